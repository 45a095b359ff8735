#!/usr/bin/env python3
"""Measure bundles on an execution provider: what tools/gpu_check.sh runs after ortspec verify.

For each bundle (as tools/gpu_make_bundles.py builds them):
  * pass-size invariance of the target, bitwise, for passes of 1..9 positions with rollbacks and a fresh
    prefill (which pass sizes give every position the same bits), and plain one-position passes for contrast;
  * step costs: C_t(1..9) and the draft step C_d, measured in decoding rounds (ortspec's calibration);
  * decoding, target-only and speculative (gamma 1, 2, 4), interleaved on the same prompts, greedy and with
    Qwen's sampling settings: tokens/s, host share (time outside onnxruntime) and how many logits rows
    reached the host in full;
  * the speedup the cost model predicts from those step costs and the per-position acceptance the real
    pairs measured on the CPU (tools/gpu_alphas.json): random weights accept nothing meaningful.

Writes OUT/gpu_check.json and OUT/gpu_check.md (a table for the README).

    python tools/gpu_check.py BUNDLE_DIR --provider cuda --out OUT
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
import time

import numpy as np

SAMPLED = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
ALPHAS = Path(__file__).with_name("gpu_alphas.json")


def decode(gen, prompts: list[list[int]], tokens: int, gammas: list[int], sampled: bool) -> dict:
    """Target-only and each gamma, interleaved prompt by prompt; medians of per-prompt tokens/s."""
    settings = {"target-only": (gen.sibling("none"), 0)} | {f"gamma={g}": (gen, g) for g in gammas}
    lms = [gen.target] + ([gen.drafter.lm] if getattr(gen.drafter, "lm", None) is not None else [])
    per: dict[str, dict[str, list]] = {name: {"tok_s": [], "host": [], "copied": [], "read": []} for name in settings}
    mode = SAMPLED if sampled else dict(do_sample=False)
    for j, ids in enumerate(prompts):
        for name, (g, gamma) in settings.items():
            for lm in lms:
                lm.rows_read = lm.rows_copied = 0
            res = g.generate(input_ids=ids, max_new_tokens=tokens, num_draft_tokens=gamma, seed=j,
                             eos_token_id=[], **mode)
            s = res.stats
            per[name]["tok_s"].append(s.tokens_per_s)
            per[name]["host"].append(s.overhead_time_s / s.total_time_s)
            per[name]["copied"].append(sum(lm.rows_copied for lm in lms))
            per[name]["read"].append(sum(lm.rows_read for lm in lms))
    base = np.array(per["target-only"]["tok_s"])
    return {name: {"tokens_per_s": float(np.median(v["tok_s"])),
                   "speedup": float(np.median(np.array(v["tok_s"]) / base)),
                   "host_share": float(np.median(v["host"])),
                   "rows_copied": int(sum(v["copied"])), "rows_read_on_device": int(sum(v["read"]))}
            for name, v in per.items()}


def predict(profile: dict, pairs: dict, key: str) -> dict:
    from ortspec.control.costmodel import best_gamma, predicted_speedup
    pair = pairs.get(key)
    if pair is None or profile.get("draft_cost") is None:
        return {}
    out = {"pair": pair["name"]}  # against plain target steps C_t(1), as the cost model defines it
    costs = profile["target_costs"]
    for mode in ("greedy", "sampled"):
        alphas = pair[mode]
        out[mode] = {f"gamma={g}": round(predicted_speedup(alphas, g, profile["draft_cost"], costs), 3)
                     for g in (1, 2, 4)}
        g, s = best_gamma(alphas, profile["draft_cost"], costs, len(alphas))
        out[mode]["best"] = {"gamma": g, "speedup": round(s, 3)}
    return out


def check_bundle(path: Path, provider: str, tokens: int, prompts: int, reps: int, pairs: dict) -> dict:
    from ortspec import SpeculativeGenerator
    from ortspec.control.calibrate import measure
    from ortspec.exactness import invariance_check
    gen = SpeculativeGenerator.load(path, provider=provider)
    rng = np.random.default_rng(0)
    vocab = gen.target.spec.output_vocab
    context = [int(t) for t in rng.integers(3, min(vocab, 30000), 64)]
    t0 = time.perf_counter()
    report = {"bundle": path.name, "provider": provider, "dtype": gen.target.spec.dtype,
              "logits_on_device": gen.target.logits_on_device}
    report["invariance"] = invariance_check(gen.target, context, positions=18, sizes=range(1, 10))
    draft = getattr(gen.drafter, "lm", None)
    profile = measure(gen.target, draft, context=128, max_k=9, reps=reps)
    report["step_ms"] = {"target": [round(c * 1e3, 3) for c in profile["target_costs"]],
                         "draft": round(profile["draft_cost"] * 1e3, 3) if draft is not None else None}
    texts = [[1] + [int(t) for t in rng.integers(3, min(vocab, 30000), 40 + 8 * j)] for j in range(prompts)]
    report["greedy"] = decode(gen, texts, tokens, [1, 2, 4], sampled=False)
    report["sampled"] = decode(gen, texts, tokens, [1, 2, 4], sampled=True)
    report["predicted"] = predict(profile, pairs, path.name.split("-")[0])
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def table(reports: list[dict]) -> str:
    """The README table: one line per bundle and mode."""
    lines = ["| bundle | dtype | invariant pass sizes (of 1–9) | C_t(1..9) ms | C_d ms | mode | γ=1 | γ=2 | γ=4 | "
             "host share (target-only / γ=4) | predicted (real acceptance) |",
             "|---|---|---|---|---|---|---:|---:|---:|---|---|"]
    for r in reports:
        sizes = r["invariance"]["sizes"]
        same = [k for k, v in sizes.items() if v["equal_rows"] == r["invariance"]["positions"]]
        steps = " ".join(f"{c:.2f}" for c in r["step_ms"]["target"])
        for mode in ("greedy", "sampled"):
            d = r[mode]
            pred = r["predicted"].get(mode, {})
            best = pred.get("best")
            pred_text = (f"{best['speedup']:.2f}× at γ={best['gamma']}" if best else "")
            lines.append(f"| {r['bundle']} | {r['dtype']} | {','.join(map(str, same)) or 'none'} | {steps} | "
                         f"{r['step_ms']['draft'] or ''} | {mode} | {d['gamma=1']['speedup']:.2f}× | "
                         f"{d['gamma=2']['speedup']:.2f}× | {d['gamma=4']['speedup']:.2f}× | "
                         f"{d['target-only']['host_share']:.1%} / {d['gamma=4']['host_share']:.1%} | {pred_text} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", help="directory of bundles (tools/gpu_make_bundles.py OUT_DIR)")
    ap.add_argument("--provider", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--out", required=True, help="directory for gpu_check.json and gpu_check.md")
    ap.add_argument("--only", nargs="*", default=["smollm2-fp16", "qwen-fp16"], help="bundle names to measure")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per generation")
    ap.add_argument("--prompts", type=int, default=3, help="random prompts per setting")
    ap.add_argument("--reps", type=int, default=10, help="repetitions per step-cost sample")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = json.loads(ALPHAS.read_text())["pairs"]
    reports = []
    for name in args.only:
        path = Path(args.bundles) / name
        print(f"== {name} on {args.provider}", flush=True)
        reports.append(check_bundle(path, args.provider, args.tokens, args.prompts, args.reps, pairs))
        r = reports[-1]
        print(f"   invariant: {r['invariance']['invariant']}; C_t(1..9) ms {r['step_ms']['target']}; "
              f"C_d ms {r['step_ms']['draft']}; greedy γ=4 {r['greedy']['gamma=4']['speedup']:.2f}× "
              f"(host {r['greedy']['gamma=4']['host_share']:.1%}); predicted {r['predicted']}", flush=True)
        (out / "gpu_check.json").write_text(json.dumps(reports, indent=2))  # kept as it grows: a timeout loses less
    (out / "gpu_check.md").write_text(table(reports))
    print(table(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
