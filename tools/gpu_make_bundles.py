#!/usr/bin/env python3
"""Build the bundles of the CUDA check on a machine without model weights or network.

Random-weight models through the fused builder, written to OUT_DIR:

    tiny-fp32     vocab-16 Llama pair (INT4 self-draft), for the distribution test
    smollm2-fp16  SmolLM2-135M-shaped Llama, fp16, with an INT4 copy of itself as draft
    qwen-fp16     Qwen2.5-Coder-1.5B-shaped target with a 0.5B-shaped draft, both fp16

Random weights make acceptance meaningless, but step costs, pass-size invariance, greedy equality and the
distribution test are all valid on them. ``--shapes tiny`` builds the same three bundles at toy sizes (seconds
on a CPU), which is how the test suite runs the whole check.

    python tools/gpu_make_bundles.py OUT_DIR [--shapes real|tiny]
"""
from __future__ import annotations

import argparse
from pathlib import Path
import shutil
import sys
import tempfile

LLAMA_TINY = dict(vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
                  tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)


def _qwen(vocab: int, hidden: int, inter: int, layers: int, heads: int, kv_heads: int, positions: int = 32768) -> dict:
    return dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
                tie_word_embeddings=True)


SHAPES = {
    "real": {
        "smollm2": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                        rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
        "qwen-target": _qwen(151936, 1536, 8960, 28, 12, 2),   # Qwen2.5-1.5B
        "qwen-draft": _qwen(151936, 896, 4864, 24, 14, 2),     # Qwen2.5-0.5B
    },
    "tiny": {
        "smollm2": dict(LLAMA_TINY, vocab_size=512, max_position_embeddings=1024),
        "qwen-target": _qwen(512, 64, 96, 2, 4, 2, positions=1024),
        "qwen-draft": _qwen(512, 32, 48, 1, 2, 1, positions=1024),
    },
}


def _save(kind: str, config: dict, where: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cls, cfg = (Qwen2ForCausalLM, Qwen2Config) if kind.startswith("qwen") else (LlamaForCausalLM, LlamaConfig)
    out = where / kind
    cls(cfg(**config)).save_pretrained(str(out))
    return out


def build(out: Path, shapes: str = "real") -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    sizes = SHAPES[shapes]
    src = Path(tempfile.mkdtemp(prefix="ortspec-gpu-src-"))  # the Hugging Face copies: removed once exported
    try:
        return _build(out, sizes, src)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def _build(out: Path, sizes: dict, src: Path) -> list[Path]:
    from ortspec.export import export_bundle
    made = []
    tiny = _save("tiny", LLAMA_TINY, src)
    made.append(export_bundle(target=str(tiny), draft="self", draft_quant="int4", out=out / "tiny-fp32",
                              dtype="fp32", overwrite=True, graph="fused", progress=None))
    smol = _save("smollm2", sizes["smollm2"], src)
    made.append(export_bundle(target=str(smol), draft="self", draft_quant="int4", out=out / "smollm2-fp16",
                              dtype="fp16", overwrite=True, graph="fused", progress=None))
    target, draft = _save("qwen-target", sizes["qwen-target"], src), _save("qwen-draft", sizes["qwen-draft"], src)
    made.append(export_bundle(target=str(target), draft=str(draft), out=out / "qwen-fp16", dtype="fp16",
                              overwrite=True, graph="fused", progress=None))
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="directory the bundles are written to")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="real",
                    help="real: the models' own shapes (GPU machine); tiny: toy sizes (CPU rehearsal, tests)")
    args = ap.parse_args()
    for path in build(Path(args.out), args.shapes):
        print("built", path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
