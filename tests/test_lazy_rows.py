"""LazyRow: verification under settings without truncation settles a draft from the graph's normalizer and the
row's largest entries. The verdict must be the whole row's, bit for bit, for every uniform number: checked on
rows whose normalizer onnxruntime computes with the graph's own nodes, with uniform numbers placed at the very
edge of each acceptance probability, and with a negative control (a normalizer the processors' changes were not
put into) that the same check catches. A large-sample test checks the first committed token's distribution.
"""
from __future__ import annotations

from dataclasses import replace
import math

import numpy as np
import onnxruntime as ort
import pytest

from ortspec import verify
from ortspec.config import DRAFT_TOP_K, SamplingConfig, draft_sampling
from ortspec.sampling import (HEAD_MIN, LAZY_TOP, LEAN_MAX, WIDE, Dist, LazyRow, LogitsPipeline, Row, acceptance_probability,
                            array_head, draw_weights, sample_weights, thin_head, wide_nucleus)
from ortspec.export.graph import add_top_outputs
from stats_util import ALPHA, chi_square_p, grouped
from test_fast_sampling import rows_of


@pytest.fixture(scope="module")
def norm_graph(tmp_path_factory):
    """Sessions of a graph that returns its input as logits, with the TopK and normalizer export appends, per
    width (the normalizer's nodes, as onnxruntime runs them in a target graph)."""
    import onnx
    from onnx import TensorProto, helper
    made = {}

    def session(width: int) -> ort.InferenceSession:
        if width not in made:
            path = tmp_path_factory.mktemp("norm") / "model.onnx"
            x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence_length", width])
            out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "sequence_length", width])
            graph = helper.make_graph([helper.make_node("Identity", ["x"], ["logits"])], "rows", [x], [out])
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
            assert add_top_outputs(path, norm=True)
            made[width] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return made[width]
    return session


class GraphRow(Row):
    """One row as a target pass returns it: its TopK and normalizer from onnxruntime, the row on the host."""

    def __init__(self, sess, row: np.ndarray, k: int, scale: float, block: int):
        k = min(k, row.size)
        values, ids, norm = sess.run(["top_values", "top_ids", "logits_norm"],
                                     {"x": row[None, None], "logits_top_k": np.array([k], np.int64),
                                      "logits_norm_scale": np.array([scale], np.float32)})
        self.row, self.values, self.ids = row, values[0, 0], ids[0, 0]
        self.scale, self.z, self.block = scale, float(norm[0, 0]), block

    def top(self, k: int):
        values = self.values[:k].tolist()
        return self.ids[:k].tolist(), values, values[-1] if k < self.row.size else -math.inf

    def norm(self):
        return self.scale, self.z, self.block

    def numpy(self) -> np.ndarray:
        return self.row

    @property
    def width(self) -> int:
        return self.row.size

    on_host = False  # (the whole row is copied before processing: the same row serves many checks)


CASES = {
    "T 0.7": dict(temperature=0.7),
    "T 1.0": dict(temperature=1.0),
    "T 0.3": dict(temperature=0.3),
    "penalty 1.3": dict(repetition_penalty=1.3),
    "penalty + bans": dict(repetition_penalty=1.1, temperature=0.8, bad_words_ids=[[3], [5, 7]]),
    "top-p 0.9": dict(top_p=0.9),
    "top-p 0.5 + penalty": dict(top_p=0.5, temperature=0.8, repetition_penalty=1.3),
}


def _rows(kind: str, width: int, n: int, seed: int) -> np.ndarray:
    if kind == "spread":  # ~120 tokens within ~2 nats of the largest above a low bulk: weights of 2**-10 of
        rng = np.random.default_rng(seed)  # the largest and more reach past the 64 entries read at T 1.0
        rows = rng.standard_normal((n, width)) - 9.0
        for r in range(n):
            rows[r, rng.choice(width, 120, replace=False)] = rng.standard_normal(120) * 0.7
        return rows.astype(np.float32)
    return rows_of(kind, width, n, seed)


def _context(row: np.ndarray, vocab: int, seed: int) -> list[int]:
    """A context holding the row's largest entries (a penalty then changes the normalizer the most) and more."""
    top = np.argsort(-row[:vocab])[:6].tolist()
    return top + np.random.default_rng(seed).integers(0, vocab, 40).tolist() + [5]


def _pipeline(cfg: SamplingConfig, vocab: int) -> LogitsPipeline:
    """A target pipeline as at a vocabulary wide enough for LazyRow to take penalized rows (from
    LAZY_PENALTY_VOCAB entries): its rows then carry the head a draw takes first, as LazyRow's do."""
    pipe = LogitsPipeline(cfg, vocab)
    pipe.LAZY_PENALTY_VOCAB = 0
    return pipe


def _checks(pipe: LogitsPipeline, row: np.ndarray, base: list[int], full: Dist, seed: int):
    """(token, q, u) triples: the row's likely tokens, a few others, banned ones; q around p; u at random and at
    the edge of the exact acceptance probability (1e-3 ... 1e-12 either side, and on it)."""
    rng = np.random.default_rng(seed)
    vocab = pipe.vocab_size
    tokens = np.argsort(-row[:vocab])[:8].tolist() + rng.integers(0, vocab, 4).tolist() + [3]
    out = []
    for t in tokens:
        p = full.prob(t)
        for q in (max(p, 1e-9) * f for f in (0.5, 0.97, 1.0, 1.03, 2.0)):
            q = min(q, 1.0)
            a = acceptance_probability(p, q)
            out.append((t, q, float(rng.random()), False))
            for e in (1e-3, 1e-6, 1e-9, 1e-12):
                out += [(t, q, a * (1 - e), True), (t, q, min(a * (1 + e), 1 - 1e-16), True)]
            out.append((t, q, a, True))
    return out


