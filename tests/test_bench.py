"""`ortspec bench` end to end on a tiny pair: a valid JSON report, a PNG, a stored calibration profile."""
from __future__ import annotations

import json
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

from ortspec.config import SAMPLING_FALLBACK
from ortspec.control.costmodel import expected_tokens


def _bench(bundle: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in (
        {"id": "a", "kind": "chat", "prompt": "w1 w2 w3 w4"},
        {"id": "b", "kind": "edit", "prompt": "w5 w6 w5 w6 w5 w6"},
        {"id": "c", "kind": "edit", "prompt": "w9 w8 w7"})) + "\n")
    return subprocess.run([sys.executable, "-m", "ortspec.cli", "bench", str(bundle), "--prompts", str(prompts),
                           "--max-new-tokens", "12", *extra], capture_output=True, text=True)


def test_bench_report_plot_and_profile(pair_bundle, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(pair_bundle, bundle)
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = _bench(bundle, tmp_path, "--num-draft-tokens", "1,3,auto", "--out", str(out), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "runs, ETA" in proc.stderr  # progress while it runs
    for label in ("target bitwise", "target 1-pos", "model g=1", "model g=3", "model g=auto", "ideal", "eff", "decode",
                  "ttft ms"):
        assert label in proc.stdout
    report = json.loads(out.read_text())
    assert report["baseline"]["tokens_per_s"] > 0
    # both target-only baselines are measured; the faster one is the reference of every speedup
    kinds = report["baselines"]
    assert set(kinds) == {"bitwise", "one-position"}
    assert report["baseline"]["tokens_per_s"] == max(b["tokens_per_s"] for b in kinds.values())
    assert report["baseline"]["kind"] in kinds
    settings = {s["num_draft_tokens"]: s for s in report["settings"]}
    assert set(settings) == {1, 3, "auto"}
    for gamma, s in settings.items():
        assert s["tokens_per_s"] > 0 and s["speedup"] > 0 and s["ideal_speedup"] > 0 and s["decode_speedup"] > 0
        assert s["decode_speedup_total"] > 0  # (decode tokens/s over all prompts against the baseline's)
        assert abs(s["efficiency"] - s["decode_speedup_total"] / s["ideal_speedup"]) < 1e-9
        # the ideal comes from this run's timings: the baseline's target time per token, the setting's passes
        timed = s["timed_costs_s"]
        assert timed is not None and timed["target_per_token"] > 0 and timed["draft_step"] > 0
        passes = {int(k): v for k, v in timed["passes"].items()}
        if gamma != "auto":
            want = expected_tokens(s["per_position_acceptance"], gamma) * timed["target_per_token"] / (
                gamma * timed["draft_step"] + passes[gamma + 1])
            assert abs(s["ideal_speedup"] - want) < 1e-9
        assert 0 <= s["acceptance_rate"] <= 1 and s["mean_tokens_per_round"] >= 1
        if gamma != "auto":
            assert len(s["per_position_acceptance"]) == gamma
        assert abs(sum(s["time_split"].values()) - 1) < 1e-6
        assert s["latency"]["p50_ms"] <= s["latency"]["p95_ms"] <= s["latency"]["p99_ms"]
        assert [p["prompt"] for p in s["per_prompt"]] == ["a", "b", "c"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (bundle / "ortspec-profile.json").is_file()  # calibration stored next to the bundle


def test_bench_kind_filter(pair_bundle, tmp_path):
    out = tmp_path / "r.json"
    proc = _bench(pair_bundle, tmp_path, "--num-draft-tokens", "2", "--drafter", "prompt-lookup",
                  "--kind", "edit", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert [p["prompt"] for p in json.loads(out.read_text())["settings"][0]["per_prompt"]] == ["b", "c"]
    proc = _bench(pair_bundle, tmp_path, "--kind", "poetry")
    assert proc.returncode == 2 and "kinds there: chat, edit" in proc.stderr
    proc = _bench(pair_bundle, tmp_path, "--num-draft-tokens", "2", "--drafter", "hybrid", "--id", "c", "--id", "a",
                  "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert [p["prompt"] for p in json.loads(out.read_text())["settings"][0]["per_prompt"]] == ["a", "c"]
    proc = _bench(pair_bundle, tmp_path, "--id", "zz")
    assert proc.returncode == 2 and "has id zz" in proc.stderr


def test_llama_cpp_logs_are_parsed():
    """compare_peers reads llama.cpp's own counters: the speculative tool's decode line, llama-cli's rate line."""
    import importlib.util
    where = Path(__file__).parents[1] / "tools" / "compare_peers.py"
    spec = importlib.util.spec_from_file_location("compare_peers", where)
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    log = "0.09.316 I encoded   10 tokens in    0.272 seconds\n0.09.316 I decoded   33 tokens in    4.226 seconds, speed"
    assert peers.parse_llama_cpp(log, 96) == (33, 4.226)
    tokens, seconds = peers.parse_llama_cpp("[ Prompt: 58.6 t/s | Generation: 12.1 t/s ]", 32)
    assert tokens == 32 and abs(tokens / seconds - 12.1) < 1e-9
    assert peers.parse_llama_cpp("error: invalid argument", 32) is None
    ik = ("llama_print_timings: prompt eval time =     212.89 ms /    29 tokens (    7.34 ms per token)\n"
          "llama_print_timings:        eval time =    1814.83 ms /    47 runs   (   38.61 ms per token)")
    assert peers.parse_ik_llama_cpp(ik) == (47, 1.81483)  # ik_llama.cpp's old main: its decode line, not the prompt's
    assert peers.parse_ik_llama_cpp(ik.splitlines()[0]) is None


def test_openvino_peer_speaks_one_line_each_way(tmp_path):
    """compare_peers drives OpenVINO GenAI through tools/openvino_peer.py under another interpreter: a ready line
    with the modes it loaded, then one JSON answer per request (decode-only: the tokens after the first)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("compare_peers", Path(__file__).parents[1] / "tools" / "compare_peers.py")
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    fake = tmp_path / "peer.py"  # stands in for openvino_peer.py: answers as it does
    fake.write_text("import json, sys\n"
                    "print(json.dumps({'ready': ['lookup', 'target']}), flush=True)\n"
                    "for line in sys.stdin:\n"
                    "    r = json.loads(line)\n"
                    "    print(json.dumps({'tokens': r['max_new_tokens'], 'decode_s': 0.5, 'text': r['mode'] + ':' + r['prompt']}), flush=True)\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {fake}\n")
    python.chmod(0o755)
    peer = peers.OpenVinoPeer(str(python), "t.gguf", None, 2)
    assert peer.modes == ["lookup", "target"]
    assert peer.run("target", "hi", 9, 4) == (8, 0.5, "target:hi")
    assert peer.run("lookup", "yo", 3, 4, {"temperature": 0.7}) == (2, 0.5, "lookup:yo")
    peer.close()
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 3\n")
    silent.chmod(0o755)
    with pytest.raises(RuntimeError, match="did not start"):
        peers.OpenVinoPeer(str(silent), "t.gguf", None, 2)


def test_bench_hybrid_reports_no_cost_model_ideal(pair_bundle, tmp_path):
    """Hybrid rounds mix free lookups and model drafts, which the cost model does not describe: no ideal."""
    out = tmp_path / "r.json"
    proc = _bench(pair_bundle, tmp_path, "--num-draft-tokens", "2", "--drafter", "hybrid", "--id", "b",
                  "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())["settings"][0]
    assert row["ideal_speedup"] is None and row["efficiency"] is None and row["speedup"] > 0
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("hybrid g=2"))
    assert line.split()[5:7] == ["-", "-"]  # name (2 words), tok/s, speedup, decode, then ideal and eff


def test_micro_bench_reports_each_setting_warm_and_cold(tmp_path):
    """`ortspec bench - --micro`: one row per setting x rows x case, the setting's math really run (greedy and
    sampled), with --cold the caches evicted between the round's pieces (and said so); bad input is refused."""
    from ortspec.microbench import MICRO_SETTINGS, format_micro, micro_bench
    settings = {k: MICRO_SETTINGS[k] for k in ("greedy", "top-p 0.9", "qwen (T0.7 p0.8 k20 rep1.05)")}
    import ortspec.microbench as bench
    reads = []
    top = bench._GraphRow.top
    bench._GraphRow.top = lambda self, k: reads.append(k) or top(self, k)
    try:
        for cold, read in ((0, "top"), (8, "top"), (0, "whole")):
            reads.clear()
            rows = micro_bench(vocab=3000, gamma=2, repeats=2, settings=settings, cold_mb=cold, rows=read)
            assert [(r["setting"], r["rows"], r["case"]) for r in rows] == [
                (s, k, c) for s in settings for k in ("peaked", "flat") for c in ("all accepted", "first rejected")]
            assert all(r["cold_mb"] == cold and r["read"] == read and r["ms_per_round"] > 0
                       and r["p90_ms"] >= r["ms_per_round"] for r in rows)
            assert ("8 MB streamed through the caches" in format_micro(rows)) is bool(cold)
            assert ("graph's top entries" in format_micro(rows)) is (read == "top")
            assert bool(reads) is (read == "top")  # top mode: the rules read the entries the graph found
    finally:
        bench._GraphRow.top = top
    with pytest.raises(ValueError, match="rows must be one of"):
        micro_bench(vocab=300, gamma=1, repeats=1, settings=settings, rows="some")
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "bench", "-", "--micro", "--vocab", "500",
                           "--gamma", "1", "--rounds", "1", "--cold", "16", "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "16 MB streamed" in proc.stdout and len(json.loads(out.read_text())) == 4 * len(MICRO_SETTINGS)
    bad = subprocess.run([sys.executable, "-m", "ortspec.cli", "bench", "-", "--micro", "--vocab", "500",
                          "--rounds", "0"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--rounds must be >= 1" in bad.stderr
    default = subprocess.run([sys.executable, "-m", "ortspec.cli", "bench", "-", "--micro", "--vocab", "300", "--gamma",
                              "1", "--rounds", "1", "--cold", "--json"], capture_output=True, text=True)
    assert default.returncode == 0 and json.loads(default.stdout)[0]["cold_mb"] == 256, default.stderr


def test_host_share_tool_reports_every_setting_both_ways(pair_bundle, ids_bundle):
    """tools/host_share.py decodes each setting target-only and speculating and prints both host shares and the
    speedup; a bundle without a draft, and bad counts, are refused."""
    tool = Path(__file__).resolve().parents[1] / "tools" / "host_share.py"
    proc = subprocess.run([sys.executable, str(tool), str(pair_bundle), "--limit", "2", "--max-new-tokens", "6"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    sys.path.insert(0, str(tool.parent))
    try:
        from host_share import SETTINGS
    finally:
        sys.path.pop(0)
    rows = [line for line in proc.stdout.splitlines() if line.count("%") == 2]
    assert [r.split("  ")[0].strip() for r in rows] == list(SETTINGS), proc.stdout
    # every knob set: a bundle's generation config (which the API falls back to) cannot change a row's meaning
    # (greedy says so; every other setting samples)
    assert all(set(s) - {"do_sample"} == set(SAMPLING_FALLBACK) - {"do_sample"} for s in SETTINGS.values())
    assert [name for name, s in SETTINGS.items() if s.get("do_sample", True) is False] == ["greedy"]
    for r in rows:
        *_, first, second, per_round, speedup = r.replace("%", " ").split()
        assert all(0 < float(x) < 100 for x in (first, second)) and float(per_round) > 0, r
        assert speedup.endswith("x") and float(speedup[:-1]) > 0, r
    for args, message in (([str(ids_bundle)], "has no draft model"), ([str(pair_bundle), "--limit", "0"], ">= 1"),
                          ([str(pair_bundle), "--repeat", "0"], ">= 1"),
                          ([str(pair_bundle), "--only", "nothing"], "matches none of the settings"),
                          ([str(pair_bundle), "--against", str(tool.parent)], "not a runtime package directory")):
        bad = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


@pytest.mark.parametrize("first", [[], ["--this-first"]])
def test_host_share_tool_compares_two_releases_in_one_process(pair_bundle, first):
    """--against loads another release's runtime package beside this one and runs both on every prompt: here this
    release against itself, so every run gives the same tokens (whichever is loaded first); --only picks settings
    by name."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "tools" / "host_share.py"), str(pair_bundle), "--limit", "1",
                           "--max-new-tokens", "6", "--repeat", "2", "--only", "no top-k",
                           "--against", str(root / "runtime"), *first], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.count("->") == 4]  # shares, ms, speedup: other -> this
    assert [r.split("  ")[0].strip() for r in rows] == ["temperature 0.7, no top-k", "temperature 1.0, no top-k",
                                                        "top-p 0.9, no top-k", "repetition penalty 1.1, no top-k"], \
        proc.stdout
    for r in rows:
        assert r.split()[-1] == "4/4" and r.count("%") == 2, r  # 2 passes x (target-only, speculating)
        # the speedups "a -> bx", then tokens per second this/other "c / d" (target-only / speculating)
        other, this, plain, spec = r.split()[-7], r.split()[-5], r.split()[-4], r.split()[-2]
        assert float(other) > 0 and this.endswith("x") and float(this[:-1]) > 0, r
        assert float(plain) > 0 and float(spec) > 0, r


def test_draft_ab_tool_runs_each_draft_over_one_target(llama_bundle, small_self_bundle, ids_bundle, workdir,
                                                     hf_models):
    """tools/draft_ab.py: the same draft loaded twice gives the same rounds (only the draft is swapped in); the
    hybrid drafter runs each; a draft over part of the vocabulary is taken; a bundle of another vocabulary, or
    one without a draft, is refused."""
    from conftest import _export
    tool = Path(__file__).resolve().parents[1] / "tools" / "draft_ab.py"
    run = lambda *a: subprocess.run([sys.executable, str(tool), *map(str, a)], capture_output=True, text=True)
    proc = run(llama_bundle, llama_bundle, "--limit", "2", "--max-new-tokens", "12", "--greedy")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[1:3]]  # "0 BASE ...", "1 OTHER ..."
    assert len(rows) == 2 and rows[0][5:] == rows[1][5:], proc.stdout  # tokens/round and acceptance
    assert "x the base draft's speed" in proc.stdout
    sampled = run(llama_bundle, llama_bundle, "--limit", "1", "--max-new-tokens", "8", "--sample", "--top-k", "5")
    assert sampled.returncode == 0 and "sampled" in sampled.stdout, sampled.stderr
    hybrid = run(llama_bundle, llama_bundle, "--drafter", "hybrid", "--limit", "2", "--max-new-tokens", "12", "--greedy")
    rows = [line.split() for line in hybrid.stdout.splitlines()[1:3]]
    # (the hybrid chooses lookups or the model by the pass costs it times as it goes, so its rounds follow the
    # machine's timing: both drafts ran, not necessarily the same rounds)
    assert hybrid.returncode == 0 and "hybrid drafter" in hybrid.stdout, hybrid.stderr
    assert len(rows) == 2 and all(float(r[-2]) >= 1 and 0 <= float(r[-1]) <= 1 for r in rows), hybrid.stdout
    subset = _export(target=str(hf_models["llama"]), draft=str(hf_models["llama"]), draft_quant="int4", draft_vocab=100,
                     out=workdir / "b_llama_subset")  # a draft whose logits cover ids 0..99 of 128
    proc = run(llama_bundle, subset, "--limit", "1", "--max-new-tokens", "8", "--greedy")
    assert proc.returncode == 0 and "x the base draft's speed" in proc.stdout, proc.stderr
    for other, message in ((small_self_bundle, "does not share"), (ids_bundle, "has no draft model")):
        bad = run(llama_bundle, other, "--limit", "1")
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


def test_the_ideal_reads_the_costs_timed_in_the_run_not_the_stored_profile():
    """A baseline spending 1.0 s of target time on 10 tokens (0.1 s a token), a gamma-4 setting whose 5-position
    passes took 0.14-0.16 s and whose draft steps 0.01 s: ideal 5 x 0.1 / (0.04 + 0.15) with every draft
    accepted, whatever the profile says. Sizes timed fewer than MIN_TIMED times are not read; auto takes the
    best size it ran; too few timed baseline tokens: no timed costs (the profile's are used)."""
    from ortspec.bench import MIN_TIMED, _Acc, _timed_costs, _timed_ideal
    base, a = _Acc(timed_target_s=1.0, timed_tokens=10), _Acc(pass_s={5: [0.15, 0.14, 0.16], 9: [0.2]}, step_s=[0.01, 0.012, 0.009])
    per_token, passes, step = _timed_costs(a, base, True, 0.5)
    assert per_token == 0.1 and passes == {5: 0.15} and step == 0.01
    assert abs(_timed_ideal([1.0] * 4, 4, per_token, passes, step) - 5 * 0.1 / (0.04 + 0.15)) < 1e-12
    assert _timed_ideal([1.0] * 8, 8, per_token, passes, step) is None  # its size not timed enough
    a.pass_s[3] = [0.12] * MIN_TIMED
    _, passes, _ = _timed_costs(a, base, True, 0.5)
    auto = _timed_ideal([0.5] * 4, "auto", per_token, passes, step)
    assert auto == max(expected_tokens([0.5] * 4, g) * 0.1 / (g * 0.01 + passes[g + 1]) for g in (2, 4))
    assert _timed_costs(a, base, False, 0.5)[2] == 0.0  # lookups draft for free
    assert _timed_costs(a, _Acc(timed_target_s=0.3, timed_tokens=MIN_TIMED - 1), True, 0.5) is None


def test_rounds_that_read_a_prompt_time_no_pass(pair_bundle):
    """Stats.round_passes: None for the first round (the prompt's prefill) and for the round where the draft
    reads a long prompt; every other round the size of its target pass and the models' run times."""
    from ortspec import SpeculativeGenerator
    gen = SpeculativeGenerator.load(pair_bundle)
    gen.LAZY_PREFILL = 16  # (the tiny model holds 256 positions)
    for prompt_len in (5, gen.LAZY_PREFILL + 20):
        ids = [3 + i % 40 for i in range(prompt_len)]
        gen.target.reset()
        gen.drafter.lm.reset()
        stats = gen.generate(input_ids=ids, max_new_tokens=20, num_draft_tokens=3).stats
        lazy = prompt_len > gen.LAZY_PREFILL  # its first round is the target's alone; the second reads the prompt
        skipped = [i for i, p in enumerate(stats.round_passes) if p is None]
        assert skipped == ([0, 1] if lazy else [0]), stats.round_passes
        assert len(stats.round_passes) == stats.rounds
        for p, g in zip(stats.round_passes, stats.round_gammas):
            if p is not None:
                positions, target_s, draft_s = p
                assert positions == g + 1 and target_s > 0 and (draft_s > 0) == (g > 0)


def _tool(name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_llama_perplexity_kl_summary_is_parsed():
    """tools/fidelity.py reads llama-perplexity's KL summary: same top token, mean KL, the NLL change from the
    log-ratio of perplexities over the base's log-perplexity; a log without the summary is an error."""
    import math
    fidelity = _tool("fidelity")
    log = ("Mean    PPL(base)            :   5.012345 ±   0.1\n"
           "Mean    ln(PPL(Q)/PPL(base)) :   0.001611 ±   0.0003\n"
           "====== KL divergence statistics ======\nMean    KLD:   0.001122 ±   0.000050\n"
           "Maximum KLD:   0.9\n====== Token probability statistics ======\nSame top p: 98.431 ±  0.224 %\n")
    got = fidelity.parse_kld(log)
    assert got["top1"] == pytest.approx(0.98431) and got["mean_kl"] == pytest.approx(0.001122)
    assert got["nll_change"] == pytest.approx(0.001611 / math.log(5.012345))
    with pytest.raises(ValueError, match="no KL summary"):
        fidelity.parse_kld("error: failed to load model")


def test_fidelity_report_is_shown_beside_each_row(llama_bundle, tmp_path):
    """tools/fidelity.py scores a bundle against a reference on windows of a text (the bundle against itself:
    100% and KL 0; its INT4 self-draft would not be); compare_peers --fidelity prints the ortspec rows with the
    bundle's numbers, matched by resolved path."""
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"w{(i * 7) % 120}" for i in range(400)))
    out = tmp_path / "fid.json"
    tools = Path(__file__).parents[1] / "tools"
    proc = subprocess.run([sys.executable, str(tools / "fidelity.py"), "--reference", str(llama_bundle), "--bundle",
                           str(llama_bundle), "--text", str(text), "--window", "32", "--tokens", "96", "--out",
                           str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    assert row["top1"] == 1.0 and row["mean_kl"] == 0.0 and row["positions"] == 3 * 15
    assert row["path"] == str(Path(llama_bundle).resolve())
    peers = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, str(tools / "compare_peers.py"), str(llama_bundle), "--peers", "",
                           "--limit", "1", "--max-new-tokens", "6", "--fidelity", str(out), "--out", str(peers)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "top-1" in proc.stdout and "100.0%" in proc.stdout
    rows = json.loads(peers.read_text())["summary"]
    assert rows and all(r["fidelity"] == {"top1": 1.0, "mean_kl": 0.0} for r in rows)
