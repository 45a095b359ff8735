"""Tool calls: function definitions checked, the JSON schema a forced call is held to, calls read from an answer.

Chat templates come in three kinds (``tool_style``): "tags" write calls in ``<tool_call>`` tags (Hermes,
Qwen2.5), "template" show the tools in a form of their own, and "generic" never show tools at all (SmolLM2,
many small models). For the last, the tools are described in a system message and the answer is one JSON object:
``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` or ``{"response": ...}`` (``generic_messages``,
``generic_format``), which the server holds and reads.

Every held answer ends: a named function is one call; on a generic template "required" and "auto" are one call
unless parallel calls are asked for; parallel calls are at most ``MAX_CALLS``, and a call that repeats an earlier
one (same function, same arguments: a small model's loop) ends the answer there (``CallWatch``) and is dropped
when the calls are read.
"""
from __future__ import annotations

import json
import re
import uuid

from .constrain import closed_objects

CALL_TAG = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)  # Hermes / Qwen2.5 style
MAX_CALLS = 8  # the calls one answer may hold where parallel calls are allowed


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
                answer: dict | str | None = None, parallel: bool | None = None) -> dict | None:
    """The response format a request's ``tool_choice`` (as ``check_choice`` reads it) holds the answer to on this
    chat template, ``answer`` being the request's own format for an answer that is not a call (None: text).
    ``parallel`` is OpenAI's ``parallel_tool_calls``: True allows up to ``MAX_CALLS`` calls, False one; None (the
    request does not say) allows one on a generic template (a small model shown no tool form repeats its first
    call; llama.cpp's server has the same rule) and several on one that writes calls in tags. A named function
    is always exactly one call. None where nothing is held (``"none"``; ``"auto"`` on a template with its own
    tool form)."""
    style = tool_style(chat_template)
    if mode is None:
        return answer
    if style == "generic":
        return generic_format(tools, mode, answer, parallel is True)
    if mode != "auto":
        return call_schema(tools, mode)
    return calls_or_answer(tools, answer, parallel is not False) if style == "tags" else answer


def generic_format(tools: list[dict], mode: str, answer: dict | str | None = None, parallel: bool = False) -> dict:
    """The JSON an answer on a "generic" template is held to: ``{"tool_calls": [call, ...]}`` (each call held to
    ``call_schema``; only the function ``mode`` names, or any for "required" and "auto") or, for "auto", also
    ``{"response": ...}``: a string, or a value of ``answer`` (``"json"``: any object). One call, or with
    ``parallel`` (and ``mode`` not a named function) up to ``MAX_CALLS``."""
    named = mode not in ("auto", "required")
    calls = _only("tool_calls", {"type": "array", "minItems": 1, "maxItems": MAX_CALLS if parallel and not named else 1,
                                 "items": _one_call(tools, "required" if mode == "auto" else mode)})
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
    before the first; one call only unless ``parallel``, then at most ``MAX_CALLS``). A text answer cannot hold the tag: once it is written,
    a call follows."""
    if answer is None:
        # TEXT: anything without the tag; LEAD: anything up to and including the first tag
        rules = ["start: TEXT? | LEAD calls",
                 r"TEXT: /(.|\n)+/ & ~/(.|\n)*<tool_call>(.|\n)*/",
                 r"LEAD: /(.|\n)*<tool_call>/ & ~/(.|\n)*<tool_call>(.|\n)+/"]
    else:
        answer = {"type": "object"} if answer == "json" else closed_objects(answer)
        rules = [f"start: %json {json.dumps(answer)} | \"<tool_call>\" calls"]
    more = f' (NL "<tool_call>" NL body NL "</tool_call>"){{0,{MAX_CALLS - 1}}}' if parallel else ""
    rules += ['calls: NL body NL "</tool_call>"' + more,
              f"body: %json {json.dumps(call_schema(tools, 'required'))}",
              r'NL: "\n"']
    return {"lark": "\n".join(rules) + "\n"}


def read_calls(text: str, tools: list[dict], generic: bool = False,
               call_only: bool = False) -> tuple[str | None, list[dict]]:
    """The calls an answer makes — ``<tool_call>{...}</tool_call>`` blocks, or an answer that is one call as JSON —
    in OpenAI's shape, and the text outside them (None when there is none). ``generic``: the answer is
    ``generic_format``'s JSON (its calls, or its response as the text). ``call_only``: the answer was held to
    calls alone (a named or required function), so no part of it is text. A call that repeats an earlier one
    (same function and arguments) is left out. An answer cut short (``max_tokens``) gives the calls it finished
    and the text it had said outside them, never the unfinished call."""
    names = {t["function"]["name"] for t in tools}
    outside, values = _read_generic(text) if generic else _read_tagged(text, call_only)
    calls, seen = [], set()
    for value in values:
        call = _call(value, names)
        key = call and (call["function"]["name"], _canonical(value["arguments"]))
        if call is not None and key not in seen:
            seen.add(key)
            calls.append(call)
    if values and not calls:  # JSON that names no offered function: the answer as it was said
        return (None if call_only else text), []
    return outside, calls


def _read_tagged(text: str, call_only: bool) -> tuple[str | None, list]:
    found = [(m.start(), m.end(), m.group(1)) for m in CALL_TAG.finditer(text)]
    values, rest, at = [], [], 0
    for start, end, body in found:
        try:
            value = json.loads(body)
        except ValueError:
            continue
        values.append(value)
        rest.append(text[at:start])
        at = end
    tail = text[at:]
    opened = tail.find("<tool_call>")
    if opened >= 0:  # a call cut short: what came before it is all that was said
        tail = tail[:opened]
    elif not found:  # an answer that is one call as JSON (a held call), or plain text
        value, whole = _json_prefix(text.strip())
        if whole and isinstance(value, dict):
            return None, [value]
        if call_only:  # a held call cut short
            return None, []
    rest.append(tail)
    outside = "".join(rest).strip()
    return outside or None, values


def _call(value, names: set) -> dict | None:
    """One call in OpenAI's shape, from {"name": ..., "arguments": {...}} naming an offered function."""
    if not (isinstance(value, dict) and value.get("name") in names and isinstance(value.get("arguments"), dict)):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": value["name"], "arguments": json.dumps(value["arguments"])}}


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _json_prefix(text: str):
    """The JSON value a text is (None when it is not one) and whether it is whole."""
    try:
        return json.loads(text), True
    except ValueError:
        return None, False


