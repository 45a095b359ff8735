#!/usr/bin/env python3
"""Time to first token, tokens/s and peak memory for long prompts, one fresh process per prompt length.

    python tools/long_prompt.py models/qwen2.5-coder-int4 --lengths 200,2000 --new 16
    python tools/long_prompt.py models/qwen2.5-coder-int4 --lengths 2000 --new 4 --chunks 128,256 --repeat 2
    python tools/long_prompt.py models/qwen2.5-coder-int4 --lengths 2000 --new 4 --drafter none --repeat 3 \
        --llama-bench ~/.cache/llama-cpp/bin/llama-bench --gguf qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

Each run feeds a prompt of random token ids (as a file of code would be, length-wise) to
``generate(input_ids=..., max_new_tokens=N, num_draft_tokens=4)`` in a process of its own, so that its
peak RSS (ru_maxrss) belongs to that prompt length alone. With ``--llama-bench`` (llama.cpp's tool, built by
``build-llama-cpp.sh``) and the GGUF file of the same model, each run is followed by llama.cpp's prompt
processing of the same length (``llama-bench -p N -n 0 -r 1``), and the ratio of the two times is printed per
pair: on a shared machine only runs side by side compare.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import resource
import subprocess
import sys
import time


def one(bundle: str, length: int, new: int, drafter: str, chunk: int | None = None) -> dict:
    import numpy as np
    from ortspec import SpeculativeGenerator
    from ortspec.model import CausalLM
    if chunk:
        CausalLM.CHUNK = chunk
    gen = SpeculativeGenerator.load(bundle, drafter=drafter, thread_pool="shared")
    ids = [int(t) for t in np.random.default_rng(length).integers(100, gen.vocab_size, length)]
    gen.generate(input_ids=ids[:8], max_new_tokens=2, do_sample=False)  # warm-up outside the timing
    t0 = time.perf_counter()
    res = gen.generate(input_ids=ids, max_new_tokens=new, num_draft_tokens=4, do_sample=False, eos_token_id=[])
    wall = time.perf_counter() - t0
    return {"prompt_tokens": length, "chunk": CausalLM.CHUNK, "new_tokens": len(res.token_ids),
            "first_token_s": res.stats.first_token_s, "total_s": wall, "decode_tokens_per_s": (len(res.token_ids) - 1) / max(wall - res.stats.first_token_s, 1e-9),
            "prefill_tokens_per_s": length / res.stats.first_token_s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def llama_prompt_s(binary: str, gguf: str, n: int, threads: int) -> float:
    """Seconds llama.cpp takes to process an n-token prompt (one repetition of llama-bench)."""
    out = subprocess.run([binary, "-m", gguf, "-p", str(n), "-n", "0", "-r", "1", "-t", str(threads), "-o", "json"],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"llama-bench failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    result = json.loads(out.stdout)[0]
    return result["avg_ns"] / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--lengths", default="200,2000", help="comma-separated prompt lengths in tokens")
    ap.add_argument("--new", type=int, default=16, help="new tokens per run (default 16)")
    ap.add_argument("--drafter", default="model")
    ap.add_argument("--repeat", type=int, default=1, help="runs per length (default 1)")
    ap.add_argument("--llama-bench", metavar="BIN", help="llama.cpp's llama-bench: time its prompt processing "
                    "of each length right after each run (needs --gguf)")
    ap.add_argument("--gguf", help="the GGUF file of the bundle's target, for --llama-bench")
    ap.add_argument("--threads", type=int, default=2, help="llama-bench threads (default 2)")
    ap.add_argument("--chunks", help="comma-separated prefill pass sizes to compare (CausalLM.CHUNK; default: the "
                    "runtime's), each run in turn for every length and repetition")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--chunk", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_bench and not args.gguf:
        ap.error("--llama-bench needs --gguf FILE (the same model as the bundle's target)")
    if args.one:
        print(json.dumps(one(args.bundle, args.one, args.new, args.drafter, args.chunk)))
        return 0
    chunks = [int(c) for c in args.chunks.split(",")] if args.chunks else [None]
    rows = []
    for n in (int(x) for x in args.lengths.split(",")):
        for _, chunk in itertools.product(range(args.repeat), chunks):
            out = subprocess.run([sys.executable, __file__, args.bundle, "--one", str(n), "--new", str(args.new),
                                  "--drafter", args.drafter] + (["--chunk", str(chunk)] if chunk else []),
                                 capture_output=True, text=True)
            if out.returncode:
                print(out.stderr, file=sys.stderr)
                return 1
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if args.llama_bench:
                row["llama_prompt_s"] = llama_prompt_s(args.llama_bench, args.gguf, n, args.threads)
                row["ratio"] = row["first_token_s"] / row["llama_prompt_s"]
            rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    llama = args.llama_bench is not None
    print(f"{'prompt':>7} {'chunk':>6} {'first token s':>14} {'prefill tok/s':>14} {'decode tok/s':>13} {'peak RSS MB':>12}"
          + (f" {'llama.cpp s':>12} {'ratio':>6}" if llama else ""))
    for r in rows:
        print(f"{r['prompt_tokens']:>7} {r['chunk']:>6} {r['first_token_s']:>14.2f} {r['prefill_tokens_per_s']:>14.1f} "
              f"{r['decode_tokens_per_s']:>13.1f} {r['peak_rss_mb']:>12.0f}"
              + (f" {r['llama_prompt_s']:>12.2f} {r['ratio']:>6.2f}" if llama else ""))
    if llama:
        for n in sorted({r["prompt_tokens"] for r in rows}):
            ratios = [r["ratio"] for r in rows if r["prompt_tokens"] == n]
            print(f"{n} tokens: time to first token / llama.cpp prompt time, median of {len(ratios)} pairs: "
                  f"{statistics.median(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
