"""Several requests at once on the server's Engine: each on a slot of its own, stepped a round at a time in turn.

In-process (no HTTP): requests are submitted to an Engine and their items read from their tickets' queues on
an asyncio loop, so the order in which answers end is observed, not timed."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("starlette")

from ortspec import SpeculativeGenerator  # noqa: E402
from ortspec.exactness import wrong_verify  # noqa: E402
from ortspec.engine import PassNeed  # noqa: E402
from ortspec.scheduler import Engine, default_parallel  # noqa: E402
from ortspec.wire import parse_request  # noqa: E402
from stats_util import ALPHA, chi_square_p  # noqa: E402
from test_sequence_stats import PROMPT, exact_distribution  # noqa: E402

LONG = 3000  # tokens of an answer that runs for seconds here: it is cancelled once it has shown what it must


def job(engine: Engine, prompt: list[int], max_tokens: int, **extra):
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 0, **extra}
    if "temperature" not in extra:
        body["temperature"] = 0
    j = parse_request(body, "completion", engine.model_id, engine.drafters)
    return j, engine.open(j)


class Client:
    """A submitted request's items as they come: its token ids (from the logprobs entries) and its outcome."""

    def __init__(self, engine: Engine, prompt: list[int], max_tokens: int, **extra):
        j, stream = job(engine, prompt, max_tokens, **extra)
        self.ticket = engine.submit(j, stream, asyncio.get_running_loop())
        self.ids: list[int] = []
        self.outcome = None

    async def next(self):
        kind, value = await asyncio.wait_for(self.ticket.queue.get(), 120)
        if kind == "logprobs":
            self.ids.extend(e.token_id for e in value)
        elif kind == "done":
            self.outcome = value
        elif kind == "error":
            raise value
        return kind

    async def until(self, kinds: tuple, count: int = 1) -> None:
        seen = 0
        while seen < count:
            seen += await self.next() in kinds

    async def finish(self):
        while self.outcome is None:
            await self.next()
        return self


def alone(gen: SpeculativeGenerator, prompt: list[int], max_tokens: int, **kw) -> list[int]:
    return gen.generate(input_ids=prompt, max_new_tokens=max_tokens, do_sample=False, eos_token_id=[],
                        **kw).token_ids


def together_and_alone(gen: SpeculativeGenerator, prompts: list[list[int]], max_tokens: int, parallel: int = 4):
    """Greedy ids of ``prompts`` all sent at once to an Engine of ``parallel`` slots (their target passes
    batched), and of each run alone."""
    async def scene():
        engine = engine_for(gen, parallel)
        try:
            clients = [Client(engine, p, max_tokens) for p in prompts]
            ids = [(await c.finish()).ids for c in clients]
            assert engine.batch.passes > 0  # (their rounds rode batched target passes)
            return ids
        finally:
            engine.close()

    return asyncio.run(scene()), [alone(gen, p, max_tokens) for p in prompts]


@pytest.fixture(scope="module")
def gen(serve_bundle_small):
    return SpeculativeGenerator.load(serve_bundle_small)


@pytest.fixture(scope="module")
def serve_bundle_small(workdir):
    """A 4,096-position llama with an INT4 self-draft (wide enough that a long answer takes seconds)."""
    from tiny import make_model
    from conftest import _export
    hf = make_model("llama", workdir / "conc_hf", vocab=128, seed=3, positions=4096, hidden=256, layers=4)
    return _export(target=str(hf), draft="self", draft_quant="int4", out=workdir / "conc")


def engine_for(gen, parallel: int, **kw) -> Engine:
    return Engine(gen, "conc", parallel=parallel, **kw)


def test_a_short_request_ends_while_a_long_one_runs_and_waits_without_slots(gen):
    """Two slots: a short request sent while a long answer runs ends before it, with the ids it gets alone.
    One slot (the control): the short request gets nothing while the long one runs."""
    short_prompt, long_prompt = [5, 9, 13, 2], [7, 3, 3, 8, 1]
    want = alone(gen, short_prompt, 16)

    async def scene(parallel: int):
        engine = engine_for(gen, parallel)
        try:
            long = Client(engine, long_prompt, LONG)
            await long.until(("logprobs",))
            short = Client(engine, short_prompt, 16)
            if parallel == 1:
                await long.until(("logprobs",), 40)  # 40 more rounds of the long answer ...
                assert short.ticket.queue.empty()  # ... and the short one has not started
                assert engine.health()["waiting"] == 1
                long.ticket.cancel.set()
                await short.finish()
            else:
                await short.finish()
                assert long.outcome is None and engine.running == 1  # still running
                long.ticket.cancel.set()
            await long.finish()
            return short, long
        finally:
            engine.close()

    short, long = asyncio.run(scene(2))
    assert short.ids == want and short.outcome.finish_reason == "length"
    assert long.outcome.finish_reason == "cancelled" and long.outcome.completion_tokens < LONG
    short, long = asyncio.run(scene(1))
    assert short.ids == want


