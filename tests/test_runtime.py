"""Runtime behaviour on tiny random bundles: cache, equivalence, failure paths, arguments."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import ortspec
from ortspec import SpeculativeGenerator
from ortspec.bundle import load_bundle
from ortspec.errors import BundleError, CacheOverflowError, ModelRunError, ProviderUnavailableError
from ortspec.sampling import Dist, LazyRow
from ortspec.engine import CausalLM

PROMPTS = [[1, 17, 5, 99, 42], [1, 8, 8, 8, 8, 8, 9, 8, 8], [1, 120, 3, 77, 64, 12, 33, 7, 90, 101, 4]]


def lm_of(bundle_dir, role="target"):
    b = load_bundle(bundle_dir)
    spec = getattr(b, role)
    return CausalLM(spec, str(b.file(spec.path)))


# -- CausalLM -----------------------------------------------------------------
def test_rollback_then_forward_equals_fresh_prefill(pair_bundle):
    lm = lm_of(pair_bundle)
    ids = [1, 17, 5, 99, 42, 8, 63, 120]
    lm.prefill(ids)
    lm.rollback(5)
    assert lm.length == 5 and lm.tokens == ids[:5]
    got = lm.forward([11, 12, 13])
    ref = lm.reference_logits(ids[:5] + [11, 12, 13])[-3:]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    lm.rollback(0)
    np.testing.assert_allclose(lm.forward(ids[:2]), lm.reference_logits(ids[:2]), atol=1e-6)


def test_static_cache_rollback_is_only_a_length(pair_bundle):
    lm = lm_of(pair_bundle)
    if not lm.static:
        pytest.skip("concat caches trim")
    lm.cache.RESERVE_STEP = 16
    lm.prefill(list(range(1, 40)))
    buffers = [id(v) for v in lm.cache.past]
    room = lm.spec.kv_headroom  # (a row-invariant target's extra attention row: one slot past every pass)
    assert lm.cache.stored == 48 + room
    lm.rollback(10)
    lm.forward([5, 6])
    assert [id(v) for v in lm.cache.past] == buffers  # same device buffers, written in place
    lm.forward([(k % 120) + 3 for k in range(60)])  # past the reservation: grows once, keeps the prefix
    assert lm.cache.stored == 80 + room and [id(v) for v in lm.cache.past] != buffers
    ref = lm.reference_logits(lm.tokens + [7, 8, 9])[-3:]
    np.testing.assert_allclose(lm.forward([7, 8, 9]), ref, atol=1e-5)


def test_rollback_never_runs_the_model(pair_bundle):
    lm = lm_of(pair_bundle)
    lm.prefill([1, 2, 3, 4, 5, 6])
    calls = []
    lm.session.run_with_iobinding = lambda *a: calls.append(a)
    lm.rollback(2)
    assert calls == [] and lm.length == 2
    with pytest.raises(ValueError, match="rollback length"):
        lm.rollback(3)


def test_kv_trim_graph_matches_slicing(pair_bundle):
    lm = lm_of(pair_bundle)
    if lm.static:
        pytest.skip("static caches are never trimmed")
    lm.prefill(list(range(1, 12)))
    full = [v.numpy().copy() for v in lm.cache.past]
    lm.rollback(4)
    trimmed = [v.numpy() for v in lm.cache.trimmed(4)]
    for a, b in zip(full, trimmed):
        assert np.array_equal(a[:, :, :4], b)


def test_overflow_is_refused_before_running(pair_bundle):
    lm = lm_of(pair_bundle)
    most = 256 - lm.spec.kv_headroom  # (a row-invariant target keeps one position for its attention row)
    with pytest.raises(CacheOverflowError, match=f"maximum of {most}"):
        lm.forward([1] * (most + 1))
    assert lm.length == 0


def test_cuda_provider_unavailable_is_a_clear_error(pair_bundle):
    import onnxruntime as ort
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA is available here")
    with pytest.raises(ProviderUnavailableError, match="ortspec\\[cuda\\]"):
        SpeculativeGenerator.load(pair_bundle, provider="cuda")


def test_cuda_with_a_dynamic_int8_draft_warns_it_runs_on_the_cpu(small_int8_bundle, small_self_bundle):
    """onnxruntime has no CUDA kernels for dynamic INT8: such a draft would run on the CPU, so loading it for
    CUDA says so (here CUDA is missing too, so the load then fails as above). An INT4 draft loads silently."""
    import warnings
    import onnxruntime as ort
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDA is available here")
    with pytest.warns(RuntimeWarning, match="--draft-quant int4"), pytest.raises(ProviderUnavailableError):
        SpeculativeGenerator.load(small_int8_bundle, provider="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ProviderUnavailableError):
            SpeculativeGenerator.load(small_self_bundle, provider="cuda")
        with pytest.raises(ProviderUnavailableError):
            SpeculativeGenerator.load(small_int8_bundle, provider="cuda", drafter="none")


@pytest.mark.parametrize("builds, says", [
    (["onnxruntime"], "install the GPU build in place of the CPU one: pip uninstall -y onnxruntime onnxruntime-gpu "
                      "&& pip install 'ortspec[cuda]'"),
    (["onnxruntime", "onnxruntime-gpu"], "both builds are installed"),
])
def test_cuda_error_names_the_install_that_fixes_it(monkeypatch, builds, says):
    from ortspec.engine import session as model
    monkeypatch.setattr(model, "installed_builds", lambda: builds)
    monkeypatch.setattr(model.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(ProviderUnavailableError) as err:
        model.providers_for("cuda")
    assert says in str(err.value)
    assert "'ortspec[cuda]'" in str(err.value)


def test_gpu_build_without_cuda_libraries_is_named(monkeypatch):
    from ortspec.engine import session as model
    monkeypatch.setattr(model, "installed_builds", lambda: ["onnxruntime-gpu"])
    assert "CUDA 13 and cuDNN 9" in model.missing_provider("CUDAExecutionProvider", loaded=False)


def test_no_install_puts_both_onnxruntime_builds_side_by_side():
    """The base install names neither build; `cpu` and `cuda` each bring exactly one."""
    import re
    import tomllib
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    names = lambda reqs: {re.split(r"[<>=~! \[;]", r, maxsplit=1)[0] for r in reqs}
    assert not names(project["dependencies"]) & {"onnxruntime", "onnxruntime-gpu"}
    extras = project["optional-dependencies"]
    assert "onnxruntime" in names(extras["cpu"]) and "onnxruntime-gpu" not in names(extras["cpu"])
    assert "onnxruntime-gpu" in names(extras["cuda"]) and "onnxruntime" not in names(extras["cuda"])
    for extra, reqs in extras.items():  # no other extra brings a build of its own, except genai's CPU one
        if extra not in ("cpu", "cuda", "genai"):
            assert not names(reqs) & {"onnxruntime", "onnxruntime-gpu"}, extra


# -- greedy equivalence -------------------------------------------------------
@pytest.fixture(scope="module")
def baselines(pair_bundle):
    gen = SpeculativeGenerator.load(pair_bundle, drafter="none")
    return {tuple(p): gen.generate(input_ids=p, max_new_tokens=40).token_ids for p in PROMPTS}


@pytest.mark.parametrize("drafter", ["model", "prompt_lookup"])
@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_greedy_equals_target_only(pair_bundle, baselines, drafter, gamma):
    gen = SpeculativeGenerator.load(pair_bundle, drafter=drafter)
    for p in PROMPTS:
        res = gen.generate(input_ids=p, max_new_tokens=40, num_draft_tokens=gamma, strict=True)
        assert res.token_ids == baselines[tuple(p)]


def test_greedy_with_self_draft_accepts_most(llama_bundle):
    base = SpeculativeGenerator.load(llama_bundle, drafter="none")
    gen = SpeculativeGenerator.load(llama_bundle)
    for p in PROMPTS:
        want = base.generate(input_ids=p, max_new_tokens=30).token_ids
        res = gen.generate(input_ids=p, max_new_tokens=30, num_draft_tokens=4, strict=True)
        assert res.token_ids == want
        assert res.stats.acceptance_rate > 0.1  # far above chance (1/128) on a chaotic random model


def test_auto_gamma_greedy_equals_target_only(pair_bundle, baselines):
    gen = SpeculativeGenerator.load(pair_bundle)
    for p in PROMPTS:
        assert gen.generate(input_ids=p, max_new_tokens=40, num_draft_tokens="auto").token_ids == baselines[tuple(p)]


# -- strict invariants over long sampled runs with many rejections -------------
def test_strict_long_sampled_generation(pair_bundle):
    gen = SpeculativeGenerator.load(pair_bundle)
    res = gen.generate(input_ids=PROMPTS[0], max_new_tokens=200, do_sample=True, temperature=1.5, seed=3,
                       num_draft_tokens=5, strict=True, eos_token_id=[])
    s = res.stats
    assert len(res.token_ids) == 200 and s.new_tokens == 200
    assert s.drafted > s.accepted > 0  # there were rejections
    assert s.rounds == len(s.round_tokens) and sum(s.round_tokens) == 200
    assert len(s.per_position_acceptance) == 5 and all(0 <= a <= 1 for a in s.per_position_acceptance)


def test_min_mass_is_computed_only_where_something_reads_it(pair_bundle, monkeypatch):
    """sum_x min(p, q) costs host time every verified position: a fixed gamma computes it only for the statistics
    when asked (record_min_mass, as bench does), an auto gamma always (it learns from it); the tokens never
    depend on it."""
    gen = SpeculativeGenerator.load(pair_bundle)
    calls = []
    original = Dist.min_mass
    monkeypatch.setattr(Dist, "min_mass", lambda self, other: calls.append(1) or original(self, other))
    monkeypatch.setattr(LazyRow, "min_mass", lambda self, other: calls.append(1) or original(self.dist(), other))
    run = dict(input_ids=PROMPTS[0], max_new_tokens=30, do_sample=True, temperature=1.2, seed=5, eos_token_id=[])
    plain = gen.generate(**run, num_draft_tokens=3)
    assert not calls and plain.stats.per_position_min_mass == []
    gen.record_min_mass = True
    recorded = gen.generate(**run, num_draft_tokens=3)
    assert recorded.token_ids == plain.token_ids
    s = recorded.stats
    assert len(calls) == sum(s.verified_at) > 0 and len(s.per_position_min_mass) == 3
    assert all(0 < m <= 1 for m in s.per_position_min_mass)
    assert gen.sibling("model").record_min_mass
    calls.clear()
    gen.record_min_mass = False
    auto = gen.generate(**run, num_draft_tokens="auto")
    assert calls and len(calls) == sum(auto.stats.verified_at)


def test_strict_detects_a_broken_cache(pair_bundle):
    gen = SpeculativeGenerator.load(pair_bundle)
    original = gen.target.rollback

    def forgetful_rollback(length):  # keeps rejected tokens' K/V: the bug strict mode exists for
        gen.target.tokens[:] = gen.target.tokens[:max(length, len(gen.target.tokens))]
    gen.target.rollback = forgetful_rollback
    with pytest.raises(ortspec.InvariantError):
        gen.generate(input_ids=PROMPTS[0], max_new_tokens=30, strict=True)
    gen.target.rollback = original


# -- seeds, EOS, lengths, events ----------------------------------------------
def test_seeded_sampling_is_reproducible(pair_bundle):
    gen = SpeculativeGenerator.load(pair_bundle)
    kw = dict(input_ids=PROMPTS[1], max_new_tokens=30, do_sample=True, top_k=20, temperature=0.9)
    a = gen.generate(seed=11, **kw).token_ids
    assert gen.generate(seed=11, **kw).token_ids == a
    assert SpeculativeGenerator.load(pair_bundle).generate(seed=11, **kw).token_ids == a
    assert gen.generate(seed=12, **kw).token_ids != a


def test_eos_is_last_token_returned(pair_bundle, baselines):
    want = baselines[tuple(PROMPTS[0])]
    eos = want[6]
    stop = want.index(eos)
    for drafter in ("model", "none", "prompt_lookup"):
        gen = SpeculativeGenerator.load(pair_bundle, drafter=drafter)
        res = gen.generate(input_ids=PROMPTS[0], max_new_tokens=40, eos_token_id=eos, num_draft_tokens=8)
        assert res.token_ids == want[:stop + 1] and res.finish_reason == "eos"


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_max_new_tokens_truncates_rounds(pair_bundle, baselines, n):
    gen = SpeculativeGenerator.load(pair_bundle, drafter="prompt_lookup")
    res = gen.generate(input_ids=PROMPTS[1], max_new_tokens=n, num_draft_tokens=8, strict=True)
    assert res.token_ids == baselines[tuple(PROMPTS[1])][:n] and res.finish_reason == "length"


def test_stream_events_rebuild_the_result(llama_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    events = list(gen.stream(prompt="w5 w6 w7", max_new_tokens=20))
    ids = [t for ev in events for t in ev.token_ids]
    res = gen.generate(prompt="w5 w6 w7", max_new_tokens=20)
    assert ids == res.token_ids
    assert "".join(ev.text for ev in events) == res.text
    assert {ev.kind for ev in events} <= {"accepted", "corrected", "bonus", "target", "text"}
    assert res.text == gen.codec.decode(res.token_ids)


def test_chat_template_is_applied(llama_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    assert gen.codec.render_chat("w9") == "<s> w1 w9 </s> <s> w2 "
    a = gen.generate(prompt="w9", chat=True, max_new_tokens=5).token_ids
    b = gen.generate(input_ids=gen.codec.encode("<s> w1 w9 </s> <s> w2"), max_new_tokens=5).token_ids
    assert a == b
    c = gen.generate(messages=[{"role": "user", "content": "w9"}], max_new_tokens=5).token_ids
    assert a == c


def test_ids_only_bundle_generates_from_input_ids(ids_bundle):
    gen = SpeculativeGenerator.load(ids_bundle, drafter="prompt_lookup")
    res = gen.generate(input_ids=[1, 5, 6, 5, 6], max_new_tokens=10)
    assert len(res.token_ids) <= 10 and res.text is None
    with pytest.raises(ValueError, match="no tokenizer"):
        gen.generate(prompt="hello")
    with pytest.raises(BundleError, match="no draft model"):
        SpeculativeGenerator.load(ids_bundle, drafter="model")


# -- failure paths -------------------------------------------------------------
def test_failing_draft_degrades_to_target_only(pair_bundle, baselines):
    gen = SpeculativeGenerator.load(pair_bundle)

    def broken(ids, keep=None, options=None):
        raise ModelRunError("simulated draft failure")
    gen.drafter.lm.forward_rows = broken  # (a decoding round's passes)
    with pytest.warns(RuntimeWarning, match="simulated draft failure"):
        res = gen.generate(input_ids=PROMPTS[0], max_new_tokens=40)
    assert res.token_ids == baselines[tuple(PROMPTS[0])]
    assert res.stats.draft_disabled
    assert gen.generate(input_ids=PROMPTS[0], max_new_tokens=5).stats.draft_disabled


def test_draft_returning_garbage_is_never_committed(pair_bundle, baselines):
    gen = SpeculativeGenerator.load(pair_bundle)
    gen.drafter.propose = lambda *a, **k: ortspec.drafting.Draft([10_000], None)
    with pytest.warns(RuntimeWarning):
        res = gen.generate(input_ids=PROMPTS[2], max_new_tokens=40)
    assert res.token_ids == baselines[tuple(PROMPTS[2])] and res.stats.draft_disabled


def test_draft_that_fails_to_load_is_disabled(tmp_path, pair_bundle, baselines):
    import shutil
    b = tmp_path / "b"
    shutil.copytree(pair_bundle, b)
    graph = b / "draft" / "model.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])  # onnxruntime cannot parse it
    with pytest.warns(RuntimeWarning, match="failed to load"):
        gen = SpeculativeGenerator.load(b, verify="none")
    res = gen.generate(input_ids=PROMPTS[0], max_new_tokens=40)
    assert res.token_ids == baselines[tuple(PROMPTS[0])] and res.stats.draft_disabled


def test_draft_whose_manifest_misnames_its_graph_is_refused(tmp_path, pair_bundle):
    import shutil, json
    b = tmp_path / "b"
    shutil.copytree(pair_bundle, b)
    m = json.loads((b / "ortspec.json").read_text())
    m["models"]["draft"]["kv_inputs"][0][0] = "no_such_input"
    (b / "ortspec.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match="no_such_input"):
        SpeculativeGenerator.load(b)


def test_target_failure_raises_and_generator_stays_usable(pair_bundle, baselines):
    gen = SpeculativeGenerator.load(pair_bundle)
    real = gen.target._pass
    calls = {"n": 0}

    def flaky(*a):
        calls["n"] += 1
        if calls["n"] == 4:
            raise ModelRunError("simulated target failure")
        return real(*a)
    gen.target._pass = flaky
    with pytest.raises(ModelRunError, match="simulated"):
        gen.generate(input_ids=PROMPTS[0], max_new_tokens=40)
    res = gen.generate(input_ids=PROMPTS[0], max_new_tokens=40, strict=True)
    assert res.token_ids == baselines[tuple(PROMPTS[0])]


def test_interrupted_stream_leaves_generator_usable(pair_bundle, baselines):
    gen = SpeculativeGenerator.load(pair_bundle)
    it = gen.stream(input_ids=PROMPTS[2], max_new_tokens=40, do_sample=True, seed=1)
    next(it)
    it.close()  # what a KeyboardInterrupt in the consumer does to the generator
    assert gen.generate(input_ids=PROMPTS[2], max_new_tokens=40).token_ids == baselines[tuple(PROMPTS[2])]


def test_threads_share_one_generator(pair_bundle, baselines):
    gen = SpeculativeGenerator.load(pair_bundle)
    results, errors = [], []

    def work():
        try:
            for k in range(20):
                p = PROMPTS[k % len(PROMPTS)]
                results.append((tuple(p), gen.generate(input_ids=p, max_new_tokens=40).token_ids))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 80
    assert all(ids == baselines[p] for p, ids in results)


def test_changing_settings_between_calls(pair_bundle):
    gen = SpeculativeGenerator.load(pair_bundle)
    fresh = SpeculativeGenerator.load(pair_bundle)
    gen.generate(input_ids=PROMPTS[0], max_new_tokens=20, do_sample=True, temperature=2.0, seed=5)
    a = gen.generate(input_ids=PROMPTS[0], max_new_tokens=20, do_sample=True, top_k=5, seed=5, strict=True)
    b = fresh.generate(input_ids=PROMPTS[0], max_new_tokens=20, do_sample=True, top_k=5, seed=5)
    assert a.token_ids == b.token_ids


# -- arguments ----------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    (dict(do_sample=True, temperature=-1.0), "temperature"),
    (dict(do_sample=True, top_p=0.0), "top_p"),
    (dict(do_sample=True, top_p=1.2), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(num_draft_tokens=-1), "num_draft_tokens"),
    (dict(num_draft_tokens="many"), "num_draft_tokens"),
    (dict(seed=-5), "seed"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
])
def test_bad_generation_arguments(llama_bundle, kwargs, match):
    gen = SpeculativeGenerator.load(llama_bundle)
    with pytest.raises(ValueError, match=match):
        gen.generate(input_ids=[1, 2, 3], **kwargs)


def test_bad_prompts(llama_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    with pytest.raises(ValueError, match="exactly one"):
        gen.generate()
    with pytest.raises(ValueError, match="exactly one"):
        gen.generate(prompt="w1", input_ids=[1])
    with pytest.raises(ValueError, match="non-empty"):
        gen.generate(prompt="")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gen.generate(input_ids=[1, 128])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gen.generate(input_ids=[-1])
    for bad in ([1.5, 2.0], [1, True], [np.float32(3.0)], ["5"]):  # no silent truncation or casting
        with pytest.raises(ValueError, match="integer token ids, got"):
            gen.generate(input_ids=bad)
    assert gen.generate(input_ids=np.array([1, 5, 9], dtype=np.int32), max_new_tokens=2).token_ids  # NumPy ints
    with pytest.raises(CacheOverflowError, match="max_new_tokens"):
        gen.generate(input_ids=[1] * 200, max_new_tokens=100)
    with pytest.raises(ValueError, match="drafter"):
        SpeculativeGenerator.load(llama_bundle, drafter="oracle")
    with pytest.raises(BundleError, match="does not exist"):
        SpeculativeGenerator.load("/nonexistent/bundle")


def test_settings_left_out_everywhere_are_transformers_defaults(llama_bundle):
    """No call setting and no generation config: transformers' GenerationConfig defaults, top-k 50 included."""
    from ortspec.config import SAMPLING_FALLBACK
    transformers = pytest.importorskip("transformers")
    hf = transformers.GenerationConfig()
    assert SAMPLING_FALLBACK == {k: getattr(hf, k) for k in SAMPLING_FALLBACK}
    gen = SpeculativeGenerator.load(llama_bundle)
    assert not gen.bundle.sampling_defaults
    assert gen.sampling_settings(do_sample=True) == dict(do_sample=True, temperature=1.0, top_k=50, top_p=1.0,
                                                         repetition_penalty=1.0)
    runs = {k: [gen.generate(input_ids=PROMPTS[0], max_new_tokens=12, seed=s, do_sample=True, top_k=k,
                             eos_token_id=[]).token_ids for s in range(6)] for k in (None, 50, 0)}
    assert runs[None] == runs[50]   # left out: 50, not off
    assert runs[None] != runs[0]    # and top_k=0 turns it off (a 128-token vocabulary: 50 truncates)


