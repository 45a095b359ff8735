"""OpenAI's wire format for `ortspec serve`: requests checked into jobs, responses and stream chunks shaped."""
from __future__ import annotations

from dataclasses import dataclass, field
import json
import math
import time
import uuid

from .checks import is_int, is_number
from .config import SpeculationConfig
from .tools import check_choice, check_tools, cut_inside_call, read_calls

MAX_STOP = 4                 # stop strings per request, as OpenAI allows
DEFAULT_MAX_BODY = 4 << 20   # bytes
DRAFTER_NAMES = {"model": "model", "hybrid": "hybrid", "prompt_lookup": "prompt_lookup",
                 "prompt-lookup": "prompt_lookup", "none": "none"}
# Fields a client may send that change output in ways ortspec does not implement: refused, not ignored.
UNSUPPORTED = {
    "functions": "functions are OpenAI's older form of tools; send tools",
    "function_call": "function calls are not supported",
    "suffix": "suffix (insertion) is not supported",
    "audio": "audio output is not supported",
}


class ApiError(Exception):
    """A request the server answers with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                             413: "invalid_request_error", 429: "rate_limit_error",
                             504: "timeout_error"}.get(status, "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# -- request parsing (pure functions: body dict -> Job, or ApiError) -------------------------------------------

@dataclass
class Job:
    """One checked request: what to generate and how to answer."""

    kind: str                       # "chat" | "completion"
    source: dict                    # prompt=..., messages=... or input_ids=... for SpeculativeGenerator.stream
    options: dict                   # the rest of stream()'s keyword arguments
    drafter: str | None
    stop: list[str]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    model: str = ""
    tools: list | None = None       # function definitions (chat), checked
    tool_mode: str | None = None    # None (text), "auto", "required" or the name of the function to call
    tool_style: str = "tags"        # how the model's chat template meets tools (tools.tool_style), once opened
    parallel_calls: bool | None = None  # OpenAI's parallel_tool_calls (None: not said; tools.held_format)
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _number(body: dict, name: str, low: float | None = None, high: float | None = None,
            low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not is_number(value):
        raise ApiError(400, f"{name} must be a number, got {value!r}", name)
    if low is not None and (value <= low if low_open else value < low):
        raise ApiError(400, f"{name} must be {'>' if low_open else '>='} {low}, got {value}", name)
    if high is not None and value > high:
        raise ApiError(400, f"{name} must be <= {high}, got {value}", name)
    return float(value)


def _integer(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value, low, high):
        bound = f" and <= {high}" if high is not None else ""
        raise ApiError(400, f"{name} must be an integer >= {low}{bound}, got {value!r}", name)
    return value


def _boolean(body: dict, name: str, default: bool | None = False) -> bool | None:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {value!r}", name)
    return value


def parse_request(body, kind: str, model_id: str, drafters: tuple[str, ...]) -> Job:
    """Check a /v1/chat/completions (kind "chat") or /v1/completions ("completion") body."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != model_id:
        raise ApiError(400, f"model {model!r} is not served here; this server serves {model_id!r} "
                            "(GET /v1/models lists it)", "model", "model_not_found")
    for name, why in UNSUPPORTED.items():
        if body.get(name) not in (None, [], {}):
            raise ApiError(400, f"{name}: {why}", name, "unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        if _number(body, name) not in (None, 0.0):
            raise ApiError(400, f"{name} is not supported; use repetition_penalty (Hugging Face semantics, "
                                "> 1 discourages repeats)", name, "unsupported_parameter")
    n = body.get("n", 1)
    if n not in (None, 1) or isinstance(n, bool):
        raise ApiError(400, f"n must be 1 (one choice per request), got {n!r}", "n")
    best_of = body.get("best_of", 1)
    if best_of not in (None, 1) or isinstance(best_of, bool):
        raise ApiError(400, f"best_of must be 1, got {best_of!r}", "best_of")
    response_format = _response_format(body.get("response_format"))
    if _boolean(body, "echo"):
        raise ApiError(400, "echo is not supported", "echo", "unsupported_parameter")

    if kind == "chat":
        messages = body.get("messages")
        if "prompt" in body:
            raise ApiError(400, "/v1/chat/completions takes messages, not prompt (use /v1/completions)", "prompt")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list of {\"role\": ..., \"content\": ...}", "messages")
        source = {"messages": messages}
        tools, tool_mode = _tools(body)
        if tools is not None:
            source["tools"] = tools
        parallel = _boolean(body, "parallel_tool_calls", None)
    else:
        tools = tool_mode = parallel = None
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if body.get(name) is not None:
                raise ApiError(400, f"{name} is for /v1/chat/completions", name)
        if "messages" in body:
            raise ApiError(400, "/v1/completions takes prompt, not messages (use /v1/chat/completions)",
                           "messages")
        source = {"prompt": _prompt(body.get("prompt"))} if not _is_ids(body.get("prompt")) \
            else {"input_ids": _ids(body.get("prompt"))}

    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    temperature = _number(body, "temperature", 0.0)
    top_p = _number(body, "top_p", 0.0, 1.0, low_open=True)
    top_k = _integer(body, "top_k", 0)
    penalty = _number(body, "repetition_penalty", 0.0, low_open=True)
    seed = _integer(body, "seed", 0)
    if temperature == 0.0:
        do_sample, temperature = False, None
    elif temperature is not None or top_p is not None or top_k is not None:
        do_sample = True  # asking for a temperature or a truncation asks for sampling
    else:
        do_sample = None  # silent: the bundle's generation config decides
    options = dict(do_sample=do_sample, temperature=temperature, top_p=top_p, top_k=top_k,
                   repetition_penalty=penalty, seed=seed, num_draft_tokens=_gamma(body.get("num_draft_tokens")))
    if tool_mode not in (None, "auto") and response_format is not None:  # the answer is held to the call's schema
        raise ApiError(400, "response_format cannot be combined with a required tool call (tool_choice)",
                       "response_format")
    if response_format is not None:
        options["response_format"] = response_format
    bias = body.get("logit_bias")
    if bias is not None:
        options["logit_bias"] = _logit_bias(bias)
    prediction = _prediction(body.get("prediction"))
    if prediction:
        options["prediction"] = prediction
    logprobs = _logprobs(body, kind)
    if logprobs is not None:
        options["logprobs"] = logprobs
    if _boolean(body, "ignore_eos"):
        options["eos_token_id"] = []
    drafter = body.get("drafter")
    if drafter is not None:
        if DRAFTER_NAMES.get(drafter) not in drafters:
            raise ApiError(400, f"drafter must be one of {', '.join(drafters)} on this server, got {drafter!r}",
                           "drafter")
        drafter = DRAFTER_NAMES[drafter]
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    stream = _boolean(body, "stream")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or not stream):
        raise ApiError(400, "stream_options must be an object, and only with stream: true", "stream_options")
    include_usage = bool(opts and opts.get("include_usage") is True)
    return Job(kind, source, options, drafter, stop, max_tokens, stream, include_usage, model_id, tools, tool_mode,
               parallel_calls=parallel)


