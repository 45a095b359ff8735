"""ONNX graphs: optimum export with past KV, one external-data file, graph facts."""
from __future__ import annotations

import os
from pathlib import Path
import re
import tempfile
import warnings

from ortspec.errors import ExportError

from .fused import build_fused, supports
from .names import DATA_SUFFIX, KEEP_INPUT, LOGITS_NORM, NORM_BLOCK, TOP_LOGITS

_KV_IN = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_KV_OUT = re.compile(r"^present\.(\d+)\.(key|value)$")


GRAPHS = ("auto", "fused", "optimum")


def choose_graph(model, graph: str) -> str:
    """Resolve "auto": the fused builder where it supports the model, else optimum."""
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {', '.join(GRAPHS)}, got {graph!r}")
    if graph == "auto":
        return "optimum" if supports(model) else "fused"
    return graph


def export_model(model, out_dir: Path, graph: str = "auto", dtype: str = "fp32") -> Path:
    """Write out_dir/model.onnx + model.onnx.data: the fused graph, or optimum's export consolidated."""
    if choose_graph(model, graph) == "fused":
        return build_fused(model, out_dir, dtype)
    if dtype != "fp32":
        raise ExportError("fp16 bundles need the fused graph (Llama, Qwen2/3, Mistral, Phi-3, Gemma 2/3); "
                          "export this model as fp32")
    from optimum.exporters.onnx import onnx_export_from_model

    if getattr(model.config, "attn_logit_softcapping", None):
        # PyTorch's sdpa attention has no soft cap and drops it silently (Gemma 2); trace the eager one
        model.set_attn_implementation("eager")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=".optimum-") as raw:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer chatter about Python control flow
                onnx_export_from_model(model, raw, task="text-generation-with-past", do_validation=False,
                                       no_post_process=True)
        except Exception as exc:
            raise ExportError(f"optimum could not export {type(model).__name__}: {exc}") from None
        src = Path(raw) / "model.onnx"
        if not src.is_file():
            raise ExportError(f"optimum produced no model.onnx for {type(model).__name__}")
        keep_logits_rows(src)
        return consolidate(src, out_dir / "model.onnx")


def output_layer(graph):
    """The node computing the logits before any element-wise steps after it (Gemma 2's soft cap: Div, Tanh,
    Mul), i.e. the output layer's MatMul (or MatMulNBits); None when the chain is not that simple."""
    producers = {out: n for n in graph.node for out in n.output}
    constants = {t.name for t in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"}
    producer = producers.get("logits")
    while producer is not None and producer.op_type in ("Div", "Mul", "Tanh", "Add", "Sub", "Cast"):
        varying = [x for x in producer.input if x not in constants]
        producer = producers.get(varying[0]) if len(varying) == 1 else None
    return producer


def keep_logits_rows(path: Path) -> None:
    """Give the graph at ``path`` an input ``logits_to_keep`` (int64 [1]): the output layer runs on the last
    that many positions only, so a prompt's other positions cost their K/V and nothing more.

    The logits must come from one MatMul (the lm_head); a Slice on its activation input is inserted. A
    value larger than the pass keeps every row. Weights are not touched (external data stays where it is).
    """
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if any(i.name == KEEP_INPUT for i in graph.input):
        return
    producer = output_layer(graph)
    if producer is None or producer.op_type != "MatMul":
        raise ExportError(f"{path}: its logits do not come from one MatMul, so the output layer cannot be limited "
                          "to the positions the runtime uses; export with --graph fused or report the model")
    tag = "keep_rows"
    graph.initializer.extend([numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), f"{tag}/end"),
                              numpy_helper.from_array(np.array([1], np.int64), f"{tag}/axis")])
    rows = helper.make_node("Neg", [KEEP_INPUT], [f"{tag}/start"], name=f"{tag}/neg")
    cut = helper.make_node("Slice", [producer.input[0], f"{tag}/start", f"{tag}/end", f"{tag}/axis"],
                           [f"{tag}/hidden"], name=f"{tag}/slice")
    producer.input[0] = f"{tag}/hidden"
    at = list(graph.node).index(producer)
    graph.node.insert(at, cut)
    graph.node.insert(at, rows)
    graph.input.append(helper.make_tensor_value_info(KEEP_INPUT, TensorProto.INT64, [1]))
    tmp = path.with_name(path.name + ".keep")
    onnx.save(model, str(tmp))
    os.replace(tmp, path)


