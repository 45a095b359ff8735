"""Weight quantization of an exported graph.

- ``int8``: onnxruntime dynamic quantization: int8 weights with a scale per output column, activations
  quantized per call (one scale per pass: for drafts only, whose passes need not round alike). Its
  multi-position passes run on onnxruntime's integer GEMM, so a draft reads a prompt 2.4-3.8x faster than
  through ``MatMulNBits`` (Qwen2.5-Coder-0.5B, 64 positions: 89 vs 340 ms) at about the same step cost.
- ``int4``: ``MatMulNBits`` 4-bit weights, block 32, symmetric, accuracy level 4.
- ``int4a``: the same with a 4-bit zero point per block (asymmetric: each block's range is fitted from
  its minimum to its maximum, so no code goes unused), at the same speed (onnxruntime's fast path takes
  integer zero points).
- ``int4a-h8``: ``int4a`` with the output layer in 8-bit blocks: a small model's output layer is a large
  share of its weights and the one that decides which token comes first.
- ``int8w``: ``MatMulNBits`` 8-bit weights (same blocks): weight-only, activations stay float.
  On SmolLM2-135M it keeps ~95% of greedy drafts where int4 keeps ~75%, at a
  similar step cost on the fused graph, so it is usually the better draft.
- ``int4s``: ``int4a``'s layout (a 4-bit zero point per block) with each block's scale and zero point searched
  rather than fitted to its range: of nine candidate scales around the range's, the one whose codes leave the
  smallest squared error, each weight's error weighted by its size (large weights matter most to a product).
  At blocks of 64 its error is about that of ``int4``'s at 32 (Qwen2.5-Coder-1.5B, a gate matrix: 0.94% of
  the weights' energy against 0.97%). Slower to export (seconds per large matrix).
- ``METHOD:B`` (``int4:64``, ``int4a:128``, ...): a ``MatMulNBits`` method with blocks of B weights (16-256, a
  power of two) instead of 32. Fewer scales to read, and onnxruntime's int8-input kernel runs faster on longer
  blocks (Qwen2.5-Coder-1.5B one-position pass on a 2-core AMD EPYC: 37.2 ms at 32, 28.1 at 64, 23.5 at 128),
  at some cost in fidelity (docs/results.md, "Block size"). onnxruntime computes rows of such matrices in
  pairs, so a target's bitwise passes then have an even number of positions (``ModelSpec.row_tile``).

All quantize the token embedding (4-bit methods) and the lm_head, which optimum exports as a
Transpose of the (tied) embedding: the transpose is folded into its own
initializer first so that the quantizer sees a constant MatMul weight.
"""
from __future__ import annotations

from pathlib import Path
import tempfile

from ortspec.errors import ExportError

from .graph import consolidate, output_layer

METHODS = ("int8", "int4", "int4a", "int4s", "int4a-h8", "int8w")
NBITS = {"block_size": 32, "accuracy_level": 4}
# method -> (bits of the body, symmetric, bits of the output layer)
NBITS_METHODS = {"int4": (4, True, 4), "int4a": (4, False, 4), "int4s": (4, False, 4), "int4a-h8": (4, False, 8),
                 "int8w": (8, True, 8)}
SEARCHED = ("int4s",)       # methods whose 4-bit matrices get searched scales (search_blocks)


def split_method(method: str) -> tuple[str, int]:
    """``"int4a:64"`` -> ("int4a", 64); a method without a block size has blocks of 32. ValueError names what
    is allowed."""
    name, _, block = str(method).partition(":")
    if name not in METHODS:
        raise ValueError(f"unknown quantization {method!r}; use one of {', '.join(METHODS)}, a MatMulNBits method "
                         f"with a block size as METHOD:B ({', '.join(NBITS_METHODS)}; B 16-256, a power of two)")
    if not block:
        return name, NBITS["block_size"]
    if name not in NBITS_METHODS or not block.isdigit() or int(block) not in (16, 32, 64, 128, 256):
        raise ValueError(f"quantization {method!r}: a block size goes with a MatMulNBits method "
                         f"({', '.join(NBITS_METHODS)}) and is 16, 32, 64, 128 or 256")
    return name, int(block)


