"""Host work right after a model pass against the same work in a warm loop.

A decoding round runs host code (the logits pipeline, sampling, the loop itself) right after each model pass,
and a pass streams the model's weights through the CPU caches. This measures, in a process decoding with the
bundle, what each piece costs then and what it costs warm:

    python tools/host_cold.py models/smollm2-135m [--model target|draft] [--repeat 40]

Each "after a pass" sample runs one single-position pass of the model (the last prompt token fed again),
then times the piece once; "warm" times the piece again straight after. Medians in microseconds.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ortspec import SpeculativeGenerator
from ortspec.bench import MICRO_SETTINGS
from ortspec.config import SamplingConfig
from ortspec.logits import LogitsPipeline

PROMPT = "Write a Python function that reverses a singly linked list, with a short docstring."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--model", choices=("target", "draft"), default="target", help="whose pass runs before each piece")
    ap.add_argument("--repeat", type=int, default=40, help="samples per piece (default 40)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    gen = SpeculativeGenerator.load(args.bundle, verify="none", drafter="model" if args.model == "draft" else "none")
    lm = gen.target if args.model == "target" else getattr(gen.drafter, "lm", None)
    if lm is None:
        ap.error(f"{args.bundle} has no draft model to run")
    ids = gen.codec.encode(PROMPT, chat=bool(gen.codec.chat_template)) if gen.codec else list(range(1, 40))
    lm.forward(ids)
    vocab = gen.vocab_size
    qwen = LogitsPipeline(SamplingConfig(do_sample=True, **MICRO_SETTINGS["qwen (T0.7 p0.8 k20 rep1.05)"]), vocab)
    dense = LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, **MICRO_SETTINGS["temperature 0.7"]), vocab)
    small = np.arange(40, dtype=np.float64)
    rng = np.random.default_rng(0)

    def python_step(_row):
        return sum(sorted((i * 7919) % 101 for i in range(40)))

    pieces = {
        "max over the row": lambda row: row.max(),
        "3 NumPy calls on 40 numbers": lambda row: np.cumsum(small)[-1] + np.exp(small).sum(),
        "40-number pure-Python step": python_step,
        "row, Qwen settings (top-k 20)": lambda row: qwen.row(row, ids),
        "row, temperature 0.7 (dense)": lambda row: dense.row(row, ids),
        "row + sample, Qwen settings": lambda row: qwen.row(row, ids).sample(rng),
    }
    print(f"{args.bundle} ({args.model}, vocabulary {vocab}): microseconds, median of {args.repeat}")
    print(f"{'piece':<34}{'after a pass':>14}{'warm':>10}{'ratio':>8}")
    for name, piece in pieces.items():
        cold, warm = [], []
        for _ in range(args.repeat):
            lm.rollback(len(ids) - 1)
            row = lm.forward(ids[-1:], keep=1)[0]
            t0 = time.perf_counter()
            piece(row)
            t1 = time.perf_counter()
            piece(row)
            t2 = time.perf_counter()
            cold.append(t1 - t0)
            warm.append(t2 - t1)
            row = None  # the host buffer is free again for the next pass
        c, w = statistics.median(cold) * 1e6, statistics.median(warm) * 1e6
        print(f"{name:<34}{c:>14.1f}{w:>10.1f}{c / w if w else float('inf'):>7.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
