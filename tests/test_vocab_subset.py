"""Drafts with a vocabulary-subset output layer (--draft-vocab): q = 0 outside, output still exact."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import _export
from ortspec import SpeculativeGenerator
from ortspec.errors import BundleError


@pytest.fixture(scope="module")
def subset_pair(workdir, hf_models):
    """Llama target + perturbed llama draft whose output layer keeps ids 0..39 (eos 2 and bos 1 among them)."""
    full = _export(target=str(hf_models["llama"]), draft=str(hf_models["llama_b"]), out=workdir / "b_sub_full")
    sub = _export(target=str(hf_models["llama"]), draft=str(hf_models["llama_b"]), out=workdir / "b_sub",
                  draft_vocab=40)
    return full, sub


def test_manifest_and_draft_logits(subset_pair):
    full, sub = subset_pair
    spec = json.loads((sub / "ortspec.json").read_text())["models"]["draft"]
    assert spec["vocab_size"] == 40 and spec["vocab_subset"] == {"full_size": 128, "ranges": [[0, 40]]}
    a = SpeculativeGenerator.load(full).drafter.lm
    b = SpeculativeGenerator.load(sub).drafter.lm
    ids = [1, 5, 60, 7, 99, 3]
    la, lb = a.reference_logits(ids), b.reference_logits(ids)
    assert lb.shape == la.shape == (len(ids), 128)
    np.testing.assert_allclose(lb[:, :40], la[:, :40], atol=1e-5)
    assert np.all(np.isneginf(lb[:, 40:]))


def test_special_ids_are_kept_and_self_draft_quantized(workdir, hf_models):
    out = _export(target=str(hf_models["small_target"]), draft="self", draft_quant="int4",
                  out=workdir / "b_sub_self", draft_vocab=1)
    spec = json.loads((out / "ortspec.json").read_text())["models"]["draft"]
    assert spec["vocab_subset"]["ranges"] == [[0, 3]]  # id 0 plus bos 1 and eos 2
    assert spec["quantization"]["method"] == "int4"


@pytest.mark.parametrize("gamma", [1, 3, "auto"])
def test_greedy_output_equals_target_only(subset_pair, gamma):
    _, sub = subset_pair
    gen = SpeculativeGenerator.load(sub)
    base = gen.sibling("none")
    for ids in ([1, 5, 6, 7], [1, 90, 100, 110, 120], [1, 20, 21, 22, 20, 21]):
        ref = base.generate(input_ids=ids, max_new_tokens=30).token_ids
        assert gen.generate(input_ids=ids, max_new_tokens=30, num_draft_tokens=gamma, strict=True).token_ids == ref


def test_sampled_drafts_stay_inside_the_subset(subset_pair):
    _, sub = subset_pair
    gen = SpeculativeGenerator.load(sub)
    drafted = []
    orig = gen.drafter.propose

    def spy(*a, **k):
        d = orig(*a, **k)
        drafted.extend(d.tokens)
        for q in d.dists or []:
            assert np.all(q.dense(gen.vocab_size)[40:] == 0)
        return d
    gen.drafter.propose = spy
    res = gen.generate(input_ids=[1, 5, 6], max_new_tokens=60, do_sample=True, temperature=1.5, seed=3, strict=True)
    assert drafted and max(drafted) < 40 and not res.stats.draft_disabled


@pytest.mark.parametrize("bad", [{"full_size": 128, "ranges": [[0, 41]]}, {"full_size": 128, "ranges": [[30, 70], [0, 0]]},
                                 {"full_size": 20, "ranges": [[0, 40]]}, {"ranges": [[0, 40]]}, [0, 40],
                                 {"full_size": 128, "ranges": [[0, True]]}])
def test_malformed_subset_is_refused(subset_pair, tmp_path, bad):
    import shutil
    _, sub = subset_pair
    dst = tmp_path / "b"
    shutil.copytree(sub, dst)
    man = json.loads((dst / "ortspec.json").read_text())
    man["models"]["draft"]["vocab_subset"] = bad
    (dst / "ortspec.json").write_text(json.dumps(man))
    with pytest.raises(BundleError, match="vocab_subset"):
        SpeculativeGenerator.load(dst)


def test_bad_draft_vocab_arguments(hf_models, tmp_path):
    for kwargs in (dict(draft_vocab=0, draft=str(hf_models["llama_b"])), dict(draft_vocab=True, draft="self", draft_quant="int4"),
                   dict(draft_vocab=40)):
        with pytest.raises(ValueError, match="draft_vocab"):
            _export(target=str(hf_models["llama"]), out=tmp_path / "x", **kwargs)
    with pytest.raises(ValueError, match="whole vocabulary"):
        _export(target=str(hf_models["llama"]), draft=str(hf_models["llama_b"]), out=tmp_path / "y", draft_vocab=128)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_inspect_shows_the_subset(subset_pair):
    from ortspec.inspect import format_report, inspect_bundle
    report = inspect_bundle(str(subset_pair[1]), checksums=False)
    assert report["ok"] and report["models"]["draft"]["vocab_subset"]["full_size"] == 128
    assert "output layer: 40 of 128 token ids (0..39)" in format_report(report)
