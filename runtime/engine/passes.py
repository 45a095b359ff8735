"""One exported graph's passes: its onnxruntime session, the binding of a pass's inputs and outputs over a KV
cache (engine.cache), the host buffers the outputs land in, and the rows handed out (engine.rows).

A pass is asked for with ``PassOptions`` (what the request reads: the bitwise rule, the largest entries per row,
the normalizer's scale) and a ``Reading`` (how this call reads its rows: whole or lazily, into the round's
leased buffers or arrays of its own); nothing about a request is kept on the model between calls.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
import time

import numpy as np

from ..bundle import ModelSpec
from ..errors import BundleError, ModelRunError, ProviderUnavailableError
from .cache import ELEM, NP_DTYPE, GrowingCache, KVLayout, StaticBinding, StaticCache
from .graphs import topk_graph
from .rows import Columns, DeviceRows, RowCounts, RowReading, TopRows
from .session import LOGITS_PLACES, missing_provider, ort, providers_for, session_options
from .slots import HostSlot, HostSlots


@dataclass(frozen=True)
class PassOptions:
    """What one request asks of a model's passes. ``bitwise``: no pass of row_tile * k + 1 positions (each
    position's logits and K/V then have the same bits whatever else shares its pass; CausalLM.forward).
    ``top_k``: the largest entries per kept row a decoding pass brings back (0: none). ``norm_scale``: the scale
    of the graph's per-row normalizer a decoding pass computes (1 / temperature; 0: not read)."""

    bitwise: bool = False
    top_k: int = 0
    norm_scale: float = 0.0

    @classmethod
    def for_rules(cls, rules, bitwise: bool = False) -> "PassOptions":
        """The options of passes whose rows sampling ``rules`` read (a LogitsPipeline: its ``top_entries()`` and
        ``norm_scale()``)."""
        return cls(bitwise, rules.top_entries(), rules.norm_scale())


PLAIN = PassOptions()


@dataclass(frozen=True)
class Reading:
    """How one call reads its pass's rows: ``lazy`` (a decoding round's rows: they may stay on the device or come
    with their largest entries) and ``reuse`` (they may live in a host buffer leased until the next round)."""

    lazy: bool = False
    reuse: bool = False


