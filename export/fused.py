"""A fused decoder graph for Llama-style models, built from the weights.

Families: Llama, Qwen2, Mistral, Qwen3 (q/k norms), Phi-3 (packed QKV and
gate/up weights, partial rotary), Gemma 2 (scaled embeddings, norms around
attention and MLP, soft-capped attention scores and logits, alternating
sliding-window layers) and Gemma 3 text models (q/k norms, local layers with
their own rotary base).

optimum's graphs spend most of a small model's step in thousands of shape
nodes (about 3,100 for SmolLM2-135M after onnxruntime's own fusions). This
builder writes the same network with onnxruntime's fused contrib operators,
about 11 nodes per layer:

    SkipSimplifiedLayerNormalization -> MatMul(QKV, packed) [+ bias] [-> q/k norms]
    -> GroupQueryAttention (rotary inside, KV cache in place, window, soft cap)
    -> MatMul(O) -> SkipSimplifiedLayerNormalization -> MatMul(gate|up, packed) -> Split
    -> QuickGelu(alpha=1) (= SiLU) or FastGelu -> Mul -> MatMul(down)

and after the last layer the final norm and the output layer, which runs on the
last ``logits_to_keep`` positions only.

With ``blocks`` (GGUF weights in block-quantized form, export.gguf_weights),
those matrices become ``MatMulNBits`` nodes holding the file's own codes and
scales (and the embedding a ``GatherBlockQuantized``); a format with per-block
offsets adds the per-block sums of the input times the offsets (a float product
of their own, or folded into the matrix over the input joined with its block
sums). Matrices that
share an input but not a block layout (Q4_K_M mixes Q4_K and Q6_K) run as
separate nodes whose outputs are concatenated.

KV cache (``kv_cache = "static"`` in the manifest): every layer's past and
present K/V are the *same* fixed-capacity buffer [1, kv_heads, capacity,
head_dim]; the graph writes the new positions in place and reads only the
first ``total_sequence_length`` of them (``seqlens_k`` = total - 1). Rolling
back is therefore only a smaller length on the next call: no copy, no trim,
on any execution provider. Sliding-window layers keep the whole cache too and
attend to the last ``window`` positions of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortspec.errors import ExportError

from .names import KEEP_INPUT

SUPPORTED = ("llama", "qwen2", "mistral", "qwen3", "phi3", "gemma2", "gemma3_text")
GEMMA = ("gemma2", "gemma3_text")
OPSET = 17


@dataclass
class Layout:
    """How one family arranges the common decoder: weight names, norms, activation, attention options."""

    qkv: list[str]              # attention projections packed into one MatMul (names under self_attn.)
    gate_up: list[str]          # MLP gate and up projections, in that order (names under mlp.)
    activation: str             # "silu" or "gelu_tanh"
    norm_offset: float          # Gemma's norms scale by (1 + weight)
    embed_scale: float | None   # Gemma multiplies the embeddings by sqrt(hidden)
    sandwich: bool              # Gemma: norms after attention and after the MLP as well
    qk_norm: bool               # per-head RMS norms of queries and keys before rotary
    scale: float                # attention score scale
    attn_softcap: float         # 0 = none
    final_softcap: float        # 0 = none
    windows: list[int]          # per layer: attention window in positions, 0 = the whole context
    local_rotary: list[bool]    # per layer: Gemma 3's local layers use their own rotary table


def head_size(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _activation(cfg) -> str:
    return getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")


def layout(cfg) -> Layout:
    """The family layout of a supported config (see supports())."""
    kind = cfg.model_type
    layers = cfg.num_hidden_layers
    window = int(getattr(cfg, "sliding_window", None) or 0)
    types = getattr(cfg, "layer_types", None)
    if types is not None:
        windows = [window if t == "sliding_attention" else 0 for t in types]
    else:  # Mistral and Phi-3 apply their window (when set) to every layer
        windows = [window] * layers
    max_pos = int(cfg.max_position_embeddings)
    windows = [0 if w >= max_pos else w for w in windows]
    gemma = kind in GEMMA
    return Layout(
        qkv=["qkv_proj"] if kind == "phi3" else ["q_proj", "k_proj", "v_proj"],
        gate_up=["gate_up_proj"] if kind == "phi3" else ["gate_proj", "up_proj"],
        activation="gelu_tanh" if gemma else "silu",
        norm_offset=1.0 if gemma else 0.0,
        embed_scale=float(cfg.hidden_size) ** 0.5 if gemma else None,
        sandwich=gemma, qk_norm=kind in ("qwen3", "gemma3_text"),
        scale=float(cfg.query_pre_attn_scalar) ** -0.5 if gemma else float(head_size(cfg)) ** -0.5,
        attn_softcap=float(getattr(cfg, "attn_logit_softcapping", None) or 0.0) if gemma else 0.0,
        final_softcap=float(getattr(cfg, "final_logit_softcapping", None) or 0.0) if gemma else 0.0,
        windows=windows,
        local_rotary=[kind == "gemma3_text" and t == "sliding_attention" for t in types or ["full"] * layers])


def supports(model) -> str | None:
    """None when the model can be built fused, else the reason it cannot."""
    cfg = model.config
    if cfg.model_type not in SUPPORTED:
        return f"model type {cfg.model_type!r} (fused graphs cover {', '.join(SUPPORTED)})"
    act = _activation(cfg)
    if act != ("gelu_pytorch_tanh" if cfg.model_type in GEMMA else "silu"):
        return f"activation {act!r}"
    scaling = getattr(cfg, "rope_scaling", None) or {}
    if scaling.get("rope_type", scaling.get("type")) in ("dynamic", "longrope"):
        return "length-dependent rope scaling"
    if getattr(cfg, "mlp_bias", False):
        return "MLP bias"
    if getattr(cfg, "use_bidirectional_attention", False):
        return "bidirectional attention"
    types = getattr(cfg, "layer_types", None)
    if types is None and cfg.model_type in GEMMA:
        return "no layer_types in the config (transformers >= 4.56 writes them)"
    if types is not None and set(types) - {"full_attention", "sliding_attention"}:
        return f"layer types {sorted(set(types))}"
    head_dim = head_size(cfg)
    if head_dim % 16:
        return f"head size {head_dim} (onnxruntime's GroupQueryAttention needs a multiple of 16)"
    rotary = int(head_dim * float(getattr(cfg, "partial_rotary_factor", None) or 1.0))
    if rotary % 16:
        return f"rotary size {rotary} (onnxruntime's GroupQueryAttention needs a multiple of 16)"
    return None


def build_fused(model, out_dir: Path, dtype: str = "fp32", blocks: dict | None = None,
                accuracy_level: int | dict = 4, head_accuracy_level: int | None = None,
                offsets: str = "float") -> Path:
    """Write out_dir/model.onnx (+ model.onnx.data) for ``model``; returns the graph path.

    dtype "fp16" stores weights, activations, KV cache and logits in float16 (for CUDA).
    blocks: Hugging Face weight name -> gguf_weights.BlockWeight for the matrices to keep block-quantized
    (fp32 only); accuracy_level is MatMulNBits' (4: activations quantized to int8 per block of each row; 1:
    fp32), or a dict of it by the matrices' bits (4 or 8). offsets: how the per-block offsets of formats with
    minimums are added: "float" (a float MatMul over the input's block sums, exact to float rounding) or "fold"
    (gguf_weights.folded: zero points at each minimum's nearest code, the remainders rounded to the matrix's bits
    as the weights of the block sums, appended to the input: one MatMulNBits, no separate correction).
    """
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper

    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"dtype must be fp32 or fp16, got {dtype!r}")
    if blocks and dtype != "fp32":
        raise ExportError("block-quantized GGUF weights need an fp32 graph; export with --dtype fp32 or fp16 "
                          "for a float graph")
    blocks = blocks or {}
    np_dtype = np.float16 if dtype == "fp16" else np.float32
    elem = TensorProto.FLOAT16 if dtype == "fp16" else TensorProto.FLOAT
    reason = supports(model)
    if reason:
        raise ExportError(f"no fused graph for this model: {reason}; use --graph optimum")
    cfg = model.config
    hidden, n_heads, kv_heads = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = head_size(cfg)
    layers, eps = cfg.num_hidden_layers, float(cfg.rms_norm_eps)
    max_pos = int(cfg.max_position_embeddings)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}  # views, no copies
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    data = open(out_dir / "model.onnx.data", "wb")
    inits, nodes = [], []

    def init(name: str, arr: np.ndarray, raw: bool = False) -> str:
        """Write one weight straight to the data file (one tensor in memory at a time); ``raw`` keeps its
        element type (codes, scales), else it is stored in the graph's float type."""
        arr = np.ascontiguousarray(arr) if raw else np.ascontiguousarray(arr, dtype=np_dtype)
        if arr.nbytes < 1024:
            inits.append(numpy_helper.from_array(arr, name))
            return name
        data.write(b"\0" * ((-data.tell()) % 64))
        offset = data.tell()
        data.write(arr.tobytes())
        tensor = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype),
                                  dims=list(arr.shape), data_location=onnx.TensorProto.EXTERNAL)
        for key, value in (("location", "model.onnx.data"), ("offset", str(offset)), ("length", str(arr.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        inits.append(tensor)
        return name

    def node(op: str, ins: list[str], outs: list[str], domain: str = "", **attrs) -> None:
        nodes.append(helper.make_node(op, ins, outs, name=f"{outs[0] or op}_node", domain=domain, **attrs))

    def linear_t(*keys: str) -> np.ndarray:
        """HF Linear weights [out, in] -> one [in, sum(out)] MatMul weight."""
        return np.concatenate([sd[k] for k in keys], axis=0).T

    sums: dict[tuple[str, int], str] = {}
    sum_shapes: set[int] = set()

    def block_sums(x: str, block: int) -> str:
        """Per-block sums of the last axis of x ([1, S, K] -> [1, S, K / block]), made once per input."""
        if (x, block) not in sums:
            shape = f"blocksum.shape{block}"
            if block not in sum_shapes:
                sum_shapes.add(block)
                inits.append(numpy_helper.from_array(np.array([0, 0, -1, block], np.int64), shape))
            node("Reshape", [x, shape], [f"{x}.blocks{block}"])
            node("ReduceSum", [f"{x}.blocks{block}", "axis.last"], [f"{x}.sums{block}"], keepdims=0)
            sums[(x, block)] = f"{x}.sums{block}"
        return sums[(x, block)]

    joined: dict[tuple[str, int], str] = {}
    pad_shapes: set[str] = set()

    def with_sums(x: str, cols: int, block: int) -> str:
        """[x, per-block sums of x padded to whole blocks, the sums again] along the last axis, once per input
        (the layout of gguf_weights.folded with two parts)."""
        if (x, block) not in joined:
            sums = block_sums(x, block)
            count = cols // block
            pads = f"fold.pads{count}"
            if pads not in pad_shapes:
                pad_shapes.add(pads)
                inits.append(numpy_helper.from_array(
                    np.array([0, 0, 0, 0, 0, -(-count // block) * block - count], np.int64), pads))
            node("Pad", [sums, pads], [f"{sums}.padded"])
            node("Concat", [x, f"{sums}.padded", sums], [f"{x}.withsums{block}"], axis=-1)
            joined[(x, block)] = f"{x}.withsums{block}"
        return joined[(x, block)]

    def nbits(x: str, w, name: str, out: str, level: int | None = None) -> None:
        """out = x @ w.T with w block-quantized (MatMulNBits), plus the offsets' correction where w has them."""
        rows, cols = w.shape
        if w.offsets is not None and offsets == "fold":
            from .gguf_weights import folded, folded_width
            f = folded(w)
            node("MatMulNBits", [with_sums(x, cols, w.block), init(f"{name}.codes", f.packed(), raw=True),
                                 init(f"{name}.scales", f.scales.reshape(-1), raw=True),
                                 init(f"{name}.zeros", f.zero_points().reshape(-1), raw=True)],
                 [out], domain="com.microsoft", K=folded_width(cols, w.block, 2), N=rows, bits=w.bits,
                 block_size=w.block,
                 accuracy_level=level if level is not None else
                 accuracy_level[w.bits] if isinstance(accuracy_level, dict) else accuracy_level)
            return
        w = w.centered()  # per-block zero points at the codes' mean: half the activation rounding error
        ins = [x, init(f"{name}.codes", w.packed(), raw=True), init(f"{name}.scales", w.scales.reshape(-1), raw=True)]
        zp = w.zero_points()
        if zp is not None:
            ins.append(init(f"{name}.zeros", zp.reshape(-1), raw=True))
        target = out if w.offsets is None else f"{out}.main"
        node("MatMulNBits", ins, [target], domain="com.microsoft", K=cols, N=rows, bits=w.bits,
             block_size=w.block, accuracy_level=level if level is not None else
             accuracy_level[w.bits] if isinstance(accuracy_level, dict) else accuracy_level)
        if w.offsets is not None:
            node("MatMul", [block_sums(x, w.block), init(f"{name}.offsets", w.offsets.T, raw=True)], [f"{out}.corr"])
            node("Add", [target, f"{out}.corr"], [out])

    def linear(x: str, keys: list[str], name: str, out: str, level: int | None = None) -> None:
        """out = x @ [W_k for k in keys].T: one MatMul of float weights, or block-quantized nodes."""
        if not all(k in blocks for k in keys):
            node("MatMul", [x, init(f"{name}.weight", linear_t(*keys))], [out])
            return
        from .gguf_weights import concat_rows, layout_key
        groups: list[list[str]] = []
        for k in keys:  # runs of one block layout are stacked into one node
            if groups and layout_key(blocks[groups[-1][-1]]) == layout_key(blocks[k]):
                groups[-1].append(k)
            else:
                groups.append([k])
        if len(groups) == 1:
            nbits(x, concat_rows([blocks[k] for k in keys]), name, out, level)
            return
        parts = [f"{out}.part{j}" for j in range(len(groups))]
        for j, group in enumerate(groups):
            nbits(x, concat_rows([blocks[k] for k in group]), f"{name}.part{j}", parts[j], level)
        node("Concat", parts, [out], axis=-1)

    fam = layout(cfg)

    def norm_weight(key: str) -> np.ndarray:
        return sd[key] + np.float32(fam.norm_offset) if fam.norm_offset else sd[key]

    def rms(x: str, key: str, out: str) -> None:
        node("SimplifiedLayerNormalization", [x, init(out + ".w", norm_weight(key))], [out], axis=-1, epsilon=eps)

    def skip_rms(x: str, resid: str, key: str, out: str, summed: str) -> None:
        node("SkipSimplifiedLayerNormalization", [x, resid, init(out + ".w", norm_weight(key))],
             [out, "", "", summed], domain="com.microsoft", epsilon=eps)

    # Rotary tables exactly as the model computes them (any static rope scaling included); Gemma 3's local
    # layers have a table of their own. A partial rotary (Phi-3's partial_rotary_factor) gives narrower tables.
    tables = {}
    with torch.no_grad():
        pos = torch.arange(max_pos)[None]
        for kind, module in (("global", model.model.rotary_emb), ("local", getattr(model.model, "rotary_emb_local", None))):
            if module is None or (kind == "local" and not any(fam.local_rotary)):
                continue
            cos, sin = module(torch.zeros(1, dtype=torch.float32), pos)
            half = cos.shape[-1] // 2
            tables[kind] = (init(f"rotary.{kind}.cos", cos[0, :, :half].numpy()),
                            init(f"rotary.{kind}.sin", sin[0, :, :half].numpy()))

    inter = int(cfg.intermediate_size)
    inits.append(numpy_helper.from_array(np.array([inter, inter], dtype=np.int64), "mlp.split"))
    if any(w.offsets is not None for w in blocks.values()) or fam.qk_norm:
        inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "axis.last"))
    if fam.qk_norm:
        inits.append(numpy_helper.from_array(np.array([n_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim],
                                                      dtype=np.int64), "qkv.split"))
        inits.append(numpy_helper.from_array(np.array([0, 0, -1, head_dim], dtype=np.int64), "heads.shape"))
        inits.append(numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), "flat.shape"))
    split_sizes = "mlp.split"
    emb = blocks.get("model.embed_tokens.weight")
    embeds = "embeds" if fam.embed_scale is None else "embeds.raw"
    if emb is None:
        node("Gather", [init("embed.weight", sd["model.embed_tokens.weight"]), "input_ids"], [embeds])
    else:  # the file's codes, gathered and dequantized per row
        vocab_rows = emb.shape[0]
        ins = ["embed.codes", "input_ids", "embed.scales"]
        init("embed.codes", emb.packed().reshape(vocab_rows, -1), raw=True)
        init("embed.scales", emb.scales, raw=True)
        if emb.offsets is not None:
            ins.append(init("embed.zeros", emb.zero_points(), raw=True))
        gathered = embeds if emb.offsets is None else "embeds.main"
        node("GatherBlockQuantized", ins, [gathered], domain="com.microsoft", gather_axis=0, quantize_axis=1,
             block_size=emb.block, bits=emb.bits)
        if emb.offsets is not None:
            inits.append(numpy_helper.from_array(np.array([0, 0, -1, emb.block], np.int64), "embed.blocked"))
            inits.append(numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "embed.flat"))
            node("Gather", [init("embed.offsets", emb.offsets, raw=True), "input_ids"], ["embeds.off"])
            node("Unsqueeze", ["embeds.off", "axis.last"], ["embeds.off1"])
            node("Reshape", [gathered, "embed.blocked"], ["embeds.blocks"])
            node("Add", ["embeds.blocks", "embeds.off1"], ["embeds.sum"])
            node("Reshape", ["embeds.sum", "embed.flat"], [embeds])
    if fam.embed_scale is not None:  # Gemma: embeddings times sqrt(hidden), rounded to the graph's type first
        node("Mul", [embeds, init("embed.scale", np.array(fam.embed_scale, dtype=np.float32))], ["embeds"])

    def head_norm(x: str, key: str, out: str) -> None:
        """Per-head RMS norm of a [1, S, heads * head_dim] projection."""
        node("Reshape", [x, "heads.shape"], [out + ".heads"])
        rms(out + ".heads", key, out + ".normed")
        node("Reshape", [out + ".normed", "flat.shape"], [out])

    resid, out = "embeds", None
    for i in range(layers):
        p = f"model.layers.{i}."
        if out is None:
            rms(resid, p + "input_layernorm.weight", f"l{i}.h")
        else:
            skip_rms(out, resid, p + "input_layernorm.weight", f"l{i}.h", f"l{i}.res")
            resid = f"l{i}.res"
        linear(f"l{i}.h", [p + f"self_attn.{x}.weight" for x in fam.qkv], f"l{i}.qkv", f"l{i}.qkv")
        qkv = f"l{i}.qkv"
        if p + f"self_attn.{fam.qkv[0]}.bias" in sd:
            bias = np.concatenate([sd[p + f"self_attn.{x}.bias"] for x in fam.qkv])
            node("Add", [qkv, init(f"l{i}.qkv.bias", bias)], [f"l{i}.qkvb"])
            qkv = f"l{i}.qkvb"
        attn_in = [qkv, "", ""]
        if fam.qk_norm:
            node("Split", [qkv, "qkv.split"], [f"l{i}.q", f"l{i}.k", f"l{i}.v"], axis=-1)
            head_norm(f"l{i}.q", p + "self_attn.q_norm.weight", f"l{i}.qn")
            head_norm(f"l{i}.k", p + "self_attn.k_norm.weight", f"l{i}.kn")
            attn_in = [f"l{i}.qn", f"l{i}.kn", f"l{i}.v"]
        cos_name, sin_name = tables["local" if fam.local_rotary[i] else "global"]
        extra = {"softcap": fam.attn_softcap} if fam.attn_softcap else {}
        node("GroupQueryAttention",
             attn_in + [f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
                        "total_sequence_length", cos_name, sin_name],
             [f"l{i}.attn", f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
             num_heads=n_heads, kv_num_heads=kv_heads, do_rotary=1, rotary_interleaved=0,
             scale=fam.scale, local_window_size=fam.windows[i] or -1, **extra)
        linear(f"l{i}.attn", [p + "self_attn.o_proj.weight"], f"l{i}.o", f"l{i}.o")
        o = f"l{i}.o"
        if p + "self_attn.o_proj.bias" in sd:
            node("Add", [o, init(f"l{i}.o.bias", sd[p + "self_attn.o_proj.bias"])], [f"l{i}.ob"])
            o = f"l{i}.ob"
        if fam.sandwich:  # Gemma: the attention output is normed before the residual add, the MLP input after
            rms(o, p + "post_attention_layernorm.weight", f"l{i}.on")
            skip_rms(f"l{i}.on", resid, p + "pre_feedforward_layernorm.weight", f"l{i}.h2", f"l{i}.res2")
        else:
            skip_rms(o, resid, p + "post_attention_layernorm.weight", f"l{i}.h2", f"l{i}.res2")
        resid = f"l{i}.res2"
        # gate and up share their input: one packed MatMul (one kernel launch fewer per layer), then Split
        linear(f"l{i}.h2", [p + f"mlp.{x}.weight" for x in fam.gate_up], f"l{i}.gate_up", f"l{i}.gu_in")
        node("Split", [f"l{i}.gu_in", split_sizes], [f"l{i}.g", f"l{i}.u"], axis=-1)
        if fam.activation == "silu":
            node("QuickGelu", [f"l{i}.g"], [f"l{i}.act"], domain="com.microsoft", alpha=1.0)  # x*sigmoid(x)
        else:  # the tanh approximation of GELU
            node("FastGelu", [f"l{i}.g"], [f"l{i}.act"], domain="com.microsoft")
        node("Mul", [f"l{i}.act", f"l{i}.u"], [f"l{i}.gu"])
        linear(f"l{i}.gu", [p + "mlp.down_proj.weight"], f"l{i}.down", f"l{i}.d")
        out = f"l{i}.d"
        if fam.sandwich:
            rms(out, p + "post_feedforward_layernorm.weight", f"l{i}.dn")
            out = f"l{i}.dn"
    skip_rms(out, resid, "model.norm.weight", "final", "")
    # the output layer sees the last logits_to_keep positions only
    inits.append(numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), "keep_rows/end"))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "keep_rows/axis"))
    node("Neg", [KEEP_INPUT], ["keep_rows/start"])
    node("Slice", ["final", "keep_rows/start", "keep_rows/end", "keep_rows/axis"], ["keep_rows/hidden"])
    head_key = "lm_head.weight" if "lm_head.weight" in sd else "model.embed_tokens.weight"
    logits = "logits" if not fam.final_softcap else "logits.raw"
    if head_key in blocks:
        linear("keep_rows/hidden", [head_key], "lm_head", logits, head_accuracy_level)
    else:
        node("MatMul", ["keep_rows/hidden", init("lm_head.weight", sd[head_key].T)], [logits])
    if fam.final_softcap:  # Gemma 2: logits = cap * tanh(logits / cap)
        cap = init("logits.cap", np.array(fam.final_softcap, dtype=np.float32))
        node("Div", [logits, cap], ["logits.div"])
        node("Tanh", ["logits.div"], ["logits.tanh"])
        node("Mul", ["logits.tanh", cap], ["logits"])

    vocab = sd[head_key].shape[0]
    kv_shape = [1, kv_heads, "max_sequence_length", head_dim]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "sequence_length"]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
              helper.make_tensor_value_info(KEEP_INPUT, TensorProto.INT64, [1])]
    outputs = [helper.make_tensor_value_info("logits", elem, [1, "sequence_length", vocab])]
    for i in range(layers):
        for kv in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kv}", elem, kv_shape))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kv}", elem, kv_shape))
    graph = helper.make_graph(nodes, "ortspec_fused_decoder", inputs, outputs, inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                         helper.make_opsetid("com.microsoft", 1)])
    onnx_model.ir_version = 8
    data.close()
    onnx.save_model(onnx_model, str(path))
    return path
