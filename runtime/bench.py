"""`ortspec bench`: speculative vs target-only decoding, interleaved in one process.

For every prompt (and repeat) two target-only baselines (drafter "none": the
bitwise reference, whose steps are passes of two positions, and plain
one-position steps, which round differently on quantized targets) and every
draft length run back to back in a rotating order, so machine noise hits all
settings alike. Speedup is the median over prompts of (setting tokens/s /
baseline tokens/s on the same prompt), against the faster of the two baselines. The ideal speedup is what the cost
model predicts from the measured per-position acceptance and the pass costs timed in the same run (each
setting's own target passes and draft steps, against the faster baseline's target time per token; rounds
that read a prompt left out): the most any decoding loop could gain from that acceptance on that machine,
after the first token. Efficiency = the decode speedup over all prompts together / ideal shows what the
runtime loses around the passes.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .control.calibrate import load_profile, machine, measure, save_profile
from .control.costmodel import best_gamma, expected_tokens, predicted_speedup
from .generator import SpeculativeGenerator, Stats

ONE_POSITION = "none-1pos"  # target-only decoding with one-position passes (bitwise=False)


@dataclass
class _Acc:
    """Accumulated measurements of one setting."""

    tokens: int = 0
    seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    target_s: float = 0.0
    draft_s: float = 0.0
    reached_at: list = field(default_factory=list)
    accepted_at: list = field(default_factory=list)
    latencies: list = field(default_factory=list)
    first_token: list = field(default_factory=list)
    min_mass: list = field(default_factory=list)
    verified: list = field(default_factory=list)
    per_prompt: list = field(default_factory=list)
    pass_s: dict = field(default_factory=dict)    # target pass positions -> run times of passes that size
    step_s: list = field(default_factory=list)    # draft model time per drafted token, per round
    timed_target_s: float = 0.0                   # target time over the rounds that read no prompt ...
    timed_tokens: int = 0                         # ... and the tokens they committed
    decode_tokens: int = 0                        # tokens after each request's first, and their time
    decode_s: float = 0.0
    draft_errors: list = field(default_factory=list)  # why the drafter failed, per run where it did

    def add(self, s: Stats, prompt_id: str) -> None:
        if s.draft_disabled:
            self.draft_errors.append(s.draft_error)
        self.tokens += s.new_tokens
        self.seconds += s.total_time_s
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.rounds += s.rounds
        self.target_s += s.target_time_s
        self.draft_s += s.draft_time_s
        for totals, values in ((self.reached_at, s.reached_at), (self.accepted_at, s.accepted_at),
                               (self.min_mass, s.min_mass_at), (self.verified, s.verified_at)):
            totals.extend([0] * (len(values) - len(totals)))  # per draft position, growing as needed
            for i, v in enumerate(values):
                totals[i] += v
        for t, n in zip(s.round_times_s, s.round_tokens):
            self.latencies.extend([t / n] * n)
        for timed, gamma, n in zip(s.round_passes, s.round_gammas, s.round_tokens):
            if timed is None:
                continue  # the round read a prompt too
            positions, target_s, draft_s = timed
            self.pass_s.setdefault(positions, []).append(target_s)
            self.timed_target_s += target_s
            self.timed_tokens += n
            if gamma and draft_s > 0:
                self.step_s.append(draft_s / gamma)
        self.first_token.append(s.first_token_s)
        if s.new_tokens > 1:
            self.decode_tokens += s.new_tokens - 1
            self.decode_s += s.total_time_s - s.first_token_s
        self.per_prompt.append({"prompt": prompt_id, "tokens": s.new_tokens, "tokens_per_s": s.tokens_per_s,
                                "acceptance_rate": s.acceptance_rate, "tokens_per_round": s.tokens_per_round})

    def alphas(self) -> list[float]:
        """Conditional per-position acceptance: P(draft i accepted | drafts before it were)."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_at, self.reached_at)]