RESPONSE_START = re.compile(r'\s*\{\s*"response"\s*:\s*"')
CALLS_START = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[\s*')
_DECODER = json.JSONDecoder()


def _read_generic(text: str) -> tuple[str | None, list]:
    """The response's text and the call values of a generic answer, whole or cut short."""
    value, whole = _json_prefix(text)
    if whole and isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        return None, value["tool_calls"]
    if whole and isinstance(value, dict) and set(value) == {"response"}:
        said = value["response"]
        return (said if isinstance(said, str) else json.dumps(said, ensure_ascii=False)), []
    if whole:
        return text, []
    start = RESPONSE_START.match(text)  # cut short inside the response string: what it had said
    if start:
        return _string_prefix(text[start.end():]), []
    calls, _ = finished_calls(text)
    return None, calls  # cut short inside the calls: those it finished


def finished_calls(text: str) -> tuple[list, int]:
    """The call values a generic answer (``{"tool_calls": [...``) has finished so far, whole or cut short, and
    where the last of them ends in ``text``."""
    start = CALLS_START.match(text)
    if not start:
        return [], 0
    values, at = [], start.end()
    while True:
        try:
            value, end = _DECODER.raw_decode(text, at)
        except ValueError:
            return values, at
        values.append(value)
        rest = text[end:].lstrip()
        if not rest.startswith(","):
            return values, end
        at = len(text) - len(rest[1:].lstrip())


def _string_prefix(body: str) -> str:
    """The text of a JSON string's opening part (no closing quote), an unfinished escape left out."""
    for cut in range(len(body), max(len(body) - 6, -1), -1):
        try:
            return json.loads('"' + body[:cut] + '"')
        except ValueError:
            continue
    return body


def cut_inside_call(text: str, generic: bool, call_only: bool = False) -> bool:
    """Whether an answer held to calls (``generic_format``, ``call_schema``, tags) stops inside one (or inside a
    generic answer's response): cut short by ``max_tokens``."""
    if generic or call_only:
        return not _json_prefix(text.strip())[1]
    last = text.rfind("<tool_call>")
    return last >= 0 and "</tool_call>" not in text[last:]


class CallWatch:
    """Watches an answer held to calls as it is written, and ends a small model's loop. An array item — a call in a
    generic answer's list, a string or an object in a call's arguments — that equals an earlier item of the same
    array, or a ``<tool_call>`` block that repeats an earlier one, is a loop: ``push`` returns True and ``text``
    is the answer closed before the repeat (its arrays and objects closed), where every call it holds still has
    the arguments its function requires; otherwise the answer goes on. ``form``: "generic" (``generic_format``),
    "call" (one call's JSON: a named or required function) or "tags" (``<tool_call>`` blocks)."""

    def __init__(self, form: str, tools: list[dict]):
        if form not in ("generic", "call", "tags"):
            raise ValueError(f"form must be 'generic', 'call' or 'tags', got {form!r}")
        self.form, self.said, self._closed = form, "", None
        self._params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}

    @property
    def text(self) -> str:
        """The answer as it ends: as written, or closed before the loop."""
        return self.said if self._closed is None else self._closed

    def push(self, piece: str) -> bool:
        """Add the answer's next text; True once it holds a loop and has been closed before it."""
        self.said += piece
        if self._closed is not None:
            return True
        if self.form != "tags":
            self._closed = self._close(self.said, 0, "")
        else:
            bodies = [(m.start(1), m.end(1)) for m in re.finditer(r"<tool_call>\n?(.*?)(?:\n?</tool_call>|$)",
                                                                   self.said, re.S)]
            done = [_canonical(v) for v, whole in (_json_prefix(self.said[a:b]) for a, b in bodies[:-1]) if whole]
            last = self.said[bodies[-1][0]:] if bodies else ""
            value, whole = _json_prefix(last.split("</tool_call>")[0])
            if whole and _canonical(value) in done:  # a block that repeats an earlier one: the answer ends before it
                self._closed = self.said[:self.said.rindex("<tool_call>")].rstrip("\n")
            elif bodies and "</tool_call>" not in last:
                self._closed = self._close(self.said, bodies[-1][0], "\n</tool_call>")
        return self._closed is not None

    def _close(self, text: str, start: int, after: str) -> str | None:
        cut = _loop_cut(text, start)
        if cut is None:
            return None
        closed = cut + after
        value, whole = _json_prefix(closed[start:].split("\n</tool_call>")[0])
        calls = value.get("tool_calls") if self.form == "generic" and isinstance(value, dict) else [value]
        if not whole or not isinstance(calls, list) or not all(self._complete(c) for c in calls):
            return None
        return closed

    def _complete(self, call) -> bool:
        schema = self._params.get(call.get("name")) if isinstance(call, dict) else None
        return schema is not None and "arguments" in call and _holds(call["arguments"], schema)


