"""The graph's own TopK (``top_logits``): every exported graph returns each kept row's largest entries beside the
logits, decoding reads those instead of searching whole rows on the host, and the output is the same bits as
reading the whole rows. Bundles exported before it (no TopK) keep working."""
from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from ortspec import SpeculativeGenerator
from ortspec.bundle import MANIFEST, load_bundle, sha256_file
from ortspec.errors import BundleError
from ortspec.sampling import LAZY_TOP, Dist, LazyRow, LogitsPipeline, inverse_cdf_list, min_mass_lists
from ortspec.sampling.kernels import inverse_cdf
from ortspec.config import SamplingConfig
from ortspec.engine import CausalLM, PassOptions, TopRows
from test_device_rows import SETTINGS, _ids, _run


@pytest.mark.parametrize("role", ["target", "draft"])
def test_graphs_return_each_rows_largest_entries(pair_bundle, role):
    """The TopK outputs hold the K largest logits of each kept row, descending, ties by the lower id, and
    the manifest names them."""
    b = load_bundle(pair_bundle)
    spec = getattr(b, role)
    assert spec.top_logits == {"k": "logits_top_k", "values": "top_values", "ids": "top_ids"}
    lm = CausalLM(spec, str(b.file(spec.path)))
    lm.forward(_ids(6, 0, 128))
    rows = lm.forward_rows([5, 7, 5, 9], keep=3, options=PassOptions(top_k=9))
    assert isinstance(rows, TopRows) and len(rows) == 3
    full = rows.numpy()
    ids, values, bound = rows.top(9)
    for i in range(3):
        order = np.lexsort((np.arange(full.shape[1]), -full[i]))[:9]  # descending, lower id first on ties
        assert np.array_equal(ids[i], order) and np.array_equal(values[i], full[i][order])
        assert bound[i] == values[i][-1] and np.all(np.delete(full[i], order) <= bound[i])
        as_lists = rows[i].top(9)
        assert as_lists[0] == order.tolist() and as_lists[1] == full[i][order].tolist() and as_lists[2] == bound[i]
    assert rows[0].norm() is None  # the pass computed no normalizer (scale 0)


