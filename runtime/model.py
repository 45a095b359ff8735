"""CausalLM: one exported graph, its onnxruntime session, IO binding and KV cache.

Cache design (DESIGN-level note). Two graph kinds exist.

*static* (the fused graphs ortspec builds): every layer's past and present
K/V are one fixed-capacity buffer [1, kv_heads, capacity, head_dim], allocated
once on the execution provider's device and bound through IO binding as both
input and output; the graph writes the new positions in place and reads the
first ``total_sequence_length`` positions. The valid length is an integer
passed to the graph each call, so ``rollback(n)`` is only a smaller number:
no copy, no host round trip, nothing re-run. Capacity grows (one copy) only
when a request needs more positions than any before it.

*concat* (optimum's ``text-generation-with-past`` export): each layer takes ``past`` K/V tensors of
shape [1, kv_heads, past_len, head_dim] and returns ``present`` tensors of
length past_len + fed. The cache is therefore the list of ``present`` OrtValues
of the last run, kept on the execution provider's device and bound back as the
next run's ``past`` inputs through IO binding; no K/V byte crosses to the host.
``valid length`` is an integer. ``rollback(n)`` only lowers it; the tensors
are trimmed to ``n`` lazily, right before the next run. On a device (CUDA) the
trim is a tiny Slice graph run on that device, one run for all layers, so the
cache never crosses to the host. On the CPU provider host memory *is* the
device, and the same trim is a NumPy slice of the OrtValues' own buffers
(``trim="graph"`` forces the device path there too; the tests run both).
Rolling back never re-runs the model. Only the logits the sampler needs are
bound to host memory.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Sequence

import numpy as np

try:
    import onnxruntime as ort
except ImportError as exc:  # the base install leaves the choice of build to an extra
    raise ImportError("ortspec needs onnxruntime, which is not installed: pip install 'ortspec[cpu]' for the CPU, "
                      "or 'ortspec[cuda]' for NVIDIA GPUs (one of the two, never both)") from exc

from .bundle import ModelSpec
from .errors import CacheOverflowError, ModelRunError, ProviderUnavailableError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
LOGITS_PLACES = ("auto", "host", "device")
_ELEM = {"float32": 1, "float16": 10}
_NP = {"float32": np.float32, "float16": np.float16}


THREAD_POOLS = ("session", "shared")
_shared_pool_threads: int | None = None  # size of onnxruntime's process-wide pool once created here


def _shared_pool(threads: int | None) -> None:
    """Create onnxruntime's process-wide intra-op pool on first use (later sizes are ignored)."""
    global _shared_pool_threads
    if _shared_pool_threads is None:
        try:
            from onnxruntime.capi import _pybind_state
            _pybind_state.set_global_thread_pool_sizes(int(threads or 0), 1)
        except Exception:
            pass  # created already (by another library): sessions simply join it
        _shared_pool_threads = int(threads or 0)


def check_thread_pool(value) -> None:
    if value not in THREAD_POOLS:
        raise ValueError(f"thread_pool must be 'session' or 'shared', got {value!r}")


def shared_thread_pool_active() -> bool:
    return _shared_pool_threads is not None


def session_options(threads: int | None, thread_pool: str = "session") -> ort.SessionOptions:
    """Options for one graph's session.

    thread_pool "session" (onnxruntime's default): a pool of ``threads`` intra-op
    threads (None: one per physical core) for this session alone. "shared": every
    session on onnxruntime's one process-wide pool. The draft and the target
    alternate many times per token; with a pool each, every step on 2 cores ran
    about 2x slower while the two alternated than in a loop of its own (4 draft
    steps + one 5-token verify of SmolLM2: 79-89 ms; 39-42 ms on one shared
    pool). Once the shared pool exists, onnxruntime requires *every* later
    session of the process to use it.
    """
    check_thread_pool(thread_pool)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # Denormal floats (e.g. attention weights that underflow in a sharp softmax) run on a slow path of the
    # CPU: flushing them to zero took 7-8% off SmolLM2 steps (pool per session; up to 25% on one graph
    # variant). Both decoding paths run the same sessions, so exactness is untouched.
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    if thread_pool == "shared":
        _shared_pool(threads)
        so.use_per_session_threads = False
        return so
    if _shared_pool_threads is not None:
        raise ValueError("this process already runs onnxruntime on its shared thread pool, and onnxruntime then "
                         "refuses sessions with threads of their own: load with thread_pool='shared'")
    if threads:
        so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    # With a pool per session, threads still spinning in the idle session would steal time from the running
    # one (20-60% per step measured on 2 cores), yet no spinning at all slows every step's hand-offs between
    # threads. Spinning during a run, stopped as soon as the run returns, measured best (SmolLM2 pair, γ=4,
    # tools/pool_cost.py: 28.8 tok/s, against 26.9 without spinning and 28.6 on the shared pool).
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


GPU_INSTALL = "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'ortspec[cuda]'"


