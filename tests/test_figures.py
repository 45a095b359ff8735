"""The results page's figures come from measured JSON: the points are the reports' numbers, matched by name, and
every figure the page shows is drawn again from the JSON committed beside it."""
from pathlib import Path
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")
from ortspec import figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def peers_report(bundle, ours, q40):
    return {"bundle": bundle, "llama_cpp_target": "/far/away/file.gguf", "llama_cpp_also": ["/else/file-q4_0.gguf"],
            "prompts": 6, "max_new_tokens": 96,
            "summary": [{"runtime": "ortspec target-only", "tokens_per_s": 10 * ours, "ratio_vs_llama_cpp": ours},
                        {"runtime": figures.LLAMA_ALONE, "tokens_per_s": 10.0, "ratio_vs_llama_cpp": 1.0},
                        {"runtime": "llama.cpp target-only file-q4_0 (decode)", "tokens_per_s": 10 * q40,
                         "ratio_vs_llama_cpp": q40}]}


FIDELITY = [{"path": "/here/models/compact", "top1": 0.987, "mean_kl": 0.0006},
            {"path": "/here/models/small", "top1": 0.923, "mean_kl": 0.04},
            {"path": "/there/file.gguf", "top1": 0.984, "mean_kl": 0.0011},
            {"path": "/there/file-q4_0.gguf", "top1": 0.931, "mean_kl": 0.028}]


def test_frontier_points_are_the_reports_ratios_matched_to_fidelity_by_name():
    reports = [peers_report("models/compact", 1.02, 1.10), peers_report("models/small", 1.23, 1.06),
               peers_report("models/compact", 1.06, 1.08)]
    points = {p["label"]: p for p in figures.frontier_points(reports, FIDELITY)}
    assert set(points) == {"compact", "small", "llama.cpp, the file", "llama.cpp, file-q4_0"}
    assert points["compact"]["ratio"] == pytest.approx(1.04) and points["compact"]["ratios"] == [1.02, 1.06]
    assert points["small"]["ratio"] == 1.23 and points["small"]["mean_kl"] == 0.04
    assert points["llama.cpp, the file"]["ratio"] == 1.0 and points["llama.cpp, the file"]["top1"] == 0.984
    assert points["llama.cpp, file-q4_0"]["ratio"] == 1.08 and points["llama.cpp, file-q4_0"]["side"] == "llama.cpp"


def test_a_frontier_point_without_a_fidelity_measurement_or_without_llama_cpp_is_refused():
    with pytest.raises(ValueError, match="no fidelity measurement for unmeasured"):
        figures.frontier_points([peers_report("models/unmeasured", 1.0, 1.0)], FIDELITY)
    report = peers_report("models/compact", 1.0, 1.0)
    report["summary"] = report["summary"][:1]
    with pytest.raises(ValueError, match="needs compare_peers run with --llama-cpp"):
        figures.frontier_points([report], FIDELITY)


def test_the_figures_command_draws_from_reports_and_says_what_is_missing(tmp_path):
    import json
    for name, rep in (("a", peers_report("models/compact", 1.02, 1.1)), ("b", peers_report("models/small", 1.2, 1.1))):
        (tmp_path / f"{name}.json").write_text(json.dumps(rep))
    (tmp_path / "fid.json").write_text(json.dumps({"rows": FIDELITY}))
    tool = [sys.executable, str(ROOT / "tools" / "figures.py")]
    out = tmp_path / "frontier.png"
    proc = subprocess.run(tool + ["frontier", "--peers", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                  "--fidelity", str(tmp_path / "fid.json"), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == PNG
    assert "small" in proc.stdout and "1.20x llama.cpp" in proc.stdout
    (tmp_path / "fid.json").write_text(json.dumps({"rows": FIDELITY[1:]}))
    proc = subprocess.run(tool + ["frontier", "--peers", str(tmp_path / "a.json"), "--fidelity",
                                  str(tmp_path / "fid.json"), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and "no fidelity measurement for compact" in proc.stderr


def test_bench_and_compare_reports_draw(tmp_path):
    bench = {"bundle": "models/x", "settings": [
        {"drafter": "none", "num_draft_tokens": 0, "per_position_acceptance": [], "speedup": 1.0,
         "decode_speedup_total": 1.0, "ideal_speedup": None},
        {"drafter": "hybrid", "num_draft_tokens": 4, "per_position_acceptance": [0.8, 0.7, 0.6, 0.5, 0.0],
         "per_position_reached": [50, 40, 28, 17, 0],
         "speedup": 1.5, "decode_speedup_total": 1.6, "ideal_speedup": 1.7},
        {"drafter": "hybrid", "num_draft_tokens": "auto", "per_position_acceptance": [0.8, 0.7],
         "speedup": 1.55, "decode_speedup_total": 1.6, "ideal_speedup": None}]}
    figures.bench(bench, tmp_path / "b.png")
    figures.acceptance({"greedy": bench, "sampled": bench}, tmp_path / "a.png")
    figures.versus({"greedy": peers_report("models/compact", 1.02, 1.1)}, tmp_path / "v.png")
    cell = {"decode_tok_s": 10.0, "speedup_median": 1.0}
    edit = {"bundle": "models/x", "max_new_tokens": 64, "rows": [{"prompt": "a.py"}],
            "fidelity": {"ortspec": {"top1": 0.98, "mean_kl": 0.001}, "llama.cpp": None},
            "summary": {m: {"target-only": cell, "prediction": dict(cell, decode_tok_s=40.0, speedup_median=4.0),
                            "llama.cpp target-only": cell} for m in ("greedy", "sampled")}}
    figures.edit(edit, tmp_path / "e.png")
    for name in ("a", "b", "v", "e"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == PNG


def test_an_acceptance_plot_leaves_out_positions_reached_too_rarely():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    figures.acceptance_axes(ax, [{"drafter": "hybrid", "num_draft_tokens": 2, "per_position_acceptance":
                                  [0.84, 0.93, 1.0, 0.0], "per_position_reached": [300, 250, 3, 0]}])
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [0.84, 0.93]
    plt.close(fig)