_CLOSERS = {"[": "]", "{": "}"}


def _loop_cut(text: str, start: int) -> str | None:
    """``text`` from ``start`` is JSON being written. Where an array's string or object item equals an earlier
    item of that array: the text up to the item before it, with every open array and object closed; else None."""
    stack: list[list] = []  # per open array or object: [opener, the item being read's start, items seen, last end]
    in_string = escape = False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
                if _item_ends(stack, text, i):
                    return _closed(text, stack)
            continue
        top = stack[-1] if stack else None
        if top and top[0] == "[" and top[1] is None and not ch.isspace() and ch not in ",]":
            top[1] = i  # an item begins
        if ch == '"':
            in_string = True
        elif ch in "[{":
            stack.append([ch, None, [], None])
        elif ch in "]}":
            if not stack:
                return None
            stack.pop()
            if _item_ends(stack, text, i):
                return _closed(text, stack)
        elif ch == "," and top and top[0] == "[" and top[1] is not None:
            top[1], top[3] = None, i  # a number or literal item ends at its comma
    return None


def _item_ends(stack: list[list], text: str, i: int) -> bool:
    """A string, object or array ended at ``i``: where it is an item of the array around it, record it; True when
    a string or object item repeats an earlier one of that array."""
    top = stack[-1] if stack else None
    if not (top and top[0] == "[" and top[1] is not None):
        return False
    item = text[top[1]:i + 1]
    if item[0] in '"{':
        if item in top[2]:
            return True
        top[2].append(item)
    top[1], top[3] = None, i + 1
    return False


def _closed(text: str, stack: list[list]) -> str:
    """The text up to the end of the innermost array's last unrepeated item, every open container closed."""
    return text[:stack[-1][3]] + "".join(_CLOSERS[f[0]] for f in reversed(stack))


def _holds(value, schema) -> bool:
    """Whether a value held to a schema's shape (its keys and types are) also has every required property and
    every array's minItems: what closing an answer early could leave out."""
    if not isinstance(schema, dict):
        return True
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return any(_holds(value, s) for s in schema[key])
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        return set(schema.get("required") or ()) <= set(value) and \
            all(_holds(v, props.get(k)) for k, v in value.items())
    if isinstance(value, list):
        return len(value) >= schema.get("minItems", 0) and all(_holds(v, schema.get("items")) for v in value)
    return True


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
