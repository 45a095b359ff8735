"""CausalLM: one exported graph fed token by token — its passes (engine.passes: session, binding, host buffers,
rows) over its KV cache (engine.cache: buffers and valid length)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..bundle import ModelSpec
from ..errors import CacheOverflowError
from .passes import PLAIN, Graph, PassOptions, Reading
from .rows import DeviceRows, TopRows

ROUND = Reading(lazy=True, reuse=True)   # a decoding round's rows, read lazily where the graph allows
REUSED = Reading(reuse=True)             # whole rows in the round's leased buffers
OWN = Reading()                          # whole rows in arrays of the caller's own


class CausalLM:
    """One model fed token by token: its graph's passes (``graph``: engine.passes.Graph — session, binding, host
    buffers, rows) over its KV cache (``cache``: StaticCache or GrowingCache — buffers and the tokens it holds).
    What a request asks of the passes comes with each call (``PassOptions``); nothing of it is kept here."""

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
        self.provider = provider
        if trim not in ("auto", "graph", "host"):
            raise ValueError(f"trim must be 'auto', 'graph' or 'host', got {trim!r}")
        if trim == "host" and provider == "cuda":
            raise ValueError("trim='host' needs the CPU provider; the cache of a GPU session lives on the GPU")
        self.graph = Graph(spec, model_path, provider, threads, thread_pool, logits, profile)
        self.cache = self.graph.new_cache(trim, thread_pool)
        self.row_tile = spec.row_tile
        self.progress = None  # called as progress(done, total) after each pass of a feed longer than one pass
        self.reset()
        if spec.rows == "invariant" and not self.rows_agree():
            self.row_tile = spec.kernel_tile  # this machine's kernels do not: bitwise passes avoid lone rows again

    def twin(self) -> "CausalLM":
        """This model over a KV cache of its own (empty), on the same session: another request's state, the
        weights in memory once. The twin keeps this model's row tile (the load's probe is not run again)."""
        twin = object.__new__(CausalLM)
        twin.spec, twin.provider, twin.row_tile, twin.progress = self.spec, self.provider, self.row_tile, None
        twin.graph = self.graph.twin()
        twin.cache = self.cache.fresh(0)
        twin.reset()
        return twin

    def rows_agree(self) -> bool:
        """Whether this machine's kernels give each row the same bits in passes of 1, 3 and 8 positions (a
        row-invariant graph's promise, export.rows): after a context of 16 tokens, 8 more are fed one at a time,
        three at a time and in one pass, and every row is compared bit for bit, on buffers of its own (the cache
        is left empty). A different kernel path for a lone row or an odd pass's last shows in its logits' bits."""
        if self.capacity < 26:
            return False
        tile, self.row_tile = self.row_tile, 1
        vocab = self.spec.vocab_size
        ids = [(3 + 37 * i) % vocab for i in range(24)]
        saved, self.cache = self.cache, self.cache.fresh(len(ids))  # (buffers of its own: the cache untouched)
        try:
            self.prefill(ids[:16])
            whole = np.array(self.forward(ids[16:]), copy=True)
            for size in (1, 3):
                self.rollback(16)
                for at in range(16, 24, size):
                    rows = self.forward(ids[at:min(at + size, 24)])
                    if not np.array_equal(rows, whole[at - 16:at - 16 + len(rows)]):
                        return False
            return True
        finally:
            self.row_tile, self.cache = tile, saved
            self.reset()

    # -- what the graph has --------------------------------------------------
    @property
    def device(self) -> str:
        """Where the session runs: "cpu" or "cuda"."""
        return self.graph.device

    @property
    def session(self):
        return self.graph.session

    @property
    def columns(self):
        """The token id of each logits column (engine.rows.Columns)."""
        return self.graph.columns

    @property
    def reading(self):
        """What this model's rows read besides their pass's buffers (engine.rows.RowReading)."""
        return self.graph.reading

    @property
    def row_counts(self):
        return self.graph.row_counts

    @property
    def logits_on_device(self) -> bool:
        """Whether a decoding round's rows stay on the device (DeviceRows)."""
        return self.graph.logits_on_device

    @property
    def top_rows(self) -> bool:
        """Whether decoding passes can bring back each row's largest entries (the graph's own TopK)."""
        return self.graph.top_rows

    @property
    def run_time_s(self) -> float:
        """Time spent inside onnxruntime, all passes together."""
        return self.graph.run_time_s

    # -- state ------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything fed so far (valid length 0)."""
        self.cache.clear()
        self.canonical_length = 0  # leading positions whose K/V all came from rows on their tile's path

    @property
    def tokens(self) -> list[int]:
        """The tokens this model's cache holds, in order (its valid length)."""
        return self.cache.tokens

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
        return self.cache.length

    @property
    def capacity(self) -> int:
        """Positions a request may fill: the model's, less the slot a row-invariant graph's attention writes past
        a pass (its rotary tables end at the model's last position)."""
        return self.spec.max_positions - self.spec.kv_headroom

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` fed tokens. Never runs the model."""
        self.cache.rewind(length)
        self.canonical_length = min(self.canonical_length, length)

    def kv_bytes(self, positions: int | None = None) -> int:
        """Bytes of the K/V buffers this model's cache holds of its own (none where it runs on another's), or
        would hold at ``positions`` positions."""
        cache = self.cache
        if cache.owner is not None:
            return 0
        layout = cache.layout
        width = 2 if layout.dtype == "float16" else 4
        return len(layout.inputs) * layout.kv_heads * layout.head_dim * width * \
            (cache.stored if positions is None else positions)

    def can_copy(self, source: "CausalLM") -> bool:
        """Whether ``copy_prefix`` can take ``source``'s cached tokens (static caches on the CPU, one layout)."""
        return self.cache.can_copy(source.cache)

    def copy_prefix(self, source: "CausalLM", n: int) -> None:
        """Hold the first ``n`` tokens ``source`` holds, their keys and values copied bit for bit (another
        request's slot: a prompt that starts as that one's does feeds only the rest). Never runs the model."""
        self.cache.copy_prefix(source.cache, n)
        self.canonical_length = min(n, source.canonical_length)

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
        self.cache.follow(length)
        self.canonical_length = 0  # (meaningful for targets only)

    def prefill(self, ids: Sequence[int], keep: int | None = None, options: PassOptions = PLAIN) -> np.ndarray:
        self.reset()
        return self.forward(ids, keep, options=options)

    # -- running ----------------------------------------------------------
    def forward(self, ids: Sequence[int], keep: int | None = None, reuse: bool = False,
                options: PassOptions = PLAIN) -> np.ndarray:
        """Feed ``ids`` after the valid cache; return float32 logits [keep, vocab] of the last ``keep`` of them
        (of all of them when ``keep`` is None). They are the caller's own arrays, except with ``reuse``: then
        they may be a host buffer this model writes again after its next ``new_round`` (decoding rounds, and
        loops that time passes as rounds run them: no fresh memory per pass).

        Long feeds run in passes of at most ``CHUNK`` positions. With ``options.bitwise``, a feed whose pass
        would have row_tile * k + 1 positions (a single token, typically; with a tile of 2, any odd number)
        re-feeds the cached token before it (its K/V come out bit for bit the same) or, with nothing cached,
        appends a throwaway position that stays outside the valid length.
        """
        return self._forward(ids, keep, options, REUSED if reuse else OWN)

    def forward_rows(self, ids: Sequence[int], keep: int | None = None, options: PassOptions = PLAIN):
        """``forward`` for a decoding round: with logits kept on the device, the rows come back as DeviceRows
        (only what the sampling rules read reaches the host); with the graph's top entries asked for
        (``options.top_k``), as TopRows; otherwise as the float32 array of ``forward``. The rows are read in
        place: they stay valid until this model's next ``new_round``."""
        return self._forward(ids, keep, options, ROUND if self.graph.lazy_reads(options) else REUSED)

    def _forward(self, ids: Sequence[int], keep: int | None, options: PassOptions, reading: Reading):
        plan = self.plan_feed(ids, keep, options)
        rows = self._feed(plan.feed, plan.first, plan.keep + plan.pad, options, reading)
        return self.fed(plan, rows)

    def plan_feed(self, ids: Sequence[int], keep: int | None, options: PassOptions) -> "Feed":
        """What ``forward(ids, keep)`` feeds (a bitwise feed's re-fed token or throwaway position), with room
        reserved for it; ValueError / CacheOverflowError for a feed that cannot run. Nothing is run."""
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
        if options.bitwise and n % self.row_tile == 1:
            lead, pad = (1, 0) if start else (0, 1)
        if start + n + pad > self.capacity:
            raise CacheOverflowError(
                f"{start + n} positions exceed the model's maximum of {self.capacity}; "
                "shorten the prompt or lower max_new_tokens")
        first = start - lead
        feed = self.tokens[first:start] + ids + ids[-1:] * pad
        self.reserve(first + len(feed))
        return Feed(ids, start, first, feed, keep, pad)

    def fed(self, plan: "Feed", rows):
        """After the passes of a planned feed ran (``rows``: the logits of its last ``keep + pad`` positions): the
        fed tokens are valid; the caller's rows. Commit only after every pass succeeded (a failed run leaves the
        valid prefix as it was)."""
        self.cache.advance(plan.start, plan.ids)
        return rows[:plan.keep] if plan.pad else rows

    def kept_rows(self, n: int, rows: int, options: PassOptions) -> int:
        """Rows a pass of ``n`` positions keeps when its caller reads the last ``rows``: a bitwise pass's output
        layer avoids a lone row too."""
        kept = min(rows, n)
        if options.bitwise and self.row_tile and kept % self.row_tile == 1:
            kept += 1
        return kept

    def new_round(self) -> None:
        """A decoding round begins: nothing read from earlier passes' rows (``forward_rows``) is read any more,
        so their host buffers may be written again."""
        self.graph.new_round()

    def release_rows(self) -> None:
        """The last pass's rows are not read any more (a greedy draft step read its token): the next pass may
        write the same buffer, still bound."""
        self.graph.release_rows()

    def reference_logits(self, ids: Sequence[int], options: PassOptions = PLAIN) -> np.ndarray:
        """Logits of a fresh prefill of ``ids`` (same passes and kernels), leaving the cache untouched."""
        ids = [int(t) for t in ids]
        saved = (self.canonical_length, self.cache)
        try:
            self.canonical_length = 0
            self.cache = self.cache.fresh(len(ids) + 1)  # buffers of its own, even where the cache is shared
            return self.forward(ids, options=options)
        finally:
            self.canonical_length, self.cache = saved

    def _feed(self, feed: list[int], first: int, rows: int, options: PassOptions, reading: Reading) -> np.ndarray:
        """Run ``feed`` from position ``first`` in passes; logits of its last ``rows`` positions."""
        n = len(feed)
        tile = self.row_tile if options.bitwise else 0
        if n <= self.CHUNK:  # one pass (every decoding round)
            kept = self.kept_rows(n, rows, options)
            logits = self._pass(feed, first, min(n, kept), options, reading)
            return logits if kept == rows else logits[-rows:]
        bounds = pass_bounds(n, self.CHUNK, tile)
        out = []
        for a, b in zip(bounds, bounds[1:]):
            want = max(0, b - max(a, n - rows))  # rows of this pass the caller asked for
            kept = max(want, 1)
            if tile and kept % tile == 1:
                kept += 1  # the output layer avoids a lone row too
            logits = self._pass(feed[a:b], first + a, min(b - a, kept), options, reading)
            if want:
                out.append(logits[-want:])
            else:
                self.release_rows()  # a pass run only for its keys and values: nobody reads its row
            if self.progress is not None and len(bounds) > 2:
                self.progress(b, n)
        if len(out) == 1:
            return out[0]
        return np.concatenate([o.numpy() if isinstance(o, (DeviceRows, TopRows)) else o for o in out])

    def _pass(self, ids: list[int], start: int, keep: int, options: PassOptions, reading: Reading) -> np.ndarray:
        """One graph run over ``ids`` at ``start``; float32 logits of its last ``keep`` positions."""
        logits = self.graph.run(self.cache, ids, start, keep, options, reading)
        self.passed(start, len(ids))
        if isinstance(logits, (DeviceRows, TopRows)):
            return logits
        return self.widen(logits)

    def passed(self, start: int, n: int, tile: int | None = None) -> None:
        """A pass of ``n`` positions from ``start`` ran (on kernels of ``tile`` rows: the model's row tile unless
        given): the leading positions whose keys and values all came from rows on their tile's path
        (``canonical_length``)."""
        if n % (tile or self.row_tile) != 1 or tile == 1:  # (every row of the pass took the path of its tile)
            if start <= self.canonical_length:
                self.canonical_length = start + n
        else:
            self.canonical_length = min(self.canonical_length, start)

    def widen(self, logits: np.ndarray) -> np.ndarray:
        """Rows of the graph's width as rows over the whole vocabulary (``Columns.widen``)."""
        return self.columns.widen(logits)

    def token_ids(self, cols: np.ndarray) -> np.ndarray:
        """Token ids of logits columns (``Columns.token_ids``)."""
        return self.columns.token_ids(cols)

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


@dataclass(frozen=True)
class Feed:
    """One planned feed (``CausalLM.plan_feed``): the caller's ``ids`` after the valid ``start``; what runs —
    ``feed`` from position ``first`` (a re-fed token before them, or a throwaway position after: ``pad``); the
    rows the caller reads (``keep``)."""

    ids: list
    start: int
    first: int
    feed: list
    keep: int
    pad: int


@dataclass(eq=False)
class PassNeed:
    """A round's target pass, announced at a scheduler's pause (``Request.pauses``): ``forward_rows(ids, keep,
    options)`` on ``lm``. A scheduler may run it, with other requests' passes in one (engine.batch), and leave
    its rows in ``rows`` (``shared``: it rode a batch); else the round runs it itself (``result``)."""

    lm: "CausalLM"
    ids: list
    keep: int
    options: PassOptions
    rows: object = None
    shared: bool = False

    def result(self):
        """The rows: the scheduler's, or this pass run now."""
        if self.rows is None:
            self.rows = self.lm.forward_rows(self.ids, keep=self.keep, options=self.options)
        return self.rows


def pass_bounds(n: int, size: int, tile: int = 0) -> list[int]:
    """Offsets splitting ``n`` positions into passes of at most ``size`` (a multiple of ``tile``); with a
    ``tile``, a last pass of tile * k + 1 positions borrows one from the pass before it."""
    bounds = list(range(0, n, size)) + [n]
    if tile and len(bounds) > 2 and (n - bounds[-2]) % tile == 1:
        bounds[-2] -= 1
    return bounds