def test_generation_config_supplies_the_sampling_defaults(tmp_path, llama_bundle):
    import json
    import shutil
    b = tmp_path / "b"
    shutil.copytree(llama_bundle, b)
    config = json.loads((b / "generation_config.json").read_text())
    config.update(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05)
    (b / "generation_config.json").write_text(json.dumps(config))
    gen = SpeculativeGenerator.load(b)
    assert gen.sampling_settings() == dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.8,
                                           repetition_penalty=1.05)
    assert gen.sampling_settings(do_sample=False, top_k=5)["do_sample"] is False  # an explicit value wins
    sampled = gen.generate(input_ids=PROMPTS[0], max_new_tokens=20, seed=1).token_ids
    explicit = gen.generate(input_ids=PROMPTS[0], max_new_tokens=20, seed=1, do_sample=True, temperature=0.7,
                            top_k=20, top_p=0.8, repetition_penalty=1.05).token_ids
    assert sampled == explicit
    greedy = SpeculativeGenerator.load(llama_bundle).generate(input_ids=PROMPTS[0], max_new_tokens=20,
                                                               repetition_penalty=1.05).token_ids
    assert gen.generate(input_ids=PROMPTS[0], max_new_tokens=20, do_sample=False).token_ids == greedy


def test_device_trim_path_gives_the_same_output(pair_bundle, baselines):
    """The Slice-graph trim (the CUDA path) run on the CPU provider: same tokens, strict invariants hold."""
    gen = SpeculativeGenerator.load(pair_bundle)
    b = gen.bundle
    if b.target.kv_cache == "static":
        pytest.skip("static caches are never trimmed")
    gen.target = CausalLM(b.target, str(b.file(b.target.path)), trim="graph")
    gen.drafter.lm = CausalLM(b.draft, str(b.file(b.draft.path)), trim="graph")
    assert gen.target.cache.trimmer is not None
    for p in PROMPTS:
        res = gen.generate(input_ids=p, max_new_tokens=40, num_draft_tokens=3, strict=True)
        assert res.token_ids == baselines[tuple(p)]
    sampled = dict(input_ids=PROMPTS[0], max_new_tokens=40, do_sample=True, seed=9, num_draft_tokens=4)
    host = SpeculativeGenerator.load(pair_bundle)
    assert gen.generate(**sampled, strict=True).token_ids == host.generate(**sampled).token_ids


def test_greedy_check_stays_greedy_when_the_bundle_samples_by_default(tmp_path, llama_bundle):
    """verify's greedy check must not inherit a bundle's do_sample=True (it would compare random samples)."""
    import json
    import shutil
    from ortspec.exactness import greedy_check
    b = tmp_path / "b"
    shutil.copytree(llama_bundle, b)
    config = json.loads((b / "generation_config.json").read_text())
    (b / "generation_config.json").write_text(json.dumps(dict(config, do_sample=True, temperature=1.5)))
    report = greedy_check(str(b), PROMPTS, gammas=[2, "auto"], drafters=("model", "prompt_lookup"),
                          max_new_tokens=30)
    assert report.runs == 12 and report.mismatches == 0, report.to_dict()
