"""A request's life on a generator: one at a time (a re-entered generator says so at once), a drafter that fails
costs that request its drafts and says why where users look, the next request drafts again, and no setting of one
request leaks into the next."""
from __future__ import annotations

import gc
import threading
import time
import warnings

import pytest

import ortspec
from ortspec import SpeculativeGenerator
from ortspec.errors import DraftBugWarning, DraftFailedWarning, GeneratorBusyError, ModelRunError

PROMPT = [1, 17, 5, 99, 42]
SAMPLED = dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, seed=3)
# settings a request may carry, each different from the one before it in the list
SETTINGS = [dict(), dict(SAMPLED), dict(SAMPLED, top_k=0), dict(bitwise=False), dict(SAMPLED, bitwise=False),
            dict(repetition_penalty=1.3), dict(SAMPLED, top_k=3, seed=9), dict(num_draft_tokens=1),
            dict(SAMPLED, num_draft_tokens="auto"), dict()]


@pytest.fixture(scope="module")
def gen(llama_bundle):
    return SpeculativeGenerator.load(llama_bundle)


# -- one generation at a time ------------------------------------------------------------------------------------
def test_a_generator_reentered_while_its_stream_is_open_says_so_at_once(gen):
    stream = gen.stream(input_ids=PROMPT, max_new_tokens=20)
    next(stream)
    t0 = time.monotonic()
    with pytest.raises(GeneratorBusyError, match="still open: finish or close"):
        gen.generate(input_ids=PROMPT, max_new_tokens=4)
    with pytest.raises(GeneratorBusyError):  # a sibling shares the target: busy too
        gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=4)
    assert time.monotonic() - t0 < 60  # (a hang would never get here)
    stream.close()
    assert gen.generate(input_ids=PROMPT, max_new_tokens=4).token_ids


def test_a_dropped_stream_releases_the_generator(gen):
    stream = gen.stream(input_ids=PROMPT, max_new_tokens=20)
    next(stream)
    del stream  # a notebook cell that left it unfinished, then lost it
    gc.collect()
    assert gen.generate(input_ids=PROMPT, max_new_tokens=4).token_ids


def test_another_thread_waits_for_an_open_stream_or_gives_up_after_its_timeout(gen, llama_bundle):
    reference = SpeculativeGenerator.load(llama_bundle).generate(input_ids=PROMPT, max_new_tokens=6).token_ids
    stream = gen.stream(input_ids=PROMPT, max_new_tokens=20)
    next(stream)
    got = {}

    def other(name, **kw):
        try:
            got[name] = gen.generate(input_ids=PROMPT, max_new_tokens=6, **kw).token_ids
        except GeneratorBusyError as exc:
            got[name] = exc

    impatient = threading.Thread(target=other, args=("impatient",), kwargs={"wait_timeout": 0.2})
    impatient.start()
    impatient.join(30)
    assert isinstance(got["impatient"], GeneratorBusyError) and "stayed busy" in str(got["impatient"])
    patient = threading.Thread(target=other, args=("patient",))
    patient.start()
    patient.join(0.5)
    assert patient.is_alive()  # waiting, as documented
    list(stream)  # the stream ends: the waiting call runs
    patient.join(60)
    assert got["patient"] == reference
    with pytest.raises(ValueError, match="wait_timeout"):
        gen.stream(input_ids=PROMPT, wait_timeout=-1)


# -- the drafter failure policy ----------------------------------------------------------------------------------
def _break(drafter, error):
    original = drafter.lm.forward_rows

    def broken(ids, keep=None, options=None):
        raise error
    drafter.lm.forward_rows = broken  # (a decoding round's passes)
    return lambda: setattr(drafter.lm, "forward_rows", original)


def test_a_draft_failure_costs_one_request_says_why_and_the_next_request_drafts_again(llama_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    reference = gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=30).token_ids
    mend = _break(gen.drafter, ModelRunError("simulated draft failure"))
    with pytest.warns(DraftFailedWarning, match="simulated draft failure"):
        failed = gen.generate(input_ids=PROMPT, max_new_tokens=30)
    assert failed.token_ids == reference
    assert failed.stats.draft_disabled and "ModelRunError: simulated draft failure" in failed.stats.draft_error
    assert failed.to_dict()["stats"]["draft_error"] == failed.stats.draft_error
    mend()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DraftFailedWarning)
        again = gen.generate(input_ids=PROMPT, max_new_tokens=30)
    assert again.token_ids == reference and again.stats.drafted > 0
    assert not again.stats.draft_disabled and again.stats.draft_error is None


def test_a_programming_error_in_a_drafter_is_a_bug_warning_that_tests_turn_into_an_error(llama_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    reference = gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=20).token_ids
    _break(gen.drafter, IndexError("index 7 is out of bounds"))
    with pytest.warns(DraftBugWarning, match="IndexError"):
        res = gen.generate(input_ids=PROMPT, max_new_tokens=20)
    assert res.token_ids == reference and res.stats.draft_disabled
    with warnings.catch_warnings():
        warnings.simplefilter("error", DraftBugWarning)  # what the suite's configuration does
        with pytest.raises(DraftBugWarning) as raised:
            gen.generate(input_ids=PROMPT, max_new_tokens=20)
    assert isinstance(raised.value.__context__, IndexError)
    assert gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=20).token_ids == reference


def test_the_suite_turns_drafter_bugs_into_errors():
    from pathlib import Path
    import tomllib
    config = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert "error::ortspec.errors.DraftBugWarning" in config["tool"]["pytest"]["ini_options"]["filterwarnings"]


