"""KV caches, one class per graph kind: static buffers bound in place (a model's own, or another's), or a concat graph's growing presents.

*static* (the fused graphs ortspec builds): every layer's past and present K/V are one fixed-capacity buffer
[1, kv_heads, capacity, head_dim], allocated once on the execution provider's device and bound through IO
binding as both input and output; the graph writes the new positions in place and reads the first
``total_sequence_length`` positions. The valid length is an integer passed to the graph each call, so a
rollback is only a smaller number: no copy, no host round trip, nothing re-run. Capacity grows (one copy) only
when a request needs more positions than any before it. A static cache may run on another model's buffers
(``share``: a self-draft over its target's keys and values).

*concat* (optimum's ``text-generation-with-past`` export): each layer takes ``past`` K/V tensors of shape
[1, kv_heads, past_len, head_dim] and returns ``present`` tensors of length past_len + fed. The cache is the
list of ``present`` OrtValues of the last run, kept on the device and bound back as the next run's ``past``
inputs; no K/V byte crosses to the host. They are trimmed to the valid length right before the next run: on a
device (CUDA) by a tiny Slice graph run there, one run for all layers; on the CPU provider (host memory *is*
the device) by a NumPy slice of the OrtValues' own buffers (``trim="graph"`` forces the device path there too).
"""
from __future__ import annotations

import time
from typing import Protocol

import numpy as np

from ..bundle import ModelSpec
from .graphs import kv_trim_graph
from .rows import DeviceRows, RowReading, TopRows
from .session import ort, session_options
from .slots import HostSlot


class PassModel(Protocol):
    """What a cache's pass reads of, and asks of, the model it belongs to (engine.lm.CausalLM)."""

    spec: ModelSpec
    session: ort.InferenceSession
    device: str                 # "cpu" or "cuda"
    kv_inputs: list[str]        # every layer's past K and V input, in order
    kv_outputs: list[str]       # ... and present output
    capacity: int
    length: int                 # tokens the model holds (valid length)
    top_k: int                  # top entries per kept row this request reads (0: none)
    norm_scale: float           # the graph's normalizer scale this request reads (0: none)
    logits_on_device: bool
    reading: RowReading         # what the pass's rows read besides its buffers
    run_time_s: float

    def top_width(self) -> int: ...
    def rows_on_device(self) -> bool: ...
    def rows_with_top(self) -> bool: ...
    def host_slot(self, rows: int, k: int, on_device: bool) -> HostSlot: ...
    def bind_slot(self, b, slot: HostSlot, rows: int, k: int) -> None: ...
    def bind_top(self, b, slot: HostSlot, rows: int, k: int) -> None: ...
    def bind_keep(self, b, n: int, keep: int) -> int: ...
    def execute(self, b) -> None: ...

ELEM = {"float32": 1, "float16": 10}
NP_DTYPE = {"float32": np.float32, "float16": np.float16}


def kv_buffers(lm: PassModel, positions: int) -> list:
    """Fresh K/V tensors of ``positions`` positions for every layer, on the model's device."""
    shape = [1, lm.spec.num_kv_heads, positions, lm.spec.head_dim]
    return [ort.OrtValue.ortvalue_from_shape_and_type(shape, NP_DTYPE[lm.spec.dtype], lm.device, 0)
            for _ in lm.kv_inputs]


