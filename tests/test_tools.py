"""Every maintained script in tools/ runs, on tiny bundles and small settings, and prints what it says it does
(compare_peers, draft_ab, host_share and the GPU scripts are exercised in test_bench and test_gpu_check)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
import subprocess
import sys

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _tool(name: str, *args, timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(TOOLS / name), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_token_ids_hashes_agree_where_output_must(llama_bundle, ids_bundle):
    """tools/token_ids.py: greedy output is the target's whatever drafts it (one hash across drafters and gammas);
    seeded sampled runs repeat; a bundle without a tokenizer runs on id prompts."""
    token_ids = _module("token_ids")
    table = token_ids.hashes(str(llama_bundle), tokens=12, count=2, drafters=("none", "model", "hybrid"),
                             gammas=(1, 3, "auto"), modes=("greedy", "sampled"))
    assert len({v for k, v in table.items() if k.endswith("/greedy")}) == 1, table
    assert "model/auto/sampled" not in table and "none/1/sampled" in table
    again = token_ids.hashes(str(llama_bundle), tokens=12, count=2, drafters=("model",), gammas=(3,),
                             modes=("sampled",))
    assert again["model/3/sampled"] == table["model/3/sampled"]
    ids = token_ids.hashes(str(ids_bundle), tokens=6, count=1, drafters=("none", "model"), gammas=(1,),
                           modes=("greedy",))
    assert list(ids) == ["none/1/greedy"]  # (no draft in that bundle)


def test_step_cost_prints_a_median_per_bundle_and_size(llama_bundle):
    out = _tool("step_cost.py", llama_bundle, "--positions", "1,3", "--context", "8", "--repeat", "2",
                "--pool", "session").stdout
    rows = [line for line in out.splitlines() if str(llama_bundle) in line]
    assert rows and all(float(x) > 0 for x in rows[-1].split()[-2:]), out


def test_fast_paths_times_a_path_both_ways(llama_bundle):
    out = _tool("fast_paths.py", llama_bundle, "--n", "1", "--max-new-tokens", "6", "--gamma", "2",
                "--paths", "LazyRow").stdout
    rows = [line for line in out.splitlines() if line.startswith("LazyRow")]
    assert rows and float(rows[0].split()[-1].rstrip("x")) > 0, out


def test_bitwise_report_counts_runs_both_ways(llama_bundle):
    out = json.loads(_tool("bitwise_report.py", llama_bundle, "--max-new-tokens", "6", "--limit", "1",
                           "--json").stdout)
    assert out["invariant"] is True and out["bitwise"]["differing_runs"] == 0
    assert out["bitwise"]["runs"] == out["one_position"]["runs"] > 0


@pytest.mark.slow
def test_serve_load_compares_the_server_with_the_direct_api(llama_bundle, tmp_path):
    report = tmp_path / "load.json"
    _tool("serve_load.py", llama_bundle, "--overhead-prompts", "1", "--requests", "2", "--clients", "2",
          "--turns", "1", "--max-tokens", "6", "--out", report, timeout=600)
    assert json.loads(report.read_text())


def test_serve_bench_interleaves_its_servers_and_reports_every_round(llama_bundle, tmp_path):
    """tools/serve_bench.py: both ortspec servers run at once, every client count in every round on each; the
    one-at-a-time server is the ratios' base; every request of the mix is answered."""
    report = tmp_path / "bench.json"
    out = _tool("serve_bench.py", llama_bundle, "--counts", "1,2", "--repeat", "2", "--requests-each", "1",
                "--short", "4", "--long", "8", "--probe-tokens", "150", "--probe-repeat", "2", "--out", report, timeout=600).stdout
    data = json.loads(report.read_text())
    rows = {(r["server"], r["clients"]): r for r in data["rows"]}
    assert set(rows) == {(s, c) for s in ("ortspec serve --parallel 1", "ortspec serve --parallel 4") for c in (1, 2)}
    for (server, clients), r in rows.items():
        assert len(r["rounds"]) == 2 and r["ok"] == r["requests"] == 2 * clients and r["tokens_per_s"] > 0
        assert r["rss_mb"] > 0
        if server.endswith("--parallel 1"):
            assert r["ratio"] == 1.0
    probe = data["ttft_beside_long"]["ortspec serve --parallel 4"]
    assert probe["short_ended_before_long"] and len(probe["runs"]) == 2
    assert "x 1-at-a-time" in out


def test_serve_bench_explains_bad_counts(llama_bundle):
    proc = subprocess.run([sys.executable, str(TOOLS / "serve_bench.py"), str(llama_bundle), "--counts", "1,x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--counts takes client counts" in proc.stderr