def _mismatches(norm_graph, cls, setting: dict, kind: str, width: int, vocab: int, rows: int = 4):
    """Verdicts of ``cls`` rows that differ from the whole row's, over every check of every row; and of the checks
    with a uniform number at random (on rows whose nucleus, if any, is among the entries read), how many it
    settled without the whole row, of how many."""
    cfg = SamplingConfig(do_sample=True, top_k=0, **setting)
    sess = norm_graph(width)
    bad = settled = total = 0
    for r, row in enumerate(_rows(kind, width, rows, seed=len(kind) + width)):
        base = _context(row, vocab, r)
        pipe = _pipeline(cfg, vocab)
        graph_row = GraphRow(sess, row, LAZY_TOP, 1 / cfg.temperature, 32 if width % 32 == 0 else 1)
        full = pipe.row(row.copy(), base, [7])
        small = cfg.top_p == 1.0 or (full.sparse and full.ids.size <= LAZY_TOP // 2)  # a nucleus among those read
        for tok, q, u, edge in _checks(pipe, row, base, full, r):
            lazy = cls(pipe, graph_row, base, [7])
            before = pipe.lazy_settled
            if lazy.accepts(tok, q, u) != full.accepts(tok, q, u):
                bad += 1
            if not edge and small:
                settled += pipe.lazy_settled - before
                total += 1
    return bad, settled, total


@pytest.mark.parametrize("setting", list(CASES))
@pytest.mark.parametrize("kind,width,vocab", [("peaked", 20_000, 20_000), ("flat", 4096, 4096),
                                              ("ties", 2000, 2000), ("peaked", 151_936, 151_665),
                                              ("peaked", 1000, 1000)])
def test_lazy_verdicts_are_the_whole_rows(norm_graph, setting, kind, width, vocab):
    bad, settled, total = _mismatches(norm_graph, LazyRow, CASES[setting], kind, width, vocab)
    assert bad == 0
    # the bounds are tight: only uniform numbers within ~1e-3 of the edge need the row (at 151,936 entries the 64
    # largest of these synthetic rows reach into their normal bulk, below which penalized tokens fall)
    if kind == "peaked" and width <= 20_000 and total:
        assert settled >= 0.95 * total, (settled, total)


class UnchangedNorm(LazyRow):
    """Wrong on purpose: reads the graph's normalizer as the processed row's (the penalty's and bans' changes
    are not put in)."""

    def _changed_mass(self, m, inv_t):
        return 0.0, 0.0

    def _changed_read(self, raw, scores, m, inv_t, bound):
        return 0.0, 0.0, 0.0


def test_negative_control_a_normalizer_without_the_penalty_is_caught(norm_graph):
    bad, _, _ = _mismatches(norm_graph, UnchangedNorm, CASES["penalty 1.3"], "peaked", 20_000, 20_000)
    assert bad > 0


def test_min_mass_from_the_bounds_is_close(norm_graph):
    vocab = 20_000
    cfg = SamplingConfig(do_sample=True, top_k=0, temperature=0.7, repetition_penalty=1.1)
    # (a small q, as a draft's top-k makes it: the draft of these settings itself samples untruncated)
    pipe, draft_pipe = LogitsPipeline(cfg, vocab), LogitsPipeline(replace(cfg, top_k=DRAFT_TOP_K), vocab)
    for r, row in enumerate(_rows("peaked", vocab, 4, seed=11)):
        base = _context(row, vocab, r)
        q = draft_pipe.row(row + np.random.default_rng(r).standard_normal(vocab).astype(np.float32), base)
        graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1 / cfg.temperature, 32)
        exact = pipe.row(row.copy(), base).min_mass(q)
        lazy = LazyRow(pipe, graph_row, base, [])
        assert abs(lazy.min_mass(q) - exact) <= LazyRow.MASS_WIDTH
        assert lazy._dist is None  # settled from the bounds


class CountingRow(GraphRow):
    reads = 0

    def numpy(self) -> np.ndarray:
        CountingRow.reads += 1
        return self.row


@pytest.mark.parametrize("tail", [0.0, 1e-4, 2.4e-4])
def test_min_mass_leaves_q_s_light_tokens_unread(norm_graph, tail):
    """A draft with most of its mass on the row's largest entries and ``tail`` spread over 56 tokens the row's
    top entries do not hold: sum min(p, q) within MASS_WIDTH of the whole row's, without reading the row."""
    vocab = 20_000
    cfg = SamplingConfig(do_sample=True, top_k=0, temperature=0.7)
    pipe = LogitsPipeline(cfg, vocab)
    for r, row in enumerate(_rows("peaked", vocab, 3, seed=5)):
        order = np.argsort(-row).tolist()
        exact_p = pipe.row(row.copy(), []).dense(vocab)
        head, light = order[:8], order[-56:]  # light: far below the entries read
        q = {t: float(exact_p[t]) for t in head}
        scale = (1.0 - tail) / sum(q.values())
        q = {t: v * scale for t, v in q.items()} | {t: tail / len(light) for t in light}
        draft = Dist(tokens=sorted(q), plist=[q[t] for t in sorted(q)])
        exact = pipe.row(row.copy(), []).min_mass(draft)
        CountingRow.reads = 0
        lazy = LazyRow(pipe, CountingRow(norm_graph(vocab), row, LAZY_TOP, 1 / cfg.temperature, 32), [], [])
        got = lazy.min_mass(draft)
        assert abs(got - exact) <= LazyRow.MASS_WIDTH
        assert lazy._dist is None and CountingRow.reads == 0  # neither the whole row nor the light tokens read


