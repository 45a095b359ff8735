"""Predicted outputs (OpenAI's Predicted Outputs): the prediction's tokens are drafts like any other, so the output is
the target's whatever the prediction says — greedy token for token, sampled in distribution (with a negative
control) — and a right prediction is taken in long passes."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ortspec import SpeculativeGenerator
from ortspec.drafting import PredictionIndex
from ortspec.exactness import distribution_check, wrong_verify

PROMPT = [1, 17, 5, 99, 42]
N = 60


def predictions(answer: list[int]) -> dict:
    return {"right": answer, "partly right": answer[:20] + [3, 4, 5] + answer[23:45] + answer[50:],
            "wrong": [7, 8, 9] * 20, "empty": [], "longer than the answer": answer + answer[:30] + [9] * 10,
            "shifted": [11, 12] + answer[5:]}


@pytest.mark.parametrize("drafter", ["model", "hybrid", "prompt_lookup", "none"])
def test_greedy_output_is_target_only_whatever_the_prediction(pair_bundle, drafter):
    gen = SpeculativeGenerator.load(pair_bundle, drafter=drafter)
    alone = SpeculativeGenerator.load(pair_bundle, drafter="none")
    answer = alone.generate(input_ids=PROMPT, max_new_tokens=N, eos_token_id=[]).token_ids
    for name, pred in predictions(answer).items():
        for gamma in (2, "auto"):
            res = gen.generate(input_ids=PROMPT, max_new_tokens=N, eos_token_id=[], prediction=pred,
                               num_draft_tokens=gamma, strict=True)
            assert res.token_ids == answer, (name, gamma)
            s = res.stats
            assert s.prediction_accepted + s.prediction_rejected <= s.drafted, name
            if name in ("right", "longer than the answer"):
                # (how long each pass is, the cost model says from the pass costs timed on this machine)
                assert s.prediction_rejected == 0 and s.prediction_accepted >= N // 2, (name, s)
                assert s.rounds <= N // 3, (name, s.rounds)
            if name == "empty":
                assert s.prediction_accepted == s.prediction_rejected == 0


def test_a_self_draft_on_the_targets_cache_with_a_prediction(llama_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    answer = gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=N, eos_token_id=[]).token_ids
    for name, pred in predictions(answer).items():
        got = gen.generate(input_ids=PROMPT, max_new_tokens=N, eos_token_id=[], prediction=pred, strict=True)
        assert got.token_ids == answer, name


def test_alignment_moves_on_after_a_rejection():
    index = PredictionIndex([10, 11, 12, 13, 14, 15, 10, 11, 16, 17])
    assert index.align([], 0) == (0, 8)
    assert index.align([10, 11], 2) == (2, 2)            # in step
    assert index.align([10, 11, 12, 99], 4) == (4, 0)    # a token the prediction does not hold: nothing
    assert index.align([12, 99, 15], 6) == (6, 1)        # one token, where it was expected
    assert index.align([5, 10, 11], 3) == (8, 2)         # a later run of "10 11", not the earlier one
    assert index.align([5, 14], 1) == (1, 0)             # one token elsewhere is weak evidence: nothing


def test_bad_predictions_are_refused(llama_bundle, ids_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    for bad, match in (([1, 2, 10_000], "outside the vocabulary"), ([1, "x"], "integer"), (5, "text or")):
        with pytest.raises(ValueError, match=match):
            gen.generate(input_ids=PROMPT, prediction=bad)
    with pytest.raises(ValueError, match="no tokenizer"):
        SpeculativeGenerator.load(ids_bundle).generate(input_ids=[1, 2, 3], prediction="w1 w2")


class _Predicting:
    """A generator whose every request carries one prediction (what the distribution check runs)."""

    def __init__(self, gen, prediction):
        self._gen, self._prediction = gen, prediction

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def generate(self, **kwargs):
        return self._gen.generate(prediction=self._prediction, **kwargs)


@pytest.mark.parametrize("drafter", ["none", "model"])
def test_sampled_output_is_distributed_as_the_targets_with_a_negative_control(small_bundle, drafter):
    """First two tokens of sampled runs with a prediction against the exact target distribution (chi-square);
    the same check with a wrong rule (resampling from p instead of the residual) must reject."""
    gen = SpeculativeGenerator.load(small_bundle, drafter=drafter)
    prefix = [1, 7, 7, 2]  # at temperature 3 the predicted (greedy) first token has p = 0.58: a wrong rule shows
    greedy = gen.sibling("none").generate(input_ids=prefix, max_new_tokens=4, eos_token_id=[]).token_ids
    sampling = dict(temperature=3.0, top_k=0)
    wrapped = _Predicting(gen, greedy + greedy)
    good = distribution_check(wrapped, [prefix], sampling, gamma=3, samples=2500, seed=5)
    assert good.p_value > 1e-3, good
    gen.sampled_verify = wrong_verify
    control = distribution_check(wrapped, [prefix], sampling, gamma=3, samples=2500, seed=6)
    assert control.p_value < 1e-3, control


def test_the_cli_takes_a_prediction_file(llama_bundle, tmp_path):
    gen = SpeculativeGenerator.load(llama_bundle)
    answer = gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=20, eos_token_id=[127])
    (tmp_path / "pred.txt").write_text(answer.text)
    got = subprocess.run([sys.executable, "-m", "ortspec.cli", "generate", str(llama_bundle), "--input-ids",
                          ",".join(map(str, PROMPT)), "--max-new-tokens", "20", "--eos-token-id", "127",
                          "--prediction", str(tmp_path / "pred.txt"), "--greedy"],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(t) for t in answer.token_ids] or got.stdout.strip() == answer.text.strip()
    assert "prediction: " in got.stderr and "tokens accepted" in got.stderr, got.stderr