def test_every_greedy_answer_is_its_alone_answer_under_interleaving(gen):
    """Four slots, six requests of different lengths and prompts at once (two wait for a slot): each answer's
    ids are the ones it gets alone — most of their target passes run batched, several requests' rows in one
    pass — and later requests reuse what earlier ones left in the slots."""
    prompts = [[1 + i, 17, 40 + 3 * i, 2, 9][: 3 + i % 3] for i in range(6)]
    lengths = [40, 12, 25, 7, 33, 18]
    wants = [alone(gen, p, n) for p, n in zip(prompts, lengths)]

    async def scene():
        engine = engine_for(gen, 4)
        try:
            clients = [Client(engine, p, n) for p, n in zip(prompts, lengths)]
            assert engine.health()["waiting"] + engine.running == 6
            done = [await c.finish() for c in clients]
            assert engine.batch.passes >= 10  # (rounds of several requests rode one target pass)
            return done
        finally:
            engine.close()

    got = asyncio.run(scene())
    assert [c.ids for c in got] == wants
    assert all(c.outcome.finish_reason == "length" for c in got)


def test_rounds_plan_for_the_batch_they_ride_and_alone_once_it_thins(gen, monkeypatch):
    """Every round of a request running beside others plans for the batch (Request.crowd: the Engine's view,
    each request's part of a batched pass where every request brings k rows), the second round of a request
    admitted into a running batch too (its first ran alone); once the others have ended, the one left plans
    alone again. The control: without batching no round sees a crowd."""
    from ortspec.control.controllers import AutoController
    seen: list = []
    choose = AutoController.choose

    def recording(self):
        seen.append((id(self), self.crowd))
        return choose(self)
    monkeypatch.setattr(AutoController, "choose", recording)
    async def scene(batch: bool):
        engine = engine_for(gen, 4, batch=batch)
        try:
            long = Client(engine, [7, 3, 3, 8, 1], 240, num_draft_tokens="auto")
            other = Client(engine, [4, 4, 1, 9], 50, num_draft_tokens="auto")
            await long.until(("logprobs",), 3)
            short = [Client(engine, p, 20, num_draft_tokens="auto") for p in ([3, 9, 14, 2], [8, 1, 1, 6])]
            for c in short + [other, long]:
                await c.finish()
            return long
        finally:
            engine.close()

    asyncio.run(scene(True))
    by_request: dict = {}
    for who, crowd in seen:
        by_request.setdefault(who, []).append(crowd)
    *short, other, long = sorted(by_request.values(), key=len)  # (by how many rounds chose gamma)
    assert long[0] is None                                         # before any batched pass: nothing known
    inside = [c for c in long if c is not None]
    assert inside and max(c.requests for c in inside) == 4         # then in the batch of four
    assert all(len(c.pass_costs) == 17 and 0 < c.pass_costs[0] and list(c.pass_costs) == sorted(c.pass_costs)
               for c in inside)
    assert long[-1] is None                                        # alone again at the end
    assert len(short) == 2 and all(rounds[0] is not None and rounds[0].requests == 4 for rounds in short)
    # (admitted into the running batch, their first round that chose gamma, the second, planned for it)
    seen.clear()
    asyncio.run(scene(False))
    assert seen and all(crowd is None for _, crowd in seen)


def test_a_failure_of_the_scheduler_itself_ends_the_running_requests_with_an_error(gen, monkeypatch):
    """A failure outside any request's step (here in running the announced passes) fails the requests running
    then — they do not wait for ever — and the Engine serves the next ones."""
    async def scene():
        engine = engine_for(gen, 2)
        try:
            real = Engine._batch
            monkeypatch.setattr(Engine, "_batch", lambda self, runs: (_ for _ in ()).throw(RuntimeError("boom")))
            first = Client(engine, [3, 9, 14, 2], 30)
            with pytest.raises(RuntimeError, match="boom"):
                await first.finish()
            monkeypatch.setattr(Engine, "_batch", real)
            assert engine.running == 0
            return await Client(engine, [3, 9, 14, 2], 6).finish()
        finally:
            engine.close()

    again = asyncio.run(scene())
    assert again.ids == alone(gen, [3, 9, 14, 2], 6)


