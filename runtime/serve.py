"""`ortspec serve`: an OpenAI-compatible HTTP server over one SpeculativeGenerator.

A layer above the public Python API (``stream``): requests are checked on the
event loop, then run one at a time, first come first served, on one worker
thread that owns the generator. Needs the ``serve`` extra (starlette, uvicorn).

Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
GET /v1/models/{id}, GET /health, GET /metrics (Prometheus). Errors are OpenAI-style JSON bodies.
"""
from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
import hmac
import json
import logging
import threading
import time

from .checks import is_int
from .config import SpeculationConfig
from .constrain import ConstraintError
from .errors import OrtspecError
from .generator import SpeculativeGenerator
from .metrics import Metrics
from .tools import CallWatch, held_format, tool_style
from .wire import (DEFAULT_MAX_BODY, ApiError, Job, Outcome, StopText, answer, failed_error, finish_reason_of,
                   logprobs_field, parse_request, response_body, sse_event, stream_chunk, usage_of)

log = logging.getLogger("ortspec.serve")


# -- the one generator, one request at a time ----------------------------------------------------------------

class Ticket:
    """A running or waiting request: the worker pushes ("text", str), then ("done", outcome) or ("error", exc)."""

    def __init__(self, job: Job, stream, loop: asyncio.AbstractEventLoop):
        self.job, self.stream, self.loop = job, stream, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancel = threading.Event()
        self.admitted = time.perf_counter()

    def put(self, item) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class Engine:
    """Runs tickets one after another on a single worker thread, in arrival order."""

    def __init__(self, gen: SpeculativeGenerator, model_id: str, max_queue: int = 32,
                 timeout_s: float = 600.0, default_gamma: int | str | None = None, default_max_tokens: int = 1024):
        self.gen, self.model_id, self.default_max_tokens = gen, model_id, default_max_tokens
        self.max_queue, self.timeout_s = max_queue, timeout_s
        self.default_gamma = gen.default_num_draft_tokens if default_gamma is None else default_gamma  # (the bundle's)
        offered = (("model", "hybrid") if gen.drafter.lm is not None else ()) + ("prompt_lookup", "none")
        self.drafters = (gen.drafter.name,) + tuple(d for d in offered if d != gen.drafter.name)
        self._siblings = {gen.drafter.name: gen}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ortspec-generate")
        self._count_lock = threading.Lock()
        self._live: set = set()  # tickets admitted and not finished: waiting + running
        self.running = False
        self.served = 0
        self.cancelled = 0
        self.last: dict | None = None
        self.created = int(time.time())
        self.metrics = Metrics(model_id)

    def generator(self, drafter: str | None) -> SpeculativeGenerator:
        name = drafter or self.gen.drafter.name
        if name not in self._siblings:
            self._siblings[name] = self.gen.sibling(name)
        return self._siblings[name]

    def open(self, job: Job):
        """Check a job against the model (prompt, context length) without running it: a _Stream."""
        gen = self.generator(job.drafter)
        opts = dict(job.options)
        if opts["num_draft_tokens"] is None:
            opts["num_draft_tokens"] = self.default_gamma
        source = job.source
        if job.tools is not None and gen.codec is not None:
            job.tool_style = tool_style(gen.codec.chat_template)
            held = held_format(job.tools, job.tool_mode, gen.codec.chat_template, opts.get("response_format"),
                               job.parallel_calls)
            if held is not None:
                opts["response_format"] = held
            if job.tool_mode is None and job.tool_style == "generic":  # "none": no functions offered in the prompt
                source = {k: v for k, v in source.items() if k != "tools"}
        if gen.codec is None and "input_ids" not in job.source:
            raise ApiError(400, "this model has no tokenizer: send prompt as a list of token ids to /v1/completions",
                           "prompt")
        capacity, param = gen.target.capacity, "messages" if job.kind == "chat" else "prompt"
        try:
            ids = gen.encode_prompt(**source)
        except (ValueError, OrtspecError) as exc:
            raise ApiError(400, str(exc), param) from None
        if len(ids) > capacity:
            raise ApiError(400, f"the prompt is {len(ids)} tokens; this model's context is {capacity} tokens",
                           param, "context_length_exceeded")
        room = capacity - len(ids) + 1  # the last new token is never fed
        if job.max_tokens is not None and job.max_tokens > room:
            raise ApiError(400, f"this model's context is {capacity} tokens; the prompt uses {len(ids)}, so "
                                f"max_tokens can be at most {room}, got {job.max_tokens}",
                           "max_tokens", "context_length_exceeded")
        try:
            return gen.stream(input_ids=ids, **opts,
                              max_new_tokens=job.max_tokens or min(room, self.default_max_tokens))
        except (ValueError, OrtspecError) as exc:
            raise ApiError(400, str(exc), "response_format" if isinstance(exc, ConstraintError) else None) from None

    def submit(self, job: Job, stream, loop) -> Ticket:
        ticket = Ticket(job, stream, loop)
        with self._count_lock:
            if len(self._live) > self.max_queue:  # one running + max_queue waiting
                self.metrics.rejected()
                raise ApiError(429, f"the server is busy: {self.max_queue} requests are already waiting "
                                    "(--max-queue); retry later", code="queue_full")
            self._live.add(ticket)
        self._pool.submit(self._run, ticket)
        return ticket

    def _run(self, ticket: Ticket) -> None:
        try:
            if ticket.cancel.is_set():  # gave up (disconnect, timeout) while waiting
                ticket.stream.close()
                self.metrics.finished("cancelled", len(ticket.stream.prompt_ids))
                self._finish(ticket, Outcome("cancelled", len(ticket.stream.prompt_ids), 0, {}, 0.0))
                return
            self.running = True
            self._generate(ticket)
        except Exception as exc:  # reported to the client as a 500 without a traceback; logged in full
            log.exception("generation failed")
            self.metrics.finished("error", len(ticket.stream.prompt_ids))
            ticket.put(("error", exc))
        finally:
            self.running = False
            with self._count_lock:
                self._live.discard(ticket)

    def _generate(self, ticket: Ticket) -> None:
        stream, stop, watch = ticket.stream, StopText(ticket.job.stop), _call_watch(ticket.job)
        tokens, reason, t0 = 0, None, time.perf_counter()
        try:
            for ev in stream:
                tokens += len(ev.token_ids)
                if ev.logprobs:  # (every token generated, up to the one that completes a stop string)
                    ticket.put(("logprobs", ev.logprobs))
                text, hit = stop.push(ev.text)
                looped = watch is not None and watch.push(text)  # a held answer is read whole at the end
                if text and watch is None:
                    ticket.put(("text", text))
                if hit or looped:
                    reason = "stop"
                    break
                if ticket.cancel.is_set():
                    reason = "cancelled"
                    break
        finally:
            stream.close()  # ends the generation and releases the generator's lock
        stats, why = stream.result
        if reason is None:
            tail = stop.flush()
            if tail and watch is not None:
                watch.push(tail)
            elif tail:
                ticket.put(("text", tail))
            reason = "length" if why == "length" else "stop"
        if watch is not None:
            ticket.put(("text", watch.text))
        seconds = time.perf_counter() - t0
        self.metrics.finished(reason, len(stream.prompt_ids), stats, stream.generator.drafter.name, seconds)
        self._finish(ticket, Outcome(reason, len(stream.prompt_ids), tokens, _stats_field(stats, ticket), seconds))

    def _finish(self, ticket: Ticket, outcome: Outcome) -> None:
        self.served += 1
        self.cancelled += outcome.finish_reason == "cancelled"
        self.last = {"id": ticket.job.id, "finish_reason": outcome.finish_reason,
                     "prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens}
        s = outcome.stats
        log.info("%s %s: %d prompt + %d new tokens in %.2f s (first after %.2f s), %.1f tok/s, acceptance %s, "
                 "%.2f tokens/round, finish %s%s", ticket.job.kind, ticket.job.id, outcome.prompt_tokens,
                 outcome.completion_tokens, outcome.seconds, s.get("time_to_first_token_s", 0.0),
                 s.get("tokens_per_s", 0.0), f"{s['acceptance_rate']:.0%}" if s.get("drafted") else "-",
                 s.get("tokens_per_round", 0.0), outcome.finish_reason,
                 f"; draft disabled: {s['draft_error']}" if s.get("draft_disabled") else "")
        ticket.put(("done", outcome))

    def metrics_text(self) -> str:
        """GET /metrics: Prometheus' text format."""
        running = int(self.running)
        return self.metrics.text(running, max(0, len(self._live) - running), self.max_queue)

    def health(self) -> dict:
        return {"status": "ok", "model": self.model_id, "running": int(self.running),
                "waiting": max(0, len(self._live) - int(self.running)), "max_queue": self.max_queue,
                "served": self.served, "cancelled": self.cancelled, "last": self.last}

    def close(self) -> None:
        """Server shutdown: stop the running generation within a round and drop the waiting ones."""
        with self._count_lock:
            live = list(self._live)
        for ticket in live:
            ticket.cancel.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _call_watch(job: Job) -> CallWatch | None:
    """What ends a small model's loop in an answer held to calls (tools.CallWatch); None where the answer is not
    held to calls (text, or "auto" on a template with a tool form of its own)."""
    if job.tool_mode is None or job.tools is None:
        return None
    if job.tool_style == "generic":
        return CallWatch("generic", job.tools)
    if job.tool_mode != "auto":
        return CallWatch("call", job.tools)
    return CallWatch("tags", job.tools) if job.tool_style == "tags" else None


def _stats_field(stats, ticket: Ticket) -> dict:
    """Speculative statistics of one request: the response's "ortspec" field."""
    return {"drafter": ticket.stream.generator.drafter.name, "rounds": stats.rounds, "drafted": stats.drafted,
            "accepted": stats.accepted, "acceptance_rate": round(stats.acceptance_rate, 4),
            "tokens_per_round": round(stats.tokens_per_round, 4),
            "mean_draft_tokens": round(stats.drafted / stats.rounds, 4) if stats.rounds else 0.0,
            "tokens_per_s": round(stats.tokens_per_s, 2), "time_to_first_token_s": round(stats.first_token_s, 4),
            "draft_disabled": stats.draft_disabled, "draft_error": stats.draft_error,
            "prediction_accepted": stats.prediction_accepted, "prediction_rejected": stats.prediction_rejected}


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

def serve(bundle: str, host: str = "127.0.0.1", port: int = 8000, drafter: str | None = None,
          num_draft_tokens: int | str | None = None, provider: str = "cpu", threads: int | None = None,
          draft_window: int | None = 512, draft_kv: str = "auto", max_queue: int = 32,
          request_timeout: float = 600.0, api_key: str | None = None,
          model_id: str | None = None, max_body: int = DEFAULT_MAX_BODY, default_max_tokens: int = 1024,
          ready=None) -> None:
    """Load a bundle and serve it until interrupted. ``ready(url)`` is called once the socket listens.
    ``drafter`` and ``num_draft_tokens`` left out (None) are the bundle's defaults (``SpeculativeGenerator``)."""
    try:
        import uvicorn
        import starlette  # noqa: F401
    except ImportError as exc:
        raise OrtspecError(f"serve needs the serve extra ({exc.name} is missing): pip install 'ortspec[serve]'") \
            from None
    import socket
    from pathlib import Path
    if not is_int(max_queue, 0):
        raise ValueError(f"--max-queue must be an integer >= 0, got {max_queue!r}")
    if not request_timeout > 0:
        raise ValueError(f"--request-timeout must be > 0 seconds, got {request_timeout!r}")
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {port!r}")
    if not is_int(default_max_tokens, 1):
        raise ValueError(f"--default-max-tokens must be an integer >= 1, got {default_max_tokens!r}")
    if not is_int(max_body, 1024):
        raise ValueError(f"--max-body-bytes must be an integer >= 1024, got {max_body!r}")
    if api_key is not None and not api_key:
        raise ValueError("--api-key must not be empty")
    if num_draft_tokens is not None:
        SpeculationConfig(num_draft_tokens)  # checked before the (slow) load
    gen = SpeculativeGenerator.load(bundle, provider=provider, drafter=drafter, threads=threads,
                                    draft_window=draft_window, draft_kv=draft_kv, thread_pool="shared")
    model_id = model_id or Path(bundle).resolve().name
    engine = Engine(gen, model_id, max_queue=max_queue, timeout_s=request_timeout, default_gamma=num_draft_tokens,
                    default_max_tokens=default_max_tokens)
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
