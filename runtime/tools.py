"""Tool calls: function definitions checked, the JSON schema a forced call is held to, calls read from an answer."""
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
    def one(tool: dict) -> dict:
        fn = tool["function"]
        return {"type": "object", "properties": {"name": {"const": fn["name"]},
                                                 "arguments": closed_objects(fn["parameters"])},
                "required": ["name", "arguments"], "additionalProperties": False}
    chosen = [one(t) for t in tools if name == "required" or t["function"]["name"] == name]
    schema = chosen[0] if len(chosen) == 1 else {"anyOf": chosen}
    return dict(schema, **{"x-guidance": {"whitespace_flexible": False}})


def uses_call_tags(chat_template: str | None) -> bool:
    """Whether a chat template asks for calls in ``<tool_call>`` tags (Hermes, Qwen2.5 and their kin)."""
    return bool(chat_template) and "<tool_call>" in chat_template


def calls_or_answer(tools: list[dict], answer: dict | str | None = None) -> dict:
    """The response format of ``tool_choice: "auto"`` on a template that writes calls in ``<tool_call>`` tags:
    an answer — free text, or given ``answer`` a JSON value of that schema (``"json"``: any object) — or one or more calls, each
    ``<tool_call>\\n{call}\\n</tool_call>`` held to ``call_schema(tools, "required")`` (free text may come
    before the first). A text answer cannot hold the tag: once it is written, a call follows."""
    if answer is None:
        # TEXT: anything without the tag; LEAD: anything up to and including the first tag
        rules = ["start: TEXT? | LEAD calls",
                 r"TEXT: /(.|\n)+/ & ~/(.|\n)*<tool_call>(.|\n)*/",
                 r"LEAD: /(.|\n)*<tool_call>/ & ~/(.|\n)*<tool_call>(.|\n)+/"]
    else:
        answer = {"type": "object"} if answer == "json" else closed_objects(answer)
        rules = [f"start: %json {json.dumps(answer)} | \"<tool_call>\" calls"]
    rules += ['calls: NL body NL "</tool_call>" (NL "<tool_call>" NL body NL "</tool_call>")*',
              f"body: %json {json.dumps(call_schema(tools, 'required'))}",
              r'NL: "\n"']
    return {"lark": "\n".join(rules) + "\n"}


def read_calls(text: str, tools: list[dict]) -> tuple[str | None, list[dict]]:
    """The calls an answer makes — ``<tool_call>{...}</tool_call>`` blocks, or an answer that is one call as JSON —
    in OpenAI's shape, and the text outside them (None when there is none)."""
    names = {t["function"]["name"] for t in tools}
    found = [(m.start(), m.end(), m.group(1)) for m in CALL_TAG.finditer(text)] or [(0, len(text), text)]
    calls, rest, at = [], [], 0
    for start, end, body in found:
        try:
            value = json.loads(body)
        except ValueError:
            continue
        if not (isinstance(value, dict) and value.get("name") in names and isinstance(value.get("arguments"), dict)):
            continue
        calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                      "function": {"name": value["name"], "arguments": json.dumps(value["arguments"])}})
        rest.append(text[at:start])
        at = end
    if not calls:
        return text, []
    rest.append(text[at:])
    outside = "".join(rest).strip()
    return outside or None, calls


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
