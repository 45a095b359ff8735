"""KV caches, one class per graph kind. A cache owns its buffers and its valid length — the tokens whose keys
and values it holds (``advance`` after a pass, ``rewind`` to roll back) — and knows nothing of the model: the
model (engine.lm) runs the passes, through engine.passes, over what the cache binds or hands it.

*static* (the fused graphs ortspec builds): every layer's past and present K/V are one fixed-capacity buffer
[1, kv_heads, capacity, head_dim], allocated once on the execution provider's device and bound through IO
binding as both input and output; the graph writes the new positions in place and reads the first
``total_sequence_length`` positions. The valid length is an integer passed to the graph each call, so a
rollback is only a smaller number: no copy, no host round trip, nothing re-run. Capacity grows (one copy) only
when a request needs more positions than any before it. A static cache may run on another cache's buffers
(``share``: a self-draft over its target's keys and values).

*concat* (optimum's ``text-generation-with-past`` export): each layer takes ``past`` K/V tensors of shape
[1, kv_heads, past_len, head_dim] and returns ``present`` tensors of length past_len + fed. The cache is the
list of ``present`` OrtValues of the last run, kept on the device and bound back as the next run's ``past``
inputs; no K/V byte crosses to the host. They are trimmed to the valid length right before the next run: on a
device (CUDA) by a tiny Slice graph run there, one run for all layers; on the CPU provider (host memory *is*
the device) by a NumPy slice of the OrtValues' own buffers (``trim="graph"`` forces the device path there too).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..bundle import ModelSpec
from .graphs import kv_trim_graph
from .session import ort, session_options

ELEM = {"float32": 1, "float16": 10}
NP_DTYPE = {"float32": np.float32, "float16": np.float16}


@dataclass(frozen=True)
class KVLayout:
    """Where and how one model's keys and values live: every layer's past K and V input and present output
    names, in order, their heads, head size and dtype, and the device."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kv_heads: int
    head_dim: int
    dtype: str
    device: str         # "cpu" or "cuda"

    @classmethod
    def of(cls, spec: ModelSpec, device: str) -> "KVLayout":
        return cls(tuple(n for pair in spec.kv_inputs for n in pair),
                   tuple(n for pair in spec.kv_outputs for n in pair),
                   spec.num_kv_heads, spec.head_dim, spec.dtype, device)

    def buffers(self, positions: int) -> list:
        """Fresh K/V tensors of ``positions`` positions for every layer, on the device."""
        shape = [1, self.kv_heads, positions, self.head_dim]
        return [ort.OrtValue.ortvalue_from_shape_and_type(shape, NP_DTYPE[self.dtype], self.device, 0)
                for _ in self.inputs]

    def fits(self, other: "KVLayout") -> bool:
        """Whether one model's passes can read and write the other's buffers: one device, the same layers, KV
        heads, head size and dtype."""
        return (len(self.inputs), self.kv_heads, self.head_dim, self.dtype, self.device) == \
            (len(other.inputs), other.kv_heads, other.head_dim, other.dtype, other.device)


