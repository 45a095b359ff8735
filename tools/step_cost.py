#!/usr/bin/env python3
"""Per-step cost of bundles' targets (or drafts), interleaved in one process.

    python tools/step_cost.py models/qwen2.5-coder-int4 models/qwen-gguf
    python tools/step_cost.py models/smollm2-135m --model draft --positions 1,2,5 --pool session

After a context of --context tokens, each model in turn runs a pass of each size
(rolled back after every pass, as a rejected draft is), --repeat times; the
median of each is printed in ms. Passes have exactly the sizes asked; with
--bitwise they run as bitwise decoding runs a target's (a pass of row_tile * k + 1
positions goes with the token before it: one position in blocks of 32, any odd
number in blocks of 64 or more).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--model", default="target", choices=["target", "draft"])
    ap.add_argument("--positions", default="1,5", help="pass sizes (default 1,5)")
    ap.add_argument("--context", type=int, default=200, help="cached tokens before each pass (default 200)")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--bitwise", action="store_true",
                    help="run passes as bitwise decoding runs a target's (default: passes of exactly the sizes asked)")
    ap.add_argument("--pool", default="shared", choices=["shared", "session"],
                    help="onnxruntime thread pool: shared (as the ortspec commands run) or one per session")
    args = ap.parse_args()
    sizes = [int(x) for x in args.positions.split(",")]
    if min(sizes) < 1 or args.context < 1 or args.repeat < 1:
        sys.exit("--positions, --context and --repeat must be positive")

    from ortspec.bundle import load_bundle
    from ortspec.engine import CausalLM, PassOptions
    from ortspec.profile import context_ids
    lms = {}
    for root in args.bundles:
        b = load_bundle(root, verify="size")
        spec = b.target if args.model == "target" else b.draft
        if spec is None:
            sys.exit(f"{root} has no {args.model} model")
        lms[root] = CausalLM(spec, str(b.file(spec.path)), thread_pool=args.pool)
    options = PassOptions(bitwise=args.bitwise)
    ids = context_ids(min(lm.spec.vocab_size for lm in lms.values()), args.context + max(sizes))
    for lm in lms.values():
        lm.prefill(ids[:args.context], options=options)
    times = {root: {n: [] for n in sizes} for root in lms}
    for _ in range(args.repeat):
        for root, lm in lms.items():
            for n in sizes:
                lm.rollback(args.context)
                t0 = time.perf_counter()
                lm.forward(ids[args.context:args.context + n], options=options)
                times[root][n].append(time.perf_counter() - t0)
    width = max(len(r) for r in lms)
    print(f"{'bundle':{width}s}  " + "  ".join(f"{n:>2d}-pos ms" for n in sizes) + f"   ({args.model}, {args.pool} pool, "
          f"context {args.context}, median of {args.repeat})")
    for root in lms:
        print(f"{root:{width}s}  " + "  ".join(f"{statistics.median(times[root][n]) * 1000:9.2f}" for n in sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
