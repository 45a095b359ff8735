"""The first two generated tokens at a real vocabulary width: speculative (and target-only) output against the
exact target marginals.

A random llama pair with 50,021 ids (not a multiple of 32: the rows' last block is partial), drafts from the
target perturbed. For each setting, seeded generations through ``generate`` give the first and second tokens;
the exact marginals come from the reference (``ortspec.reference``) over fresh full-sequence passes of the
target: P(x1) and P(x1, x2) for every x1 likely enough to be counted (the other first tokens pooled in one
cell). Pooled chi-square tests at alpha = 0.001 (Bonferroni over the two). The settings reach each row path:
a top-p nucleus without top-k (LazyRow), a low temperature over dense rows (the exp2 clamp), flat rows under a
wide nucleus, top-k 20 with top-p 0.8 and a penalty, top-k 300 under a penalty below 1 with a 19-token
bad word, and bad words with target-only decoding. Each has a negative control that the same test rejects: a
verifier resampling from p instead of the residual (drafters), or the bans left out (target-only).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ortspec import SpeculativeGenerator
from ortspec.config import SamplingConfig
from ortspec.sampling import draft_pipeline
from ortspec.reference import distribution
from stats_util import ALPHA, chi_square_p, sample_pairs, worker_pool

pytestmark = pytest.mark.slow  # (about a minute of seeded generations)

V = 50_021
PROMPT = [1, 7, 19, 400, 7, 19, 400, 33, 5, 7, 19, 400, 2000, 31, 7, 19, 400, 45, 8, 7, 19, 400, 9, 7]
N, N_CONTROL = 800, 500
WORKERS = 2


@pytest.fixture(scope="module")
def wide_bundle(tmp_path_factory) -> Path:
    from tiny import make_model
    from ortspec.export import export_bundle
    work = tmp_path_factory.mktemp("wide")
    target = make_model("llama", work / "t", vocab=V, seed=11, scale=2.0)
    draft = make_model("llama", work / "d", vocab=V, seed=11, scale=2.0, perturb=0.1)
    return export_bundle(target=str(target), draft=str(draft), out=work / "b", progress=None)


@pytest.fixture(scope="module")
def pool():
    with worker_pool(WORKERS) as ex:
        yield ex


@pytest.fixture(scope="module")
def models(wide_bundle):
    gen = SpeculativeGenerator.load(wide_bundle, drafter="model", threads=1, draft_kv="own")
    return gen.target, gen.drafter.lm


@pytest.fixture(scope="module")
def target(models):
    return models[0]


@pytest.fixture(scope="module")
def draft(models):
    return models[1]


class Exact:
    """P(x1) and, for each x1 expected at least 20 times in ``n`` draws, P(x2 | x1), from the reference over
    fresh passes of the target; and cells of the first token by p / q (``q`` what the draft model samples its
    first proposal from, or None: by p), each holding a tenth of P(x1)."""

    def __init__(self, target, sampling: dict, n: int, draft=None, prompt=PROMPT):
        cfg = SamplingConfig(do_sample=True, **sampling)
        self.p1 = distribution(target.reference_logits(prompt)[-1], prompt, cfg)
        self.second = {}
        for x1 in np.flatnonzero(self.p1 * n >= 20).tolist():
            ctx = prompt + [x1]
            self.second[x1] = distribution(target.reference_logits(ctx)[-1], ctx, cfg)
        ratio = self.p1.copy()
        if draft is not None:
            q1 = draft_pipeline(cfg, V).row(draft.reference_logits(prompt)[-1].copy(), prompt).dense(V)
            with np.errstate(divide="ignore"):
                ratio = np.where(q1 > 0, self.p1 / np.maximum(q1, 1e-300), np.inf)
        order = np.argsort(ratio, kind="stable")
        order = order[self.p1[order] > 0]
        edges = np.searchsorted(np.cumsum(self.p1[order]), np.linspace(0, 1, 11)[1:-1])
        self.cell = np.full(V, -1)
        for j, part in enumerate(np.split(order, edges)):
            self.cell[part] = j

    def p_value(self, pairs: np.ndarray) -> float:
        """Bonferroni over three tests: the first token, the first token's cells, and the (first, second) pair."""
        p1, heavy = self.p1, sorted(self.second)
        first = chi_square_p(np.bincount(pairs[:, 0], minlength=V), p1)
        if np.any(self.cell[pairs[:, 0]] < 0):
            return 0.0  # a token of probability 0
        cells = chi_square_p(np.bincount(self.cell[pairs[:, 0]], minlength=10),
                             np.bincount(self.cell[p1 > 0], weights=p1[p1 > 0], minlength=10))
        exact = np.concatenate([p1[x] * self.second[x] for x in heavy] + [[1.0 - p1[heavy].sum()]])
        counts = np.zeros(exact.size)
        where = {x: j for j, x in enumerate(heavy)}
        for x1, x2 in pairs.tolist():
            j = where.get(x1)
            counts[j * V + x2 if j is not None else -1] += 1
        return min(1.0, 3 * min(first, cells, chi_square_p(counts, exact)))


