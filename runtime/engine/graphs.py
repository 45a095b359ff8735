"""Two tiny graphs the engine runs beside a model (TopK over device rows, Slice of a concat cache), encoded without the onnx package."""
from __future__ import annotations



def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes | int | str) -> bytes:
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint((number << 3) | 2) + _varint(len(data)) + data


def _value_info(name: str, elem_type: int) -> bytes:
    tensor_type = _field(1, elem_type)                      # TypeProto.Tensor.elem_type
    return _field(1, name) + _field(2, _field(1, tensor_type))  # ValueInfoProto{name, type{tensor_type}}


def _model(graph: bytes) -> bytes:
    opset = _field(1, "") + _field(2, 13)
    return _field(1, 8) + _field(2, "ortspec") + _field(7, graph) + _field(8, opset)


def topk_graph(elem_type: int) -> bytes:
    """ModelProto bytes: values, indices = TopK(logits, k) along the vocabulary, values cast to float32."""
    topk = _field(1, "logits") + _field(1, "k") + _field(2, "top") + _field(2, "indices") + _field(4, "TopK")
    to_float = _field(1, "to") + _field(3, 1) + _field(20, 2)  # AttributeProto{name, i=FLOAT, type=INT}
    cast = _field(1, "top") + _field(2, "values") + _field(4, "Cast") + _field(5, to_float)
    graph = _field(1, topk) + _field(1, cast) + _field(2, "logits_topk")
    graph += _field(11, _value_info("logits", elem_type)) + _field(11, _value_info("k", 7))
    graph += _field(12, _value_info("values", 1)) + _field(12, _value_info("indices", 7))
    return _model(graph)


def kv_trim_graph(n: int, elem_type: int) -> bytes:
    """ModelProto bytes: y_i = Slice(x_i, starts, ends, axes) for i < n (opset 13)."""
    graph = b""
    for i in range(n):
        node = (_field(1, f"x{i}") + _field(1, "starts") + _field(1, "ends") + _field(1, "axes")
                + _field(2, f"y{i}") + _field(3, f"slice{i}") + _field(4, "Slice"))
        graph += _field(1, node)
    graph += _field(2, "kv_trim")
    for i in range(n):
        graph += _field(11, _value_info(f"x{i}", elem_type))
    for name in ("starts", "ends", "axes"):
        graph += _field(11, _value_info(name, 7))
    for i in range(n):
        graph += _field(12, _value_info(f"y{i}", elem_type))
    return _model(graph)