def test_penalized_flat_rows_are_read_whole(norm_graph):
    """A penalized row goes to LazyRow only where its head (the entries read) may hold most of its mass: a flat
    one is computed whole at once (its verdicts are rarely settled from the bounds, its draws seldom)."""
    vocab = LogitsPipeline.LAZY_PENALTY_VOCAB
    cfg = SamplingConfig(do_sample=True, top_k=0, temperature=0.8, repetition_penalty=1.2)
    pipe = LogitsPipeline(cfg, vocab)
    plain = LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, temperature=0.8), vocab)
    base = list(range(50))
    for kind, lazy in (("peaked", True), ("flat", False)):
        row = _rows(kind, vocab, 1, seed=2)[0]
        graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1 / cfg.temperature, 32)
        assert thin_head(graph_row, pipe) is not lazy
        assert isinstance(pipe.verify_row(graph_row, base, []), LazyRow) is lazy, kind
        assert isinstance(plain.verify_row(graph_row, base, []), LazyRow)  # (without a penalty its verdicts are)
        assert not isinstance(pipe.verify_row(graph_row, base, [], last=True), LazyRow) or lazy


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_rows_whose_nucleus_reaches_past_the_entries_read_are_read_whole(norm_graph, temperature):
    """Top-p without top-k: where the normalizer says the nucleus holds more than the LAZY_TOP entries read
    (top_p times it above LAZY_TOP), no LazyRow is made (it could settle nothing); a peaked row and one whose
    normalizer is of another temperature still go to LazyRow. A penalized row is wide where the normalizer less
    the number of ids the penalty may change still is (each loses at most its weight, at most 1): a flat row in a
    short context is, the same row in a context of enough distinct ids is not, and a penalty below 1 (which
    raises scores) never is. Verdicts, residual draws and draws are the whole row's either way."""
    vocab = 4096
    cfg = SamplingConfig(do_sample=True, top_k=0, top_p=0.9, temperature=temperature)
    pipe = LogitsPipeline(cfg, vocab)
    penalized = LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, top_p=0.9, temperature=temperature,
                                              repetition_penalty=1.1), vocab)
    penalized.LAZY_PENALTY_VOCAB = 0
    draft = Dist(tokens=[3, 9, 17], plist=[0.5, 0.3, 0.2])
    for kind, wide in (("flat", True), ("peaked", False)):
        row = _rows(kind, vocab, 1, seed=5)[0]
        graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1 / temperature, 32)
        scale, z_graph, _ = graph_row.norm()
        assert (cfg.top_p * z_graph > LAZY_TOP) is wide  # the rows are what their names say
        assert wide_nucleus(graph_row, pipe) is wide
        got = pipe.verify_row(graph_row, [], [])
        assert isinstance(got, LazyRow) is not wide
        assert not wide_nucleus(GraphRow(norm_graph(vocab), row, LAZY_TOP, 0.5 / temperature, 32), pipe)
        # penalized: the row's normalizer less the ids the penalty may change (the context's distinct ids and
        # the new ones) must still be wide
        room = int(z_graph - WIDE * LAZY_TOP / cfg.top_p)  # distinct ids that leave a wide row wide
        short, long = list(range(5)), list(range(room + 1)) * 2
        assert wide_nucleus(graph_row, penalized, short, [7]) is wide
        assert not wide_nucleus(graph_row, penalized, long, [7])
        if wide:
            assert room > 10 and wide_nucleus(graph_row, penalized, list(range(room - 2)), [room - 3, room + 7])
            assert not wide_nucleus(graph_row, penalized, list(range(room - 2)), [room + 7, room + 8, room + 9])
            assert not isinstance(penalized.verify_row(graph_row, short, [7]), LazyRow)
            assert isinstance(penalized.verify_row(graph_row, long, [7]), LazyRow)
        raising = LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, top_p=0.9, temperature=temperature,
                                                repetition_penalty=0.9), vocab)
        assert not wide_nucleus(graph_row, raising, short, [7])
        full = pipe.row(row.copy(), [])
        for context, new in ((short, [7]), (long, [7])):
            full_penalized = penalized.row(row.copy(), context, new)
            for u in (0.05, 0.5, 0.95):
                fresh = penalized.verify_row(GraphRow(norm_graph(vocab), row.copy(), LAZY_TOP, 1 / temperature, 32),
                                             context, new)
                assert fresh.accepts(3, 0.5, u) == full_penalized.accepts(3, 0.5, u)
                assert fresh.residual(draft, u) == full_penalized.residual(draft, u)
                assert fresh.draw(u) == full_penalized.draw(u)
        for u in (0.05, 0.5, 0.95):
            fresh = pipe.verify_row(GraphRow(norm_graph(vocab), row.copy(), LAZY_TOP, 1 / temperature, 32), [], [])
            assert fresh.accepts(3, 0.5, u) == full.accepts(3, 0.5, u)
            assert fresh.residual(draft, u) == full.residual(draft, u)
            assert fresh.draw(u) == full.draw(u)


class DrawsFromWide(LazyRow):
    """Wrong on purpose: draws from a wide nucleus's bounds as from any other (the head first)."""

    def _draw_bounds(self):
        return self._bounds()


@pytest.mark.parametrize("vocab", [4096, 20_000])
@pytest.mark.parametrize("penalty", [1.0, 1.2])
def test_a_wide_nucleus_is_drawn_without_a_head_by_every_path(norm_graph, vocab, penalty):
    """A nucleus whose mass is wide by the row's total (top_p times it above WIDE * LAZY_TOP) has an empty head:
    its draws and residual draws go by id (a sparse nucleus) or in block order over the kept weights (a dense
    one), whichever path made the row (a host row, a pass's row read whole, a LazyRow that needs the whole row),
    and LazyRow settles none of them from its bounds. One drawn head first is caught."""
    cfg = SamplingConfig(do_sample=True, top_k=0, top_p=0.9, temperature=1.0, repetition_penalty=penalty)
    pipe = _pipeline(cfg, vocab)
    row = _rows("flat", vocab, 1, seed=6)[0]
    base = np.argsort(-row)[:3].tolist() if penalty != 1.0 else []
    fresh = lambda: GraphRow(norm_graph(vocab), row.copy(), LAZY_TOP, 1.0, 32)  # noqa: E731
    full = pipe.row(row.copy(), base, [])
    assert full.head_ids() == [] and full.sparse is (vocab == 4096)
    assert cfg.top_p * fresh().norm()[1] > WIDE * LAZY_TOP
    plain = Dist(full.ids, full.probs) if full.sparse else None  # (a dense nucleus: sample_weights below)
    draft = Dist(tokens=sorted(np.argsort(-row)[:5].tolist()), plist=[0.2] * 5)
    wrong = 0
    for u in np.random.default_rng(1).random(200).tolist():
        expected = plain.draw(u) if full.sparse else sample_weights(full.weights, u)
        assert full.draw(u) == expected
        assert LazyRow(pipe, fresh(), base, []).draw(u) == expected
        assert pipe.verify_row(fresh(), base, []).draw(u) == expected
        assert LazyRow(pipe, fresh(), base, []).residual(draft, u) == full.residual(draft, u)
        assert pipe.lazy_settled == 0
        wrong += DrawsFromWide(_pipeline(cfg, vocab), fresh(), base, []).draw(u) != expected
    assert wrong > 0  # negative control: drawn head first where the bounds settle it


class ClosedNucleus(LazyRow):
    """Wrong on purpose: takes a nucleus that reaches past the entries read for one held by them (p = 0 for every
    token outside them)."""

    def _nucleus(self, *args):
        got = super()._nucleus(*args)
        return got if got is None or got[3] else (*got[:3], True)


class NoLastWeight(LazyRow):
    """Wrong on purpose: bounds the kept sum of a nucleus that reaches past the entries read by top_p times the
    total alone (the last kept token's weight, which takes the sum past it, left out)."""

    def _nucleus(self, scores, top, inv_t, z_lo, z_hi, bound):
        got = super()._nucleus(scores, top, inv_t, z_lo, z_hi, bound)
        return got if got is None or got[3] else (got[0], got[1], self.pipe.config.top_p * z_hi, False)


