"""Figures drawn from measured JSON: the reports of `ortspec bench --out`, tools/compare_peers.py --out and
tools/fidelity.py --out. Nothing here measures; every point comes from a report. Needs matplotlib (the `bench`
extra). `ortspec bench --plot` and `compare_peers.py --plot` call these; tools/figures.py draws the results
page's figures from several reports at once."""
from __future__ import annotations

from pathlib import Path
import statistics

ORTSPEC_DEFAULT = "ortspec hybrid auto"  # the recipes' default decoding, as compare_peers names its row
LLAMA_ALONE = "llama.cpp target-only (decode)"
EDIT_NAMES = {"target-only": "ortspec target-only", "default": "ortspec default (hybrid, auto)",
              "prediction": "ortspec default\n+ the file as prediction", "llama.cpp target-only": "llama.cpp alone",
              "llama.cpp ngram": "llama.cpp n-gram", "llama.cpp draft model": "llama.cpp draft model"}


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("figures need matplotlib: pip install 'ortspec[bench]'") from None
    return plt


def _save(fig, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


MIN_REACHED = 5  # a draft position reached fewer times than this is left out of an acceptance plot


def acceptance_axes(ax, settings: list[dict], title: str | None = None) -> None:
    """P(accepted | reached) per draft position, a line per bench setting (drafter and gamma); positions reached
    fewer than MIN_REACHED times (where the report counts them) are left out."""
    for r in settings:
        acc = r["per_position_acceptance"]
        reached = r.get("per_position_reached") or [MIN_REACHED] * len(acc)
        points = [(i + 1, a) for i, (a, n) in enumerate(zip(acc, reached)) if n >= MIN_REACHED]
        if points:
            ax.plot(*zip(*points), "o-", label=f"{r['drafter']} gamma={r['num_draft_tokens']}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted | reached)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)


def acceptance(reports: dict[str, dict], path: str | Path) -> None:
    """One panel per bench report (e.g. {"greedy": ..., "sampled": ...}): acceptance per draft position."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(reports), figsize=(5.5 * len(reports), 3.8), squeeze=False)
    for ax, (label, report) in zip(axes[0], reports.items()):
        acceptance_axes(ax, [r for r in report["settings"] if r["per_position_acceptance"]],
                        f"{Path(report['bundle']).name}, {label}")
    _save(fig, path)


def bench(report: dict, path: str | Path) -> None:
    """`ortspec bench --plot`: speedup against gamma (measured and the cost model's), and acceptance per position."""
    plt = _pyplot()
    rows = [r for r in report["settings"] if r["num_draft_tokens"] != "auto"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    g = [r["num_draft_tokens"] for r in rows]
    ax1.plot(g, [r["speedup"] for r in rows], "o-", label="measured")
    ax1.plot(g, [r["decode_speedup_total"] for r in rows], "^-", label="measured, after the first token")
    ax1.plot(g, [r["ideal_speedup"] or float("nan") for r in rows], "s--",
             label="cost model (ideal, after the first token)")
    for r in report["settings"]:
        if r["num_draft_tokens"] == "auto":
            ax1.axhline(r["speedup"], color="gray", ls=":", label="auto (measured)")
    ax1.axhline(1.0, color="black", lw=0.8)
    ax1.set_xlabel("draft tokens per round (gamma)")
    ax1.set_ylabel("speedup vs target only")
    ax1.legend()
    acceptance_axes(ax2, report["settings"])
    fig.suptitle(Path(report["bundle"]).name)
    _save(fig, path)


def _fidelity_label(row: dict) -> str:
    f = row.get("fidelity")
    return f"\ntop-1 {f['top1'] * 100:.1f}%, KL {f['mean_kl']:.4f}" if f else ""


def _grouped_bars(groups: dict[str, dict[str, tuple[float, str | None]]], labels: list[str], names: list[str],
                  xlabel: str, title: str, path: str | Path) -> None:
    """Horizontal bars, one row per name and one bar per group ({group: {name: (value, text beside the bar)}})."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.7 + 0.75 * len(names)))
    height = 0.8 / len(groups)
    for k, (label, cells) in enumerate(groups.items()):
        ys = [i + (k - (len(groups) - 1) / 2) * height for i in range(len(names))]
        rates = [cells.get(n, (0.0, None))[0] for n in names]
        ax.barh(ys, rates, height=height * 0.95, label=label)
        for y, n, rate in zip(ys, names, rates):
            text = cells.get(n, (0.0, None))[1]
            if text:
                ax.text(rate, y, f" {text}", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.margins(x=0.15)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
    _save(fig, path)


def versus(reports: dict[str, dict], path: str | Path, runtimes: list[str] | None = None) -> None:
    """Bars of decode tokens/s per runtime row, one bar per report (e.g. greedy and sampled runs of
    compare_peers), each labelled with its rate against llama.cpp alone in the same run."""
    first = next(iter(reports.values()))
    names = runtimes or [s["runtime"] for s in first["summary"]]
    names = [n for n in names if any(any(s["runtime"] == n for s in r["summary"]) for r in reports.values())]
    groups = {label: {s["runtime"]: (s["tokens_per_s"], f"{s['ratio_vs_llama_cpp']:.2f}x"
                                     if "ratio_vs_llama_cpp" in s else None) for s in report["summary"]}
              for label, report in reports.items()}
    labels = []
    for n in names:
        row = next((s for r in reports.values() for s in r["summary"] if s["runtime"] == n), {})
        name = "ortspec default (hybrid, auto length)" if n == ORTSPEC_DEFAULT else n.replace(" (decode)", "")
        labels.append(name + _fidelity_label(row))
    _grouped_bars(groups, labels, names, "decode tokens/s (the bar's label: against llama.cpp alone in the same run)",
                  f"{Path(first['bundle']).name}: {first['prompts']} prompts, {first['max_new_tokens']} tokens", path)


def frontier_points(reports: list[dict], fidelity_rows: list[dict]) -> list[dict]:
    """Speed/fidelity points from compare_peers reports run with llama.cpp on the file (the speed unit: each
    run's own llama.cpp rate) and tools/fidelity.py's rows, matched by the bundle directory's or GGUF file's name
    (the reports may come from another machine). The same file or bundle in several reports gives one point, its
    median ratio."""
    fidelity = {Path(r["path"]).name: r for r in fidelity_rows}
    points: dict[str, dict] = {}

    def add(key: str, label: str, side: str, ratio: float) -> None:
        fid = fidelity.get(Path(key).name)
        if fid is None:
            raise ValueError(f"no fidelity measurement for {Path(key).name}: run tools/fidelity.py on it")
        name = Path(key).name
        points.setdefault(name, {"name": name, "label": label, "side": side, "top1": fid["top1"],
                                 "mean_kl": fid["mean_kl"], "ratios": []})["ratios"].append(ratio)
    for report in reports:
        by = {s["runtime"]: s for s in report["summary"]}
        if LLAMA_ALONE not in by or not report.get("llama_cpp_target"):
            raise ValueError(f"{report['bundle']}: a frontier needs compare_peers run with --llama-cpp")
        add(report["bundle"], Path(report["bundle"]).name, "ortspec", by["ortspec target-only"]["ratio_vs_llama_cpp"])
        add(report["llama_cpp_target"], "llama.cpp, the file", "llama.cpp", 1.0)
        for other in report.get("llama_cpp_also", []):
            row = by.get(f"llama.cpp target-only {Path(other).stem} (decode)")
            if row:
                add(other, f"llama.cpp, {Path(other).stem}", "llama.cpp", row["ratio_vs_llama_cpp"])
    return [dict(p, ratio=statistics.median(p["ratios"])) for p in points.values()]


def frontier(points: list[dict], path: str | Path, title: str = "") -> None:
    """Target-only decode speed (x llama.cpp on the file) against KL to the file's float model."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for side, marker in (("ortspec", "o"), ("llama.cpp", "s")):
        mine = [p for p in points if p["side"] == side]
        ax.scatter([p["mean_kl"] for p in mine], [p["ratio"] for p in mine], marker=marker, s=60, label=side)
        for p in mine:
            ax.annotate(f"{p['label']}\ntop-1 {p['top1'] * 100:.1f}%", (p["mean_kl"], p["ratio"]),
                        textcoords="offset points", xytext=(6, -4), fontsize=7)
    ax.set_xscale("log")
    ax.axhline(1.0, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("mean KL to the file's float model (log; left is closer)")
    ax.set_ylabel("target-only decode speed\n(x llama.cpp on the file, same run)")
    ax.margins(x=0.35, y=0.15)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    _save(fig, path)


def edit(report: dict, path: str | Path) -> None:
    """tools/edit_bench.py's report: mean decode tokens/s per configuration, greedy and sampled, each bar
    labelled with its median speedup over the same export's target-only decoding."""
    summary = report["summary"]
    modes = list(summary)
    names = list(next(iter(summary.values())))
    groups = {mode: {n: (c["decode_tok_s"], f"{c['speedup_median']:.2f}x") for n, c in summary[mode].items()}
              for mode in modes}
    fid = report.get("fidelity") or {}
    labels = []
    for n in names:
        side = fid.get("llama.cpp" if n.startswith("llama.cpp") else "ortspec")
        cell = summary[modes[0]][n]
        part = f" ({cell['runs']} of {cell['of']} files)" if cell.get("runs", 1) < cell.get("of", 1) else ""
        labels.append(EDIT_NAMES.get(n, n) + part
                      + (f"\ntop-1 {side['top1'] * 100:.1f}%, KL {side['mean_kl']:.4f}" if side else ""))
    rows = report["rows"]
    _grouped_bars(groups, labels, names,
                  "decode tokens/s, mean over the prompts (the bar's label: median x the export's target-only)",
                  f"edit workload, {Path(report['bundle']).name}: {len({r['prompt'] for r in rows})} files, "
                  f"{report['max_new_tokens']} tokens", path)
