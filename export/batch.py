"""A target graph that runs several requests' passes as one: the rows of every request side by side, each
request's attention over a KV cache of its own.

A fused graph is per-row everywhere but in its attention: the matrices, norms and activations of a row never
read another row. ``make_batched`` keeps all of that as it is, over the rows of every slot concatenated
([1, rows, ...] as before), and gives each GroupQueryAttention one copy per slot: slot ``b`` reads its rows
(``slot_bounds[b]`` to ``slot_bounds[b + 1]``), its own past keys and values (``past_key_values.L.key@b``), its
own lengths (``seqlens_k@b``, ``total_sequence_length@b``), and writes its own present ones. The output layer
reads the rows ``kept_rows`` names (each slot's last few; ``logits_to_keep`` is their count). The weights are
read once for every slot's rows: a decoding pass, bandwidth-bound at one row, costs little more at several.

Each row gets the bits it gets alone. The graph is made row-invariant first (export.rows: each attention with one
zero query row appended, each row-pairing matrix an even row count), so every kernel takes the path it takes
in a pass of its own: a slot's attention sees its own rows and the zero row, exactly as a single pass does,
and the matrices' rows do not depend on their neighbours. A slot with no rows in a pass runs its attention over
the zero row alone, on a spare cache (the runtime binds one). The normalizer's scale (``logits_norm_scale``) is
per row, [1, rows, 1], since the slots' requests may sample at different temperatures. Every node added is
named ``batch/...``.
"""
from __future__ import annotations

from .names import KEEP_INPUT
from .rows import ROWS_PREFIX as _ROWS, is_row_invariant, rewrite_rows

BATCH_KEY = "ortspec.batch"       # graph metadata: the slot count
BOUNDS = "slot_bounds"            # int64 [slots + 1]: where each slot's rows start, and the last one's end
KEPT = "kept_rows"                # int64 [kept]: the rows whose logits the pass returns (each slot's last few)
_P = "batch/"


def slot_name(name: str, slot: int) -> str:
    """A per-request input or output's name for ``slot`` (``past_key_values.0.key@1``)."""
    return f"{name}@{slot}"