class _ValidLength:
    """The tokens a cache holds keys and values for, in order: its valid length."""

    tokens: list[int]

    @property
    def length(self) -> int:
        return len(self.tokens)

    def advance(self, start: int, ids: Sequence[int]) -> None:
        """A pass from position ``start`` wrote ``ids``' keys and values: they are valid from now on."""
        self.tokens[start:] = ids

    def rewind(self, length: int) -> None:
        """Keep the first ``length`` tokens (what lies beyond is never read again, and is overwritten)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback length must be in [0, {self.length}], got {length}")
        del self.tokens[length:]


class StaticCache(_ValidLength):
    """Fixed-capacity K/V buffers bound in place (see the module's note) of at most ``limit`` positions, plus
    ``headroom`` slots a pass may write past the positions it feeds (a row-invariant graph's extra attention
    row: never valid, overwritten by the next pass); ``owner``: the cache whose buffers this one runs on
    (``share``), else None."""

    kind = "static"
    RESERVE_STEP = 256  # buffers grow in multiples of this many positions

    def __init__(self, layout: KVLayout, limit: int, size: int = 0, headroom: int = 0):
        self.layout, self.limit, self.headroom = layout, limit, headroom
        size = size and size + headroom
        self.past: list = layout.buffers(size)
        self.stored = size                  # the buffers' capacity
        self.binding: StaticBinding | None = None  # an IO binding with the buffers bound (made on the next pass)
        self.owner: StaticCache | None = None
        self.tokens = []

    def clear(self) -> None:
        """Hold nothing (the buffers stay: the valid length alone says what is cached)."""
        self.tokens = []

    def fresh(self, positions: int) -> "StaticCache":
        """A cache of the same kind with buffers of its own for ``positions`` positions (a reference prefill)."""
        return StaticCache(self.layout, self.limit, positions, self.headroom)

    def reserve(self, positions: int) -> None:
        """Room for ``positions`` (rounded up) and the headroom, keeping the valid prefix."""
        if self.owner is not None:  # the owner's buffers grow (the owner keeps its valid prefix)
            self.owner.reserve(positions)
            self.follow_owner()
            return
        if positions + self.headroom <= self.stored:
            return
        layout, length = self.layout, self.length
        size = min(self.limit, -(-positions // self.RESERVE_STEP) * self.RESERVE_STEP) + self.headroom
        if not length:
            self.past, self.stored, self.binding = layout.buffers(size), size, None
            return
        fresh = []  # rare: one copy of the valid prefix (through the host on a GPU)
        for old in self.past:
            data = np.zeros((1, layout.kv_heads, size, layout.head_dim), NP_DTYPE[layout.dtype])
            data[:, :, :length] = old.numpy()[:, :, :length]
            fresh.append(ort.OrtValue.ortvalue_from_numpy(data, layout.device, 0))
        self.past, self.stored = fresh, size
        self.binding = None  # rebind the new buffers on the next call

    def can_copy(self, other) -> bool:
        """Whether ``copy_prefix`` can take ``other``'s tokens: both static on the CPU with one layout, this one
        on buffers of its own."""
        return other.kind == "static" and self.owner is None and self.layout.device == "cpu" and \
            self.layout.fits(other.layout)

    def copy_prefix(self, other: "StaticCache", n: int) -> None:
        """Hold ``other``'s first ``n`` tokens instead of what this cache held: their keys and values copied into
        this cache's buffers, bit for bit (on the CPU an OrtValue's array is its memory)."""
        if not self.can_copy(other) or not 0 <= n <= other.length:
            raise ValueError(f"copy_prefix: cannot take {n} positions of that cache")
        self.tokens = []
        self.reserve(n)
        for mine, theirs in zip(self.past, other.past):
            mine.numpy()[:, :, :n] = theirs.numpy()[:, :, :n]
        self.tokens = other.tokens[:n]

    def can_share(self, other) -> bool:
        """Whether this cache can run on ``other``'s buffers: both static, with one layout on one device."""
        return other.kind == "static" and self.layout.fits(other.layout)

    def share(self, owner: "StaticCache") -> None:
        """Run on ``owner``'s buffers instead of buffers of its own (``CausalLM.share_cache``)."""
        self.owner = owner
        self.past, self.stored, self.binding = self.layout.buffers(0), 0, None
        self.follow_owner()

    def follow(self, length: int) -> None:
        """The valid prefix becomes the owner's first ``length`` tokens, whose keys and values it computed."""
        if self.owner is None or not 0 <= length <= self.owner.length:
            raise ValueError(f"follow: {length} positions are not all in a shared cache's owner")
        self.tokens = self.owner.tokens[:length]

    def follow_owner(self) -> None:
        """A cache sharing another's binds that one's current buffers (which ``reserve`` may replace)."""
        owner = self.owner
        if owner is not None and self.past is not owner.past:
            self.past, self.stored, self.binding = owner.past, owner.stored, None

    def bound(self, session) -> "StaticBinding":
        """An IO binding of ``session`` with every layer's K/V buffer bound as both past input and present output
        (written in place), made once per set of buffers."""
        self.follow_owner()
        if self.binding is None:
            b = session.io_binding()
            for name_in, name_out, value in zip(self.layout.inputs, self.layout.outputs, self.past):
                b.bind_ortvalue_input(name_in, value)
                b.bind_ortvalue_output(name_out, value)
            self.binding = StaticBinding(b)
        return self.binding


class StaticBinding:
    """A static cache's IO binding (``io``: every layer's K/V bound in place) and the host arrays the pass binds
    its small inputs to (``feed``: made by the pass on its first run; engine.passes)."""

    __slots__ = ("io", "feed")

    def __init__(self, io):
        self.io, self.feed = io, None


class GrowingCache(_ValidLength):
    """A concat graph's cache: the ``present`` tensors of the last pass, ``stored`` positions of them, trimmed to
    the valid length before the next pass (see the module's note)."""

    kind = "concat"
    owner = None  # (a concat cache never runs on another's)

    def __init__(self, layout: KVLayout, host_trim: bool, trimmer=None):
        self.layout, self.host_trim, self.trimmer = layout, host_trim, trimmer
        self.empty = layout.buffers(0)
        self.past: list = list(self.empty)
        self.stored = 0
        self.tokens = []

    @staticmethod
    def for_layout(layout: KVLayout, trim: str, thread_pool: str, providers: list) -> "GrowingCache":
        host_trim = trim == "host" or (trim == "auto" and layout.device == "cpu")
        trimmer = None if host_trim else ort.InferenceSession(
            kv_trim_graph(len(layout.inputs), ELEM[layout.dtype]), session_options(1, thread_pool),
            providers=providers)
        return GrowingCache(layout, host_trim, trimmer)

    def clear(self) -> None:
        self.past, self.stored, self.tokens = list(self.empty), 0, []

    def fresh(self, positions: int) -> "GrowingCache":
        return GrowingCache(self.layout, self.host_trim, self.trimmer)

    def reserve(self, positions: int) -> None:
        """Nothing to reserve: each pass returns tensors of the length it needs."""

    def can_share(self, other) -> bool:
        return False

    def can_copy(self, other) -> bool:
        return False

    def trimmed(self, length: int) -> list:
        """The cache tensors cut to ``length`` positions (the past a pass from ``length`` binds)."""
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
            b.bind_output(f"y{i}", self.layout.device, 0)
        self.trimmer.run_with_iobinding(b)
        self.past, self.stored = list(b.get_outputs()), length
        return self.past

    def store(self, present: list, stored: int) -> None:
        """A pass's ``present`` tensors, ``stored`` positions long, are the cache now."""
        self.past, self.stored = present, stored
