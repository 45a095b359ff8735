"""Replicas of `ortspec serve` on Ray Serve: past one machine without a balancer of ortspec's own.

Each replica is a Ray actor process that loads the bundle and runs the same OpenAI-compatible application as
`ortspec serve` (its Engine: ``parallel`` slots, the queue, /health and /metrics); Ray Serve's HTTP proxy spreads
requests over the replicas (streams included), its controller health-checks every replica through
``check_health`` (the replica's worker thread alive and its engine open) and replaces one that fails. Needs the
``ray`` extra (``ray[serve]``) besides ``serve``.

    from ray import serve
    from ortspec.replicas import application
    serve.run(application("models/smollm2-135m", replicas=2, parallel=2), route_prefix="/")

or from the shell, on a running cluster (``ray start --head``; other machines ``ray start --address=...``):

    serve run ortspec.replicas:build bundle=models/smollm2-135m replicas=2 parallel=2

Every replica reads the bundle from the same path, so on several machines it must be on each (or on shared
storage). /health and /metrics answer from whichever replica the proxy picks; Ray's own metrics cover the
deployment as a whole.
"""
from __future__ import annotations

from .errors import OrtspecError

_ENGINES: list = []  # the engine this replica process built (check_health reads it)

OPTIONS = ("parallel", "drafter", "num_draft_tokens", "threads", "max_queue", "request_timeout", "model_id",
           "api_key", "default_max_tokens", "draft_window", "draft_kv", "provider")


def replica_app(bundle: str, options: dict):
    """The ASGI application one replica runs: `ortspec serve`'s, over an engine loaded here."""
    from .serve import build_engine, create_app
    engine = build_engine(bundle, **{k: v for k, v in options.items() if k != "api_key"})
    _ENGINES.append(engine)
    return create_app(engine, api_key=options.get("api_key"))


def check_replica() -> None:
    """A replica's health: its engine built, open and its worker thread running; RuntimeError otherwise."""
    if not _ENGINES or not _ENGINES[-1].alive():
        raise RuntimeError("this replica's engine is not running")


def application(bundle: str, replicas: int = 1, num_cpus: float = 1.0, health_check_period_s: float = 10.0,
                **options):
    """A Ray Serve application of ``replicas`` replicas of ``bundle``'s server (``options``: those of
    ``ortspec.serve.serve`` — parallel, drafter, num_draft_tokens, threads, max_queue, request_timeout, model_id,
    api_key, default_max_tokens, draft_window, draft_kv, provider), each reserving ``num_cpus`` of the cluster."""
    try:
        from ray import serve
    except ImportError as exc:
        raise OrtspecError(f"replicas need the ray extra ({exc.name} is missing): pip install 'ortspec[serve,ray]'") \
            from None
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown server options {unknown}; known: {', '.join(OPTIONS)}")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"replicas must be an integer >= 1, got {replicas!r}")
    bundle, options = str(bundle), dict(options)

    def builder():  # (a function: Ray Serve calls it on each replica to make the application)
        return replica_app(bundle, options)

    @serve.deployment(num_replicas=replicas, ray_actor_options={"num_cpus": num_cpus},
                      health_check_period_s=health_check_period_s, max_ongoing_requests=1000)
    @serve.ingress(builder)
    class OrtspecReplica:
        def check_health(self) -> None:
            """Raises (the controller then replaces this replica) once its engine is gone or its worker died."""
            from ortspec.replicas import check_replica  # (this module as the replica imported it, not a copy)
            check_replica()

    return OrtspecReplica.bind()


def build(args: dict):
    """`serve run ortspec.replicas:build bundle=DIR [replicas=N] [parallel=N] ...`: the application from
    command-line arguments (strings; numbers converted)."""
    args = dict(args)
    if "bundle" not in args:
        raise ValueError("give the bundle: serve run ortspec.replicas:build bundle=DIR [replicas=N] [parallel=N]")
    bundle = args.pop("bundle")
    numbers = {"replicas": int, "num_cpus": float, "health_check_period_s": float, "threads": int,
               "max_queue": int, "request_timeout": float, "default_max_tokens": int, "draft_window": int}
    for name, kind in numbers.items():
        if name in args:
            args[name] = kind(args[name])
    if "parallel" in args and args["parallel"] != "auto":
        args["parallel"] = int(args["parallel"])
    return application(bundle, **args)
