"""Every fast path of ``ortspec.sampling`` against the plain reference (``ortspec.reference``), by generated cases.

Rows of 17 to 152,000 entries (multiples of 32 and not), fp16-rounded rows, ties at the maximum, at the k-th
entry and at the top-p cut, temperatures 0.05-2, top-k and top-p alone and together, penalties below and
above 1, and bad words that overlap, repeat, reach past 17 tokens or name the end of sequence. Each case goes
through the host row (``LogitsPipeline.row``), the row read through its largest entries (the graph's TopK, as a
pass returns it), the rows verification takes (``verify_row``: LazyRow or the host row) and greedy on both. Asserted:
the same support as the reference, each probability within the float32 rounding of the weights, the same
greedy token, and for the verification rows the very verdicts and draws of the whole row on a grid of uniform
numbers. Negative controls put back two fixed bugs (a token banned twice; bad words matched on the last 16
tokens only) and show these checks fail.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ortspec.config import SamplingConfig
from ortspec.sampling import LazyRow, LogitsPipeline, Processors, Row, Rows, acceptance_probability
from ortspec import reference

EOS = 2
WIDTHS = (17, 31, 300, 4096, 4099, 50_001, 152_000)
RUN = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


class TopRow(Row):
    """One row as a pass returns it: the whole row, its largest entries (sorted, the lower id first on ties, as
    onnxruntime's TopK gives them) and the normalizer sum exp((l - max) * scale), as the graph computes it."""

    on_host = False

    def __init__(self, row: np.ndarray, scale: float):
        self.row = row
        order = np.lexsort((np.arange(row.size), -row))
        self._ids, self._values = order[:512], row[order[:512]]
        x = (row.astype(np.float64) - row.max()) * np.float32(scale)
        self._norm = (scale, float(np.float32(np.exp(x).sum())), 1)

    def top(self, k: int):
        k = min(k, self.row.size, self._ids.size)
        bound = float(self._values[k]) if k < self._ids.size else (-math.inf if k >= self.row.size else None)
        if bound is None:
            raise AssertionError("a test row serves at most 512 entries")
        return self._ids[:k].tolist(), self._values[:k].tolist(), bound

    def norm(self):
        return self._norm

    def numpy(self) -> np.ndarray:
        return self.row

    @property
    def width(self) -> int:
        return self.row.size


class TopRows(list, Rows):
    """Rows with largest entries, as ``LogitsPipeline.greedy`` receives a pass's rows."""


@st.composite
def cases(draw, widths=WIDTHS, sample=True):
    width = draw(st.sampled_from(widths))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "peaked", "flat", "fp16", "grid"]))
    scale = {"normal": 3.0, "peaked": 2.0, "flat": 0.3, "fp16": 4.0, "grid": 2.0}[kind]
    row = (rng.standard_normal(width) * scale).astype(np.float32)
    if kind == "peaked":
        row[rng.integers(0, width, 8)] += 12
    elif kind == "fp16":
        row = row.astype(np.float16).astype(np.float32)
    elif kind == "grid":
        row = np.round(row * 2) / np.float32(2)
    if draw(st.booleans()):  # ties at the maximum
        row[rng.integers(0, width, 3)] = row.max()
    context = [int(t) for t in rng.integers(0, width, draw(st.integers(1, 40)))]
    context[:3] = np.argsort(-row)[:3].tolist()  # the largest entries in the context: a penalty moves them
    words = ()
    if draw(st.booleans()):
        n = draw(st.sampled_from([2, 3, 18, 19, 25]))
        last = int(np.argmax(row))
        words = ((EOS,), (last,), (int(rng.integers(0, width)),),
                 tuple(context[-(n - 1):]) + (last,), tuple(context[-1:]) + (last,),  # a token banned twice
                 tuple(context[-(n - 1):]) + (int(np.argsort(-row)[1]),))
    k = draw(st.sampled_from([0, 0, 1, 20, 50, 300])) if sample else 0
    if k and draw(st.booleans()):  # ties at the k-th entry
        kth = np.sort(row)[::-1][min(k, width) - 1]
        row[rng.integers(0, width, 2)] = kth
    cfg = SamplingConfig(
        do_sample=sample, temperature=draw(st.sampled_from([0.05, 0.3, 0.7, 1.0, 1.3, 2.0])), top_k=k,
        top_p=draw(st.sampled_from([1.0, 1.0, 0.5, 0.8, 0.95])) if sample else 1.0,
        repetition_penalty=draw(st.sampled_from([1.0, 1.0, 0.8, 1.05, 1.3])), bad_words_ids=words)
    new = [int(t) for t in rng.integers(0, width, draw(st.integers(0, 3)))]
    return row, context, new, cfg


def _exact_eos_free(cfg: SamplingConfig) -> SamplingConfig:
    """The settings as a generator hands them to its pipeline: an end-of-sequence word alone dropped."""
    words = tuple(w for w in cfg.bad_words_ids if w != (EOS,))
    return SamplingConfig(cfg.do_sample, cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty, words)


