"""Tool calls on the three kinds of chat template: one that writes calls in <tool_call> tags, one that shows tools
its own way, and one that never shows them ("generic": SmolLM2 and many small models), where the tools go in a
system message and the answer is held to {"tool_calls": [...]} or {"response": ...}."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")

from ortspec import SpeculativeGenerator  # noqa: E402
from ortspec.constrain import Constraint, Vocabulary, grammar_for  # noqa: E402
from ortspec.text import TextCodec  # noqa: E402
from ortspec.tools import (MAX_CALLS, CallWatch, call_schema, calls_or_answer, check_tools,  # noqa: E402
                           cut_inside_call, generic_format, generic_messages, held_format, read_calls, tool_style)
from test_structured import (PROMPT, TOOL_TEMPLATE, TOOLS, V, _params, bundle, gen,  # noqa: E402,F401 (fixtures)
                             save_bpe_tokenizer)
from tiny import CHAT_TEMPLATE  # noqa: E402

OWN_FORM = ("{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
            "{% for m in messages %}{{ m['content'] }}{% endfor %}")


def test_the_style_is_read_from_the_template():
    assert [tool_style(t) for t in (TOOL_TEMPLATE, OWN_FORM, CHAT_TEMPLATE, None)] == \
        ["tags", "template", "generic", "generic"]


def test_what_each_style_holds_the_answer_to():
    tools = check_tools(TOOLS)
    answer = {"type": "object", "properties": {"x": {"type": "integer"}}}
    for template in (TOOL_TEMPLATE, OWN_FORM, CHAT_TEMPLATE):
        assert held_format(tools, None, template) is None  # "none": text
        assert held_format(tools, None, template, answer) == answer
    assert held_format(tools, "add", TOOL_TEMPLATE) == held_format(tools, "add", OWN_FORM) == call_schema(tools, "add")
    assert held_format(tools, "auto", TOOL_TEMPLATE, "json") == calls_or_answer(tools, "json")
    assert held_format(tools, "auto", OWN_FORM) is None  # its own form: the model's text, read afterwards
    for mode in ("auto", "required", "add"):
        assert held_format(tools, mode, CHAT_TEMPLATE, answer) == generic_format(tools, mode, answer)


CALL = '{"name":"add","arguments":{"a":1,"b":2}}'
CALL2 = '{"name":"get_weather","arguments":{"city":"Oslo"}}'


@pytest.mark.parametrize("mode, answer, texts, refused", [
    ("many", None, ['{"tool_calls":[%s]}' % CALL, '{"tool_calls":[%s,%s]}' % (CALL, CALL2), '{"response":"ab cd"}'],
     ["ab cd", '{"tool_calls":[]}', '{"tool_calls":[{"name":"nope","arguments":{}}]}',
      '{"tool_calls":[{"name":"add","arguments":{"a":1}}]}', '{"response":"x","more":1}',
      '{"tool_calls":[%s]} and more' % CALL, '{"response":{"a":1}}']),
    ("auto", "json", ['{"response":{"a":[1,2]}}', '{"tool_calls":[%s]}' % CALL], ['{"response":"ab"}', "ab"]),
    ("required", None, ['{"tool_calls":[%s]}' % CALL2], ['{"response":"ab"}', CALL2]),
    ("add", None, ['{"tool_calls":[%s]}' % CALL], ['{"tool_calls":[%s]}' % CALL2, '{"response":"ab"}']),
    ("auto", None, ['{"tool_calls":[%s]}' % CALL, '{"response":"ab"}'], ['{"tool_calls":[%s,%s]}' % (CALL, CALL2)]),
    ("required", None, ['{"tool_calls":[%s]}' % CALL], ['{"tool_calls":[%s,%s]}' % (CALL, CALL2)]),
    ("many", None, ['{"tool_calls":[%s]}' % ",".join([CALL] * MAX_CALLS)],
     ['{"tool_calls":[%s]}' % ",".join([CALL] * (MAX_CALLS + 1))]),
    ("named-parallel", None, ['{"tool_calls":[%s]}' % CALL], ['{"tool_calls":[%s,%s]}' % (CALL, CALL)]),
])
def test_a_generic_answer_is_held_to_calls_or_a_response(gen, mode, answer, texts, refused):
    """Every token of an allowed answer passes its mask and the answer may end there; a refused one is masked
    out at some token or cannot end. One call unless parallel calls are asked for ("many": "auto" with
    parallel_tool_calls true, at most MAX_CALLS); a named function is one call even then."""
    tools = check_tools(TOOLS)
    fmt = generic_format(tools, "auto", answer, parallel=True) if mode == "many" else \
        generic_format(tools, "add", answer, parallel=True) if mode == "named-parallel" else \
        generic_format(tools, mode, answer)
    assert [held(gen, fmt, t) for t in texts] == [True] * len(texts)
    assert [held(gen, fmt, t) for t in refused] == [False] * len(refused)


def held(gen, fmt: dict, text: str) -> bool:
    """Whether every token of ``text`` passes the format's mask and the answer may end there."""
    vocab = Vocabulary(gen.codec.tokenizer.to_str(), gen.vocab_size)
    constraint, ids = Constraint(grammar_for(fmt), vocab, frozenset({2}), len(PROMPT)), gen.codec.encode_text(text)
    for i, t in enumerate(ids):
        allowed = constraint.allowed(PROMPT, ids[:i])
        if allowed is None or not allowed[t]:
            return False
    return constraint.complete(PROMPT + ids)


