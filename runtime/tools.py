"""Tool calls: function definitions checked, the JSON schema a forced call is held to, calls read from an answer.

Chat templates come in three kinds (``tool_style``): "tags" write calls in ``<tool_call>`` tags (Hermes,
Qwen2.5), "template" show the tools in a form of their own, and "generic" never show tools at all (SmolLM2,
many small models). For the last, the tools are described in a system message and the answer is one JSON object:
``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` or ``{"response": ...}`` (``generic_messages``,
``generic_format``), which the server holds and reads.
"""
from __future__ import annotations

import json
import re
import uuid

from .constrain import closed_objects

CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)  # Hermes / Qwen2.5 style


def check_tools(tools) -> list[dict]:
    """OpenAI's ``tools`` ([{"type": "function", "function": {"name", "description", "parameters"}}]) as the chat
    template and the call schema read them; ValueError naming the entry otherwise."""
    if not isinstance(tools, list) or not tools:
        raise ValueError("tools must be a non-empty list of {\"type\": \"function\", \"function\": {...}}")
    out, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise ValueError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}} with a "
                             "name of letters, digits, _ . - (at most 64)")
        if name in names:
            raise ValueError(f"tools[{i}]: the function name {name!r} appears twice")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        names.add(name)
        out.append({"type": "function", "function": dict(fn, parameters=params)})
    return out


def check_choice(choice, tools: list[dict]) -> str | None:
    """``tool_choice`` as what the answer must be: None (text: "none"), "auto" (text or calls), or the name of
    the one function to call ("required" with one tool, or a named function); "required" with several tools is
    "required"."""
    names = [t["function"]["name"] for t in tools]
    if choice is None or choice == "auto":
        return "auto"
    if choice == "none":
        return None
    if choice == "required":
        return names[0] if len(names) == 1 else "required"
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if name not in names:
        raise ValueError(f"tool_choice must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                         f"\"function\": {{\"name\": one of {names}}}}}, got {json.dumps(choice)[:120]}")
    return name


def call_schema(tools: list[dict], name: str) -> dict:
    """The JSON schema of one call, {"name": ..., "arguments": {...}}: of the function ``name``, or of any of
    them ("required"). Compact JSON (no free whitespace: the arguments are re-serialized anyway), so that every
    key, quote and bracket is forced: free drafts."""
    return _compact(_one_call(tools, name))


def _one_call(tools: list[dict], name: str) -> dict:
    def one(tool: dict) -> dict:
        fn = tool["function"]
        return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                                 "arguments": closed_objects(fn["parameters"])},
                "required": ["name", "arguments"], "additionalProperties": False}
    chosen = [one(t) for t in tools if name == "required" or t["function"]["name"] == name]
    return chosen[0] if len(chosen) == 1 else {"anyOf": chosen}


def _compact(schema: dict) -> dict:
    return dict(schema, **{"x-guidance": {"whitespace_flexible": False}})


def _only(key: str, schema: dict) -> dict:
    return {"type": "object", "properties": {key: schema}, "required": [key], "additionalProperties": False}


def tool_style(chat_template: str | None) -> str:
    """How a chat template meets tools: "tags" (it asks for calls in ``<tool_call>`` tags), "template" (it shows
    the tools to the model in a form of its own) or "generic" (it never shows them: they go in a system message
    and the answer is held to ``generic_format``)."""
    if uses_call_tags(chat_template):
        return "tags"
    return "template" if chat_template and re.search(r"\btools\b", chat_template) else "generic"


