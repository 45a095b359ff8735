#!/usr/bin/env python3
"""Drafts compared over one loaded target: the same requests, interleaved, in one process.

    python tools/draft_ab.py models/qwen2.5-coder /work/other-bundle --limit 6 --max-new-tokens 96 --greedy
    python tools/draft_ab.py models/qwen2.5-coder B2 B3 --sample --temperature 0.7 --top-p 0.8 --top-k 20
    python tools/draft_ab.py models/qwen2.5-coder-int4 B2 --drafter hybrid --num-draft-tokens auto

BASE is loaded whole; of each OTHER bundle only its draft is loaded, and it drafts for BASE's target (the
bundles must share BASE's tokenizer). Each prompt runs once with every draft, in rotating order, with the same
seed, so the drafts meet the same machine. Printed per draft: the whole requests' total time, the median
tokens/s and time to first token, tokens per round and acceptance; then each OTHER's total time against BASE's.
"""
from __future__ import annotations

import argparse
from pathlib import Path
import statistics
import sys

DEV_PROMPTS = Path(__file__).resolve().parent.parent / "runtime" / "data" / "dev.jsonl"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="bundle whose target (and draft) run")
    ap.add_argument("others", nargs="+", help="bundles whose drafts draft for BASE's target")
    ap.add_argument("--prompts", default=str(DEV_PROMPTS), help="jsonl with a \"prompt\" per line (default: dev)")
    ap.add_argument("--limit", type=int, default=6, help="first N prompts (default 6)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--num-draft-tokens", default="4", help="gamma or 'auto' (default 4)")
    ap.add_argument("--drafter", default="model", choices=["model", "hybrid"],
                    help="each draft model drafts alone (model, the default) or with n-gram lookups (hybrid)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true")
    mode.add_argument("--sample", action="store_true")
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--repetition-penalty", type=float)
    args = ap.parse_args()
    if args.limit < 1 or args.max_new_tokens < 1:
        ap.error("--limit and --max-new-tokens must be >= 1")
    gamma = args.num_draft_tokens if args.num_draft_tokens == "auto" else int(args.num_draft_tokens)

    from ortspec import SpeculativeGenerator
    from ortspec.bench import load_prompts
    from ortspec.bundle import load_bundle
    from ortspec.drafting import make_drafter
    from ortspec.engine import CausalLM

    gen = SpeculativeGenerator.load(args.base, thread_pool="shared", drafter=args.drafter)
    base_drafter = getattr(gen.drafter, "model", gen.drafter)
    if getattr(base_drafter, "lm", None) is None:
        ap.error(f"{args.base} has no draft model")
    tokenizer = gen.bundle.tokenizer_file.read_bytes() if gen.bundle.tokenizer_file else None
    gens = {f"0 {args.base}": gen}
    for n, root in enumerate(args.others, 1):
        other = load_bundle(root, verify="size")
        if other.draft is None:
            ap.error(f"{root} has no draft model")
        if (other.tokenizer_file.read_bytes() if other.tokenizer_file else None) != tokenizer \
                or other.draft.output_vocab != gen.target.spec.vocab_size:
            ap.error(f"{root} does not share {args.base}'s tokenizer and vocabulary")
        lm = CausalLM(other.draft, str(other.file(other.draft.path)), thread_pool="shared")
        source = gen.target if base_drafter.source is not None and lm.can_share(gen.target) else None
        twin = gen.sibling(args.drafter)
        twin.drafter = make_drafter(args.drafter, lm, base_drafter.window, source)
        gens[f"{n} {root}"] = twin
    sampling = {"do_sample": False} if args.greedy else {
        "do_sample": True if args.sample else None, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "repetition_penalty": args.repetition_penalty}
    prompts = [item["prompt"] for item in load_prompts(Path(args.prompts))][:args.limit]
    chat = gen.codec is not None and bool(gen.codec.chat_template)
    names = list(gens)
    runs: dict[str, list] = {name: [] for name in names}
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            runs[name].append(gens[name].generate(prompt, chat=chat, max_new_tokens=args.max_new_tokens,
                                                  num_draft_tokens=gamma, seed=i, **sampling).stats)
        print(f"[draft_ab] prompt {i + 1}/{len(prompts)} done", file=sys.stderr, flush=True)
    width = max(len(n) for n in names)
    print(f"{'draft of':{width}s}  total s  tok/s  ttft ms  tok/round  acceptance   "
          f"({len(prompts)} prompts, {args.max_new_tokens} new tokens, {args.drafter} drafter, gamma {gamma}, "
          f"{'greedy' if args.greedy else 'sampled'})")
    for name in names:
        v = runs[name]
        drafted = sum(s.drafted for s in v)
        print(f"{name:{width}s}  {sum(s.total_time_s for s in v):7.1f}  {statistics.median(s.tokens_per_s for s in v):5.2f}"
              f"  {1e3 * statistics.median(s.first_token_s for s in v):7.0f}"
              f"  {sum(s.new_tokens for s in v) / max(1, sum(s.rounds for s in v)):9.2f}"
              f"  {sum(s.accepted for s in v) / max(1, drafted):10.2f}")
    base_total = sum(s.total_time_s for s in runs[names[0]])
    for name in names[1:]:
        print(f"{name}: {base_total / sum(s.total_time_s for s in runs[name]):.3f}x the base draft's speed "
              "(total time of the same requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
