"""The logits pipeline matches Hugging Face transformers' processors, row by row."""
import numpy as np
import pytest

from ortspec.config import SamplingConfig
from ortspec.sampling import LogitsPipeline, top_p_filter

torch = pytest.importorskip("torch")
from transformers.generation.logits_process import (  # noqa: E402
    LogitsProcessorList, NoBadWordsLogitsProcessor, RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

V = 300
SETTINGS = [
    dict(do_sample=True),
    dict(do_sample=True, temperature=0.7),
    dict(do_sample=True, temperature=1.3, top_k=20),
    dict(do_sample=True, top_p=0.9),
    dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.8, repetition_penalty=1.3),
    dict(do_sample=True, repetition_penalty=0.7, top_p=0.5),
    dict(do_sample=True, top_p=0.999),  # nucleus larger than the partial-sort window
    dict(do_sample=True, bad_words_ids=((5,), (7, 9)), top_k=40),
    dict(do_sample=True, logit_bias=((3, 8.5), (7, -2.25), (290, -100.0)), top_k=20),  # 7 also penalized
    dict(do_sample=True, logit_bias=((11, 100.0), (12, -0.5)), repetition_penalty=1.3, top_p=0.9),
]


def hf_probs(cfg: SamplingConfig, logits: np.ndarray, context: list[int]) -> np.ndarray:
    procs = LogitsProcessorList()
    if cfg.logit_bias:
        procs.append(SequenceBiasLogitsProcessor({(t,): b for t, b in cfg.logit_bias}))
    if cfg.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty))
    if cfg.bad_words_ids:
        procs.append(NoBadWordsLogitsProcessor([list(w) for w in cfg.bad_words_ids], eos_token_id=None))
    if cfg.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k:
        procs.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        procs.append(TopPLogitsWarper(cfg.top_p))
    ids = torch.tensor([context])
    scores = procs(ids, torch.tensor(logits[None], dtype=torch.float32))
    return torch.softmax(scores.double(), dim=-1)[0].numpy()


@pytest.mark.parametrize("settings", SETTINGS)
def test_matches_transformers(settings):
    cfg = SamplingConfig(**settings)
    pipe = LogitsPipeline(cfg, V)
    rng = np.random.default_rng(0)
    base = list(rng.integers(0, V, 40))
    new = [7, 9, 11, 5]
    rows = (rng.standard_normal((len(new) + 1, V)) * 3).astype(np.float32)
    ours = pipe.probs(rows, base, new)
    for i in range(rows.shape[0]):
        ref = hf_probs(cfg, rows[i], base + new[:i])
        assert np.allclose(ours[i], ref, atol=1e-5), (i, np.abs(ours[i] - ref).max())
        assert np.array_equal(ours[i] > 0, ref > 0)


def test_greedy_applies_penalty_and_takes_lowest_index_on_ties():
    pipe = LogitsPipeline(SamplingConfig(repetition_penalty=2.0), 4)
    rows = np.array([[1.0, 3.0, 3.0, 2.0]], dtype=np.float32)
    assert pipe.greedy(rows, [0])[0] == 1          # tie between 1 and 2: lowest index
    assert pipe.greedy(rows, [1])[0] == 2          # 1 penalized to 1.5
    assert pipe.greedy(rows, [1, 2])[0] == 3       # both penalized


