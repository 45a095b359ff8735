"""ortspec profile: operator time by type from onnxruntime's profiler, the time outside operators, the bytes a
pass reads, and llama-bench's times beside them."""
from __future__ import annotations

import json
import os
from pathlib import Path
import stat
import subprocess
import sys

import pytest

from ortspec.bundle import load_bundle
from ortspec.profile import PassProfile, llama_bench, pass_bytes, profile_model, read_trace, report


def _event(cat, name, ts, dur, op=None):
    e = {"cat": cat, "name": name, "ts": ts, "dur": dur, "ph": "X"}
    if op:
        e["args"] = {"op_name": op}
    return e


def test_a_trace_is_split_into_runs_and_operator_types(tmp_path):
    events = [_event("Session", "model_run", 100, 50), _event("Session", "model_run", 200, 80),
              _event("Node", "a_kernel_time", 105, 10, "MatMul"), _event("Node", "a_fence_before", 104, 0, "MatMul"),
              _event("Node", "b_kernel_time", 120, 5, "Add"), _event("Node", "c_kernel_time", 125, 7, "MatMul"),
              _event("Node", "a_kernel_time", 210, 30, "MatMul"), _event("Session", "session_initialization", 0, 90),
              _event("Node", "stray_kernel_time", 150, 3, "Add")]  # (between runs: nobody's)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(events))
    assert read_trace(str(path)) == [{"run": 50.0, "ops": {"MatMul": 17.0, "Add": 5.0}},
                                     {"run": 80.0, "ops": {"MatMul": 30.0}}]


def test_profile_splits_each_pass_size_of_both_models(llama_bundle):
    bundle = load_bundle(llama_bundle)
    target = profile_model(bundle, "target", [1, 3], context=8, repeat=2, threads=1)
    draft = profile_model(bundle, "draft", [1], context=8, repeat=2, threads=1)
    assert [(p.model, p.positions) for p in target + draft] == [("target", 1), ("target", 3), ("draft", 1)]
    for p in target + draft:
        assert p.wall_ms >= p.session_ms > 0 and p.run_ms > 0 and p.op_ms > 0
        assert "GroupQueryAttention" in p.ops_ms
    assert "MatMulNBits" in draft[0].ops_ms and "MatMulNBits" not in target[0].ops_ms  # an int4 self-draft
    with pytest.raises(ValueError, match="exceeds"):
        profile_model(bundle, "target", [1], context=bundle.target.max_positions, repeat=1)


def test_pass_bytes_are_the_weights_and_the_cache_read(llama_bundle):
    spec = load_bundle(llama_bundle).target
    got = pass_bytes(spec, 100)
    assert got["weights"] == sum(spec.size_bytes.values()) > 0
    assert got["cache"] == 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 100 * 4
    assert got["total"] == got["weights"] + got["cache"]


def _fake_llama_bench(tmp_path: Path, records: list[dict]) -> Path:
    """A stand-in for llama-bench that prints these records and saves its arguments."""
    exe = tmp_path / "llama-bench"
    exe.write_text(f"#!{sys.executable}\nimport json, sys\nopen({str(tmp_path / 'args')!r}, 'w').write("
                   f"json.dumps(sys.argv[1:]))\nprint(json.dumps({records!r}))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def test_llama_bench_times_are_per_pass(tmp_path):
    records = [{"n_prompt": 5, "n_gen": 0, "n_depth": 200, "avg_ts": 100.0},
               {"n_prompt": 0, "n_gen": 32, "n_depth": 200, "avg_ts": 40.0}]
    bins = _fake_llama_bench(tmp_path, records)
    assert llama_bench(str(bins), "m.gguf", [1, 5], 200, 2) == {1: 25.0, 5: 50.0}
    args = json.loads((tmp_path / "args").read_text())
    assert args[args.index("-d") + 1] == "200" and args[args.index("-p") + 1] == "5" and "-n" in args
    with pytest.raises(FileNotFoundError, match="no llama-bench"):
        llama_bench(str(tmp_path / "nowhere"), "m.gguf", [1], 200, 2)


def test_report_names_the_leading_operators_and_the_peer():
    p = PassProfile("target", 1, wall_ms=40.0, session_ms=39.0, run_ms=38.0, ops_ms={"MatMulNBits": 30.0, "Add": 2.0})
    text = report([p], 20e9, {"target": {"weights": 600_000_000, "cache": 0, "total": 600_000_000}}, {1: 32.0})
    assert "MatMulNBits" in text and "ortspec/llama.cpp 1.25" in text and "bound 30.00 ms" in text
    assert p.host_ms == 1.0 and p.outside_ms == 6.0


def test_the_profile_command_prints_json(llama_bundle, tmp_path):
    bins = _fake_llama_bench(tmp_path, [{"n_prompt": 0, "n_gen": 32, "n_depth": 8, "avg_ts": 50.0}])
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "profile", str(llama_bundle), "--positions", "1",
                           "--context", "8", "--repeat", "2", "--threads", "1", "--json", "--llama-cpp", str(bins),
                           "--gguf", str(gguf)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert [(p["model"], p["positions"]) for p in out["passes"]] == [("target", 1), ("draft", 1)]
    assert out["llama_cpp_ms"] == {"1": 20.0} and out["bandwidth_gb_s"] > 0
    bad = subprocess.run([sys.executable, "-m", "ortspec.cli", "profile", str(llama_bundle), "--models", "both"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--models takes" in bad.stderr
    no_file = subprocess.run([sys.executable, "-m", "ortspec.cli", "profile", str(llama_bundle), "--llama-cpp",
                              str(bins)], capture_output=True, text=True, timeout=120)
    assert no_file.returncode != 0 and "--gguf FILE" in no_file.stderr