def installed_builds() -> list[str]:
    """The onnxruntime distributions installed (they all provide the one `onnxruntime` package)."""
    from importlib import metadata
    found = []
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.distribution(name)
            found.append(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def providers_for(provider: str) -> list:
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be 'cpu' or 'cuda', got {provider!r}")
    name = PROVIDERS[provider]
    if name not in ort.get_available_providers():
        raise ProviderUnavailableError(_missing_provider(name))
    return [name] if provider == "cpu" else [name, "CPUExecutionProvider"]


def _missing_provider(name: str, loaded: bool = True) -> str:
    """What to do when onnxruntime cannot run ``name``: the fix depends on which builds are installed."""
    builds = installed_builds()
    here = f"onnxruntime {ort.__version__} ({' + '.join(builds) or 'unknown build'})"
    if name != PROVIDERS["cuda"]:
        return f"{here} has no {name}"
    if len(builds) > 1:
        return (f"{here}: both builds are installed and overwrite each other's files, so which one runs is "
                f"accidental; keep only the GPU build: {GPU_INSTALL}")
    if "onnxruntime-gpu" not in builds or loaded:
        return (f"{here} has no CUDAExecutionProvider (available: {', '.join(ort.get_available_providers())}); "
                f"install the GPU build in place of the CPU one: {GPU_INSTALL}; or use provider='cpu'")
    return (f"{here} offers CUDA but could not start it (missing or mismatched CUDA/cuDNN libraries: onnxruntime-gpu "
            "1.31+ needs CUDA 13 and cuDNN 9; its log above names the library); or use provider='cpu'")


class CausalLM:
    """Owns one model: session, IO binding, device-resident KV cache, valid length."""

    RESERVE_STEP = 256  # static caches grow in multiples of this many positions
    # positions per pass when feeding a long prompt: activations stay bounded. On a 2,000-token prompt to
    # Qwen2.5-1.5B INT4 (target alone), passes of 512 / 256 / 128 peaked at +964 / +558 / +360 MB over a
    # 200-token prompt, with time to first token 44.1 / 39.2 / 36.0 s (fp32 target: 34.2 s at 512, 26.8 at 128)
    CHUNK = 128
    HOST_ROWS = 64      # logits rows of a reusable host buffer; a larger request gets a temporary one
    HOST_BUFFERS = 3    # reusable host buffers (a returned array keeps its buffer out of use while it lives)
    TOP_MAX = 272       # top entries per row a reusable buffer holds (the pipelines read at most 256 + 16)
    # onnxruntime's CPU kernels compute a row that is alone in its tile of rows on another path, with
    # other rounding: any one-position pass, and (GroupQueryAttention with head size 16) the last row of
    # a pass of 32k + 1 positions. Bitwise passes never have ROW_TILE * k + 1 positions (nor the output
    # layer as many rows); every other size gives each position the same bits (measured; `ortspec verify`
    # checks it on the machine at hand).
    ROW_TILE = 32

    def __init__(self, spec: ModelSpec, model_path: str, provider: str = "cpu",
                 threads: int | None = None, trim: str = "auto", thread_pool: str = "session",
                 logits: str = "auto"):
        self.spec = spec
        self._subset = [tuple(r) for r in spec.vocab_subset["ranges"]] if spec.vocab_subset else None
        self._columns = None  # token id of each logits column (vocab-subset drafts), built on first use
        self.provider = provider
        self.device = "cuda" if provider == "cuda" else "cpu"
        providers = providers_for(provider)
        so = session_options(threads, thread_pool)
        try:
            self.session = ort.InferenceSession(model_path, so, providers=providers)
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise ModelRunError(f"onnxruntime cannot load {model_path}: {exc}") from None
        if providers[0] not in self.session.get_providers():  # onnxruntime falls back to the CPU with a warning
            raise ProviderUnavailableError(_missing_provider(providers[0], loaded=False))
        self._check_graph_names()
        if trim not in ("auto", "graph", "host"):
            raise ValueError(f"trim must be 'auto', 'graph' or 'host', got {trim!r}")
        if trim == "host" and self.device != "cpu":
            raise ValueError("trim='host' needs the CPU provider; the cache of a GPU session lives on the GPU")
        self._host_trim = trim == "host" or (trim == "auto" and self.device == "cpu")
        needs_trimmer = spec.kv_cache == "concat" and not self._host_trim
        self._trimmer = None if not needs_trimmer else ort.InferenceSession(
            kv_trim_graph(2 * spec.num_layers, _ELEM[spec.dtype]), session_options(1, thread_pool), providers=providers)
        if logits not in LOGITS_PLACES:
            raise ValueError(f"logits must be one of {', '.join(LOGITS_PLACES)}, got {logits!r}")
        # Where the rows a decoding round reads stay: "device" keeps them where the graph wrote them and the host
        # reads only the largest entries of each row (DeviceRows); "host" copies every kept row. auto: device on
        # a GPU, host on the CPU provider (there host memory is the device, and numpy reads rows in place).
        self.logits_on_device = logits == "device" or (logits == "auto" and self.device != "cpu")
        self._topk = ort.InferenceSession(topk_graph(_ELEM[spec.dtype]), session_options(1, thread_pool),
                                          providers=providers) if self.logits_on_device else None
        self.rows_read = self.rows_copied = 0  # device rows: read through their top entries / copied in full
        # The graph's own TopK over each kept row (bundles exported with it): a decoding pass then brings back
        # each row's ``top_k`` largest entries too, and the sampling rules read those instead of the row.
        # "host" asks for whole rows only (the graph is still told to find one entry: its input must be fed).
        self.top_rows = bool(spec.top_logits) and logits != "host"
        self.top_k = 0          # entries per kept row decoding passes bring back (0: none; set per request)
        self.norm_scale = 0.0   # the graph's normalizer scale (1 / temperature; 0: not read; set per request)
        self._kv_in = [n for pair in spec.kv_inputs for n in pair]
        self._kv_out = [n for pair in spec.kv_outputs for n in pair]
        self.static = spec.kv_cache == "static"
        self._empty = self._buffers(0)
        self._past: list = list(self._empty)   # static: the shared buffers; concat: last presents
        self._stored = 0                       # concat: positions held; static: buffer capacity
        self._binding = None                   # static: IO binding with the KV buffers already bound
        self._cache_owner: CausalLM | None = None  # share_cache: the model whose KV buffers this one runs on
        self._host: list[tuple] = []           # reusable host slots: logits, top values, top columns (_slot)
        # Bitwise passes (see ROW_TILE): a position's logits and K/V are then the same bits whatever else
        # shares its pass. The generator sets it per request.
        self.bitwise = False
        self.progress = None  # called as progress(done, total) after each pass of a feed longer than one pass
        self._lazy = False    # set by forward_rows: the next feed's kept rows may stay on the device
        self.run_time_s = 0.0
        self.reset()

    # -- state ------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything fed so far (valid length 0)."""
        if not self.static:
            self._past, self._stored = list(self._empty), 0
        self.tokens: list[int] = []
        self.canonical_length = 0  # leading positions whose K/V all came from passes of >= 2 positions

    def _buffers(self, positions: int) -> list:
        shape = [1, self.spec.num_kv_heads, positions, self.spec.head_dim]
        return [ort.OrtValue.ortvalue_from_shape_and_type(shape, _NP[self.spec.dtype], self.device, 0)
                for _ in self._kv_in]

    def reserve(self, positions: int) -> None:
        """Static cache: make room for ``positions`` (rounded up), keeping the valid prefix."""
        if self._cache_owner is not None:  # the owner's buffers grow (the owner keeps its valid prefix)
            self._cache_owner.reserve(positions)
            self._follow_owner()
            return
        if not self.static or positions <= self._stored:
            return
        step = self.RESERVE_STEP
        size = min(self.capacity, -(-positions // step) * step)
        if not self.length:
            self._past, self._stored, self._binding = self._buffers(size), size, None
            return
        fresh = []  # rare: one copy of the valid prefix (through the host on a GPU)
        for old in self._past:
            data = np.zeros((1, self.spec.num_kv_heads, size, self.spec.head_dim), _NP[self.spec.dtype])
            data[:, :, :self.length] = old.numpy()[:, :, :self.length]
            fresh.append(ort.OrtValue.ortvalue_from_numpy(data, self.device, 0))
        self._past, self._stored = fresh, size
        self._binding = None  # rebind the new buffers on the next call

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
        a, b = self.spec, source.spec
        return (self.static and source.static and self.device == source.device
                and (a.num_layers, a.num_kv_heads, a.head_dim, a.dtype) == (b.num_layers, b.num_kv_heads,
                                                                            b.head_dim, b.dtype))

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
        self._cache_owner = source
        self._past, self._stored, self._binding = list(self._empty), 0, None
        self._follow_owner()

    def _follow_owner(self) -> None:
        """A model sharing another's cache binds that model's current buffers (which ``reserve`` may replace)."""
        owner = self._cache_owner
        if owner is not None and self._past is not owner._past:
            self._past, self._stored, self._binding = owner._past, owner._stored, None

    def follow(self, length: int) -> None:
        """A model sharing another's cache (``share_cache``): its valid prefix becomes the owner's first
        ``length`` tokens, whose keys and values the owner computed."""
        owner = self._cache_owner
        if owner is None or not 0 <= length <= owner.length:
            raise ValueError(f"follow: {length} positions are not all in a shared cache's owner")
        self.tokens = owner.tokens[:length]
        self.canonical_length = 0  # (meaningful for targets only)

    def prefill(self, ids: Sequence[int], keep: int | None = None) -> np.ndarray:
        self.reset()
        return self.forward(ids, keep)

    # -- running ----------------------------------------------------------
    def forward(self, ids: Sequence[int], keep: int | None = None) -> np.ndarray:
        """Feed ``ids`` after the valid cache; return float32 logits [keep, vocab] of the last ``keep`` of them
        (of all of them when ``keep`` is None).

        Long feeds run in passes of at most ``CHUNK`` positions. With ``bitwise`` set, a feed whose pass
        would have ROW_TILE * k + 1 positions (a single token, typically) re-feeds the cached token before
        it (its K/V come out bit for bit the same) or, with nothing cached, appends a throwaway position
        that stays outside the valid length.
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
        if self.bitwise and n <= self.CHUNK and n % self.ROW_TILE == 1:
            lead, pad = (1, 0) if start else (0, 1)
        if start + n + pad > self.capacity:
            raise CacheOverflowError(
                f"{start + n} positions exceed the model's maximum of {self.capacity}; "
                "shorten the prompt or lower max_new_tokens")
        first = start - lead
        feed = self.tokens[first:start] + ids + ids[-1:] * pad
        self.reserve(first + len(feed))
        rows = self._feed(feed, first, keep + pad)
        # Commit only after every pass succeeded (a failed run leaves the valid prefix as it was).
        self.tokens[start:] = ids
        return rows[:keep] if pad else rows

    def forward_rows(self, ids: Sequence[int], keep: int | None = None):
        """``forward`` for a decoding round: with logits kept on the device, the rows come back as DeviceRows
        (only what the sampling rules read reaches the host); with the graph's top entries asked for
        (``top_k``), as TopRows; otherwise as the float32 array of ``forward``."""
        if not self.logits_on_device and not (self.top_rows and self.top_k):
            return self.forward(ids, keep)
        self._lazy = True
        try:
            return self.forward(ids, keep)
        finally:
            self._lazy = False

    def reference_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits of a fresh prefill of ``ids`` (same passes and kernels), leaving the cache untouched."""
        ids = [int(t) for t in ids]
        saved = (self.tokens, self._past, self._stored, self._binding, self.canonical_length, self._cache_owner)
        try:
            self.tokens, self.canonical_length, self._cache_owner = [], 0, None  # fresh buffers, even when shared
            if self.static:
                size = len(ids) + 1
                self._past, self._stored, self._binding = self._buffers(size), size, None
            else:
                self._past, self._stored = list(self._empty), 0
            return self.forward(ids)
        finally:
            self.tokens, self._past, self._stored, self._binding, self.canonical_length, self._cache_owner = saved

    def _feed(self, feed: list[int], first: int, rows: int) -> np.ndarray:
        """Run ``feed`` from position ``first`` in passes; logits of its last ``rows`` positions."""
        n = len(feed)
        tile = self.ROW_TILE if self.bitwise else 0
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
            if self.progress is not None and len(bounds) > 2:
                self.progress(b, n)
        if len(out) == 1:
            return out[0]
        return np.concatenate([o.numpy() if isinstance(o, (DeviceRows, TopRows)) else o for o in out])

    def _pass(self, ids: list[int], start: int, keep: int) -> np.ndarray:
        """One graph run over ``ids`` at ``start``; float32 logits of its last ``keep`` positions."""
        if self.static:
            self._follow_owner()
            if self._binding is None:
                self._binding = self._bind_static(self._past)
            logits = self._run_static(ids, start + len(ids), keep, self._binding)
        else:
            logits, present = self._run_concat(ids, start, self._trimmed(start), keep)
            self._past, self._stored = present, start + len(ids)
        if len(ids) >= 2:
            if start <= self.canonical_length:
                self.canonical_length = start + len(ids)
        else:
            self.canonical_length = min(self.canonical_length, start)
        if isinstance(logits, (DeviceRows, TopRows)):
            return logits
        return self.widen(logits)

    def widen(self, logits: np.ndarray) -> np.ndarray:
        """Rows of the graph's width as rows over the whole vocabulary: a vocab-subset draft's other ids get -inf
        (probability 0)."""
        if self._subset is None:
            return logits
        full = np.full((logits.shape[0], self.spec.output_vocab), -np.inf, dtype=np.float32)
        col = 0
        for lo, hi in self._subset:
            full[:, lo:hi] = logits[:, col:col + hi - lo]
            col += hi - lo
        return full

    def token_ids(self, cols: np.ndarray) -> np.ndarray:
        """Token ids of logits columns (a vocab-subset draft's columns cover its id ranges in order)."""
        if self._subset is None:
            return cols
        if self._columns is None:
            self._columns = np.concatenate([np.arange(lo, hi) for lo, hi in self._subset])
        return self._columns[cols]

    def _bind_static(self, buffers: list):
        """An IO binding with every layer's K/V buffer bound as both past input and present output."""
        b = self.session.io_binding()
        for name_in, name_out, value in zip(self._kv_in, self._kv_out, buffers):
            b.bind_ortvalue_input(name_in, value)
            b.bind_ortvalue_output(name_out, value)  # written in place
        return b

    def _bind_keep(self, b, n: int, keep: int) -> int:
        """Bind logits_to_keep when the graph has it; the number of logits rows the run returns."""
        if self.spec.logits_to_keep is None:
            return n
        b.bind_cpu_input(self.spec.logits_to_keep, np.array([keep], dtype=np.int64))
        return keep

    def _run_concat(self, ids: list[int], start: int, past: list, keep: int) -> tuple[np.ndarray, list]:
        spec = self.spec
        total = start + len(ids)
        b = self.session.io_binding()
        feeds = {spec.input_ids: np.asarray([ids], dtype=np.int64),
                 spec.attention_mask: np.ones((1, total), dtype=np.int64)}
        if spec.position_ids:
            feeds[spec.position_ids] = np.arange(start, total, dtype=np.int64)[None, :]
        for name, arr in feeds.items():
            b.bind_cpu_input(name, arr)
        rows = self._bind_keep(b, len(ids), keep)
        for name, value in zip(self._kv_in, past):
            b.bind_ortvalue_input(name, value)
        lazy = self._lazy
        b.bind_output(spec.logits, self.device if lazy else "cpu", 0)
        for name in self._kv_out:
            b.bind_output(name, self.device, 0)
        k = self.top_width() if spec.top_logits else 0
        if k:  # bound last: outputs come back in bind order
            b.bind_cpu_input(spec.top_logits["k"], np.array([k], dtype=np.int64))
            if spec.logits_norm:
                b.bind_cpu_input(spec.logits_norm["scale"], np.array([self.norm_scale], dtype=np.float32))
            slot = self._new_slot(0, rows * k, rows)
            self._bind_top(b, slot, rows, k)
            top = (slot[1].reshape(rows, k), slot[2].reshape(rows, k), k)
        self._execute(b)
        out = b.get_outputs()
        present = list(out[1:1 + len(self._kv_out)])
        if lazy:
            if self.logits_on_device:
                device = DeviceRows(self, out[0], top=top if self.top_k else None)
                return device[len(device) - keep:], present
            host = out[0].numpy()[0].astype(np.float32).ravel()
            return TopRows(self, (host, top[0].ravel(), top[1].ravel(), None, None, None, slot[6]), rows, k,
                           start=rows - keep), present
        logits = out[0].numpy()[0][-keep:]
        return logits.astype(np.float32), present

    def _execute(self, b) -> None:
        """Run the bound graph, counting the time spent inside onnxruntime."""
        t0 = time.perf_counter()
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:
            raise ModelRunError(f"onnxruntime failed running {self.spec.path}: {exc}") from None
        finally:
            self.run_time_s += time.perf_counter() - t0

    def _run_static(self, ids: list[int], total: int, keep: int, b) -> np.ndarray:
        """One call of a static-cache graph: only ids, lengths and the output buffers are (re)bound."""
        spec = self.spec
        feed, rows = self._feed_small(b, ids, total, keep)
        k = self.top_width() if spec.top_logits else 0
        put = feed["put"]
        if k:
            put["top_k"][0] = k
        if spec.logits_norm:
            put["norm_scale"][0] = self.norm_scale  # (rounded to float32 as NumPy rounds it)
        on_device = self._lazy and self.logits_on_device
        # rows left on the device need only the top arrays, fresh each pass (what DeviceRows holds of them does
        # not keep a reusable slot out of use; the device path binds every pass anyway)
        slot, index = self._slot(rows, k) if not on_device else (self._new_slot(0, rows * k, rows), None)
        key = None if index is None else (index, rows, k)
        if key is None or feed["out"] != key or self.device != "cpu":  # else: the same buffers are still bound
            if on_device:
                value = ort.OrtValue.ortvalue_from_shape_and_type([1, rows, spec.vocab_size], _NP[spec.dtype],
                                                                  self.device, 0)
                b.bind_ortvalue_output(spec.logits, value)
            else:
                b.bind_output(spec.logits, "cpu", 0, _NP[spec.dtype], [1, rows, spec.vocab_size], slot[3])
            if k:
                self._bind_top(b, slot, rows, k)
            feed["out"] = key
        self._execute(b)
        if on_device:
            top = (slot[1][:rows * k].reshape(rows, k), slot[2][:rows * k].reshape(rows, k), k) if self.top_k else None
            return DeviceRows(self, value, top=top)[rows - keep:]
        if self._lazy:  # the graph's top entries of each row beside the rows
            return TopRows(self, slot, rows, k, start=rows - keep)
        logits = slot[0][:rows * spec.vocab_size].reshape(rows, spec.vocab_size)[rows - keep:]
        return logits if logits.dtype == np.float32 else logits.astype(np.float32)

    def _feed_small(self, b, ids: list[int], total: int, keep: int) -> tuple[dict, int]:
        """Write a pass's small inputs (ids, lengths, rows to keep) into host arrays bound to the static binding
        ``b``; the number of logits rows the pass returns. On the CPU provider onnxruntime reads bound host
        inputs in place at run time, so an array is bound once (the ids again only when the pass length
        changes); on other devices binding copies the values, so every pass binds them again. The feed's
        "out" is the (address, rows) of the logits buffer bound last."""
        spec = self.spec
        feed = getattr(b, "ortspec_feed", None)
        bind = feed is None or self.device != "cpu"
        if feed is None:
            feed = b.ortspec_feed = {"seqlens": np.zeros(1, np.int32), "total": np.zeros((), np.int32),
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

    def top_width(self) -> int:
        """Top entries the next pass brings back per row: ``top_k`` in decoding passes, else 1 (the graph's
        TopK input must be fed; one entry is the cheapest)."""
        return max(1, min(self.top_k if self._lazy and self.top_rows else 1, self.spec.vocab_size))

    def _bind_top(self, b, slot: tuple, rows: int, k: int) -> None:
        """Bind the graph's TopK outputs (and normalizers) to a slot's host arrays as [1, rows, k] ([1, rows])
        (copied there from any device)."""
        names = self.spec.top_logits
        b.bind_output(names["values"], "cpu", 0, np.float32, [1, rows, k], slot[4])
        b.bind_output(names["ids"], "cpu", 0, np.int64, [1, rows, k], slot[5])
        if self.spec.logits_norm:
            b.bind_output(self.spec.logits_norm["norm"], "cpu", 0, np.float32, [1, rows], slot[7])

    def _slot(self, rows: int, k: int) -> tuple[tuple, int | None]:
        """Host arrays for a pass's outputs — flat logits (rows x vocabulary), top values and top columns
        (rows x k), and their addresses — and the slot's index among the reusable ones (None: one-off arrays).

        Small passes get one of HOST_BUFFERS reusable slots that no array handed out earlier still refers to
        (what the caller holds refers to the slot's arrays, so the reference count tells): the logits are
        returned without a copy, a slot is written again only once nothing can read it, and a slot already
        touched spares the page faults of fresh memory. A pass with the slot and shapes of the pass before
        is still bound.
        """
        width = self.spec.vocab_size
        if rows > self.HOST_ROWS or k > self.TOP_MAX:
            return self._new_slot(rows * width, rows * max(k, 1), rows), None
        pool = self._host
        for i in range(len(pool)):  # (not enumerate: its reused tuple would hold one more reference)
            buf = pool[i][0]
            if sys.getrefcount(buf) <= 3:  # the slot, ``buf``, the call: nobody else holds it
                return pool[i], i
        slot = self._new_slot(self.HOST_ROWS * width, self.HOST_ROWS * self.TOP_MAX, self.HOST_ROWS)
        if len(pool) < self.HOST_BUFFERS:
            pool.append(slot)
            return slot, len(pool) - 1
        return slot, None

    def _new_slot(self, size: int, top: int, rows: int) -> tuple:
        """(logits, top values, top columns, their addresses, row normalizers, its address)."""
        arrays = (np.empty(size, dtype=_NP[self.spec.dtype]), np.empty(top, np.float32), np.empty(top, np.int64))
        norms = np.empty(max(rows, 1), np.float32)
        return arrays + tuple(a.ctypes.data for a in arrays) + (norms, norms.ctypes.data)

    def _trimmed(self, length: int) -> list:
        """The cache tensors cut to ``length`` positions (device-side Slice)."""
        if self._stored == length:
            return self._past
        if length == 0:
            return list(self._empty)
        if self._host_trim:
            self._past = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v.numpy()[:, :, :length]))
                          for v in self._past]
            self._stored = length
            return self._past
        b = self._trimmer.io_binding()
        for i, value in enumerate(self._past):
            b.bind_ortvalue_input(f"x{i}", value)
        b.bind_cpu_input("starts", np.zeros(1, dtype=np.int64))
        b.bind_cpu_input("ends", np.array([length], dtype=np.int64))
        b.bind_cpu_input("axes", np.array([2], dtype=np.int64))
        for i in range(len(self._past)):
            b.bind_output(f"y{i}", self.device, 0)
        t0 = time.perf_counter()
        self._trimmer.run_with_iobinding(b)
        self.run_time_s += time.perf_counter() - t0
        self._past, self._stored = list(b.get_outputs()), length
        return self._past

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
            from .errors import BundleError
            raise BundleError(f"{spec.path} lacks the inputs/outputs the manifest names: {missing[:4]}; "
                              "the manifest does not describe this graph, re-export the bundle")


class _Rows:
    """Consecutive logits rows of one pass: ``rows[i]`` is a DeviceRow, ``rows[a:b]`` a view of fewer rows."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            if step != 1:
                raise IndexError(f"{type(self).__name__} slices take consecutive rows")
            return self if (a, b) == (0, n) else self._view(self.start + a, self.start + max(a, b))
        i = int(i) + (n if int(i) < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"row {i} of {n}")
        return DeviceRow(self, i)

    def _view(self, start: int, stop: int) -> "_Rows":
        raise NotImplementedError


class DeviceRows(_Rows):
    """Logits rows left on the device where the graph wrote them (an OrtValue [1, rows, width]).

    The sampling rules read only the largest entries of a row in most settings (greedy, top-k): ``top(K)`` hands
    them the graph's own TopK of the pass (copied to the host with it) or, for graphs without one or a larger
    K, runs a TopK graph on the device, and brings back K ids, their values, and a bound that every other entry
    is at most (the K-th largest value). ``numpy()`` copies the rows in full, for the settings (and the rare
    rows) that need more. Indexing gives a DeviceRow; slicing a view of fewer rows sharing the same results.
    """

    def __init__(self, lm: "CausalLM", value, start: int = 0, stop: int | None = None, shared: dict | None = None,
                 top: tuple | None = None):
        self.lm, self.value = lm, value
        self.start = start
        self.stop = value.shape()[1] if stop is None else stop
        self._shared = shared if shared is not None else {"top": {}, "host": None}
        if top is not None:  # the graph's own TopK of these rows: (values, columns, K), already on the host
            values, cols, k = top
            self._shared["top"][k] = _top_entries(lm, values, cols, k)
            lm.rows_read += values.shape[0]

    def _view(self, start: int, stop: int) -> "DeviceRows":
        return DeviceRows(self.lm, self.value, start, stop, self._shared)

    def numpy(self) -> np.ndarray:
        """The rows as float32 [rows, vocab] on the host (copied once, then shared by every view)."""
        host = self._shared["host"]
        if host is None:
            host = self.value.numpy()[0].astype(np.float32)
            host = self.lm.widen(host)
            self._shared["host"] = host
            self.lm.rows_copied += host.shape[0]
        return host[self.start:self.stop]

    def copy(self) -> np.ndarray:
        return self.numpy().copy()

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids [rows, K] and float32 values [rows, K] of each row's K largest entries (K = min(k, width)),
        and per row a bound that every entry not returned is at most (-inf when nothing is left out)."""
        width = self.value.shape()[2]
        k = min(int(k), width)
        found = self._shared["top"].get(k)
        if found is None:  # the graph's TopK found at least as many: they serve (more entries than asked is fine)
            found = next((f for have, f in self._shared["top"].items() if have >= k), None)
        if found is None:
            lm = self.lm
            b = lm._topk.io_binding()
            b.bind_ortvalue_input("logits", self.value)
            b.bind_cpu_input("k", np.array([k], dtype=np.int64))
            b.bind_output("values", "cpu")
            b.bind_output("indices", "cpu")
            t0 = time.perf_counter()
            lm._topk.run_with_iobinding(b)
            lm.run_time_s += time.perf_counter() - t0
            values, cols = (v.numpy()[0] for v in b.get_outputs())
            found = self._shared["top"][k] = (lm.token_ids(cols), values, _bound(values, k, width))
            lm.rows_read += values.shape[0]
        ids, values, bound = found
        return ids[self.start:self.stop], values[self.start:self.stop], bound[self.start:self.stop]


def _flat_view(arr: np.ndarray) -> memoryview:
    """A C-contiguous array's memory as a flat memoryview of its items (writes land in the array)."""
    return memoryview(arr).cast("B").cast(arr.dtype.char)


def _top_entries(lm: "CausalLM", values: np.ndarray, cols: np.ndarray, k: int) -> tuple:
    """(token ids, values, bound) of rows' K largest entries as a TopK returned them (columns of the graph's
    width)."""
    return lm.token_ids(cols), values, _bound(values, k, lm.spec.vocab_size)


def _bound(values: np.ndarray, k: int, width: int) -> np.ndarray:
    """What every entry left out of rows' K largest ``values`` is at most: the K-th, or -inf when none is."""
    return values[:, -1] if k < width else np.full(values.shape[0], -np.inf, dtype=np.float32)


class TopRows(_Rows):
    """Logits rows on the host beside the graph's TopK of each (the K largest entries, descending, and a bound
    every other entry is at most): the sampling rules read a row's top entries (``top``) where they settle it,
    and the whole row (``numpy``) where they do not. The same interface as DeviceRows. It holds a pass's host
    slot (flat arrays) and touches NumPy only when asked for: right after a pass every NumPy call is slow."""

    def __init__(self, lm: "CausalLM", slot: tuple, rows: int, k: int, start: int = 0, stop: int | None = None):
        self.lm, self.k, self.rows = lm, k, rows
        self.logits, self.values, self.cols = slot[0], slot[1], slot[2]  # (held: the slot stays out of use)
        # each row's sum exp((logit - max) * scale) at the scale the pass ran with (None: not computed)
        self.norms = slot[6] if lm.spec.logits_norm and lm.norm_scale > 0 else None
        self.scale = lm.norm_scale
        self.start, self.stop = start, rows if stop is None else stop
        lm.rows_read += self.stop - self.start

    def _view(self, start: int, stop: int) -> "TopRows":
        rows = TopRows.__new__(TopRows)
        rows.__dict__.update(self.__dict__)
        rows.start, rows.stop = start, stop
        return rows

    def numpy(self) -> np.ndarray:
        width = self.lm.spec.vocab_size
        host = self.logits[:self.rows * width].reshape(self.rows, width)[self.start:self.stop]
        return self.lm.widen(host if host.dtype == np.float32 else host.astype(np.float32))

    def copy(self) -> np.ndarray:
        return self.numpy().copy()

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids, values and bound of each row's largest entries: the graph's K of them when K >= ``k``
        (more than asked for is fine), else the ``k`` largest found on the host."""
        if min(int(k), self.lm.spec.output_vocab) > self.k:
            rows = self.numpy()
            ids = np.argsort(-rows, axis=1, kind="stable")[:, :k]
            values = np.take_along_axis(rows, ids, axis=1)
            return ids, values, _bound(values, k, rows.shape[1])
        n, k = self.rows, self.k
        ids, values, bound = _top_entries(self.lm, self.values[:n * k].reshape(n, k),
                                          self.cols[:n * k].reshape(n, k), k)
        return ids[self.start:self.stop], values[self.start:self.stop], bound[self.start:self.stop]

    def row_norm(self, i: int) -> tuple[float, float, int] | None:
        """(scale, normalizer, block) of row ``i``: sum_j exp((logit_j - max) * scale) as the graph computed it in
        float32 (in blocks of ``block`` entries, then over the blocks), None where the pass did not compute it."""
        if self.norms is None:
            return None
        return self.scale, float(self.norms[self.start + i]), self.lm.spec.logits_norm["block"]

    def row_spread(self, i: int) -> tuple[float, float] | None:
        """Row ``i``'s largest entry and the bound on those not read (None when every entry is read)."""
        if self.k >= self.lm.spec.vocab_size:
            return None
        j = (self.start + i) * self.k
        return float(self.values[j]), float(self.values[j + self.k - 1])

    def row_top(self, i: int, k: int) -> tuple[list, list, float]:
        """``top`` of one row as Python lists (what the sampling rules read, without NumPy calls)."""
        if min(int(k), self.lm.spec.output_vocab) > self.k:
            ids, values, bound = self.top(k)
            return ids[i].tolist(), values[i].tolist(), float(bound[i])
        j, k = (self.start + i) * self.k, self.k
        values = self.values[j:j + k].tolist()
        cols = self.cols[j:j + k]
        ids = cols.tolist() if self.lm._subset is None else self.lm.token_ids(cols).tolist()
        return ids, values, values[-1] if k < self.lm.spec.vocab_size else -math.inf


class DeviceRow:
    """One row of DeviceRows (what ``rows[i]`` of a host array would be)."""

    def __init__(self, rows: DeviceRows, i: int):
        self.rows, self.i = rows, i

    def top(self, k: int) -> tuple:
        if isinstance(self.rows, TopRows):
            return self.rows.row_top(self.i, k)
        ids, values, bound = self.rows.top(k)
        return ids[self.i], values[self.i], float(bound[self.i])

    def numpy(self) -> np.ndarray:
        return self.rows.numpy()[self.i]

    @property
    def width(self) -> int:
        """The row's width (what ``numpy()`` would hold)."""
        return self.rows.lm.spec.output_vocab

    def spread(self) -> tuple[float, float] | None:
        """(largest entry, bound on the entries not read) of this row where its pass returned top entries."""
        return self.rows.row_spread(self.i) if isinstance(self.rows, TopRows) else None

    def norm(self) -> tuple[float, float, int] | None:
        """(scale, normalizer, block) of this row where its pass computed one (TopRows.row_norm), else None."""
        return self.rows.row_norm(self.i) if isinstance(self.rows, TopRows) else None

    @property
    def on_host(self) -> bool:
        """Whether ``numpy()`` is the pass's own host buffer (a row used once may be processed in it)."""
        return isinstance(self.rows, TopRows)


def pass_bounds(n: int, size: int, tile: int = 0) -> list[int]:
    """Offsets splitting ``n`` positions into passes of at most ``size`` (a multiple of ``tile``); with a
    ``tile``, a last pass of tile * k + 1 positions borrows one from the pass before it."""
    bounds = list(range(0, n, size)) + [n]
    if tile and len(bounds) > 2 and (n - bounds[-2]) % tile == 1:
        bounds[-2] -= 1
    return bounds


# -- a tiny Slice graph, encoded without the onnx package ------------------
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