def _band_row(width: int, band: int, seed: int) -> np.ndarray:
    """One heavy token and ``band`` tokens at about a fifth of its weight, the rest far below: a top-p nucleus of
    more than LAZY_TOP tokens whose normalizer is not wide (top_p times it below LAZY_TOP)."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(width) * 0.5 - 12.0).astype(np.float32)
    ids = rng.permutation(width)
    row[ids[0]] = 0.0
    row[ids[1:band + 1]] = (rng.standard_normal(band) * 0.2 - 1.6).astype(np.float32)
    return row


def _open_mismatches(norm_graph, cls, temperature: float, top_p: float, rows: int = 3):
    """Verdicts of ``cls`` rows on band rows that differ from the whole row's, and how many of the checks at a
    random uniform number it settled, of how many. Checks: the entries read, tokens of the band not read (kept,
    as the whole row tells), tokens far below (not kept); q around p; u at random and at each edge. (Settled
    counts the entries read: a kept token not read gets p between 0 and its weight over the kept sum.)"""
    vocab = 4096
    cfg = SamplingConfig(do_sample=True, top_k=0, top_p=top_p, temperature=temperature)
    bad = settled = total = 0
    for r in range(rows):
        row = _band_row(vocab, 200, seed=r)
        pipe = LogitsPipeline(cfg, vocab)
        graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1 / temperature, 32)
        full = pipe.row(row.copy(), [], [])
        assert full.sparse and full.ids.size > LAZY_TOP and not wide_nucleus(graph_row, pipe)
        fresh = pipe.verify_row(graph_row, [], [])
        assert isinstance(fresh, LazyRow) and fresh._bounds()[5][3] is False  # past the entries read
        order = np.argsort(-row).tolist()
        kept = full.ids.tolist()
        tokens = order[:6] + [t for t in order[LAZY_TOP:] if t in set(kept)][:6] + order[-3:]
        rng = np.random.default_rng(r)
        for t in tokens:
            p = full.prob(t)
            for q in (min(max(p, 1e-4) * f, 1.0) for f in (0.5, 0.97, 1.03, 2.0)):
                a = acceptance_probability(p, q)
                checks = [(float(rng.random()), False)]
                checks += [(x, True) for e in (1e-3, 1e-6, 1e-9) for x in (a * (1 - e), min(a * (1 + e), 1 - 1e-16))]
                for u, edge in checks:
                    before = pipe.lazy_settled
                    if cls(pipe, graph_row, [], []).accepts(t, q, u) != full.accepts(t, q, u):
                        bad += 1
                    if not edge and t in order[:LAZY_TOP]:
                        settled += pipe.lazy_settled - before
                        total += 1
    return bad, settled, total


@pytest.mark.parametrize("temperature,top_p", [(1.0, 0.9), (0.7, 0.8)])
def test_a_nucleus_past_the_entries_read_settles_verdicts(norm_graph, temperature, top_p):
    """A top-p nucleus that holds more tokens than those read, on a row whose normalizer is not wide: every
    entry read is kept and the kept sum lies between top_p times the total and that plus the weight at the
    bound, so verdicts are settled from the bounds (p between 0 and its weight over that sum for tokens not
    read). The whole row's verdict every time; most at random settled; and two wrong rules (tokens not read
    taken as outside the nucleus; the kept sum without the last kept weight) are caught by the same checks."""
    bad, settled, total = _open_mismatches(norm_graph, LazyRow, temperature, top_p)
    assert bad == 0
    assert settled >= 0.9 * total, (settled, total)
    assert _open_mismatches(norm_graph, ClosedNucleus, temperature, top_p)[0] > 0
    assert _open_mismatches(norm_graph, NoLastWeight, temperature, top_p)[0] > 0


def _open_draw_mismatches(norm_graph, cls, temperature: float, top_p: float, penalty: float = 1.0, rows: int = 3):
    """Draws and residual draws of ``cls`` rows on band rows (a nucleus past the entries read) that differ from
    the whole row's, at random uniform numbers and on the boundaries of the head's running sums; and how many
    random draws it settled, of how many. q: a draft's row of a perturbed row, and one-hot guesses."""
    vocab = 4096
    cfg = SamplingConfig(do_sample=True, top_k=0, top_p=top_p, temperature=temperature,
                         repetition_penalty=penalty)
    bad = settled = total = 0
    for r in range(rows):
        row = _band_row(vocab, 200, seed=10 + r)
        base = np.argsort(-row)[:3].tolist() if penalty != 1.0 else []
        pipe, draft_pipe = _pipeline(cfg, vocab), LogitsPipeline(draft_sampling(cfg), vocab)
        graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1 / temperature, 32)
        full = pipe.row(row.copy(), base, [])
        assert full.sparse and full.ids.size > LAZY_TOP
        assert cls(pipe, graph_row, base, [])._bounds()[5][3] is False  # past the entries read
        rng = np.random.default_rng(r)
        drafts = [draft_pipe.row(row + rng.standard_normal(vocab).astype(np.float32) * 0.3, base, [])]
        drafts += [Dist.one_hot(int(t)) for t in np.argsort(-row)[:2]]
        ids, probs = full.ids, full.probs
        pos = np.searchsorted(ids, full.head_ids())
        edges = np.cumsum(probs[pos]).tolist()[:30]  # the head's running sums: every boundary a draw crosses there
        randoms = rng.random(60).tolist()
        for u in randoms + [min(x * f, 1 - 1e-16) for x in edges for f in (1, 1 - 1e-9, 1 + 1e-9)]:
            before = pipe.lazy_settled
            if cls(pipe, graph_row, base, []).draw(u) != full.draw(u):
                bad += 1
            if u in randoms:
                settled += pipe.lazy_settled - before
                total += 1
            for q in drafts:
                if cls(pipe, graph_row, base, []).residual(q, u) != full.residual(q, u):
                    bad += 1
    return bad, settled, total


@pytest.mark.parametrize("temperature,top_p,penalty", [(1.0, 0.9, 1.0), (0.7, 0.8, 1.0), (1.0, 0.9, 1.2)])
def test_draws_from_a_nucleus_past_the_entries_read(norm_graph, temperature, top_p, penalty):
    """Draws and residual draws from a top-p nucleus that holds more tokens than those read take the head (the
    entries read above the 64th, all kept) first: landing there they are settled from the bounds (p = weight
    over the kept sum, which lies between top_p times the total and that plus the weight at the bound; the
    residual's sum is 1 - sum_x min(p, q)). The whole row's token every time, at random and on the head's
    boundaries; most random draws settled; a head walked by id is caught by the same checks."""
    bad, settled, total = _open_draw_mismatches(norm_graph, LazyRow, temperature, top_p, penalty)
    assert bad == 0
    assert settled >= 0.25 * total, (settled, total)  # (the head holds about a third of these nuclei)
    assert _open_draw_mismatches(norm_graph, HeadById, temperature, top_p, penalty)[0] > 0


