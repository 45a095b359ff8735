#!/usr/bin/env python3
"""Where a self-draft's keys and values come from, compared: the target's cache (draft_kv="auto") against the
draft's own (draft_kv="own"), one process, the two generators alternating on each prompt.

    python tools/draft_kv.py models/smollm2-135m --sample
    python tools/draft_kv.py models/smollm2-135m --num-draft-tokens 4 --prompts runtime/data/long.jsonl

Prints per setting tokens/s over whole requests, the median time to first token and the mean acceptance, and
the median per-prompt ratio of time per token (own / target's cache: above 1 means reading the target's cache
is faster). Sampled runs use Qwen-style settings (temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.05)
with the prompt's index as seed.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import statistics
import sys
import time

from ortspec.shipped import DEV_PROMPTS, shipped

DEV = shipped(DEV_PROMPTS)
SAMPLED = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(DEV), help="jsonl with a \"prompt\" per line (default: the dev prompts)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-draft-tokens", default="auto", help="an integer or 'auto' (default)")
    ap.add_argument("--sample", action="store_true", help="Qwen-style sampling instead of greedy")
    args = ap.parse_args(argv)
    from ortspec import SpeculativeGenerator
    gamma = args.num_draft_tokens if args.num_draft_tokens == "auto" else int(args.num_draft_tokens)
    gens = {kv: SpeculativeGenerator.load(args.bundle, thread_pool="shared", draft_kv=kv) for kv in ("auto", "own")}
    if gens["auto"].drafter.source is None:
        print(f"{args.bundle}: the draft does not read the target's cache here (not a self-draft of the same "
              "layout, or not on the CPU); nothing to compare", file=sys.stderr)
        return 2
    lines = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    prompts = [item["prompt"] for item in lines][:args.limit]
    sampling = SAMPLED if args.sample else dict(do_sample=False)
    for gen in gens.values():  # warm-up
        gen.generate(messages=[{"role": "user", "content": "hi"}], max_new_tokens=8, num_draft_tokens=gamma,
                     **sampling)
    runs = {kv: [] for kv in gens}
    for i, prompt in enumerate(prompts):
        for kv in (("auto", "own") if i % 2 else ("own", "auto")):
            t0 = time.perf_counter()
            res = gens[kv].generate(messages=[{"role": "user", "content": prompt}], max_new_tokens=args.max_new_tokens,
                                    num_draft_tokens=gamma, seed=i, **sampling)
            runs[kv].append((time.perf_counter() - t0, res.stats.first_token_s, len(res.token_ids),
                             res.stats.acceptance_rate))
        print(f"\r[draft_kv] {i + 1}/{len(prompts)} prompts", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"{args.bundle}, {'sampled' if args.sample else 'greedy'}, gamma {gamma}, {len(prompts)} prompts, "
          f"{args.max_new_tokens} new tokens")
    for kv, rows in runs.items():
        name = "target's cache (auto)" if kv == "auto" else "own cache"
        print(f"  {name:22s} tok/s {sum(r[2] for r in rows) / sum(r[0] for r in rows):6.2f}   "
              f"ttft median {statistics.median(r[1] for r in rows) * 1e3:5.0f} ms   "
              f"acceptance {statistics.mean(r[3] for r in rows):.3f}")
    ratios = [o[0] / o[2] / (a[0] / a[2]) for a, o in zip(runs["auto"], runs["own"])]
    print(f"  time per token, own / target's cache: median {statistics.median(ratios):.3f} "
          f"(per prompt {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