def test_a_cancelled_request_frees_its_slot_at_once(gen):
    """Two slots, both running long answers, a third waiting: cancelling one starts the third at the next turn,
    while the other long answer still runs."""
    async def scene():
        engine = engine_for(gen, 2)
        try:
            a, b = Client(engine, [3, 4, 5], LONG), Client(engine, [6, 7, 8], LONG)
            await a.until(("logprobs",))
            await b.until(("logprobs",))
            c = Client(engine, [9, 10, 11], 6)
            await a.until(("logprobs",), 10)
            assert c.ticket.queue.empty() and engine.health()["waiting"] == 1
            a.ticket.cancel.set()
            await c.finish()
            assert b.outcome is None and engine.running == 1
            b.ticket.cancel.set()
            await a.finish()
            await b.finish()
            return a, b, c
        finally:
            engine.close()

    a, b, c = asyncio.run(scene())
    assert a.outcome.finish_reason == b.outcome.finish_reason == "cancelled"
    assert c.ids == alone(gen, [9, 10, 11], 6)


def test_queue_limit_counts_waiting_requests_past_the_slots(gen):
    from ortspec.wire import ApiError

    async def scene():
        engine = engine_for(gen, 2, max_queue=1)
        try:
            running = [Client(engine, [3, 4, 5 + i], LONG) for i in range(3)]  # two run, one waits
            with pytest.raises(ApiError) as err:
                Client(engine, [1, 2], 4)
            assert err.value.status == 429 and "--parallel" in str(err.value.body())
            for c in running:
                c.ticket.cancel.set()
            for c in running:
                await c.finish()
            again = await Client(engine, [1, 2], 4).finish()  # room again
            return again
        finally:
            engine.close()

    assert asyncio.run(scene()).outcome.finish_reason == "length"


def test_a_prompt_that_starts_with_a_cached_one_feeds_only_the_rest(gen):
    """A system prompt every request repeats: the second request goes to the slot whose cache holds it and
    feeds only the rest (cached_prompt_tokens), with the ids it gets alone; a prompt sharing nothing goes to
    another free slot, leaving the first slot's cache in place."""
    system = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    first, other, second = system + [30, 31], [90, 91, 92], system + [40, 41, 42]

    async def scene():
        engine = engine_for(gen, 3)
        try:
            a = await Client(engine, first, 10).finish()
            b = await Client(engine, other, 10).finish()
            c = await Client(engine, second, 10).finish()
            return a, b, c
        finally:
            engine.close()

    a, b, c = asyncio.run(scene())
    assert a.outcome.stats["cached_prompt_tokens"] == 0 and b.outcome.stats["cached_prompt_tokens"] == 0
    assert c.outcome.stats["cached_prompt_tokens"] >= len(system) - 1
    assert c.ids == alone(SpeculativeGenerator.load(gen.bundle.root), second, 10)


@pytest.mark.parametrize("which", ["self-draft", "own-cache draft"])
def test_a_running_requests_prompt_start_is_copied_to_a_free_slot(gen, small_bundle, which):
    """A long answer runs on one slot; a request whose prompt starts with the same 20 tokens goes to a cold slot,
    which takes those tokens' keys and values from the running slot (target and an own-cache draft) and feeds
    only the rest: its ids are the ones it gets alone, and the long answer's are unchanged."""
    g = gen if which == "self-draft" else SpeculativeGenerator.load(small_bundle, drafter="model")
    vocab = g.vocab_size
    system = [(7 * i + 3) % vocab for i in range(20)]
    long_prompt, short_prompt = system + [1, 2], system + [5, 6, 7]
    want_short, want_long = alone(g, short_prompt, 12), alone(g, long_prompt, 60)

    async def scene():
        engine = engine_for(g, 2)
        try:
            long = Client(engine, long_prompt, 60)
            await long.until(("logprobs",))
            short = await Client(engine, short_prompt, 12).finish()
            await long.finish()
            return short, long
        finally:
            engine.close()

    short, long = asyncio.run(scene())
    assert short.outcome.stats["cached_prompt_tokens"] >= len(system) - 1
    assert short.ids == want_short and long.ids == want_long