def test_sparse_draws_take_the_head_first():
    """A sparse distribution with a head draws the head's ids in the head's order, then the rest by id (the
    draw for each u as that definition gives it); each token with its probability (chi-square, 100k draws),
    and the residual max(0, p - q) likewise; ignoring the order is caught by the definition check."""
    rng = np.random.default_rng(2)
    ids = np.sort(rng.choice(5000, 300, replace=False))
    probs = rng.random(300) ** 3
    probs /= probs.sum()
    head = [int(t) for t in ids[np.argsort(-probs)[:40]]] + [4999 if 4999 not in ids else 0]  # (one not held)
    dist = Dist(ids, probs, head=head)
    order = [t for t in head if t in set(ids.tolist())] + [t for t in ids.tolist() if t not in set(head)]
    p_of = dict(zip(ids.tolist(), probs.tolist()))
    for u in rng.random(300).tolist():
        sums = np.cumsum([p_of[t] for t in order])
        expected = order[min(int(np.searchsorted(sums, u * sums[-1], side="right")), len(order) - 1)]
        assert dist.draw(u) == expected
        assert Dist(ids, probs).draw(u) == int(ids[min(int(np.searchsorted(np.cumsum(probs), u * probs.sum(),
                                                                             side="right")), ids.size - 1)])
    assert any(dist.draw(u) != Dist(ids, probs).draw(u) for u in rng.random(100).tolist())  # the order matters
    small = Dist(tokens=ids.tolist(), plist=probs.tolist(), head=head)
    u = rng.random(100_000)
    for d in (dist, small):
        draws = np.bincount([d.draw(x) for x in u], minlength=5000)
        assert chi_square_p(draws[ids], probs) > ALPHA
    q = Dist(tokens=ids[:50].tolist(), plist=(probs[:50] / probs[:50].sum()).tolist())
    r = np.maximum(probs - np.where(np.arange(300) < 50, probs[:50].sum() ** -1 * np.pad(probs[:50], (0, 250)), 0), 0)
    draws = np.bincount([verify.residual_draw(dist, q, x) for x in u], minlength=5000)
    assert chi_square_p(draws[ids], r / r.sum()) > ALPHA


def test_first_token_follows_p_where_the_nucleus_reaches_past_the_entries_read(norm_graph):
    """40k seeded rounds of one draft on a band row (a top-p nucleus of 174 tokens, 64 read): the committed token
    follows p (chi-square over the nucleus), with most verdicts settled from the bounds; the same test catches a
    verifier that takes the tokens not read for outside the nucleus."""
    vocab = 4096
    cfg = SamplingConfig(do_sample=True, top_k=0, top_p=0.9, temperature=1.0)
    pipe, draft_pipe = LogitsPipeline(cfg, vocab), LogitsPipeline(draft_sampling(cfg), vocab)
    row = _band_row(vocab, 200, seed=7)
    graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1.0, 32)
    p = pipe.row(row.copy(), [])
    q = draft_pipe.row(row + np.random.default_rng(3).standard_normal(vocab).astype(np.float32) * 0.3, [])
    assert p.ids.size > LAZY_TOP and pipe.verify_row(graph_row, [], [])._bounds()[5][3] is False
    exact = p.dense(vocab)
    support = np.flatnonzero(exact)
    bonus = Dist.one_hot(0)
    for cls, passes in ((LazyRow, True), (ClosedNucleus, False)):
        rng = np.random.default_rng(1)
        counts = np.zeros(vocab, dtype=np.int64)
        settled = pipe.lazy_settled
        for _ in range(15_000):
            d = q.sample(rng)
            v = verify.verify_dists([d], [q], lambda i: cls(pipe, graph_row, [], []) if i == 0 else bonus, rng)
            counts[d if v.accepted else v.next_token] += 1
        assert counts[np.setdiff1d(np.arange(vocab), support)].sum() == 0 or not passes
        p_value = chi_square_p(counts[support], exact[support])
        assert (p_value > ALPHA) == passes, cls.__name__
        if cls is LazyRow:
            assert pipe.lazy_settled - settled > 7_500  # the verdicts came from the bounds


def test_rows_without_a_normalizer_read_the_whole_row(norm_graph):
    """A pass that computed no normalizer (scale 0, or a bundle without one) gives the whole row's verdicts."""
    vocab = 2000
    cfg = SamplingConfig(do_sample=True, top_k=0)
    pipe = LogitsPipeline(cfg, vocab)
    row = _rows("peaked", vocab, 1, 3)[0]
    graph_row = GraphRow(norm_graph(vocab), row, pipe.top_entries(), 0.5, 32)  # another temperature's
    lazy = LazyRow(pipe, graph_row, [], [])
    full = pipe.row(row.copy(), [])
    tok = int(np.argmax(row))
    assert lazy.accepts(tok, 0.9, 0.5) == full.accepts(tok, 0.9, 0.5)
    assert lazy._dist is not None and pipe.lazy_read == 1


def test_first_token_is_distributed_as_the_target_with_lazy_rows(norm_graph):
    """60k seeded rounds of one draft: the committed token follows p (chi-square), and a verifier fed a wrong
    normalizer (the penalty not put in) is caught by the same test."""
    vocab = 64
    cfg = SamplingConfig(do_sample=True, top_k=0, temperature=1.0, repetition_penalty=3.0)
    pipe, draft_pipe = LogitsPipeline(cfg, vocab), LogitsPipeline(draft_sampling(cfg), vocab)
    rng0 = np.random.default_rng(0)
    row = (rng0.standard_normal(vocab) * 1.5).astype(np.float32)
    row[[1, 2, 3]] += 3.0
    base = [1, 2]  # the two largest are penalized
    graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1 / cfg.temperature, 32)
    p = pipe.row(row.copy(), base)
    q = draft_pipe.row(row + rng0.standard_normal(vocab).astype(np.float32), base)
    exact = p.dense(vocab)
    assert 0.05 < 1 - p.min_mass(q) < 0.95
    bonus = Dist.one_hot(0)
    settled = pipe.lazy_settled
    for cls, passes in ((LazyRow, True), (UnchangedNorm, False)):
        rng = np.random.default_rng(1)
        counts = np.zeros(vocab, dtype=np.int64)
        for _ in range(60_000):
            d = q.sample(rng)
            v = verify.verify_dists([d], [q], lambda i: cls(pipe, graph_row, base, []) if i == 0 else bonus, rng)
            counts[d if v.accepted else v.next_token] += 1
        assert (chi_square_p(counts, exact) > ALPHA) == passes, cls.__name__
        if cls is LazyRow:
            assert pipe.lazy_settled - settled > 50_000  # the verdicts came from the bounds


