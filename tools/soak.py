#!/usr/bin/env python3
"""Soak test: generate many tokens with frequent rejections and watch resident memory.

    python tools/soak.py BUNDLE --tokens 20000 --temperature 1.5

    python tools/soak.py BUNDLE --calls 200 --prompt-lengths 50,3000 --per-call 4

Samples at a high temperature so that drafts are often rejected (every
rejection exercises rollback), prints RSS after each generation, and reports
the growth of RSS after warm-up. With --prompt-lengths every call gets a
prompt of random token ids of a random length in that range (a server sees
prompts of many lengths; nothing may grow with them). Exit code 1 if growth
exceeds --max-growth.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=20000, help="total new tokens to generate (default 20000)")
    ap.add_argument("--per-call", type=int, default=256, help="max_new_tokens per generate call")
    ap.add_argument("--temperature", type=float, default=1.5)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--drafter", default="model")
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of tokens treated as warm-up")
    ap.add_argument("--max-growth", type=float, default=0.05, help="allowed RSS growth after warm-up")
    ap.add_argument("--json", help="write the RSS series here")
    ap.add_argument("--calls", type=int, default=None, help="stop after this many calls instead of --tokens")
    ap.add_argument("--prompt-lengths", default=None, metavar="MIN,MAX",
                    help="random-id prompts of lengths drawn uniformly from MIN..MAX, one per call")
    args = ap.parse_args()

    import numpy as np
    from ortspec import SpeculativeGenerator
    gen = SpeculativeGenerator.load(args.bundle, drafter=args.drafter, thread_pool="shared")
    prompt = "Tell me a long story about a lighthouse keeper." if gen.codec else None
    ids = None if gen.codec else [1, 5, 6, 7]
    lengths = None
    if args.prompt_lengths:
        lo, hi = (int(x) for x in args.prompt_lengths.split(","))
        lengths, rng = (lo, hi), np.random.default_rng(0)
    done, calls, drafted, accepted, series = 0, 0, 0, 0, []
    t0 = time.perf_counter()
    while (done < args.tokens) if args.calls is None else (calls < args.calls):
        if lengths:
            prompt, n = None, int(rng.integers(lengths[0], lengths[1] + 1))
            ids = [int(t) for t in rng.integers(min(100, gen.vocab_size - 1), gen.vocab_size, n)]
        left = args.per_call if args.calls is not None else min(args.per_call, args.tokens - done)
        res = gen.generate(prompt=prompt, input_ids=ids, max_new_tokens=left,
                           do_sample=True, temperature=args.temperature, seed=calls,
                           num_draft_tokens=args.num_draft_tokens, eos_token_id=[])
        done += len(res.token_ids)
        calls += 1
        drafted += res.stats.drafted
        accepted += res.stats.accepted
        series.append((done, rss_mb()))
        shown = f"  prompt {len(ids)}" if lengths else ""
        print(f"{done:>7} tokens{shown}  RSS {series[-1][1]:8.1f} MB  acceptance {res.stats.acceptance_rate:.2f}",
              flush=True)
    warm = series[min(len(series) - 1, int(args.warmup * len(series)))][1]
    growth = (series[-1][1] - warm) / warm
    summary = {"tokens": done, "calls": calls, "seconds": time.perf_counter() - t0,
               "rejections": drafted - accepted, "acceptance_rate": accepted / max(drafted, 1),
               "rss_after_warmup_mb": warm, "rss_end_mb": series[-1][1], "rss_peak_mb": max(r for _, r in series),
               "growth_after_warmup": growth}
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "series": series}, f, indent=2)
    return 0 if growth <= args.max_growth else 1


if __name__ == "__main__":
    sys.exit(main())