def _prediction(value) -> str | None:
    """OpenAI's Predicted Outputs: {"type": "content", "content": text or [{"type": "text", "text": ...}, ...]}
    (a bare string is taken too); the predicted text, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, dict) or value.get("type") != "content" or "content" not in value:
        raise ApiError(400, 'prediction must be {"type": "content", "content": text or a list of text parts}',
                       "prediction")
    content = value["content"]
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ApiError(400, "prediction.content must be text or a list of {\"type\": \"text\", \"text\": ...} parts",
                   "prediction")


def _tools(body: dict) -> tuple[list | None, str | None]:
    """Checked ``tools`` and what ``tool_choice`` asks of the answer (see tools.check_choice)."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw in (None, []):
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools", "tool_choice")
        return None, None
    try:
        tools = check_tools(raw)
    except ValueError as exc:
        raise ApiError(400, str(exc), "tools") from None
    try:
        return tools, check_choice(choice, tools)
    except ValueError as exc:
        raise ApiError(400, str(exc), "tool_choice") from None


def answer(job: Job, text: str, finish: str) -> tuple[dict, str]:
    """A chat answer's message and finish reason: with tools in play, the calls read from the text (finish
    "tool_calls"); an answer that ``max_tokens`` cut inside a call finishes "length" with the calls it had
    finished, never the unfinished one's text."""
    if job.tool_mode is None:
        return {"role": "assistant", "content": text}, finish
    generic, call_only = job.tool_style == "generic", job.tool_mode != "auto"
    content, calls = read_calls(text, job.tools, generic=generic, call_only=call_only)
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    if finish == "length" and cut_inside_call(text, generic, call_only):
        return message, "length"
    return message, "tool_calls" if calls else finish


