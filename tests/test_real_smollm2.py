"""Integration on the real SmolLM2-135M-Instruct pair (recipe smollm2-135m: fp32 target, INT4 self-draft).

Exports once per session from the PyPI wheel that carries the GGUF weights.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ortspec import SpeculativeGenerator
from ortspec.exactness import greedy_check

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    pytest.importorskip("torch")
    from ortspec.export import export_bundle
    from ortspec.export.recipes import resolve_recipe
    out = tmp_path_factory.mktemp("real") / "smollm2-135m"
    return export_bundle(out=out, progress=None, **resolve_recipe("smollm2-135m", progress=lambda m: None))


def test_inspect_reports_a_sound_bundle(smol):
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "inspect", str(smol), "--json"],
                          capture_output=True, text=True)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"]
    target, draft = report["models"]["target"], report["models"]["draft"]
    assert target["layers"] == 30 and target["kv_heads"] == 3 and target["vocab_size"] == 49152
    assert draft["quantization"]["method"] == "int4"
    assert draft["quantization"]["quantized_nodes"]["GatherBlockQuantized"] == 1  # embedding quantized
    assert draft["size_bytes"] < target["size_bytes"] / 4


def test_logits_are_sane(smol):
    gen = SpeculativeGenerator.load(smol, drafter="none")
    ids = gen.codec.encode("The capital of France is")
    logits = gen.target.prefill(ids)
    assert np.isfinite(logits).all()
    assert gen.codec.decode([int(logits[-1].argmax())]).strip() == "Paris"
    res = gen.generate(prompt="What is the capital of France?", chat=True, max_new_tokens=20)
    assert "Paris" in res.text and res.finish_reason == "eos"


def test_speculative_greedy_equals_target_greedy_on_dev_prompts(smol, dev_prompts):
    gen = SpeculativeGenerator.load(smol, drafter="none")
    prompts = [gen.codec.encode(p, chat=True) for p in dev_prompts]
    report = greedy_check(str(smol), prompts, gammas=[1, 2, 4, 8], drafters=("model", "prompt_lookup"),
                          max_new_tokens=64)
    for d in report.divergences:  # reported, never hidden
        print(f"divergence: {d}")
    assert report.runs == len(prompts) * 8
    assert report.mismatches == 0, report.to_dict()
