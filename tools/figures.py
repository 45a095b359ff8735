#!/usr/bin/env python3
"""Draw the results page's figures from measured JSON (nothing is measured here).

    python tools/figures.py frontier --peers docs/data/frontier-*.json --fidelity docs/data/fidelity-qwen.json \
        --out docs/figures/frontier.png
    python tools/figures.py versus --greedy docs/data/peers-gguf-greedy.json --sampled docs/data/peers-gguf-sampled.json \
        --out docs/figures/versus.png
    python tools/figures.py acceptance --greedy docs/data/bench-gguf-greedy.json \
        --sampled docs/data/bench-gguf-sampled.json --out docs/figures/acceptance.png
    python tools/figures.py edit --report docs/data/edit-gguf.json --out docs/figures/edit.png

frontier: each bundle's target-only decode speed against llama.cpp on the file in the same run
(tools/compare_peers.py --only target-only --llama-cpp ... [--llama-cpp-also requantized.gguf]), placed at its
mean KL to the file's float model (tools/fidelity.py); llama.cpp's files beside them.
versus: tools/compare_peers.py reports with --llama-cpp, greedy and sampled: ortspec target-only and its default
decoding beside llama.cpp alone and speculating, each bar labelled with its rate against llama.cpp alone.
acceptance: `ortspec bench --out` reports: the probability that a draft position is accepted once reached.
edit: a tools/edit_bench.py report: Predicted Outputs on an edit workload beside target-only, the default
decoding and llama.cpp.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys

from ortspec import figures

VERSUS_ROWS = ["ortspec target-only", figures.ORTSPEC_DEFAULT, figures.LLAMA_ALONE]


def read(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"cannot read the report {path}: {e}") from None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="figure", required=True)
    p = sub.add_parser("frontier", help="target-only speed (x llama.cpp) against KL to the float model")
    p.add_argument("--peers", nargs="+", required=True, help="compare_peers reports run with --llama-cpp")
    p.add_argument("--fidelity", nargs="+", required=True, help="tools/fidelity.py reports")
    p.add_argument("--title", default="")
    p.add_argument("--label", action="append", default=[], metavar="NAME=TEXT",
                   help="show the bundle or file NAME as TEXT (repeatable)")
    for name, what in (("versus", "compare_peers reports"), ("acceptance", "ortspec bench reports")):
        p_ = sub.add_parser(name, help=f"from {what}, greedy and/or sampled")
        p_.add_argument("--greedy")
        p_.add_argument("--sampled")
    p = sub.add_parser("edit", help="from a tools/edit_bench.py report")
    p.add_argument("--report", required=True)
    for p_ in sub.choices.values():
        p_.add_argument("--out", required=True, help="the PNG to write")
    args = ap.parse_args()
    try:
        if args.figure == "frontier":
            rows = [r for f in args.fidelity for r in read(f)["rows"]]
            points = figures.frontier_points([read(f) for f in args.peers], rows)
            labels = dict(item.split("=", 1) for item in args.label if "=" in item)
            for p_ in points:
                p_["label"] = labels.get(p_["name"], p_["label"])
            for p_ in sorted(points, key=lambda p_: p_["mean_kl"]):
                print(f"{p_['label']:<36} KL {p_['mean_kl']:.4f}  top-1 {p_['top1'] * 100:5.1f}%  "
                      f"{p_['ratio']:.2f}x llama.cpp (median of {len(p_['ratios'])})")
            figures.frontier(points, args.out, args.title)
        elif args.figure == "edit":
            figures.edit(read(args.report), args.out)
        else:
            reports = {k: read(v) for k, v in (("greedy", args.greedy), ("sampled", args.sampled)) if v}
            if not reports:
                ap.error("give --greedy and/or --sampled")
            if args.figure == "versus":
                rows = VERSUS_ROWS + [s["runtime"] for r in reports.values() for s in r["summary"]
                                      if s["runtime"].startswith("llama.cpp speculative")][:1]
                figures.versus(reports, args.out, rows)
            else:
                figures.acceptance(reports, args.out)
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