def test_the_penalized_set_follows_the_context():
    """The distinct tokens a penalty reads are cached per context: a list extended in place adds only its new
    tokens (with ``growing_context``, as the decode loop sets it, without comparing the prefix again); any other
    context, or one changed in place where the flag is off, is read afresh. Each time the set is exactly the
    context's."""
    rows = np.array([[1.0, 3.0, 3.0, 2.0, 0.5]], dtype=np.float32)
    for growing in (False, True):
        pipe = LogitsPipeline(SamplingConfig(repetition_penalty=2.0), 5)
        pipe.growing_context = growing
        context = [1]
        for extra in ([2], [3, 3], [7]):  # 7: outside the vocabulary
            pipe.greedy(rows, context)
            assert pipe.processors.seen == {t for t in context if t < 5}
            context.extend(extra)
        pipe.greedy(rows, context)
        assert pipe.processors.seen == {1, 2, 3}
        assert pipe.greedy(rows, [4])[0] == 1 and pipe.processors.seen == {4}  # another list: read afresh
        assert pipe.greedy(rows, [4, 1])[0] == 2 and pipe.processors.seen == {4, 1}
    pipe = LogitsPipeline(SamplingConfig(repetition_penalty=2.0), 5)
    context = [1, 2]
    pipe.greedy(rows, context)
    context[1] = 0  # changed in place (no decode loop does this): the flag is off, so it is noticed
    pipe.greedy(rows, context)
    assert pipe.processors.seen == {0, 1}


def test_context_of_each_row_includes_earlier_drafts():
    pipe = LogitsPipeline(SamplingConfig(repetition_penalty=10.0), 3)
    rows = np.array([[1.0, 2.0, 0.0]] * 3, dtype=np.float32)
    # row 0 sees [2]; row 1 sees [2, 1] (1 penalized); row 2 sees [2, 1, 0]: 1 -> 0.1, 2 -> 0.2
    assert list(pipe.greedy(rows, [2], new=[1, 0])) == [1, 0, 1]


def test_padded_logits_are_cut_to_the_shared_vocabulary():
    pipe = LogitsPipeline(SamplingConfig(do_sample=True), 3)
    probs = pipe.probs(np.array([[0.0, 0.0, 0.0, 50.0]], dtype=np.float32), [0])
    assert probs.shape == (1, 3) and np.allclose(probs, 1 / 3)


def test_top_p_keeps_at_least_one_and_reaches_mass():
    p = np.array([0.05, 0.6, 0.25, 0.1])
    assert np.allclose(top_p_filter(p, 0.5), [0, 1, 0, 0])
    out = top_p_filter(p, 0.7)
    assert np.allclose(out, np.array([0, 0.6, 0.25, 0]) / 0.85)


def test_all_banned_is_an_error():
    pipe = LogitsPipeline(SamplingConfig(bad_words_ids=((0,), (1,))), 2)
    with pytest.raises(ValueError, match="banned"):
        pipe.greedy(np.zeros((1, 2), dtype=np.float32), [0])


@pytest.mark.parametrize("bad", [dict(temperature=0), dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(top_k=-1), dict(top_k=2.5), dict(repetition_penalty=0.0),
                                 dict(temperature=float("nan"))])
