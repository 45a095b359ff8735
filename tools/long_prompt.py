#!/usr/bin/env python3
"""Time to first token, tokens/s and peak memory for long prompts, one fresh process per prompt length.

    python tools/long_prompt.py models/qwen2.5-coder-int4 --lengths 200,2000 --new 16

Each run feeds a prompt of random token ids (as a file of code would be, length-wise) to
``generate(input_ids=..., max_new_tokens=N, num_draft_tokens=4)`` in a process of its own, so that its
peak RSS (ru_maxrss) belongs to that prompt length alone.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(bundle: str, length: int, new: int, drafter: str) -> dict:
    import numpy as np
    from ortspec import SpeculativeGenerator
    gen = SpeculativeGenerator.load(bundle, drafter=drafter, thread_pool="shared")
    ids = [int(t) for t in np.random.default_rng(length).integers(100, gen.vocab_size, length)]
    gen.generate(input_ids=ids[:8], max_new_tokens=2, do_sample=False)  # warm-up outside the timing
    t0 = time.perf_counter()
    res = gen.generate(input_ids=ids, max_new_tokens=new, num_draft_tokens=4, do_sample=False, eos_token_id=[])
    wall = time.perf_counter() - t0
    return {"prompt_tokens": length, "new_tokens": len(res.token_ids), "first_token_s": res.stats.first_token_s,
            "total_s": wall, "decode_tokens_per_s": (len(res.token_ids) - 1) / max(wall - res.stats.first_token_s, 1e-9),
            "prefill_tokens_per_s": length / res.stats.first_token_s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--lengths", default="200,2000", help="comma-separated prompt lengths in tokens")
    ap.add_argument("--new", type=int, default=16, help="new tokens per run (default 16)")
    ap.add_argument("--drafter", default="model")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.bundle, args.one, args.new, args.drafter)))
        return 0
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        out = subprocess.run([sys.executable, __file__, args.bundle, "--one", str(n), "--new", str(args.new),
                              "--drafter", args.drafter], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr, file=sys.stderr)
            return 1
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'prompt':>7} {'first token s':>14} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MB':>12}")
    for r in rows:
        print(f"{r['prompt_tokens']:>7} {r['first_token_s']:>14.2f} {r['prefill_tokens_per_s']:>14.1f} "
              f"{r['decode_tokens_per_s']:>13.1f} {r['peak_rss_mb']:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
