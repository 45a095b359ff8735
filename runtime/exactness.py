"""Exactness checks of a pair on this machine: pass-size invariance, greedy equality, distribution.

Bitwise decoding (the default) computes every committed token's logits in
passes whose per-position results do not depend on the pass, so speculative
greedy output must equal target-only greedy output token for token: any
divergence is a mismatch. ``invariance_check`` measures that property for the
target on this machine and provider, bit for bit. Where it does not hold (or
with ``bitwise=False``), rounding can flip an argmax at a near-tie, and
divergences are classified: a *near-tie* when the target's top-2 margin at the
diverging position (from a fresh prefill of the common prefix) is below
``tie_tolerance``, else a real *mismatch*.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, asdict
from typing import Sequence

import numpy as np

from .sampling import LogitsPipeline
from .config import SamplingConfig
from .drafting import common_prefix
from .engine import PLAIN, PassOptions
from .errors import OrtspecError


@dataclass
class Divergence:
    prompt_index: int
    drafter: str
    gamma: int
    position: int          # index into the new tokens
    target_token: int      # what target-only greedy produced
    speculative_token: int
    margin: float          # top-1 minus top-2 target logit at that position
    near_tie: bool


@dataclass
class GreedyReport:
    prompts: int = 0
    runs: int = 0
    mismatches: int = 0
    near_ties: int = 0
    near_ties_allowed: bool = False   # False: every divergence counts as a mismatch
    divergences: list = field(default_factory=list)
    answers: list = field(default_factory=list)  # target-only greedy answer per prompt (not in to_dict)

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "runs": self.runs, "mismatches": self.mismatches,
                "near_ties": self.near_ties, "near_ties_allowed": self.near_ties_allowed,
                "divergences": [asdict(d) for d in self.divergences]}


def greedy_check(bundle_dir: str, prompts: Sequence[list[int]], gammas: Sequence,
                 drafters: Sequence[str] = ("model",), max_new_tokens: int = 64,
                 tie_tolerance: float = 1e-4, allow_near_ties: bool = False, bitwise: bool = True,
                 baseline_bitwise: bool | None = None, provider: str = "cpu", threads: int | None = None,
                 thread_pool: str = "session", repetition_penalty: float = 1.0, progress=None) -> GreedyReport:
    """Compare speculative greedy output with target-only greedy output, token for token.

    gammas: draft lengths (integers and/or "auto"). With ``allow_near_ties`` a divergence at a top-2
    margin below ``tie_tolerance`` is reported as a near-tie instead of a mismatch. ``bitwise`` applies
    to the speculative runs and, unless ``baseline_bitwise`` says otherwise, to the target-only runs.
    """
    from .generator import SpeculativeGenerator

    first = SpeculativeGenerator.load(bundle_dir, provider=provider, drafter=drafters[0], threads=threads,
                                      thread_pool=thread_pool,
                                      verify="none")
    base = first.sibling("none")  # one copy of the target in memory
    gens = {d: first if d == drafters[0] else first.sibling(d) for d in drafters}
    pipe = LogitsPipeline(SamplingConfig(repetition_penalty=repetition_penalty), base.vocab_size)
    report = GreedyReport(prompts=len(prompts), near_ties_allowed=allow_near_ties)
    kw = dict(max_new_tokens=max_new_tokens, repetition_penalty=repetition_penalty, do_sample=False)
    base_bitwise = bitwise if baseline_bitwise is None else baseline_bitwise
    for i, ids in enumerate(prompts):
        want = base.generate(input_ids=ids, bitwise=base_bitwise, **kw).token_ids
        report.answers.append(want)
        for drafter, gen in gens.items():
            for gamma in gammas:
                got = gen.generate(input_ids=ids, num_draft_tokens=gamma, bitwise=bitwise, **kw).token_ids
                report.runs += 1
                if progress:
                    progress(report.runs)
                if got == want:
                    continue
                pos = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                context = list(ids) + want[:pos]
                scores = pipe.scores(base.target.reference_logits(context)[-1:], context)[0]
                top = np.sort(scores)[-2:]
                margin = float(top[1] - top[0])
                tie = allow_near_ties and margin < tie_tolerance
                report.divergences.append(Divergence(
                    i, drafter, gamma, pos, int(want[pos]) if pos < len(want) else -1,
                    int(got[pos]) if pos < len(got) else -1, margin, tie))
                if tie:
                    report.near_ties += 1
                else:
                    report.mismatches += 1
    return report


# -- pass-size invariance --------------------------------------------------------
def invariance_check(lm, context: Sequence[int], positions: int = 12, sizes: Sequence[int] = range(1, 10),
                     bitwise: bool = True) -> dict:
    """Bit-for-bit comparison of each position's logits however the runtime passes it to the model.

    ``positions`` tokens after ``context`` are fed in passes of each size in ``sizes`` (after every pass
    the cache is rolled back by half of it and the rest re-fed, as rejected drafts are), and once more by a
    fresh prefill of the whole sequence; every row must equal the row of one pass over all ``positions``.
    With ``bitwise`` the model runs as bitwise decoding does (a single token is passed with the token
    before it); the result also reports what plain one-position passes give, for comparison.
    """
    context = [int(t) for t in context]
    fed = [int(context[i % len(context)]) for i in range(positions)]
    options = PassOptions(bitwise=bitwise)

    def rows_in_passes(size: int, options: PassOptions) -> tuple[np.ndarray, int]:
        lm.rollback(min(lm.length, len(context)))
        got: dict[int, list] = {}
        pos = 0
        while pos < positions:
            k = min(size, positions - pos)
            for j, row in enumerate(lm.forward(fed[pos:pos + k], options=options)):
                got.setdefault(pos + j, []).append(row)
            keep = k if k == 1 or pos + k == positions else (k + 1) // 2
            lm.rollback(len(context) + pos + keep)  # a rejection: the rest of the pass is fed again
            pos += keep
        worst, equal = 0.0, 0
        for i in range(positions):
            same = all(np.array_equal(r, reference[i]) for r in got[i])
            equal += same
            worst = max([worst] + [float(np.max(np.abs(r - reference[i]))) for r in got[i]])
        return worst, equal

    try:
        lm.prefill(context, options=options)
        reference = lm.forward(fed, options=options)
        report = {"positions": positions, "bitwise": bitwise, "sizes": {}}
        for size in sizes:
            worst, equal = rows_in_passes(size, options)
            report["sizes"][int(size)] = {"equal_rows": equal, "max_abs_diff": worst}
        fresh = lm.reference_logits(context + fed, options)[-positions:]
        report["prefill"] = {"equal_rows": sum(np.array_equal(a, b) for a, b in zip(fresh, reference)),
                             "max_abs_diff": float(np.max(np.abs(fresh - reference)))}
        report["invariant"] = (all(v["equal_rows"] == positions for v in report["sizes"].values())
                               and report["prefill"]["equal_rows"] == positions)
        if bitwise:
            worst, equal = rows_in_passes(1, PLAIN)
            report["one_position_passes"] = {"equal_rows": equal, "max_abs_diff": worst}
        return report
    finally:
        lm.reset()


# -- distribution check ----------------------------------------------------------
class MemoLM:
    """Stands in for a CausalLM with the same interface; logits are memoized by token prefix.

    Lets tens of thousands of speculative rounds from a few fixed prefixes run
    through the real drafter, pipeline and verifier while each distinct
    context is computed by the real model only once.

    With a ``horizon`` (prefix length, K) set, contexts that extend the prefix
    by K or more tokens get the prefix's own row as a stand-in instead of a
    model run: such a row decides only tokens after the first K committed
    ones (verification runs left to right), so the distribution of the first K
    tokens — all the check measures — is unchanged, and deep draft blocks cost
    nothing.
    """

    def __init__(self, lm, max_bytes: int = 1_500_000_000):
        self.lm, self.spec, self.provider = lm, lm.spec, lm.provider
        self.static = lm.static
        self.tokens: list[int] = []
        self._memo: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
        self._max_rows = max(64, max_bytes // (4 * lm.spec.output_vocab))
        self.horizon: tuple[int, int] | None = None
        self.row_tile = lm.row_tile

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def canonical_length(self) -> int:
        return len(self.tokens)  # memoized rows are what they are: any cached prefix may be reused

    @property
    def capacity(self) -> int:
        return self.lm.capacity

    @property
    def run_time_s(self) -> float:
        return self.lm.run_time_s

    def reset(self) -> None:
        self.tokens = []

    def reserve(self, positions: int) -> None:
        pass

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback length must be in [0, {self.length}], got {length}")
        del self.tokens[length:]

    def prefill(self, ids, keep=None, options: PassOptions = PLAIN):
        self.reset()
        return self.forward(ids, keep, options=options)

    def new_round(self) -> None:
        pass  # (memoized rows are copies of its own)

    def release_rows(self) -> None:
        pass

    def forward(self, ids, keep=None, reuse=False, options: PassOptions = PLAIN) -> np.ndarray:
        full = self.tokens + [int(t) for t in ids]
        start = len(self.tokens)
        keys = [tuple(full[: j + 1]) for j in range(start, len(full))]
        if self.horizon is not None:
            base, k = self.horizon
            stand_in = tuple(full[:base])
            keys = [key if len(key) - base < k else stand_in for key in keys]
            if stand_in in keys and stand_in not in self._memo:
                self._memo[stand_in] = self.lm.reference_logits(list(stand_in), options)[-1].copy()
        for k in keys:  # freshly used rows are the last to be evicted
            if k in self._memo:
                self._memo.move_to_end(k)
        if any(k not in self._memo for k in keys):
            real = self.lm
            end = start + len(keys)
            while tuple(full[:end]) not in keys:  # stand-ins need no run
                end -= 1
            real.rollback(min(common_prefix(real.tokens, full), start))
            first = real.length
            rows = real.forward(full[first:end], options=options)
            for j, row in zip(range(first, end), rows):
                self._memo[tuple(full[: j + 1])] = row.copy()  # not a view: it would pin a runtime buffer
            while len(self._memo) > self._max_rows:
                self._memo.popitem(last=False)
        out = np.stack([self._memo[k] for k in keys[len(keys) - (keep or len(keys)):]])
        self.tokens = full
        return out

    forward_rows = forward  # memoized rows live on the host

    def reference_logits(self, ids, options: PassOptions = PLAIN) -> np.ndarray:
        return self.lm.reference_logits(ids, options)


def wrong_verify(draft_tokens, draft_dists, target_dist, rng, min_mass=None):
    """A deliberately wrong verifier for negative controls: resamples from p, not max(0, p - q)."""
    from .verify import Verdict, acceptance_probability
    for i, tok in enumerate(draft_tokens):
        p = target_dist(i)
        if rng.random() >= acceptance_probability(p.prob(tok), draft_dists[i].prob(tok)):
            return Verdict(i, p.sample(rng), False)
    return Verdict(len(draft_tokens), target_dist(len(draft_tokens)).sample(rng), True)


@dataclass
class DistributionResult:
    p_value: float      # Bonferroni-adjusted over prefixes and K
    tv: float           # largest total variation distance seen
    tv_bound: float     # its sampling-error bound
    samples: int
    tests: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"p_value": self.p_value, "tv": self.tv, "tv_bound": self.tv_bound, "samples": self.samples,
                "tests": self.tests}


def memoized_generator(bundle_dir: str, drafter: str, provider: str = "cpu", threads: int | None = None,
                       thread_pool: str = "session"):
    from .generator import SpeculativeGenerator
    # the draft keeps its own cache: rows memoized by token prefix must not depend on where its K/V came from
    # (what the check measures, the verification rules, holds for any draft)
    gen = SpeculativeGenerator.load(bundle_dir, provider=provider, drafter=drafter, threads=threads, verify="none",
                                    thread_pool=thread_pool, draft_kv="own")
    gen.target = MemoLM(gen.target)
    if gen.drafter.lm is not None:
        gen.drafter.lm = MemoLM(gen.drafter.lm)
    return gen


def sampled_pipeline(gen, sampling: dict) -> LogitsPipeline:
    """The rows generate() samples from with these settings (a setting left out: the bundle's, else
    transformers' default)."""
    return LogitsPipeline(SamplingConfig(**gen.sampling_settings(**(sampling | {"do_sample": True}))),
                          gen.vocab_size)


def distribution_check(gen, prefixes: Sequence[list[int]], sampling: dict, gamma: int, samples: int,
                       ks: Sequence[int] = (1, 2), seed: int = 0, alpha: float = 1e-3, progress=None) -> DistributionResult:
    """First-K-token distribution of full speculative rounds vs the exact target-only distribution."""
    from .stats import pooled_chi_square, tv_sampling_bound
    k_max = max(ks)
    pipe = sampled_pipeline(gen, sampling)
    per_prefix = max(1, samples // len(prefixes))
    tests, p_values = [], []
    for pi, prefix in enumerate(prefixes):
        for lm in (gen.target, gen.drafter.lm):
            if isinstance(lm, MemoLM):
                lm.horizon = (len(prefix), k_max)
        seqs = []
        for i in range(per_prefix):
            res = gen.generate(input_ids=prefix, max_new_tokens=max(k_max, gamma + 1), do_sample=True,
                               seed=seed * 1_000_003 + pi * 100_003 + i, num_draft_tokens=gamma,
                               eos_token_id=[], **sampling)
            if res.stats.draft_error:  # the rest of that request was target-only decoding: nothing to measure
                raise OrtspecError(f"the drafter failed during the check ({res.stats.draft_error}); nothing about "
                                   "speculative decoding was measured")
            seqs.append(tuple(res.token_ids[:k_max]))
            if progress and (i + 1) % 500 == 0:
                progress(pi * per_prefix + i + 1, per_prefix * len(prefixes))
        target = gen.target.lm if isinstance(gen.target, MemoLM) else gen.target

        def probs_after(extra: list[int]) -> np.ndarray:
            ctx = list(prefix) + extra
            return pipe.probs(target.reference_logits(ctx)[-1:], ctx)[0]

        p1 = probs_after([])
        for k in ks:
            if k == 1:
                counts = np.bincount([s[0] for s in seqs], minlength=p1.size).astype(np.float64)
                exact = p1
            else:  # k == 2: blocks for heavy first tokens, one pooled cell for the rest
                heavy = [int(x) for x in np.nonzero(p1 * per_prefix >= 5)[0]]
                index = {x: j for j, x in enumerate(heavy)}
                exact_parts = [p1[x] * probs_after([x]) for x in heavy] + [np.array([1 - p1[heavy].sum()])]
                exact = np.concatenate(exact_parts)
                counts = np.zeros_like(exact)
                for s in seqs:
                    j = index.get(s[0])
                    counts[j * p1.size + s[1] if j is not None else -1] += 1
            p, cells, tv = pooled_chi_square(counts, exact)
            tests.append({"prefix": pi, "k": k, "p_value": p, "tv": tv,
                          "tv_bound": tv_sampling_bound(cells, per_prefix), "cells": cells})
            p_values.append(p)
    worst = max(tests, key=lambda t: t["tv"] - t["tv_bound"])
    adjusted = min(1.0, min(p_values) * len(p_values))
    return DistributionResult(adjusted, worst["tv"], worst["tv_bound"], per_prefix * len(prefixes), tests)


def control_power(p: np.ndarray, q: np.ndarray) -> float:
    """How far the negative control's wrong rule moves the first token's distribution away from p, the draft's
    first token drawn from q: total variation between min(p, q) + (1 - sum min(p, q)) p (a rejection resampled
    from p) and p (the exact rule). Zero where q = p (nothing rejected) and where the two do not overlap (the
    residual is p); largest where they partly agree."""
    m = np.minimum(p, q)
    return 0.5 * float(np.abs(m - m.sum() * p).sum())


def choose_prefixes(gen, prompts: Sequence[list[int]], answers: Sequence[list[int]], sampling: dict, n: int,
                    depth: int = 8) -> list[dict]:
    """The n prefixes for the distribution check: among each prompt followed by the first j <= depth tokens of
    its target-only greedy answer, those where the control's wrong rule differs most from the exact rule
    (``control_power`` of the target's and the draft model's processed first-token rows). A check whose
    prefixes all have near one-hot rows under the sampling settings (a peaked instruct model at top-p 0.8)
    cannot tell a wrong rule apart at any sample size. Without a draft model: the first n prompts."""
    draft = gen.drafter.lm
    if draft is None:
        return [{"prompt": i, "answer_tokens": 0, "ids": list(ids)} for i, ids in enumerate(prompts[:n])]
    pipe = sampled_pipeline(gen, sampling)
    found = []
    for i, (ids, answer) in enumerate(zip(prompts, answers)):
        extra = [int(t) for t in answer[:depth]]
        ctx = list(ids) + extra
        rows = slice(len(ids) - 1, len(ctx))  # the rows that predict each candidate's next token
        p = pipe.probs(gen.target.reference_logits(ctx)[rows], ids, extra)
        q = pipe.probs(draft.reference_logits(ctx)[rows], ids, extra)
        for j in range(len(extra) + 1):
            found.append({"prompt": i, "answer_tokens": j, "ids": list(ids) + extra[:j],
                          "control_tv": round(control_power(p[j], q[j]), 6)})
    found.sort(key=lambda c: -c["control_tv"])  # stable: ties keep the prompts' order
    return found[:n]


def run_verify(bundle_dir: str, prompts: Sequence[list[int]], gammas: Sequence[int], sampling: dict,
               samples: int = 20_000, seed: int = 0, prefixes: int = 2, ks: Sequence[int] = (1, 2),
               drafter: str | None = None, max_new_tokens: int = 32, alpha: float = 1e-3,
               provider: str = "cpu", threads: int | None = None, configure=None, progress=None,
               thread_pool: str = "session") -> dict:
    """The whole certificate: pass-size invariance, greedy equality, distribution test, negative control.

    ``configure(generator)`` may alter the generator under test before the distribution check (the tests
    use it to plant bugs the check must catch).
    """
    from .bundle import load_bundle
    from .engine import CausalLM
    bundle = load_bundle(bundle_dir)
    drafter = drafter or ("model" if bundle.draft is not None else "prompt_lookup")
    say = progress or (lambda *_: None)
    say("pass-size invariance check")
    lm = CausalLM(bundle.target, str(bundle.file(bundle.target.path)), provider, threads, thread_pool=thread_pool)
    invariance = invariance_check(lm, prompts[0], sizes=range(1, max(gammas) + 2))
    del lm
    say("greedy check")
    greedy = greedy_check(bundle_dir, prompts, gammas, drafters=(drafter,), max_new_tokens=max_new_tokens,
                          allow_near_ties=not invariance["invariant"],
                          repetition_penalty=sampling.get("repetition_penalty", 1.0), provider=provider,
                          threads=threads, thread_pool=thread_pool)
    gen = memoized_generator(bundle_dir, drafter, provider, threads, thread_pool)
    if configure is not None:
        configure(gen)
    gamma = max(gammas)
    picked = choose_prefixes(gen, prompts, greedy.answers, sampling, prefixes)
    chosen = [c.pop("ids") for c in picked]
    say("distribution check")
    dist = distribution_check(gen, chosen, sampling, gamma, samples, ks, seed, alpha)
    say("negative control")
    gen.sampled_verify = wrong_verify
    control = distribution_check(gen, chosen, sampling, gamma, samples, ks, seed + 1, alpha)
    rejected = control.p_value < alpha
    if greedy.mismatches or dist.p_value < alpha:
        verdict = "fail"
    elif not rejected:
        verdict = "inconclusive"
    else:
        verdict = "pass"
    return {"verdict": verdict, "bundle": str(bundle_dir), "drafter": drafter, "num_draft_tokens": list(gammas),
            "sampling": sampling, "alpha": alpha, "invariance": invariance, "greedy": greedy.to_dict(),
            "prefixes": picked, "distribution": dist.to_dict(),
            "negative_control": {"p_value": control.p_value, "rejected": rejected, "tv": control.tv,
                                 "verifier": "resamples from p instead of the residual"}}


def format_verify(r: dict) -> str:
    g, d, c, inv = r["greedy"], r["distribution"], r["negative_control"], r["invariance"]
    sizes = inv["sizes"]
    same = [s for s, v in sizes.items() if v["equal_rows"] == inv["positions"]]
    lines = [f"ortspec verify {r['bundle']} (drafter {r['drafter']}, gamma {r['num_draft_tokens']})"]
    if inv["invariant"]:
        lines.append(f"  pass-size invariance: {inv['positions']} positions fed in passes of {min(sizes)}-{max(sizes)} "
                     "tokens (with rollbacks) and by a fresh prefill: every row bit-identical")
    else:
        lines.append(f"  pass-size invariance: NOT invariant here - bit-identical rows only for pass sizes "
                     f"{same or 'none'}; prefill rows equal {inv['prefill']['equal_rows']}/{inv['positions']}. "
                     "Greedy output can then differ from target-only output at near-ties")
    one = inv.get("one_position_passes")
    if one:
        lines.append(f"    (plain one-position passes, which bitwise decoding avoids: {one['equal_rows']}/"
                     f"{inv['positions']} rows identical, max |diff| {one['max_abs_diff']:.2g})")
    allowance = "near-ties allowed (not invariant)" if g["near_ties_allowed"] else "no near-tie allowance"
    lines.append(f"  greedy: {g['runs']} runs over {g['prompts']} prompts: {g['mismatches']} mismatches"
                 + (f", {g['near_ties']} near-ties (top-2 margin < 1e-4)" if g["near_ties_allowed"] else "")
                 + f" ({allowance})")
    for dv in g["divergences"][:5]:
        kind = "near-tie" if dv["near_tie"] else "MISMATCH"
        lines.append(f"    {kind}: prompt {dv['prompt_index']} gamma {dv['gamma']} position {dv['position']}: "
                     f"target {dv['target_token']} vs speculative {dv['speculative_token']} (margin {dv['margin']:.2e})")
    if any("control_tv" in c for c in r.get("prefixes", ())):
        lines.append("  prefixes: " + ", ".join(f"prompt {c['prompt']} + {c['answer_tokens']} answer tokens "
                                                f"(wrong rule's TV {c['control_tv']:.3f})" for c in r["prefixes"]))
    lines.append(f"  distribution ({d['samples']} samples, {r['sampling']}): p = {d['p_value']:.3g} "
                 f"(Bonferroni over {len(d['tests'])} tests), TV = {d['tv']:.4f} (sampling bound {d['tv_bound']:.4f})")
    lines.append(f"  negative control ({c['verifier']}): p = {c['p_value']:.3g} -> "
                 + ("rejected, so the test can detect a wrong rule" if c["rejected"] else "NOT rejected: the test lacks power"))
    lines.append({"pass": "verdict: PASS - output is distributed as the target's on this machine",
                  "fail": "verdict: FAIL - speculative output differs from the target's",
                  "inconclusive": "verdict: INCONCLUSIVE - increase --samples"}[r["verdict"]])
    return "\n".join(lines)