class StaticCache:
    """Fixed-capacity K/V buffers bound in place (see the module's note); ``owner``: the cache of the model whose
    buffers this one runs on (``share``), else None."""

    kind = "static"
    RESERVE_STEP = 256  # buffers grow in multiples of this many positions

    def __init__(self, lm: PassModel, size: int = 0):
        self.lm = lm
        self.past: list = kv_buffers(lm, size)
        self.stored = size                  # the buffers' capacity
        self.binding: _StaticBinding | None = None  # IO binding with the buffers bound (made on the next pass)
        self.owner: StaticCache | None = None

    def clear(self) -> None:
        """Nothing to drop: the valid length alone says what is cached."""

    def fresh(self, positions: int) -> "StaticCache":
        """A cache of the same kind with buffers of its own for ``positions`` positions (a reference prefill)."""
        return StaticCache(self.lm, positions)

    def reserve(self, positions: int) -> None:
        """Room for ``positions`` (rounded up), keeping the model's valid prefix."""
        if self.owner is not None:  # the owner's buffers grow (the owner keeps its valid prefix)
            self.owner.reserve(positions)
            self.follow_owner()
            return
        if positions <= self.stored:
            return
        lm = self.lm
        size = min(lm.capacity, -(-positions // self.RESERVE_STEP) * self.RESERVE_STEP)
        if not lm.length:
            self.past, self.stored, self.binding = kv_buffers(lm, size), size, None
            return
        fresh = []  # rare: one copy of the valid prefix (through the host on a GPU)
        for old in self.past:
            data = np.zeros((1, lm.spec.num_kv_heads, size, lm.spec.head_dim), NP_DTYPE[lm.spec.dtype])
            data[:, :, :lm.length] = old.numpy()[:, :, :lm.length]
            fresh.append(ort.OrtValue.ortvalue_from_numpy(data, lm.device, 0))
        self.past, self.stored = fresh, size
        self.binding = None  # rebind the new buffers on the next call

    def can_share(self, other) -> bool:
        """Whether this cache can run on ``other``'s buffers: both static, on one device, with one layout."""
        a, b = self.lm.spec, other.lm.spec
        return (other.kind == "static" and self.lm.device == other.lm.device
                and (a.num_layers, a.num_kv_heads, a.head_dim, a.dtype) == (b.num_layers, b.num_kv_heads,
                                                                            b.head_dim, b.dtype))

    def share(self, owner: "StaticCache") -> None:
        """Run on ``owner``'s buffers instead of buffers of its own (``CausalLM.share_cache``)."""
        self.owner = owner
        self.past, self.stored, self.binding = kv_buffers(self.lm, 0), 0, None
        self.follow_owner()

    def follow_owner(self) -> None:
        """A cache sharing another's binds that one's current buffers (which ``reserve`` may replace)."""
        owner = self.owner
        if owner is not None and self.past is not owner.past:
            self.past, self.stored, self.binding = owner.past, owner.stored, None

    def run(self, ids: list[int], start: int, keep: int):
        """One pass over ``ids`` at ``start``; the logits rows of its last ``keep`` positions."""
        self.follow_owner()
        if self.binding is None:
            self.binding = self._bind()
        return self._run(ids, start + len(ids), keep, self.binding)

    def _bind(self) -> "_StaticBinding":
        """An IO binding with every layer's K/V buffer bound as both past input and present output."""
        lm = self.lm
        b = lm.session.io_binding()
        for name_in, name_out, value in zip(lm.kv_inputs, lm.kv_outputs, self.past):
            b.bind_ortvalue_input(name_in, value)
            b.bind_ortvalue_output(name_out, value)  # written in place
        return _StaticBinding(b)

    def _run(self, ids: list[int], total: int, keep: int, sb: "_StaticBinding"):
        """One call of the graph: only ids, lengths and the output buffers are (re)bound."""
        lm, spec = self.lm, self.lm.spec
        feed, rows = self._feed_small(sb, ids, total, keep)
        b = sb.io
        k = lm.top_width() if spec.top_logits else 0
        put = feed["put"]
        if k:
            put["top_k"][0] = k
        if spec.logits_norm:
            put["norm_scale"][0] = lm.norm_scale  # (rounded to float32 as NumPy rounds it)
        on_device = lm.rows_on_device()
        slot = lm.host_slot(rows, k, on_device)
        key = None if slot.serial is None else (slot.serial, rows, k)
        if key is None or feed["out"] != key or lm.device != "cpu":  # else: the same buffers are still bound
            if on_device:
                value = ort.OrtValue.ortvalue_from_shape_and_type([1, rows, spec.vocab_size], NP_DTYPE[spec.dtype],
                                                                  lm.device, 0)
                b.bind_ortvalue_output(spec.logits, value)
            elif key is not None:  # a kept slot: its values are made once per shape
                lm.bind_slot(b, slot, rows, k)
            else:
                b.bind_output(spec.logits, "cpu", 0, NP_DTYPE[spec.dtype], [1, rows, spec.vocab_size],
                              slot.logits_at)
            if k and key is None:
                lm.bind_top(b, slot, rows, k)
            feed["out"] = key
        lm.execute(b)
        if on_device:
            # (the graph's own top entries where it has them and this request reads them: an earlier release's
            # graph has none, and DeviceRows then runs its own TopK)
            top = (slot.top_values[:rows * k].reshape(rows, k), slot.top_cols[:rows * k].reshape(rows, k), k) \
                if k and lm.top_k else None
            return DeviceRows(lm.reading, value, top=top)[rows - keep:]
        if lm.rows_with_top():  # the graph's top entries of each row beside the rows
            return TopRows(lm.reading, slot, rows, k, lm.norm_scale, start=rows - keep)
        logits = slot.logits[:rows * spec.vocab_size].reshape(rows, spec.vocab_size)[rows - keep:]
        return logits if logits.dtype == np.float32 else logits.astype(np.float32)

    def _feed_small(self, sb: "_StaticBinding", ids: list[int], total: int, keep: int) -> tuple[dict, int]:
        """Write a pass's small inputs (ids, lengths, rows to keep) into host arrays bound to ``sb``; the number of
        logits rows the pass returns. On the CPU provider onnxruntime reads bound host inputs in place at run
        time, so an array is bound once (the ids again only when the pass length changes); on other devices
        binding copies the values, so every pass binds them again. The feed's "out" is the (slot, rows, k) of
        the logits buffer bound last."""
        lm, spec = self.lm, self.lm.spec
        b, feed = sb.io, sb.feed
        bind = feed is None or lm.device != "cpu"
        if feed is None:
            feed = sb.feed = {"seqlens": np.zeros(1, np.int32), "total": np.zeros((), np.int32),
                              "keep": np.zeros(1, np.int64), "ids": np.zeros((1, 0), np.int64), "out": None,
                              "top_k": np.ones(1, np.int64), "norm_scale": np.zeros(1, np.float32)}
            # each array's memory as a flat memoryview: a pass writes its few numbers through these (a NumPy item
            # write costs several times as much, more so right after a pass has flushed the caches)
            feed["put"] = {name: _flat_view(feed[name]) for name in ("seqlens", "total", "keep", "top_k", "norm_scale")}
        n = len(ids)
        bind_ids = bind or feed["ids"].shape[1] != n
        if feed["ids"].shape[1] != n:
            feed["ids"] = np.zeros((1, n), np.int64)
            feed["put"]["ids"] = _flat_view(feed["ids"])
        put = feed["put"]
        view = put["ids"]
        for j in range(n):
            view[j] = ids[j]
        put["seqlens"][0] = total - 1
        put["total"][0] = total
        rows = n
        if spec.logits_to_keep is not None:
            put["keep"][0] = rows = keep
        if bind:
            b.bind_cpu_input(spec.seqlens_k, feed["seqlens"])
            b.bind_cpu_input(spec.total_sequence_length, feed["total"])
            if spec.logits_to_keep is not None:
                b.bind_cpu_input(spec.logits_to_keep, feed["keep"])
            if spec.top_logits:
                b.bind_cpu_input(spec.top_logits["k"], feed["top_k"])
            if spec.logits_norm:
                b.bind_cpu_input(spec.logits_norm["scale"], feed["norm_scale"])
        if bind_ids:
            b.bind_cpu_input(spec.input_ids, feed["ids"])
        return feed, rows


class GrowingCache:
    """A concat graph's cache: the ``present`` tensors of the last pass, ``stored`` positions of them, trimmed to
    the valid length before the next pass (see the module's note)."""

    kind = "concat"
    owner = None  # (a concat cache never runs on another's)

    def __init__(self, lm: PassModel, host_trim: bool, trimmer=None):
        self.lm, self.host_trim, self.trimmer = lm, host_trim, trimmer
        self.empty = kv_buffers(lm, 0)
        self.past: list = list(self.empty)
        self.stored = 0

    @staticmethod
    def for_model(lm: PassModel, trim: str, thread_pool: str, providers: list) -> "GrowingCache":
        host_trim = trim == "host" or (trim == "auto" and lm.device == "cpu")
        trimmer = None if host_trim else ort.InferenceSession(
            kv_trim_graph(2 * lm.spec.num_layers, ELEM[lm.spec.dtype]), session_options(1, thread_pool),
            providers=providers)
        return GrowingCache(lm, host_trim, trimmer)

    def clear(self) -> None:
        self.past, self.stored = list(self.empty), 0

    def fresh(self, positions: int) -> "GrowingCache":
        return GrowingCache(self.lm, self.host_trim, self.trimmer)

    def reserve(self, positions: int) -> None:
        """Nothing to reserve: each pass returns tensors of the length it needs."""

    def can_share(self, other) -> bool:
        return False

    def run(self, ids: list[int], start: int, keep: int):
        logits, present = self._run(ids, start, self._trimmed(start), keep)
        self.past, self.stored = present, start + len(ids)
        return logits

    def _run(self, ids: list[int], start: int, past: list, keep: int):
        lm, spec = self.lm, self.lm.spec
        total = start + len(ids)
        b = lm.session.io_binding()
        feeds = {spec.input_ids: np.asarray([ids], dtype=np.int64),
                 spec.attention_mask: np.ones((1, total), dtype=np.int64)}
        if spec.position_ids:
            feeds[spec.position_ids] = np.arange(start, total, dtype=np.int64)[None, :]
        for name, arr in feeds.items():
            b.bind_cpu_input(name, arr)
        rows = lm.bind_keep(b, len(ids), keep)
        for name, value in zip(lm.kv_inputs, past):
            b.bind_ortvalue_input(name, value)
        lazy = lm.rows_with_top()
        b.bind_output(spec.logits, lm.device if lazy else "cpu", 0)
        for name in lm.kv_outputs:
            b.bind_output(name, lm.device, 0)
        k = lm.top_width() if spec.top_logits else 0
        top = None  # (an earlier release's graph has no top entries: DeviceRows then runs its own TopK)
        if k:  # bound last: outputs come back in bind order
            b.bind_cpu_input(spec.top_logits["k"], np.array([k], dtype=np.int64))
            if spec.logits_norm:
                b.bind_cpu_input(spec.logits_norm["scale"], np.array([lm.norm_scale], dtype=np.float32))
            slot = lm.host_slot(rows, k, on_device=True)  # (top entries only: the logits stay where they are)
            lm.bind_top(b, slot, rows, k)
            top = (slot.top_values.reshape(rows, k), slot.top_cols.reshape(rows, k), k)
        lm.execute(b)
        out = b.get_outputs()
        present = list(out[1:1 + len(lm.kv_outputs)])
        if lazy:
            if lm.logits_on_device:
                device = DeviceRows(lm.reading, out[0], top=top if k and lm.top_k else None)
                return device[len(device) - keep:], present
            host = out[0].numpy()[0].astype(np.float32).ravel()
            return TopRows(lm.reading, HostSlot(host, slot.top_values, slot.top_cols, slot.norms), rows, k,
                           lm.norm_scale, start=rows - keep), present
        logits = out[0].numpy()[0][-keep:]
        return logits.astype(np.float32), present

    def _trimmed(self, length: int) -> list:
        """The cache tensors cut to ``length`` positions."""
        if self.stored == length:
            return self.past
        if length == 0:
            return list(self.empty)
        if self.host_trim:
            self.past = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v.numpy()[:, :, :length]))
                         for v in self.past]
            self.stored = length
            return self.past
        b = self.trimmer.io_binding()
        for i, value in enumerate(self.past):
            b.bind_ortvalue_input(f"x{i}", value)
        b.bind_cpu_input("starts", np.zeros(1, dtype=np.int64))
        b.bind_cpu_input("ends", np.array([length], dtype=np.int64))
        b.bind_cpu_input("axes", np.array([2], dtype=np.int64))
        for i in range(len(self.past)):
            b.bind_output(f"y{i}", self.lm.device, 0)
        t0 = time.perf_counter()
        self.trimmer.run_with_iobinding(b)
        self.lm.run_time_s += time.perf_counter() - t0
        self.past, self.stored = list(b.get_outputs()), length
        return self.past


class _StaticBinding:
    """A static cache's IO binding (``io``: every layer's K/V bound in place) and the host arrays its small inputs
    are bound to (``feed``: made on its first pass; see ``StaticCache._feed_small``)."""

    __slots__ = ("io", "feed")

    def __init__(self, io):
        self.io, self.feed = io, None


def _flat_view(arr: np.ndarray) -> memoryview:
    """A C-contiguous array's memory as a flat memoryview of its items (writes land in the array)."""
    return memoryview(arr).cast("B").cast(arr.dtype.char)
