#!/usr/bin/env python3
"""Fidelity of exports and of llama.cpp to one float reference, on the same windows of the same text.

    python tools/fidelity.py --reference models/qwen-fp32 --bundle models/qwen-gguf --bundle models/qwen-int4 \
        [--llama-cpp ~/.cache/llama-cpp/bin --llama-reference FILE.gguf --llama-file FILE.gguf \
         --llama-file requant-q4_0.gguf [--ik-llama-cpp ~/.cache/ik-llama-cpp/bin]] [--text long.txt] \
        [--window 512] [--tokens 6144] [--out fidelity.json]

Each ortspec bundle's target is teacher-forced against the reference bundle's target (`ortspec quality
--window`); each llama.cpp file runs through `llama-perplexity --kl-divergence` against the logits of
``--llama-reference`` (a GGUF file; converted once to F32 with `llama-quantize --allow-requantize`, which is the
file's float model, as ortspec's `--dtype fp32` export of it is); with --ik-llama-cpp, ik_llama.cpp's
llama-perplexity scores each file the same way, with and without run-time repacking (-rtr). All score the second half of every window of
``--window`` tokens, each read from an empty cache, over the first ``--tokens`` tokens: top-1 agreement with the
float model, mean KL(float || candidate) and the change in NLL of the text. The default text is the long prompt
set joined (ortspec/data/long.jsonl), as docs/results.md measures. The JSON (--out) is what
`tools/compare_peers.py --fidelity` prints beside its rows, keyed by each bundle's and file's resolved path.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import re
import subprocess
import sys
import tempfile

from ortspec.shipped import shipped


def long_text() -> str:
    lines = Path(shipped("long.jsonl")).read_text().splitlines()
    return "\n\n".join(json.loads(line)["prompt"] for line in lines if line.strip())


def parse_kld(log: str) -> dict:
    """llama-perplexity --kl-divergence's summary -> {top1, mean_kl[, nll_change]}; ValueError if it is missing.
    The NLL change is ln(PPL(Q) / PPL(base)) over ln(PPL(base)), where the log prints the base's perplexity."""
    import math
    kl = re.search(r"Mean\s+KLD:\s+([-\d.eE+]+)", log)
    same = re.search(r"Same top p:\s+([\d.]+)", log)
    ratio = re.search(r"Mean\s+ln\(PPL\(Q\)/PPL\(base\)\)\s*:\s+([-\d.eE+]+)", log)
    base = re.search(r"Mean\s+PPL\(base\)\s*:\s+([\d.eE+]+)", log)
    if not kl or not same:
        raise ValueError("llama-perplexity printed no KL summary:\n" + log[-2000:])
    out = {"top1": float(same.group(1)) / 100, "mean_kl": float(kl.group(1))}
    if ratio and base and float(base.group(1)) > 1:
        out["nll_change"] = float(ratio.group(1)) / math.log(float(base.group(1)))
    return out


def llama_cpp_fidelity(bin_dir: Path, reference: Path, files: list[str], text: str, window: int, tokens: int,
                       threads: int, work: Path, ik_dir: Path | None = None) -> list[dict]:
    """llama.cpp's rows (and with ``ik_dir``, ik_llama.cpp's, with and without run-time repacking: each fork
    computes its own reference logits from the same F32 file)."""
    f32 = work / (reference.stem + ".f32.gguf")
    if not f32.is_file():
        print(f"converting {reference} to F32 for llama.cpp's reference logits", file=sys.stderr, flush=True)
        subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(reference), str(f32), "F32"],
                       check=True, capture_output=True)
    path = work / "text.txt"
    path.write_text(text)
    common = ["-f", str(path), "-c", str(window), "--chunks", str(tokens // window), "-t", str(threads)]
    runs = [("llama.cpp", bin_dir, [], "")]
    if ik_dir is not None:
        runs += [("ik_llama.cpp", ik_dir, [], "#ik"), ("ik_llama.cpp -rtr", ik_dir, ["-rtr"], "#ik-rtr")]
    rows = []
    for runtime, where, flags, key in runs:
        base = work / f"base{key.replace('#', '-')}.kld"
        if not base.is_file():
            subprocess.run([str(where / "llama-perplexity"), "-m", str(f32), *common, "--kl-divergence-base",
                            str(base)], check=True, capture_output=True)
        for f in files:
            print(f"{runtime} on {f}", file=sys.stderr, flush=True)
            proc = subprocess.run([str(where / "llama-perplexity"), "-m", f, *common, *flags, "--kl-divergence-base",
                                   str(base), "--kl-divergence"], capture_output=True, text=True)
            rows.append({"runtime": runtime, "path": str(Path(f).resolve()) + key, "name": Path(f).name,
                         **parse_kld(proc.stdout + proc.stderr)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", help="ortspec bundle of the float model (--dtype fp32 export of the file)")
    ap.add_argument("--bundle", action="append", default=[], help="an ortspec bundle to score (repeatable)")
    ap.add_argument("--llama-cpp", metavar="BIN_DIR", help="llama.cpp's binaries (llama-perplexity, llama-quantize)")
    ap.add_argument("--llama-reference", help="the GGUF file whose float model is the reference for llama.cpp")
    ap.add_argument("--llama-file", action="append", default=[], help="a GGUF file llama.cpp runs (repeatable)")
    ap.add_argument("--ik-llama-cpp", metavar="BIN_DIR",
                    help="ik_llama.cpp's binaries: each --llama-file scored by it too, with and without -rtr "
                         "(rows keyed by the file's path + '#ik' / '#ik-rtr', as compare_peers reads them)")
    ap.add_argument("--text", help="a text file (default: the long prompt set joined)")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=6144)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", help="where llama.cpp's F32 reference and logits are kept (default: a temporary dir)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.bundle and not args.reference:
        ap.error("--bundle needs --reference (the float export to compare with)")
    if args.llama_file and not (args.llama_cpp and args.llama_reference):
        ap.error("--llama-file needs --llama-cpp and --llama-reference")
    text = Path(args.text).read_text() if args.text else long_text()
    from ortspec.quality import compare_models
    rows = []
    for b in args.bundle:
        print(f"ortspec on {b}", file=sys.stderr, flush=True)
        r = compare_models(b, args.reference, text, tokens=args.tokens, window=args.window, threads=args.threads)
        rows.append({"runtime": "ortspec", "path": str(Path(b).resolve()), "name": Path(b).name,
                     "top1": r["top1_agreement"], "mean_kl": r["mean_kl"],
                     "nll_change": r["nll_candidate"] / r["nll_reference"] - 1, "positions": r["positions"]})
    if args.llama_file:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(args.work) if args.work else Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            rows += llama_cpp_fidelity(Path(args.llama_cpp).expanduser(), Path(args.llama_reference), args.llama_file,
                                       text, args.window, args.tokens, args.threads, work,
                                       Path(args.ik_llama_cpp).expanduser() if args.ik_llama_cpp else None)
    print(f"{'runtime':<18}{'model':<44}{'top-1':>8}{'mean KL':>10}{'NLL change':>12}")
    for r in rows:
        nll = f"{r['nll_change'] * 100:+.1f}%" if "nll_change" in r else "-"
        print(f"{r['runtime']:<18}{r['name']:<44}{r['top1'] * 100:>7.1f}%{r['mean_kl']:>10.4f}{nll:>12}")
    report = {"window": args.window, "tokens": args.tokens, "text": args.text or "ortspec/data/long.jsonl joined",
              "reference": args.reference, "llama_reference": args.llama_reference, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
