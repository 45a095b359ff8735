"""Target graphs whose every row takes one path whatever the pass size: a lone row computed as in a pass of many.

onnxruntime's CPU kernels compute some rows of a pass on a path of their own, with other rounding: a pass of
one position (GroupQueryAttention's single-query path, a float MatMul's single-row one) and, for MatMulNBits in
blocks of 64 or more (or at an accuracy level other than 4), the last row of a pass of odd size (those take rows
in pairs). Bitwise decoding kept every committed token's logits on the multi-row paths by never running such a
pass: a one-token step ran as a pass of two positions, an odd verify pass as one more (``ModelSpec.row_tile``).

``make_row_invariant`` rewrites a fused graph so that no kernel ever sees such a pass, at the cost of a row or
so inside the kernels that need it instead of a whole extra position through every layer:

- each GroupQueryAttention gets one zero query row appended (its key and value land one slot past the pass,
  outside the valid length, and are overwritten by the next pass: the KV buffers keep one slot of headroom,
  ``ROW_HEADROOM``); causal attention keeps the real rows from seeing it, and the extra output row is cut;
- each matrix whose kernel pairs rows (MatMulNBits in blocks of 64 or more or at another accuracy level, float
  MatMul) gets a zero row appended when its rows are odd, and the extra output row is cut.

MatMulNBits in blocks of 32 at accuracy level 4 computes each row alike at any count (measured on an AMD EPYC
with AVX-512 VNNI); the rest of a fused graph is per-row. The graph says it was rewritten in its metadata
(``ROWS_KEY``); the runtime then runs passes of any size (``ModelSpec.row_tile`` 1) once a probe at load has
found every row's logits the same in passes of 1, 3 and 8 positions on this machine (``CausalLM.rows_agree``).
Every node the rewrite adds is named ``rows/...``, so ``undo_rows`` gives back the graph it rewrote (for
runtimes that size the KV cache to the fed positions exactly, as onnxruntime-genai does).
"""
from __future__ import annotations

import os
from pathlib import Path

ROWS_KEY = "ortspec.rows"      # graph metadata: "invariant" once rewritten
ROW_HEADROOM = 1               # KV slots past the valid length a pass of a rewritten graph writes
_PREFIX = "rows/"
ROWS_PREFIX = _PREFIX          # every node and constant the rewrite adds is named so


def make_row_invariant(path: Path, dst: Path | None = None) -> bool:
    """Rewrite the fused graph at ``path`` (in place, or to ``dst`` beside it) as the module describes; False when
    there is nothing to do: it is rewritten already, or it is not a fused graph (no GroupQueryAttention)."""
    import onnx
    model = onnx.load(str(path), load_external_data=False)
    if not rewrite_rows(model):
        return False
    dst = path if dst is None else dst
    tmp = dst.with_name(dst.name + ".rows")
    onnx.save(model, str(tmp))
    os.replace(tmp, dst)
    return True


