"""GGUF files kept as they are: the layout of their quantized matrices in the graph, and how far a rounded
target is from its source's float model (measured once at export)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from .load import Source

Progress = Callable[[str], None]


# MatMulNBits accuracy levels by the matrices' bits: 4 rounds each input row to int8 per block, 1 reads it in fp32.
# With fp32 inputs onnxruntime's 4-bit kernel costs 1.3-2.9x per decoding step here, its 8-bit one (the 5-, 6-
# and 8-bit GGUF types) several times more: those keep int8 inputs.
ACCURACY_LEVELS = {"int8": {4: 4, 8: 4}, "fp32": {4: 1, 8: 4}}


GGUF_LAYOUTS = ("compact", "exact")


def split_layout(layout: str) -> tuple[str, int]:
    """``"compact"`` -> ("compact", 128), ``"compact:64"`` -> ("compact", 64), ``"exact"`` -> ("exact", 0);
    ValueError names what is allowed."""
    name, _, block = str(layout).partition(":")
    if name not in GGUF_LAYOUTS or (block and (name == "exact" or not block.isdigit()
                                               or int(block) not in (16, 32, 64, 128, 256))):
        raise ValueError(f"gguf_layout must be 'compact', 'compact:B' (B 16, 32, 64, 128 or 256) or 'exact', "
                         f"got {layout!r}")
    return name, int(block) if block else (0 if name == "exact" else 128)


def gguf_graph(src: Source, out_dir: Path, say: Progress, activations: str = "int8",
                layout: str = "compact") -> dict:
    """Build the fused graph of a GGUF source with its quantized matrices as the file has them (``layout``
    "exact") or in the compact layout (``split_layout``); the manifest's quantization entry. With fp32
    activations the 4-bit matrices read float inputs; the 8-bit ones and the output layer still read int8 (at
    fp32 the output layer alone would cost several times the rest of a step, and it moves top-1 agreement
    least)."""
    from .fused import build_fused
    from .gguf_weights import compact, read_block_weights
    from .quantize import count_quantized
    name, block8 = split_layout(layout)
    sd = {k: v.detach().float().numpy() for k, v in src.model.state_dict().items()}
    blocks, counts = read_block_weights(src.info["ref"], sd, src.model.config)
    say("GGUF weights checked against the dequantized model: " +
        ", ".join(f"{n} x {t}" for t, n in sorted(counts.items())))
    if name != "exact":
        blocks = compact(blocks, block8)
    levels = ACCURACY_LEVELS[activations]
    path = build_fused(src.model, out_dir, "fp32", blocks=blocks, accuracy_level=levels, head_accuracy_level=4,
                       offsets="fold" if name == "compact" and activations == "int8" else "float")
    # the longest block decides how onnxruntime tiles rows (ModelSpec.row_tile: in pairs from blocks of 64)
    entry = {"method": "gguf", "op": "MatMulNBits", "block_size": max((w.block for w in blocks.values()), default=32),
             "accuracy_level": {f"{b}-bit": lv for b, lv in levels.items()},
             "output_layer_accuracy_level": 4, "activations": activations, "types": counts,
             "layout": name, "float_tensors": "norms, biases and any tensor of another type",
             "quantized_nodes": count_quantized(path)}
    if name == "compact":
        entry["layout_detail"] = (f"5- and 6-bit types re-rounded to 8-bit codes in blocks of {block8}; per-block "
                                  "minimums folded into each product as the weights of the input's block sums")
    return entry


FIDELITY_TOKENS = 256


def reference_rows(src: Source, tokens: int = FIDELITY_TOKENS) -> tuple[list[int], "np.ndarray"]:
    """The first ``tokens`` tokens of the shipped quality text and the source's float model's log-probabilities
    of the next token at each (PyTorch, float32; a GGUF file dequantized: the file's float model)."""
    import torch
    from ortspec.quality import log_softmax
    from ortspec.shipped import shipped
    ids = list(src.tokenizer(shipped("quality.txt").read_text())["input_ids"][:tokens])
    with torch.no_grad():
        logits = src.model(torch.tensor([ids])).logits[0].float().numpy()
    return ids, log_softmax(logits).astype(np.float32)


def fidelity_to_source(reference: tuple, root: Path, entry: dict) -> dict:
    """Top-1 agreement and mean KL(float || graph) of the graph in ``entry`` (a manifest model entry under
    ``root``) against ``reference_rows``, teacher-forced, every position scored."""
    from ortspec.bundle import ModelSpec
    from ortspec.engine import CausalLM
    from ortspec.quality import log_softmax
    ids, base = reference
    spec = ModelSpec.from_dict(entry, "target")
    lm = CausalLM(spec, str(root / spec.path))
    ids, base = ids[:lm.capacity], base[:lm.capacity]  # (a model of few positions: as many as it takes)
    cand = log_softmax(lm.forward(ids))
    del lm
    base = base.astype(np.float64)
    kl = float(np.mean(np.sum(np.exp(base) * (base - cand), axis=-1)))
    return {"reference": "the source's float model (PyTorch)", "text": "ortspec/data/quality.txt",
            "positions": len(ids), "top1": float(np.mean(cand.argmax(-1) == base.argmax(-1))), "mean_kl": kl}