class Graph:
    """One model's session and passes (see the module's note). ``logits``: where a decoding round's rows stay —
    "device" keeps them where the graph wrote them and the host reads only the largest entries of each row
    (DeviceRows); "host" copies every kept row; auto: device on a GPU, host on the CPU provider (there host
    memory is the device, and numpy reads rows in place)."""

    def __init__(self, spec: ModelSpec, model_path: str, provider: str = "cpu", threads: int | None = None,
                 thread_pool: str = "session", logits: str = "auto", profile: str | None = None):
        self.spec = spec
        self.device = "cuda" if provider == "cuda" else "cpu"
        self.providers = providers_for(provider)
        self.threads, self.thread_pool, self.model_path = threads, thread_pool, model_path
        so = session_options(threads, thread_pool)
        if profile:  # onnxruntime's profiler, to a file named from this prefix (session.end_profiling())
            so.enable_profiling, so.profile_file_prefix = True, profile
        try:
            self.session = ort.InferenceSession(model_path, so, providers=self.providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ModelRunError(f"onnxruntime cannot load {model_path}: {exc}") from None
        if self.providers[0] not in self.session.get_providers():  # onnxruntime falls back to the CPU, warning
            raise ProviderUnavailableError(missing_provider(self.providers[0], loaded=False))
        check_graph_names(spec, self.session)
        if logits not in LOGITS_PLACES:
            raise ValueError(f"logits must be one of {', '.join(LOGITS_PLACES)}, got {logits!r}")
        self.layout = KVLayout.of(spec, self.device)
        self.logits_on_device = logits == "device" or (logits == "auto" and self.device != "cpu")
        self._topk = ort.InferenceSession(topk_graph(ELEM[spec.dtype]), session_options(1, thread_pool),
                                          providers=self.providers) if self.logits_on_device else None
        # the token id of each logits column (a vocab-subset draft's cover its id ranges in order)
        self.columns = Columns([tuple(r) for r in spec.vocab_subset["ranges"]] if spec.vocab_subset else None,
                               spec.output_vocab)
        self.own_buffers()
        # The graph's own TopK over each kept row (bundles exported with it): a decoding pass then brings back
        # each row's ``top_k`` largest entries too, and the sampling rules read those instead of the row.
        # "host" asks for whole rows only (the graph is still told to find one entry: its input must be fed).
        self.top_rows = bool(spec.top_logits) and logits != "host"

    def twin(self) -> "Graph":
        """The same session (weights loaded once) with host buffers, row counts and run time of its own: another
        request's passes over another cache (CausalLM.twin). Twins run one pass at a time between them (a
        server's scheduler runs every request's rounds on one thread)."""
        twin = copy.copy(self)
        twin.own_buffers()
        return twin

    def own_buffers(self) -> None:
        """Host buffers, row counts and a run-time count of this graph's own (made at load; again for a twin)."""
        spec = self.spec
        self.row_counts = RowCounts()  # rows read through their top entries / device rows copied in full
        # what the rows of this graph's passes read besides the pass's buffers
        self.reading = RowReading(self.columns, spec.vocab_size, spec.output_vocab,
                                  spec.logits_norm["block"] if spec.logits_norm else None,
                                  self.device_top if self._topk is not None else None, self.row_counts)
        # host buffers of decoding passes, leased until the next round (``new_round``; HostSlots)
        self._slots = HostSlots(spec.vocab_size, NP_DTYPE[spec.dtype])
        self._last_slot: HostSlot | None = None  # the kept slot the last pass wrote (``release_rows``)
        self.run_time_s = 0.0  # time spent inside onnxruntime

    # -- what a call reads ---------------------------------------------------
    def lazy_reads(self, options: PassOptions) -> bool:
        """Whether a decoding round's rows under ``options`` come back other than as a whole float32 array."""
        return self.logits_on_device or (self.top_rows and bool(options.top_k))

    def new_round(self) -> None:
        """Nothing read from earlier passes' rows is read any more: their host buffers may be written again."""
        self._slots.new_round()
        self._last_slot = None

    def release_rows(self) -> None:
        """The last pass's rows are not read any more: the next pass may write the same buffer, still bound."""
        self._slots.give_back(self._last_slot)
        self._last_slot = None

    # -- one pass ----------------------------------------------------------
    def run(self, cache, ids: list[int], start: int, keep: int, options: PassOptions, reading: Reading):
        """One pass over ``ids`` at ``start`` on ``cache``; the logits rows of its last ``keep`` positions (float32,
        or DeviceRows / TopRows for a lazy reading). The cache's valid length is the caller's to advance."""
        if cache.kind == "static":
            return self._run_static(cache.bound(self.session), ids, start + len(ids), keep, options, reading)
        t0 = time.perf_counter()
        past = cache.trimmed(start)
        if not cache.host_trim:  # the device's trim graph: the model's time
            self.run_time_s += time.perf_counter() - t0
        logits, present = self._run_concat(ids, start, past, keep, options, reading)
        cache.store(present, start + len(ids))
        return logits

    def _run_static(self, sb: StaticBinding, ids: list[int], total: int, keep: int, options: PassOptions,
                    reading: Reading):
        """One call of a static graph: only ids, lengths and the output buffers are (re)bound."""
        spec = self.spec
        feed, rows = self._feed_small(sb, ids, total, keep)
        b = sb.io
        k = self.top_width(options, reading) if spec.top_logits else 0
        put = feed["put"]
        if k:
            put["top_k"][0] = k
        if spec.logits_norm:
            put["norm_scale"][0] = options.norm_scale  # (rounded to float32 as NumPy rounds it)
        on_device = reading.lazy and self.logits_on_device
        slot = self._host_slot(rows, k, on_device, reading.reuse)
        key = None if slot.serial is None else (slot.serial, rows, k)
        if key is None or feed["out"] != key or self.device != "cpu":  # else: the same buffers are still bound
            if on_device:
                value = ort.OrtValue.ortvalue_from_shape_and_type([1, rows, spec.vocab_size], NP_DTYPE[spec.dtype],
                                                                  self.device, 0)
                b.bind_ortvalue_output(spec.logits, value)
            elif key is not None:  # a kept slot: its values are made once per shape
                self._bind_slot(b, slot, rows, k)
            else:
                b.bind_output(spec.logits, "cpu", 0, NP_DTYPE[spec.dtype], [1, rows, spec.vocab_size],
                              slot.logits_at)
            if k and key is None:
                self._bind_top(b, slot, rows, k)
            feed["out"] = key
        self._execute(b)
        if on_device:
            # (the graph's own top entries where it has them and this request reads them: an earlier release's
            # graph has none, and DeviceRows then runs its own TopK)
            top = (slot.top_values[:rows * k].reshape(rows, k), slot.top_cols[:rows * k].reshape(rows, k), k) \
                if k and options.top_k else None
            return DeviceRows(self.reading, value, top=top)[rows - keep:]
        if reading.lazy:  # the graph's top entries of each row beside the rows
            return TopRows(self.reading, slot, rows, k, options.norm_scale, start=rows - keep)
        logits = slot.logits[:rows * spec.vocab_size].reshape(rows, spec.vocab_size)[rows - keep:]
        return logits if logits.dtype == np.float32 else logits.astype(np.float32)

    def _feed_small(self, sb: StaticBinding, ids: list[int], total: int, keep: int) -> tuple[dict, int]:
        """Write a pass's small inputs (ids, lengths, rows to keep) into host arrays bound to ``sb``; the number of
        logits rows the pass returns. On the CPU provider onnxruntime reads bound host inputs in place at run
        time, so an array is bound once (the ids again only when the pass length changes); on other devices
        binding copies the values, so every pass binds them again. The feed's "out" is the (slot, rows, k) of
        the logits buffer bound last."""
        spec = self.spec
        b, feed = sb.io, sb.feed
        bind = feed is None or self.device != "cpu"
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

    def _run_concat(self, ids: list[int], start: int, past: list, keep: int, options: PassOptions,
                    reading: Reading):
        spec, layout = self.spec, self.layout
        total = start + len(ids)
        b = self.session.io_binding()
        feeds = {spec.input_ids: np.asarray([ids], dtype=np.int64),
                 spec.attention_mask: np.ones((1, total), dtype=np.int64)}
        if spec.position_ids:
            feeds[spec.position_ids] = np.arange(start, total, dtype=np.int64)[None, :]
        for name, arr in feeds.items():
            b.bind_cpu_input(name, arr)
        rows = len(ids)
        if spec.logits_to_keep is not None:
            b.bind_cpu_input(spec.logits_to_keep, np.array([keep], dtype=np.int64))
            rows = keep
        for name, value in zip(layout.inputs, past):
            b.bind_ortvalue_input(name, value)
        b.bind_output(spec.logits, self.device if reading.lazy else "cpu", 0)
        for name in layout.outputs:
            b.bind_output(name, self.device, 0)
        k = self.top_width(options, reading) if spec.top_logits else 0
        top = None  # (an earlier release's graph has no top entries: DeviceRows then runs its own TopK)
        if k:  # bound last: outputs come back in bind order
            b.bind_cpu_input(spec.top_logits["k"], np.array([k], dtype=np.int64))
            if spec.logits_norm:
                b.bind_cpu_input(spec.logits_norm["scale"], np.array([options.norm_scale], dtype=np.float32))
            slot = self._host_slot(rows, k, True, reading.reuse)  # (top entries only: the logits stay put)
            self._bind_top(b, slot, rows, k)
            top = (slot.top_values.reshape(rows, k), slot.top_cols.reshape(rows, k), k)
        self._execute(b)
        out = b.get_outputs()
        present = list(out[1:1 + len(layout.outputs)])
        if reading.lazy:
            if self.logits_on_device:
                device = DeviceRows(self.reading, out[0], top=top if k and options.top_k else None)
                return device[len(device) - keep:], present
            host = out[0].numpy()[0].astype(np.float32).ravel()
            return TopRows(self.reading, HostSlot(host, slot.top_values, slot.top_cols, slot.norms), rows, k,
                           options.norm_scale, start=rows - keep), present
        logits = out[0].numpy()[0][-keep:]
        return logits.astype(np.float32), present

    # -- output binding ------------------------------------------------------
    def top_width(self, options: PassOptions, reading: Reading) -> int:
        """Top entries a pass brings back per row: ``top_k`` in decoding passes, else 1 (the graph's TopK input
        must be fed; one entry is the cheapest)."""
        return max(1, min(options.top_k if reading.lazy and self.top_rows else 1, self.spec.vocab_size))

    def _host_slot(self, rows: int, k: int, on_device: bool, reuse: bool) -> HostSlot:
        """Host arrays for a pass's outputs: top entries only for rows left on the device; a slot leased for the
        round for rows of a round (``reuse``); else arrays of the caller's own."""
        if on_device:
            return self._slots.one_off(rows, k, logits=False)
        if reuse:
            self._last_slot = self._slots.take(rows, k)
            return self._last_slot
        return self._slots.one_off(rows, k)

    def _bind_top(self, b, slot: HostSlot, rows: int, k: int) -> None:
        """Bind the graph's TopK outputs (and normalizers) to a slot's host arrays as [1, rows, k] ([1, rows])
        (copied there from any device)."""
        names = self.spec.top_logits
        b.bind_output(names["values"], "cpu", 0, np.float32, [1, rows, k], slot.values_at)
        b.bind_output(names["ids"], "cpu", 0, np.int64, [1, rows, k], slot.cols_at)
        if self.spec.logits_norm:
            b.bind_output(self.spec.logits_norm["norm"], "cpu", 0, np.float32, [1, rows], slot.norms_at)

    def _bind_slot(self, b, slot: HostSlot, rows: int, k: int) -> None:
        """Bind a kept slot's host arrays as the pass's logits, top entries and normalizers (``_bind_top``'s
        outputs, through values the slot keeps)."""
        logits, values, cols, norms = slot.outputs(rows, self.spec.vocab_size, k)
        b.bind_ortvalue_output(self.spec.logits, logits)
        if k:
            names = self.spec.top_logits
            b.bind_ortvalue_output(names["values"], values)
            b.bind_ortvalue_output(names["ids"], cols)
            if self.spec.logits_norm:
                b.bind_ortvalue_output(self.spec.logits_norm["norm"], norms)

    def _execute(self, b) -> None:
        """Run the bound graph, counting the time spent inside onnxruntime."""
        t0 = time.perf_counter()
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:
            raise ModelRunError(f"onnxruntime failed running {self.spec.path}: {exc}") from None
        finally:
            self.run_time_s += time.perf_counter() - t0

    def device_top(self, value, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(values, columns) [rows, k] of the ``k`` largest entries of each row of a device-resident logits value
        [1, rows, width], found by a TopK graph on the device (its time counted as the model's)."""
        b = self._topk.io_binding()
        b.bind_ortvalue_input("logits", value)
        b.bind_cpu_input("k", np.array([k], dtype=np.int64))
        b.bind_output("values", "cpu")
        b.bind_output("indices", "cpu")
        t0 = time.perf_counter()
        self._topk.run_with_iobinding(b)
        self.run_time_s += time.perf_counter() - t0
        values, cols = (v.numpy()[0] for v in b.get_outputs())
        return values, cols

    def new_cache(self, trim: str, thread_pool: str):
        """An empty KV cache of this graph's kind."""
        if self.spec.kv_cache == "static":
            spec = self.spec
            return StaticCache(self.layout, spec.max_positions - spec.kv_headroom, headroom=spec.kv_headroom)
        return GrowingCache.for_layout(self.layout, trim, thread_pool, self.providers)


def check_graph_names(spec: ModelSpec, session) -> None:
    """The inputs and outputs the manifest names are the graph's; BundleError naming the missing otherwise."""
    inputs = {i.name for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    need_in = [spec.input_ids] + [n for p in spec.kv_inputs for n in p]
    if spec.logits_to_keep:
        need_in.append(spec.logits_to_keep)
    need_in += [spec.seqlens_k, spec.total_sequence_length] if spec.kv_cache == "static" else [spec.attention_mask]
    if spec.position_ids:
        need_in.append(spec.position_ids)
    need_out = [spec.logits] + [n for p in spec.kv_outputs for n in p]
    if spec.top_logits:
        need_in.append(spec.top_logits["k"])
        need_out += [spec.top_logits["values"], spec.top_logits["ids"]]
    if spec.logits_norm:
        need_in.append(spec.logits_norm["scale"])
        need_out.append(spec.logits_norm["norm"])
    missing = [n for n in need_in if n not in inputs] + [n for n in need_out if n not in outputs]
    if missing:
        raise BundleError(f"{spec.path} lacks the inputs/outputs the manifest names: {missing[:4]}; "
                          "the manifest does not describe this graph, re-export the bundle")


def _flat_view(arr: np.ndarray) -> memoryview:
    """A C-contiguous array's memory as a flat memoryview of its items (writes land in the array)."""
    return memoryview(arr).cast("B").cast(arr.dtype.char)
