#!/usr/bin/env python3
"""Build bundles for the CUDA check on a machine without model weights or network.

Writes SmolLM2-135M-shaped (and optionally Qwen2.5-0.5B/1.5B-shaped) Llama/Qwen2
models with random weights through the fused builder, fp16, each with an INT4
copy of itself as draft. Random weights make acceptance meaningless, but step
costs (what calibration measures), greedy equality and the distribution test
are all valid on them.

    python tools/gpu_make_bundles.py OUT_DIR [--qwen]
"""
from __future__ import annotations

import argparse
from pathlib import Path
import sys
import tempfile


def make(kind: str, where: Path, dtype: str, draft_quant: str | None) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    from ortspec.export import export_bundle
    torch.manual_seed(0)
    if kind == "smollm2":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                             num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                             max_position_embeddings=8192, rope_theta=100000.0,
                                             tie_word_embeddings=True, bos_token_id=1, eos_token_id=2))
    elif kind == "qwen-1.5b":
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                             num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                                             max_position_embeddings=32768, tie_word_embeddings=True))
    else:  # tiny: for the distribution test
        model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=64, intermediate_size=96,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=256, initializer_range=0.2,
                                             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2))
    src = Path(tempfile.mkdtemp()) / kind
    model.save_pretrained(str(src))
    out = where / f"{kind}-{dtype}"
    return export_bundle(target=str(src), draft="self", draft_quant=draft_quant, out=out, dtype=dtype,
                         overwrite=True, graph="fused")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--qwen", action="store_true", help="also build a Qwen2.5-1.5B-shaped bundle")
    args = ap.parse_args()
    where = Path(args.out)
    where.mkdir(parents=True, exist_ok=True)
    make("tiny", where, "fp32", "int4")
    make("smollm2", where, "fp16", "int4")
    make("smollm2", where, "fp32", "int4")
    if args.qwen:
        make("qwen-1.5b", where, "fp16", "int4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
