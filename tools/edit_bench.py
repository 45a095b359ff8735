#!/usr/bin/env python3
"""Predicted Outputs on an edit workload: decode speed with the original file as the prediction, against target-only
decoding and the bundle's default drafter, greedy and sampled, interleaved.

    python tools/edit_bench.py models/smollm2-135m
    python tools/edit_bench.py models/qwen2.5-coder-int4 --max-new-tokens 512 --out edit.json

Each prompt is a Python file of ortspec's own (100-400 lines, shipped with the package) and a one-line change
request; the answer is the whole updated file, so it repeats the file nearly verbatim. Three configurations,
each its own generator (no configuration inherits another's caches or learned priors; every run starts from
an empty cache): target-only (drafter "none"), the bundle's default decoding, and the default decoding with the
original file (in its code fence) as the prediction. Settings: greedy, and sampled at temperature 0.7, top-p 0.8,
top-k 20, repetition penalty 1.05 (seeded). The order of the configurations rotates per prompt. Reported: decode
tokens/s (after the first token), the speedups over target-only, and the prediction's accepted and rejected
tokens. Greedy runs must give the same tokens in every configuration (exit 1 otherwise).

With --llama-cpp (binaries from ../shared/tools/build-llama-cpp.sh) and --llama-cpp-target (the GGUF file the
bundle was exported from), llama.cpp runs the same prompts beside them: alone (llama-cli), with its n-gram
speculation (llama-speculative-simple --spec-type ngram-simple) and, given --llama-cpp-draft, with the draft
file (draft-simple, --llama-cpp-draft-max drafts). Each is timed by llama.cpp's own decode counters, as the
ortspec rows are (after the first token). --fidelity (tools/fidelity.py's JSON) prints each side's top-1
agreement and KL against the file's float model beside the rates.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import statistics
import sys

import ortspec
from ortspec import SpeculativeGenerator
from compare_peers import llama_cpp_run

EDITS = [("drafting/hybrid.py", "Change PROBE_EVERY from 16 to 32."),
         ("drafting/lookup.py", "Change LONG_MAX from 60 to 48."),
         ("results.py", "Rename the method record_min_mass to add_min_mass."),
         ("metrics.py", "Add 600.0 at the end of BUCKETS."),
         ("drafting/prediction.py", "Change PAUSED from 4 to 6."),
         ("control/memory.py", "Add a blank line at the end of the file.")]
SAMPLED = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
CONFIGS = ("target-only", "default", "prediction")


def edit_prompts(limit: int) -> list[dict]:
    root = Path(ortspec.__file__).parent
    out = []
    for rel, request in EDITS[:limit]:
        code = (root / rel).read_text()
        prompt = (f"Here is a Python file:\n\n```python\n{code}```\n\n{request} Answer with the whole updated file "
                  "in one ```python code block and nothing else.")
        out.append({"id": rel, "lines": code.count("\n"), "prompt": prompt, "prediction": f"```python\n{code}```"})
    return out


def summarize(rows: list[dict], configs, modes) -> dict:
    """Per mode and configuration: mean decode tokens/s and median speedup over target-only across the prompts
    where the configuration ran (a failed run, recorded as None or 0, is left out and counted), and the rate
    against llama.cpp alone on the same prompts where it ran."""
    summary = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        summary[mode] = {}
        for name in configs:
            ran = [r[name] for r in mine if r[name]["decode_tok_s"]]
            summary[mode][name] = {"decode_tok_s": statistics.mean(c["decode_tok_s"] for c in ran) if ran else 0.0,
                                   "speedup_median": statistics.median(c["speedup"] for c in ran) if ran else 0.0,
                                   "runs": len(ran), "of": len(mine)}
        if "llama.cpp target-only" in configs:
            for name, s in summary[mode].items():
                both = [r for r in mine if r[name]["decode_tok_s"] and r["llama.cpp target-only"]["decode_tok_s"]]
                if both:
                    s["x_llama_cpp"] = statistics.mean(r[name]["decode_tok_s"] for r in both) / \
                        statistics.mean(r["llama.cpp target-only"]["decode_tok_s"] for r in both)
    return summary


def decode_rate(stats) -> float:
    rest = stats.total_time_s - stats.first_token_s
    return (stats.new_tokens - 1) / rest if stats.new_tokens > 1 and rest > 0 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--limit", type=int, default=4, help="edit prompts (default 4, at most %d)" % len(EDITS))
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--modes", default="greedy,sampled")
    ap.add_argument("--out", help="write the measurements as JSON")
    ap.add_argument("--llama-cpp", metavar="BIN_DIR", help="directory with llama-cli and llama-speculative-simple")
    ap.add_argument("--llama-cpp-target", help="the GGUF file the bundle's target was exported from")
    ap.add_argument("--llama-cpp-draft", help="a draft GGUF file for llama.cpp's draft-model speculation")
    ap.add_argument("--llama-cpp-draft-max", type=int, default=8, help="llama.cpp's drafts per step (default 8)")
    ap.add_argument("--fidelity", metavar="JSON", help="tools/fidelity.py's report, for the fidelity columns")
    args = ap.parse_args()
    if not 1 <= args.limit <= len(EDITS) or args.max_new_tokens < 2:
        ap.error(f"--limit must be in 1..{len(EDITS)} and --max-new-tokens >= 2")
    if bool(args.llama_cpp) != bool(args.llama_cpp_target):
        ap.error("--llama-cpp and --llama-cpp-target go together")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"greedy", "sampled"}:
        ap.error("--modes takes greedy and/or sampled")
    gens = {"target-only": SpeculativeGenerator.load(args.bundle, drafter="none", verify="none", thread_pool="shared"),
            "default": SpeculativeGenerator.load(args.bundle, verify="none", thread_pool="shared"),
            "prediction": SpeculativeGenerator.load(args.bundle, verify="none", thread_pool="shared")}
    peers = {}
    if args.llama_cpp:
        def peer(draft, spec_type):
            return lambda text, raw, new, sampling: llama_cpp_run(args.llama_cpp, args.llama_cpp_target, draft,
                                                                 text if draft or spec_type != "draft-simple" else raw,
                                                                 new, 2, args.llama_cpp_draft_max, sampling,
                                                                 spec_type)
        peers["llama.cpp target-only"] = peer(None, "draft-simple")
        peers["llama.cpp ngram"] = peer(None, "ngram-simple")
        if args.llama_cpp_draft:
            peers["llama.cpp draft model"] = peer(args.llama_cpp_draft, "draft-simple")
    configs = CONFIGS + tuple(peers)
    prompts = edit_prompts(args.limit)
    warm = gens["default"].codec.encode("Hello", chat=True)
    for gen in gens.values():
        gen.generate(input_ids=warm, max_new_tokens=4)
    rows, mismatches = [], 0
    for k, item in enumerate(prompts):
        ids = gens["default"].codec.encode(item["prompt"], chat=True)
        text = gens["default"].codec.render_chat(item["prompt"])
        for mode in modes:
            settings = dict(SAMPLED, seed=k) if mode == "sampled" else dict(do_sample=False)
            order = configs[k % len(configs):] + configs[:k % len(configs)]
            got, rates = {}, {}
            for name in order:
                if name in peers:
                    sampling = {key: v for key, v in SAMPLED.items() if key != "do_sample"} if mode == "sampled" \
                        else None
                    measured = peers[name](text, item["prompt"], args.max_new_tokens, sampling)
                    rates[name] = measured[0] / measured[1] if measured else None  # (a run that failed)
                    continue
                gen = gens[name]
                for lm in filter(None, (gen.target, gen.drafter.lm)):
                    lm.reset()  # every run from an empty cache: its prefill included
                extra = {"prediction": item["prediction"]} if name == "prediction" else {}
                res = gen.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, **settings, **extra)
                got[name], rates[name] = res, decode_rate(res.stats)
            if mode == "greedy" and len({tuple(r.token_ids) for r in got.values()}) != 1:
                mismatches += 1
            base = rates["target-only"]
            row = {"prompt": item["id"], "lines": item["lines"], "prompt_tokens": len(ids), "mode": mode}
            for name in configs:
                rate = rates[name]
                row[name] = {"decode_tok_s": rate, "speedup": rate / base if rate and base else None}
                if name in got:
                    res = got[name]
                    row[name].update(tokens=len(res.token_ids), tokens_per_round=res.stats.tokens_per_round,
                                     prediction_accepted=res.stats.prediction_accepted,
                                     prediction_rejected=res.stats.prediction_rejected)
            rows.append(row)
            print(f"{item['id']:<24}{mode:<8}" + "".join(
                f"{name} {row[name]['decode_tok_s']:6.1f} tok/s ({row[name]['speedup']:.2f}x)   "
                if row[name]["speedup"] else f"{name} failed   " for name in configs)
                + f"prediction {row['prediction']['prediction_accepted']}/{row['prediction']['prediction_rejected']}"
                  " accepted/rejected", flush=True)
    fidelity = {}
    if args.fidelity:  # keyed by resolved path, as tools/fidelity.py writes it
        fidelity = {r["path"]: r for r in json.loads(Path(args.fidelity).read_text())["rows"]}
    sides = {"ortspec": fidelity.get(str(Path(args.bundle).resolve())),
             "llama.cpp": fidelity.get(str(Path(args.llama_cpp_target).resolve())) if args.llama_cpp else None}
    summary = summarize(rows, configs, modes)
    for mode in modes:
        print(f"{mode}:")
        for name, s in summary[mode].items():
            fid = sides["llama.cpp" if name.startswith("llama.cpp") else "ortspec"]
            print(f"  {name:<24}{s['decode_tok_s']:7.1f} tok/s  median {s['speedup_median']:.2f}x target-only"
                  + (f"  {s['x_llama_cpp']:.2f}x llama.cpp alone" if "x_llama_cpp" in s else "")
                  + (f"  ({s['runs']} of {s['of']} runs)" if s["runs"] < s["of"] else "")
                  + (f"  fidelity top-1 {fid['top1'] * 100:.1f}% KL {fid['mean_kl']:.4f}" if fid else ""))
    if mismatches:
        print(f"{mismatches} greedy prompt(s) gave different tokens across configurations", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps({"bundle": args.bundle, "max_new_tokens": args.max_new_tokens,
                                              "llama_cpp_target": args.llama_cpp_target,
                                              "fidelity": {k: v and {"top1": v["top1"], "mean_kl": v["mean_kl"]}
                                                           for k, v in sides.items()},
                                              "rows": rows, "summary": summary, "greedy_mismatches": mismatches},
                                             indent=2))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
