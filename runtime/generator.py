"""SpeculativeGenerator: the decode loop, its public API and Stats bookkeeping."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
import os
import threading
import time
from typing import Iterator, Sequence
import warnings

import numpy as np

from .bundle import Bundle, load_bundle
from .config import SamplingConfig, SpeculationConfig, resolve_sampling
from .controller import acceptance_mode, make_controller, stored_acceptance
from .drafters import (Draft, HybridDrafter, ModelDrafter, NoDrafter, PromptLookupDrafter, check_window,
                       common_prefix)
from .errors import BundleError, CacheOverflowError, IncompatibleModelsError, OrtspecError
from .logits import Dist, LogitsPipeline, Scratch, draft_pipeline
from .model import LOGITS_PLACES, CausalLM, check_thread_pool
from .text import StreamDecoder, TextCodec
from .verify import Uniforms, Verdict, greedy_verify, verify_dists

DRAFTERS = ("model", "prompt_lookup", "hybrid", "none")
DRAFT_KV = ("auto", "own")  # where a self-draft's keys and values for committed text come from


class InvariantError(OrtspecError):
    """A strict-mode runtime check failed: the cache or logits are inconsistent."""


@dataclass
class Stats:
    """What one generation did and where its time went."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    proposed_at: list = field(default_factory=list)   # per draft position: rounds that proposed it
    reached_at: list = field(default_factory=list)    # per draft position: rounds that verified it (all before passed)
    accepted_at: list = field(default_factory=list)   # per draft position: rounds that accepted it
    # per draft position (sampling), where the generator's ``record_min_mass`` or an auto gamma asks for it:
    min_mass_at: list = field(default_factory=list)   # the sum of sum_x min(p, q) ...
    verified_at: list = field(default_factory=list)   # ... over this many verified positions
    round_times_s: list = field(default_factory=list)
    round_tokens: list = field(default_factory=list)
    round_gammas: list = field(default_factory=list)
    # per round: (positions of its target pass, the target's run time, the draft model's run time), or None for a
    # round that also read a prompt (the first; one where the draft caught up with a long prompt): no step cost
    round_passes: list = field(default_factory=list)
    target_time_s: float = 0.0
    draft_time_s: float = 0.0
    overhead_time_s: float = 0.0
    total_time_s: float = 0.0
    first_token_s: float = 0.0    # time to the first committed token (prefill included)
    draft_disabled: bool = False

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft i accepted | drafts 1..i-1 were), i = 1..gamma: the alphas of the cost model."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_at, self.reached_at)]

    @property
    def per_position_min_mass(self) -> list[float]:
        """Mean sum_x min(p_i, q_i) over the rounds that verified position i: its expected acceptance (recorded
        when sampling with ``SpeculativeGenerator.record_min_mass`` on, as bench runs, or an auto gamma; else
        empty)."""
        return [m / n if n else 0.0 for m, n in zip(self.min_mass_at, self.verified_at)]

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def record(self, gamma: int, verdict_accepted: int, committed: int, seconds: float) -> None:
        self.rounds += 1
        self.drafted += gamma
        self.accepted += verdict_accepted
        self.new_tokens += committed
        while len(self.proposed_at) < gamma:
            self.proposed_at.append(0)
            self.reached_at.append(0)
            self.accepted_at.append(0)
        for i in range(gamma):
            self.proposed_at[i] += 1
            self.reached_at[i] += i <= verdict_accepted
            self.accepted_at[i] += i < verdict_accepted
        self.round_times_s.append(seconds)
        self.round_tokens.append(committed)
        self.round_gammas.append(gamma)

    def record_min_mass(self, masses: list[float]) -> None:
        for i, m in enumerate(masses):
            if i == len(self.min_mass_at):
                self.min_mass_at.append(0.0)
                self.verified_at.append(0)
            self.min_mass_at[i] += m
            self.verified_at[i] += 1

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "new_tokens": self.new_tokens, "acceptance_rate": self.acceptance_rate,
            "per_position_acceptance": self.per_position_acceptance,
            "per_position_min_mass": self.per_position_min_mass,
            "tokens_per_round": self.tokens_per_round, "tokens_per_s": self.tokens_per_s,
            "target_time_s": self.target_time_s, "draft_time_s": self.draft_time_s,
            "overhead_time_s": self.overhead_time_s, "total_time_s": self.total_time_s,
            "first_token_s": self.first_token_s,
            "draft_disabled": self.draft_disabled,
        }