def held_format(tools: list[dict], mode: str | None, chat_template: str | None,
                answer: dict | str | None = None, parallel: bool = True) -> dict | None:
    """The response format a request's ``tool_choice`` (as ``check_choice`` reads it) holds the answer to on this
    chat template, ``answer`` being the request's own format for an answer that is not a call (None: text);
    ``parallel`` False (OpenAI's ``parallel_tool_calls``): at most one call. None where nothing is held
    (``"none"``; ``"auto"`` on a template with its own tool form)."""
    style = tool_style(chat_template)
    if mode is None:
        return answer
    if style == "generic":
        return generic_format(tools, mode, answer, parallel)
    if mode != "auto":
        return call_schema(tools, mode)
    return calls_or_answer(tools, answer, parallel) if style == "tags" else answer


def generic_format(tools: list[dict], mode: str, answer: dict | str | None = None, parallel: bool = True) -> dict:
    """The JSON an answer on a "generic" template is held to: ``{"tool_calls": [call, ...]}`` (each call held to
    ``call_schema``; only the function ``mode`` names, or any for "required" and "auto"; one call only unless
    ``parallel``) or, for "auto", also ``{"response": ...}``: a string, or a value of ``answer`` (``"json"``: any
    object)."""
    calls = _only("tool_calls", dict({"type": "array", "minItems": 1},
                                     items=_one_call(tools, "required" if mode == "auto" else mode),
                                     **({} if parallel else {"maxItems": 1})))
    if mode != "auto":
        return _compact(calls)
    said = {"type": "string"} if answer is None else {"type": "object"} if answer == "json" \
        else closed_objects(answer)
    return _compact({"anyOf": [calls, _only("response", said)]})


GENERIC_INSTRUCTION = """You can call these functions (each described as JSON):
{functions}

Reply with one JSON object and nothing else. To call functions: {{"tool_calls": [{{"name": "<function name>", \
"arguments": {{<the arguments>}}}}]}}. To reply without calling one: {{"response": "<your reply>"}}."""