def test_lazy_rows_only_without_top_k():
    def lazy(**kw):
        return LogitsPipeline(SamplingConfig(do_sample=True, **kw), 1000).lazy_rows()
    assert lazy(top_k=0) and lazy(top_k=0, bad_words_ids=[[4]]) and lazy(top_k=1000) and lazy(top_k=0, top_p=0.9)
    assert not lazy(top_k=20) and not lazy(top_k=20, top_p=0.9) and not lazy(top_k=0, repetition_penalty=0.9)
    assert not lazy(top_k=0, repetition_penalty=1.2)  # exact too (tested above), but slower than whole rows here
    assert LogitsPipeline(SamplingConfig(do_sample=True, top_k=0), 1000).top_entries() == LAZY_TOP
    # with a penalty from LAZY_PENALTY_VOCAB entries on (a whole row costs more there than the penalty's bookkeeping)
    big, small = LogitsPipeline.LAZY_PENALTY_VOCAB, LogitsPipeline.LAZY_PENALTY_VOCAB - 1
    for vocab, expected in ((big, True), (151_936, True), (small, False), (49_152, False)):
        pipe = LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, repetition_penalty=1.1), vocab)
        assert pipe.lazy_rows() is expected and (pipe.top_entries() == LAZY_TOP) is expected
        assert pipe.norm_scale() == (1.0 if expected else 0.0)
    assert not LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, repetition_penalty=0.9), big).lazy_rows()


def _edges(full: Dist) -> list[float]:
    """Uniform numbers at the boundaries of a draw from ``full`` (its running sums over the total), and on either
    side of each by 1e-9 and 1e-12 (relative)."""
    if full.sparse:
        cdf = np.cumsum(full.probs)
        points = (cdf / cdf[-1]).tolist()
    else:
        head = full.head_ids()
        head = np.flatnonzero(full.weights >= HEAD_MIN) if head is None else head
        points = (np.cumsum(full.weights[head].astype(np.float64)) / full.total).tolist()
    out = []
    for x in points[:40]:
        out += [x, x * (1 - 1e-9), x * (1 + 1e-9), x * (1 - 1e-12), x * (1 + 1e-12)]
    return [min(max(x, 0.0), 1 - 1e-16) for x in out]


def _draw_mismatches(norm_graph, cls, setting: dict, kind: str, width: int, vocab: int, rows: int = 3):
    """Draws and residual draws of ``cls`` rows that differ from the whole row's (uniform numbers at random and
    at every boundary; q: the draft's top-k row of a perturbed row, and one-hot guesses); and how many of the
    draws at random it settled, of how many."""
    cfg = SamplingConfig(do_sample=True, top_k=0, **setting)
    sess = norm_graph(width)
    bad = settled = total = 0
    for r, row in enumerate(_rows(kind, width, rows, seed=3 * width + len(kind))):
        base = _context(row, vocab, r)
        pipe, draft_pipe = _pipeline(cfg, vocab), LogitsPipeline(draft_sampling(cfg), vocab)
        graph_row = GraphRow(sess, row, LAZY_TOP, 1 / cfg.temperature, 32 if width % 32 == 0 else 1)
        full = pipe.row(row.copy(), base, [7])
        rng = np.random.default_rng(r)
        drafts = [draft_pipe.row(row + rng.standard_normal(width).astype(np.float32), base, [7])]
        drafts += [Dist.one_hot(int(t)) for t in np.argsort(-row[:vocab])[:2]]
        randoms = rng.random(60).tolist()
        for u in randoms + _edges(full):
            before = pipe.lazy_settled
            if cls(pipe, graph_row, base, [7]).draw(u) != full.draw(u):
                bad += 1
            if u in randoms:
                settled += pipe.lazy_settled - before
                total += 1
            for q in drafts:
                if cls(pipe, graph_row, base, [7]).residual(q, u) != full.residual(q, u):
                    bad += 1
    return bad, settled, total


@pytest.mark.parametrize("setting", list(CASES))
@pytest.mark.parametrize("kind,width,vocab", [("peaked", 20_000, 20_000), ("flat", 4096, 4096),
                                              ("peaked", 151_936, 151_665), ("peaked", 1000, 1000)])
def test_lazy_draws_are_the_whole_rows(norm_graph, setting, kind, width, vocab):
    """The bonus draw and the residual draw after a rejection, from the bounds: the whole row's token for every
    uniform number, including those on the boundaries between tokens."""
    bad, settled, total = _draw_mismatches(norm_graph, LazyRow, CASES[setting], kind, width, vocab)
    assert bad == 0
    if kind == "peaked" and width <= 20_000 and CASES[setting].get("temperature", 1.0) < 1.0:
        assert settled >= 0.8 * total, (settled, total)


class HeadById(LazyRow):
    """Wrong on purpose: walks the head by id, not largest entry first as the whole row's draw does."""

    def _from_norm(self, *args, **kw):
        got = super()._from_norm(*args, **kw)
        if got:
            self._hd = sorted(self._head())
        return got


@pytest.mark.parametrize("setting", ["T 1.0", "T 0.7", "penalty 1.3", "penalty + bans"])
def test_draws_from_rows_whose_heavy_weights_reach_past_the_entries_read(norm_graph, setting):
    """Rows whose weights of 2**-10 of the largest and more reach past the 64 entries read: a draw or residual
    draw that lands in the head (the entries read above the 64th, largest first) is settled from the bounds,
    the whole row's token every time (uniform numbers at random and on every boundary), and most random draws
    are settled; a head walked in another order (by id) is caught by the same checks."""
    bad, settled, total = _draw_mismatches(norm_graph, LazyRow, CASES[setting], "spread", 4096, 4096)
    assert bad == 0
    assert settled >= 0.4 * total, (settled, total)
    assert _draw_mismatches(norm_graph, HeadById, CASES[setting], "spread", 4096, 4096)[0] > 0


class UnshiftedNorm(LazyRow):
    """Wrong on purpose: keeps the graph's reference (the raw largest logit) where the host's weights are relative
    to the largest processed score (they differ when the penalty lowers the largest)."""

    @staticmethod
    def _shift(m, top, inv_t):
        return 1.0