def test_one_call_at_most_in_tags_too(gen):
    tagged = '<tool_call>\n%s\n</tool_call>'
    one = calls_or_answer(check_tools(TOOLS), parallel=False)
    assert held(gen, one, tagged % CALL) and held(gen, one, "ab cd")
    assert not held(gen, one, tagged % CALL + "\n" + tagged % CALL2)
    assert held(gen, calls_or_answer(check_tools(TOOLS)), tagged % CALL + "\n" + tagged % CALL2)
    many = calls_or_answer(check_tools(TOOLS))  # parallel: at most MAX_CALLS
    assert held(gen, many, "\n".join([tagged % CALL] * MAX_CALLS))
    assert not held(gen, many, "\n".join([tagged % CALL] * (MAX_CALLS + 1)))


def test_what_parallel_tool_calls_allows_on_each_style():
    """Not said: one call on a generic template (a small model shown no tool form repeats its first call),
    several in tags; a named function is one call whatever is said."""
    tools = check_tools(TOOLS)
    for mode in ("auto", "required"):
        assert held_format(tools, mode, CHAT_TEMPLATE) == generic_format(tools, mode, parallel=False)
        assert held_format(tools, mode, CHAT_TEMPLATE, parallel=True) == generic_format(tools, mode, parallel=True)
    assert held_format(tools, "add", CHAT_TEMPLATE, parallel=True) == generic_format(tools, "add")
    assert held_format(tools, "auto", TOOL_TEMPLATE) == calls_or_answer(tools, parallel=True)
    assert held_format(tools, "auto", TOOL_TEMPLATE, parallel=False) == calls_or_answer(tools, parallel=False)
    assert held_format(tools, "add", TOOL_TEMPLATE, parallel=True) == call_schema(tools, "add")


LOOPED = '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_weather","arguments":' \
         '{"city":"Paris"}},{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_weather","argu'


def watched(form: str, text: str, step: int = 3) -> tuple[bool, str, int]:
    """Feed a CallWatch ``text`` in pieces of ``step`` characters: whether it ended a loop, its text, and how much
    of ``text`` it had read then."""
    watch = CallWatch(form, check_tools(TOOLS))
    for at in range(0, len(text), step):
        if watch.push(text[at:at + step]):
            return True, watch.text, at + step
    return False, watch.text, len(text)


def test_a_repeated_call_ends_the_answer_before_it():
    """The issue's answer (the first call again and again until max_tokens): the watch ends it once the first
    repeat is finished, closed after the first call; read, it is that one call. In any piece size."""
    for step in (1, 3, 7, 40):
        ended, text, read = watched("generic", LOOPED, step)
        assert ended and read < len(LOOPED) * 2 // 3 + step
        assert text == '{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}'
    assert read_calls(text, check_tools(TOOLS), generic=True)[1][0]["function"]["arguments"] == '{"city": "Paris"}'
    # different calls go on; so do numbers that repeat (coordinates, counts)
    assert not watched("generic", '{"tool_calls":[%s,%s,' % (CALL, CALL2))[0]
    assert not watched("call", '{"name":"add","arguments":{"a":1,"b":1}}')[0]


def test_a_looping_array_in_the_arguments_is_closed_where_the_call_stays_whole():
    tools = check_tools(TOOLS)
    schema_tools = check_tools([{"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "required": ["tags", "text"],
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}, "text": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "log", "parameters": {
            "type": "object", "required": ["text"],
            "properties": {"text": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}}}])
    watch = CallWatch("call", schema_tools)  # "text" is required and not yet said: the answer goes on
    assert not watch.push('{"name":"note","arguments":{"tags":["a","b","a"')
    watch = CallWatch("call", schema_tools)
    assert watch.push('{"name":"log","arguments":{"text":"hi","tags":["a","b","a"')
    assert watch.text == '{"name":"log","arguments":{"text":"hi","tags":["a","b"]}}'
    assert cut_inside_call(watch.said, False, call_only=True) and not cut_inside_call(watch.text, False, True)
    watch = CallWatch("tags", tools)  # in tags: a block that repeats an earlier one ends the answer before it
    assert not watch.push("Let me look.\n<tool_call>\n%s\n</tool_call>\n" % CALL)
    assert watch.push("<tool_call>\n%s\n</tool_call>" % CALL)
    assert watch.text == "Let me look.\n<tool_call>\n%s\n</tool_call>" % CALL
    watch = CallWatch("tags", schema_tools)  # and a loop inside a block closes the block
    assert watch.push('<tool_call>\n{"name":"log","arguments":{"text":"hi","tags":["a","a"')
    assert watch.text == '<tool_call>\n{"name":"log","arguments":{"text":"hi","tags":["a"]}}\n</tool_call>'
    with pytest.raises(ValueError, match="form"):
        CallWatch("free", tools)


