#!/usr/bin/env python3
"""Step cost of the fused graph against optimum's graph, per model family, on random weights.

    python tools/family_cost.py                      # every family, shapes below
    python tools/family_cost.py --family qwen3 --layers 28 --vocab 151936

For each family a random model with the hidden size, heads and MLP width of a
real small member (the layer count and vocabulary as given, so that export stays
quick) is exported twice, with the fused builder and with optimum, and
tools/step_cost.py times both targets interleaved in one process (1 and 5
positions after 200 cached tokens, median of --repeat passes). Random weights
cost what trained ones do: the work per step depends on the shapes only.
"""
from __future__ import annotations

import argparse
from pathlib import Path
import subprocess
import sys
import tempfile

# family -> (the real member whose shape is used, its config fields); config and model classes as the tests'
SHAPES = {
    "qwen3": ("Qwen3-0.6B", dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128)),
    "phi3": ("Phi-3-mini", dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=32,
                                num_key_value_heads=32, sliding_window=2047)),
    "gemma2": ("Gemma-2-2B", dict(hidden_size=2304, intermediate_size=9216, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=256, query_pre_attn_scalar=256,
                                  sliding_window=4096)),
    "gemma3": ("Gemma-3-1B", dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=4,
                                  num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                                  sliding_window=512)),
}


def make(family: str, out: Path, layers: int, vocab: int) -> Path:
    import torch
    import transformers
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tiny import FAMILY_CONFIGS, save_tokenizer
    config_cls, model_cls, _ = FAMILY_CONFIGS[family]
    cfg = getattr(transformers, config_cls)(vocab_size=vocab, num_hidden_layers=layers, max_position_embeddings=4096,
                                            pad_token_id=0, tie_word_embeddings=family.startswith("gemma"),
                                            **SHAPES[family][1])
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(cfg)
    model.save_pretrained(str(out))
    save_tokenizer(vocab, out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", action="append", choices=sorted(SHAPES), help="repeatable; default: all")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of each random model (default 8)")
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary size (default 32000)")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--workdir", help="where models and bundles go (default: a temporary directory)")
    args = ap.parse_args()
    if args.layers < 1 or args.vocab < 16 or args.repeat < 1:
        sys.exit("--layers, --vocab and --repeat must be positive (vocab at least 16)")
    from ortspec.export import export_bundle
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for family in args.family or sorted(SHAPES):
            member = SHAPES[family][0]
            print(f"== {family}: {member} shape, {args.layers} layers, vocabulary {args.vocab}", flush=True)
            src = make(family, Path(tmp) / family, args.layers, args.vocab)
            bundles = []
            for graph in ("fused", "optimum"):
                out = Path(tmp) / f"{family}-{graph}"
                export_bundle(target=str(src), out=out, graph=graph, progress=None)
                bundles.append(str(out))
            subprocess.run([sys.executable, str(Path(__file__).with_name("step_cost.py")), *bundles,
                            "--repeat", str(args.repeat)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