def generic_messages(messages: list[dict], tools: list[dict] | None, system: bool = True) -> list[dict]:
    """A conversation (as ``text.check_messages`` returns it) for a template that never shows tools: the
    functions and the answer's JSON form in the system message (appended to the first one, or a new first
    one; with ``system`` False, before the first user turn's text, for templates that refuse a system message)
    when ``tools`` are given; earlier calls as the JSON an answer holds, and tool results as user turns
    (consecutive ones together), since such templates know neither."""
    names = {c.get("id"): c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out: list[dict] = []
    results = False  # the last turn written holds tool results (the next ones join it)
    for m in messages:
        if m["role"] == "tool":
            result = {"name": m.get("name") or names.get(m.get("tool_call_id"), ""), "content": m["content"]}
            line = json.dumps({"tool_response": result}, ensure_ascii=False)
            out.append({"role": "user", "content": out.pop()["content"] + "\n" + line if results else line})
        elif m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"])}
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        else:
            out.append(m)
        results = m["role"] == "tool"
    if tools:
        functions = "\n".join(json.dumps({k: t["function"][k] for k in ("name", "description", "parameters")
                                           if k in t["function"]}, ensure_ascii=False) for t in tools)
        said = GENERIC_INSTRUCTION.format(functions=functions)
        first_user = next((i for i, m in enumerate(out) if m["role"] == "user"), None)
        if out and out[0]["role"] == "system":
            out[0] = dict(out[0], content=out[0]["content"] + "\n\n" + said)
        elif system or first_user is None:
            out.insert(0, {"role": "system", "content": said})
        else:
            out[first_user] = dict(out[first_user], content=said + "\n\n" + out[first_user]["content"])
    return out


def uses_call_tags(chat_template: str | None) -> bool:
    """Whether a chat template asks for calls in ``<tool_call>`` tags (Hermes, Qwen2.5 and their kin)."""
    return bool(chat_template) and "<tool_call>" in chat_template


def calls_or_answer(tools: list[dict], answer: dict | str | None = None, parallel: bool = True) -> dict:
    """The response format of ``tool_choice: "auto"`` on a template that writes calls in ``<tool_call>`` tags:
    an answer — free text, or given ``answer`` a JSON value of that schema (``"json"``: any object) — or one or more calls, each
    ``<tool_call>\\n{call}\\n</tool_call>`` held to ``call_schema(tools, "required")`` (free text may come
    before the first; one call only unless ``parallel``). A text answer cannot hold the tag: once it is written,
    a call follows."""
    if answer is None:
        # TEXT: anything without the tag; LEAD: anything up to and including the first tag
        rules = ["start: TEXT? | LEAD calls",
                 r"TEXT: /(.|\n)+/ & ~/(.|\n)*<tool_call>(.|\n)*/",
                 r"LEAD: /(.|\n)*<tool_call>/ & ~/(.|\n)*<tool_call>(.|\n)+/"]
    else:
        answer = {"type": "object"} if answer == "json" else closed_objects(answer)
        rules = [f"start: %json {json.dumps(answer)} | \"<tool_call>\" calls"]
    more = ' (NL "<tool_call>" NL body NL "</tool_call>")*' if parallel else ""
    rules += ['calls: NL body NL "</tool_call>"' + more,
              f"body: %json {json.dumps(call_schema(tools, 'required'))}",
              r'NL: "\n"']
    return {"lark": "\n".join(rules) + "\n"}


def read_calls(text: str, tools: list[dict], generic: bool = False) -> tuple[str | None, list[dict]]:
    """The calls an answer makes — ``<tool_call>{...}</tool_call>`` blocks, or an answer that is one call as JSON —
    in OpenAI's shape, and the text outside them (None when there is none). ``generic``: the answer is
    ``generic_format``'s JSON (its calls, or its response as the text; an answer cut short keeps what the
    response had said)."""
    if generic:
        return _read_generic(text, tools)
    names = {t["function"]["name"] for t in tools}
    found = [(m.start(), m.end(), m.group(1)) for m in CALL_TAG.finditer(text)] or [(0, len(text), text)]
    calls, rest, at = [], [], 0
    for start, end, body in found:
        try:
            value = json.loads(body)
        except ValueError:
            continue
        call = _call(value, names)
        if call is None:
            continue
        calls.append(call)
        rest.append(text[at:start])
        at = end
    if not calls:
        return text, []
    rest.append(text[at:])
    outside = "".join(rest).strip()
    return outside or None, calls


def _call(value, names: set) -> dict | None:
    """One call in OpenAI's shape, from {"name": ..., "arguments": {...}} naming an offered function."""
    if not (isinstance(value, dict) and value.get("name") in names and isinstance(value.get("arguments"), dict)):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(value["arguments"])}}


RESPONSE_START = re.compile(r'\s*\{\s*"response"\s*:\s*"')


def _read_generic(text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
    names = {t["function"]["name"] for t in tools}
    try:
        value = json.loads(text)
    except ValueError:
        start = RESPONSE_START.match(text)  # cut short inside the response string: what it had said
        return (_string_prefix(text[start.end():]) if start else text), []
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        calls = [c for c in (_call(v, names) for v in value["tool_calls"]) if c is not None]
        if calls:
            return None, calls
    if isinstance(value, dict) and set(value) == {"response"}:
        said = value["response"]
        return (said if isinstance(said, str) else json.dumps(said, ensure_ascii=False)), []
    return text, []


def _string_prefix(body: str) -> str:
    """The text of a JSON string's opening part (no closing quote), an unfinished escape left out."""
    for cut in range(len(body), max(len(body) - 6, -1), -1):
        try:
            return json.loads('"' + body[:cut] + '"')
        except ValueError:
            continue
    return body


def template_messages(messages: list[dict]) -> list[dict]:
    """Assistant tool calls as chat templates read them: each call's arguments as an object, not a JSON string."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            m = dict(m, tool_calls=[dict(c, function=dict(c["function"], arguments=_arguments(c["function"])))
                                    for c in calls])
        out.append(m)
    return out


def _arguments(fn: dict):
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args
