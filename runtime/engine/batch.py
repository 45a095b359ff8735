"""Several requests' target passes as one: the rows of every slot side by side through the weights once, each
slot's attention over its own KV cache (the target's batched graph: ortspec.export.batch).

A decoding pass on the CPU is bound by reading the weights (measured on an AMD EPYC, 2 vCPUs, after 96 tokens:
SmolLM2-135M fp32 20 ms for one row, 25 ms for four; Qwen2.5-Coder-1.5B Q4_K_M, compact layout, 52 ms for one,
95 for four), so the rows of several requests cost little more than one request's. Each row gets the bits it gets
in a pass of its own on the multi-row kernels (the batched graph is row-invariant and every slot's attention sees
its rows and a zero row, as a row-invariant pass alone does), so a request's output is the same whether its pass
rode alone or with others: ``BatchedPasses.run`` hands each request the rows ``CausalLM.forward_rows`` would
have returned, and leaves its cache as that call would. (A bitwise pass on a target that is not row-invariant
re-feeds the token before a lone one, so that its row takes the multi-row kernels: in a batched pass it needs
no such help.)
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ..errors import ModelRunError
from .lm import ROUND, CausalLM, Feed
from .passes import PLAIN
from .rows import TopRows
from .session import ort, session_options
from .slots import HostSlot

NEEDS_ONNX = "running several requests' passes as one builds the target's batched graph with the onnx package: " \
             "pip install onnx (it comes with ortspec[serve])"


def batch_refusal(lm: CausalLM) -> str | None:
    """Why ``lm``'s passes cannot run batched (None where they can): a fused graph with a static cache, on the
    CPU, its rows read on the host."""
    if lm.device != "cpu":
        return "batched passes run on the CPU provider only"
    if not lm.static:
        return "batched passes need a fused graph with a static KV cache (this one grows its cache per pass)"
    if lm.logits_on_device:
        return "batched passes read their rows on the host (logits='device' keeps them on the device)"
    if lm.spec.vocab_subset:
        return "batched passes need a graph over the whole vocabulary"
    return None


class BatchedPasses:
    """The target's batched graph for ``slots`` requests in one session of its own (the weights are loaded for it
    too: one more copy in memory), run over the caches of generator twins of ``lm``."""

    def __init__(self, lm: CausalLM, slots: int):
        refusal = batch_refusal(lm)
        if refusal:
            raise ValueError(refusal)
        try:
            import onnx
        except ImportError:
            raise ModelRunError(NEEDS_ONNX) from None
        from ..export.batch import BOUNDS, KEPT, make_batched, slot_name
        spec, graph = lm.spec, lm.graph
        self.spec, self.slots, self.bounds_name, self.slot_name = spec, int(slots), BOUNDS, slot_name
        path = graph.model_path
        model = onnx.load(path, load_external_data=False)
        make_batched(model, self.slots, spec.seqlens_k, spec.total_sequence_length,
                     spec.logits_norm["scale"] if spec.logits_norm else None)
        so = session_options(graph.threads, graph.thread_pool)
        so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                    os.path.dirname(os.path.abspath(path)))
        try:
            self.session = ort.InferenceSession(model.SerializeToString(), so, providers=graph.providers)
        except Exception as exc:
            raise ModelRunError(f"onnxruntime cannot load the batched graph of {path}: {exc}") from None
        self.layout = graph.layout
        names = {i.name for i in self.session.get_inputs()}
        self.kept_name = KEPT if KEPT in names else None  # (a graph without logits_to_keep returns every row)
        self.spare = self.layout.buffers(4)  # a slot without rows attends to its zero row over these
        self.width = spec.vocab_size
        self.dtype = np.dtype(np.float32 if spec.dtype == "float32" else np.float16)
        self._buffers: list = [None, None]  # two sets of output arrays, used in turn (see ``_outputs``)
        self._turn = 0
        self.passes = 0        # batched passes run
        self.rows = 0          # rows they ran
        self.run_time_s = 0.0
        self.costs = PassCosts()

    def fits(self, lm: CausalLM, ids: list[int], keep: int, options) -> bool:
        """Whether ``forward_rows(ids, keep, options)`` on ``lm`` runs as one pass a batch can take: one pass of at
        most CHUNK positions whose zero attention row lands inside the cache and the model's positions."""
        n = len(ids)
        return n <= lm.CHUNK and lm.length + n + 1 <= min(lm.spec.max_positions, lm.capacity + 1)

    def run(self, jobs: list) -> list:
        """Run the passes ``jobs`` ask for (each an engine.PassNeed: lm, ids, keep, options) as one; each job's
        ``rows`` is then what ``lm.forward_rows(ids, keep, options)`` would have returned, and each lm's cache
        as that call would have left it. At most ``slots`` jobs, on distinct caches."""
        if not 1 <= len(jobs) <= self.slots:
            raise ValueError(f"a batched pass takes 1 to {self.slots} requests, got {len(jobs)}")
        plans: list[Feed] = []
        kept, widths = [], []
        for job in jobs:
            lm = job.lm
            # as it is: no kernel of the batched graph sees a lone row, so a bitwise pass re-feeds nothing here
            plan = lm.plan_feed(job.ids, job.keep, PLAIN)
            lm.reserve(plan.first + len(plan.feed) + 1)  # (the slot's zero attention row lands inside its buffers)
            plans.append(plan)
            kept.append(plan.keep)
            widths.append(lm.graph.top_width(job.options, ROUND) if self.spec.top_logits else 0)
        sizes = [len(p.feed) for p in plans]
        total_rows = sum(sizes)
        # the rows whose logits come back: each slot's last ``keep`` (all rows, with a graph that keeps no fewer)
        if self.kept_name is None:
            kept = list(sizes)
        starts = np.cumsum([0] + sizes[:-1])
        index = np.concatenate([np.arange(a + n - k_b, a + n) for a, n, k_b in zip(starts, sizes, kept)])
        out_rows = len(index)
        k = max(widths) if widths else 0
        logits, values, cols, norms, scales = self._outputs(out_rows, k)
        b = self.session.io_binding()
        ids = np.fromiter((t for p in plans for t in p.feed), np.int64, total_rows).reshape(1, total_rows)
        bounds = np.zeros(self.slots + 1, np.int64)
        bounds[1:len(sizes) + 1] = np.cumsum(sizes)
        bounds[len(sizes) + 1:] = total_rows
        spec, name = self.spec, self.slot_name
        b.bind_cpu_input(spec.input_ids, ids)
        b.bind_cpu_input(self.bounds_name, bounds)
        count = np.array([out_rows], np.int64)
        if spec.logits_to_keep is not None:
            b.bind_cpu_input(spec.logits_to_keep, count if self.kept_name else np.array([total_rows], np.int64))
        if self.kept_name is not None:
            b.bind_cpu_input(self.kept_name, index)
        small = []  # (kept alive until the run returns)
        for slot in range(self.slots):
            if slot < len(plans):
                plan, past = plans[slot], jobs[slot].lm.cache.past
                total = plan.first + len(plan.feed)
            else:
                total, past = 0, self.spare
            seqlens, total_arr = np.array([total - 1], np.int32), np.array(total, np.int32)
            small += [seqlens, total_arr]
            b.bind_cpu_input(name(spec.seqlens_k, slot), seqlens)
            b.bind_cpu_input(name(spec.total_sequence_length, slot), total_arr)
            for n_in, n_out, value in zip(self.layout.inputs, self.layout.outputs, past):
                b.bind_ortvalue_input(name(n_in, slot), value)
                b.bind_ortvalue_output(name(n_out, slot), value)
        b.bind_output(spec.logits, "cpu", 0, self.dtype, [1, out_rows, self.width], logits.ctypes.data)
        if spec.top_logits:
            top = spec.top_logits
            k_arr = np.array([max(k, 1)], np.int64)
            small.append(k_arr)
            b.bind_cpu_input(top["k"], k_arr)
            b.bind_output(top["values"], "cpu", 0, np.float32, [1, out_rows, max(k, 1)], values.ctypes.data)
            b.bind_output(top["ids"], "cpu", 0, np.int64, [1, out_rows, max(k, 1)], cols.ctypes.data)
            if spec.logits_norm:
                at = 0
                for job, keep in zip(jobs, kept):
                    scales[at:at + keep] = job.options.norm_scale
                    at += keep
                b.bind_cpu_input(spec.logits_norm["scale"], scales[:out_rows].reshape(1, out_rows, 1))
                b.bind_output(spec.logits_norm["norm"], "cpu", 0, np.float32, [1, out_rows], norms.ctypes.data)
        t0 = time.perf_counter()
        try:
            self.session.run_with_iobinding(b)
        except Exception as exc:
            raise ModelRunError(f"onnxruntime failed running the batched graph of {spec.path}: {exc}") from None
        elapsed = time.perf_counter() - t0
        self.run_time_s += elapsed
        self.passes += 1
        self.rows += total_rows
        at = 0
        width, kk = self.width, max(k, 1)
        shares = self.costs.shares(sizes, elapsed)
        for job, plan, size, keep, k_job, share in zip(jobs, plans, sizes, kept, widths, shares):
            lm = job.lm
            lm.graph.run_time_s += share
            lo, hi = at, at + keep
            if lm.graph.lazy_reads(job.options):  # the rows as a decoding pass reads them: TopRows
                slot = HostSlot(logits[lo * width:hi * width], _first_columns(values, kk, lo, hi, k_job),
                                _first_columns(cols, kk, lo, hi, k_job), norms[lo:hi])
                rows = TopRows(lm.reading, slot, keep, k_job, job.options.norm_scale)
            else:
                rows = logits[lo * width:hi * width].reshape(keep, width)
                rows = lm.widen(rows if rows.dtype == np.float32 else rows.astype(np.float32))
            if keep != plan.keep:  # (a graph that returns every row)
                rows = rows[keep - plan.keep:]
            lm.passed(plan.first, size, tile=1)  # (every row on the path of a pass of many)
            job.rows, job.shared = lm.fed(plan, rows), True
            at += keep
        return [job.rows for job in jobs]

    def _outputs(self, rows: int, k: int) -> tuple:
        """Host arrays for a batched pass's outputs, two sets used in turn: a pass's rows are read (its requests'
        rounds verified) before the pass after the next one writes the same arrays."""
        self._turn ^= 1
        have = self._buffers[self._turn]
        k = max(k, 1)
        if have is None or have[0] < rows or have[1] < k:
            size, top = max(rows, have[0] if have else 0), max(k, have[1] if have else 0)
            have = (size, top, np.empty(size * self.width, self.dtype), np.empty(size * top, np.float32),
                    np.empty(size * top, np.int64), np.empty(size, np.float32), np.empty(size, np.float32))
            self._buffers[self._turn] = have
        return have[2:]