def test_default_slots_are_sized_by_memory(gen, monkeypatch):
    import ortspec.scheduler as scheduler
    per_slot = sum(len(lm.cache.layout.inputs) * lm.cache.layout.kv_heads * lm.cache.layout.head_dim * 4
                   for lm in (gen.target,)) * gen.target.capacity  # (the self-draft shares the target's cache)
    monkeypatch.setattr(scheduler, "available_memory", lambda: per_slot * 5)
    assert default_parallel(gen) == 2
    monkeypatch.setattr(scheduler, "available_memory", lambda: per_slot)
    assert default_parallel(gen) == 1
    monkeypatch.setattr(scheduler, "available_memory", lambda: per_slot * 1000)
    assert default_parallel(gen) == 4


# -- the sampled law under concurrency -------------------------------------------------------------------------

N_SAMPLED = 3000


def concurrent_counts(bundle, sampling: dict, wrong: bool) -> tuple[np.ndarray, int, int]:
    """First three tokens of N_SAMPLED seeded sampled requests, all submitted at once to an Engine of three
    slots (their rounds interleave): counts [V, V, V], drafts proposed and accepted."""
    g = SpeculativeGenerator.load(bundle, drafter="model", threads=1)
    if wrong:
        g.sampled_verify = wrong_verify
    V = g.vocab_size
    counts = np.zeros((V, V, V), dtype=np.int64)
    totals = [0, 0, 0]

    async def scene():
        engine = Engine(g, "law", parallel=3, max_queue=N_SAMPLED)
        try:
            for lo in range(0, N_SAMPLED, 300):  # in waves: the asyncio queues stay small
                clients = [Client(engine, PROMPT, 4, temperature=sampling["temperature"], seed=s,
                                  num_draft_tokens=3) for s in range(lo, lo + 300)]
                for c in clients:
                    await c.finish()
                    counts[tuple(c.ids[:3])] += 1
                    totals[0] += c.outcome.stats["drafted"]
                    totals[1] += c.outcome.stats["accepted"]
            totals[2] = engine.batch.passes
        finally:
            engine.close()

    asyncio.run(scene())
    assert totals[2] >= N_SAMPLED // 10  # (rounds after the first verified on rows of batched passes)
    return counts, totals[0], totals[1]


def test_sampled_answers_under_concurrency_follow_the_target_law(small_bundle):
    """3,000 seeded sampled requests with drafts of 3, three slots interleaving, their target passes batched
    (several requests' rows in one pass): the first three tokens follow
    the exact target-only distribution (pooled chi-square); a wrong verifier (resampling from p instead of
    the residual) run the same way is caught."""
    sampling = dict(temperature=0.7)
    exact = exact_distribution(small_bundle, sampling)
    counts, drafted, accepted = concurrent_counts(small_bundle, sampling, wrong=False)
    assert counts.sum() == N_SAMPLED
    assert accepted >= 300 and drafted - accepted >= 300, "the test needs many accepts and many rejects"
    assert chi_square_p(counts, exact) > ALPHA
    wrong, _, _ = concurrent_counts(small_bundle, sampling, wrong=True)
    assert chi_square_p(wrong, exact) < ALPHA


def test_parallel_flag_is_checked():
    from ortspec.commands import _parallel
    assert _parallel("auto") == "auto" and _parallel("3") == 3
    for bad in ("0", "-2", "many"):
        with pytest.raises(ValueError, match="--parallel"):
            _parallel(bad)


def test_a_pausing_stream_pauses_before_each_target_pass_but_the_first(gen):
    """The scheduler's streams (adopt(..., pauses=True)) pause between a round's drafts and its target pass from
    the second round on (the first, the prompt's, runs whole: its first token waits for nobody), announcing the
    pass (engine.PassNeed: the ids a forward_rows would feed); their ids are the plain stream's."""
    kw = dict(input_ids=[3, 4, 5], max_new_tokens=20, do_sample=False, eos_token_id=[])
    plain = [t for ev in gen.stream(**kw) for t in ev.token_ids]
    items = list(gen.adopt(gen.stream(**kw), pauses=True))
    pauses = [isinstance(x, PassNeed) for x in items]
    assert not pauses[0] and sum(pauses) >= 2 and None not in items  # (a short prompt: no chunk pauses)
    assert all(not (a and b) for a, b in zip(pauses, pauses[1:]))  # one pause per round
    assert all(x.lm is gen.target and x.keep >= 1 and x.rows is not None for x in items if isinstance(x, PassNeed))
    assert [t for ev in items if not isinstance(ev, PassNeed) for t in ev.token_ids] == plain


