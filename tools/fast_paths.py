"""What each host fast path of the sampling code gains end to end: tokens/s with it and without it.

    python tools/fast_paths.py BUNDLE [--prompts FILE] [--n 6] [--max-new-tokens 64] [--gamma 4] [--json OUT]

For each fast path, on the settings that reach it, every prompt is generated twice in one process on one
loaded pair (speculative, the bundle's draft model, a fixed gamma), once with every fast path on and once with
that one switched off, in alternating order; the gain is the summed time without it over the summed time with
it (above 1: the path pays). Outputs are exactly distributed either way (a pair whose draft keeps its own cache
may draw other tokens on a repeated prompt: the draft's rows for a reused prefix round differently).
"""
from __future__ import annotations

import argparse
from contextlib import contextmanager
import json
from pathlib import Path
import sys
import time

from ortspec import SpeculativeGenerator, sampling
from ortspec.bench import load_prompts
from ortspec.shipped import DEV_PROMPTS, shipped

QWEN = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
MODES = {
    "greedy": dict(do_sample=False),
    "qwen-settings": QWEN,
    "top-p 0.9": dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0),
}


@contextmanager
def _patched(owner, name: str, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


# name: (what it is, the modes that reach it, a context manager that switches it off)
PATHS = {
    "top entries": ("rows read through the graph's TopK (greedy, top-k, LazyRow) instead of whole",
                    ("greedy", "qwen-settings", "top-p 0.9"),
                    lambda: _patched(sampling.LogitsPipeline, "top_entries", lambda self: 0)),
    "LazyRow": ("verdicts from the graph's normalizer and largest entries",
                ("top-p 0.9",), lambda: _patched(sampling.LogitsPipeline, "lazy_rows", lambda self: False)),
    # (measured and removed in 0.2.0, under 2% on both shipped pairs: WideRow, nucleus probes, the draft's
    # tail cut, the exp2 clamp; docs/exactness.md)
}


def measure(gen: SpeculativeGenerator, prompts: list[list[int]], mode: dict, off, max_new: int, gamma: int):
    """(time with the path, time without it, tokens)."""
    t_on = t_off = 0.0
    tokens = 0
    for i, ids in enumerate(prompts):
        for variant in ((True, False) if i % 2 == 0 else (False, True)):
            t0 = time.perf_counter()
            if variant:
                res = gen.generate(input_ids=ids, max_new_tokens=max_new, seed=i, num_draft_tokens=gamma, **mode)
            else:
                with off():
                    res = gen.generate(input_ids=ids, max_new_tokens=max_new, seed=i, num_draft_tokens=gamma,
                                       **mode)
            dt = time.perf_counter() - t0
            if variant:
                t_on += dt
                tokens += len(res.token_ids)
            else:
                t_off += dt
    return t_on, t_off, tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=None, help="JSONL prompts (default: the packaged dev prompts)")
    ap.add_argument("--n", type=int, default=6, help="prompts used (the first N)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--paths", default=",".join(PATHS), help="comma-separated: " + ", ".join(PATHS))
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    gen = SpeculativeGenerator.load(args.bundle, drafter="model", verify="none", thread_pool="shared")
    items = load_prompts(Path(args.prompts) if args.prompts else shipped(DEV_PROMPTS))[:args.n]
    chat = bool(gen.codec.chat_template)
    prompts = [gen.codec.encode(p["prompt"], chat=chat) for p in items]
    gen.generate(input_ids=prompts[0], max_new_tokens=8)  # (warm)
    rows = []
    print(f"{args.bundle}: {len(prompts)} prompts x {args.max_new_tokens} tokens, gamma {args.gamma}")
    print(f"{'fast path':16} {'settings':14} {'tok/s with':>10} {'without':>8} {'gain':>6}")
    for name in args.paths.split(","):
        what, modes, off = PATHS[name]
        for mode in modes:
            t_on, t_off, n = measure(gen, prompts, MODES[mode], off, args.max_new_tokens, args.gamma)
            row = {"path": name, "what": what, "settings": mode, "tokens_per_s": n / t_on,
                   "tokens_per_s_without": n / t_off, "gain": t_off / t_on}
            rows.append(row)
            print(f"{name:16} {mode:14} {row['tokens_per_s']:10.1f} {row['tokens_per_s_without']:8.1f} "
                  f"{row['gain']:6.3f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"bundle": args.bundle, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