def check_method(name: str, method: str) -> None:
    """ValueError unless ``method`` is a quantization ``name`` (draft_quant / target_quant) may take. (A target
    may take any block size: with blocks of 64 or more its bitwise passes have an even number of positions,
    ``ModelSpec.row_tile``.)"""
    try:
        split_method(method)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc} (or 'gguf': a .gguf file's own weights)") from None


def quantize(src: Path, dst_dir: Path, method: str) -> dict:
    """Quantize src (model.onnx + data) into dst_dir; returns the manifest entry."""
    try:
        method, block = split_method(method)
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    import logging
    import onnx

    # The quantizers log expected notices (opset upgrade, "consider pre-processing") as warnings.
    for name in ("", "onnxruntime.quantization", "onnxruntime.quantization.matmul_nbits_quantizer"):
        logging.getLogger(name).setLevel(logging.ERROR)
    dst_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst_dir.parent, prefix=".quant-") as work:
        work = Path(work)
        unfolded = consolidate(src, work / "unfolded.onnx", fold_transposes=True)
        out = work / "quant.onnx"
        try:
            if method == "int8":
                from onnxruntime.quantization import QuantType, quantize_dynamic
                quantize_dynamic(str(unfolded), str(out), op_types_to_quantize=["MatMul", "Gather"],
                                 weight_type=QuantType.QInt8, per_channel=True,
                                 use_external_data_format=True,
                                 extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
                entry = {"method": "int8", "op": "DynamicQuantizeMatMul/MatMulInteger", "weight_type": "int8",
                         "per_channel": True, "ops": ["MatMul", "Gather"]}
            else:
                model = _nbits(onnx.load(str(unfolded)), method, block, unfolded)
                model.save_model_to_file(str(out), use_external_data_format=True)
                bits, symmetric, head_bits = NBITS_METHODS[method]
                entry = {"method": method, "op": "MatMulNBits", "bits": bits, **NBITS, "block_size": block,
                         "symmetric": symmetric,
                         "head_bits": head_bits, "ops": ["MatMul", "Gather"] if bits == 4 else ["MatMul"]}
        except ExportError:
            raise
        except Exception as exc:
            raise ExportError(f"{method} quantization of {src} failed: {exc}") from None
        consolidate(out, dst_dir / "model.onnx")
        entry["quantized_nodes"] = count_quantized(dst_dir / "model.onnx")
    return entry


def _nbits(model, method: str, block: int = NBITS["block_size"], source: Path | None = None):
    """MatMulNBits quantization of ``model`` (an onnx ModelProto, loaded from ``source``) by ``method``;
    returns onnxruntime's ONNXModel wrapper. The output layer is quantized in a pass of its own where its bits
    differ."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    bits, symmetric, head_bits = NBITS_METHODS[method]
    head = output_layer(model.graph)
    head_name = [head.name] if head is not None and head.op_type == "MatMul" else []
    if head_bits != bits and not head_name:
        raise ExportError(f"{method}: the graph's output layer is not one MatMul, so it cannot be quantized apart")

    def run(proto, nbits: int, **select):
        ops = ("MatMul", "Gather") if nbits == 4 else ("MatMul",)  # onnxruntime gathers 4-bit blocks only
        q = MatMulNBitsQuantizer(proto, bits=nbits, block_size=block, is_symmetric=symmetric,
                                 accuracy_level=NBITS["accuracy_level"], op_types_to_quantize=ops,
                                 quant_axes=(("MatMul", 0), ("Gather", 1)), **select)
        q.process()
        return q.model

    if head_bits == bits:
        out = run(model, bits)
    else:
        body = run(model, bits, nodes_to_exclude=head_name)
        out = run(body.model, head_bits, nodes_to_include=head_name)
    if method in SEARCHED:  # (the quantizer took the float weights out of ``model``: read them from the file)
        _search_matmuls(out.model, source, block)
    return out


def _search_matmuls(quantized, source: Path, block: int) -> None:
    """Replace the codes, scales and zero points of each 4-bit MatMulNBits in ``quantized`` (an onnx ModelProto
    the quantizer made with per-block zero points) with ``search_blocks``' from its float weight in the graph
    file ``source``."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from .gguf_weights import BlockWeight
    floats = {t.name: t for t in onnx.load(str(source), load_external_data=False).graph.initializer}
    inits = {t.name: t for t in quantized.graph.initializer}
    for node in quantized.graph.node:
        attrs = {a.name: a.i for a in node.attribute}
        if node.op_type != "MatMulNBits" or attrs.get("bits") != 4 or len(node.input) < 4:
            continue
        name = node.input[1][:-len("_Q4")] if node.input[1].endswith("_Q4") else None
        if name not in floats or attrs["K"] % block:
            continue  # (not a weight this pass knows, or padded blocks: the quantizer's codes stay)
        rows = np.ascontiguousarray(numpy_helper.to_array(floats[name], str(source.parent)).T,
                                    dtype=np.float32)  # [N, K]
        parts = [search_blocks(rows[i:i + 4096], block) for i in range(0, rows.shape[0], 4096)]
        codes, scales, zeros = (np.concatenate(p) for p in zip(*parts))
        w = BlockWeight(codes, scales, None, 4, block, "int4s", zeros)
        for i, suffix, value in ((1, "_Q4", w.packed()), (2, "_scales", w.scales), (3, "_zero_points", w.zero_points())):
            t = inits[node.input[i]]
            if t.name != name + suffix or value.size != int(np.prod(t.dims)):
                raise ExportError(f"int4s: the quantizer's {t.name} does not have the layout expected")
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
            t.CopyFrom(numpy_helper.from_array(value.reshape(tuple(t.dims)).astype(dtype, copy=False), t.name))


def search_blocks(rows, block: int, candidates: int = 9, spread: float = 0.15):
    """4-bit codes with a scale and a zero point per block of ``block`` weights along each row of ``rows``
    (float32 [N, K]): for each block, of ``candidates`` scales from range / (15 * (1 - spread)) to
    range / (15 * (1 + spread)) (range: max(max, 0) - min(min, 0)), the one whose codes leave the smallest
    error sum over the block of (|w| + rms) * (w - scale * (code - zero))^2, the zero point rounding
    -min / scale. Returns codes uint8 [N, K], scales float32 [N, K / block], zero points uint8 [N, K / block]."""
    import numpy as np
    n, k = rows.shape
    x = rows.reshape(n, k // block, block)
    lo = np.minimum(x.min(-1, keepdims=True), 0)
    span = np.maximum(np.maximum(x.max(-1, keepdims=True), 0) - lo, np.float32(1e-30))
    weight = np.sqrt((x * x).mean(-1, keepdims=True)) + np.abs(x)
    best = None
    for stretch in np.linspace(-spread, spread, candidates, dtype=np.float32):
        scale = span / np.float32(15 * (1 + stretch))
        zero = np.clip(np.rint(-lo / scale), 0, 15)
        err = (weight * (scale * (np.clip(np.rint(x / scale) + zero, 0, 15) - zero) - x) ** 2).sum(-1, keepdims=True)
        if best is None:
            best = [err, scale, zero]
        else:
            better = err < best[0]
            best = [np.where(better, a, b) for a, b in zip((err, scale, zero), best)]
    _, scale, zero = best
    codes = np.clip(np.rint(x / scale) + zero, 0, 15).astype(np.uint8).reshape(n, k)
    return codes, scale[..., 0].astype(np.float32), zero[..., 0].astype(np.uint8)


def count_quantized(path: Path) -> dict:
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized", "MatMulInteger",
                            "DynamicQuantizeMatMul", "DequantizeLinear"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