def test_an_answer_cut_inside_a_call_gives_the_finished_calls_never_the_raw_format():
    tools = check_tools(TOOLS)
    assert read_calls(LOOPED, tools, generic=True)[0] is None
    assert len(read_calls(LOOPED, tools, generic=True)[1]) == 1  # finished calls, repeats left out
    assert read_calls('{"tool_calls":[{"name":"add","argu', tools, generic=True) == (None, [])
    assert read_calls('{"name":"add","arguments":{"a":', tools, call_only=True) == (None, [])
    text, calls = read_calls("Sure.\n<tool_call>\n%s\n</tool_call>\n<tool_call>\n{\"name\": \"get_w" % CALL, tools)
    assert text == "Sure." and [c["function"]["name"] for c in calls] == ["add"]
    assert read_calls("Sure.\n<tool_call>\n{\"na", tools) == ("Sure.", [])
    assert cut_inside_call(LOOPED, True) and not cut_inside_call('{"tool_calls":[%s]}' % CALL, True)
    assert cut_inside_call("a <tool_call>\n{", False) and not cut_inside_call("plain text", False)


def test_a_generic_answer_is_read_as_calls_or_its_response():
    tools = check_tools(TOOLS)
    text, calls = read_calls('{"tool_calls": [%s, %s]}' % (CALL, CALL2), tools, generic=True)
    assert text is None and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Oslo"})]
    assert read_calls('{"response": "it is \\"warm\\""}', tools, generic=True) == ('it is "warm"', [])
    assert read_calls('{"response": {"x": 1}}', tools, generic=True) == ('{"x": 1}', [])
    assert read_calls('{"response": "cut sh\\u00', tools, generic=True) == ("cut sh", [])  # max_tokens reached
    assert read_calls('{"tool_calls": [{"name": "nope", "arguments": {}}]}', tools, generic=True)[1] == []
    # the same texts on a template with tags are left as they are
    assert read_calls('{"response": "hi"}', tools) == ('{"response": "hi"}', [])


def test_a_generic_template_gets_the_tools_and_the_history_as_text(bundle):
    """The functions and the JSON form go in the system message (a new one, or after the app's); an earlier call
    is the JSON the answer held, tool results are one user turn (the template has no tool role)."""
    codec = TextCodec(bundle / "tokenizer.json", dict(json.loads((bundle / "tokenizer_config.json").read_text()),
                                                      chat_template=CHAT_TEMPLATE))
    tools = check_tools(TOOLS)
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    history = [{"role": "user", "content": "add"}, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "3"}, {"role": "tool", "content": "again 3"}]
    shown = generic_messages(history, tools)
    assert [m["role"] for m in shown] == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' in shown[0]["content"] and '{"response": "<your reply>"}' in shown[0]["content"]
    assert json.loads(shown[2]["content"]) == {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}
    assert [json.loads(line) for line in shown[3]["content"].splitlines()] == [
        {"tool_response": {"name": "add", "content": "3"}}, {"tool_response": {"name": "", "content": "again 3"}}]
    with_system = generic_messages([{"role": "system", "content": "be brief"}] + history[:1], tools)
    assert [m["role"] for m in with_system] == ["system", "user"]
    assert with_system[0]["content"].startswith("be brief\n\nYou can call these functions")
    assert generic_messages(history[:1], None) == history[:1]  # no tools offered: no instruction
    rendered = codec.render_messages(history, tools)  # renders although the template knows no tool role
    assert rendered.startswith("<s> w0 You can call") and '{"tool_response"' in rendered


NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}<s> {{ {'user': 'w1', 'assistant': 'w2'}[m['role']] }} {{ m['content'] }} </s> {% endfor %}"
             "{% if add_generation_prompt %}<s> w2 {% endif %}")