def test_invalid_settings_name_the_argument(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        SamplingConfig(do_sample=True, **bad)


def test_scratch_arrays_are_leased_until_the_next_round():
    """A scratch array stays its taker's until the next round (whatever else refers to it, on any interpreter):
    never handed out twice within a round, handed out again after ``new_round`` (no fresh vocabulary-wide array,
    no page faults, per row), and at once where the taker gives it back."""
    from ortspec.sampling import Scratch
    scratch = Scratch()
    first = scratch.take(1000)
    address = first.ctypes.data
    del first  # no reference left: still leased for this round
    second = scratch.take(1000)
    assert second.ctypes.data != address
    assert scratch.take(1000, np.float64).dtype == np.float64  # another type: another array
    scratch.give_back(second)
    assert scratch.take(1000) is second
    scratch.new_round()
    seen = {scratch.take(1000).ctypes.data for _ in range(2)}
    assert address in seen and len(seen) == 2


def test_round_pool_keeps_at_most_keep_buffers_and_never_reuses_a_one_off():
    from ortspec.arena import RoundPool
    pool = RoundPool(keep=2)
    made = []
    make = lambda: made.append(object()) or made[-1]  # noqa: E731
    kept = [pool.take("k", make) for _ in range(2)]
    extra = pool.take("k", make)  # past ``keep``: a one-off
    assert len({id(x) for x in kept + [extra]}) == 3 and pool.leased == 2
    pool.give_back(extra)  # ignored: never handed out again
    pool.new_round()
    again = [pool.take("k", make) for _ in range(3)]
    assert {id(x) for x in again[:2]} == {id(x) for x in kept} and again[2] is not extra
    assert pool.take("other", make) is made[-1]  # keys do not share buffers


def test_seen_tokens_follow_growing_changing_and_empty_contexts():
    """The repetition penalty's token set, kept across rows of a request: exactly the distinct in-vocabulary ids
    of base + new whether the context grows, is replaced by another, shrinks to nothing or repeats ids; also where
    some rows read only the set (rows read from their largest entries: the id array catches up when asked for)."""
    pipe = LogitsPipeline(SamplingConfig(do_sample=True, repetition_penalty=1.2), 50)
    rng = np.random.default_rng(5)
    base: list[int] = []
    for step in range(40):
        if step in (15, 30):
            base = [int(t) for t in rng.integers(0, 60, 5)]  # another request's context
        elif step == 25:
            base = []
        else:
            base = base + [int(t) for t in rng.integers(0, 60, int(rng.integers(1, 4)))]
        new = [int(t) for t in rng.integers(0, 60, int(rng.integers(0, 4)))]
        if step % 3 == 1:  # (the reset at step 25 among them)
            pipe.processors.update_seen(base)
            assert pipe.processors.seen == {t for t in base if t < 50}, step
            continue
        got = pipe.processors.seen_tokens(base, new)
        assert got.size == len(set(got.tolist()))  # no id twice
        assert set(got.tolist()) == {t for t in base + new if t < 50}, step


def test_a_block_of_fewer_rows_ends_where_new_ends():
    """A draft step's one row is conditioned on all of the drafts before it (the penalty reads them), as the
    last row of a verification block is."""
    pipe = LogitsPipeline(SamplingConfig(repetition_penalty=3.0), 8)
    row = np.array([[5.0, 4.9, 0, 0, 0, 0, 0, 0]], np.float32)
    assert pipe.greedy(row, [2, 3], [])[0] == 0
    assert pipe.greedy(row, [2, 3], [0])[0] == 1  # 0 was drafted before this row: penalized
    assert pipe.greedy(np.vstack([row, row]), [2, 3], [0]).tolist() == [0, 1]
    assert np.array_equal(pipe.scores(row, [2, 3], [0])[0], pipe.scores(np.vstack([row, row]), [2, 3], [0])[1])


def test_logit_bias_greedy_bit_for_bit_as_transformers():
    """Biased then penalized in float32, as transformers' SequenceBias then RepetitionPenalty."""
    from ortspec.reference import processed_scores
    rng = np.random.default_rng(3)
    cfg = SamplingConfig(repetition_penalty=1.3, logit_bias=((3, 2.5), (7, -1.75), (8, 0.1)))
    pipe = LogitsPipeline(cfg, V)
    base, new = [7, 8, 20], [3, 9]
    rows = (rng.standard_normal((3, V)) * 3).astype(np.float32)
    ours = pipe.scores(rows, base, new)
    for i in range(3):
        procs = LogitsProcessorList([SequenceBiasLogitsProcessor({(t,): b for t, b in cfg.logit_bias}),
                                     RepetitionPenaltyLogitsProcessor(cfg.repetition_penalty)])
        theirs = procs(torch.tensor([base + new[:i]]), torch.tensor(rows[i][None]))[0].numpy()
        assert np.array_equal(ours[i], theirs) and np.array_equal(processed_scores(rows[i], base + new[:i], cfg),
                                                                  theirs)
    assert pipe.top_entries() == 0  # a bias may raise any entry: rows are read whole


@pytest.mark.parametrize("bias", [{5: True}, {-1: 1.0}, {5: 101}, {5: float("nan")}, {"5": 1.0}])
def test_bad_logit_bias_is_refused(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingConfig(logit_bias=bias)
