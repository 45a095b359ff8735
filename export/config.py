"""ExportConfig: everything one export is asked to do, checked before any work (``export_bundle`` takes one)."""
from __future__ import annotations

from dataclasses import dataclass, replace
import os
from pathlib import Path

from ortspec.checks import is_int
from ortspec.config import check_decoding, check_generation

from .gguf_graph import split_layout
from .quantize import check_method

KEEP = "gguf"  # a quant value: keep the .gguf file's own quantized weights
GRAPHS = ("auto", "fused", "optimum")


@dataclass(frozen=True)
class ModelRequest:
    """What is asked of one of the two models: its source (a hub id, a model directory, a .gguf file, or "self"
    for a quantized copy of the target), a re-quantization method (None: none) and whether the .gguf file's own
    quantized weights are to be kept whatever ``dtype`` says (quant "gguf")."""

    role: str               # "target" or "draft"
    source: str
    quant: str | None
    keep: bool


@dataclass(frozen=True)
class ExportConfig:
    """One export: ``target`` (and ``draft``, or ``"self"`` for a quantized copy) into bundle ``out``.

    Sources: a Hugging Face hub id, a local model directory, or a .gguf file.
    graph: "fused" (onnxruntime contrib operators, in-place KV cache; Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3),
    "optimum" (optimum's text-generation-with-past export), or "auto" (fused where supported).
    dtype: None (default): a .gguf source exported without --*-quant keeps the file's quantized weights as they
        are (MatMulNBits/GatherBlockQuantized holding the file's codes and scales: the GGUF model itself, no
        second rounding); any other source, fp32. "fp32": float weights (a GGUF file dequantized);
        "fp16": float16 (fused graphs only; meant for the CUDA execution provider).
    genai_config: also write onnxruntime-genai configs, with this speculative.max_draft_tokens (1-16).
    draft_vocab: give the draft an output layer for token ids [0, draft_vocab) and the special tokens only
        (a cheaper draft; the other ids get probability 0 in q and the verifier's residual keeps the output exact).
    generation: sampling settings the model's authors recommend (do_sample, temperature, top_k, top_p,
        repetition_penalty), written into the bundle's generation_config.json as the defaults of generation.
    decoding: the drafter and draft length a call that leaves them out uses ({"drafter": "hybrid",
        "num_draft_tokens": "auto"}, say), written into the manifest; without it, "model" and 4.
    draft_quant / target_quant: re-quantize that model ("int4", "int8w", ...; see quantize.METHODS; a
        MatMulNBits method takes a block size as "int4:64"), or "gguf":
        keep that .gguf file's own quantized weights even when ``dtype`` asks for float weights (an fp32 target
        from one file with a draft kept as its file has it, say).
    activations: how the matrices of a GGUF file kept as they are read their inputs: "int8" (default: rounded to
        int8 per block, as llama.cpp's CPU kernels do; fastest) or "fp32" (the 4-bit matrices read float inputs:
        closer to the file's model in float, at 1.3-2.9x the cost per decoding step on a CPU).
    gguf_layout: how a .gguf file's quantized matrices are held when kept: "compact" (default: 4-bit types as
        the file has them, their minimums folded into the same product, gguf_weights.folded; Q5/Q6_K
        re-rounded to 8-bit codes in blocks of 128, gguf_weights.requantize8 — a pass reads ~12% fewer bytes and
        runs fewer operators, for a change in the weights far below the file's own rounding) or "exact" (every
        weight the file's to float rounding; Q6_K as 8-bit codes in blocks of 16). "compact:B" re-blocks to B
        (16-256). None: "compact".
    overwrite: replace a bundle already at ``out``. trust_remote_code: run code a hub model ships (never by
    default).

    Made with bad values, it raises ValueError naming the option, before any work.
    """

    target: str
    draft: str | None = None
    out: str | os.PathLike = "bundle"
    draft_quant: str | None = None
    target_quant: str | None = None
    overwrite: bool = False
    trust_remote_code: bool = False
    graph: str = "auto"
    dtype: str | None = None
    genai_config: int | None = None
    draft_vocab: int | None = None
    generation: dict | None = None
    activations: str = "int8"
    decoding: dict | None = None
    gguf_layout: str | None = "compact"

    def __post_init__(self) -> None:
        target, draft, draft_quant, target_quant = self.target, self.draft, self.draft_quant, self.target_quant
        if not isinstance(target, str) or not target:
            raise ValueError("target must be a hub id, a model directory or a .gguf path")
        if draft is not None and (not isinstance(draft, str) or not draft):
            raise ValueError("draft must be None, 'self', a hub id, a model directory or a .gguf path")
        for name, q in (("draft_quant", draft_quant), ("target_quant", target_quant)):
            if q is not None and q != KEEP:
                check_method(name, q)
        if draft == "self" and draft_quant in (None, KEEP):
            raise ValueError("draft='self' makes the draft a quantized copy of the target: pass draft_quant='int4' "
                             "or 'int8'")
        if draft is None and draft_quant is not None:
            raise ValueError("draft_quant needs a draft: pass draft='self' or a draft model")
        for name, q, src in (("draft_quant", draft_quant, draft), ("target_quant", target_quant, target)):
            if q == KEEP and not str(src).lower().endswith(".gguf"):
                raise ValueError(f"{name}={KEEP!r} keeps a .gguf file's own quantized weights, and {src!r} is "
                                 "not a .gguf file")
        if target_quant == "int8":
            raise ValueError("target_quant='int8' (dynamic quantization) is refused: it quantizes activations with "
                             "one scale per pass, so a position's logits depend on the other positions in its pass "
                             "and speculative output could not equal target-only output; use target_quant='int8w' "
                             "(8-bit weights, activations quantized per block of each row: exact) or 'int4'")
        if self.graph not in GRAPHS:
            raise ValueError(f"graph must be 'auto', 'fused' or 'optimum', got {self.graph!r}")
        if self.activations not in ("int8", "fp32"):
            raise ValueError(f"activations must be 'int8' or 'fp32', got {self.activations!r}")
        object.__setattr__(self, "gguf_layout", self.gguf_layout or "compact")
        split_layout(self.gguf_layout)
        if self.activations != "int8" and not any(
                str(m.source).lower().endswith(".gguf") and (m.keep or (not m.quant and self.dtype is None))
                for m in self.models() if m.source != "self"):
            raise ValueError("activations applies to the matrices of a .gguf file kept as they are: pass a .gguf "
                             "target or draft without --dtype and without re-quantizing it")
        if self.dtype not in (None, "fp32", "fp16"):
            raise ValueError(f"dtype must be None (as the source is), 'fp32' or 'fp16', got {self.dtype!r}")
        if self.genai_config is not None and not is_int(self.genai_config, 1, 16):
            raise ValueError(f"genai_config must be None or max_draft_tokens from 1 to 16, got {self.genai_config!r}")
        if self.draft_vocab is not None and not is_int(self.draft_vocab, 1):
            raise ValueError(f"draft_vocab must be None or a positive number of token ids, got {self.draft_vocab!r}")
        check_generation(self.generation)
        if self.decoding is not None:
            object.__setattr__(self, "decoding", check_decoding(self.decoding, draft is not None))
        if self.draft_vocab is not None and draft is None:
            raise ValueError("draft_vocab restricts the draft's output layer: pass a draft too")
        if self.draft_vocab is not None and draft_quant == KEEP:
            raise ValueError(f"draft_vocab rebuilds the draft's output layer from float weights: it cannot keep the "
                             f"file's quantized weights (draft_quant={KEEP!r}); pick one")
        if self.dtype == "fp16" and "int8" in (draft_quant, target_quant):
            raise ValueError("int8 dynamic quantization needs fp32 weights; use int4 or int8w with fp16")
        object.__setattr__(self, "out", Path(self.out).expanduser())

    def models(self) -> list[ModelRequest]:
        """What is asked of the target, then of the draft (when there is one)."""
        asked = [("target", self.target, self.target_quant)] + ([("draft", self.draft, self.draft_quant)]
                                                                if self.draft is not None else [])
        return [ModelRequest(role, source, None if quant == KEEP else quant, quant == KEEP)
                for role, source, quant in asked]

    def but(self, **changes) -> "ExportConfig":
        """The same export with some options changed (checked again)."""
        return replace(self, **changes)
