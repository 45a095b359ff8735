"""The decode loop: plan -> propose -> verify -> commit -> account, one round at a time, over a generator's models."""
from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import TYPE_CHECKING, Iterator
import warnings

import numpy as np

from .config import SpeculationConfig
from .control import acceptance_mode, make_controller
from .drafting import Draft, NoDrafter, PredictionDrafter, PromptLookupDrafter, common_prefix
from .engine import PassNeed, PassOptions
from .errors import DraftBugWarning, DraftFailedWarning, OrtspecError
from .logprobs import token_logprob
from .results import Event, Stats
from .sampling import Dist, LogitsPipeline, draft_pipeline
from .sampling.masked import MaskedPipeline
from .text import StreamDecoder
from .verify import Uniforms, Verdict, greedy_verify

if TYPE_CHECKING:
    from .context import DecodeContext
    from .request import Request

# A drafter failing with one of these has a bug (not a model that cannot run): reported as DraftBugWarning, which
# a test suite turns into an error.
PROGRAMMING_ERRORS = (TypeError, IndexError, KeyError, AttributeError, AssertionError, NameError, ZeroDivisionError,
                      NotImplementedError)
# what a drafter's failure may be (a model that cannot run, a bad proposal, a bug); anything else propagates
DRAFT_FAILURES = (OrtspecError, ValueError, ArithmeticError, RuntimeError, MemoryError, *PROGRAMMING_ERRORS)


class InvariantError(OrtspecError):
    """A strict-mode runtime check failed: the cache or logits are inconsistent."""


@dataclass
class Round:
    """One round, filled in step by step."""

    started: float          # perf_counter at its start
    target_s: float         # the target's run time before it
    draft_s: float          # the draft model's run time before it
    remaining: int          # new tokens the request may still commit
    limit: int = 0          # the most a drafter may propose (a long copy may pass gamma)
    gamma: int = 0          # draft tokens planned
    paused: bool = False    # an auto gamma paused model drafting this round
    catching_up: bool = False  # the draft model reads a long stretch of context first (no step cost to time)
    shared: bool = False    # its target pass rode a batch with other requests' (engine.batch)
    draft: Draft = field(default_factory=Draft.empty)
    counted: int = 0        # drafts that count as the drafter's (not a free guess)
    forced: int = 0         # drafts the constraint forced (free: no draft model step)
    raw: np.ndarray | None = None  # strict: the target's rows as the pass returned them
    masses: list | None = None     # sampling: sum_x min(p, q) of each verified position, where it is read
    verdict: Verdict | None = None
    new: list = field(default_factory=list)   # tokens committed
    reason: str | None = None                 # "eos" | "length" once the request is over
    logprobs: list | None = None              # one TokenLogprob per committed token, where asked for
    before: list | None = None                # strict: the committed tokens before it