def _sample(pool, bundle, drafter, gamma, sampling, n, wrong=False, seed0=0, prompt=PROMPT):
    chunks = np.array_split(np.arange(seed0, seed0 + n), WORKERS * 2)
    jobs = [dict(bundle=str(bundle), drafter=drafter, prompt=prompt, max_new_tokens=max(2, gamma + 1),
                 gamma=gamma, sampling=sampling, seeds=[int(s) for s in c], wrong=wrong) for c in chunks]
    parts = list(pool.map(sample_pairs, jobs))
    return np.concatenate([p for p, _, _ in parts]), sum(d for _, d, _ in parts), sum(a for _, _, a in parts)


def _long_word(target) -> tuple:
    """A 19-token bad word: the prompt's last 18 tokens, then the first token's likeliest id."""
    return tuple(PROMPT[-18:]) + (int(np.argmax(target.reference_logits(PROMPT)[-1])),)


def _echo(target, temperature: float) -> list[int]:
    """A prompt whose last two tokens occurred near its start, followed there by a token the target gives a
    probability between 0.3 and 0.8 at ``temperature`` next: prompt lookup proposes that token (and what followed
    it), which the target then accepts about as often as it rejects. The first of PROMPT's variants (its last
    token replaced) that has one."""
    for last in range(3, 500):
        base = PROMPT[:-1] + [last]
        guess = int(np.argmax(target.reference_logits(base)[-1]))
        echo = base[:1] + base[-2:] + [guess] + base[1:]
        p = distribution(target.reference_logits(echo)[-1], echo, SamplingConfig(True, temperature))
        if 0.3 <= p[guess] <= 0.8:
            return echo
    raise AssertionError("no prompt found")


# name: (drafter, gamma, settings, the negative control's verifier: resampling from p, or accepting every draft
# where drafts carry little of p)
SETTINGS = {
    "model-topp-lazy": ("model", 3, dict(temperature=1.0, top_p=0.9, top_k=0), True),
    "lookup-low-temperature-dense": ("prompt_lookup", 2, dict(temperature=0.3, top_k=0), True),
    "model-flat-wide-nucleus": ("model", 3, dict(temperature=2.5, top_p=0.95, top_k=0), "accept"),
    "hybrid-qwen-settings": ("hybrid", 3, dict(temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05),
                             True),
    "model-topk300-penalty-below-1-long-word": ("model", 3, dict(top_k=300, repetition_penalty=0.9), True),
}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_speculative_marginals_equal_the_target_at_a_real_width(pool, wide_bundle, target, draft, name):
    drafter, gamma, sampling, control = SETTINGS[name]
    if "long-word" in name:
        sampling = dict(sampling, bad_words_ids=[list(_long_word(target))])
    prompt = _echo(target, sampling["temperature"]) if drafter in ("prompt_lookup", "hybrid") else PROMPT
    exact = Exact(target, sampling, N, draft if drafter != "prompt_lookup" else None, prompt)
    pairs, drafted, accepted = _sample(pool, wide_bundle, drafter, gamma, sampling, N, prompt=prompt)
    assert accepted >= 40 and drafted - accepted >= 100, (drafted, accepted)
    assert exact.p_value(pairs) > ALPHA
    wrong, _, _ = _sample(pool, wide_bundle, drafter, gamma, sampling, N_CONTROL, wrong=control, seed0=10 ** 6,
                          prompt=prompt)
    assert exact.p_value(wrong) < ALPHA  # negative control: the wrong verifier is caught


def test_target_only_marginals_with_bad_words(pool, wide_bundle, target):
    """drafter "none": the rows a target-only step reads (bitwise passes of two positions) with single and
    19-token bad words; control: the same samples without the bans are rejected."""
    top = np.argsort(-target.reference_logits(PROMPT)[-1])[:2].tolist()
    sampling = dict(temperature=0.8, top_k=0, bad_words_ids=[[top[1]], list(_long_word(target))])
    exact = Exact(target, sampling, N)
    assert exact.p1[top[0]] == 0 and exact.p1[top[1]] == 0
    pairs, _, _ = _sample(pool, wide_bundle, "none", 0, sampling, N)
    assert exact.p_value(pairs) > ALPHA
    free, _, _ = _sample(pool, wide_bundle, "none", 0, dict(sampling, bad_words_ids=[]), N_CONTROL, seed0=10 ** 6)
    assert exact.p_value(free) < ALPHA  # negative control: the bans left out are caught