def load_prompts(path: Path) -> list[dict]:
    items = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n} is not JSON ({exc}); each line must be {{\"prompt\": ...}}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise ValueError(f"{path}:{n} has no non-empty \"prompt\" string")
        items.append({"id": str(obj.get("id", n)), "prompt": obj["prompt"], "kind": str(obj.get("kind", ""))})
    if not items:
        raise ValueError(f"{path} holds no prompts")
    return items


def run_bench(bundle: str, prompts: list[dict], gammas: list, drafter: str | None = None, max_new_tokens: int = 128,
              repeat: int = 1, chat: bool | None = None, provider: str = "cpu", threads: int | None = None,
              thread_pool: str = "session",
              calibrate: bool = False, sampling: dict | None = None, progress=None,
              draft_window: int | None = 512, draft_kv: str = "auto") -> dict:
    sampling = dict(sampling or {})
    spec = SpeculativeGenerator.load(bundle, provider=provider, drafter=drafter, threads=threads, verify="none",
                                     thread_pool=thread_pool, draft_window=draft_window, draft_kv=draft_kv)
    spec.record_min_mass = True  # the report gives sum_x min(p, q) per position
    drafter = drafter or spec.bundle.default_drafter
    base = spec.sibling("none")  # same target session: one copy of the weights in memory
    sampling = spec.sampling_settings(**sampling)  # flags left out: the bundle's generation config
    if chat is None:
        chat = bool(base.codec and base.codec.chat_template)
    lm = spec.drafter.lm
    profile = None if calibrate else load_profile(spec.bundle.root, provider)
    if profile is None or (lm is not None and "draft_cost" not in profile):
        if progress:
            progress("calibrating step costs")
        profile = measure(spec.target, lm)
        save_profile(spec.bundle.root, provider, profile)
    encode = (lambda p: base.codec.encode(p, chat=chat)) if base.codec else None
    if encode is None:
        raise ValueError("this bundle has no tokenizer; bench needs text prompts")
    settings = ["none", ONE_POSITION] + list(gammas)
    accs = {str(s): _Acc() for s in settings}
    warm = encode(prompts[0]["prompt"])
    base.generate(input_ids=warm, max_new_tokens=8)
    spec.generate(input_ids=warm, max_new_tokens=8, num_draft_tokens=gammas[0])
    total, done, t0 = len(prompts) * repeat * len(settings), 0, time.perf_counter()
    per_prompt: list[dict] = []
    for r in range(repeat):
        for k, item in enumerate(prompts):
            ids = encode(item["prompt"])
            order = settings[(k + r) % len(settings):] + settings[:(k + r) % len(settings)]
            tps, dps = {}, {}
            for s in order:
                gen = base if s in ("none", ONE_POSITION) else spec
                kw = {"bitwise": False} if s == ONE_POSITION else {} if s == "none" else {"num_draft_tokens": s}
                for model in filter(None, (spec.target, lm)):
                    model.reset()  # every run a new request: its prefill included (no prefix left by another)
                res = gen.generate(input_ids=ids, max_new_tokens=max_new_tokens, seed=r, **sampling, **kw)
                accs[str(s)].add(res.stats, item["id"])
                tps[str(s)], dps[str(s)] = res.stats.tokens_per_s, _decode_rate(res.stats)
                done += 1
                if progress:
                    eta = (time.perf_counter() - t0) / done * (total - done)
                    progress(f"{done}/{total} runs, ETA {eta:.0f} s")
            per_prompt.append((tps, dps))
    # the faster target-only decoding is the baseline of every speedup
    fastest = max(("none", ONE_POSITION), key=lambda s: accs[s].tokens / accs[s].seconds if accs[s].seconds else 0)
    ratios = {str(g): [t[str(g)] / t[fastest] if t[fastest] else 0.0 for t, _ in per_prompt] for g in gammas}
    decode = {str(g): [d[str(g)] / d[fastest] if d[fastest] else 0.0 for _, d in per_prompt] for g in gammas}
    return _report(bundle, accs, ratios, decode, gammas, profile, drafter, max_new_tokens, chat, sampling, provider,
                   fastest)


def _decode_rate(s: Stats) -> float:
    """Tokens/s after the first token (the prompt's prefill left out): what speculation speeds up."""
    rest = s.total_time_s - s.first_token_s
    return (s.new_tokens - 1) / rest if s.new_tokens > 1 and rest > 0 else 0.0


def _report(bundle, accs, ratios, decode, gammas, profile, drafter, max_new_tokens, chat, sampling, provider,
            fastest: str) -> dict:
    b = accs[fastest]
    costs = profile["target_costs"]
    draft_cost = 0.0 if drafter not in ("model", "hybrid") else float(profile.get("draft_cost", 0.0))

    def split(a: _Acc) -> dict:
        t = a.seconds or 1.0
        return {"target": a.target_s / t, "draft": a.draft_s / t, "overhead": max(0.0, 1 - (a.target_s + a.draft_s) / t)}

    def latency(a: _Acc) -> dict:
        lat = np.asarray(a.latencies) * 1000 if a.latencies else np.zeros(1)
        out = {f"p{q}_ms": float(np.percentile(lat, q)) for q in (50, 95, 99)}
        out["first_token_p50_ms"] = 1000 * float(np.median(a.first_token)) if a.first_token else 0.0
        return out

    rows = []
    for g in gammas:
        a = accs[str(g)]
        alphas = a.alphas()
        timed = _timed_costs(a, b, drafter == "model", draft_cost)
        if drafter == "hybrid":
            ideal = None  # rounds mix free lookups and model drafts: the cost model describes neither mix
        elif timed is not None:
            ideal = _timed_ideal(alphas, g, *timed)
        elif g == "auto":  # too few timed rounds (every request one round or two): the stored profile's costs
            ideal = best_gamma(alphas or [0.0], draft_cost, costs, max(1, len(alphas)))[1]
        else:
            ideal = predicted_speedup(alphas, int(g), draft_cost, costs)
        speedup = statistics.median(ratios[str(g)]) if ratios[str(g)] else 0.0
        decode_speedup = statistics.median(decode[str(g)]) if decode[str(g)] else 0.0
        decode_total = _decode_ratio(a, b)
        rows.append({"drafter": drafter, "num_draft_tokens": g, "tokens_per_s": a.tokens / a.seconds if a.seconds else 0.0,
                     "speedup": speedup,
                     "decode_speedup": decode_speedup, "acceptance_rate": a.accepted / a.drafted if a.drafted else 0.0,
                     "per_position_acceptance": alphas,
                     "per_position_reached": list(a.reached_at),  # (0: never reached; its acceptance means nothing)
                     "per_position_min_mass": [m / v if v else 0.0 for m, v in zip(a.min_mass, a.verified)],
                     "mean_tokens_per_round": a.tokens / a.rounds if a.rounds else 0.0,
                     "decode_speedup_total": decode_total,
                     "ideal_speedup": ideal, "efficiency": decode_total / ideal if ideal else None,
                     "timed_costs_s": None if timed is None else {"target_per_token": timed[0], "passes": timed[1],
                                                                  "draft_step": timed[2]},
                     "time_split": split(a), "latency": latency(a), "per_prompt": a.per_prompt,
                     "draft_failures": len(a.draft_errors), "draft_error": a.draft_errors[0] if a.draft_errors else None})
    def baseline(a: _Acc, kind: str) -> dict:
        return {"kind": kind, "tokens_per_s": a.tokens / a.seconds if a.seconds else 0.0, "time_split": split(a),
                "latency": latency(a), "per_prompt": a.per_prompt}

    kinds = {"none": "bitwise", ONE_POSITION: "one-position"}
    return {"bundle": str(bundle), "machine": dict(machine(), provider=provider),
            "config": {"max_new_tokens": max_new_tokens, "chat": chat, "sampling": sampling, "prompts": len(b.per_prompt)},
            "profile": {"draft_cost_s": draft_cost, "target_costs_s": costs},
            "baseline": baseline(b, kinds[fastest]),
            "baselines": {kinds[s]: baseline(accs[s], kinds[s]) for s in ("none", ONE_POSITION)},
            "settings": rows}


def _decode_ratio(a: _Acc, base: _Acc) -> float:
    """Tokens per second after the first token, all prompts together, over the baseline's: what the ideal
    describes (the median of per-prompt ratios in the decode column scatters around it)."""
    if not (a.decode_s and base.decode_s and base.decode_tokens):
        return 0.0
    return (a.decode_tokens / a.decode_s) / (base.decode_tokens / base.decode_s)


MIN_TIMED = 3  # passes of a size (or target-only rounds) before this run's timings stand for its cost


def _timed_costs(a: _Acc, base: _Acc, model: bool, profile_draft: float) -> tuple[float, dict, float] | None:
    """This run's costs for one setting: the faster baseline's target time per committed token, the median run
    time of the setting's target passes of each size (timed at least MIN_TIMED times) and, for a draft ``model``,
    its median time per drafted token (the profile's if no round timed one; lookups cost 0). None when either
    side has too few rounds that read no prompt."""
    if base.timed_tokens < MIN_TIMED or base.timed_target_s <= 0:
        return None
    passes = {k: statistics.median(v) for k, v in sorted(a.pass_s.items()) if k > 1 and len(v) >= MIN_TIMED}
    if not passes:
        return None
    step = (statistics.median(a.step_s) if a.step_s else profile_draft) if model else 0.0
    return base.timed_target_s / base.timed_tokens, passes, step


def _timed_ideal(alphas: list, g, per_token: float, passes: dict, step: float) -> float | None:
    """The cost model's speedup with this run's costs: a fixed gamma at its own pass size; auto at the best of
    the sizes it ran."""
    sizes = [int(g) + 1] if g != "auto" else list(passes)
    best = None
    for k in sizes:
        if k in passes and k > 1:
            s = expected_tokens(alphas, k - 1) * per_token / ((k - 1) * step + passes[k])
            best = s if best is None else max(best, s)
    return best


def format_table(report: dict) -> str:
    head = (f"{'setting':<16}{'tok/s':>8}{'speedup':>9}{'decode':>8}{'ideal':>7}{'eff':>6}{'accept':>8}{'tok/rnd':>8}"
            f"{'draft%':>7}{'target%':>8}{'other%':>7}{'p50ms':>7}{'p95ms':>7}{'p99ms':>7}{'ttft ms':>9}")
    lines = [head, "-" * len(head)]
    ref = report["baseline"]
    for kind, b in report["baselines"].items():
        name = "target bitwise" if kind == "bitwise" else "target 1-pos"
        lines.append(f"{name:<16}{b['tokens_per_s']:>8.1f}{b['tokens_per_s'] / ref['tokens_per_s']:>9.2f}"
                     f"{'':>8}{'':>7}{'':>6}{'':>8}{1.0:>8.2f}"
                     f"{0:>7.0%}{b['time_split']['target']:>8.0%}{b['time_split']['overhead']:>7.0%}"
                     f"{b['latency']['p50_ms']:>7.1f}{b['latency']['p95_ms']:>7.1f}{b['latency']['p99_ms']:>7.1f}"
                     f"{b['latency']['first_token_p50_ms']:>9.0f}")
    for r in report["settings"]:
        name = f"{r['drafter']} g={r['num_draft_tokens']}"
        t = r["time_split"]
        lines.append(f"{name:<16}{r['tokens_per_s']:>8.1f}{r['speedup']:>9.2f}{r['decode_speedup']:>8.2f}"
                     + (f"{r['ideal_speedup']:>7.2f}{r['efficiency']:>6.2f}" if r["ideal_speedup"] else f"{'-':>7}{'-':>6}")
                     + f"{r['acceptance_rate']:>8.0%}{r['mean_tokens_per_round']:>8.2f}"
                     f"{t['draft']:>7.0%}{t['target']:>8.0%}{t['overhead']:>7.0%}"
                     f"{r['latency']['p50_ms']:>7.1f}{r['latency']['p95_ms']:>7.1f}{r['latency']['p99_ms']:>7.1f}"
                     f"{r['latency']['first_token_p50_ms']:>9.0f}")
    for r in report["settings"]:
        reached = r.get("per_position_reached") or [1] * len(r["per_position_acceptance"])
        acc = " ".join(f"{a:.2f}" if n else "-" for a, n in zip(r["per_position_acceptance"], reached))
        mass = " ".join(f"{a:.2f}" for a in r.get("per_position_min_mass") or [])
        lines.append(f"  per-position acceptance, {r['drafter']} g={r['num_draft_tokens']}: {acc}"
                     + (f"   (sum min(p, q): {mass})" if mass else ""))
    for r in report["settings"]:
        if r.get("draft_failures"):
            lines.append(f"  DRAFT DISABLED in {r['draft_failures']} run(s) of {r['drafter']} g={r['num_draft_tokens']} "
                         f"(those runs went on target-only): {r['draft_error']}")
    lines.append("  speedup: tokens/s over the whole request; decode: after the first token (prefill left out); "
                 "ideal: the cost model's decode speedup from the acceptance and the pass costs timed in this run; "
                 "eff: decode speedup over all prompts together / ideal")
    lines.append(f"  speedups are against the faster target-only decoding: {ref['kind']} ("
                 "bitwise: every step a pass of two positions, output identical to speculative output; "
                 "1-pos: one-position steps, which round differently on quantized targets)")
    return "\n".join(lines)

