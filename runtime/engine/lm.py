"""CausalLM: one exported graph — its onnxruntime session, IO binding, KV cache (cache.py), host buffers and rows."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from ..bundle import ModelSpec
from ..errors import BundleError, CacheOverflowError, ModelRunError, ProviderUnavailableError
from .cache import ELEM, NP_DTYPE, GrowingCache, StaticCache
from .graphs import topk_graph
from .rows import Columns, DeviceRows, RowCounts, RowReading, TopRows
from .session import LOGITS_PLACES, missing_provider, ort, providers_for, session_options
from .slots import HostSlot, HostSlots


class CausalLM:
    """Owns one model: session, IO binding, device-resident KV cache (``cache``: StaticCache or GrowingCache),
    the tokens it holds (valid length), and the host buffers its passes write."""

    # positions per pass when feeding a long prompt: activations stay bounded. On a 2,000-token prompt to
    # Qwen2.5-1.5B INT4 (target alone), passes of 512 / 256 / 128 peaked at +964 / +558 / +360 MB over a
    # 200-token prompt, with time to first token 44.1 / 39.2 / 36.0 s (fp32 target: 34.2 s at 512, 26.8 at 128)
    CHUNK = 128
    # onnxruntime's CPU kernels compute a row that is alone in its tile of rows on another path, with
    # other rounding: any one-position pass, and (GroupQueryAttention with head size 16) the last row of
    # a pass of 32k + 1 positions; with weights in blocks of 64 or more (ModelSpec.row_tile: 2) the last
    # row of every pass of odd size. Bitwise passes never have row_tile * k + 1 positions (nor the output
    # layer as many rows); every other size gives each position the same bits (measured; `ortspec verify`
    # checks it on the machine at hand). ROW_TILE is the tile of graphs without long blocks.
    ROW_TILE = 32

    def __init__(self, spec: ModelSpec, model_path: str, provider: str = "cpu",
                 threads: int | None = None, trim: str = "auto", thread_pool: str = "session",
                 logits: str = "auto", profile: str | None = None):
        self.spec = spec
        # the token id of each logits column (a vocab-subset draft's cover its id ranges in order)
        self.columns = Columns([tuple(r) for r in spec.vocab_subset["ranges"]] if spec.vocab_subset else None,
                               spec.output_vocab)
        self.provider = provider
        self.device = "cuda" if provider == "cuda" else "cpu"
        providers = providers_for(provider)
        so = session_options(threads, thread_pool)
        if profile:  # onnxruntime's profiler, to a file named from this prefix (session.end_profiling())
            so.enable_profiling, so.profile_file_prefix = True, profile
        try:
            self.session = ort.InferenceSession(model_path, so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ModelRunError(f"onnxruntime cannot load {model_path}: {exc}") from None
        if providers[0] not in self.session.get_providers():  # onnxruntime falls back to the CPU with a warning
            raise ProviderUnavailableError(missing_provider(providers[0], loaded=False))
        self._check_graph_names()
        if trim not in ("auto", "graph", "host"):
            raise ValueError(f"trim must be 'auto', 'graph' or 'host', got {trim!r}")
        if trim == "host" and self.device != "cpu":
            raise ValueError("trim='host' needs the CPU provider; the cache of a GPU session lives on the GPU")
        if logits not in LOGITS_PLACES:
            raise ValueError(f"logits must be one of {', '.join(LOGITS_PLACES)}, got {logits!r}")
        # Where the rows a decoding round reads stay: "device" keeps them where the graph wrote them and the host
        # reads only the largest entries of each row (DeviceRows); "host" copies every kept row. auto: device on
        # a GPU, host on the CPU provider (there host memory is the device, and numpy reads rows in place).
        self.logits_on_device = logits == "device" or (logits == "auto" and self.device != "cpu")
        self._topk = ort.InferenceSession(topk_graph(ELEM[spec.dtype]), session_options(1, thread_pool),
                                          providers=providers) if self.logits_on_device else None
        self.row_counts = RowCounts()  # rows read through their top entries / device rows copied in full
        # what the rows of this model's passes read besides the pass's buffers
        self.reading = RowReading(self.columns, spec.vocab_size, spec.output_vocab,
                                  spec.logits_norm["block"] if spec.logits_norm else None,
                                  self.device_top if self._topk is not None else None, self.row_counts)
        # The graph's own TopK over each kept row (bundles exported with it): a decoding pass then brings back
        # each row's ``top_k`` largest entries too, and the sampling rules read those instead of the row.
        # "host" asks for whole rows only (the graph is still told to find one entry: its input must be fed).
        self.top_rows = bool(spec.top_logits) and logits != "host"
        self.top_k = 0          # entries per kept row decoding passes bring back (0: none; set per request)
        self.norm_scale = 0.0   # the graph's normalizer scale (1 / temperature; 0: not read; set per request)
        self.kv_inputs = [n for pair in spec.kv_inputs for n in pair]
        self.kv_outputs = [n for pair in spec.kv_outputs for n in pair]
        self.cache = StaticCache(self) if spec.kv_cache == "static" else \
            GrowingCache.for_model(self, trim, thread_pool, providers)
        # host buffers of decoding passes, leased until the next round (``new_round``; HostSlots)
        self._slots = HostSlots(spec.vocab_size, NP_DTYPE[spec.dtype])
        self._last_slot: HostSlot | None = None  # the kept slot the last pass wrote (``release_rows``)
        self._reuse = False   # set by forward(reuse=True): this feed's rows may live in a leased slot
        # Bitwise passes (see ROW_TILE): a position's logits and K/V are then the same bits whatever else
        # shares its pass. The generator sets it per request.
        self.bitwise = False
        self.row_tile = spec.row_tile
        self.progress = None  # called as progress(done, total) after each pass of a feed longer than one pass
        self._lazy = False    # set by forward_rows: the next feed's kept rows may stay on the device
        self.run_time_s = 0.0
        self.reset()

    # -- state ------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything fed so far (valid length 0)."""
        self.cache.clear()
        self.tokens: list[int] = []
        self.canonical_length = 0  # leading positions whose K/V all came from rows on their tile's path

    @property
    def static(self) -> bool:
        """Whether the cache is a static one (fixed buffers bound in place)."""
        return self.cache.kind == "static"

    def reserve(self, positions: int) -> None:
        """Make room for ``positions`` (a static cache grows, keeping the valid prefix)."""
        self.cache.reserve(positions)

    @property
    def length(self) -> int:
        """Valid cache length: how many tokens this model has been fed and keeps."""
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return self.spec.max_positions

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` fed tokens. Never runs the model."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback length must be in [0, {self.length}], got {length}")
        del self.tokens[length:]
        self.canonical_length = min(self.canonical_length, length)

    def can_share(self, source: "CausalLM") -> bool:
        """Whether this model can run on ``source``'s KV buffers (``share_cache``): both static caches on one
        device with one layout."""
        return self.static and self.cache.can_share(source.cache)

    def share_cache(self, source: "CausalLM") -> None:
        """Run on ``source``'s KV buffers instead of buffers of its own: a self-draft (the target's weights
        quantized, so the same layers' keys and values) over its target's cache. The draft then reads the
        target's keys and values for everything the target has verified — it never reads the prompt, and it
        drafts from the better model's cache — and nothing is copied: its valid prefix is set by ``follow``.

        Why sharing is safe: the draft writes only at positions from the target's valid length on (``follow``
        never sets a longer prefix), and the target's next pass writes its own keys and values at every
        position it reads beyond its valid length before reading them; positions past a valid length are
        never read (rollback by length). So the target never reads the draft's keys and values.
        """
        if not self.can_share(source):
            raise ValueError("share_cache needs two static caches on one device with the same layers, KV heads, "
                             "head size and dtype")
        self.cache.share(source.cache)

    def follow(self, length: int) -> None:
        """A model sharing another's cache (``share_cache``): its valid prefix becomes the owner's first
        ``length`` tokens, whose keys and values the owner computed."""
        owner = self.cache.owner.lm if self.cache.owner is not None else None
        if owner is None or not 0 <= length <= owner.length:
            raise ValueError(f"follow: {length} positions are not all in a shared cache's owner")
        self.tokens = owner.tokens[:length]
        self.canonical_length = 0  # (meaningful for targets only)

    def prefill(self, ids: Sequence[int], keep: int | None = None) -> np.ndarray:
        self.reset()
        return self.forward(ids, keep)

    # -- running ----------------------------------------------------------
    def forward(self, ids: Sequence[int], keep: int | None = None, reuse: bool = False) -> np.ndarray:
        """Feed ``ids`` after the valid cache; return float32 logits [keep, vocab] of the last ``keep`` of them
        (of all of them when ``keep`` is None). They are the caller's own arrays, except with ``reuse``: then
        they may be a host buffer this model writes again after its next ``new_round`` (decoding rounds, and
        loops that time passes as rounds run them: no fresh memory per pass).

        Long feeds run in passes of at most ``CHUNK`` positions. With ``bitwise`` set, a feed whose pass
        would have row_tile * k + 1 positions (a single token, typically; with a tile of 2, any odd number)
        re-feeds the cached token before it (its K/V come out bit for bit the same) or, with nothing cached,
        appends a throwaway position that stays outside the valid length.
        """
        ids = [int(t) for t in ids]
        n = len(ids)
        if not n:
            raise ValueError("forward needs at least one token")
        keep = n if keep is None else int(keep)
        if not 1 <= keep <= n:
            raise ValueError(f"keep must be in [1, {n}], got {keep}")
        start = self.length
        lead = pad = 0
        # (CHUNK is a multiple of the tile, so then no pass of the feed has row_tile * k + 1 positions either)
        if self.bitwise and n % self.row_tile == 1:
            lead, pad = (1, 0) if start else (0, 1)
        if start + n + pad > self.capacity:
            raise CacheOverflowError(
                f"{start + n} positions exceed the model's maximum of {self.capacity}; "
                "shorten the prompt or lower max_new_tokens")
        first = start - lead
        feed = self.tokens[first:start] + ids + ids[-1:] * pad
        self.reserve(first + len(feed))
        self._reuse = reuse
        try:
            rows = self._feed(feed, first, keep + pad)
        finally:
            self._reuse = False
        # Commit only after every pass succeeded (a failed run leaves the valid prefix as it was).
        self.tokens[start:] = ids
        return rows[:keep] if pad else rows

    def forward_rows(self, ids: Sequence[int], keep: int | None = None):
        """``forward`` for a decoding round: with logits kept on the device, the rows come back as DeviceRows
        (only what the sampling rules read reaches the host); with the graph's top entries asked for
        (``top_k``), as TopRows; otherwise as the float32 array of ``forward``. The rows are read in place: they
        stay valid until this model's next ``new_round``."""
        if not self.logits_on_device and not (self.top_rows and self.top_k):
            return self.forward(ids, keep, reuse=True)
        self._lazy = True
        try:
            return self.forward(ids, keep, reuse=True)
        finally:
            self._lazy = False

    def new_round(self) -> None:
        """A decoding round begins: nothing read from earlier passes' rows (``forward_rows``) is read any more,
        so their host buffers may be written again."""
        self._slots.new_round()
        self._last_slot = None

    def release_rows(self) -> None:
        """The last pass's rows are not read any more (a greedy draft step read its token): the next pass may
        write the same buffer, still bound."""
        self._slots.give_back(self._last_slot)
        self._last_slot = None

    def reference_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits of a fresh prefill of ``ids`` (same passes and kernels), leaving the cache untouched."""
        ids = [int(t) for t in ids]
        saved = (self.tokens, self.canonical_length, self.cache)
        try:
            self.tokens, self.canonical_length = [], 0
            self.cache = self.cache.fresh(len(ids) + 1)  # buffers of its own, even where the cache is shared
            return self.forward(ids)
        finally:
            self.tokens, self.canonical_length, self.cache = saved

    def _feed(self, feed: list[int], first: int, rows: int) -> np.ndarray:
        """Run ``feed`` from position ``first`` in passes; logits of its last ``rows`` positions."""
        n = len(feed)
        tile = self.row_tile if self.bitwise else 0
        if n <= self.CHUNK:  # one pass (every decoding round)
            kept = min(rows, n)
            if tile and kept % tile == 1:
                kept += 1  # the output layer avoids a lone row too
            logits = self._pass(feed, first, min(n, kept))
            return logits if kept == rows else logits[-rows:]
        bounds = pass_bounds(n, self.CHUNK, tile)
        out = []
        for a, b in zip(bounds, bounds[1:]):
            want = max(0, b - max(a, n - rows))  # rows of this pass the caller asked for
            kept = max(want, 1)
            if tile and kept % tile == 1:
                kept += 1  # the output layer avoids a lone row too
            logits = self._pass(feed[a:b], first + a, min(b - a, kept))
            if want:
                out.append(logits[-want:])
            else:
                self.release_rows()  # a pass run only for its keys and values: nobody reads its row
            if self.progress is not None and len(bounds) > 2:
                self.progress(b, n)
        if len(out) == 1:
            return out[0]
        return np.concatenate([o.numpy() if isinstance(o, (DeviceRows, TopRows)) else o for o in out])

    def _pass(self, ids: list[int], start: int, keep: int) -> np.ndarray:
        """One graph run over ``ids`` at ``start``; float32 logits of its last ``keep`` positions."""
        logits = self.cache.run(ids, start, keep)
        if len(ids) % self.row_tile != 1:  # (every row of the pass took the path of its tile)
            if start <= self.canonical_length:
                self.canonical_length = start + len(ids)
        else:
            self.canonical_length = min(self.canonical_length, start)
        if isinstance(logits, (DeviceRows, TopRows)):
            return logits
        return self.widen(logits)

    def widen(self, logits: np.ndarray) -> np.ndarray:
        """Rows of the graph's width as rows over the whole vocabulary (``Columns.widen``)."""
        return self.columns.widen(logits)

    def token_ids(self, cols: np.ndarray) -> np.ndarray:
        """Token ids of logits columns (``Columns.token_ids``)."""
        return self.columns.token_ids(cols)

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

    @property
    def rows_read(self) -> int:
        """Rows of this model's passes read through their largest entries."""
        return self.row_counts.read

    @rows_read.setter
    def rows_read(self, value: int) -> None:
        self.row_counts.read = value

    @property
    def rows_copied(self) -> int:
        """Device-resident rows copied to the host in full."""
        return self.row_counts.copied

    @rows_copied.setter
    def rows_copied(self, value: int) -> None:
        self.row_counts.copied = value

    # -- what a cache's pass asks of its model --------------------------------
    def rows_on_device(self) -> bool:
        """This pass's rows stay on the device (DeviceRows)."""
        return self._lazy and self.logits_on_device

    def rows_with_top(self) -> bool:
        """This pass's rows go out as rows with their largest entries (TopRows or DeviceRows)."""
        return self._lazy

    def host_slot(self, rows: int, k: int, on_device: bool) -> HostSlot:
        """Host arrays for a pass's outputs: top entries only for rows left on the device; a slot leased for the
        round for rows of a round (``forward(reuse=True)``); else arrays of the caller's own."""
        if on_device:
            return self._slots.one_off(rows, k, logits=False)
        if self._reuse:
            self._last_slot = self._slots.take(rows, k)
            return self._last_slot
        return self._slots.one_off(rows, k)

    def bind_keep(self, b, n: int, keep: int) -> int:
        """Bind logits_to_keep when the graph has it; the number of logits rows the run returns."""
        if self.spec.logits_to_keep is None:
            return n
        b.bind_cpu_input(self.spec.logits_to_keep, np.array([keep], dtype=np.int64))
        return keep

    def execute(self, b) -> None:
        """Run the bound graph, counting the time spent inside onnxruntime."""
        t0 = time.perf_counter()
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:
            raise ModelRunError(f"onnxruntime failed running {self.spec.path}: {exc}") from None
        finally:
            self.run_time_s += time.perf_counter() - t0

    def top_width(self) -> int:
        """Top entries the next pass brings back per row: ``top_k`` in decoding passes, else 1 (the graph's
        TopK input must be fed; one entry is the cheapest)."""
        return max(1, min(self.top_k if self._lazy and self.top_rows else 1, self.spec.vocab_size))

    def bind_top(self, b, slot: HostSlot, rows: int, k: int) -> None:
        """Bind the graph's TopK outputs (and normalizers) to a slot's host arrays as [1, rows, k] ([1, rows])
        (copied there from any device)."""
        names = self.spec.top_logits
        b.bind_output(names["values"], "cpu", 0, np.float32, [1, rows, k], slot.values_at)
        b.bind_output(names["ids"], "cpu", 0, np.int64, [1, rows, k], slot.cols_at)
        if self.spec.logits_norm:
            b.bind_output(self.spec.logits_norm["norm"], "cpu", 0, np.float32, [1, rows], slot.norms_at)

    def bind_slot(self, b, slot: HostSlot, rows: int, k: int) -> None:
        """Bind a kept slot's host arrays as the pass's logits, top entries and normalizers (``bind_top``'s
        outputs, through values the slot keeps)."""
        logits, values, cols, norms = slot.outputs(rows, self.spec.vocab_size, k)
        b.bind_ortvalue_output(self.spec.logits, logits)
        if k:
            names = self.spec.top_logits
            b.bind_ortvalue_output(names["values"], values)
            b.bind_ortvalue_output(names["ids"], cols)
            if self.spec.logits_norm:
                b.bind_ortvalue_output(self.spec.logits_norm["norm"], norms)

    def _check_graph_names(self) -> None:
        spec = self.spec
        inputs = {i.name for i in self.session.get_inputs()}
        outputs = {o.name for o in self.session.get_outputs()}
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


def pass_bounds(n: int, size: int, tile: int = 0) -> list[int]:
    """Offsets splitting ``n`` positions into passes of at most ``size`` (a multiple of ``tile``); with a
    ``tile``, a last pass of tile * k + 1 positions borrows one from the pass before it."""
    bounds = list(range(0, n, size)) + [n]
    if tile and len(bounds) > 2 and (n - bounds[-2]) % tile == 1:
        bounds[-2] -= 1
    return bounds