def test_negative_control_draws_from_a_misplaced_normalizer_are_caught(norm_graph):
    setting = dict(repetition_penalty=1.3, temperature=0.5)
    assert _draw_mismatches(norm_graph, LazyRow, setting, "peaked", 20_000, 20_000)[0] == 0
    bad, settled, _ = _draw_mismatches(norm_graph, UnshiftedNorm, setting, "peaked", 20_000, 20_000)
    assert bad > 0 and settled > 0


def test_dense_draws_follow_the_weights_over_head_and_rest():
    """draw_weights (the heavy weights by id, then the rest in block order) draws each token with probability
    weight / total (chi-square, 200k draws); a draw that never leaves the head is caught by the same test."""
    w = np.zeros(5000, dtype=np.float32)
    w[[10, 700, 2500]] = [1.0, 0.5, 0.25]                     # the head
    w[[3, 1999, 4096, 4999]] = [2.0 ** -11, 2.0 ** -12, 0.0002, 0.0001]  # below HEAD_MIN
    w[np.arange(100, 5000, 7)] += 1e-4                         # a spread-out rest (~8% of the mass)
    total = float(w.astype(np.float64).sum())
    exact = w / total
    support = np.flatnonzero(w)
    rng = np.random.default_rng(0)
    u = rng.random(200_000)
    draws = np.bincount([draw_weights(w, total, x) for x in u], minlength=w.size)
    assert set(np.flatnonzero(draws)) <= set(support.tolist())
    assert chi_square_p(draws[support], exact[support]) > ALPHA
    head = w >= HEAD_MIN
    head_only = np.where(head, w, 0).astype(np.float32)  # wrong: the rest never drawn
    wrong = np.bincount([draw_weights(head_only, float(head_only.sum()), x) for x in u[:50_000]],
                        minlength=w.size)
    assert chi_square_p(wrong[support], exact[support]) < ALPHA


def test_draws_from_a_flat_row_follow_the_definition():
    """A row with more than LEAN_MAX heavy weights (a flat one) is drawn from in block order throughout, as
    before heads were drawn first; a peaked one from its head by id (checked against the loop that defines it)."""
    rng = np.random.default_rng(4)
    flat = np.exp2(rng.standard_normal(20_000) * 0.3).astype(np.float32)
    flat /= flat.max()
    peaked = (flat * 2.0 ** -14).astype(np.float32)
    peaked[[5, 900, 7000, 19_999]] = [1.0, 0.5, 2.0 ** -9, 0.25]
    assert (flat >= HEAD_MIN).sum() > LEAN_MAX and (peaked >= HEAD_MIN).sum() == 4
    for w in (flat, peaked):
        total = float(w.astype(np.float64).sum())
        for u in rng.random(200).tolist() + [0.0, 0.5, 0.999]:
            got = draw_weights(w, total, u)
            if w is flat:
                assert got == sample_weights(w, u)
                continue
            x, acc, expected = u * total, 0.0, None
            for i in np.flatnonzero(w >= HEAD_MIN).tolist():
                acc += float(w[i])
                if acc > x:
                    expected = i
                    break
            assert got == expected if expected is not None else w[got] < HEAD_MIN


def test_dense_draws_follow_the_weights_over_a_head_given_and_the_rest():
    """draw_weights with a head (the entries above the LAZY_TOP-th largest, largest first; or any ids in any
    order), then the rest in block order, draws each token with probability weight / total (chi-square, 200k
    draws); a draw that never leaves the head is caught by the same test."""
    rng = np.random.default_rng(0)
    w = np.zeros(5000, dtype=np.float32)
    heavy = rng.choice(5000, 90, replace=False)
    w[heavy] = np.exp2(-rng.random(90) * 4).astype(np.float32)  # 90 heavy weights: the head holds 63 of them
    w[np.arange(100, 5000, 7)] += 2e-3                            # a spread-out rest (~25% of the mass)
    w /= w.max()
    total = float(w.astype(np.float64).sum())
    exact = w / total
    support = np.flatnonzero(w)
    head = array_head(w, w.size)
    assert len(head) == LAZY_TOP - 1 and set(head) <= set(heavy.tolist())
    assert 0.5 < w[head].sum() / total < 0.9
    u = rng.random(200_000)
    for given in (head, rng.choice(support, 40, replace=False).tolist()):
        draws = np.bincount([draw_weights(w, total, x, given) for x in u], minlength=w.size)
        assert set(np.flatnonzero(draws)) <= set(support.tolist())
        assert chi_square_p(draws[support], exact[support]) > ALPHA
    head_only = np.zeros_like(w)
    head_only[head] = w[head]  # wrong: the rest never drawn
    wrong = np.bincount([draw_weights(head_only, float(head_only.sum()), x, head) for x in u[:50_000]],
                        minlength=w.size)
    assert chi_square_p(wrong[support], exact[support]) < ALPHA


def test_dense_draws_take_the_head_then_the_rest_in_block_order():
    """The draw for each u is the one its definition gives: the running sum over the head in its order, then
    sample_weights over the rest for the remainder; on a flat row, a peaked one, and rows whose head entries
    are banned (weight 0) or carry the whole total."""
    rng = np.random.default_rng(4)
    flat = np.exp2(rng.standard_normal(20_000) * 0.3).astype(np.float32)
    flat /= flat.max()
    peaked = (flat * 2.0 ** -14).astype(np.float32)
    peaked[[5, 900, 7000, 19_999]] = [1.0, 0.5, 2.0 ** -9, 0.25]
    banned = peaked.copy()
    banned[[5, 900]] = 0.0
    only_head = np.zeros(20_000, dtype=np.float32)
    only_head[[17, 400, 12_000]] = [1.0, 0.5, 0.25]
    for w in (flat, peaked, banned, only_head):
        total = float(w.astype(np.float64).sum())
        head = array_head(w, w.size)
        assert len(head) <= LAZY_TOP - 1
        for u in rng.random(200).tolist() + [0.0, 0.5, 0.999, 1 - 1e-16]:
            got = draw_weights(w, total, u, head)
            assert w[got] > 0
            x, acc, expected = u * total, 0.0, None
            for i in head:
                acc += float(w[i])
                if acc > x:
                    expected = i
                    break
            if expected is None and total > acc:
                rest = w.copy()
                rest[head] = 0
                expected = sample_weights(rest, min((x - acc) / (total - acc), 1.0 - 2.0 ** -53))
            if expected is None or expected < 0:  # rounding past the head's whole total: its last weight
                expected = max(i for i in head if w[i] > 0)
            assert got == expected, (u, got, expected)