def _unsettled_cut(scores: np.ndarray, top_p: float, differ: np.ndarray) -> bool:
    """Whether the tokens two nuclei disagree on sit at a cut float rounding decides: the mass before them within
    1e-5 of top_p (float32 weights against float64 probabilities)."""
    if top_p >= 1.0:
        return False
    x = scores.astype(np.float64)
    ids = np.arange(scores.size)
    order = np.lexsort((-ids, -x))
    p = np.exp(x[order] - x.max())
    p /= p.sum()
    before = dict(zip(order.tolist(), (np.cumsum(p) - p).tolist()))
    return all(abs(before[int(t)] - top_p) < 1e-5 for t in np.flatnonzero(differ))


def assert_matches_reference(dense: np.ndarray, row: np.ndarray, context: list[int], cfg: SamplingConfig):
    """A distribution (dense float64) equals the reference's: the same support, each probability within the
    float32 rounding of its weight (relative 1e-5 + 1e-6 |y|, y its exponent in bits below the largest)."""
    ref = reference.distribution(row, context, cfg, (EOS,))
    # (float32 weights below 2**-126 of the largest are denormals, 0 below 2**-149, and 0 from 2**-126 where the
    # CPU flushes denormals; the reference's float64 softmax keeps them. Tokens below 2**-75 of the largest are
    # left out of the comparison: under 1e-17 of mass in all)
    tiny = ref.max() * 2.0 ** -75
    ref, dense = np.where(ref < tiny, 0.0, ref), np.where(ref < tiny, 0.0, dense)
    support, ref_support = dense > 0, ref > 0
    if not np.array_equal(support, ref_support):
        scores = reference.warped_scores(row, context, cfg, (EOS,))
        assert _unsettled_cut(scores, cfg.top_p, support != ref_support), \
            f"support differs at {np.flatnonzero(support != ref_support)[:8]}"
        return
    y = np.abs(np.log2(np.maximum(ref[ref_support], 1e-300) / ref.max()))
    tol = (2e-5 + 2e-6 * y) * ref[ref_support] + 1e-12
    worst = np.max(np.abs(dense[ref_support] - ref[ref_support]) - tol)
    assert worst <= 0, f"a probability is off by {worst:.3g} beyond its rounding"


@RUN
@given(cases())
def test_host_rows_equal_the_reference(case):
    row, context, new, cfg = case
    pipe = LogitsPipeline(_exact_eos_free(cfg), row.size)
    dist = pipe.row(row.copy(), context, new)
    assert_matches_reference(dist.dense(row.size), row, context + new, cfg)


@RUN
@given(cases())
def test_rows_read_through_their_largest_entries_equal_the_reference(case):
    row, context, new, cfg = case
    pipe = LogitsPipeline(_exact_eos_free(cfg), row.size)
    dist = pipe.row(TopRow(row, 1 / cfg.temperature), context, new)
    assert_matches_reference(dist.dense(row.size), row, context + new, cfg)


@RUN
@given(cases(sample=False))
def test_greedy_host_and_top_rows_choose_the_reference_token(case):
    row, context, new, cfg = case
    pipe = LogitsPipeline(_exact_eos_free(cfg), row.size)
    want = reference.greedy_token(row, context + new, cfg, (EOS,))
    # (a block's row i reads the context base + new[:i]: one row, base + new as its base)
    assert int(pipe.greedy(row[None].copy(), context + new)[0]) == want
    assert int(pipe.greedy(TopRows([TopRow(row, 1.0)]), context + new)[0]) == want


GRID = np.concatenate([np.linspace(0, 1, 41)[1:-1], [1e-9, 1 - 1e-9]])


def check_verification_row(row: np.ndarray, context: list[int], new: list[int], cfg: SamplingConfig,
                           pipe: LogitsPipeline | None = None):
    """The row verification takes (LazyRow or the host row) gives the whole row's verdicts and draws on a grid of
    uniform numbers, and the whole row is the reference's distribution."""
    pipe = pipe or LogitsPipeline(_exact_eos_free(cfg), row.size)
    pipe.LAZY_PENALTY_VOCAB = 0  # (penalized rows as at a wide vocabulary)
    got = pipe.verify_row(TopRow(row, pipe.norm_scale() or 1.0), context, new)
    whole = pipe.row(row.copy(), context, new)
    assert_matches_reference(whole.dense(row.size), row, context + new, cfg)
    tokens = np.argsort(-row)[:6].tolist() + [int(t) for t in np.random.default_rng(row.size).integers(0, row.size, 3)]
    for t in tokens:
        p = whole.prob(t)
        for q in {min(1.0, max(p, 1e-9) * f) for f in (0.5, 1.0, 2.0)}:
            a = acceptance_probability(p, q)
            for u in list(GRID) + [a * (1 - 1e-9), a, min(a * (1 + 1e-9), 1 - 1e-16)]:
                assert got.accepts(t, q, u) == whole.accepts(t, q, u), (type(got).__name__, t, q, u)
    for u in GRID:
        assert got.draw(u) == whole.draw(u), (type(got).__name__, u)
    return got


