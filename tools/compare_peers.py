#!/usr/bin/env python3
"""Compare ortspec with Hugging Face transformers on the same pair and prompts, interleaved.

    python tools/compare_peers.py models/smollm2-135m --max-new-tokens 128 --out peers.json [--plot peers.png]
        [--llama-cpp-bin /path/llama-speculative-simple --llama-cpp-target t.gguf --llama-cpp-draft d.gguf]

Per prompt, in one process and rotating order: ortspec target-only, ortspec
with the bundle's draft, ortspec prompt-lookup; transformers (PyTorch, CPU,
fp32, from the same source weights the bundle was exported from) target-only
`generate`, prompt-lookup `generate(prompt_lookup_num_tokens=...)`, and
assisted generation with the draft's source model when the draft is a separate
model (a quantized self-draft has no PyTorch counterpart). Greedy decoding.
Optionally llama.cpp's `llama-speculative-simple` binary if given (not
installed by ortspec). Prints tokens/s per runtime and ratios against
transformers' target-only generate.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import re
import statistics
import subprocess
import sys
import time

REPO = Path(__file__).resolve().parent.parent


def load_hf(source: dict):
    import torch
    from transformers import AutoModelForCausalLM
    ref = Path(source["ref"])
    kw = {"gguf_file": ref.name} if source["kind"] == "gguf" else {}
    where = str(ref.parent) if source["kind"] == "gguf" else source["ref"]
    model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kw).eval()
    return model


def hf_run(model, ids, max_new, eos, **kw) -> tuple[int, float]:
    import torch
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0], **kw)
    return out.shape[1] - len(ids), time.perf_counter() - t0


def llama_cpp_run(binary, target, draft, prompt, max_new, threads) -> tuple[int, float] | None:
    cmd = [binary, "-m", target, "-md", draft, "-p", prompt, "-n", str(max_new), "--temp", "0", "-t", str(threads),
           "--draft-max", "4"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds", proc.stderr + proc.stdout)
    return (int(m.group(1)), float(m.group(2))) if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(REPO / "tools" / "prompts" / "dev.jsonl"))
    ap.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--plot")
    ap.add_argument("--llama-cpp-bin")
    ap.add_argument("--llama-cpp-target")
    ap.add_argument("--llama-cpp-draft")
    args = ap.parse_args()

    import torch
    from ortspec import SpeculativeGenerator
    from ortspec.bench import load_prompts
    torch.set_num_threads(args.threads)
    spec = SpeculativeGenerator.load(args.bundle, threads=args.threads, verify="none")
    base, lookup = spec.sibling("none"), spec.sibling("prompt_lookup")
    b = spec.bundle
    target_hf = load_hf(b.target.source)
    draft_src = b.draft.source if b.draft is not None else None
    assistant = load_hf(draft_src) if draft_src and draft_src.get("kind") != "self" else None
    eos = sorted(b.eos_token_ids)
    prompts = load_prompts(Path(args.prompts))[: args.limit or None]
    g = args.num_draft_tokens
    runners = {
        "ortspec target-only": lambda ids, p: (lambda r: (len(r.token_ids), r.stats.total_time_s))(
            base.generate(input_ids=ids, max_new_tokens=args.max_new_tokens)),
        f"ortspec draft model g={g}": lambda ids, p: (lambda r: (len(r.token_ids), r.stats.total_time_s))(
            spec.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, num_draft_tokens=g)),
        f"ortspec prompt-lookup g={g}": lambda ids, p: (lambda r: (len(r.token_ids), r.stats.total_time_s))(
            lookup.generate(input_ids=ids, max_new_tokens=args.max_new_tokens, num_draft_tokens=g)),
        "transformers target-only": lambda ids, p: hf_run(target_hf, ids, args.max_new_tokens, eos),
        f"transformers prompt-lookup {g}": lambda ids, p: hf_run(target_hf, ids, args.max_new_tokens, eos,
                                                                 prompt_lookup_num_tokens=g),
    }
    if assistant is not None:
        runners["transformers assisted"] = lambda ids, p: hf_run(target_hf, ids, args.max_new_tokens, eos,
                                                                 assistant_model=assistant)
    if args.llama_cpp_bin:
        runners["llama.cpp speculative"] = lambda ids, p: llama_cpp_run(
            args.llama_cpp_bin, args.llama_cpp_target, args.llama_cpp_draft, p, args.max_new_tokens, args.threads)
    names = list(runners)
    rows = {n: [] for n in names}
    for k, item in enumerate(prompts):
        text = b.tokenizer_file and spec.codec.render_chat(item["prompt"])
        ids = spec.codec.encode(item["prompt"], chat=True)
        for n in names[k % len(names):] + names[: k % len(names)]:
            got = runners[n](ids, text)
            if got:
                rows[n].append({"prompt": item["id"], "tokens": got[0], "seconds": got[1],
                                "tokens_per_s": got[0] / got[1]})
        print(f"prompt {k + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    ref = "transformers target-only"
    summary = []
    for n in names:
        if not rows[n]:
            continue
        tps = sum(r["tokens"] for r in rows[n]) / sum(r["seconds"] for r in rows[n])
        ratios = [r["tokens_per_s"] / h["tokens_per_s"] for r, h in zip(rows[n], rows[ref])]
        summary.append({"runtime": n, "tokens_per_s": tps, "ratio_vs_transformers": statistics.median(ratios)})
    print(f"{'runtime':<34}{'tok/s':>8}{'x transformers':>16}")
    for s in summary:
        print(f"{s['runtime']:<34}{s['tokens_per_s']:>8.1f}{s['ratio_vs_transformers']:>16.2f}")
    report = {"bundle": args.bundle, "max_new_tokens": args.max_new_tokens, "prompts": len(prompts),
              "summary": summary, "per_prompt": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.barh([s["runtime"] for s in summary], [s["tokens_per_s"] for s in summary])
        ax.set_xlabel("tokens/s (greedy)")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