def test_target_graphs_return_each_rows_normalizer(pair_bundle):
    """A target graph's normalizer is sum_j exp((logit_j - max) / T) of each kept row, within the bound LazyRow
    reads it with; drafts have none."""
    b = load_bundle(pair_bundle)
    assert b.target.logits_norm == {"scale": "logits_norm_scale", "norm": "logits_norm", "block": 32}
    assert b.draft.logits_norm is None
    lm = CausalLM(b.target, str(b.file(b.target.path)))
    lm.forward(_ids(6, 0, 128))
    rows = lm.forward_rows([5, 7, 5, 9], keep=3, options=PassOptions(top_k=4, norm_scale=1 / 0.7))
    full = rows.numpy().astype(np.float64)
    for i in range(3):
        scale, z, block = rows[i].norm()
        exact = float(np.exp((full[i] - full[i].max()) / 0.7).sum())
        assert scale == 1 / 0.7 and block == 32
        assert abs(z - exact) <= ((block - 1) + (128 // block - 1) + 124) * 2.0 ** -24 * exact


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_top_rows_give_the_same_tokens_as_whole_rows(pair_bundle, setting, monkeypatch):
    """Decoding on the CPU reads the graph's top entries (logits="auto") where the rules settle a row from them
    (and, without truncation, verifies from the target's normalizer: LazyRow), and whole rows otherwise: the
    same tokens, bit for bit, as reading every row whole (logits="host")."""
    bounded = []
    real = LazyRow._from_norm
    monkeypatch.setattr(LazyRow, "_from_norm", lambda self, *a: bounded.append(real(self, *a)) or bounded[-1])
    top = SpeculativeGenerator.load(pair_bundle)
    host = SpeculativeGenerator.load(pair_bundle, logits="host")
    assert top.target.top_rows and not host.target.top_rows
    prompts = [_ids(6 + 3 * j, j, 128) for j in range(4)]
    top.target.rows_read = 0
    assert _run(top, setting, prompts) == _run(host, setting, prompts)
    rules = LogitsPipeline(SamplingConfig(**SETTINGS[setting]), 128)
    if rules.top_entries():  # rows came with their top entries
        assert top.target.rows_read > 0
    assert (sum(b is not None for b in bounded) > 10) is rules.lazy_rows()  # verdicts from the normalizer: without truncation


PENALIZED = {
    "penalty, no top-k": dict(do_sample=True, temperature=0.8, top_k=0, repetition_penalty=1.3),
    "penalty + bans + top-p": dict(do_sample=True, top_p=0.9, top_k=0, repetition_penalty=1.2,
                                   bad_words_ids=[[4], [6, 8]]),
}


@pytest.mark.parametrize("setting", list(PENALIZED))
def test_penalized_lazy_rows_give_the_same_tokens_as_whole_rows(pair_bundle, setting, monkeypatch):
    """Where the vocabulary is wide enough for LazyRow to take penalized rows (here: any width), decoding gives
    the same tokens as whole rows, and LazyRow settled verdicts from the normalizer."""
    monkeypatch.setattr(LogitsPipeline, "LAZY_PENALTY_VOCAB", 0)
    bounded = []
    real = LazyRow._from_norm
    monkeypatch.setattr(LazyRow, "_from_norm", lambda self, *a, **k: bounded.append(real(self, *a, **k)) or bounded[-1])
    top = SpeculativeGenerator.load(pair_bundle)
    host = SpeculativeGenerator.load(pair_bundle, logits="host")
    prompts = [_ids(6 + 3 * j, j, 128) for j in range(4)]
    settings = PENALIZED[setting]
    runs = [[g.generate(input_ids=p, max_new_tokens=24, seed=j, num_draft_tokens=n, eos_token_id=[],
                        **settings).token_ids for j, p in enumerate(prompts) for n in (1, 3)] for g in (top, host)]
    assert runs[0] == runs[1]
    assert sum(b is not None for b in bounded) > 10


def _without_top(bundle, dst, norm_only: bool = False):
    """A copy of ``bundle`` as exported before graphs had a TopK: no top_logits or logits_norm in the manifest, no
    such inputs or outputs in the graphs; ``norm_only``: as exported before target graphs had a normalizer."""
    import onnx
    shutil.copytree(bundle, dst)
    manifest = json.loads((dst / MANIFEST).read_text())
    gone = [("input", "logits_norm_scale"), ("output", "logits_norm")]
    if not norm_only:
        gone += [("input", "logits_top_k"), ("output", "top_values"), ("output", "top_ids")]
    for spec in manifest["models"].values():
        path = dst / spec["path"]
        model = onnx.load(str(path), load_external_data=False)
        graph = model.graph
        keep = [n for n in graph.node if not n.name.startswith("norm/") and (norm_only or n.op_type != "TopK")]
        del graph.node[:]
        graph.node.extend(keep)
        for field, name in gone:
            values = [v for v in getattr(graph, field) if v.name != name]
            del getattr(graph, field)[:]
            getattr(graph, field).extend(values)
        onnx.save(model, str(path))
        spec.pop("logits_norm", None)
        if not norm_only:
            spec.pop("top_logits")
        spec["sha256"][path.name] = sha256_file(path)
        spec["size_bytes"][path.name] = path.stat().st_size
    (dst / MANIFEST).write_text(json.dumps(manifest))
    return dst


def test_a_bundle_without_top_outputs_still_decodes(pair_bundle, tmp_path):
    """A bundle exported before the graphs had a TopK loads and decodes the same tokens as one with it."""
    old = _without_top(pair_bundle, tmp_path / "old")
    before = SpeculativeGenerator.load(old)
    assert before.target.spec.top_logits is None and not before.target.top_rows
    from ortspec.inspect import format_report, inspect_bundle
    assert "top entries: none (exported before" in format_report(inspect_bundle(str(old)))
    assert "largest logits come with the pass" in format_report(inspect_bundle(str(pair_bundle)))
    now = SpeculativeGenerator.load(pair_bundle)
    prompts = [_ids(6 + 3 * j, j, 128) for j in range(3)]
    for setting in ("greedy", "qwen defaults", "temperature only"):
        assert _run(before, setting, prompts) == _run(now, setting, prompts), setting


def test_upgrade_gives_an_old_bundle_the_top_entries(pair_bundle, tmp_path):
    """`ortspec export --upgrade --out B`: an old bundle's graphs get the TopK in place (the weights untouched),
    it decodes the same tokens reading them, and a second upgrade has nothing to do."""
    import subprocess
    import sys
    old = _without_top(pair_bundle, tmp_path / "old")
    weights = {p.name: p.stat().st_mtime_ns for p in old.glob("*/*.data")}
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "export", "--upgrade", "--out", "old"],
                          capture_output=True, text=True, cwd=tmp_path)  # a relative path, as people type it
    assert proc.returncode == 0 and "upgraded (target, draft)" in proc.stdout, proc.stderr
    b = load_bundle(old)  # checksums too
    assert b.target.top_logits and b.draft.top_logits and b.target.path == "target/model.onnx"
    assert b.target.logits_norm and not b.draft.logits_norm
    assert not list(old.glob("*/*.upgrade")) and not list(old.glob("*/*.tmp"))
    assert {p.name: p.stat().st_mtime_ns for p in old.glob("*/*.data")} == weights
    up = SpeculativeGenerator.load(old)
    assert up.target.top_rows
    prompts = [_ids(6 + 3 * j, j, 128) for j in range(3)]
    for setting in ("greedy", "qwen defaults", "temperature only"):
        assert _run(up, setting, prompts) == _run(SpeculativeGenerator.load(pair_bundle), setting, prompts)
    again = subprocess.run([sys.executable, "-m", "ortspec.cli", "export", "--upgrade", "--out", str(old)],
                           capture_output=True, text=True)
    assert again.returncode == 0 and "already current" in again.stdout
    for args, message in (([str(tmp_path / "none")], "does not exist"),
                          ([str(old), "--target", "x"], "takes no --target")):
        bad = subprocess.run([sys.executable, "-m", "ortspec.cli", "export", "--upgrade", "--out", *args],
                             capture_output=True, text=True)
        assert bad.returncode != 0 and message in bad.stderr, bad.stderr


