#!/usr/bin/env python3
"""Where the draft model reads a long prompt: the whole prompt (drafting from the first round, or the first round
target-only) or a window of its first tokens plus the last N, each with its own cache, or (a self-draft) the
target's cache, against target-only decoding.

    python tools/draft_window.py models/smollm2-135m --prompts 6 --new 96

Greedy, draft model at gamma 4, the first PROMPTS prompts of runtime/data/long.jsonl, every run a fresh request,
settings interleaved per prompt. Prints per-run lines, then medians of per-prompt ratios to target-only (whole
request and after the first token), time to first token and acceptance.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ortspec.shipped import LONG_PROMPTS, shipped

LONG = shipped(LONG_PROMPTS)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", type=int, default=6, help="how many prompts of the long set (default 6)")
    ap.add_argument("--new", type=int, default=96, help="new tokens per run (default 96)")
    args = ap.parse_args()
    from ortspec import SpeculativeGenerator
    items = [json.loads(line) for line in LONG.read_text().splitlines()][:args.prompts]
    full = SpeculativeGenerator.load(args.bundle, thread_pool="shared", draft_window=None, draft_kv="own")
    eager_default = SpeculativeGenerator.LAZY_PREFILL
    settings = {"target-only": (full.sibling("none"), eager_default),
                "whole prompt, drafting from round 1": (full, 10 ** 9),
                "whole prompt, round 1 target-only": (full, eager_default)}
    for window in (512, 1024):
        gen = SpeculativeGenerator.load(args.bundle, thread_pool="shared", draft_window=window, draft_kv="own")
        settings[f"window {window}"] = (gen, eager_default)
    shared = SpeculativeGenerator.load(args.bundle, thread_pool="shared")
    if shared.drafter.source is not None:
        settings["the target's cache (draft_kv auto)"] = (shared, eager_default)
    results: dict[str, list] = {name: [] for name in settings}
    for item in items:
        for name, (gen, lazy_from) in settings.items():
            for lm in filter(None, (gen.target, getattr(gen.drafter, "lm", None))):
                lm.reset()
            SpeculativeGenerator.LAZY_PREFILL = lazy_from
            res = gen.generate(prompt=item["prompt"], chat=True, max_new_tokens=args.new, num_draft_tokens=4,
                               do_sample=False)
            s = res.stats
            decode = (s.new_tokens - 1) / max(s.total_time_s - s.first_token_s, 1e-9)
            results[name].append((s.tokens_per_s, decode, s.first_token_s, s.acceptance_rate))
            print(f"{item['id']:<28}{name:<38}{s.tokens_per_s:7.1f} tok/s  ttft {s.first_token_s:6.2f} s  "
                  f"acceptance {s.acceptance_rate:.2f}", flush=True)
    SpeculativeGenerator.LAZY_PREFILL = eager_default
    base = results["target-only"]
    print(f"\n{'setting':<38}{'whole':>8}{'decode':>8}{'ttft s':>8}{'accept':>8}")
    for name, rows in results.items():
        print(f"{name:<38}{np.median([r[0] / b[0] for r, b in zip(rows, base)]):>8.2f}"
              f"{np.median([r[1] / b[1] for r, b in zip(rows, base)]):>8.2f}"
              f"{np.median([r[2] for r in rows]):>8.2f}{np.median([r[3] for r in rows]):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
