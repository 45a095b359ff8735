"""Several requests at once for `ortspec serve`: slots (generator twins with KV caches of their own over the
shared sessions) and the Engine that admits requests to them and steps every running one a round at a time.

The HTTP layer (ortspec.serve) checks each request here (``Engine.open``), submits it and reads its Ticket's queue;
this module knows nothing of HTTP.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time

from .checks import is_int
from .config import SpeculationConfig
from .constrain import ConstraintError
from .drafting import common_prefix
from .engine import PassNeed
from .engine.batch import BatchedPasses, batch_refusal
from .errors import OrtspecError
from .generator import SpeculativeGenerator
from .metrics import Metrics
from .results import Stats
from .tools import CallWatch, held_format, tool_style
from .wire import ApiError, Job, Outcome, StopText

log = logging.getLogger("ortspec.serve")
END = object()  # a stream's end, as _step reads it


class Ticket:
    """A running or waiting request: the worker pushes ("text", str), then ("done", outcome) or ("error", exc)."""

    def __init__(self, job: Job, stream, loop: asyncio.AbstractEventLoop):
        self.job, self.stream, self.loop = job, stream, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancel = threading.Event()
        self.admitted = time.perf_counter()

    def put(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the server's event loop is closed (shutdown): nobody is listening any more
            pass


class Slot:
    """A place for one running request: a generator twin (KV caches of its own for the target and the draft, over
    the sessions every slot shares) and its siblings per drafter. What the last request left in its caches stays
    there: a request whose prompt starts with it (a chat's next turn, a system prompt every call repeats) feeds
    only the rest."""

    def __init__(self, gen: SpeculativeGenerator):
        self.gens = {gen.drafter.name: gen}
        self.base = gen
        self.last_used = 0

    def generator(self, drafter: str) -> SpeculativeGenerator:
        if drafter not in self.gens:
            self.gens[drafter] = self.base.sibling(drafter)
        return self.gens[drafter]

    def cached(self, ids: list[int]) -> int:
        """How many leading tokens of ``ids`` this slot's target cache holds."""
        return common_prefix(self.base.target.tokens, ids)

    def copy_from(self, donor: "Slot", ids: list[int], n: int) -> int:
        """Take the ``n`` first tokens of ``ids`` that ``donor``'s caches hold (target and an own-cache draft),
        copied bit for bit into this slot's caches; the number taken (0 where the caches cannot copy)."""
        target, source = self.base.target, donor.base.target
        if not target.can_copy(source):
            return 0
        target.copy_prefix(source, n)
        mine, theirs = self.base.drafter.lm, donor.base.drafter.lm
        if mine is not None and self.base.drafter.source is None and mine.can_copy(theirs):
            mine.copy_prefix(theirs, min(n, common_prefix(theirs.tokens, ids)))
        return n

    def kv_bytes(self) -> int:
        """The K/V buffers this slot's caches hold now."""
        return sum(lm.kv_bytes() for lm in (self.base.target, self.base.drafter.lm) if lm is not None)


class Run:
    """One admitted request on its slot, stepped a round (one event) at a time by the scheduler."""

    def __init__(self, ticket: Ticket, slot: Slot):
        self.ticket, self.slot = ticket, slot
        self.stop, self.watch = StopText(ticket.job.stop), _call_watch(ticket.job)
        self.tokens, self.t0 = 0, time.perf_counter()
        self.need = None  # the target pass its last pause announced (engine.PassNeed)


class Engine:
    """Runs up to ``parallel`` requests at once, each on a slot of its own (Slot: its own KV caches over shared
    sessions), interleaved on one worker thread. In each turn every running request takes one step — its
    round's target pass and the events it commits, then its next round's drafts, up to the pause before that
    round's target pass (a request's first round is one step, after its prompt's chunks of 128 positions, a
    step each, where it is long) — and then the target passes the requests announced at those pauses run as
    one (engine.batch.BatchedPasses: every request's rows through the weights once, each request's attention
    over its own cache; ``batch`` False: each request runs its own). A request that arrives while others run
    opens the next turn, so its first token waits at most for the turn running then. A request whose prompt
    starts as one a slot holds (a free slot's, or a running one's: its held prompt stays put) feeds only the
    rest. Each request's output is what it would be alone (its own caches, rows with the same bits whatever
    pass they ride: greedy ids are the same, a seeded sampled answer the same tokens at the same settings).
    Past ``parallel`` running, requests wait in arrival order, ``max_queue`` of them at most (then 429)."""

    COPY_MIN = 16  # a prompt start another slot holds, this many tokens longer than the free slot's: copied over

    def __init__(self, gen: SpeculativeGenerator, model_id: str, max_queue: int = 32,
                 timeout_s: float = 600.0, default_gamma: int | str | None = None, default_max_tokens: int = 1024,
                 parallel: int = 1, batch: bool = True):
        if not is_int(parallel, 1):
            raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
        self.gen, self.model_id, self.default_max_tokens = gen, model_id, default_max_tokens
        self.max_queue, self.timeout_s, self.parallel = max_queue, timeout_s, parallel
        self.default_gamma = gen.default_num_draft_tokens if default_gamma is None else default_gamma  # (the bundle's)
        offered = (("model", "hybrid") if gen.drafter.lm is not None else ()) + ("prompt_lookup", "none")
        self.drafters = (gen.drafter.name,) + tuple(d for d in offered if d != gen.drafter.name)
        self._checker = Slot(gen)  # checks requests on the event loop (no pass runs on it there)
        self.slots = [self._checker] + [Slot(gen.twin()) for _ in range(parallel - 1)]
        self.batch = self._batched_passes() if batch and parallel > 1 else None
        self._cond = threading.Condition()
        self._waiting: collections.deque = collections.deque()
        self._runs: list[Run] = []
        self._closed = False
        self._admitted = 0  # requests admitted so far (a slot's last_used is the count at its last admission)
        self.served = 0
        self.cancelled = 0
        self.last: dict | None = None
        self.created = int(time.time())
        self.metrics = Metrics(model_id)
        self._worker = threading.Thread(target=self._loop, name="ortspec-generate", daemon=True)
        self._worker.start()

    def _batched_passes(self) -> BatchedPasses | None:
        """The target's batched graph for every slot (None, logged, where this target or install cannot)."""
        refusal = batch_refusal(self.gen.target)
        if refusal is None:
            try:
                return BatchedPasses(self.gen.target, self.parallel)
            except OrtspecError as exc:
                refusal = str(exc)
        log.warning("requests run their target passes one at a time: %s", refusal)
        return None

    @property
    def running(self) -> int:
        return len(self._runs)

    def generator(self, drafter: str | None) -> SpeculativeGenerator:
        return self._checker.generator(drafter or self.gen.drafter.name)

    def open(self, job: Job):
        """Check a job against the model (prompt, context length) without running it: a _Stream."""
        gen = self.generator(job.drafter)
        opts = dict(job.options)
        if opts["num_draft_tokens"] is None:
            opts["num_draft_tokens"] = self.default_gamma
        source = job.source
        if job.tools is not None and gen.codec is not None:
            job.tool_style = tool_style(gen.codec.chat_template)
            held = held_format(job.tools, job.tool_mode, gen.codec.chat_template, opts.get("response_format"),
                               job.parallel_calls)
            if held is not None:
                opts["response_format"] = held
            if job.tool_mode is None and job.tool_style == "generic":  # "none": no functions offered in the prompt
                source = {k: v for k, v in source.items() if k != "tools"}
        if gen.codec is None and "input_ids" not in job.source:
            raise ApiError(400, "this model has no tokenizer: send prompt as a list of token ids to /v1/completions",
                           "prompt")
        capacity, param = gen.target.capacity, "messages" if job.kind == "chat" else "prompt"
        try:
            ids = gen.encode_prompt(**source)
        except (ValueError, OrtspecError) as exc:
            raise ApiError(400, str(exc), param) from None
        if len(ids) > capacity:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this model's context is {capacity} tokens",
                           param, "context_length_exceeded")
        room = capacity - len(ids) + 1  # the last new token is never fed
        if job.max_tokens is not None and job.max_tokens > room:
            raise ApiError(400, f"this model's context is {capacity} tokens; the prompt uses {len(ids)}, so "
                                f"max_tokens can be at most {room}, got {job.max_tokens}",
                           "max_tokens", "context_length_exceeded")
        try:
            return gen.stream(input_ids=ids, **opts,
                              max_new_tokens=job.max_tokens or min(room, self.default_max_tokens))
        except (ValueError, OrtspecError) as exc:
            raise ApiError(400, str(exc), "response_format" if isinstance(exc, ConstraintError) else None) from None

    def submit(self, job: Job, stream, loop) -> Ticket:
        ticket = Ticket(job, stream, loop)
        with self._cond:
            if self._closed:
                raise ApiError(503, "the server is shutting down", code="shutting_down")
            if len(self._runs) + len(self._waiting) >= self.parallel + self.max_queue:
                self.metrics.rejected()
                raise ApiError(429, f"the server is busy: {self.parallel} requests are running (--parallel) and "
                                    f"{self.max_queue} are waiting (--max-queue); retry later", code="queue_full")
            self._waiting.append(ticket)
            self._cond.notify()
        return ticket

    # -- the worker ------------------------------------------------------------
    def _loop(self) -> None:
        """The scheduler: admit waiting requests to free slots, then step every running request once."""
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._runs:
                    self._cond.wait()
                if self._closed and not self._runs:
                    return
                self._admit()
                runs = list(self._runs)
            try:
                self._turn(runs)
            except Exception as exc:  # (a request's own failure ends in its step: this is the scheduler's)
                log.exception("the scheduler failed; the running requests end with an error")
                for run in list(self._runs):
                    run.ticket.stream.close()
                    self.metrics.finished("error", len(run.ticket.stream.prompt_ids))
                    self._release(run)
                    run.ticket.put(("error", exc))

    def _turn(self, runs: list[Run]) -> None:
        """One turn: every running request a step, then the target passes they announced, batched."""
        for run in runs:
            self._step(run)
        if self.batch is not None:
            self._batch(runs)

    def _admit(self) -> None:
        """Waiting requests, in arrival order, onto free slots (holding the lock): each to the free slot whose
        cache holds the longest start of its prompt, else the one used longest ago."""
        busy = {id(r.slot) for r in self._runs}
        while self._waiting:
            free = [s for s in self.slots if id(s) not in busy]
            ticket = self._waiting[0]
            if ticket.cancel.is_set() or self._closed:  # gave up (disconnect, timeout) while waiting
                self._waiting.popleft()
                self._drop(ticket)
                continue
            if not free:
                return
            self._waiting.popleft()
            ids = ticket.stream.prompt_ids
            held = {id(s): s.cached(ids) for s in self.slots}
            slot = max(free, key=lambda s: (held[id(s)], -s.last_used))
            donor = max(self.slots, key=lambda s: held[id(s)])  # (a busy slot's held prefix stays put)
            if held[id(donor)] >= held[id(slot)] + self.COPY_MIN:
                slot.copy_from(donor, ids, held[id(donor)])
            self._admitted += 1
            slot.last_used = self._admitted
            gen = slot.generator(ticket.stream.generator.drafter.name)
            ticket.stream = gen.adopt(ticket.stream, pauses=True, crowd=self._batch_now,  # (the checked request,
                                      hurry=self._admits_next)                       # on this slot's models)
            busy.add(id(slot))
            self._runs.insert(0, Run(ticket, slot))  # its first round (the prompt's prefill) opens the next turn

    def _drop(self, ticket: Ticket) -> None:
        self.metrics.finished("cancelled", len(ticket.stream.prompt_ids))
        self._finish(ticket, Outcome("cancelled", len(ticket.stream.prompt_ids), 0, {}, 0.0))

    def _step(self, run: Run) -> None:
        """One step of a running request: its round's target pass (unless the last batched pass ran it), the
        round's events (text to the client) and the next round's drafts, up to its next pause; or its end (then
        its slot is free). A pause that announces a target pass leaves it in ``run.need``."""
        ticket = run.ticket
        stream = ticket.stream
        run.need = None
        try:
            reason = None
            while reason is None:
                if ticket.cancel.is_set():
                    reason = "cancelled"
                    break
                ev = next(stream, END)
                if ev is None or isinstance(ev, PassNeed):  # a pause: another request may run a step now
                    run.need = ev
                    return
                if ev is END:
                    reason = "end"
                    break
                run.tokens += len(ev.token_ids)
                if ev.logprobs:  # (every token generated, up to the one that completes a stop string)
                    ticket.put(("logprobs", ev.logprobs))
                text, hit = run.stop.push(ev.text)
                looped = run.watch is not None and run.watch.push(text)  # a held answer is read whole at the end
                if text and run.watch is None:
                    ticket.put(("text", text))
                if hit or looped:
                    reason = "stop"
            stream.close()  # ends the generation and releases the slot's generator
            self._done(run, None if reason == "end" else reason)
        except Exception as exc:  # reported to the client as a 500 without a traceback; logged in full
            log.exception("generation failed")
            stream.close()
            self.metrics.finished("error", len(stream.prompt_ids))
            self._release(run)
            ticket.put(("error", exc))

    def _batch(self, runs: list[Run]) -> None:
        """The target passes the running requests announced, run as one (BatchedPasses) where two or more can:
        each request then verifies its round on the rows it would have got alone. A failure leaves each request
        to run its own pass."""
        batch = self.batch
        needs = [r.need for r in runs if r.need is not None and r in self._runs]
        needs = [n for n in needs if batch.fits(n.lm, n.ids, n.keep, n.options)]
        if len(needs) < 2:
            return
        try:
            for at in range(0, len(needs), batch.slots):
                if len(needs) - at >= 2:
                    batch.run(needs[at:at + batch.slots])
        except Exception:  # (the caches' valid lengths move only after a pass succeeded)
            log.exception("a batched target pass failed; the requests run their own passes")
            for need in needs:
                need.rows, need.shared = None, False

    def _admits_next(self) -> bool:
        """Whether a request waits for a slot that is free (it starts in the next turn): the running greedy
        requests' draft models then stop drafting, so that its first token waits for little more than the pass
        under way (a sampled request drafts whole: its seeded answer must not depend on the timing)."""
        return bool(self._waiting) and len(self._runs) < self.parallel

    def _batch_now(self):
        """The batch the running requests' next passes ride (engine.batch.Crowd), or None: no batching, fewer
        than two run, or no batched pass has been timed yet. Every round plans for it (Request.crowd), the
        first of a request's too (admitted into a running batch, it plans its second round in its first step)."""
        running = min(len(self._runs), self.batch.slots) if self.batch is not None else 0
        if running < 2 or not self.batch.costs.by_rows:
            return None
        return self.batch.costs.crowd(running, SpeculationConfig.max_draft_tokens + 1)

    def _done(self, run: Run, reason: str | None) -> None:
        ticket, stream, watch = run.ticket, run.ticket.stream, run.watch
        stats, why = stream.result or (Stats(), "interrupted")  # (none: cancelled before its first round)
        if reason is None:
            tail = run.stop.flush()
            if tail and watch is not None:
                watch.push(tail)
            elif tail:
                ticket.put(("text", tail))
            reason = "length" if why == "length" else "stop"
        if watch is not None:
            ticket.put(("text", watch.text))
        seconds = time.perf_counter() - run.t0
        self.metrics.finished(reason, len(stream.prompt_ids), stats, stream.generator.drafter.name, seconds)
        self._release(run)
        self._finish(ticket, Outcome(reason, len(stream.prompt_ids), run.tokens, _stats_field(stats, ticket),
                                     seconds))

    def _release(self, run: Run) -> None:
        with self._cond:
            self._runs.remove(run)

    def _finish(self, ticket: Ticket, outcome: Outcome) -> None:
        self.served += 1
        self.cancelled += outcome.finish_reason == "cancelled"
        self.last = {"id": ticket.job.id, "finish_reason": outcome.finish_reason,
                     "prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens}
        s = outcome.stats
        log.info("%s %s: %d prompt (%d cached) + %d new tokens in %.2f s (first after %.2f s), %.1f tok/s, "
                 "acceptance %s, %.2f tokens/round, finish %s%s", ticket.job.kind, ticket.job.id,
                 outcome.prompt_tokens, s.get("cached_prompt_tokens", 0), outcome.completion_tokens,
                 outcome.seconds, s.get("time_to_first_token_s", 0.0), s.get("tokens_per_s", 0.0),
                 f"{s['acceptance_rate']:.0%}" if s.get("drafted") else "-", s.get("tokens_per_round", 0.0),
                 outcome.finish_reason, f"; draft disabled: {s['draft_error']}" if s.get("draft_disabled") else "")
        ticket.put(("done", outcome))

    def metrics_text(self) -> str:
        """GET /metrics: Prometheus' text format."""
        return self.metrics.text(self.running, len(self._waiting), self.max_queue, self.parallel,
                                 sum(s.kv_bytes() for s in self.slots))

    def health(self) -> dict:
        return {"status": "ok", "model": self.model_id, "running": self.running, "waiting": len(self._waiting),
                "parallel": self.parallel, "max_queue": self.max_queue, "served": self.served,
                "cancelled": self.cancelled, "last": self.last}

    def alive(self) -> bool:
        """Whether the engine takes requests: not closed, its worker thread running."""
        return not self._closed and self._worker.is_alive()

    def close(self) -> None:
        """Server shutdown: stop the running generations within a round and drop the waiting ones."""
        with self._cond:
            self._closed = True
            for run in self._runs:
                run.ticket.cancel.set()
            for ticket in self._waiting:
                ticket.cancel.set()
            self._cond.notify()


def default_parallel(gen: SpeculativeGenerator, cap: int = 4, share: float = 0.5) -> int:
    """Slots to run by default: as many as fit in ``share`` of the memory available now with every slot's caches
    at the model's whole context (target and an own-cache draft), at most ``cap``, at least 1."""
    need = sum(lm.kv_bytes(gen.target.capacity) for lm in (gen.target, gen.drafter.lm) if lm is not None)
    available = available_memory()
    if not need or available is None:
        return 1
    return max(1, min(cap, int(available * share // need)))


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes (None where there is none: not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _call_watch(job: Job) -> CallWatch | None:
    """What ends a small model's loop in an answer held to calls (tools.CallWatch); None where the answer is not
    held to calls (text, or "auto" on a template with a tool form of its own)."""
    if job.tool_mode is None or job.tools is None:
        return None
    if job.tool_style == "generic":
        return CallWatch("generic", job.tools)
    if job.tool_mode != "auto":
        return CallWatch("call", job.tools)
    return CallWatch("tags", job.tools) if job.tool_style == "tags" else None


def _stats_field(stats, ticket: Ticket) -> dict:
    """Speculative statistics of one request: the response's "ortspec" field."""
    return {"drafter": ticket.stream.generator.drafter.name, "rounds": stats.rounds, "drafted": stats.drafted,
            "accepted": stats.accepted, "acceptance_rate": round(stats.acceptance_rate, 4),
            "tokens_per_round": round(stats.tokens_per_round, 4),
            "mean_draft_tokens": round(stats.drafted / stats.rounds, 4) if stats.rounds else 0.0,
            "tokens_per_s": round(stats.tokens_per_s, 2), "time_to_first_token_s": round(stats.first_token_s, 4),
            "draft_disabled": stats.draft_disabled, "draft_error": stats.draft_error,
            "prediction_accepted": stats.prediction_accepted, "prediction_rejected": stats.prediction_rejected,
            "cached_prompt_tokens": stats.cached_tokens}