@pytest.mark.parametrize("stop", ["before the switch", "after the switch"])
def test_an_interrupted_upgrade_leaves_a_bundle_that_loads(pair_bundle, tmp_path, monkeypatch, stop):
    """Stopped before the manifest names the new graph, the bundle is the old one; stopped after, it runs the
    new graph under the other name. Either way it loads, and the next upgrade finishes the job."""
    from ortspec.export import api
    old = _without_top(pair_bundle, tmp_path / "old")
    real = api._switch_manifest if stop == "before the switch" else api._move_back

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(api, "_switch_manifest" if stop == "before the switch" else "_move_back", interrupted)
    with pytest.raises(KeyboardInterrupt):
        api.upgrade_bundle(old, progress=None)
    b = load_bundle(old)
    assert (b.target.top_logits is None) is (stop == "before the switch")
    assert (b.target.path == "target/model.onnx") is (stop == "before the switch")
    monkeypatch.setattr(api, "_switch_manifest" if stop == "before the switch" else "_move_back", real)
    assert api.upgrade_bundle(old, progress=None) == ["target", "draft"]
    b = load_bundle(old)
    assert b.target.top_logits and b.target.path == "target/model.onnx" and b.draft.path == "draft/model.onnx"
    assert not list(old.glob("*/*.upgrade"))
    gen = SpeculativeGenerator.load(old)
    assert _run(gen, "qwen defaults", [_ids(7, 1, 128)]) == \
        _run(SpeculativeGenerator.load(pair_bundle), "qwen defaults", [_ids(7, 1, 128)])


