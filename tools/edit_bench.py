#!/usr/bin/env python3
"""Predicted Outputs on an edit workload: decode speed with the original file as the prediction, against target-only
decoding and the bundle's default drafter, greedy and sampled, interleaved.

    python tools/edit_bench.py models/smollm2-135m
    python tools/edit_bench.py models/qwen2.5-coder-int4 --max-new-tokens 512 --out edit.json

Each prompt is a Python file of ortspec's own (100-400 lines, shipped with the package) and a one-line change
request; the answer is the whole updated file, so it repeats the file nearly verbatim. Three configurations,
each its own generator (no configuration inherits another's caches or learned priors; every run starts from
an empty cache): target-only (drafter "none"), the bundle's default decoding, and the default decoding with the
original file (in its code fence) as the prediction. Settings: greedy, and sampled at temperature 0.7, top-p 0.8,
top-k 20, repetition penalty 1.05 (seeded). The order of the configurations rotates per prompt. Reported: decode
tokens/s (after the first token), the speedups over target-only, and the prediction's accepted and rejected
tokens. Greedy runs must give the same tokens in every configuration (exit 1 otherwise).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import statistics
import sys

import ortspec
from ortspec import SpeculativeGenerator

EDITS = [("drafting/hybrid.py", "Change PROBE_EVERY from 16 to 32."),
         ("drafting/lookup.py", "Change LONG_MAX from 60 to 48."),
         ("results.py", "Rename the method record_min_mass to add_min_mass."),
         ("metrics.py", "Add 600.0 at the end of BUCKETS."),
         ("drafting/prediction.py", "Change PAUSED from 4 to 6."),
         ("control/memory.py", "Add a blank line at the end of the file.")]
SAMPLED = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
CONFIGS = ("target-only", "default", "prediction")


def edit_prompts(limit: int) -> list[dict]:
    root = Path(ortspec.__file__).parent
    out = []
    for rel, request in EDITS[:limit]:
        code = (root / rel).read_text()
        prompt = (f"Here is a Python file:\n\n```python\n{code}```\n\n{request} Answer with the whole updated file "
                  "in one ```python code block and nothing else.")
        out.append({"id": rel, "lines": code.count("\n"), "prompt": prompt, "prediction": f"```python\n{code}```"})
    return out


def decode_rate(stats) -> float:
    rest = stats.total_time_s - stats.first_token_s
    return (stats.new_tokens - 1) / rest if stats.new_tokens > 1 and rest > 0 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--limit", type=int, default=4, help="edit prompts (default 4, at most %d)" % len(EDITS))
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--modes", default="greedy,sampled")
    ap.add_argument("--out", help="write the measurements as JSON")
    args = ap.parse_args()
    if not 1 <= args.limit <= len(EDITS) or args.max_new_tokens < 2:
        ap.error(f"--limit must be in 1..{len(EDITS)} and --max-new-tokens >= 2")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"greedy", "sampled"}:
        ap.error("--modes takes greedy and/or sampled")
    gens = {"target-only": SpeculativeGenerator.load(args.bundle, drafter="none", verify="none", thread_pool="shared"),
            "default": SpeculativeGenerator.load(args.bundle, verify="none", thread_pool="shared"),
            "prediction": SpeculativeGenerator.load(args.bundle, verify="none", thread_pool="shared")}
    prompts = edit_prompts(args.limit)
    warm = gens["default"].codec.encode("Hello", chat=True)
    for gen in gens.values():
        gen.generate(input_ids=warm, max_new_tokens=4)
    rows, mismatches = [], 0
    for k, item in enumerate(prompts):
        ids = gens["default"].codec.encode(item["prompt"], chat=True)
        for mode in modes:
            settings = dict(SAMPLED, seed=k) if mode == "sampled" else dict(do_sample=False)
            order = CONFIGS[k % 3:] + CONFIGS[:k % 3]
            got = {}
            for name in order:
                gen = gens[name]
                for lm in filter(None, (gen.target, gen.drafter.lm)):
                    lm.reset()  # every run from an empty cache: its prefill included
                extra = {"prediction": item["prediction"]} if name == "prediction" else {}
                res = gen.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, **settings, **extra)
                got[name] = res
            if mode == "greedy" and len({tuple(r.token_ids) for r in got.values()}) != 1:
                mismatches += 1
            base = decode_rate(got["target-only"].stats)
            row = {"prompt": item["id"], "lines": item["lines"], "prompt_tokens": len(ids), "mode": mode}
            for name, res in got.items():
                rate = decode_rate(res.stats)
                row[name] = {"tokens": len(res.token_ids), "decode_tok_s": rate, "speedup": rate / base if base else 0,
                             "tokens_per_round": res.stats.tokens_per_round,
                             "prediction_accepted": res.stats.prediction_accepted,
                             "prediction_rejected": res.stats.prediction_rejected}
            rows.append(row)
            print(f"{item['id']:<24}{mode:<8}" + "".join(
                f"{name} {row[name]['decode_tok_s']:6.1f} tok/s ({row[name]['speedup']:.2f}x)   " for name in CONFIGS)
                + f"prediction {row['prediction']['prediction_accepted']}/{row['prediction']['prediction_rejected']}"
                  " accepted/rejected", flush=True)
    summary = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {name: {"decode_tok_s": statistics.mean(r[name]["decode_tok_s"] for r in mine),
                                "speedup_median": statistics.median(r[name]["speedup"] for r in mine)}
                         for name in CONFIGS}
        print(f"{mode}: " + ", ".join(f"{name} {s['decode_tok_s']:.1f} tok/s (median {s['speedup_median']:.2f}x)"
                                      for name, s in summary[mode].items()))
    if mismatches:
        print(f"{mismatches} greedy prompt(s) gave different tokens across configurations", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps({"bundle": args.bundle, "max_new_tokens": args.max_new_tokens,
                                              "rows": rows, "summary": summary, "greedy_mismatches": mismatches},
                                             indent=2))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