def test_a_template_that_refuses_a_system_message_gets_the_functions_in_the_first_user_turn(bundle):
    """(Gemma 2's template raises on a system message.) Without tools it renders as before."""
    codec = TextCodec(bundle / "tokenizer.json", dict(json.loads((bundle / "tokenizer_config.json").read_text()),
                                                      chat_template=NO_SYSTEM))
    assert tool_style(NO_SYSTEM) == "generic"
    chat = [{"role": "user", "content": "add"}]
    rendered = codec.render_messages(chat, check_tools(TOOLS))
    assert rendered.startswith("<s> w1 You can call these functions") and rendered.count("<s> w1") == 1
    assert rendered.endswith("\n\nadd </s> <s> w2 ")
    assert codec.render_messages(chat) == "<s> w1 add </s> <s> w2 "
    with pytest.raises(ValueError, match="System role"):  # the app's own system message: the template's error
        codec.render_messages([{"role": "system", "content": "x"}] + chat)


@pytest.fixture(scope="module")
def generic_server(tmp_path_factory):
    """The structured tests' pair (1024 positions: the functions' description is long in its little tokenizer)
    with a chat template that never shows tools, served."""
    pytest.importorskip("uvicorn")
    openai = pytest.importorskip("openai")
    from test_serve import start_server
    from tiny import make_model
    from ortspec.export import export_bundle
    work = tmp_path_factory.mktemp("generic")
    pair = [make_model("llama", work / name, vocab=V, seed=21, scale=3.0, perturb=perturb, tokenizer=False,
                       positions=1024) for name, perturb in (("t", 0.0), ("d", 0.3))]
    for d in pair:
        save_bpe_tokenizer(d, CHAT_TEMPLATE)
    out = export_bundle(target=str(pair[0]), draft=str(pair[1]), out=work / "b", progress=None)
    proc, url = start_server(out, work / "server.log")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield client, client.models.list().data[0].id, SpeculativeGenerator.load(out)
    proc.terminate()
    proc.wait(timeout=30)


CHAT = [{"role": "user", "content": "a record please"}]


def test_server_tool_choices_on_a_template_that_never_shows_tools(generic_server):
    """Through the official client: "required" and a named tool (streamed), one call each (parallel_tool_calls
    false: the random model would go on adding calls), end in calls with valid arguments;
    "auto" ends in valid calls or in text that is the response, never the JSON around it; "none" offers no
    functions (a shorter prompt) and answers text; a second turn with the call's result renders."""
    import jsonschema
    client, model, api = generic_server
    r = client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, tool_choice="required",
                                       max_tokens=200, temperature=0, parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1, r
    call = r.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), _params(call.function.name))
    offered = r.usage.prompt_tokens
    named = {"type": "function", "function": {"name": "add"}}
    chunks = [ch for ch in client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, max_tokens=200,
                                                          temperature=0, tool_choice=named, parallel_tool_calls=False, stream=True) if ch.choices]
    deltas = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or []]
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and [d.function.name for d in deltas] == ["add"]
    jsonschema.validate(json.loads(deltas[0].function.arguments), _params("add"))
    fmt = held_format(check_tools(TOOLS), "auto", CHAT_TEMPLATE)
    for seed in range(4):
        r = client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, max_tokens=60, seed=seed,
                                           temperature=1.0)
        message, finish = r.choices[0].message, r.choices[0].finish_reason
        raw = api.generate(messages=CHAT, tools=TOOLS, response_format=fmt, max_new_tokens=60, do_sample=True,
                           temperature=1.0, seed=seed).text  # the same request through the Python API
        text, calls = read_calls(raw, check_tools(TOOLS), generic=True)
        assert message.content == text
        assert [c.function.arguments for c in message.tool_calls or []] == [c["function"]["arguments"] for c in calls]
        if message.tool_calls:
            assert finish == "tool_calls"
            for c in message.tool_calls:
                jsonschema.validate(json.loads(c.function.arguments), _params(c.function.name))
        else:
            assert finish in ("stop", "length") and not (message.content or "").lstrip().startswith('{"response"')
    r = client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, tool_choice="none", max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.tool_calls is None and r.usage.prompt_tokens < offered
    follow = CHAT + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, max_tokens=60, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_server_answer_cut_inside_a_call_finishes_length_without_the_raw_format(generic_server):
    """max_tokens reached inside a call, whole and streamed: finish "length" (as OpenAI says it), no content, and
    only calls that were finished; never the held {"tool_calls": ... text."""
    client, model, _ = generic_server
    for stream in (False, True):
        r = client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, tool_choice="required",
                                           max_tokens=6, temperature=0, stream=stream)
        if stream:
            chunks = [ch for ch in r if ch.choices]
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
            calls = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or []]
            finish = chunks[-1].choices[0].finish_reason
        else:
            content, calls, finish = r.choices[0].message.content, r.choices[0].message.tool_calls, \
                r.choices[0].finish_reason
        assert finish == "length" and not content and not calls, r