def test_the_cli_summary_names_a_draft_failure(llama_bundle):
    import subprocess
    import sys
    # (in a child process: the commands run onnxruntime on its process-wide thread pool)
    code = ("import ortspec.drafting as d, ortspec.errors as e\n"
            "def broken(self, *a, **k): raise e.ModelRunError('simulated draft failure')\n"
            "d.ModelDrafter.propose = broken\n"
            "from ortspec.cli import main; raise SystemExit(main())")
    got = subprocess.run([sys.executable, "-c", code, "generate", str(llama_bundle), "--input-ids", "1,17,5",
                          "--max-new-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    assert "draft disabled: model drafter failed (ModelRunError: simulated draft failure)" in got.stderr, got.stderr


def test_bench_reports_a_draft_failure(llama_bundle, monkeypatch):
    from ortspec.bench import format_table, run_bench
    from ortspec.drafting import ModelDrafter

    def broken(self, *a, **k):
        raise ModelRunError("simulated draft failure")
    monkeypatch.setattr(ModelDrafter, "propose", broken)
    with pytest.warns(DraftFailedWarning):
        report = run_bench(str(llama_bundle), [{"id": "a", "prompt": "w1 w2 w3 w4"}], [2], max_new_tokens=12)
    row = report["settings"][0]
    assert row["draft_failures"] == 1 and "simulated draft failure" in row["draft_error"]
    assert "DRAFT DISABLED in 1 run(s)" in format_table(report)


def test_a_draft_that_failed_to_load_is_reported_by_every_request(tmp_path, llama_bundle):
    import shutil
    b = tmp_path / "b"
    shutil.copytree(llama_bundle, b)
    graph = b / "draft" / "model.onnx"
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    with pytest.warns(DraftFailedWarning, match="failed to load"):
        gen = SpeculativeGenerator.load(b, verify="none")
    for _ in range(2):
        stats = gen.generate(input_ids=PROMPT, max_new_tokens=5).stats
        assert stats.draft_disabled and "failed to load" in stats.draft_error


# -- per-request state -------------------------------------------------------------------------------------------
def run_alternating(bundle, settings, prompt=PROMPT, max_new_tokens=24, **load):
    """All the settings in turn, twice, on one generator and its siblings (sharing its target and buffers): each
    request gives the ids a fresh generator with the same drafter gives it. (Greedy ids are the target's whatever
    drafts; seeded sampled ids follow the drafts proposed, which hybrid and n-gram drafters and the draft length
    "auto" choose by priors and timed costs: those are compared greedy only.)"""
    shared = SpeculativeGenerator.load(bundle, **load)
    family = [shared, shared.sibling("hybrid"), shared.sibling("none"), shared.sibling("prompt_lookup")]
    fresh = {}
    for rnd in range(2):
        for i, s in enumerate(settings):
            g = family[(i + rnd) % len(family)]
            got = g.generate(input_ids=prompt, max_new_tokens=max_new_tokens, **s).token_ids
            if s.get("do_sample") and (g.drafter.name in ("hybrid", "prompt_lookup")
                                       or s.get("num_draft_tokens") == "auto" and g.drafter.name != "none"):
                continue
            if (g.drafter.name, i) not in fresh:
                alone = SpeculativeGenerator.load(bundle, drafter=g.drafter.name, **load)
                fresh[g.drafter.name, i] = alone.generate(input_ids=prompt, max_new_tokens=max_new_tokens,
                                                          **s).token_ids
            assert got == fresh[g.drafter.name, i], (rnd, i, s, g.drafter.name)


@pytest.mark.parametrize("logits", ["host", "device"])
def test_alternating_settings_on_one_generator_and_its_siblings_give_fresh_generators_ids(llama_bundle, logits):
    run_alternating(llama_bundle, SETTINGS, logits=logits)


def test_the_lazy_rows_sentinel_is_no_token_id():
    from ortspec.sampling.lazy import LazyRow
    assert not isinstance(LazyRow.NEVER, int)  # compared by identity: no value a computation returns is it


# -- a bundle without a draft model ------------------------------------------------------------------------------
def test_a_bundle_without_a_draft_decodes_by_default(ids_bundle):
    gen = SpeculativeGenerator.load(ids_bundle)
    assert gen.drafter.name == "prompt_lookup" and gen.default_num_draft_tokens == "auto"
    ids = [1, 5, 9, 5, 9, 5, 9, 5]
    want = SpeculativeGenerator.load(ids_bundle, drafter="none").generate(input_ids=ids, max_new_tokens=20)
    assert gen.generate(input_ids=ids, max_new_tokens=20).token_ids == want.token_ids
    from ortspec.scheduler import Engine
    assert Engine(gen, "ids").drafters[0] == "prompt_lookup"


def test_the_cli_runs_a_bundle_without_a_draft_and_its_errors_name_its_flags(ids_bundle):
    import subprocess
    import sys
    cli = [sys.executable, "-m", "ortspec.cli", "generate", str(ids_bundle), "--input-ids", "1,5,9,5,9"]
    got = subprocess.run(cli + ["--max-new-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0 and len(got.stdout.split()) == 8, got.stderr
    assert "drafter prompt_lookup" in got.stderr
    bad = subprocess.run(cli + ["--drafter", "model"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "--drafter prompt-lookup or --drafter none" in bad.stderr, bad.stderr
    bad = subprocess.run(cli + ["--max-new-tokens", "0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--max-new-tokens must be" in bad.stderr, bad.stderr