class DecodeLoop:
    """One request's rounds. Each round: (1) plan gamma, (2) propose drafts with their q, (3) one target pass over
    the unfed committed tokens and the drafts, verified left to right, (4) commit the accepted drafts and the
    next token and roll both caches back to the committed boundary, (5) account: statistics, the controller,
    strict checks."""

    def __init__(self, ctx: DecodeContext, req: Request, stats: Stats, outcome: list):
        self.ctx, self.req, self.stats = ctx, req, stats
        # this request's drafter: a failure replaces it for the rest of the request only (the next one drafts again)
        self.drafter = ctx.drafter
        if req.prediction:  # the predicted output first, the generator's drafter where it offers nothing
            self.drafter = PredictionDrafter(req.prediction, len(req.prompt_ids), ctx.drafter)
        if ctx.draft_error is not None:  # the draft model never loaded: every request says so
            stats.draft_disabled, stats.draft_error = True, ctx.draft_error
        self.outcome = outcome  # the finish reason, once there is one
        self.sampling = req.sampling.do_sample
        # a greedy request's drafts may end early for a waiting request (its ids are the target's whatever it
        # drafts); a sampled one's are whole, so that a seeded answer does not depend on the timing
        self.drafter.set_stop(None if self.sampling else req.hurry)
        self.pipe = LogitsPipeline(req.sampling, ctx.vocab_size, ctx.scratch)
        self.draft_pipe = draft_pipeline(req.sampling, ctx.vocab_size, ctx.scratch, ctx.draft_sampling) \
            if self.sampling else self.pipe
        if req.constraint is not None:  # structured output: target and draft rows masked alike
            self.pipe = MaskedPipeline(self.pipe, req.constraint)
            self.draft_pipe = MaskedPipeline(self.draft_pipe, req.constraint) if self.sampling else self.pipe
        self.pipe.growing_context = self.draft_pipe.growing_context = True  # ``committed``: one list, only extended
        self.rng = Uniforms(np.random.default_rng(req.seed))  # (the generator's own numbers, drawn in blocks)
        self.mode = acceptance_mode(req.sampling)
        self.controller = make_controller(req.speculation, ctx, self.mode, self.drafter)
        self.decoder = StreamDecoder(ctx.codec if req.text else None)
        self.committed = list(req.prompt_ids)
        self.start, self.started = len(self.committed), time.perf_counter()
        target = self.target = ctx.target
        # what the target's passes read of each row; bitwise: no target pass of a size whose rows round
        # differently (pass-size invariance)
        self.passes = PassOptions.for_rules(self.pipe, req.speculation.bitwise)
        # Reuse whatever cached prefix still matches (the last token is always re-fed; bitwise, only positions
        # computed in multi-row passes), and make room for the whole request at once (a static cache grows by
        # copying otherwise).
        reusable = target.canonical_length if req.speculation.bitwise else self.start
        target.rollback(min(common_prefix(target.tokens, self.committed), self.start - 1, reusable))
        stats.cached_tokens = target.length
        self._sync_drafter()
        self.draft_lm = self.drafter.lm
        room = self.start + req.max_new_tokens + SpeculationConfig.max_draft_tokens + 1
        for lm in (target, self.draft_lm):
            if lm is not None:
                lm.reserve(min(room, lm.capacity))
        # A long prompt's first token comes from the target alone: the draft model reads the prompt in the
        # second round, so the user's wait for the first token is the target's prefill only. A draft reading the
        # target's cache never reads the prompt: it drafts from the second round on, always (whatever the target
        # kept from an earlier call: the draft's state, and so a seeded output, must not depend on it).
        self.lazy = self.drafter.source is not None or len(self.committed) - target.length > ctx.lazy_prefill

    def rounds(self) -> Iterator[Event]:
        if self.req.pauses:
            yield from self._prompt_in_steps()
        while True:
            r = self.plan()
            self.propose(r)
            need = PassNeed(self.target, self.committed[self.target.length:] + r.draft.tokens,
                            len(r.draft.tokens) + 1, self.passes)
            if self.req.pauses and self.stats.rounds:  # (the first round, the prompt's, runs whole: its first token
                # waits for nobody; riding the batch, it waited for a turn: 2.9x its time alone beside a long
                # answer on the SmolLM2 pair, against 1.3x)
                yield need
            self.verify(r, need)
            r.shared = need.shared
            self.commit(r)
            self.account(r)
            verdict = r.verdict if r.counted else Verdict(0, r.verdict.next_token, False)
            yield from _events(self.decoder, r.new, verdict, r.counted, r.logprobs)
            if r.reason:
                yield from self.finish(r.reason)
                return

    def _prompt_in_steps(self) -> Iterator[None]:
        """A scheduler's stream: a long unfed prompt is fed a CHUNK of positions a step, with a pause (None) after
        each, up to its last two chunks at most, which the first round feeds (the passes a prefill runs anyway:
        the same keys and values, bit for bit)."""
        target = self.target
        while len(self.committed) - target.length > 2 * target.CHUNK:
            at = target.length
            target.forward(self.committed[at:at + target.CHUNK], keep=1, reuse=True, options=self.passes)
            target.release_rows()
            yield None

    # 1. plan ----------------------------------------------------------------
    def plan(self) -> Round:
        """Start a round: what earlier rounds read is released, and gamma is chosen (none in a lazy first round;
        never past max_new_tokens or the context)."""
        ctx, target, draft_lm = self.ctx, self.target, self.draft_lm
        self.controller.crowd = self.req.crowd() if self.req.crowd is not None else None  # (None: alone)
        r = Round(time.perf_counter(), target.run_time_s, draft_lm.run_time_s if draft_lm is not None else 0.0,
                  self.req.max_new_tokens - (len(self.committed) - self.start))
        for lm in (target, draft_lm):  # nothing read in the round before is read again
            if lm is not None:
                lm.new_round()
        ctx.scratch.new_round()
        r.limit = min(PromptLookupDrafter.LONG_MAX, r.remaining - 1, target.capacity - len(self.committed))
        r.gamma = 0 if self.lazy else min(self.controller.choose(), r.limit)
        r.paused = not self.lazy and r.gamma == 0 and self.controller.plans
        self.lazy = False
        # a draft far behind reads its context first: that round's times say nothing about a step's cost
        r.catching_up = bool(r.gamma) and self.drafter.unread(self.committed) > ctx.lazy_prefill
        return r

    # 2. propose ---------------------------------------------------------------
    def propose(self, r: Round) -> None:
        """The round's drafts with the q each was drawn from; with none and a bitwise pass, a one-token n-gram guess
        where the text so far has one, which stays out of the drafter's statistics (free where a lone row would
        be padded anyway, ``row_tile`` > 1; on a row-invariant target, a pass of two costs a little more than
        one and the guess often holds)."""
        ctx, controller = self.ctx, self.controller
        if self.req.constraint is not None and ctx.forced_drafts and r.remaining > 1 and r.limit > 0:
            forced = self.req.constraint.forced(self.committed)[:r.limit]
            if forced:  # the only continuation the constraint allows: verified like any draft, drafted for free
                r.draft, r.forced = Draft(forced, [Dist.one_hot(t) for t in forced] if self.sampling else None), \
                    len(forced)
                self.stats.forced += len(forced)
                return
        if self.drafter.sizes_by_cost:  # the costs as timed online once two pass sizes are, the profile's before
            self.drafter.set_costs(controller.live_costs(), controller.draft_cost, controller.crowd is not None)
        r.draft = self._draft(r)
        if not r.draft.tokens and self.req.speculation.bitwise and r.remaining > 1 and \
                self.target.capacity > len(self.committed):
            guess = ctx.guess.lookup(self.committed, 1)
            r.draft = Draft(guess, [Dist.one_hot(t) for t in guess] if self.sampling else None)
        else:
            r.counted = len(r.draft.tokens)

    def _draft(self, r: Round) -> Draft:
        """The drafter's proposal, checked; with gamma 0 none, unless auto paused model drafting and the drafter
        may still propose lookups then. A draft failure leaves the rest of the request to the target alone."""
        ctx = self.ctx
        if r.gamma < 1 and not (r.paused and self.drafter.drafts_when_paused and r.limit > 0):
            return Draft.empty()
        try:
            draft = self.drafter.propose(self.committed, r.gamma, self.draft_pipe, self.sampling, self.rng,
                                        limit=r.limit)
            if len(draft.tokens) > max(r.gamma, r.limit) or any(not 0 <= t < ctx.vocab_size for t in draft.tokens):
                raise ValueError(f"drafter returned invalid tokens {draft.tokens[:8]}")
            if self.sampling and draft.tokens and (draft.dists is None or len(draft.dists) != len(draft.tokens)):
                raise ValueError("drafter returned no or too few draft distributions")
            return draft
        except DRAFT_FAILURES as exc:
            self._drafter_failed(exc)
            return Draft.empty()

    def _sync_drafter(self) -> None:
        try:
            self.drafter.sync(self.committed)
        except DRAFT_FAILURES as exc:
            self._drafter_failed(exc)

    def _drafter_failed(self, exc: Exception) -> None:
        """The one failure policy for drafters: the rest of this request decodes with the target alone (output
        unchanged: no unverified token is ever committed), Stats says so and why, and a warning names it (a
        DraftBugWarning for a programming error, which a test suite turns into an error). The generator keeps
        its drafter: the next request drafts again (the draft model's cache is resynchronized then)."""
        reason = f"{self.drafter.name} drafter failed ({type(exc).__name__}: {exc})"
        self.stats.draft_disabled, self.stats.draft_error = True, reason
        self.drafter = NoDrafter()
        category = DraftBugWarning if isinstance(exc, PROGRAMMING_ERRORS) else DraftFailedWarning
        warnings.warn(f"{reason}; this request goes on with the target alone", category, stacklevel=2)

    # 3. verify ----------------------------------------------------------------
    def verify(self, r: Round, need: PassNeed) -> None:
        """The round's target pass (``need``: over [unfed committed tokens, d_1..d_gamma], run here unless a
        scheduler ran it already) -> gamma + 1 rows, verified left to right: the next token is a correction or
        the bonus."""
        tokens = r.draft.tokens
        rows = need.result()
        # (strict checks and log-probabilities read the rows as the pass returned them: verification may rewrite
        # rows in place)
        r.raw = rows.copy() if self.req.strict or self.req.logprobs is not None else None
        if not self.sampling:
            r.verdict = greedy_verify(tokens, self.pipe.greedy(rows, self.committed, tokens))
            return
        if r.counted and (self.ctx.record_min_mass or self.controller.reads_masses):
            r.masses = []
        r.verdict = self.ctx.sampled_verify(tokens, r.draft.dists or [],
                                            self.pipe.verify_rows(rows, self.committed, tokens), self.rng, r.masses)
        if r.masses:
            self.stats.record_min_mass(r.masses)

    # 4. commit ----------------------------------------------------------------
    def commit(self, r: Round) -> None:
        """Commit the accepted drafts and the next token (cut at EOS and max_new_tokens), and roll both caches back
        to the committed boundary (rejected keys and values are never read)."""
        new = r.draft.tokens[:r.verdict.accepted] + [r.verdict.next_token]
        r.new, r.reason = _cut(new, self.req.eos, r.remaining)
        if self.req.logprobs is not None:
            r.logprobs = self._logprobs(r)
        r.before = list(self.committed) if self.req.strict else None
        self.committed.extend(r.new)
        self.target.rollback(min(self.target.length, len(self.committed) - 1))
        self._sync_drafter()

    def _logprobs(self, r: Round) -> list:
        """The committed tokens' log-probabilities: token j from row j of the pass (its context the committed
        text and the tokens before it, drafts that passed)."""
        out, constraint, width = [], self.req.constraint, self.ctx.vocab_size
        for j, tok in enumerate(r.new):
            context = self.committed + r.new[:j]
            allowed = constraint.allowed(self.committed, r.new[:j]) if constraint is not None else None
            out.append(token_logprob(r.raw[j][:width], context, self.req.sampling, tok, self.req.logprobs, allowed))
        return out

    # 5. account ---------------------------------------------------------------
    def account(self, r: Round) -> None:
        """Statistics, the controller's update, and strict checks."""
        stats, target, draft_lm = self.stats, self.target, self.draft_lm
        accepted = r.verdict.accepted if r.counted else 0
        stats.record(r.counted, accepted, len(r.new), time.perf_counter() - r.started)
        stats.round_passes.append(None if stats.rounds == 1 or r.catching_up else (
            len(r.draft.tokens) + 1, target.run_time_s - r.target_s,
            (draft_lm.run_time_s - r.draft_s) if draft_lm is not None else 0.0))
        if stats.rounds == 1:
            stats.first_token_s = time.perf_counter() - self.started
        if r.forced:
            stats.forced_accepted += r.verdict.accepted
        if r.draft.origin == "prediction":
            stats.prediction_accepted += accepted
            stats.prediction_rejected += len(r.draft.tokens) - accepted
        self.controller.update(r.counted or r.forced, accepted, side=r.draft.side or bool(r.forced),
                               prefill=r.catching_up, masses=r.masses, shared=r.shared)
        if self.req.constraint is not None:
            stats.constraint_time_s = self.req.constraint.time_s
        if self.req.strict:
            self._check(r)

    def finish(self, reason: str) -> Iterator[Event]:
        self.outcome.append(reason)
        self.ctx.memory.learn(self.controller.lessons(), self.mode, self.req.speculation.bitwise)
        tail = self.decoder.flush()
        if tail:
            yield Event([], tail, "text")

    def _check(self, r: Round) -> None:
        """strict=True: cache lengths, cached tokens, and logits vs a fresh prefill (bit for bit when bitwise)."""
        committed, t, drafter = r.before + r.new, self.target, self.drafter
        bitwise = self.req.speculation.bitwise
        if t.length != len(committed) - 1 or t.tokens != committed[:-1]:
            raise InvariantError(f"target cache holds {t.length} tokens, expected {len(committed) - 1}")
        lm, seen = drafter.lm, drafter.view(committed)
        if lm is not None and (lm.length > len(seen) - 1 or lm.tokens != seen[:lm.length]):
            raise InvariantError("draft cache holds tokens that are not on the committed path")
        m = len(r.new)
        fresh = t.reference_logits(committed[:-1], self.passes)[-m:]
        got = r.raw[:m]
        if not (np.array_equal(got, fresh) if bitwise else np.allclose(got, fresh, rtol=1e-4, atol=1e-4)):
            err = float(np.max(np.abs(got - fresh)))
            raise InvariantError(f"speculative-path logits differ from a fresh prefill by {err:.3g}"
                                 + (" (bitwise: this target is not pass-size invariant here; see ortspec verify)"
                                    if bitwise else ""))


def _cut(new: list[int], eos: frozenset, remaining: int) -> tuple[list[int], str | None]:
    for i, tok in enumerate(new):
        if tok in eos:
            return new[: i + 1], "eos"
    if len(new) >= remaining:
        return new[:remaining], "length"
    return new, None


def _events(decoder: StreamDecoder, new: list[int], verdict: Verdict, gamma: int,
            logprobs: list | None = None) -> Iterator[Event]:
    cut = verdict.accepted
    accepted = new[:cut]
    if accepted:
        yield Event(accepted, decoder.push(accepted), "accepted", None if logprobs is None else logprobs[:cut])
    rest = new[cut:]
    if rest:
        kind = "target" if gamma == 0 else ("bonus" if verdict.bonus else "corrected")
        yield Event(rest, decoder.push(rest), kind, None if logprobs is None else logprobs[cut:])
