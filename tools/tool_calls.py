#!/usr/bin/env python3
"""Tool calls as apps make them, through the official openai client against `ortspec serve BUNDLE` (loopback).

    python tools/tool_calls.py models/smollm2-135m
    python tools/tool_calls.py models/qwen2.5-coder-int4 --max-tokens 200

For each tool schema as apps write it (no additionalProperties; optional properties, enums, a nested object) and
each tool_choice — "required", the tool named (streamed), "auto" — one greedy request; prints whether the answer
ended (finish_reason "tool_calls", or "stop" with text for "auto"), the completion tokens used against
max_tokens, and the call's arguments, which must parse and hold only declared keys. Exit status 1 if any
request failed those checks.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
import tempfile

sys.path.insert(0, str(Path(__file__).parent))
from serve_soak import start_server  # noqa: E402

TOOLS = {
    "weather": ({"name": "get_weather", "description": "Get the current weather in a city",
                 "parameters": {"type": "object", "required": ["city"],
                                "properties": {"city": {"type": "string", "maxLength": 40},
                                               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}},
                "What's the weather like in Paris today?"),
    "event": ({"name": "create_event", "description": "Add an event to the calendar",
               "parameters": {"type": "object", "required": ["title", "when"],
                              "properties": {"title": {"type": "string", "maxLength": 60},
                                             "when": {"type": "object", "required": ["date"],
                                                      "properties": {"date": {"type": "string", "maxLength": 20},
                                                                     "time": {"type": "string", "maxLength": 10}}},
                                             "attendees": {"type": "array", "maxItems": 5,
                                                           "items": {"type": "string", "maxLength": 40}}}}},
              "Put a dentist appointment on my calendar for 2026-12-09 at 10:00."),
}


def declared(schema: dict, value) -> bool:
    """Whether a value holds only the keys its schema declares, at every depth."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return set(value) <= set(props) and all(declared(props[k], v) for k, v in value.items())
    if isinstance(value, list):
        return all(declared(schema.get("items", {}), v) for v in value)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--max-tokens", type=int, default=200)
    args = ap.parse_args()
    import openai
    log = Path(tempfile.mkdtemp()) / "server.log"
    proc, url = start_server(args.bundle, ["--model-name", "m"], log)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    failed = 0
    try:
        for name, (fn, question) in TOOLS.items():
            tools = [{"type": "function", "function": fn}]
            messages = [{"role": "user", "content": question}]
            for choice in ("required", "named", "auto"):
                tool_choice = {"type": "function", "function": {"name": fn["name"]}} if choice == "named" else choice
                kw = dict(model="m", messages=messages, tools=tools, tool_choice=tool_choice, temperature=0,
                          max_tokens=args.max_tokens)
                if choice == "named":  # streamed
                    parts, finish, tokens = {}, None, None
                    for chunk in client.chat.completions.create(**kw, stream=True,
                                                                stream_options={"include_usage": True}):
                        for c in chunk.choices:
                            finish = c.finish_reason or finish
                            for call in c.delta.tool_calls or []:
                                parts.setdefault(call.index, []).append(call.function.arguments or "")
                        tokens = chunk.usage.completion_tokens if chunk.usage else tokens
                    arguments, text = ["".join(p) for p in parts.values()], None
                else:
                    res = client.chat.completions.create(**kw)
                    c = res.choices[0]
                    finish, tokens, text = c.finish_reason, res.usage.completion_tokens, c.message.content
                    arguments = [t.function.arguments for t in c.message.tool_calls or []]
                try:
                    values = [json.loads(a) for a in arguments]
                    good = all(isinstance(v, dict) and declared(fn["parameters"], v) for v in values)
                except ValueError:
                    values, good = arguments, False
                ended = finish == "tool_calls" and bool(values) or (choice == "auto" and finish == "stop" and text)
                ok = bool(ended) and good
                failed += not ok
                shown = json.dumps(values) if values else repr((text or "")[:80])
                print(f"{name:<8} {choice:<9} {'ok  ' if ok else 'FAIL'} finish {finish}, {tokens}/{args.max_tokens} "
                      f"tokens: {shown}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
