"""The CUDA check cannot rot: tools/gpu_check.sh runs end to end here on the CPU provider with toy shapes
(install into a private directory, bundles, verify, invariance, step costs, decoding, report)."""
from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess

import pytest

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu(tmp_path):
    (tmp_path / "wheels").mkdir()  # none: the CPU build already installed here is used
    env = dict(os.environ, PROVIDER="cpu", SHAPES="tiny", SAMPLES="2000", OUT=str(tmp_path / "reports"),
               TMPDIR=str(tmp_path), WHEELS=str(tmp_path / "wheels"))
    proc = subprocess.run(["bash", "tools/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "reports"
    assert json.loads((out / "verify_tiny.json").read_text())["verdict"] == "pass"
    for name in ("smollm2-fp16", "qwen-fp16"):
        assert json.loads((out / f"verify_{name}.json").read_text())["greedy"]["mismatches"] == 0
    reports = json.loads((out / "gpu_check.json").read_text())
    assert [r["bundle"] for r in reports] == ["smollm2-fp16", "qwen-fp16"]
    for r in reports:
        assert r["provider"] == "cpu" and r["dtype"] == "float16"
        assert sorted(r["invariance"]["sizes"]) == [str(k) for k in range(1, 10)]  # JSON keys
        assert len(r["step_ms"]["target"]) == 9 and r["step_ms"]["draft"] > 0
        for mode in ("greedy", "sampled"):
            assert set(r[mode]) == {"target-only", "gamma=1", "gamma=2", "gamma=4"}
            assert all(0 <= v["host_share"] <= 1 and v["tokens_per_s"] > 0 for v in r[mode].values())
        assert r["predicted"]["greedy"]["best"]["speedup"] >= 1.0  # gamma 0 (no drafting) is always a choice
    table = (out / "gpu_check.md").read_text().splitlines()
    assert len(table) == 2 + 2 * 2 and table[2].startswith("| smollm2-fp16 | float16 |")
    assert "== done (verify: pass)" in (out / "gpu_check.log").read_text()
    assert not list(tmp_path.glob("ortspec-gpu-*"))  # its work directory is removed


def test_wheel_parts_join_and_check(tmp_path):
    wheel = tmp_path / "onnxruntime_gpu-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    data = os.urandom(5000)
    wheel.write_bytes(data)
    subprocess.run(f"sha256sum {wheel.name} > {wheel.name}.sha256 && split -b 2000 -d {wheel.name} {wheel.name}.part-"
                   f" && rm {wheel.name}", shell=True, cwd=tmp_path, check=True)
    parts = sorted(tmp_path.glob("*.part-*"))
    assert len(parts) == 3
    damaged = parts[1].read_bytes()
    parts[1].write_bytes(damaged[:-1] + bytes([damaged[-1] ^ 1]))
    proc = subprocess.run(["bash", str(ROOT / "tools/gpu_wheel.sh"), "join", str(tmp_path)], capture_output=True,
                          text=True)
    assert proc.returncode == 1 and "incomplete or damaged" in proc.stdout
    parts[1].write_bytes(damaged)
    subprocess.run(["bash", str(ROOT / "tools/gpu_wheel.sh"), "join", str(tmp_path)], check=True, capture_output=True)
    assert wheel.read_bytes() == data and not list(tmp_path.glob("*.part-*"))
