"""Every path through the runtime a bundle can take: bundle format 1 (an earlier release's: no top entries in its
graphs) and 2, logits read whole on the host, through their top entries and on the device, top-k sampling on and off, every drafter. Each gives the
right output or a clear error: greedy the target-only ids, seeded sampling the ids the current bundle's host path
gives where the drafts do not depend on timing."""
from __future__ import annotations

import json

import pytest

from ortspec import SpeculativeGenerator
from ortspec.bundle import MANIFEST
from test_top_logits import _without_top

PROMPTS = [[1, 17, 5, 99, 42, 17, 5], [1, 8, 9, 10, 8, 9]]
SETTINGS = {"greedy": dict(do_sample=False),
            "top-k on": dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
            "top-k off": dict(do_sample=True, temperature=0.9, top_k=0)}
DRAFTERS = ("model", "hybrid", "prompt_lookup", "none")
# drafts chosen by timed costs (hybrid) or sized by them (n-gram lookups): their seeded sampled ids may differ
TIMED = ("hybrid", "prompt_lookup")


@pytest.fixture(scope="module")
def formats(pair_bundle, tmp_path_factory):
    """{1: a copy as an earlier release wrote it, 2: the bundle as exported now}."""
    old = _without_top(pair_bundle, tmp_path_factory.mktemp("format1") / "b")
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["format_version"] = 1
    (old / MANIFEST).write_text(json.dumps(manifest))
    return {1: old, 2: pair_bundle}


def _ids(gen, setting):
    return [gen.generate(input_ids=p, max_new_tokens=16, num_draft_tokens=3, seed=11 + j, eos_token_id=[],
                         **SETTINGS[setting]).token_ids for j, p in enumerate(PROMPTS)]


def test_every_format_logits_place_top_k_and_drafter(formats):
    reference = {}
    base = SpeculativeGenerator.load(formats[2], logits="host")
    for setting in SETTINGS:
        reference["none", setting] = _ids(base.sibling("none"), setting)
        reference["model", setting] = _ids(base, setting)
    for version, bundle in formats.items():
        for logits in ("host", "auto", "device"):  # whole rows on the host; through their top entries; on the device
            first = SpeculativeGenerator.load(bundle, logits=logits)
            assert first.target.top_rows == (version == 2 and logits != "host")
            for drafter in DRAFTERS:
                gen = first if drafter == "model" else first.sibling(drafter)
                for setting in SETTINGS:
                    got = _ids(gen, setting)
                    where = (version, logits, drafter, setting)
                    assert all(len(ids) == 16 and all(0 <= t < 128 for t in ids) for ids in got), where
                    if setting == "greedy":
                        assert got == reference["none", "greedy"], where
                    elif drafter not in TIMED:
                        assert got == reference[drafter, setting], where