FORMATS = '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": {...}}}'


def _response_format(fmt):
    """OpenAI's response_format as stream() takes it: None (text), "json" (any JSON object) or a JSON schema.
    A schema is always held strictly (the answer cannot leave it), whatever ``strict`` says."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, dict) and schema:
            return schema
        if isinstance(spec, dict) and schema is None:
            return "json"  # a schema object without a schema: any JSON object
    raise ApiError(400, f"response_format must be {FORMATS}, got {json.dumps(fmt)[:120]}", "response_format")


def _logit_bias(value) -> dict:
    """OpenAI's logit_bias, {"token id": bias}, as {int: bias} (the biases are checked with the other settings)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.isdigit() for k in value):
        raise ApiError(400, "logit_bias must be an object mapping token ids (\"42\") to biases in [-100, 100]",
                       "logit_bias")
    return {int(k): v for k, v in value.items()}


def _logprobs(body: dict, kind: str) -> int | None:
    """Alternatives per token the answer reports (None: no log-probabilities). Chat: ``logprobs`` true with
    ``top_logprobs`` 0..20; completions: ``logprobs`` 0..20."""
    if kind == "chat":
        top = _integer(body, "top_logprobs", 0, 20)
        if not _boolean(body, "logprobs"):
            if top is not None:
                raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return top or 0
    value = body.get("logprobs")
    if value is None or value is False:
        return None
    return _integer(body, "logprobs", 0, 20)


TEXT_WINDOW = 16  # tokens before a token that its text is decoded after (spaces and bytes join with them)