@dataclass(frozen=True)
class Event:
    """Tokens committed together: kind is accepted | corrected | bonus | target."""

    token_ids: list[int]
    text: str
    kind: str


@dataclass(frozen=True)
class Result:
    token_ids: list[int]
    text: str | None
    stats: Stats
    finish_reason: str  # "eos" | "length"

    def to_dict(self) -> dict:
        return {"token_ids": self.token_ids, "text": self.text, "finish_reason": self.finish_reason,
                "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    speculation: SpeculationConfig
    eos: frozenset
    seed: int | None
    strict: bool
    text: bool = True  # text deltas per round (a stream's events); generate() decodes once at the end


def decoding_vocab(bundle: Bundle, codec: TextCodec | None, drafts_with_model: bool) -> int:
    """The ids decoding chooses among: the target's logits width, or the draft's where that is narrower and the
    ids it leaves out are padding (past every id the tokenizer knows: probability 0 for every drafter, so that
    speculative output stays distributed as target-only output). A draft narrower than the tokenizer's ids
    cannot propose tokens the target may choose: drafting with it is refused; the target alone decodes over
    its whole width."""
    width = bundle.target.output_vocab
    if bundle.draft is None or bundle.draft.output_vocab >= width:
        return width
    cut = bundle.draft.output_vocab
    tokens = codec.id_count() if codec is not None else None
    if tokens is not None and tokens <= cut:
        return cut
    if drafts_with_model:
        known = f"the tokenizer's ids reach {tokens - 1}" if tokens is not None else "the bundle has no tokenizer"
        raise IncompatibleModelsError(
            f"the draft's logits cover ids 0..{cut - 1} but the target's cover 0..{width - 1} and {known}: the "
            "draft cannot propose every token the target may choose; re-export the pair with drafts of the same "
            "vocabulary, or load with drafter='prompt_lookup' or 'none'")
    return width


class SpeculativeGenerator:
    """Generates with a bundle's target, drafting with a model, n-grams, or nothing.

    Calls on one generator are serialized by a lock: it may be shared between
    threads, and concurrent calls run one after another.
    """

    def __init__(self, bundle: Bundle, target: CausalLM, drafter, codec: TextCodec | None,
                 draft_disabled: bool = False):
        self.bundle = bundle
        self.target = target
        self.drafter = drafter
        self.codec = codec
        self.draft_disabled = draft_disabled
        self.vocab_size = decoding_vocab(bundle, codec, getattr(drafter, "lm", None) is not None)
        self._lock = threading.Lock()
        self._profile: dict | None = None
        # the last auto controller's per-position acceptance, per mode ("greedy", "sampled"): the next
        # request's starting point (a request is too short to learn from a neutral guess, and this pair's
        # drafts agree about as well next time); also kept in the bundle's profile for the next process
        self.acceptance_prior: dict = {}
        # and the pass sizes it timed, per kind of pass (bitwise or not: C_t(1) is a pass of two positions or of
        # one): kept only in memory, since they are this process's view of the machine now
        self.timing_prior: dict = {}
        self._profile_read = False  # the stored profile was looked for (drafters that size proposals read it)
        self._sampled_verify = verify_dists  # replaceable only by exactness checks (negative controls)
        self.draft_sampling = "match"  # what the draft samples from (config.draft_sampling); never changes output
        self._scratch = Scratch()  # vocabulary-wide arrays reused across rounds (calls hold the lock)
        self._guess = PromptLookupDrafter()  # free one-token guesses for rounds without drafts (bitwise passes)
        # Sampling: sum_x min(p, q) of every verified position into Stats (bench turns it on). An auto gamma
        # learns from it and always computes it; otherwise it is host time that serves only the statistics
        # (without top-k, about a tenth of a round's time outside onnxruntime on SmolLM2).
        self.record_min_mass = False

    # -- construction -------------------------------------------------------
    @classmethod
    def load(cls, bundle_dir: str | os.PathLike, provider: str = "cpu", drafter: str = "model",
             threads: int | None = None, verify: str = "full",
             thread_pool: str = "session", logits: str = "auto",
             draft_window: int | None = 512, draft_kv: str = "auto") -> "SpeculativeGenerator":
        """Load a bundle. drafter: "model" (the bundle's draft), "prompt_lookup" or "none".

        thread_pool: "session" (a thread pool per model, spinning only while that model runs) or "shared"
        (both models on onnxruntime's process-wide pool, as the commands run; about as fast, but onnxruntime
        then requires every later session in the process to use it, and export must run in another process).

        logits: how a decoding round reads its logits rows. Each pass also returns every kept row's largest
        entries (the graph's TopK; bundles exported before it lack them), which settle greedy and top-k sampling
        without reading the row. "device" leaves the rows on the execution provider's device and copies a row
        only where its top entries do not settle it; "host" reads every row whole; "auto" (default) is "device"
        on CUDA and, on the CPU, rows in host memory read through their top entries. Output is the same bits
        every way.

        draft_window: the draft model reads a long context as its first tokens plus about this many recent
        ones (None: all of it). A long prompt then costs the draft a window's prefill and its steps attend over
        a window; acceptance may change, the output never does. On long edit prompts (SmolLM2, 800-2,800
        tokens) 512 kept acceptance (0.37 vs 0.40) and ran 0.73x target-only speed where the whole context
        ran 0.51x (README, "Long prompts").

        draft_kv: "auto" (default) lets a self-draft (the target's own weights quantized: same layers and cache
        layout) run on the target's KV cache: it reads the target's keys and values for the committed text
        instead of computing its own, so it never reads the prompt (the first token is the target's prefill
        alone), drafts from the better model's cache and keeps no cache of its own; draft_window does not
        apply then. "own": the draft keeps its own cache.
        Acceptance may change, the output never does.
        """
        if not isinstance(bundle_dir, (str, os.PathLike)):
            raise ValueError(f"bundle_dir must be a path, got {type(bundle_dir).__name__}")
        drafter = drafter.replace("-", "_") if isinstance(drafter, str) else drafter
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
        check_thread_pool(thread_pool)
        if logits not in LOGITS_PLACES:
            raise ValueError(f"logits must be one of {', '.join(LOGITS_PLACES)}, got {logits!r}")
        check_window(draft_window)
        if draft_kv not in DRAFT_KV:
            raise ValueError(f"draft_kv must be one of {', '.join(DRAFT_KV)}, got {draft_kv!r}")
        bundle = load_bundle(bundle_dir, verify=verify)
        if (bundle.target.quantization or {}).get("method") == "int8":
            warnings.warn("this bundle's target uses dynamic INT8 quantization (one activation scale per pass), so "
                          "speculative output can differ from target-only output at near-ties; re-export it with "
                          "--target-quant int8w for bitwise-exact output", RuntimeWarning, stacklevel=2)
        if provider == "cuda" and drafter in ("model", "hybrid") and bundle.draft is not None and \
                (bundle.draft.quantization or {}).get("method") == "int8":
            warnings.warn("this bundle's draft uses dynamic INT8 (MatMulInteger), which onnxruntime runs on the CPU "
                          "even with the CUDA provider; for a GPU, re-export with --draft-quant int4",
                          RuntimeWarning, stacklevel=2)
        if drafter in ("model", "hybrid") and bundle.draft is None:
            raise BundleError(f"bundle {bundle.root} has no draft model; use drafter='prompt_lookup' or "
                              "'none', or export with --draft")
        target = CausalLM(bundle.target, str(bundle.file(bundle.target.path)), provider, threads,
                          thread_pool=thread_pool, logits=logits)
        codec = TextCodec(bundle.tokenizer_file, bundle.tokenizer_config) if bundle.tokenizer_file else None
        disabled = False
        if drafter in ("model", "hybrid"):
            try:
                lm = CausalLM(bundle.draft, str(bundle.file(bundle.draft.path)), provider, threads,
                              thread_pool=thread_pool, logits=logits)
                shared = draft_kv == "auto" and bundle.draft.source.get("kind") == "self" and lm.can_share(target)
                impl = cls._model_drafter(drafter, lm, draft_window, target if shared else None)
            except BundleError:
                raise  # a manifest that misdescribes its graph is a broken bundle, not a runtime failure
            except Exception as exc:
                warnings.warn(f"draft model failed to load ({exc}); decoding with the target alone",
                              RuntimeWarning, stacklevel=2)
                impl, disabled = NoDrafter(), True
        elif drafter == "prompt_lookup":
            impl = PromptLookupDrafter()
        else:
            impl = NoDrafter()
        return cls(bundle, target, impl, codec, disabled)

    @staticmethod
    def _model_drafter(kind: str, lm: CausalLM, window: int | None = None, source: CausalLM | None = None):
        model = ModelDrafter(lm, window, source)
        return HybridDrafter(model) if kind == "hybrid" else model

    def sibling(self, drafter: str) -> "SpeculativeGenerator":
        """Another generator over the same loaded models (no second copy in memory) with another drafter.

        Share it only within one thread: both use the same target cache.
        """
        drafter = drafter.replace("-", "_")
        if drafter == "none":
            impl = NoDrafter()
        elif drafter == "prompt_lookup":
            impl = PromptLookupDrafter()
        elif drafter in ("model", "hybrid") and getattr(self.drafter, "lm", None) is not None:
            model = getattr(self.drafter, "model", self.drafter)  # the hybrid's model drafter
            impl = self._model_drafter(drafter, self.drafter.lm, model.window, model.source)
        else:
            raise ValueError(f"cannot make a {drafter!r} sibling of a generator with drafter {self.drafter.name!r}")
        twin = SpeculativeGenerator(self.bundle, self.target, impl, self.codec, self.draft_disabled)
        twin._profile, twin.draft_sampling, twin._scratch = self._profile, self.draft_sampling, self._scratch
        twin.record_min_mass = self.record_min_mass
        return twin

    def profile(self) -> dict | None:
        """This machine's calibrated step costs for the bundle (measured once, then read from disk)."""
        if self._profile is None:
            from .calibrate import load_profile, measure, save_profile
            provider = self.target.provider
            self._profile = load_profile(self.bundle.root, provider)
            if self._profile is None:
                self._profile = measure(self.target, getattr(self.drafter, "lm", None))
                save_profile(self.bundle.root, provider, self._profile)
        return self._profile

    # -- public API ---------------------------------------------------------
    def generate(self, prompt: str | None = None, input_ids: Sequence[int] | None = None, **kwargs) -> Result:
        """Generate and return all new tokens at once (same arguments as stream)."""
        events = self.stream(prompt, input_ids, **kwargs)
        events._req = replace(events._req, text=False)  # before the first round: no per-round detokenizing
        ids: list[int] = []
        for ev in events:
            ids.extend(ev.token_ids)
        stats, reason = events.result  # type: ignore[attr-defined]
        text = self.codec.decode(ids) if self.codec else None
        return Result(ids, text, stats, reason)

    def stream(self, prompt: str | None = None, input_ids: Sequence[int] | None = None, *,
               max_new_tokens: int = 64, do_sample: bool | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
               bad_words_ids: Sequence[Sequence[int]] = (), seed: int | None = None,
               num_draft_tokens: int | str = 4, eos_token_id: int | Sequence[int] | None = None,
               strict: bool = False, chat: bool = False, system: str | None = None,
               messages: Sequence[dict] | None = None, bitwise: bool = True) -> "_Stream":
        """Yield Events as tokens are committed. Arguments are checked before any work.

        The prompt is one of: ``prompt`` (text; with ``chat=True`` a user turn through the chat template),
        ``messages`` (a conversation [{"role": "system"|"user"|"assistant", "content": ...}, ...] through the
        chat template) or ``input_ids``. A conversation that continues an earlier call's (its messages plus the
        assistant's reply, then the next user turn) reuses that call's cached prefix: only new tokens are fed.

        Sampling settings left out (None) come from the bundle's generation_config.json, as in transformers'
        ``generate`` (see ``sampling_defaults``), else transformers' defaults: greedy; when sampling,
        temperature 1, top-k 50 (``top_k=0`` turns it off), top-p 1, no repetition penalty.
        """
        eos = self._eos(eos_token_id)
        # as transformers' NoBadWordsLogitsProcessor: an end-of-sequence id alone is never a bad word
        words = tuple(tuple(w) for w in bad_words_ids if not (len(w) == 1 and w[0] in eos))
        sampling = SamplingConfig(**self.sampling_settings(
            do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty), bad_words_ids=words)
        speculation = SpeculationConfig(num_draft_tokens, bitwise=bitwise)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
        ids = self.encode_prompt(prompt, input_ids, chat=chat, system=system, messages=messages)
        need = len(ids) + max_new_tokens - 1
        if need > self.target.capacity:
            raise CacheOverflowError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) needs {need} positions but the "
                f"target holds {self.target.capacity}; shorten the prompt or lower max_new_tokens")
        request = _Request(ids, max_new_tokens, sampling, speculation, eos, seed, bool(strict))
        return _Stream(self, request)

    def sampling_settings(self, **given) -> dict:
        """Sampling settings for a call: each one given (not None) wins, then the bundle's generation
        config, then transformers' defaults (greedy; temperature 1, top-k 50, top-p 1, no penalty)."""
        return resolve_sampling(self.bundle.sampling_defaults, **given)

    # -- the decode loop ------------------------------------------------------
    def _rounds(self, req: _Request, stats: Stats, outcome: list) -> Iterator[Event]:
        pipe = LogitsPipeline(req.sampling, self.vocab_size, self._scratch)
        draft_pipe = draft_pipeline(req.sampling, self.vocab_size, self._scratch, self.draft_sampling) \
            if req.sampling.do_sample else pipe
        pipe.growing_context = draft_pipe.growing_context = True  # ``committed`` below: one list, only extended
        rng = Uniforms(np.random.default_rng(req.seed))  # (the generator's own numbers, drawn in blocks)
        controller = make_controller(req.speculation, self, acceptance_mode(req.sampling))
        decoder = StreamDecoder(self.codec if req.text else None)
        target, sampling = self.target, req.sampling.do_sample
        committed = list(req.prompt_ids)
        start, started = len(committed), time.perf_counter()
        # Bitwise: no target pass of a size whose rows round differently (DESIGN §3, pass-size invariance).
        target.bitwise = req.speculation.bitwise
        # Reuse whatever cached prefix still matches (the last token is always re-fed; bitwise, only
        # positions computed in multi-row passes), and make room for the whole request at once (a static
        # cache grows by copying otherwise).
        reusable = target.canonical_length if req.speculation.bitwise else start
        target.rollback(min(common_prefix(target.tokens, committed), start - 1, reusable))
        self._sync_drafter(committed)
        room = start + req.max_new_tokens + SpeculationConfig.max_draft_tokens + 1
        for lm, rules in ((target, pipe), (getattr(self.drafter, "lm", None), draft_pipe)):
            if lm is not None:
                lm.reserve(min(room, lm.capacity))
                lm.top_k = rules.top_entries()  # the largest entries per row this request's rules read
                lm.norm_scale = rules.norm_scale()  # and the scale of each row's normalizer (LazyRow)
        # A long prompt's first token comes from the target alone: the draft model reads the prompt in the
        # second round, so the user's wait for the first token is the target's prefill only. A draft reading
        # the target's cache never reads the prompt: it drafts from the second round on, always (whatever the
        # target kept from an earlier call: the draft's state, and so a seeded output, must not depend on it).
        lazy = getattr(self.drafter, "source", None) is not None or \
            len(committed) - target.length > self.LAZY_PREFILL
        draft_lm = getattr(self.drafter, "lm", None)
        while True:
            t0 = time.perf_counter()
            t_run, d_run = target.run_time_s, (draft_lm.run_time_s if draft_lm is not None else 0.0)
            remaining = req.max_new_tokens - (len(committed) - start)
            # 1. Choose gamma: never draft past max_new_tokens or the context (limit: what a long copy may
            #    propose beyond gamma).
            limit = min(PromptLookupDrafter.LONG_MAX, remaining - 1, target.capacity - len(committed))
            gamma = 0 if lazy else min(controller.choose(), limit)
            paused = not lazy and gamma == 0 and getattr(controller, "plans", False)
            lazy = False
            # 2. Draft gamma tokens with their sampling distributions q (a draft far behind reads the prompt now:
            #    that round's times say nothing about a step's cost).
            catching_up = bool(gamma) and hasattr(self.drafter, "unread") and \
                self.drafter.unread(committed) > self.LAZY_PREFILL
            self._hand_costs(controller)
            draft = self._draft(committed, gamma, limit, draft_pipe, sampling, rng, stats, paused)
            free = not draft.tokens and req.speculation.bitwise and remaining > 1 and target.capacity > len(committed)
            if free:  # a bitwise pass has two positions anyway: the second may as well be an n-gram guess
                guess = self._guess.lookup(committed, 1)
                draft = Draft(guess, [Dist.one_hot(t) for t in guess] if sampling else None)
            counted = 0 if free else len(draft.tokens)  # free guesses stay out of the drafter's statistics
            # 3. One target pass over [unfed committed tokens, d_1..d_gamma] -> gamma+1 rows.
            rows = target.forward_rows(committed[target.length:] + draft.tokens, keep=len(draft.tokens) + 1)
            raw = rows.copy() if req.strict else None  # verification may rewrite rows in place
            # 4. Verify left to right; the next token is a correction or the bonus.
            # sum_x min(p, q) of each verified draft position, where the statistics or the controller read it
            masses = [] if sampling and counted and (self.record_min_mass or controller.reads_masses) else None
            verdict = self._verify(pipe, rows, committed, draft, sampling, rng, masses)
            rows = None  # its host buffer is free again: the next pass writes into it, already bound
            if masses:
                stats.record_min_mass(masses)
            # 5. Commit accepted drafts + next token, cut at EOS and max_new_tokens.
            new = draft.tokens[:verdict.accepted] + [verdict.next_token]
            new, reason = _cut(new, req.eos, remaining)
            before = list(committed) if req.strict else None
            committed.extend(new)
            # 6. Roll both caches back to the committed boundary (rejected K/V are never read).
            target.rollback(min(target.length, len(committed) - 1))
            self._sync_drafter(committed)
            stats.record(counted, verdict.accepted if counted else 0, len(new), time.perf_counter() - t0)
            stats.round_passes.append(None if stats.rounds == 1 or catching_up else (
                len(draft.tokens) + 1, target.run_time_s - t_run,
                (draft_lm.run_time_s - d_run) if draft_lm is not None else 0.0))
            if stats.rounds == 1:
                stats.first_token_s = time.perf_counter() - started
            controller.update(counted, verdict.accepted if counted else 0, side=draft.side, prefill=catching_up,
                              masses=masses)
            if req.strict:
                self._check(before, new, raw, req.speculation.bitwise)
            yield from _events(decoder, new, verdict if counted else Verdict(0, verdict.next_token, False), counted)
            if reason:
                outcome.append(reason)
                self._learn(controller, acceptance_mode(req.sampling), req.speculation.bitwise)
                tail = decoder.flush()
                if tail:
                    yield Event([], tail, "text")
                return

    def _hand_costs(self, controller) -> None:
        """Hand a drafter that sizes its proposals by cost (long copies, the hybrid's choice) the pass costs and
        draft step of this request's controller: timed online once it has timed two pass sizes (they follow the
        machine as it is now), the stored profile's before that (none is measured for this)."""
        if hasattr(self.drafter, "pass_costs") and hasattr(controller, "live_costs"):
            self.drafter.pass_costs = controller.live_costs()
            if hasattr(self.drafter, "draft_cost"):
                self.drafter.draft_cost = controller.draft_cost

    def stored_profile(self) -> dict | None:
        """The calibrated step costs stored for this machine, if any (never measures; see ``profile``)."""
        if self._profile is None and not self._profile_read:
            from .calibrate import load_profile
            self._profile, self._profile_read = load_profile(self.bundle.root, self.target.provider), True
        return self._profile

    LAZY_PREFILL = 256  # unfed prompt tokens from which the first round runs without drafts

    # costs timed online this much below the stored profile replace it (above it they may be a busy machine's:
    # load only ever slows passes, so slower timings are not stored)
    DRIFT = 1.25
    MOVED = 0.05  # a per-position acceptance this far from the stored one is stored again

    def _learn(self, controller, mode: str, bitwise: bool) -> None:
        """Keep an auto controller's acceptance and pass timings for the next request (the acceptance also in the
        stored profile, once a request measured enough of it), and store the pass costs it timed when they are
        well below the profile's (the profile was measured on a busy machine, or the machine got faster): a
        re-calibration for free. Timings above the profile's are not stored (they may say only that the machine
        is busy now), except for their shape: when the sizes' costs relative to each other contradict the
        profile's, the timed shape is stored at the profile's level."""
        if not getattr(controller, "plans", False):
            return  # a fixed gamma's timings and acceptance are not kept
        if getattr(controller, "rounds", 0):
            self.acceptance_prior[mode] = carried = controller.carried_acceptance()
            self.timing_prior[bool(bitwise)] = controller.carried_timings()
            seen = {"alphas": carried["alphas"], "measured": carried["measured"]}
            if controller.rounds >= controller.EXPLORE_EVERY and self._profile is not None:
                stored = stored_acceptance(self._profile)
                old = stored.get(mode, {}).get("alphas", [])
                if len(old) != len(seen["alphas"]) or max(abs(a - b) for a, b in zip(old, seen["alphas"])) > self.MOVED:
                    self._store_profile(dict(self._profile, acceptance={**stored, mode: seen}))
        if self._profile is None or len(controller.timed_at) < 2 or controller.rounds < controller.EXPLORE_EVERY:
            return  # nothing to correct, or too little evidence
        drift = controller.worst_drift()
        faster = drift is not None and drift < 1 / self.DRIFT
        shape = controller.shape_drift()
        if not faster and (shape is None or shape[0] <= self.DRIFT):
            return
        learned = controller.learned_profile()
        costs = learned["target_costs"]
        old = list(self._profile.get("target_costs") or [])
        if faster:
            stored = dict(self._profile, relearned_from_drift=round(drift, 3))
        else:  # only the shape is wrong: the timed shape at the profile's level (slower timings may be load)
            ref = shape[1]
            costs = [c * old[ref - 1] / costs[ref - 1] for c in costs] if ref <= len(old) else costs
            stored = dict(self._profile, reshaped_by=round(shape[0], 3))
        # C_t(1) stays as measured (bitwise decoding times two-position passes in its place), and only a model
        # drafter's timings say anything about the draft's step (only when faster: a slower one may be load)
        stored["target_costs"] = old[:1] + costs[1:]
        if faster and controller.draft_lm is not None and learned["draft_cost"] is not None:
            stored["draft_cost"] = learned["draft_cost"]
        self._store_profile(stored)

    def _store_profile(self, profile: dict) -> None:
        from .calibrate import save_profile
        self._profile = profile
        save_profile(self.bundle.root, self.target.provider, profile)

    def _draft(self, committed, gamma, limit, pipe, sampling, rng, stats, paused: bool = False) -> Draft:
        """The round's draft; with ``gamma`` 0 none, unless auto ``paused`` model drafting and the drafter may
        still propose lookups then."""
        if gamma < 1 and not (paused and getattr(self.drafter, "drafts_when_paused", False) and limit > 0):
            return Draft.empty()
        try:
            draft = self.drafter.propose(committed, gamma, pipe, sampling, rng, limit=limit)
            if len(draft.tokens) > max(gamma, limit) or any(not 0 <= t < self.vocab_size for t in draft.tokens):
                raise ValueError(f"drafter returned invalid tokens {draft.tokens[:8]}")
            if sampling and draft.tokens and (draft.dists is None or len(draft.dists) != len(draft.tokens)):
                raise ValueError("drafter returned no or too few draft distributions")
            return draft
        except Exception as exc:  # any draft failure degrades to target-only decoding
            self._disable_draft(exc)
            stats.draft_disabled = True
            return Draft.empty()

    def _verify(self, pipe, rows, committed, draft: Draft, sampling, rng, masses: list | None) -> Verdict:
        """The round's verdict; when sampling, sum_x min(p, q) of each verified position goes into ``masses``."""
        if sampling:
            return self._sampled_verify(draft.tokens, draft.dists or [],
                                        pipe.verify_rows(rows, committed, draft.tokens), rng, masses)
        return greedy_verify(draft.tokens, pipe.greedy(rows, committed, draft.tokens))

    def _sync_drafter(self, committed) -> None:
        try:
            self.drafter.sync(committed)
        except Exception as exc:
            self._disable_draft(exc)

    def _disable_draft(self, exc: Exception) -> None:
        warnings.warn(f"draft model failed ({type(exc).__name__}: {exc}); continuing with the target alone",
                      RuntimeWarning, stacklevel=4)
        self.drafter = NoDrafter()
        self.draft_disabled = True

    def _check(self, before: list[int], new: list[int], rows: np.ndarray, bitwise: bool) -> None:
        """strict=True: cache lengths, cached tokens, and logits vs a fresh prefill (bit for bit when bitwise)."""
        committed = before + new
        t = self.target
        if t.length != len(committed) - 1 or t.tokens != committed[:-1]:
            raise InvariantError(f"target cache holds {t.length} tokens, expected {len(committed) - 1}")
        lm = getattr(self.drafter, "lm", None)
        seen = self.drafter.view(committed) if hasattr(self.drafter, "view") else committed
        if lm is not None and (lm.length > len(seen) - 1 or lm.tokens != seen[:lm.length]):
            raise InvariantError("draft cache holds tokens that are not on the committed path")
        m = len(new)
        fresh = t.reference_logits(committed[:-1])[-m:]
        got = rows[:m]
        if not (np.array_equal(got, fresh) if bitwise else np.allclose(got, fresh, rtol=1e-4, atol=1e-4)):
            err = float(np.max(np.abs(got - fresh)))
            raise InvariantError(f"speculative-path logits differ from a fresh prefill by {err:.3g}"
                                 + (" (bitwise: this target is not pass-size invariant here; see ortspec verify)"
                                    if bitwise else ""))

    # -- helpers --------------------------------------------------------------
    def encode_prompt(self, prompt: str | None = None, input_ids: Sequence[int] | None = None, *,
                      chat: bool = False, system: str | None = None,
                      messages: Sequence[dict] | None = None) -> list[int]:
        """The token ids ``stream`` would feed for these prompt arguments (checked the same way)."""
        if sum(x is not None for x in (prompt, input_ids, messages)) != 1:
            raise ValueError("pass exactly one of prompt (text), messages (a conversation) or input_ids (token ids)")
        if messages is not None:
            if system is not None:
                raise ValueError("with messages, put the system message first in messages instead of system=")
            if self.codec is None:
                raise ValueError("this bundle has no tokenizer; pass input_ids instead of messages")
            ids = self.codec.encode_messages(messages)
        elif prompt is not None:
            if not isinstance(prompt, str) or not prompt:
                raise ValueError("prompt must be a non-empty string")
            if self.codec is None:
                raise ValueError("this bundle has no tokenizer; pass input_ids instead of prompt")
            ids = self.codec.encode(prompt, chat=chat, system=system)
        else:
            if chat:
                raise ValueError("chat=True needs a text prompt, not input_ids")
            try:
                ids = [_token_id(t) for t in input_ids]
            except TypeError:
                raise ValueError("input_ids must be a sequence of integers") from None
        if not ids:
            raise ValueError("the prompt encodes to no tokens; pass a longer prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"input_ids contains ids outside the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        return ids

    def _eos(self, eos_token_id) -> frozenset:
        if eos_token_id is None:
            return frozenset(self.bundle.eos_token_ids)
        ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError(f"eos_token_id must be an id >= 0 or a list of them, got {eos_token_id!r}")
        return frozenset(ids)


class _Stream:
    """Iterator over a generation's events; holds the generator's lock while it runs."""

    def __init__(self, gen: SpeculativeGenerator, req: _Request):
        self._gen, self._req = gen, req
        self._it = self._run()
        self.result: tuple[Stats, str] | None = None

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids (after the chat template), as fed to the target."""
        return list(self._req.prompt_ids)

    def __iter__(self):
        return self

    def __next__(self) -> Event:
        return next(self._it)

    def close(self) -> None:
        self._it.close()

    def _run(self) -> Iterator[Event]:
        gen, req = self._gen, self._req
        with gen._lock:
            stats = Stats(draft_disabled=gen.draft_disabled)
            t_lm = gen.target.run_time_s
            d_lm = getattr(getattr(gen.drafter, "lm", None), "run_time_s", 0.0)
            outcome: list = []
            t0 = time.perf_counter()
            try:
                yield from gen._rounds(req, stats, outcome)
            finally:
                stats.total_time_s = time.perf_counter() - t0
                stats.target_time_s = gen.target.run_time_s - t_lm
                lm = getattr(gen.drafter, "lm", None)
                stats.draft_time_s = (lm.run_time_s - d_lm) if lm is not None else 0.0
                stats.overhead_time_s = max(0.0, stats.total_time_s - stats.target_time_s - stats.draft_time_s)
                stats.draft_disabled = stats.draft_disabled or gen.draft_disabled
                self.result = (stats, outcome[0] if outcome else "interrupted")


def _token_id(value) -> int:
    """An integer token id (Python or NumPy integers); booleans and non-integral numbers are refused."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"input_ids must hold integer token ids, got {value!r}")
    return int(value)


def _cut(new: list[int], eos: frozenset, remaining: int) -> tuple[list[int], str | None]:
    for i, tok in enumerate(new):
        if tok in eos:
            return new[: i + 1], "eos"
    if len(new) >= remaining:
        return new[:remaining], "length"
    return new, None


def _events(decoder: StreamDecoder, new: list[int], verdict: Verdict, gamma: int) -> Iterator[Event]:
    accepted = new[: verdict.accepted]
    if accepted:
        yield Event(accepted, decoder.push(accepted), "accepted")
    rest = new[verdict.accepted:]
    if rest:
        kind = "target" if gamma == 0 else ("bonus" if verdict.bonus else "corrected")
        yield Event(rest, decoder.push(rest), kind)
