"""Bad input, faults and fuzzing: every failure is a named error, and state survives it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ortspec import SpeculativeGenerator
from ortspec.bundle import load_bundle
from ortspec.errors import BundleError, CacheOverflowError, IncompatibleModelsError, OrtspecError

PROMPT = [1, 17, 5, 99, 42]
FUZZ = settings(max_examples=int(os.environ.get("ORTSPEC_FUZZ_EXAMPLES", 60)), deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def gen(llama_bundle):
    return SpeculativeGenerator.load(llama_bundle)


@pytest.fixture(scope="module")
def reference(llama_bundle):
    fresh = SpeculativeGenerator.load(llama_bundle, drafter="none")
    return fresh.generate(input_ids=PROMPT, max_new_tokens=30).token_ids


def copy_bundle(src, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(src, dst)
    return dst


def edit_manifest(bundle, change):
    m = json.loads((bundle / "ortspec.json").read_text())
    change(m)
    (bundle / "ortspec.json").write_text(json.dumps(m))


# -- malformed bundles ----------------------------------------------------------
@pytest.mark.parametrize("path,match", [("../outside/model.onnx", "escapes"), ("/etc/passwd", "relative"),
                                        ("target\\\\model.onnx", "relative")])
def test_manifest_paths_cannot_leave_the_bundle(tmp_path, llama_bundle, path, match):
    b = copy_bundle(llama_bundle, tmp_path)
    edit_manifest(b, lambda m: m["models"]["target"].__setitem__("path", path))
    with pytest.raises(BundleError, match=match):
        load_bundle(b)


def test_symlink_pointing_outside_is_refused(tmp_path, llama_bundle):
    b = copy_bundle(llama_bundle, tmp_path)
    outside = tmp_path / "elsewhere.onnx"
    shutil.move(b / "target" / "model.onnx", outside)
    os.symlink(outside, b / "target" / "model.onnx")
    with pytest.raises(BundleError, match="outside the bundle"):
        load_bundle(b)


@pytest.mark.parametrize("version", [0, "1", None, True])
def test_unknown_format_version(tmp_path, llama_bundle, version):
    b = copy_bundle(llama_bundle, tmp_path)
    edit_manifest(b, lambda m: m.__setitem__("format_version", version))
    with pytest.raises(BundleError, match="format version"):
        load_bundle(b)


def test_a_bundle_from_a_newer_release_says_to_upgrade_ortspec(tmp_path, llama_bundle):
    b = copy_bundle(llama_bundle, tmp_path)
    edit_manifest(b, lambda m: m.update(format_version=3, ortspec_version="9.0.0"))
    with pytest.raises(BundleError, match=r"written by ortspec 9\.0\.0.*upgrade ortspec"):
        load_bundle(b)


def test_format_versions_this_release_reads(tmp_path, llama_bundle):
    from ortspec import __version__
    manifest = json.loads((llama_bundle / "ortspec.json").read_text())
    assert manifest["format_version"] == 2 and manifest["ortspec_version"] == __version__
    b = copy_bundle(llama_bundle, tmp_path)
    edit_manifest(b, lambda m: m.__setitem__("format_version", 1))  # an earlier release's bundle still loads
    assert load_bundle(b).target.top_logits


def test_manifest_that_is_not_json(tmp_path, llama_bundle):
    b = copy_bundle(llama_bundle, tmp_path)
    (b / "ortspec.json").write_text("{ not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(b)


def mutate(manifest: dict, path: list, value) -> None:
    node = manifest
    for key in path[:-1]:
        node = node[key]
    if value == "__delete__":
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


PATHS = [["format"], ["models"], ["models", "target"], ["models", "draft"], ["models", "target", "num_layers"],
         ["models", "target", "kv_inputs"], ["models", "draft", "kv_outputs"], ["models", "target", "sha256"],
         ["models", "target", "vocab_size"], ["models", "draft", "special_ids"], ["models", "target", "dtype"],
         ["models", "target", "kv_cache"], ["models", "target", "seqlens_k"], ["models", "target", "data"],
         ["tokenizer"], ["tokenizer", "file"], ["models", "draft", "tokenizer"], ["models", "target", "size_bytes"]]
VALUES = st.one_of(st.just("__delete__"), st.none(), st.integers(-5, 10 ** 6), st.text(max_size=12),
                   st.lists(st.integers(-1, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), VALUES), min_size=1, max_size=3))
def test_fuzzed_manifests_load_or_raise_named_errors(tmp_path_factory, llama_bundle, edits):
    b = tmp_path_factory.mktemp("fz") / "b"
    shutil.copytree(llama_bundle, b)
    m = json.loads((b / "ortspec.json").read_text())
    for path, value in edits:
        try:
            mutate(m, path, value)
        except (KeyError, TypeError, AttributeError):
            pass  # the path no longer exists after an earlier edit
    (b / "ortspec.json").write_text(json.dumps(m))
    try:
        SpeculativeGenerator.load(b, verify="size")
    except (BundleError, IncompatibleModelsError):
        pass


@FUZZ
@given(offset=st.integers(0, 10 ** 9), flips=st.integers(1, 8), victim=st.sampled_from(
    ["target/model.onnx", "target/model.onnx.data", "draft/model.onnx", "draft/model.onnx.data", "tokenizer.json"]))
def test_fuzzed_file_corruption_is_caught(tmp_path_factory, llama_bundle, offset, flips, victim):
    b = tmp_path_factory.mktemp("fc") / "b"
    shutil.copytree(llama_bundle, b)
    data = bytearray((b / victim).read_bytes())
    for k in range(flips):
        data[(offset + 7919 * k) % len(data)] ^= 0x5A
    (b / victim).write_bytes(bytes(data))
    try:
        g = SpeculativeGenerator.load(b)
    except (BundleError, IncompatibleModelsError):
        return
    assert victim == "tokenizer.json"  # the only file without a checksum: it must still behave
    try:
        g.generate(input_ids=PROMPT, max_new_tokens=4)
    except OrtspecError:
        pass


# -- generate arguments ----------------------------------------------------------
# Subnormal floats stay out: onnxruntime flushes denormals to zero (session.set_denormal_as_zero), which can leave
# the calling thread unable to represent them, and hypothesis then refuses to draw them.
ARGS = st.fixed_dictionaries({}, optional={
    "max_new_tokens": st.one_of(st.integers(-2, 40), st.floats(allow_nan=True, allow_subnormal=False), st.just("8")),
    "do_sample": st.one_of(st.booleans(), st.just(1)),
    "temperature": st.one_of(st.floats(-1, 3, allow_subnormal=False), st.just(float("nan")), st.integers(-1, 3), st.just("hot")),
    "top_k": st.one_of(st.integers(-3, 200), st.floats(0, 5, allow_subnormal=False)),
    "top_p": st.one_of(st.floats(-0.5, 1.5, allow_subnormal=False), st.just(float("inf")), st.just(float("nan"))),
    "repetition_penalty": st.one_of(st.floats(-1, 3, allow_subnormal=False), st.just(float("nan"))),
    "seed": st.one_of(st.none(), st.integers(-3, 2 ** 40), st.just(True)),
    "num_draft_tokens": st.one_of(st.integers(-2, 20), st.just("auto"), st.just("x"), st.none()),
    "eos_token_id": st.one_of(st.none(), st.integers(-1, 200), st.lists(st.integers(-1, 130), max_size=3)),
    "bad_words_ids": st.lists(st.lists(st.integers(-1, 130), max_size=2), max_size=2),
    "input_ids": st.one_of(st.lists(st.integers(-2, 130), max_size=6), st.just("1 2 3")),
})


@FUZZ
@given(kwargs=ARGS)
def test_fuzzed_generate_arguments_work_or_raise_value_errors(gen, reference, kwargs):
    kwargs.setdefault("input_ids", PROMPT)
    try:
        res = gen.generate(**kwargs)
        assert len(res.token_ids) <= kwargs.get("max_new_tokens", 64)
    except (ValueError, CacheOverflowError):
        pass
    assert gen.generate(input_ids=PROMPT, max_new_tokens=30).token_ids == reference  # state intact


# -- context limits, interrupts ---------------------------------------------------
def test_rounds_near_the_end_of_the_context_shrink_gamma(gen):
    cap = gen.target.capacity  # 256 for the tiny models
    prompt = [3 + (i % 100) for i in range(cap - 10)]
    res = gen.generate(input_ids=prompt, max_new_tokens=11, num_draft_tokens=8, strict=True, eos_token_id=[])
    assert len(res.token_ids) == 11
    with pytest.raises(CacheOverflowError, match="shorten the prompt"):
        gen.generate(input_ids=prompt, max_new_tokens=12)


def test_keyboard_interrupt_mid_generation_leaves_generator_usable(llama_bundle, reference):
    g = SpeculativeGenerator.load(llama_bundle)
    real, calls = g.target._pass, {"n": 0}

    def interrupted(*a):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a)
    g.target._pass = interrupted
    with pytest.raises(KeyboardInterrupt):
        for _ in g.stream(input_ids=PROMPT, max_new_tokens=30, do_sample=True, seed=1):
            pass
    g.target._pass = real
    assert g.generate(input_ids=PROMPT, max_new_tokens=30, strict=True).token_ids == reference


# -- CLI error reporting -------------------------------------------------------------
def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "ortspec.cli", *map(str, args)], capture_output=True, text=True)


def test_cli_runtime_error_is_one_line_exit_1(tmp_path):
    proc = run_cli("inspect", tmp_path / "missing")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_cli_bad_argument_exit_2_and_debug_shows_traceback(llama_bundle):
    proc = run_cli("generate", llama_bundle, "--input-ids", "1,2", "--temperature", "-1", "--sample")
    assert proc.returncode == 2 and "temperature" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("--debug", "generate", llama_bundle, "--input-ids", "1,2", "--temperature", "-1", "--sample")
    assert "Traceback" in proc.stderr
    proc = run_cli("generate", llama_bundle, "--input-ids", "1,x")
    assert proc.returncode == 2 and "comma-separated" in proc.stderr
    proc = run_cli("generate", llama_bundle)
    assert proc.returncode == 2 and "exactly one" in proc.stderr


def test_cli_help_for_every_command():
    for cmd in ("export", "generate", "bench", "verify", "inspect"):
        proc = run_cli(cmd, "--help")
        assert proc.returncode == 0 and "usage: ortspec " + cmd in proc.stdout


def test_cli_debug_shows_the_cause_of_a_reraised_error(tmp_path, llama_bundle):
    """A bundle whose tokenizer cannot be read: one line without --debug, the tokenizer library's own error (the
    cause the one-line message leaves out) with it."""
    b = copy_bundle(llama_bundle, tmp_path)
    (b / "tokenizer.json").write_text("{not json")
    proc = run_cli("generate", b, "--prompt", "w1 w2")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "re-export" in proc.stderr, proc.stderr
    proc = run_cli("--debug", "generate", b, "--prompt", "w1 w2")
    assert "During handling of the above exception" in proc.stderr and "Exception: " in proc.stderr, proc.stderr


def test_export_refuses_a_generation_config_it_cannot_read(tmp_path, hf_models):
    """A malformed generation_config.json would change a bundle's EOS ids and sampling defaults silently."""
    from ortspec.errors import ExportError
    from ortspec.export import export_bundle
    src = tmp_path / "src"
    shutil.copytree(hf_models["no_tok"], src)
    (src / "generation_config.json").write_text('{"eos_token_id": [2, ')
    with pytest.raises(ExportError, match="generation_config.json cannot be read"):
        export_bundle(target=str(src), out=tmp_path / "b", progress=None)
    assert not (tmp_path / "b").exists()