def rewrite_rows(model) -> bool:
    """``make_row_invariant`` on a loaded ``onnx.ModelProto``, in place; False when there is nothing to do."""
    import numpy as np
    from onnx import helper, numpy_helper

    from .names import KEEP_INPUT

    graph = model.graph
    if is_row_invariant(model) or not any(n.op_type == "GroupQueryAttention" for n in graph.node):
        return False
    kept = _kept_tensors(graph, KEEP_INPUT)
    consts = {"zeros4": [0, 0, 0, 0], "zero": [0], "one": [1], "two": [2], "axis": [1], "start": [1], "end": [2]}
    graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), _PREFIX + k) for k, v in consts.items())
    graph.initializer.extend([numpy_helper.from_array(np.array([1], np.int32), _PREFIX + "one32"),
                              numpy_helper.from_array(np.array(1, np.int32), _PREFIX + "one32s")])
    c = {k: _PREFIX + k for k in consts}

    def n(op: str, ins: list[str], out: str, **attrs):
        name = out if out.startswith(_PREFIX) else f"{_PREFIX}{out}.cut"
        return helper.make_node(op, ins, [out], name=name, **attrs)

    head = [  # the pass's rows and, for the output layer, the kept rows: each count and the pad that makes it even
        n("Shape", ["input_ids"], _PREFIX + "shape"),
        n("Slice", [_PREFIX + "shape", c["start"], c["end"]], _PREFIX + "rows"),
        n("Mod", [_PREFIX + "rows", c["two"]], _PREFIX + "odd"),
        n("Concat", [c["zeros4"], _PREFIX + "odd", c["zero"]], _PREFIX + "pads", axis=0),
        n("Concat", [c["zeros4"], c["one"], c["zero"]], _PREFIX + "pad1", axis=0),
        n("Add", ["seqlens_k", _PREFIX + "one32"], _PREFIX + "seqlens_k"),
        n("Add", ["total_sequence_length", _PREFIX + "one32s"], _PREFIX + "total"),
    ]
    if any(i.name == KEEP_INPUT for i in graph.input):
        head += [n("Mod", [KEEP_INPUT, c["two"]], _PREFIX + "kept_odd"),
                 n("Concat", [c["zeros4"], _PREFIX + "kept_odd", c["zero"]], _PREFIX + "kept_pads", axis=0)]
    nodes, count = list(head), 0
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            ins = list(node.input)
            for j in (0, 1, 2):  # the packed QKV, or separate Q, K and V
                if ins[j]:
                    nodes.append(n("Pad", [ins[j], _PREFIX + "pad1"], f"{_PREFIX}{ins[j]}.plus1"))
                    ins[j] = f"{_PREFIX}{ins[j]}.plus1"
            ins[5], ins[6] = _PREFIX + "seqlens_k", _PREFIX + "total"
            out = node.output[0]
            nodes.append(_renamed(node, ins, f"{_PREFIX}{out}.plus1"))
            nodes.append(n("Slice", [f"{_PREFIX}{out}.plus1", c["zero"], _PREFIX + "rows", c["axis"]], out))
            count += 1
        elif _pairs_rows(node):
            x, out = node.input[0], node.output[0]
            tail = "kept_" if x in kept else ""
            rows = KEEP_INPUT if tail else _PREFIX + "rows"
            nodes.append(n("Pad", [x, f"{_PREFIX}{tail}pads"], f"{_PREFIX}{out}.in"))
            nodes.append(_renamed(node, [f"{_PREFIX}{out}.in", *node.input[1:]], f"{_PREFIX}{out}.even"))
            nodes.append(n("Slice", [f"{_PREFIX}{out}.even", c["zero"], rows, c["axis"]], out))
            count += 1
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    entry = model.metadata_props.add()
    entry.key, entry.value = ROWS_KEY, "invariant"
    return True


def undo_rows(model) -> bool:
    """The graph ``rewrite_rows`` was given back, in place on a loaded ``onnx.ModelProto`` (the same nodes, names
    and weights); False when it was not rewritten."""
    if not is_row_invariant(model):
        return False
    graph = model.graph
    added = [n for n in graph.node if n.name.startswith(_PREFIX)]
    source = {n.output[0]: n.input[0] for n in added if n.op_type == "Pad"}  # a padded input: what it pads
    source.update({_PREFIX + "seqlens_k": "seqlens_k", _PREFIX + "total": "total_sequence_length"})
    target = {n.input[0]: n.output[0] for n in added if n.op_type == "Slice" and n.name.endswith(".cut")}
    nodes = []
    for node in graph.node:
        if node.name.startswith(_PREFIX):
            continue
        if node.output and node.output[0] in target:
            node.output[0] = target[node.output[0]]
        for j, name in enumerate(node.input):
            node.input[j] = source.get(name, name)
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if not t.name.startswith(_PREFIX)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    props = [(p.key, p.value) for p in model.metadata_props if p.key != ROWS_KEY]
    del model.metadata_props[:]
    for key, value in props:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return True


def is_row_invariant(model) -> bool:
    """Whether a loaded ONNX model (``onnx.ModelProto``) was rewritten by ``make_row_invariant``."""
    return any(p.key == ROWS_KEY and p.value == "invariant" for p in model.metadata_props)


def _pairs_rows(node) -> bool:
    """Whether a node's kernel computes a lone row (or an odd pass's last) on a path of its own."""
    if node.op_type == "MatMul":
        return True
    if node.op_type != "MatMulNBits":
        return False
    attrs = {a.name: a.i for a in node.attribute if a.type == a.INT}
    return attrs.get("block_size", 32) != 32 or attrs.get("accuracy_level", 0) != 4


def _renamed(node, inputs: list[str], first_output: str):
    """A copy of ``node`` reading ``inputs`` and writing ``first_output`` in place of its first output."""
    from onnx import helper
    copy = helper.make_node(node.op_type, inputs, [first_output, *node.output[1:]], name=node.name,
                            domain=node.domain)
    copy.attribute.extend(node.attribute)
    return copy


def _kept_tensors(graph, keep_input: str) -> set[str]:
    """Tensors with the output layer's rows (the last ``logits_to_keep``): everything computed from the Slice that
    keeps them (the one whose start is -logits_to_keep)."""
    negs = {n.output[0] for n in graph.node if n.op_type == "Neg" and list(n.input) == [keep_input]}
    kept = {n.output[0] for n in graph.node if n.op_type == "Slice" and len(n.input) > 1 and n.input[1] in negs}
    for node in graph.node:  # (nodes are in topological order)
        if any(i in kept for i in node.input):
            kept.update(o for o in node.output if o)
    return kept
