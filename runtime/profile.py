"""Where a pass's time goes: operator time by type (onnxruntime's profiler), time outside operators, the bytes bound."""
from __future__ import annotations

from dataclasses import dataclass, field
import json
import os
from pathlib import Path
import statistics
import subprocess
import tempfile
import threading
import time

import numpy as np



@dataclass
class PassProfile:
    """One pass size of one model, per pass (medians over the repeats, in ms)."""

    model: str                  # "target" or "draft"
    positions: int
    wall_ms: float              # the pass as the runtime runs it, on a session without the profiler
    session_ms: float           # of which inside onnxruntime (the rest: binding, host buffers, Python)
    run_ms: float               # the profiled session's run (onnxruntime's model_run)
    ops_ms: dict[str, float] = field(default_factory=dict)  # operator type -> time in its kernels

    @property
    def op_ms(self) -> float:
        return sum(self.ops_ms.values())

    @property
    def host_ms(self) -> float:
        return max(0.0, self.wall_ms - self.session_ms)

    @property
    def outside_ms(self) -> float:
        """Run time outside the kernels (the executor, allocation, copies between operators)."""
        return max(0.0, self.run_ms - self.op_ms)

    def as_dict(self) -> dict:
        return {"model": self.model, "positions": self.positions, "wall_ms": round(self.wall_ms, 3),
                "session_ms": round(self.session_ms, 3), "host_ms": round(self.host_ms, 3), "run_ms": round(self.run_ms, 3), "op_ms": round(self.op_ms, 3),
                "outside_ms": round(self.outside_ms, 3),
                "ops_ms": {k: round(v, 3) for k, v in sorted(self.ops_ms.items(), key=lambda kv: -kv[1])}}


def context_ids(vocab: int, n: int) -> list[int]:
    """``n`` token ids a timed pass reads after: (1000 + 7 i) mod min(vocab, 30000), ids every model has."""
    span = min(vocab, 30000)
    return [(1000 + 7 * i) % span for i in range(n)]


def profile_model(bundle, which: str, sizes: list[int], context: int = 200, repeat: int = 10,
                  threads: int | None = None, say=None) -> list[PassProfile]:
    """Profile ``which`` model of a loaded bundle (ortspec.bundle.Bundle): after ``context`` cached tokens,
    passes of each size in ``sizes`` (rolled back after each, as a rejected draft is), ``repeat`` times, on two
    sessions in turn: a plain one for the wall time and one with onnxruntime's profiler for the split."""
    from .engine import CausalLM
    spec = bundle.target if which == "target" else bundle.draft
    if spec is None:
        raise ValueError(f"this bundle has no {which} model")
    path = str(bundle.file(spec.path))
    if min(sizes) < 1 or context < 1 or repeat < 1:
        raise ValueError("pass sizes, context and repeat must be positive")
    if context + max(sizes) > spec.max_positions:
        raise ValueError(f"context {context} + a pass of {max(sizes)} exceeds the model's {spec.max_positions} "
                         "positions")
    with tempfile.TemporaryDirectory(prefix="ortspec-profile-") as tmp:
        plain = CausalLM(spec, path, threads=threads)
        traced = CausalLM(spec, path, threads=threads, profile=os.path.join(tmp, which))
        ids = context_ids(spec.vocab_size, context + max(sizes))
        for lm in (plain, traced):
            lm.prefill(ids[:context])
        walls: dict[int, list[float]] = {n: [] for n in sizes}
        inside: dict[int, list[float]] = {n: [] for n in sizes}
        order: list[int] = []  # the size of each profiled pass after the prefill, in order
        for k in range(repeat + 1):  # the first round warms up and is left out
            for n in sizes:
                for lm in (plain, traced):
                    lm.rollback(context)
                    t0, r0 = time.perf_counter(), lm.run_time_s
                    lm.forward(ids[context:context + n])
                    if lm is plain and k:
                        walls[n].append(time.perf_counter() - t0)
                        inside[n].append(lm.run_time_s - r0)
                order.append(n if k else 0)
            if say:
                say(f"{which}: round {k + 1} of {repeat + 1}")
        trace = traced.session.end_profiling()
        runs = read_trace(trace)
    runs = runs[-len(order):]  # (the prefill's runs come first)
    out = []
    for n in sizes:
        mine = [r for r, m in zip(runs, order) if m == n]
        types = sorted({t for r in mine for t in r["ops"]})
        out.append(PassProfile(which, n, statistics.median(walls[n]) * 1e3, statistics.median(inside[n]) * 1e3,
                               statistics.median(r["run"] for r in mine) / 1e3,
                               {t: statistics.median(r["ops"].get(t, 0.0) for r in mine) / 1e3 for t in types}))
    return out


