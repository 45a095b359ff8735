#!/usr/bin/env python3
"""Time outside onnxruntime per sampling setting, target-only and speculating, interleaved in one process.

    python tools/host_share.py models/smollm2-135m
    python tools/host_share.py models/qwen2.5-coder --limit 4 --max-new-tokens 48 --num-draft-tokens auto

For each setting, every dev prompt runs target-only (drafter "none") and with the bundle's draft model, the
two in alternating order; the share of wall time spent outside onnxruntime's runs (the logits pipeline,
sampling, verification, the loop, the Python around each pass) is printed for each, with the host
milliseconds per round.
"""
from __future__ import annotations

import argparse
from pathlib import Path
import sys

SETTINGS = {
    "Qwen2.5 (T 0.7, top-p 0.8, top-k 20, rep 1.05)": dict(temperature=0.7, top_p=0.8, top_k=20,
                                                          repetition_penalty=1.05),
    "Llama-3 style (T 0.6, top-p 0.9, top-k 50)": dict(temperature=0.6, top_p=0.9, top_k=50),
    "top-k 50 (transformers' default)": dict(top_k=50),
    "temperature 0.7, no top-k": dict(temperature=0.7, top_k=0),
    "top-p 0.9, no top-k": dict(top_p=0.9, top_k=0),
    "repetition penalty 1.1, no top-k": dict(repetition_penalty=1.1, top_k=0),
}
PROMPTS = Path(__file__).resolve().parent / "prompts" / "dev.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(PROMPTS), help="jsonl prompts (default: the dev prompts)")
    ap.add_argument("--limit", type=int, default=6, help="the first N prompts (default 6)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", default="4", help="gamma or 'auto' (default 4)")
    args = ap.parse_args()
    if args.limit < 1 or args.max_new_tokens < 1:
        ap.error("--limit and --max-new-tokens must be >= 1")
    gamma = args.num_draft_tokens if args.num_draft_tokens == "auto" else int(args.num_draft_tokens)

    from ortspec import SpeculativeGenerator
    from ortspec.bench import load_prompts
    from ortspec.bundle import load_bundle
    from ortspec.errors import OrtspecError
    try:
        if load_bundle(args.bundle, verify="size").draft is None:
            ap.error(f"{args.bundle} has no draft model")
    except OrtspecError as exc:
        ap.error(str(exc))
    gen = SpeculativeGenerator.load(args.bundle, thread_pool="shared")
    alone = gen.sibling("none")
    prompts = [item["prompt"] for item in load_prompts(Path(args.prompts))][:args.limit]
    chat = gen.codec is not None and bool(gen.codec.chat_template)
    encode = (lambda p: {"prompt": p, "chat": chat}) if gen.codec else (lambda p: {"input_ids": [1, 2, 3]})
    gen.generate(**encode(prompts[0]), max_new_tokens=4, do_sample=True, seed=0)  # warm-up
    print(f"{args.bundle}: time outside onnxruntime, {len(prompts)} prompts x {args.max_new_tokens} tokens, "
          f"speculating with gamma {gamma}")
    print(f"{'setting':<48}{'target-only':>14}{'speculating':>14}{'host ms/round (spec.)':>23}")
    for name, settings in SETTINGS.items():
        spent = {"none": [0.0, 0.0, 0], "model": [0.0, 0.0, 0]}
        for i, prompt in enumerate(prompts):
            order = (("none", alone), ("model", gen)) if i % 2 == 0 else (("model", gen), ("none", alone))
            for label, g in order:
                s = g.generate(**encode(prompt), max_new_tokens=args.max_new_tokens, num_draft_tokens=gamma,
                               seed=i, do_sample=True, **settings).stats
                acc = spent[label]
                acc[0] += s.overhead_time_s
                acc[1] += s.total_time_s
                acc[2] += s.rounds
        share = {k: 100 * v[0] / v[1] for k, v in spent.items()}
        per_round = 1000 * spent["model"][0] / max(spent["model"][2], 1)
        print(f"{name:<48}{share['none']:>13.2f}%{share['model']:>13.2f}%{per_round:>23.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
