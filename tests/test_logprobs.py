"""Log-probabilities: each token's under the distribution it was drawn from, equal to the plain reference's on a
fresh prefill's rows, and the same bits whatever drafted the token."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ortspec import SpeculativeGenerator, TokenLogprob
from ortspec.config import SamplingConfig
from ortspec.reference import distribution, processed_scores, softmax

PROMPT = [1, 5, 9, 14, 5]
SAMPLED = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)


@pytest.fixture(scope="module")
def gen(llama_bundle):
    return SpeculativeGenerator.load(llama_bundle, drafter="model", threads=1)


def _reference(gen, ids, settings) -> list[float]:
    """Each generated token's log-probability from a fresh prefill's rows and the plain reference."""
    config = SamplingConfig(**{k: v for k, v in settings.items() if k != "seed"})
    out = []
    for j, tok in enumerate(ids):
        context = PROMPT + ids[:j]
        row = np.array(gen.target.reference_logits(context)[-1][:gen.vocab_size], dtype=np.float32)
        p = distribution(row, context, config) if config.do_sample else softmax(processed_scores(row, context, config))
        out.append(float(np.log(p[tok])))
    return out


@pytest.mark.parametrize("settings", [dict(do_sample=False), dict(SAMPLED, seed=3)], ids=["greedy", "sampled"])
def test_logprobs_are_the_references_on_a_fresh_prefill(gen, settings):
    res = gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=16, logprobs=5, **settings)
    assert len(res.logprobs) == len(res.token_ids)
    assert [t.token_id for t in res.logprobs] == res.token_ids
    assert [t.logprob for t in res.logprobs] == _reference(gen, res.token_ids, settings)  # bit for bit
    for t in res.logprobs:
        assert isinstance(t, TokenLogprob) and math.isfinite(t.logprob) and len(t.top) == 5
        values = [v for _, v in t.top]
        assert values == sorted(values, reverse=True) and sum(math.exp(v) for v in values) <= 1 + 1e-9
        assert t.logprob <= values[0] and (t.token_id not in dict(t.top) or dict(t.top)[t.token_id] == t.logprob)


@pytest.mark.parametrize("drafter, gamma", [("model", 1), ("model", 3), ("prompt_lookup", 3), ("hybrid", "auto")])
def test_greedy_logprobs_do_not_depend_on_the_drafter(gen, drafter, gamma):
    alone = gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=24, logprobs=3)
    got = gen.sibling(drafter).generate(input_ids=PROMPT, max_new_tokens=24, logprobs=3, num_draft_tokens=gamma)
    assert got.token_ids == alone.token_ids and got.logprobs == alone.logprobs


def test_stream_events_carry_their_tokens_logprobs(gen):
    events = list(gen.stream(input_ids=PROMPT, max_new_tokens=12, logprobs=0, **dict(SAMPLED, seed=5)))
    for ev in events:
        assert [t.token_id for t in ev.logprobs or []] == ev.token_ids and all(not t.top for t in ev.logprobs or [])
    assert gen.generate(input_ids=PROMPT, max_new_tokens=4).logprobs is None  # not asked for


@pytest.mark.parametrize("bad", [21, -1, True, 2.0, "3"])
def test_bad_logprobs_are_refused(gen, bad):
    with pytest.raises(ValueError, match="logprobs"):
        gen.generate(input_ids=PROMPT, max_new_tokens=4, logprobs=bad)


def test_alternatives_past_the_nucleus_are_the_models_next_choices():
    """A top-k of 2 leaves 2 tokens of nonzero probability: the other 3 of 5 alternatives are the next three by
    the raw logits (not arbitrary ids of probability 0, such as padding rows); under a constraint that allows one
    token, the disallowed ones in the model's order; equal logits: the lower id first."""
    from ortspec.logprobs import token_logprob
    rng = np.random.default_rng(0)
    row = rng.standard_normal(50_000).astype(np.float32)
    order = [int(i) for i in np.argsort(-row, kind="stable")]
    t = token_logprob(row, [1, 2], SamplingConfig(do_sample=True, top_k=2), order[0], 5)
    assert [i for i, _ in t.top] == order[:5]
    assert all(math.isfinite(v) for _, v in t.top[:2]) and all(v == -math.inf for _, v in t.top[2:])
    allowed = np.zeros(row.size, bool)
    allowed[order[7]] = True
    t = token_logprob(row, [1, 2], SamplingConfig(do_sample=True), order[7], 4, allowed=allowed)
    assert [i for i, _ in t.top] == [order[7]] + order[:3] and t.logprob == 0.0
    flat = np.zeros(1000, np.float32)
    flat[[5, 900]] = 1.0
    t = token_logprob(flat, [1], SamplingConfig(do_sample=False), 5, 4)
    assert [i for i, _ in t.top] == [5, 900, 0, 1] and t.top[0][1] == t.top[1][1]
