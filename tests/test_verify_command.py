"""`ortspec verify`: passes on a correct pair, fails on planted bugs, and says when it lacks power."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ortspec.drafting import Draft
from ortspec.sampling import Dist
from ortspec.exactness import run_verify, wrong_verify

PROMPTS = [[1, 5, 9, 5], [1, 7, 3, 3, 8]]


def verify(bundle, samples=3000, configure=None, **sampling):
    return run_verify(str(bundle), PROMPTS, [1, 3], sampling, samples=samples, prefixes=2, max_new_tokens=12,
                      configure=configure)


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=6),
                                      dict(top_p=0.85, repetition_penalty=1.3)])
def test_passes_on_a_correct_pair(small_bundle, sampling):
    r = verify(small_bundle, **sampling)
    assert r["verdict"] == "pass", r
    assert r["greedy"]["mismatches"] == 0 and r["greedy"]["runs"] == 4
    assert r["negative_control"]["rejected"]
    assert r["distribution"]["tv"] <= r["distribution"]["tv_bound"]


def test_fails_with_an_injected_wrong_verifier(small_bundle):
    r = verify(small_bundle, configure=lambda gen: setattr(gen, "sampled_verify", wrong_verify))
    assert r["verdict"] == "fail" and r["distribution"]["p_value"] < 1e-3


def test_fails_when_the_draft_reports_a_different_q(small_bundle):
    def report_unprocessed_q(gen):
        original = gen.drafter.propose

        def propose(committed, gamma, pipeline, sampling, rng, limit=None):
            d = original(committed, gamma, pipeline, sampling, rng)
            if d.dists is None:
                return d
            flat = [np.sqrt(q.dense(gen.vocab_size)) for q in d.dists]  # not what the tokens were drawn from
            return Draft(d.tokens, [Dist.from_probs(f / f.sum()) for f in flat])
        gen.drafter.propose = propose
    r = verify(small_bundle, configure=report_unprocessed_q, temperature=0.6)
    assert r["verdict"] == "fail"


def test_inconclusive_with_too_few_samples(small_copy_bundle):
    """A draft that is the target's own graph: q equals p (to the rounding of one-position passes), so drafts
    are almost never rejected and the control's wrong residual almost never runs: whatever the CPU's kernels,
    100 samples cannot tell it apart. (A quantized draft's rejection rate, and with it the control's power,
    moves with the CPU's integer kernels.)"""
    r = verify(small_copy_bundle, samples=100)
    assert r["verdict"] == "inconclusive" and not r["negative_control"]["rejected"]


def test_a_draft_failing_during_the_check_is_an_error(small_bundle):
    from ortspec.errors import OrtspecError

    def break_the_draft(gen):
        def propose(*args, **kwargs):
            raise RuntimeError("draft crashed")
        gen.drafter.propose = propose
    with pytest.raises(OrtspecError, match="failed during the check"):
        verify(small_bundle, samples=100, configure=break_the_draft)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "ortspec.cli", "verify", *map(str, args)],
                          capture_output=True, text=True)


def test_cli_json_and_exit_code(small_bundle, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w2 w6 w2"}\n{"prompt": "w4 w0 w0 w5"}\n')
    proc = cli(small_bundle, "--samples", 3000, "--json", "--num-draft-tokens", "2", "--greedy-tokens", 8,
               "--prompts", prompts, "--no-chat")
    assert proc.returncode in (0, 2), proc.stderr  # pass, or inconclusive on these short prefixes
    report = json.loads(proc.stdout)
    assert report["verdict"] == {0: "pass", 2: "inconclusive"}[proc.returncode]
    assert set(report) >= {"verdict", "greedy", "distribution", "negative_control"}
    assert set(report["distribution"]) >= {"p_value", "tv", "tv_bound", "samples"}


def test_cli_bundle_without_tokenizer_needs_ids_file(ids_bundle, tmp_path):
    proc = cli(ids_bundle, "--samples", 200)
    assert proc.returncode == 2 and "--input-ids-file" in proc.stderr
    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"input_ids": [1, 5, 6, 5, 6]}) + "\n")
    proc = cli(ids_bundle, "--samples", 200, "--input-ids-file", ids, "--prefixes", 1, "--json")
    assert proc.returncode in (0, 2), proc.stderr
    assert json.loads(proc.stdout)["drafter"] == "prompt_lookup"  # no draft model in this bundle


@pytest.mark.parametrize("flag", [["--temperature", "-1"], ["--top-p", "0"], ["--top-k", "-2"], ["--k", "3"]])
def test_cli_refuses_bad_settings_before_work(small_bundle, flag):
    proc = cli(small_bundle, *flag)
    assert proc.returncode == 2 and "error" in proc.stderr and "Traceback" not in proc.stderr
    assert "[ortspec verify] greedy" not in proc.stderr


def test_control_power_is_the_wrong_rules_total_variation():
    from ortspec.exactness import control_power
    p = np.array([0.5, 0.5, 0.0])
    assert control_power(p, p) == 0.0                                 # nothing is ever rejected
    assert control_power(p, np.array([0.0, 0.0, 1.0])) == 0.0         # disjoint: the residual is p itself
    # q = one-hot on 0: accepted half the time; a rejection resamples p, not the residual (all on 1)
    assert control_power(p, np.array([1.0, 0.0, 0.0])) == 0.25        # [0.75, 0.25] against [0.5, 0.5]
    assert control_power(np.array([0.2, 0.8]), np.array([0.6, 0.4])) == pytest.approx(0.08)  # [0.28, 0.72]


def test_prefixes_are_where_the_wrong_rule_shows_most(small_bundle):
    """Each chosen prefix's score is the control's power at exactly that prefix (a fresh prefill of it, not a
    neighbouring row), and no candidate (a prompt plus up to 8 tokens of its greedy answer) scores higher."""
    from ortspec.config import SamplingConfig
    from ortspec.exactness import choose_prefixes, control_power, memoized_generator
    from ortspec.sampling import LogitsPipeline
    gen = memoized_generator(str(small_bundle), "model")
    sampling = dict(temperature=0.8, top_k=6, repetition_penalty=1.2)
    base = gen.sibling("none")
    answers = [base.generate(input_ids=ids, max_new_tokens=10, do_sample=False).token_ids for ids in PROMPTS]
    picked = choose_prefixes(gen, PROMPTS, answers, sampling, n=3)
    assert len(picked) == 3 and [c["control_tv"] for c in picked] == sorted((c["control_tv"] for c in picked),
                                                                            reverse=True)
    pipe = LogitsPipeline(SamplingConfig(do_sample=True, **sampling), gen.vocab_size)

    def power(ids):
        p = pipe.probs(gen.target.reference_logits(ids)[-1:], ids)[0]
        q = pipe.probs(gen.drafter.lm.reference_logits(ids)[-1:], ids)[0]
        return control_power(p, q)
    for c in picked:
        assert c["ids"] == PROMPTS[c["prompt"]] + answers[c["prompt"]][:c["answer_tokens"]]
        assert c["control_tv"] == pytest.approx(power(c["ids"]), abs=1e-5)
    best = max(power(PROMPTS[i] + answers[i][:j]) for i in range(len(PROMPTS)) for j in range(9))
    assert picked[0]["control_tv"] == pytest.approx(best, abs=1e-5) and best > 0
