"""Calibration: measure this machine's step costs for a bundle and keep them as a profile.

C_d is one draft step (one token after a context of ``context`` tokens) and
C_t(k) one target pass over k tokens after the same context, k = 1..max_k.
They are measured the way decoding spends them: C_t(1) in a loop of
target-only steps, C_t(k > 1) right after k - 1 draft steps, and C_d as the
mean step of those draft runs. Each model runs slower right after the other
(its weights are out of cache), which a model timed in a loop of its own
misses. Profiles live next to the bundle in ``ortspec-profile.json``, keyed by
execution provider and machine (``profile_key``), and seed the "auto" draft-length controller.
"""
from __future__ import annotations

import functools
import json
import platform
import socket
import time
from pathlib import Path

import numpy as np

PROFILE_FILE = "ortspec-profile.json"


def profile_key(provider: str) -> str:
    """Which machine a profile was timed on: provider, host name, processor, CPU count and onnxruntime version
    (host names alone repeat: every virtual machine may be called the same, and a bundle may be copied)."""
    m = _identity()
    return f"{provider}@{m['host']} [{m['processor']}, {m['cpus']} CPUs, onnxruntime {m['onnxruntime']}]"


@functools.lru_cache(maxsize=None)
def cpu_name() -> str:
    """The processor as the OS describes it: on Linux its model name with vendor, family and model numbers (a
    model name may be as vague as "AMD EPYC"), elsewhere what ``platform`` knows."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "model name" in fields or "vendor_id" in fields:
        ident = " ".join(f"{k} {fields[k]}" for k in ("cpu family", "model") if k in fields)
        return " ".join(x for x in (fields.get("vendor_id", ""), fields.get("model name", ""), ident) if x)
    return platform.processor() or platform.machine() or "unknown processor"


def _timed(lm, context: list[int], k: int, reps: int) -> float:
    """Fastest of ``reps`` runs: on a shared machine noise only ever adds time."""
    samples = []
    feed = _ids(lm, k, k)
    for _ in range(reps):
        lm.rollback(len(context))
        lm.new_round()  # (as a decoding round: the pass writes a host buffer already bound, not fresh memory)
        t0 = time.perf_counter()
        lm.forward(feed, reuse=True)
        samples.append(time.perf_counter() - t0)
    return min(samples)


def _ids(lm, n: int, seed: int) -> list[int]:
    """``n`` ordinary token ids (3..99, fewer on a smaller vocabulary) to time passes with."""
    high = min(100, int(lm.spec.vocab_size))
    return [int(t) for t in np.random.default_rng(seed).integers(min(3, high - 1), high, n)]


def _round(target, draft, context: list[int], k: int) -> tuple[float, float]:
    """One decoding round: k - 1 draft steps, then a target pass over k tokens; (mean draft step, target pass)."""
    feed = _ids(target, k, k)
    target.rollback(len(context))
    draft.rollback(len(context))
    draft.new_round()
    target.new_round()
    t0 = time.perf_counter()
    for tok in feed[:-1]:
        draft.forward([tok], reuse=True)
        draft.release_rows()
    t1 = time.perf_counter()
    target.forward(feed, reuse=True)
    return (t1 - t0) / (k - 1), time.perf_counter() - t1


def _minima(rounds: dict, n: int | None = None) -> tuple[list, float]:
    """Over the first ``n`` repetitions (all: None): each pass size's fastest target pass, and the draft step
    (the median over pass sizes of their fastest mean steps)."""
    fastest = [min(t for _, t in series[:n]) for series in rounds.values()]
    return fastest, float(np.median([min(d for d, _ in series[:n]) for series in rounds.values()]))


def _settled(rounds: dict, settle: float) -> bool:
    """True when the latest repetition lowered no pass size's fastest time, nor the draft step, by more than
    ``settle``: the minima have stopped moving."""
    n = len(next(iter(rounds.values())))
    if n < 2:
        return False
    (before, draft_before), (now, draft_now) = _minima(rounds, n - 1), _minima(rounds, n)
    return all(b * (1 - settle) <= a for a, b in zip(now + [draft_now], before + [draft_before]))


def measure(target, draft=None, context: int = 128, max_k: int = 9, reps: int = 5, min_reps: int = 3,
            settle: float = 0.05) -> dict:
    """Step costs (seconds) at a fixed context length, after a warm-up of every model. With a draft, the rounds
    repeat at least ``min_reps`` and at most ``reps`` times, stopping once a repetition moves no minimum by more
    than ``settle`` (on a quiet machine 3: min of 3 read within 1.6% of min of 5 on the recipes' pairs; a busy
    spell moves a minimum by tens of percent)."""
    ctx = _ids(target, context, 0)
    # (plain passes: the raw cost of each pass size; bitwise decoding reads C_t(2) for one-token steps)
    for lm in filter(None, (target, draft)):
        lm.prefill(ctx)
        _timed(lm, ctx, 1, 3)  # warm-up: first runs pay for page faults and allocations
    costs = [_timed(target, ctx, 1, reps)]
    if draft is None:
        costs += [_timed(target, ctx, k, reps) for k in range(2, max_k + 1)]
    else:
        # Fastest of reps (noise only adds time), each measured right after the drafts. The pass sizes take
        # turns within each repetition, so a busy spell on a shared machine slows a few samples of every
        # size rather than every sample of a few sizes (which once made C_t(5..9) read 3x C_t(4)).
        rounds: dict[int, list] = {k: [] for k in range(2, max_k + 1)}
        for rep in range(reps):
            for k in rounds:
                rounds[k].append(_round(target, draft, ctx, k))
            if rep + 1 >= min_reps and _settled(rounds, settle):
                break
        fastest, draft_cost = _minima(rounds)
        costs += fastest
        repetitions = len(rounds[2])
    out = {"target_costs": costs, "context": context, "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": machine(), "method": "rounds"}
    if draft is not None:
        out["draft_cost"], out["repetitions"] = draft_cost, repetitions
    for lm in filter(None, (target, draft)):
        lm.reset()
    return out


def _identity() -> dict:
    """What tells this machine's pass costs from another's (``profile_key``)."""
    import onnxruntime as ort
    import os
    return {"host": socket.gethostname(), "processor": cpu_name(), "cpus": os.cpu_count(),
            "onnxruntime": ort.__version__}


def machine() -> dict:
    return dict(_identity(), platform=platform.platform(), python=platform.python_version())


def load_profile(bundle_dir: Path, provider: str) -> dict | None:
    path = Path(bundle_dir) / PROFILE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    entry = data.get(profile_key(provider)) if isinstance(data, dict) else None
    if not isinstance(entry, dict) or not entry.get("target_costs") or entry.get("method") != "rounds":
        return None  # missing, damaged, or measured by an older method: measure again
    return entry


def save_profile(bundle_dir: Path, provider: str, profile: dict) -> bool:
    """Store a profile; False (and nothing written) when the bundle directory is read-only."""
    path = Path(bundle_dir) / PROFILE_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(data, dict):
            data = {}
        data[profile_key(provider)] = profile
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)
        return True
    except (OSError, ValueError):
        return False