def test_the_head_is_the_entries_above_the_lazy_top_th_largest():
    """array_head from a row on the host and the head LazyRow takes from the graph's TopK are the same ids in the
    same order (largest entry first, lowest id first on ties), ties at the LAZY_TOP-th largest left out, columns
    past the vocabulary left out, whatever order the TopK gives tied entries in; a row of at most LAZY_TOP
    entries is all head."""
    from ortspec.sampling import top_head
    rng = np.random.default_rng(9)
    for row in (np.round(rng.standard_normal(3000) * 4).astype(np.float32),  # many ties
                rng.standard_normal(3000).astype(np.float32)):          # none
        kth = np.sort(row)[-LAZY_TOP]
        expected = sorted(np.flatnonzero(row > kth).tolist(), key=lambda t: (-row[t], t))
        assert array_head(row, 3000) == expected and len(expected) <= LAZY_TOP - 1
        assert array_head(row, 1500) == [t for t in expected if t < 1500]
        for tie_order in (1, -1):  # ties among the entries returned by id ascending, then descending

            class Top:
                width = 3000

                def top(self, k):
                    order = np.lexsort((tie_order * np.arange(3000), -row))[:k]
                    return order, row[order], row[order[-1]]
            assert top_head(Top(), 3000) == expected and top_head(Top(), 1500) == [t for t in expected if t < 1500]
    small = rng.standard_normal(LAZY_TOP).astype(np.float32)
    small[3] = -np.inf
    assert array_head(small, LAZY_TOP) == sorted((t for t in range(LAZY_TOP) if t != 3), key=lambda t: -small[t])


def test_rows_of_pipelines_without_lazy_rows_are_drawn_from_whole(norm_graph):
    """A penalized pipeline below LAZY_PENALTY_VOCAB entries verifies with whole rows, whose draws take the heavy
    weights first (no head): a LazyRow made for one anyway settles no draw from its bounds, and draws as the
    whole row does."""
    vocab = 4096
    cfg = SamplingConfig(do_sample=True, top_k=0, temperature=0.8, repetition_penalty=1.3)
    pipe = LogitsPipeline(cfg, vocab)
    assert not pipe.lazy_rows()
    row = _rows("spread", vocab, 1, seed=3)[0]
    base = _context(row, vocab, 0)
    full = pipe.row(row.copy(), base, [7])
    assert full.head_ids() is None
    graph_row = GraphRow(norm_graph(vocab), row, LAZY_TOP, 1 / cfg.temperature, 32)
    draft = Dist(tokens=[3, 9, 17], plist=[0.5, 0.3, 0.2])
    for u in np.random.default_rng(0).random(30).tolist():
        settled = pipe.lazy_settled
        assert LazyRow(pipe, graph_row, base, [7]).draw(u) == full.draw(u)
        assert LazyRow(pipe, graph_row, base, [7]).residual(draft, u) == full.residual(draft, u)
        assert pipe.lazy_settled == settled


class SettlesThin(LazyRow):
    """Wrong on purpose: settles a thin row's draws from its head (the bounds) as any other row's."""

    def _draw_bounds(self):
        return self._bounds() if self.pipe.lazy_rows() else self.NEVER


def test_thin_rows_draw_in_block_order_and_residuals_by_rejection(norm_graph):
    """A dense row whose total is above THIN_TOTAL (its head holds at most half of it), given further uniform
    numbers as verification hands them: draws go in block order throughout and residual draws by rejection,
    whichever path reads the row (a host row, a pass's row, a LazyRow: the LazyRow settles none of them from its
    head, so every path maps the same uniform numbers to the same tokens). Residual draws follow
    normalize(max(0, p - q)) (chi-square per token and over 50 groups, 40k; none where p <= q). Without further
    uniform numbers the draws are the head-first ones as before. Negative controls: keeping q's tokens in a
    residual draw, and a LazyRow settling draws of a thin row from its head, are both caught."""
    from ortspec.sampling import THIN_TOTAL
    vocab = 4096
    cfg = SamplingConfig(do_sample=True, top_k=0, temperature=1.0)
    pipe = _pipeline(cfg, vocab)
    row = _rows("flat", vocab, 1, seed=8)[0]
    fresh = lambda: GraphRow(norm_graph(vocab), row.copy(), LAZY_TOP, 1.0, 32)  # noqa: E731
    full = pipe.row(row.copy(), [], [])
    assert full._thin() and full.total > THIN_TOTAL and fresh().norm()[1] > THIN_TOTAL
    order = np.argsort(-row)
    draft = Dist(tokens=sorted(order[:40].tolist()), plist=[1 / 40] * 40)
    p, qd = full.dense(vocab), draft.dense(vocab)
    r = np.maximum(p - qd, 0.0)
    r /= r.sum()
    assert np.any((qd > 0) & (r == 0)) and 0.3 < 1 - full.min_mass(draft) < 0.999
    wrong = 0
    for seed in range(100):
        u = np.random.default_rng(seed).random()
        more = lambda s=seed: np.random.default_rng([s, 1]).random  # noqa: E731 (the same stream for each path)
        expected = sample_weights(full.weights, u, full.blocks)
        assert full.draw(u, more()) == expected
        assert LazyRow(pipe, fresh(), [], []).draw(u, more()) == expected
        assert pipe.verify_row(fresh(), [], [], last=True).draw(u, more()) == expected
        left = full.residual(draft, u, more())
        assert LazyRow(pipe, fresh(), [], []).residual(draft, u, more()) == left
        assert pipe.verify_row(fresh(), [], []).residual(draft, u, more()) == left
        assert full.draw(u) == LazyRow(pipe, fresh(), [], []).draw(u)  # (head first, without more)
        wrong += SettlesThin(_pipeline(cfg, vocab), fresh(), [], []).draw(u, more()) != expected
    assert wrong > 0
    rng = np.random.default_rng(5)
    counts = np.bincount([full.residual(draft, rng.random(), rng.random) for _ in range(40_000)], minlength=vocab)
    assert counts[r == 0].sum() == 0
    assert chi_square_p(counts[r > 0], r[r > 0]) > ALPHA and chi_square_p(*grouped(counts, r)) > ALPHA

    class KeepsQ(Dist):
        def _thin_residual(self, draft, u, more):
            return self.draw(u, more)
    kept_q = KeepsQ(weights=full.weights, total=full.total, blocks=full.blocks)
    rng = np.random.default_rng(6)
    wrong_counts = np.bincount([kept_q.residual(draft, rng.random(), rng.random) for _ in range(20_000)],
                               minlength=vocab)
    assert wrong_counts[r == 0].sum() > 0.002 * 20_000
