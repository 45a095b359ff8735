"""GGUF quantized weights as onnxruntime's block-quantized operators hold them, without a second rounding.

Each GGUF block type becomes codes, one float32 scale per block and, where the
format has per-block minimums, a float32 offset per block:

    weight = scale * (code - zero) + offset

which is exactly the formula llama.cpp (and gguf-py) dequantize with, so every
weight in the graph equals the file's dequantized weight. ``MatMulNBits`` and
``GatherBlockQuantized`` store the codes (4 bits where the format has 4, else
8) and the scales; an offset becomes a small correction in the graph
(per-block sums of the activations times the offsets), because fractional zero
points run on onnxruntime's slow path.

    type   codes      block  zero   offset         source formula
    Q4_0   4-bit q    32     8      -              d * (q - 8)
    Q4_1   4-bit q    32     0      m              d * q + m
    Q5_0   8-bit q+112 32    128    -              d * (q - 16)
    Q5_1   8-bit q    32     0      m              d * q + m
    Q8_0   8-bit q+128 32    128    -              d * q           (q signed)
    Q4_K   4-bit q    32     0      -dmin*m_j      d*sc_j * q - dmin*m_j
    Q5_K   8-bit q    32     0      -dmin*m_j      d*sc_j * q - dmin*m_j
    Q6_K   8-bit q+96 16     128    -              d*sc_j * (q - 32)

F32/F16/BF16 tensors (and block types not listed) stay float. That is the
``exact`` layout: in its graph, a type with offsets gets per-block zero points at
the mean of each block's codes (``BlockWeight.centered``, the offset absorbing
scale * zero): the same weights to float rounding, and half the error of
int8-rounded activations.

The ``compact`` layout (the default) reads ~12% fewer bytes a pass and runs fewer
operators: the 5- and 6-bit types are re-rounded to 8-bit codes in blocks of 128
(``requantize8``: onnxruntime's faster 8-bit kernel, scales on 1/128 of the
weights instead of 1/16), and the minimums of the 4-bit types are ``folded`` into
their matrix as the weights of the input's block sums instead of a float product
of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# type name -> (bits of the stored code, block size, bytes per block of the GGUF encoding, weights per block)
LAYOUT = {
    "Q4_0": (4, 32, 18, 32), "Q4_1": (4, 32, 20, 32), "Q5_0": (8, 32, 22, 32), "Q5_1": (8, 32, 24, 32),
    "Q8_0": (8, 32, 34, 32), "Q4_K": (4, 32, 144, 256), "Q5_K": (8, 32, 176, 256), "Q6_K": (8, 16, 210, 256),
}
SUPPORTED = tuple(LAYOUT)


@dataclass
class BlockWeight:
    """A [rows, cols] matrix (rows = output features, blocks run along cols) in block-quantized form."""

    codes: np.ndarray            # uint8 [rows, cols], one code per weight (0 .. 2**bits - 1)
    scales: np.ndarray           # float32 [rows, cols // block]
    offsets: np.ndarray | None   # float32 [rows, cols // block], or None
    bits: int                    # 4 or 8
    block: int
    qtype: str
    zeros: np.ndarray | None = None  # uint8 [rows, cols // block] per-block zero points (``centered``), or None

    @property
    def zero(self) -> int | np.ndarray:
        """The zero point: per block after ``centered``; else 0 where the format has offsets, or the operators'
        default (2**(bits-1))."""
        if self.zeros is not None:
            return self.zeros
        return 0 if self.offsets is not None else 1 << (self.bits - 1)

    def centered(self) -> "BlockWeight":
        """The same weights with each block's zero point at the mean of its codes, the offset taking up the
        difference: scale * (code - z) + (offset + scale * z), equal to float rounding of the offsets.

        MatMulNBits at accuracy level 4 rounds the activations to int8 per block; the product's error is
        sum_i scale * (code_i - zero) * error_i, so codes far from their zero point (0 .. 15 against zero 0)
        carry about twice the error of centered ones. Types without offsets are centered already."""
        if self.offsets is None or self.zeros is not None:
            return self
        rows, cols = self.codes.shape
        mean = self.codes.reshape(rows, cols // self.block, self.block).mean(axis=-1)
        zeros = np.clip(np.rint(mean), 0, (1 << self.bits) - 1).astype(np.uint8)
        offsets = (self.offsets.astype(np.float64) + self.scales.astype(np.float64) * zeros).astype(np.float32)
        return BlockWeight(self.codes, self.scales, offsets, self.bits, self.block, self.qtype, zeros)

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols], computed as llama.cpp computes it."""
        rows, cols = self.codes.shape
        zero = self.zeros[..., None] if self.zeros is not None else np.float32(self.zero)
        q = self.codes.reshape(rows, -1, self.block).astype(np.float32) - zero
        w = self.scales[..., None] * q
        if self.offsets is not None:
            w = w + self.offsets[..., None]
        return w.reshape(rows, cols)

    def take_rows(self, index: np.ndarray) -> "BlockWeight":
        return BlockWeight(self.codes[index], self.scales[index],
                           None if self.offsets is None else self.offsets[index], self.bits, self.block, self.qtype,
                           None if self.zeros is None else self.zeros[index])

    def packed(self) -> np.ndarray:
        """Codes as MatMulNBits/GatherBlockQuantized take them: uint8 [rows, blocks, block * bits / 8], two 4-bit
        codes per byte (the even one in the low nibble)."""
        rows, cols = self.codes.shape
        codes = self.codes.reshape(rows, cols // self.block, self.block)
        if self.bits == 8:
            return np.ascontiguousarray(codes)
        return _pack_pairs(codes)

    def zero_points(self) -> np.ndarray | None:
        """Explicit zero points as the operators take them (two 4-bit ones per byte, the even block's in the low
        nibble): per block after ``centered``, else 0 where the format has offsets; None means the default."""
        if self.offsets is None and self.zeros is None:
            return None
        rows, blocks = self.scales.shape
        zeros = self.zeros if self.zeros is not None else np.zeros((rows, blocks), np.uint8)
        return np.ascontiguousarray(zeros) if self.bits == 8 else _pack_pairs(zeros)


def requantize8(w: BlockWeight, block: int) -> BlockWeight:
    """``w``'s weights (exactly as the file dequantizes them) rounded to 8-bit codes in blocks of ``block``
    (``round_codes``).

    Lossy, and slightly: the file's 6-bit (Q6_K) or 5-bit codes sit on grids four to eight times coarser, so each
    weight moves by at most half a step of the new grid (Qwen2.5-Coder-1.5B's Q6_K tensors: 0.002-0.004% of the
    weights' energy at blocks of 32-128). Longer blocks cut the scales a pass reads (10 bits per weight at
    Q6_K's blocks of 16, 8.25 at 128) and run onnxruntime's faster 8-bit kernels."""
    codes, scales, zeros = round_codes(w.dequantize(), block, 8)
    return BlockWeight(codes, scales, None, 8, block, f"{w.qtype}~8:{block}", zeros)


def round_codes(x: np.ndarray, block: int, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float [rows, cols] -> codes uint8 [rows, cols], scales float32 and zero points uint8 [rows, cols / block]:
    per block a grid of 2**bits - 1 steps across its range (0 included), each value rounded to the nearest
    point."""
    rows, cols = x.shape
    if cols % block:
        raise ValueError(f"a matrix of {cols} columns has no whole blocks of {block}")
    top = (1 << bits) - 1
    v = x.reshape(rows, cols // block, block).astype(np.float64)
    lo = np.minimum(v.min(-1, keepdims=True), 0.0)
    hi = np.maximum(v.max(-1, keepdims=True), 0.0)
    scale = np.where(hi > lo, (hi - lo) / top, 1.0).astype(np.float32).astype(np.float64)
    zeros = np.clip(np.rint(-lo / scale), 0, top)
    codes = np.clip(np.rint(v / scale) + zeros, 0, top).astype(np.uint8)
    return (np.ascontiguousarray(codes.reshape(rows, cols)), scale[..., 0].astype(np.float32),
            zeros[..., 0].astype(np.uint8))


def folded(w: BlockWeight, parts: int = 2) -> BlockWeight:
    """A format with per-block minimums (Q4_1, Q4_K, Q5_1, Q5_K) as one matrix over the input and its block sums
    (``[x, sums, ...] @ folded.T = x @ W.T``, the sums repeated ``parts`` times, each copy but the last padded
    with zeros to a whole number of blocks): each block's zero point is its minimum's nearest whole code,
    ``z = rint(-offset / scale)``, and what remains, ``r = offset + scale * z`` (at most half a step unless
    clipped), is the block sums' weight, rounded to the matrix's own bits in blocks of its own size
    (``round_codes``) — with two parts, the second holds what the first's rounding left (a 4-bit pair: about an
    8-bit grid). The product then runs as a single ``MatMulNBits`` over K + (parts - 1) * padded + K / block
    inputs, with no separate correction."""
    rows, cols = w.shape
    top = (1 << w.bits) - 1
    with np.errstate(divide="ignore", invalid="ignore"):  # (a block of scale 0 keeps zero point 0)
        zeros = np.clip(np.nan_to_num(np.rint(-w.offsets / w.scales)), 0, top).astype(np.uint8)
    rest = w.offsets.astype(np.float64) + w.scales.astype(np.float64) * zeros
    count = rest.shape[1]
    codes, scales, zero_points = [w.codes], [w.scales], [zeros]
    for _ in range(parts):
        padded = np.zeros((rows, -(-count // w.block) * w.block), np.float32)
        padded[:, :count] = rest
        c, sc, z = round_codes(padded, w.block, w.bits)
        codes.append(c), scales.append(sc), zero_points.append(z)
        got = (c.reshape(rows, -1, w.block).astype(np.float64) - z[..., None]) * sc[..., None].astype(np.float64)
        rest = rest - got.reshape(rows, -1)[:, :count]
    return BlockWeight(np.concatenate(codes, axis=1), np.concatenate(scales, axis=1), None, w.bits, w.block,
                       f"{w.qtype}+sums", np.concatenate(zero_points, axis=1))


def folded_width(cols: int, block: int, parts: int) -> int:
    """K of ``folded``'s product: the input, ``parts - 1`` padded copies of its block sums and one unpadded."""
    count = cols // block
    return cols + (parts - 1) * (-(-count // block) * block) + count


def compact(blocks: dict, block8: int = 128) -> dict:
    """The ``compact`` layout of a file's matrices: 5- and 6-bit ones (Q5_x, Q6_K) re-rounded to 8-bit codes in
    blocks of ``block8`` (``requantize8``; of the largest power of two up to it that divides a matrix's width),
    4-bit ones (Q4_0, Q4_1, Q4_K), Q8_0 and the token embedding (a gather reads one row of it) as the file has
    them (the 4-bit ones' minimums then ``folded`` into the product by the graph)."""
    out = {}
    for name, w in blocks.items():
        block = block8
        while block > w.block and w.shape[1] % block:
            block //= 2
        # (Q8_0's codes are 8-bit already: another 8-bit grid would add about its own rounding again)
        keep = w.bits != 8 or w.qtype == "Q8_0" or block <= w.block or name == "model.embed_tokens.weight"
        out[name] = w if keep else requantize8(w, block)
    return out


def _pack_pairs(values: np.ndarray) -> np.ndarray:
    """4-bit values, two per byte along the last axis (the even one in the low nibble; an odd count padded)."""
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros((*values.shape[:-1], 1), values.dtype)], axis=-1)
    return np.ascontiguousarray(values[..., 0::2] | (values[..., 1::2] << np.uint8(4)))


def concat_rows(parts: list[BlockWeight]) -> BlockWeight:
    """Stack matrices with the same layout along their rows (packed QKV, gate|up)."""
    first = parts[0]
    if any((p.bits, p.block, p.offsets is None, p.codes.shape[1]) !=
           (first.bits, first.block, first.offsets is None, first.codes.shape[1]) for p in parts):
        raise ValueError("only matrices of one block layout can be stacked")
    if any((p.zeros is None) != (first.zeros is None) for p in parts):
        raise ValueError("stack matrices before centering them")
    offsets = None if first.offsets is None else np.concatenate([p.offsets for p in parts])
    zeros = None if first.zeros is None else np.concatenate([p.zeros for p in parts])
    return BlockWeight(np.concatenate([p.codes for p in parts]), np.concatenate([p.scales for p in parts]),
                       offsets, first.bits, first.block, "+".join(sorted({p.qtype for p in parts})), zeros)


def layout_key(w: BlockWeight) -> tuple:
    return (w.bits, w.block, w.offsets is not None)


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """float32 of the little-endian half at byte ``at`` of each block."""
    return np.ascontiguousarray(raw[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[.., 16] bytes -> [.., 32] codes: low nibbles are weights 0..15, high nibbles 16..31 (Q4_0/Q4_1/Q5_x)."""
    return np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=-1)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of Q4_K/Q5_K -> (sc, m), each [.., 8] 6-bit values."""
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=-1)
    return sc.astype(np.float32), m.astype(np.float32)


def _k_low(qs: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K: 128 bytes -> [.., 8, 32] low 4 bits; chunk c holds sub-block 2c (low) and 2c+1 (high)."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 32)
    return np.stack([chunks & np.uint8(15), chunks >> np.uint8(4)], axis=-2).reshape(*qs.shape[:-1], 8, 32)


def decode(qtype: str, raw: np.ndarray, cols: int) -> BlockWeight:
    """A GGUF tensor's bytes (uint8 [rows, bytes per row]) of type ``qtype`` -> BlockWeight [rows, cols]."""
    if qtype not in LAYOUT:
        raise ValueError(f"GGUF type {qtype} has no block-quantized form here")
    bits, block, nbytes, per = LAYOUT[qtype]
    rows = raw.shape[0]
    if cols % per or raw.size != rows * cols // per * nbytes:
        raise ValueError(f"{qtype} tensor of {cols} columns has {raw.size} bytes for {rows} rows")
    b = raw.reshape(rows, cols // per, nbytes)
    offsets = None
    if qtype in ("Q4_0", "Q4_1"):
        at = 2 if qtype == "Q4_0" else 4
        codes, scales = _nibbles(b[..., at:at + 16]), _f16(b, 0)
        if qtype == "Q4_1":
            offsets = _f16(b, 2)
    elif qtype in ("Q5_0", "Q5_1"):
        at = 2 if qtype == "Q5_0" else 4
        qh = np.ascontiguousarray(b[..., at:at + 4]).view("<u4")
        high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = _nibbles(b[..., at + 4:at + 20]) | (high << np.uint8(4))
        scales = _f16(b, 0)
        if qtype == "Q5_0":
            codes = q + np.uint8(112)          # d * (q - 16) = d * ((q + 112) - 128)
        else:
            codes, offsets = q, _f16(b, 2)
    elif qtype == "Q8_0":
        codes, scales = b[..., 2:34] ^ np.uint8(0x80), _f16(b, 0)   # signed q + 128
    elif qtype in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b, 0)[..., None], _f16(b, 2)[..., None]
        sc, m = _k_scales(b[..., 4:16])
        if qtype == "Q4_K":
            q = _k_low(b[..., 16:144])
        else:
            high = (b[..., 16:48][..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & np.uint8(1)
            q = _k_low(b[..., 48:176]) | (high << np.uint8(4))
        codes, scales, offsets = q, d * sc, -(dmin * m)
    else:  # Q6_K
        ql, qh = b[..., 0:128], b[..., 128:192]
        sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
        halves = []
        for h in range(2):
            low = ql[..., 64 * h:64 * h + 64].reshape(rows, -1, 2, 32)          # [.., k & 1, i]
            low = np.stack([low & np.uint8(15), low >> np.uint8(4)], axis=-3)  # [.., k >> 1, k & 1, i]
            high = (qh[..., 32 * h:32 * h + 32][..., None, :] >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3
            halves.append(low.reshape(rows, -1, 4, 32) | (high << np.uint8(4)))
        q = np.concatenate(halves, axis=-2)
        codes, scales = q + np.uint8(96), _f16(b, 208)[..., None] * sc      # (q - 32) = (q + 96) - 128
    return BlockWeight(np.ascontiguousarray(codes.reshape(rows, cols)),
                       np.ascontiguousarray(scales.reshape(rows, cols // block), dtype=np.float32),
                       None if offsets is None else
                       np.ascontiguousarray(offsets.reshape(rows, cols // block), dtype=np.float32),
                       bits, block, qtype)


# GGUF tensor names -> Hugging Face parameter names (Llama-family layout)
_LAYER = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in _LAYER:
        return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.weight"
    return None


def rotary_row_order(rows: int, heads: int) -> np.ndarray:
    """Row order that turns llama.cpp's Q/K layout (rotary pairs adjacent) into Hugging Face's (halves)."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def read_block_weights(path, state_dict: dict, config, progress=None) -> tuple[dict, dict]:
    """The quantized matrices of GGUF file ``path`` as BlockWeights keyed by Hugging Face name, each checked
    against ``state_dict`` (the model transformers dequantized from the same file): equal weights, after
    undoing llama.cpp's Q/K row order where the model uses it. Returns (weights, {qtype: count})."""
    from gguf import GGUFReader
    from ortspec.errors import ExportError

    reader = GGUFReader(str(path))
    out, counts = {}, {}
    heads = {"q_proj": config.num_attention_heads,
             "k_proj": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
    for t in reader.tensors:
        name, qtype = hf_name(t.name), t.tensor_type.name
        if name is None or qtype not in LAYOUT or (name not in state_dict and name != "lm_head.weight"):
            continue
        cols = int(t.shape[0])  # GGUF lists the innermost (input) dimension first
        raw = np.asarray(t.data).reshape(int(np.prod(t.shape[1:])), -1)
        w = decode(qtype, raw, cols)
        ref = state_dict.get(name)
        if ref is None:
            ref = state_dict.get("model.embed_tokens.weight")  # tied output layer
        ref = np.asarray(ref, dtype=np.float32)
        if ref.shape != w.shape:
            raise ExportError(f"GGUF tensor {t.name} is {w.shape}, the model's {name} is {ref.shape}")
        got = w.dequantize()
        if not np.array_equal(got, ref):
            kind = name.split(".")[-2]
            if kind in heads:
                order = rotary_row_order(w.shape[0], heads[kind])
                if np.array_equal(got[order], ref):
                    w = w.take_rows(order)
                    got = None
            if got is not None:
                err = float(np.max(np.abs(got - ref)))
                raise ExportError(f"GGUF tensor {t.name} ({qtype}) does not decode to the model's {name} "
                                  f"(max difference {err:.3g}); this file's layout is not supported, export "
                                  "with --dtype fp32")
        out[name] = w
        counts[qtype] = counts.get(qtype, 0) + 1
        if progress:
            progress(len(out))
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    if head not in out and embed in out and head in state_dict and \
            np.array_equal(np.asarray(state_dict[head]), np.asarray(state_dict[embed])):
        out[head] = out[embed]  # a tied output layer: the embedding's codes
    return out, counts