def read_trace(path: str) -> list[dict]:
    """onnxruntime's profile as a list of runs: {"run": µs, "ops": {operator type: µs in its kernels}}."""
    events = json.loads(Path(path).read_text())
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    out = [{"run": float(e["dur"]), "ops": {}, "end": e["ts"] + e["dur"], "ts": e["ts"]} for e in runs]
    starts = [r["ts"] for r in out]
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        if 0 <= i < len(out) and e["ts"] + e["dur"] <= out[i]["end"]:  # (inside that run)
            op = e.get("args", {}).get("op_name", "?")
            out[i]["ops"][op] = out[i]["ops"].get(op, 0.0) + float(e["dur"])
    return [{"run": r["run"], "ops": r["ops"]} for r in out]


def pass_bytes(spec, context: int) -> dict:
    """Bytes one pass must read from memory at least: the graph's weights (its files) and the cached keys and
    values of ``context`` positions."""
    weights = sum(int(v) for v in spec.size_bytes.values())
    elem = 2 if spec.dtype == "float16" else 4
    cache = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * context * elem
    return {"weights": weights, "cache": cache, "total": weights + cache}


def memory_bandwidth(threads: int, mib: int = 256, repeat: int = 5) -> float:
    """This machine's memory bandwidth as ``threads`` threads copying ``mib`` MiB between arrays (bytes read
    plus bytes written, per second; the best of ``repeat``)."""
    threads = max(1, int(threads))
    n = (mib << 20) // 8 // threads
    src = [np.ones(n) for _ in range(threads)]
    dst = [np.empty(n) for _ in range(threads)]
    best = 0.0
    for _ in range(repeat + 1):
        workers = [threading.Thread(target=np.copyto, args=(d, s)) for d, s in zip(dst, src)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = max(best, 2 * 8 * n * threads / (time.perf_counter() - t0))
    return best


def llama_bench(binaries: str, gguf: str, sizes: list[int], context: int, threads: int,
                repeat: int = 3, timeout: float = 900) -> dict[int, float]:
    """llama.cpp's ms per pass of each size after ``context`` tokens (``llama-bench -d``): a one-position pass
    from its decoding test, larger ones from prompt tests of that many tokens."""
    exe = Path(binaries) / "llama-bench"
    if not exe.is_file():
        raise FileNotFoundError(f"no llama-bench in {binaries} (build llama.cpp's tools first)")
    prompts = [n for n in sizes if n > 1] or [0]
    cmd = [str(exe), "-m", gguf, "-p", ",".join(map(str, prompts)), "-n", "32" if 1 in sizes else "0",
           "-d", str(context), "-t", str(threads), "-r", str(repeat), "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({proc.returncode}): {proc.stderr[-800:]}")
    out = {}
    for r in json.loads(proc.stdout):
        n = 1 if r["n_gen"] else r["n_prompt"]
        if n in sizes:
            out[n] = 1e3 * n / float(r["avg_ts"])
    return out


def report(profiles: list[PassProfile], bandwidth: float, read: dict[str, dict], peer: dict[int, float] | None,
           top: int = 8) -> str:
    """The profile as text: per model and pass size, the wall time, its split and the leading operator types;
    the bound from the bytes read; llama.cpp beside it when measured."""
    lines = [f"memory bandwidth (copy, read + write): {bandwidth / 1e9:.1f} GB/s"]
    for p in profiles:
        b = read[p.model]
        bound = b["total"] / bandwidth * 1e3
        lines.append("")
        lines.append(f"{p.model}, {p.positions}-position pass: {p.wall_ms:.2f} ms"
                     + (f"   (llama.cpp: {peer[p.positions]:.2f} ms, ortspec/llama.cpp {p.wall_ms / peer[p.positions]:.2f})"
                        if peer and p.model == "target" and p.positions in peer else ""))
        lines.append(f"  onnxruntime {p.session_ms:.2f} ms + host {p.host_ms:.2f} ms (binding, buffers, Python); "
                     f"profiled run {p.run_ms:.2f} ms: operators {_share(p.op_ms, p.run_ms)}, "
                     f"outside operators {_share(p.outside_ms, p.run_ms)}")
        lines.append(f"  bytes read: {b['weights'] / 1e6:.1f} MB weights + {b['cache'] / 1e6:.2f} MB cache -> "
                     f"bound {bound:.2f} ms ({bound / p.wall_ms:.0%} of the pass)")
        for op, ms in sorted(p.ops_ms.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"    {op:32s} {ms:8.2f} ms  {_share(ms, p.op_ms):>6s}")
    return "\n".join(lines)


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"