def test_a_long_prompt_is_read_in_steps_while_a_short_request_runs(gen):
    """Two slots: a 1,500-token prompt is fed 128 positions a step, so a short request sent with it ends before
    the long request's first token (fed whole, that prompt would come first); both get their alone ids."""
    long_prompt = [(11 * i + 5) % gen.vocab_size for i in range(1500)]
    short_prompt = [9, 8, 7]
    want_long, want_short = alone(gen, long_prompt, 4), alone(gen, short_prompt, 3)

    async def scene():
        engine = engine_for(gen, 2)
        try:
            long = Client(engine, long_prompt, 4)
            short = Client(engine, short_prompt, 3)
            await short.finish()
            assert long.ticket.queue.empty()  # not a token of the long answer yet
            await long.finish()
            return long, short
        finally:
            engine.close()

    long, short = asyncio.run(scene())
    assert long.ids == want_long and short.ids == want_short


@pytest.mark.parametrize("sampled", [False, True])
def test_a_request_waiting_for_a_free_slot_cuts_the_running_drafts_short(gen, monkeypatch, sampled):
    """While a request waits to start on a free slot (Engine._admits_next), a running greedy request's draft
    model stops after its first step, so the newcomer's first token waits for little more than the pass under
    way; drafts are whole again once it has started, and every answer keeps its alone ids. A sampled request
    drafts whole throughout (the control): its seeded answer is its alone answer. Admission is held back here
    for a few rounds so that the window is there to observe."""
    from ortspec.drafting.model import ModelDrafter
    short_prompt, long_prompt = [5, 9, 13, 2], [7, 3, 3, 8, 1]
    extra = dict(temperature=0.8, seed=7) if sampled else {}
    want_long = gen.sibling("model").generate(input_ids=long_prompt, max_new_tokens=120, eos_token_id=[],
                                              num_draft_tokens=4, do_sample=True, **extra).token_ids \
        if sampled else alone(gen, long_prompt, 120)
    want_short = alone(gen, short_prompt, 8)
    seen: list[tuple[int, int, bool]] = []  # each draft model proposal: gamma, drafted, a request waiting
    real_propose, real_admit = ModelDrafter.propose, Engine._admit
    hold = {"on": False, "engine": None}

    def propose(self, committed, gamma, *args, **kw):
        draft = real_propose(self, committed, gamma, *args, **kw)
        seen.append((gamma, len(draft.tokens), hold["engine"]._admits_next()))
        return draft

    def admit(self):
        if not (hold["on"] and self._waiting):
            real_admit(self)

    monkeypatch.setattr(ModelDrafter, "propose", propose)
    monkeypatch.setattr(Engine, "_admit", admit)

    async def scene():
        engine = hold["engine"] = engine_for(gen, 2)
        try:
            long = Client(engine, long_prompt, 120, drafter="model", num_draft_tokens=4, **extra)
            await long.until(("logprobs",), 5)
            hold["on"] = True
            short = Client(engine, short_prompt, 8)
            await long.until(("logprobs",), 5)  # rounds of the long answer while the short one waits
            assert short.ticket.queue.empty() and engine.health()["waiting"] == 1
            hold["on"] = False
            await short.finish()
            await long.finish()
            return long, short
        finally:
            engine.close()

    long, short = asyncio.run(scene())
    assert long.ids == want_long[:len(long.ids)] and len(long.ids) == 120 and short.ids == want_short
    waiting = [drafted for gamma, drafted, w in seen if w and gamma == 4]
    whole = [drafted for gamma, drafted, w in seen if not w and gamma == 4]
    assert waiting and whole
    if sampled:
        assert sum(d == 4 for d in waiting + whole) >= len(waiting + whole) - 2  # whole throughout
    else:
        assert all(d == 1 for d in waiting)                   # cut after the first step while one waited
        assert sum(d == 4 for d in whole) >= len(whole) - 2   # whole otherwise (bar the context's end)