def add_top_outputs(path: Path, dst: Path | None = None, norm: bool = False) -> bool:
    """Give the graph at ``path`` the TOP_LOGITS input and outputs: ``TopK(logits, logits_top_k)`` along the
    vocabulary, values cast to float32. A decoding round then reads each row's few largest entries straight
    from the pass (the sampling rules need no more with top-k or greedy) instead of searching the whole row on
    the host, and on a GPU the full rows never leave the device. With ``norm`` (target graphs) also the
    LOGITS_NORM input and output: each row's sum_i exp((logit_i - max) * scale), from which verification
    without top-k settles most drafts without exponentiating the row on the host (``LazyRow``). Weights are not
    touched (they stay in the external-data file beside it). Written in place, or to ``dst`` in the same
    directory; False when the graph has them already (nothing written)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    names = {i.name for i in graph.input}
    has_top, has_norm = TOP_LOGITS["k"] in names, LOGITS_NORM["scale"] in names
    if has_top and (has_norm or not norm):
        return False
    logits = next((o for o in graph.output if o.name == "logits"), None)
    if logits is None:
        raise ExportError(f"{path} has no logits output")
    elem = logits.type.tensor_type.elem_type
    if not has_top:
        raw = TOP_LOGITS["values"] if elem == TensorProto.FLOAT else "top/values.raw"
        graph.node.append(helper.make_node("TopK", ["logits", TOP_LOGITS["k"]], [raw, TOP_LOGITS["ids"]],
                                           name="top/topk", axis=-1, largest=1, sorted=1))
        if raw != TOP_LOGITS["values"]:
            graph.node.append(helper.make_node("Cast", [raw], [TOP_LOGITS["values"]], name="top/cast",
                                               to=TensorProto.FLOAT))
        graph.input.append(helper.make_tensor_value_info(TOP_LOGITS["k"], TensorProto.INT64, [1]))
        rows = [1, "sequence_length", "top_k"]
        graph.output.append(helper.make_tensor_value_info(TOP_LOGITS["values"], TensorProto.FLOAT, rows))
        graph.output.append(helper.make_tensor_value_info(TOP_LOGITS["ids"], TensorProto.INT64, rows))
    if norm and not has_norm:
        width = logits.type.tensor_type.shape.dim[-1].dim_value
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        graph.node.extend(_norm_nodes(elem, width, opset))
        graph.input.append(helper.make_tensor_value_info(LOGITS_NORM["scale"], TensorProto.FLOAT, [1]))
        graph.output.append(helper.make_tensor_value_info(LOGITS_NORM["norm"], TensorProto.FLOAT,
                                                          [1, "sequence_length"]))
    dst = path if dst is None else dst
    tmp = dst.with_name(dst.name + ".top")
    onnx.save(model, str(tmp))
    os.replace(tmp, dst)
    return True


def _norm_nodes(elem: int, width: int, opset: int) -> list:
    """Nodes computing LOGITS_NORM["norm"] [1, rows] from the logits and the TopK's values (their first is the
    row's largest logit): exp((logits - max) * scale), summed over NORM_BLOCK entries, then over the blocks."""
    from onnx import TensorProto, helper

    def const(name: str, values: list[int]):
        return helper.make_node("Constant", [], [name], name=name,
                                value=helper.make_tensor(name, TensorProto.INT64, [len(values)], values))

    def reduce_sum(x: str, axis: int, out: str):  # (every node's name starts with norm/)
        name = out if out.startswith("norm/") else "norm/sum"
        if opset >= 13:
            return [const(f"{name}/axes", [axis]),
                    helper.make_node("ReduceSum", [x, f"{name}/axes"], [out], name=name, keepdims=0)]
        return [helper.make_node("ReduceSum", [x], [out], name=name, axes=[axis], keepdims=0)]

    nodes = [const("norm/starts", [0]), const("norm/ends", [1]), const("norm/axis", [2]),
             helper.make_node("Slice", [TOP_LOGITS["values"], "norm/starts", "norm/ends", "norm/axis"], ["norm/max"],
                              name="norm/max")]
    x = "logits"
    if elem != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [x], ["norm/logits"], name="norm/cast", to=TensorProto.FLOAT))
        x = "norm/logits"
    nodes += [helper.make_node("Sub", [x, "norm/max"], ["norm/shifted"], name="norm/shifted"),
              helper.make_node("Mul", ["norm/shifted", LOGITS_NORM["scale"]], ["norm/scaled"], name="norm/scaled"),
              helper.make_node("Exp", ["norm/scaled"], ["norm/exp"], name="norm/exp")]
    if width and width % NORM_BLOCK == 0 and width > NORM_BLOCK:
        nodes += [const("norm/shape", [0, 0, width // NORM_BLOCK, NORM_BLOCK]),
                  helper.make_node("Reshape", ["norm/exp", "norm/shape"], ["norm/blocks"], name="norm/blocks")]
        nodes += reduce_sum("norm/blocks", 3, "norm/block_sums")
        nodes += reduce_sum("norm/block_sums", 2, LOGITS_NORM["norm"])
    else:
        nodes += reduce_sum("norm/exp", 2, LOGITS_NORM["norm"])
    return nodes


def consolidate(src: Path, dst: Path, fold_transposes: bool = False) -> Path:
    """Rewrite ``src`` as ``dst`` + one ``dst.data`` file, streaming tensors one at a time.

    With ``fold_transposes``, Transpose nodes applied to initializers (the tied
    lm_head in optimum graphs) become initializers, so quantizers see them.
    """
    import onnx
    from onnx import external_data_helper as ext, numpy_helper

    model = onnx.load(str(src), load_external_data=False)
    data_path = dst.with_name(dst.name + DATA_SUFFIX)
    tmp_dst = dst.with_name(dst.name + ".tmp")
    offset = 0
    with open(data_path, "wb") as out:
        def put(tensor) -> None:
            nonlocal offset
            if ext.uses_external_data(tensor):
                info = ext.ExternalDataInfo(tensor)
                with open(src.parent / info.location, "rb") as f:
                    f.seek(info.offset or 0)
                    blob = f.read(info.length) if info.length else f.read()
            elif tensor.ByteSize() < 1024:
                return  # small constants stay inline
            else:
                blob = numpy_helper.to_array(tensor).tobytes()
            pad = (-offset) % 64
            out.write(b"\0" * pad)
            offset += pad
            out.write(blob)
            del tensor.external_data[:]
            tensor.ClearField("raw_data")
            for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
                tensor.ClearField(f)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for k, v in (("location", data_path.name), ("offset", str(offset)), ("length", str(len(blob)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = k, v
            offset += len(blob)

        if fold_transposes:
            _fold_initializer_transposes(model, src.parent)
        for tensor in _all_tensors(model.graph):
            put(tensor)
    onnx.save(model, str(tmp_dst))
    os.replace(tmp_dst, dst)
    return dst


def _all_tensors(graph):
    """Initializers and tensor attributes (Constant nodes, subgraphs) of a graph."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _all_tensors(sub)


def _fold_initializer_transposes(model, base: Path) -> None:
    import numpy as np
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    keep = []
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            arr = numpy_helper.to_array(inits[node.input[0]], base_dir=str(base))
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            folded = numpy_helper.from_array(np.ascontiguousarray(np.transpose(arr, perm)), node.output[0])
            model.graph.initializer.append(folded)
            continue
        keep.append(node)
    if len(keep) != len(model.graph.node):
        del model.graph.node[:]
        model.graph.node.extend(keep)


def graph_facts(path: Path) -> dict:
    """Input/output names and static sizes of an exported graph, for the manifest."""
    import onnx

    from .rows import is_row_invariant
    model = onnx.load(str(path), load_external_data=False)
    ins = {i.name: i for i in model.graph.input}
    outs = {o.name: o for o in model.graph.output}

    def dims(vi):
        return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in vi.type.tensor_type.shape.dim]

    kv_in = _pairs(ins, _KV_IN)
    kv_out = _pairs(outs, _KV_OUT)
    if not kv_in or len(kv_in) != len(kv_out):
        raise ExportError(f"{path} has no past-key-value inputs/outputs; the export did not use a cache")
    shape = dims(ins[kv_in[0][0]])
    static = "seqlens_k" in ins
    if "logits" not in outs or "input_ids" not in ins or not (static or "attention_mask" in ins):
        raise ExportError(f"{path} lacks input_ids/attention_mask/logits")
    elem = ins[kv_in[0][0]].type.tensor_type.elem_type
    return {
        "input_ids": "input_ids", "attention_mask": None if static else "attention_mask",
        "kv_cache": "static" if static else "concat",
        "seqlens_k": "seqlens_k" if static else None,
        "total_sequence_length": "total_sequence_length" if static else None,
        "position_ids": "position_ids" if "position_ids" in ins else None,
        "logits_to_keep": KEEP_INPUT if KEEP_INPUT in ins else None,
        "top_logits": dict(TOP_LOGITS) if TOP_LOGITS["k"] in ins and TOP_LOGITS["values"] in outs
        and TOP_LOGITS["ids"] in outs else None,
        "logits_norm": dict(LOGITS_NORM, block=NORM_BLOCK if any(n.name == "norm/blocks" for n in model.graph.node)
                            else 1) if LOGITS_NORM["scale"] in ins and LOGITS_NORM["norm"] in outs else None,
        "logits": "logits", "kv_inputs": kv_in, "kv_outputs": kv_out,
        "rows": "invariant" if is_row_invariant(model) else None,
        "num_layers": len(kv_in), "num_kv_heads": int(shape[1]), "head_dim": int(shape[3]),
        "vocab_size": int(dims(outs["logits"])[-1]),
        "dtype": {1: "float32", 10: "float16"}.get(elem, str(elem)),
        "inputs": {n: dims(v) for n, v in ins.items()},
        "outputs": {n: dims(v) for n, v in outs.items()},
    }


def _pairs(values: dict, pattern) -> list[list[str]]:
    layers: dict[int, dict[str, str]] = {}
    for name in values:
        m = pattern.match(name)
        if m:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = name
    return [[layers[i]["key"], layers[i]["value"]] for i in sorted(layers)]


def subset_ranges(first: int, extra_ids, full_size: int) -> list[list[int]]:
    """Token ids [0, first) plus ``extra_ids`` (special tokens), merged into sorted [start, stop) ranges."""
    ids = sorted({i for i in range(first)} | {int(i) for i in extra_ids if 0 <= int(i) < full_size})
    ranges: list[list[int]] = []
    for i in ids:
        if ranges and ranges[-1][1] == i:
            ranges[-1][1] = i + 1
        else:
            ranges.append([i, i + 1])
    return ranges


def restrict_vocab(src: Path, dst: Path, ranges: list[list[int]]) -> Path:
    """Write ``src`` as ``dst`` with an output layer that computes only the logits of the ids in ``ranges``.

    The logits must come straight from one MatMul with a constant weight (the
    lm_head); its columns outside the ranges are dropped, so the draft's last
    and often largest matrix shrinks to the kept share of the vocabulary.
    """
    import numpy as np
    import onnx
    from onnx import external_data_helper as ext, numpy_helper

    work = dst.with_name(dst.name + ".unfolded")
    consolidate(src, work, fold_transposes=True)
    try:
        model = onnx.load(str(work), load_external_data=False)
        logits = "logits"  # graph_facts requires this name of every exported graph
        producer = next((n for n in model.graph.node if logits in n.output), None)
        inits = {t.name: t for t in model.graph.initializer}
        if producer is None or producer.op_type != "MatMul" or producer.input[1] not in inits:
            raise ExportError(f"{src}: its logits do not come from one MatMul with a constant weight, so its "
                              "vocabulary cannot be restricted; drop --draft-vocab")
        tensor = inits[producer.input[1]]
        if ext.uses_external_data(tensor):
            ext.load_external_data_for_tensor(tensor, str(work.parent))
        weight = numpy_helper.to_array(tensor)
        kept = np.ascontiguousarray(np.concatenate([weight[:, a:b] for a, b in ranges], axis=1))
        tensor.CopyFrom(numpy_helper.from_array(kept, tensor.name))
        out = next(o for o in model.graph.output if o.name == logits)
        dims = out.type.tensor_type.shape.dim
        dims[len(dims) - 1].ClearField("dim_param")
        dims[len(dims) - 1].dim_value = kept.shape[1]
        onnx.save(model, str(work))  # the new head inline (< 2 GB), every other weight still external
        consolidate(work, dst)
    finally:
        for leftover in work.parent.glob(work.name + "*"):
            leftover.unlink()
    return dst