def logprobs_field(job: Job, entries: list, codec, before: list[int], offset: int = 0) -> dict:
    """OpenAI's ``logprobs`` of a choice for TokenLogprob entries: chat's ``content`` list, or the completions
    API's parallel lists (``text_offset`` from ``offset``, the characters before these tokens). A token's text is
    what it adds after the tokens ``before`` it (the answer's earlier tokens: extended here), so that the texts of
    an answer's tokens join into its text."""
    window: list[int] = before[-TEXT_WINDOW:]

    def text(t: int) -> str:
        if codec is None:
            return str(t)
        return codec.decode(window + [t])[len(codec.decode(window)) if window else 0:]

    def value(lp: float) -> float:  # a token of probability 0 (past top-k or top-p) as OpenAI writes one
        return lp if math.isfinite(lp) else -9999.0

    if job.kind == "chat":
        def one(t: int, lp: float) -> dict:
            s = text(t)
            return {"token": s, "logprob": value(lp), "bytes": list(s.encode())}
        content = []
        for e in entries:
            content.append(dict(one(e.token_id, e.logprob), top_logprobs=[one(i, v) for i, v in e.top]))
            window = (window + [e.token_id])[-TEXT_WINDOW:]
            before.append(e.token_id)
        return {"content": content, "refusal": None}
    tokens, tops = [], []
    for e in entries:
        tokens.append(text(e.token_id))
        tops.append({text(i): value(v) for i, v in e.top})
        window = (window + [e.token_id])[-TEXT_WINDOW:]
        before.append(e.token_id)
    offsets, at = [], offset
    for s in tokens:
        offsets.append(at)
        at += len(s)
    return {"tokens": tokens, "token_logprobs": [value(e.logprob) for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


def _gamma(value):
    if value is None:
        return None
    if value == "auto":
        return "auto"
    if not is_int(value, 0, SpeculationConfig.max_draft_tokens):
        raise ApiError(400, f"num_draft_tokens must be an integer in [0, {SpeculationConfig.max_draft_tokens}] "
                            f"or \"auto\", got {value!r}", "num_draft_tokens")
    return value


def _is_ids(prompt) -> bool:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    return isinstance(prompt, list) and bool(prompt) and all(is_int(t) for t in prompt)


def _ids(prompt) -> list[int]:
    return list(prompt[0] if isinstance(prompt[0], list) else prompt)


def _prompt(prompt) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise ApiError(400, "prompt must be one string or one list of token ids (one prompt per request)", "prompt")
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be a non-empty string", "prompt")
    return prompt


# -- stop strings ------------------------------------------------------------------------------------------------

class StopText:
    """Cuts streamed text at the first stop string, holding back a tail that could begin one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.pending = ""

    def push(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was reached (the text ends before it)."""
        buf = self.pending + text
        if not self.stops:
            return buf, False
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[:min(hits)], True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self.pending = buf[len(buf) - hold:]
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out



def failed_error(exc: Exception) -> ApiError:
    return ApiError(500, f"generation failed ({type(exc).__name__}: {exc})")


def finish_reason_of(outcome: Outcome) -> str:
    return "length" if outcome.finish_reason == "length" else "stop"


def usage_of(outcome: Outcome) -> dict:
    """OpenAI's usage, and the request's speculation under "speculation" (drafted, accepted, acceptance rate)."""
    s = outcome.stats
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": s.get("cached_prompt_tokens", 0)},
            "completion_tokens_details": {"accepted_prediction_tokens": s.get("prediction_accepted", 0),
                                          "rejected_prediction_tokens": s.get("prediction_rejected", 0)},
            "speculation": {"drafter": s.get("drafter"), "drafted": s.get("drafted", 0),
                            "accepted": s.get("accepted", 0), "acceptance_rate": s.get("acceptance_rate", 0.0)}}


def envelope(job: Job, choice: dict, chunk: bool, **extra) -> dict:
    """An OpenAI response or stream chunk around one choice."""
    chat = job.kind == "chat"
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": ("chatcmpl-" if chat else "cmpl-") + job.id, "object": obj, "created": job.created,
            "model": job.model, "choices": [{"index": 0, "logprobs": None, **choice}], **extra}


def response_body(job: Job, text: str, outcome: Outcome, logprobs: dict | None = None) -> dict:
    finish = finish_reason_of(outcome)
    if job.kind == "chat":
        message, finish = answer(job, text, finish)
        body = {"message": message}
    else:
        body = {"text": text}
    if logprobs is not None:
        body["logprobs"] = logprobs
    return envelope(job, dict(body, finish_reason=finish), False, usage=usage_of(outcome), ortspec=outcome.stats)


def stream_chunk(job: Job, text: str | None, finish: str | None, first: bool = False, extra: dict | None = None,
                 logprobs: dict | None = None) -> dict:
    if job.kind == "chat":
        delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text is not None else {})
        body = {"delta": delta}
    else:
        body = {"text": text or ""}
    if logprobs is not None:
        body["logprobs"] = logprobs
    return envelope(job, dict(body, finish_reason=finish), True, **(extra or {}))


def sse_event(data) -> bytes:
    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data, ensure_ascii=False).encode()) + b"\n\n"


@dataclass
class Outcome:
    finish_reason: str      # stop | length | cancelled
    prompt_tokens: int
    completion_tokens: int
    stats: dict
    seconds: float
