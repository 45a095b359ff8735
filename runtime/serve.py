"""`ortspec serve`: an OpenAI-compatible HTTP server over one SpeculativeGenerator.

A layer above the public Python API (``stream``): requests are checked on the
event loop, then run on slots (ortspec.scheduler.Engine): up to ``parallel`` at
once, each on KV caches of its own over the one loaded model, stepped a round at
a time in turn on one worker thread; the rest wait, first come first served. Needs the
``serve`` extra (starlette, uvicorn).

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
GET /v1/models/{id}, GET /health, GET /metrics (Prometheus). Errors are OpenAI-style JSON bodies.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time

from .checks import is_int
from .config import SpeculationConfig
from .errors import OrtspecError
from .generator import SpeculativeGenerator
from .scheduler import Engine, Ticket, default_parallel
from .wire import (DEFAULT_MAX_BODY, ApiError, answer, failed_error, finish_reason_of, logprobs_field,
                   parse_request, response_body, sse_event, stream_chunk, usage_of)

log = logging.getLogger("ortspec.serve")


def _draft_header(stats: dict) -> dict | None:
    """A header that says a request's drafter failed (the body's "ortspec" field says it too, with the reason)."""
    if not stats.get("draft_disabled"):
        return None
    reason = " ".join(str(stats.get("draft_error") or "draft disabled").split())
    return {"x-ortspec-draft-disabled": reason.encode("ascii", "replace").decode("ascii")[:500]}


# -- HTTP -------------------------------------------------------------------------------------------------------

def create_app(engine: Engine, api_key: str | None = None, max_body: int = DEFAULT_MAX_BODY):
    """The Starlette application over an Engine."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def error(exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    def check_key(request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send Authorization: Bearer <key>",
                           code="invalid_api_key")

    async def read_json(request):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body:
            raise ApiError(413, f"the request body is {int(size)} bytes; this server accepts at most {max_body} "
                                "(--max-body-bytes)")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_body:
                raise ApiError(413, f"the request body exceeds {max_body} bytes (--max-body-bytes)")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks) or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from None

    async def completions(request, kind: str):
        try:
            check_key(request)
            job = parse_request(await read_json(request), kind, engine.model_id, engine.drafters)
            stream = engine.open(job)
            ticket = engine.submit(job, stream, asyncio.get_running_loop())
        except ApiError as exc:
            return error(exc)
        if job.stream:
            return StreamingResponse(_sse(ticket, engine), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            body = await _collect(ticket, engine, request)
        except ApiError as exc:
            return error(exc)
        return JSONResponse(body, headers=_draft_header(body.get("ortspec") or {}))

    async def chat(request):
        return await completions(request, "chat")

    async def completion(request):
        return await completions(request, "completion")

    def model_card() -> dict:
        return {"id": engine.model_id, "object": "model", "created": engine.created, "owned_by": "ortspec"}

    async def models(request):
        try:
            check_key(request)
        except ApiError as exc:
            return error(exc)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def model(request):
        try:
            check_key(request)
            if request.path_params["name"] != engine.model_id:
                raise ApiError(404, f"model {request.path_params['name']!r} is not served here; this server "
                                    f"serves {engine.model_id!r}", "model", "model_not_found")
        except ApiError as exc:
            return error(exc)
        return JSONResponse(model_card())

    async def health(request):
        return JSONResponse(engine.health())

    async def metrics(request):
        return PlainTextResponse(engine.metrics_text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def http_error(request, exc: HTTPException):
        message = {404: f"no such endpoint: {request.method} {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, exc.detail)
        return error(ApiError(exc.status_code, message))

    async def server_error(request, exc: Exception):
        log.exception("unhandled error")
        return error(ApiError(500, f"internal error ({type(exc).__name__}); see the server log"))

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/completions", completion, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/v1/models/{name:path}", model, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", metrics, methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error},
                     lifespan=lifespan)


async def _next(ticket: Ticket, engine: Engine):
    """The next item from the worker, or an ApiError once the request's time is up."""
    left = engine.timeout_s - (time.perf_counter() - ticket.admitted)
    try:
        return await asyncio.wait_for(ticket.queue.get(), timeout=max(left, 0.0))
    except asyncio.TimeoutError:
        ticket.cancel.set()
        raise ApiError(504, f"the request took longer than this server's {engine.timeout_s:g} s limit "
                            "(--request-timeout)", code="timeout") from None


async def _collect(ticket: Ticket, engine: Engine, request) -> dict:
    parts: list[str] = []
    entries = [] if "logprobs" in ticket.job.options else None
    watcher = asyncio.ensure_future(_watch_disconnect(request, ticket))
    try:
        while True:
            kind, value = await _next(ticket, engine)
            if kind == "text":
                parts.append(value)
            elif kind == "logprobs":
                entries.extend(value)
            elif kind == "error":
                raise failed_error(value)
            else:
                lp = None if entries is None else logprobs_field(ticket.job, entries, ticket.stream.generator.codec, [])
                return response_body(ticket.job, "".join(parts), value, lp)
    finally:
        watcher.cancel()
        ticket.cancel.set()  # no-op once done; stops the generation on any early exit


async def _watch_disconnect(request, ticket: Ticket) -> None:
    while not ticket.cancel.is_set():
        if await request.is_disconnected():
            ticket.cancel.set()
            return
        await asyncio.sleep(0.1)


async def _sse(ticket: Ticket, engine: Engine):
    """Server-sent events in OpenAI's chunk format, ending with [DONE]; an error ends the stream with an
    {"error": ...} event. A client that goes away cancels the generation (the worker stops within a round)."""
    job, sent, before = ticket.job, 0, []
    held = [] if job.tool_mode is not None else None  # with tools in play the text is read for calls at the end
    try:
        if job.kind == "chat":
            yield sse_event(stream_chunk(job, None, None, first=True))
        while True:
            try:
                kind, value = await _next(ticket, engine)
            except ApiError as exc:
                yield sse_event(exc.body())
                break
            if kind == "text" and held is not None:
                held.append(value)
            elif kind == "text":
                sent += len(value)
                yield sse_event(stream_chunk(job, value, None))
            elif kind == "logprobs":
                lp = logprobs_field(job, value, ticket.stream.generator.codec, before, sent)
                yield sse_event(stream_chunk(job, "", None, logprobs=lp))
            elif kind == "error":
                yield sse_event(failed_error(value).body())
                break
            else:
                finish = finish_reason_of(value)
                if held is not None:
                    message, finish = answer(job, "".join(held), finish)
                    if "tool_calls" in message:
                        calls = [dict(c, index=k) for k, c in enumerate(message["tool_calls"])]
                        chunk = stream_chunk(job, None, None)
                        chunk["choices"][0]["delta"] = {"content": message["content"], "tool_calls": calls}
                        yield sse_event(chunk)
                    elif message["content"]:
                        yield sse_event(stream_chunk(job, message["content"], None))
                yield sse_event(stream_chunk(job, None if job.kind == "chat" else "", finish,
                                             extra={"ortspec": value.stats}))
                if job.include_usage:
                    usage = stream_chunk(job, None, None, extra={"usage": usage_of(value)})
                    usage["choices"] = []
                    yield sse_event(usage)
                break
        yield sse_event(b"[DONE]")
    finally:
        ticket.cancel.set()


# -- the command ---------------------------------------------------------------------------------------------------

def build_engine(bundle: str, drafter: str | None = None, num_draft_tokens: int | str | None = None,
                 provider: str = "cpu", threads: int | None = None, draft_window: int | None = 512,
                 draft_kv: str = "auto", max_queue: int = 32, parallel: int | str = "auto",
                 request_timeout: float = 600.0, model_id: str | None = None,
                 default_max_tokens: int = 1024, batch: bool = True) -> Engine:
    """Check the server's settings, load the bundle and start its Engine (``serve``, and each replica of
    ``ortspec.replicas``). ``drafter`` and ``num_draft_tokens`` left out (None) are the bundle's defaults;
    ``batch`` False runs each request's target pass on its own (Engine)."""
    from pathlib import Path
    if not is_int(max_queue, 0):
        raise ValueError(f"--max-queue must be an integer >= 0, got {max_queue!r}")
    if not request_timeout > 0:
        raise ValueError(f"--request-timeout must be > 0 seconds, got {request_timeout!r}")
    if not is_int(default_max_tokens, 1):
        raise ValueError(f"--default-max-tokens must be an integer >= 1, got {default_max_tokens!r}")
    if parallel != "auto" and not is_int(parallel, 1):
        raise ValueError(f"--parallel must be 'auto' or an integer >= 1, got {parallel!r}")
    if num_draft_tokens is not None:
        SpeculationConfig(num_draft_tokens)  # checked before the (slow) load
    gen = SpeculativeGenerator.load(bundle, provider=provider, drafter=drafter, threads=threads,
                                    draft_window=draft_window, draft_kv=draft_kv, thread_pool="shared")
    if parallel == "auto":
        parallel = default_parallel(gen)
    engine = Engine(gen, model_id or Path(bundle).resolve().name, max_queue=max_queue, timeout_s=request_timeout,
                    default_gamma=num_draft_tokens, default_max_tokens=default_max_tokens, parallel=parallel,
                    batch=batch)
    log.info("%d request(s) at once (--parallel), %d more may wait (--max-queue)", parallel, max_queue)
    return engine


def serve(bundle: str, host: str = "127.0.0.1", port: int = 8000, max_body: int = DEFAULT_MAX_BODY,
          api_key: str | None = None, ready=None, **settings) -> None:
    """Load a bundle and serve it until interrupted. ``ready(url)`` is called once the socket listens;
    ``settings`` are ``build_engine``'s (drafter, num_draft_tokens, provider, threads, draft_window, draft_kv,
    max_queue, parallel, request_timeout, model_id, default_max_tokens, batch)."""
    try:
        import uvicorn
        import starlette  # noqa: F401
    except ImportError as exc:
        raise OrtspecError(f"serve needs the serve extra ({exc.name} is missing): pip install 'ortspec[serve]'") \
            from None
    import socket
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {port!r}")
    if not is_int(max_body, 1024):
        raise ValueError(f"--max-body-bytes must be an integer >= 1024, got {max_body!r}")
    if api_key is not None and not api_key:
        raise ValueError("--api-key must not be empty")
    engine = build_engine(bundle, **settings)
    app = create_app(engine, api_key=api_key, max_body=max_body)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OrtspecError(f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port") from None
    sock.listen(128)
    bound = sock.getsockname()[1]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{bound}"
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    if ready is not None:
        ready(url)
    server.run(sockets=[sock])
