#!/usr/bin/env python3
"""Tool calls as apps make them, through the official openai client against `ortspec serve BUNDLE` (loopback).

    python tools/tool_calls.py models/smollm2-135m
    python tools/tool_calls.py models/qwen2.5-coder-gguf --json tool-calls.json

The shipped set (ortspec/data/tool_questions.json): 4 function tools as apps write them (no additionalProperties;
optional, nested and enum arguments), all offered with every request, and 13 questions as users ask them, several
phrasings per tool. Each question is asked greedy with tool_choice "required", its tool named (whole, and
streamed) and "auto"; then questions that want two calls with parallel_tool_calls true. A request is ok when it
ends inside max_tokens — finish "tool_calls" with calls whose arguments hold to their function's schema (for
"auto", finish "stop" with text also ends) — with one call unless parallel calls were asked for, the named
function when one was named, and no call repeated. Prints a row per request and a summary (and whether the
model picked the question's tool, which the rules do not decide); exit status 1 if any request was not ok.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
import tempfile

sys.path.insert(0, str(Path(__file__).parent))
from serve_soak import start_server  # noqa: E402

MODES = ("required", "named", "named-stream", "auto")


def load_set() -> dict:
    from ortspec.shipped import TOOL_QUESTIONS, shipped
    return json.loads(shipped(TOOL_QUESTIONS).read_text())


def ask(client, tools: list[dict], question: str, mode: str, name: str | None, max_tokens: int,
        parallel: bool | None = None) -> dict:
    """One greedy request; what it ended with: finish reason, completion tokens, calls [(name, arguments)],
    text, and whether it was streamed."""
    choice = {"type": "function", "function": {"name": name}} if mode.startswith("named") else mode
    kw = dict(model="m", messages=[{"role": "user", "content": question}], tools=tools, tool_choice=choice,
              temperature=0, max_tokens=max_tokens)
    if parallel is not None:
        kw["parallel_tool_calls"] = parallel
    if mode.endswith("stream"):
        parts, names, finish, tokens, text = {}, {}, None, None, []
        for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
            for c in chunk.choices:
                finish = c.finish_reason or finish
                text.append(c.delta.content or "")
                for call in c.delta.tool_calls or []:
                    parts.setdefault(call.index, []).append(call.function.arguments or "")
                    names[call.index] = call.function.name or names.get(call.index)
            tokens = chunk.usage.completion_tokens if chunk.usage else tokens
        calls = [(names[k], "".join(parts[k])) for k in sorted(parts)]
        text = "".join(text) or None
    else:
        res = client.chat.completions.create(**kw)
        c = res.choices[0]
        finish, tokens, text = c.finish_reason, res.usage.completion_tokens, c.message.content
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []]
    return {"finish": finish, "tokens": tokens, "calls": calls, "text": text}


def judge(outcome: dict, tools: list[dict], mode: str, name: str | None, max_tokens: int,
          parallel: bool = False) -> list[str]:
    """What is wrong with an outcome (empty: ok)."""
    import jsonschema
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    wrong, calls = [], outcome["calls"]
    if not outcome["tokens"] or outcome["tokens"] >= max_tokens:
        wrong.append(f"used {outcome['tokens']} of max_tokens {max_tokens}")
    text_answer = mode == "auto" and not calls and outcome["finish"] == "stop" and bool(outcome["text"])
    if not text_answer and not (outcome["finish"] == "tool_calls" and calls):
        wrong.append(f"finish {outcome['finish']} with {len(calls)} calls")
    if text_answer and outcome["text"].lstrip().startswith(("{", "<tool_call>")):
        wrong.append("the held format returned as text")
    if len(calls) > 1 and not parallel:
        wrong.append(f"{len(calls)} calls without parallel_tool_calls")
    if len(set(calls)) < len(calls):
        wrong.append("a call repeated")
    for fn, arguments in calls:
        if mode.startswith("named") and fn != name:
            wrong.append(f"called {fn}, not the named {name}")
        if fn not in params:
            wrong.append(f"called an unknown function {fn}")
            continue
        try:
            jsonschema.validate(json.loads(arguments), params[fn])
        except (ValueError, jsonschema.ValidationError) as exc:
            wrong.append(f"{fn} arguments invalid: {str(exc).splitlines()[0][:80]}")
    return wrong


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--max-tokens", type=int, default=120, help="per request (default 120)")
    ap.add_argument("--limit", type=int, default=None, help="the first N questions only")
    ap.add_argument("--no-parallel", action="store_true", help="leave out the parallel_tool_calls questions")
    ap.add_argument("--json", metavar="FILE", help="write every request's outcome here")
    args = ap.parse_args()
    import openai
    data = load_set()
    tools, questions = data["tools"], data["questions"][:args.limit]
    log = Path(tempfile.mkdtemp()) / "server.log"
    proc, url = start_server(args.bundle, ["--model-name", "m"], log)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    rows = []
    try:
        jobs = [(q["question"], q["tool"], mode, None) for q in questions for mode in MODES]
        if not args.no_parallel:
            jobs += [(q["question"], None, mode, True) for q in data["parallel"] for mode in ("required", "auto")]
        for question, tool, mode, parallel in jobs:
            outcome = ask(client, tools, question, mode, tool, args.max_tokens, parallel)
            wrong = judge(outcome, tools, mode, tool, args.max_tokens, bool(parallel))
            picked = tool is None or all(fn == tool for fn, _ in outcome["calls"])
            rows.append(dict(outcome, question=question, tool=tool, mode=mode + (" parallel" if parallel else ""),
                             ok=not wrong, wrong=wrong, picked=picked))
            shown = "; ".join(f"{fn}{a}" for fn, a in outcome["calls"]) or repr((outcome["text"] or "")[:60])
            print(f"{'ok  ' if not wrong else 'FAIL'} {rows[-1]['mode']:<17} {outcome['finish']:<10} "
                  f"{outcome['tokens']:>3}/{args.max_tokens} {question[:44]:<44} {shown[:110]}"
                  + (f"  <- {'; '.join(wrong)}" if wrong else ""), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    good = sum(r["ok"] for r in rows)
    called = [r for r in rows if r["calls"] and r["tool"]]
    print(f"\n{good}/{len(rows)} ok ({len(questions)} questions, {len(tools)} tools, max_tokens {args.max_tokens}); "
          f"the question's own tool picked in {sum(r['picked'] for r in called)}/{len(called)} answers with calls; "
          f"completion tokens max {max(r['tokens'] or 0 for r in rows)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"bundle": args.bundle, "max_tokens": args.max_tokens, "rows": rows},
                                              indent=1))
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
