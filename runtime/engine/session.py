"""onnxruntime sessions: execution providers, session options, thread pools, and what to do when a build is missing."""
from __future__ import annotations

try:
    import onnxruntime as ort
except ImportError as exc:  # the base install leaves the choice of build to an extra
    raise ImportError("ortspec needs onnxruntime, which is not installed: pip install 'ortspec[cpu]' for the CPU, "
                      "or 'ortspec[cuda]' for NVIDIA GPUs (one of the two, never both)") from exc

from ..errors import ProviderUnavailableError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
LOGITS_PLACES = ("auto", "host", "device")


THREAD_POOLS = ("session", "shared")
_shared_pool_threads: int | None = None  # size of onnxruntime's process-wide pool once created here


def _shared_pool(threads: int | None) -> None:
    """Create onnxruntime's process-wide intra-op pool on first use (later sizes are ignored)."""
    global _shared_pool_threads
    if _shared_pool_threads is None:
        from onnxruntime.capi import _pybind_state
        try:
            _pybind_state.set_global_thread_pool_sizes(int(threads or 0), 1)
        except _pybind_state.Fail as exc:  # onnxruntime's own error type; only "created already" is expected
            if "already been created" not in str(exc):
                raise
            # created already (by another library in this process): sessions simply join it
        _shared_pool_threads = int(threads or 0)


def check_thread_pool(value) -> None:
    if value not in THREAD_POOLS:
        raise ValueError(f"thread_pool must be 'session' or 'shared', got {value!r}")


def shared_thread_pool_active() -> bool:
    return _shared_pool_threads is not None


def session_options(threads: int | None, thread_pool: str = "session") -> ort.SessionOptions:
    """Options for one graph's session.

    thread_pool "session" (onnxruntime's default): a pool of ``threads`` intra-op
    threads (None: one per physical core) for this session alone. "shared": every
    session on onnxruntime's one process-wide pool. The draft and the target
    alternate many times per token; with a pool each, every step on 2 cores ran
    about 2x slower while the two alternated than in a loop of its own (4 draft
    steps + one 5-token verify of SmolLM2: 79-89 ms; 39-42 ms on one shared
    pool). Once the shared pool exists, onnxruntime requires *every* later
    session of the process to use it.
    """
    check_thread_pool(thread_pool)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # Denormal floats (e.g. attention weights that underflow in a sharp softmax) run on a slow path of the
    # CPU: flushing them to zero took 7-8% off SmolLM2 steps (pool per session; up to 25% on one graph
    # variant). Both decoding paths run the same sessions, so exactness is untouched.
    so.add_session_config_entry("session.set_denormal_as_zero", "1")
    if thread_pool == "shared":
        _shared_pool(threads)
        so.use_per_session_threads = False
        return so
    if _shared_pool_threads is not None:
        raise ValueError("this process already runs onnxruntime on its shared thread pool, and onnxruntime then "
                         "refuses sessions with threads of their own: load with thread_pool='shared'")
    if threads:
        so.intra_op_num_threads = int(threads)
    so.inter_op_num_threads = 1
    # With a pool per session, threads still spinning in the idle session would steal time from the running
    # one (20-60% per step measured on 2 cores), yet no spinning at all slows every step's hand-offs between
    # threads. Spinning during a run, stopped as soon as the run returns, measured best (SmolLM2 pair, γ=4,
    # release 0.2: 28.8 tok/s, against 26.9 without spinning and 28.6 on the shared pool).
    so.add_session_config_entry("session.intra_op.allow_spinning", "1")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return so


GPU_INSTALL = "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'ortspec[cuda]'"


def installed_builds() -> list[str]:
    """The onnxruntime distributions installed (they all provide the one `onnxruntime` package)."""
    from importlib import metadata
    found = []
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.distribution(name)
            found.append(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def providers_for(provider: str) -> list:
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be 'cpu' or 'cuda', got {provider!r}")
    name = PROVIDERS[provider]
    if name not in ort.get_available_providers():
        raise ProviderUnavailableError(missing_provider(name))
    return [name] if provider == "cpu" else [name, "CPUExecutionProvider"]


def missing_provider(name: str, loaded: bool = True) -> str:
    """What to do when onnxruntime cannot run ``name``: the fix depends on which builds are installed."""
    builds = installed_builds()
    here = f"onnxruntime {ort.__version__} ({' + '.join(builds) or 'unknown build'})"
    if name != PROVIDERS["cuda"]:
        return f"{here} has no {name}"
    if len(builds) > 1:
        return (f"{here}: both builds are installed and overwrite each other's files, so which one runs is "
                f"accidental; keep only the GPU build: {GPU_INSTALL}")
    if "onnxruntime-gpu" not in builds or loaded:
        return (f"{here} has no CUDAExecutionProvider (available: {', '.join(ort.get_available_providers())}); "
                f"install the GPU build in place of the CPU one: {GPU_INSTALL}; or use provider='cpu'")
    return (f"{here} offers CUDA but could not start it (missing or mismatched CUDA/cuDNN libraries: onnxruntime-gpu "
            "1.31+ needs CUDA 13 and cuDNN 9; its log above names the library); or use provider='cpu'")