def test_upgrade_gives_a_target_its_normalizer(pair_bundle, tmp_path):
    """A bundle whose graphs have the TopK but whose target lacks the normalizer: only the target is upgraded,
    and it decodes the same tokens (verification then reads the normalizer)."""
    from ortspec.export import api
    old = _without_top(pair_bundle, tmp_path / "old", norm_only=True)
    b = load_bundle(old)
    assert b.target.top_logits and b.target.logits_norm is None
    prompts = [_ids(6 + 3 * j, j, 128) for j in range(3)]
    before = _run(SpeculativeGenerator.load(old), "temperature only", prompts)
    assert api.upgrade_bundle(old, progress=None) == ["target"]
    assert load_bundle(old).target.logits_norm and api.upgrade_bundle(old, progress=None) == []
    assert _run(SpeculativeGenerator.load(old), "temperature only", prompts) == before


def test_a_malformed_top_logits_entry_is_refused(pair_bundle, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(pair_bundle, bad)
    manifest = json.loads((bad / MANIFEST).read_text())
    manifest["models"]["target"]["top_logits"] = {"k": "logits_top_k", "values": 3}
    (bad / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="top_logits is malformed"):
        load_bundle(bad)


def test_top_entries_wanted_per_setting():
    """How many top entries a pipeline reads: greedy and top-k settings a few (with the margin), sampling without
    truncation LAZY_TOP (verification settles most drafts from them), settings that need whole rows none."""
    def wanted(**kw):
        return LogitsPipeline(SamplingConfig(**kw), 1000).top_entries()
    margin = LogitsPipeline.TOP_MARGIN
    assert wanted(do_sample=False) == 1 + margin
    assert wanted(do_sample=True, top_k=20, top_p=0.8, repetition_penalty=1.05) == 20 + margin
    assert wanted(do_sample=True, top_k=0) == LAZY_TOP                 # temperature only: LazyRow
    assert wanted(do_sample=True, top_k=2000) == LAZY_TOP              # top-k beyond the vocabulary: none
    assert wanted(do_sample=True, top_k=0, bad_words_ids=[[3]]) == LAZY_TOP
    assert wanted(do_sample=True, top_k=0, repetition_penalty=1.2) == 0   # penalized rows are read whole
    assert wanted(do_sample=True, top_k=0, top_p=0.9) == LAZY_TOP      # a nucleus too
    assert wanted(do_sample=True, top_k=300) == 0                      # beyond the lean path
    assert wanted(do_sample=True, top_k=0, repetition_penalty=0.8) == 0
    assert wanted(do_sample=True, top_k=20, repetition_penalty=0.8) == 0  # a penalty below 1 raises entries


def test_small_dists_draw_and_overlap_as_the_array_forms():
    """The list forms used for small supports: the same draw as the array inverse CDF for the same uniform
    number, and the same sum of min(p, q)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        w = rng.random(n) * (rng.random(n) < 0.7)
        if not w.any():
            continue
        u = float(rng.random())
        assert inverse_cdf_list(w.tolist(), u) == inverse_cdf(w, u)
    p = Dist.from_probs(np.array([0.1, 0.0, 0.5, 0.4, 0.0]))
    q = Dist.from_probs(np.array([0.3, 0.3, 0.0, 0.2, 0.2]))
    assert p.small and q.small
    arrays = Dist.from_probs(np.array([0.1, 0.0, 0.5, 0.4, 0.0]), small=False)
    assert not arrays.small and arrays.sparse
    assert math.isclose(p.min_mass(q), arrays.min_mass(q), rel_tol=1e-12)
    assert math.isclose(min_mass_lists(p.tokens, p.plist, q.tokens, q.plist), 0.1 + 0.2, rel_tol=1e-12)
    assert p.prob(2) == 0.5 and p.prob(1) == 0.0 and p.prob(7) == 0.0


@pytest.mark.parametrize("entry", [{"scale": "logits_norm_scale", "norm": "logits_norm"},
                                   {"scale": "logits_norm_scale", "norm": 3, "block": 32},
                                   {"scale": "logits_norm_scale", "norm": "logits_norm", "block": 0}])
def test_a_malformed_logits_norm_entry_is_refused(pair_bundle, tmp_path, entry):
    bad = tmp_path / "bad"
    shutil.copytree(pair_bundle, bad)
    manifest = json.loads((bad / MANIFEST).read_text())
    manifest["models"]["target"]["logits_norm"] = entry
    (bad / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="logits_norm is malformed"):
        load_bundle(bad)