def make_batched(model, slots: int, seqlens: str = "seqlens_k", total: str = "total_sequence_length",
                 norm_scale: str | None = "logits_norm_scale"):
    """Rewrite a loaded fused graph (``onnx.ModelProto``, weights external or not) as the module describes, in
    place, for ``slots`` slots; the model. ValueError for a graph that has no GroupQueryAttention (only fused
    graphs batch)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    if slots < 1:
        raise ValueError(f"slots must be at least 1, got {slots}")
    graph = model.graph
    if not any(n.op_type == "GroupQueryAttention" for n in graph.node):
        raise ValueError("only fused graphs (GroupQueryAttention with a static cache) run several requests "
                         "in one pass; re-export the bundle with the fused builder")
    if not is_row_invariant(model):
        rewrite_rows(model)
    producer = {o: n for n in graph.node for o in n.output}
    consts = {f"{_P}at{b}": [b] for b in range(slots + 2)}
    graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items())

    def node(op: str, ins: list[str], outs: list[str], **attrs):
        return helper.make_node(op, ins, outs, name=_P + outs[0], **attrs)

    head = []
    for b in range(slots):  # each slot's rows, and its lengths with the zero row
        head += [node("Slice", [BOUNDS, f"{_P}at{b}", f"{_P}at{b + 1}"], [f"{_P}start@{b}"]),
                 node("Slice", [BOUNDS, f"{_P}at{b + 1}", f"{_P}at{b + 2}"], [f"{_P}end@{b}"]),
                 node("Sub", [f"{_P}end@{b}", f"{_P}start@{b}"], [f"{_P}rows@{b}"]),
                 node("Add", [slot_name(seqlens, b), _ROWS + "one32"], [f"{_P}seqlens@{b}"]),
                 node("Add", [slot_name(total, b), _ROWS + "one32s"], [f"{_P}total@{b}"])]

    dropped: set[int] = set()
    replaced: dict[int, list] = {}
    # the output layer reads the rows asked for, each slot's last few, not the last rows of the whole pass
    negs = {n.output[0] for n in graph.node if n.op_type == "Neg" and list(n.input) == [KEEP_INPUT]}
    keep_cut = next((n for n in graph.node if n.op_type == "Slice" and len(n.input) > 1 and n.input[1] in negs),
                    None)
    if keep_cut is not None:
        replaced[id(keep_cut)] = [node("Gather", [keep_cut.input[0], KEPT], [keep_cut.output[0]], axis=1)]
    kv_in, kv_out = [], []
    for node_ in graph.node:
        if node_.op_type != "GroupQueryAttention":
            continue
        ins = list(node_.input)
        sources = []
        for j in (0, 1, 2):  # the padded query/key/value: what each Pad pads
            pad = producer.get(ins[j]) if ins[j] else None
            sources.append(pad.input[0] if pad is not None else "")
            if pad is not None:
                dropped.add(id(pad))
        cut = next(n for n in graph.node if n.op_type == "Slice" and n.input[0] == node_.output[0])
        dropped.add(id(cut))
        out = cut.output[0]
        kv_in += ins[3:5]
        kv_out += list(node_.output[1:3])
        nodes, parts = [], []
        for b in range(slots):
            padded = []
            for src in sources:
                if not src:
                    padded.append("")
                    continue
                nodes += [node("Slice", [src, f"{_P}start@{b}", f"{_P}end@{b}", _ROWS + "axis"], [f"{_P}{src}@{b}"]),
                          node("Pad", [f"{_P}{src}@{b}", _ROWS + "pad1"], [f"{_P}{src}@{b}.plus1"])]
                padded.append(f"{_P}{src}@{b}.plus1")
            copy = helper.make_node("GroupQueryAttention",
                                    padded + [slot_name(ins[3], b), slot_name(ins[4], b), f"{_P}seqlens@{b}",
                                              f"{_P}total@{b}", *ins[7:]],
                                    [f"{_P}{out}@{b}.plus1", slot_name(node_.output[1], b),
                                     slot_name(node_.output[2], b)],
                                    name=f"{_P}{node_.name}@{b}", domain=node_.domain)
            copy.attribute.extend(node_.attribute)
            nodes += [copy, node("Slice", [f"{_P}{out}@{b}.plus1", _ROWS + "zero", f"{_P}rows@{b}", _ROWS + "axis"],
                                 [f"{_P}{out}@{b}"])]
            parts.append(f"{_P}{out}@{b}")
        nodes.append(node("Concat", parts, [out], axis=1) if slots > 1 else node("Identity", parts, [out]))
        replaced[id(node_)] = nodes
    body = list(head)
    for node_ in graph.node:
        if id(node_) in dropped:
            continue
        body += replaced.get(id(node_), [node_])
    del graph.node[:]
    graph.node.extend(body)

    # the inputs and outputs: one set of lengths and of keys and values per slot
    per_slot_in = set(kv_in) | {seqlens, total}
    inputs = [i for i in graph.input if i.name not in per_slot_in]
    for b in range(slots):
        for i in graph.input:
            if i.name in per_slot_in:
                copy = type(i)()
                copy.CopyFrom(i)
                copy.name = slot_name(i.name, b)
                inputs.append(copy)
    inputs.append(helper.make_tensor_value_info(BOUNDS, TensorProto.INT64, [slots + 1]))
    if keep_cut is not None:
        inputs.append(helper.make_tensor_value_info(KEPT, TensorProto.INT64, ["kept_rows"]))
    outputs = [o for o in graph.output if o.name not in set(kv_out)]
    for b in range(slots):
        for o in graph.output:
            if o.name in set(kv_out):
                copy = type(o)()
                copy.CopyFrom(o)
                copy.name = slot_name(o.name, b)
                outputs.append(copy)
    for vi in inputs:
        if norm_scale and vi.name == norm_scale:  # a scale per row: [1, rows, 1]
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in (1, "kept_rows", 1):
                dims.add().__setattr__("dim_value" if isinstance(d, int) else "dim_param", d)
    del graph.input[:]
    graph.input.extend(inputs)
    del graph.output[:]
    graph.output.extend(outputs)
    _prune(graph)
    del graph.value_info[:]
    entry = model.metadata_props.add()
    entry.key, entry.value = BATCH_KEY, str(slots)
    return model


def _prune(graph) -> None:
    """Drop nodes nothing reads (the single-request lengths' nodes), and initializers no node reads."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
            for a in node.attribute:  # (subgraphs: none in fused graphs, kept whole if any)
                if a.g.node:
                    needed.update(i for n in a.g.node for i in n.input)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