@RUN
@given(cases(widths=(300, 4099, 50_001, 152_000)))
def test_verification_rows_give_the_whole_rows_verdicts_and_draws(case):
    row, context, new, cfg = case
    if cfg.top_k:  # (verification of top-k rows is the host row's)
        cfg = SamplingConfig(True, cfg.temperature, 0, cfg.top_p, cfg.repetition_penalty, cfg.bad_words_ids)
    check_verification_row(row, context, new, cfg)


def test_lazy_rows_are_reached_by_the_generated_cases():
    """The verification test above exercises LazyRow, not only the host row."""
    kinds = set()
    rng = np.random.default_rng(3)
    for top_p, flat in ((1.0, False), (0.9, True), (0.5, False)):
        row = (rng.standard_normal(50_001) * (0.3 if flat else 3)).astype(np.float32)
        cfg = SamplingConfig(True, 1.0, 0, top_p)
        kinds.add(type(check_verification_row(row, [1, 2], [], cfg)).__name__)
    assert {"LazyRow", "Dist"} <= kinds


# -- the two bugs put back: the checks above must catch them ---------------------------------------------------

def _banned_twice(self, base, new):
    """The bug fixed: a token that two words ban listed twice."""
    banned = self.banned_always.tolist()
    context = [int(t) for t in base[-16:]] + [int(t) for t in new]
    for word in self.multi:
        prefix = list(word[:-1])
        if word[-1] < self.vocab_size and context[len(context) - len(prefix):] == prefix:
            banned.append(word[-1])
    return banned


def _the_issue_row():
    rng = np.random.default_rng(0)
    row = rng.standard_normal(4096).astype(np.float32)
    row[5], row[11], row[12] = 8.0, 7.0, 6.5
    return row


def test_a_token_banned_twice_gives_the_reference_probabilities():
    row = _the_issue_row()
    cfg = SamplingConfig(do_sample=True, top_k=0, bad_words_ids=((5,), (7, 5), (int(np.argmin(row)),)))
    pipe = LogitsPipeline(cfg, row.size)
    lazy = pipe.verify_row(TopRow(row, 1.0), [1, 2, 7], [])
    assert isinstance(lazy, LazyRow)
    draws = np.bincount([lazy.draw(u) for u in (np.arange(20_000) + 0.5) / 20_000], minlength=row.size)
    p = reference.distribution(row, [1, 2, 7], cfg)
    assert abs(draws[12] / 20_000 - p[12]) < 1e-3 and abs(p[12] - 0.0794) < 1e-3
    check_verification_row(row, [1, 2, 7], [], cfg)


def test_negative_control_a_token_banned_twice_is_caught(monkeypatch):
    monkeypatch.setattr(Processors, "banned", _banned_twice)
    with pytest.raises(AssertionError):
        test_a_token_banned_twice_gives_the_reference_probabilities()


def _long_word_case():
    rng = np.random.default_rng(1)
    row = (rng.standard_normal(300) * 2).astype(np.float32)
    context = [int(t) for t in rng.integers(3, 300, 30)]
    top = int(np.argmax(row))
    cfg = SamplingConfig(do_sample=True, top_k=20, bad_words_ids=(tuple(context[-18:]) + (top,),))  # 19 tokens
    return row, context, cfg, top


def test_a_19_token_word_is_banned_at_every_position_of_a_pass():
    row, context, cfg, top = _long_word_case()
    pipe = LogitsPipeline(cfg, row.size)
    for cut in (0, 1, 3):  # the word's prefix split between the committed text and the pass's drafts
        base, new = context[:len(context) - cut], context[len(context) - cut:]
        dist = pipe.row(row.copy(), base, new)
        assert dist.prob(top) == 0.0
        assert_matches_reference(dist.dense(row.size), row, context, cfg)
    assert int(LogitsPipeline(SamplingConfig(bad_words_ids=cfg.bad_words_ids), 300)
               .greedy(row[None].copy(), context)[0]) != top


def test_negative_control_a_16_token_window_is_caught(monkeypatch):
    monkeypatch.setattr(Processors, "banned", _banned_twice)
    with pytest.raises(AssertionError):
        test_a_19_token_word_is_banned_at_every_position_of_a_pass()


def test_negative_control_the_reference_check_catches_a_wrong_tie_rule():
    """Ties at the top-p cut decided the other way (the lower id kept) fail the support check."""
    row = np.array([3.0, 1.0, 1.0, 1.0, 0.0, 1.0] + [-20.0] * 11, dtype=np.float32)
    cfg = SamplingConfig(do_sample=True, top_p=0.75)
    wrong = np.zeros(row.size)
    keep = [0, 1, 2]
    wrong[keep] = np.exp(row[keep] - row.max()) / np.exp(row[keep] - row.max()).sum()
    with pytest.raises(AssertionError):
        assert_matches_reference(wrong, row, [], cfg)
    right = LogitsPipeline(cfg, row.size).row(row.copy(), [])
    assert_matches_reference(right.dense(row.size), row, [], cfg)