class PassCosts:
    """What a batched pass costs by its rows, learned from the passes run, and how a pass's time is split among
    its requests: what the pass would have cost with one row each, shared equally, plus, for each request, what
    its rows past the first added (their marginal cost in this pass). The parts add up to the pass's time.

    A pass on the CPU is bound by reading the weights while its rows are few (SmolLM2-135M fp32, 4 slots, AMD
    EPYC 2 vCPUs: 30 ms at 4 rows, 31 at 8, 40 at 12), so a row a request adds costs the batch far less than the
    pass's average row; what a request's cost model reads of a batch (``crowd``) comes from this table."""

    DECAY = 0.2

    def __init__(self):
        self.by_rows: dict[int, float] = {}  # total rows -> seconds, an exponential average of the passes seen
        self._slope: float | None = None     # past the largest size timed (computed once per table)
        self._crowds: dict = {}              # (requests, sizes) -> Crowd, for the table as it is

    def learn(self, rows: int, seconds: float) -> None:
        have = self.by_rows.get(rows)
        self.by_rows[rows] = seconds if have is None else have + self.DECAY * (seconds - have)
        self._slope = None
        self._crowds.clear()

    def estimate(self, rows: int) -> float:
        """A pass of ``rows`` rows: as timed; between timed sizes, on the line between the nearest two; below
        the smallest, that one's; past the largest, on from it at the least-squares slope of the timed sizes
        (none below zero)."""
        table = self.by_rows
        if not table:
            raise ValueError("no batched pass has been timed yet")
        if rows in table:
            return table[rows]
        top = max(table)
        if rows > top:
            if self._slope is None:
                sizes = sorted(table)
                self._slope = max(0.0, float(np.polyfit(sizes, [table[r] for r in sizes], 1)[0])) \
                    if len(sizes) > 1 else 0.0
            return table[top] + self._slope * (rows - top)
        below = max((r for r in table if r < rows), default=None)
        above = min(r for r in table if r > rows)
        if below is None:
            return table[above]
        lo, hi = table[below], table[above]
        return lo + (hi - lo) * (rows - below) / (above - below)

    def shares(self, sizes: list[int], elapsed: float) -> list[float]:
        """Each request's part of a pass of ``sizes`` rows per request that took ``elapsed`` seconds."""
        total = sum(sizes)
        self.learn(total, elapsed)
        full = self.estimate(total)
        extra = [max(0.0, full - self.estimate(total - size + 1)) if size > 1 else 0.0 for size in sizes]
        spent = sum(extra)
        if spent > elapsed:  # (estimates off on a noisy pass: the marginal parts scaled into the pass)
            extra = [e * elapsed / spent for e in extra]
            spent = elapsed
        base = (elapsed - spent) / len(sizes)
        return [base + e for e in extra]

    def crowd(self, requests: int, sizes: int) -> "Crowd":
        """What a request of a batch of ``requests`` plans its rounds for: its part of the pass where every
        request of the batch brings k rows, for k = 1..``sizes`` (no size cheaper than a smaller one)."""
        key = (requests, sizes)
        if key not in self._crowds:  # (asked every turn; the table changes once a batched pass)
            costs = [self.estimate(requests * k) / requests for k in range(1, sizes + 1)]
            self._crowds[key] = Crowd(requests, tuple(np.maximum.accumulate(costs).tolist()))  # (never cheaper
            # with more rows: noise)
        return self._crowds[key]


@dataclass(frozen=True)
class Crowd:
    """The batch a request's target passes ride with, as its rounds plan for it (Request.crowd): how many
    requests share a pass, and C_t(k), the request's part of such a pass where each of them brings k rows
    (``pass_costs``), which its cost model reads in place of its own passes' times.

    A draft step the request runs alone, every request of the batch waits for; the rows it adds to the pass
    cost the batch only their marginal time. A request that chose its rounds against the batch as it stood
    (the others' drafts already in the turn) found model drafts paying once the others drafted (their steps
    made the turn long) and not where none did: the batch settled on the slower of the two (SmolLM2 pair,
    4 requests: the model's draft steps 16% to 30% of the time). Every request planning as if the others made
    the same choice compares the two batches whole."""

    requests: int
    pass_costs: tuple


def _first_columns(flat: np.ndarray, k: int, lo: int, hi: int, want: int) -> np.ndarray:
    """Rows ``lo``..``hi`` of a flat [rows, k] array, their first ``want`` columns, as a flat array of their own
    (the graph's TopK is sorted: its first entries are those of a smaller K)."""
    want = max(want, 1)
    return np.ascontiguousarray(flat[lo * k:hi * k].reshape(hi - lo, k)[:, :want]).ravel()
