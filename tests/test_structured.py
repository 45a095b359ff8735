"""Structured output: constrained speculative decoding is constrained target-only decoding, token for token when
greedy and in distribution when sampling; forced tokens are free drafts; bad formats fail before model work.

The pair is random, with a byte-level BPE tokenizer trained here on a little JSON and prose (as real models'
tokenizers are: merged tokens beside every single byte, so a constraint allows several tokenizations of the
same text)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("llguidance")

from ortspec import SpeculativeGenerator  # noqa: E402
from ortspec import loop as loop_module  # noqa: E402
from ortspec.config import SamplingConfig  # noqa: E402
from ortspec.constrain import Constraint, ConstraintError, Vocabulary, grammar_for  # noqa: E402
from ortspec.reference import softmax, top_p_keep, warped_scores  # noqa: E402
from stats_util import ALPHA, chi_square_p, grouped  # noqa: E402

V = 320
PROMPT = [1, 40, 41, 42]
CORPUS = ['{"name": "Ada", "n": 36, "tags": ["ab", "cd"]}', '{"a": [1, 2, 3], "b": true, "c": null}',
          "the quick brown fox jumps over the lazy dog", "abc abd acd bcd, 0123456789"] * 30
REGEX = r"(ab|cd|ef)( (ab|cd|ef)){0,3}"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}


# a chat template in the Hermes / Qwen2.5 manner: tools shown to the model, calls written in <tool_call> tags
TOOL_TEMPLATE = (  # (without tools, tiny.CHAT_TEMPLATE's prompts)
    "{% if tools %}<s> tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}answer, or call one in "
    "<tool_call></tool_call> tags</s> {% endif %}{% for m in messages %}<s> "
    "{{ {'system': 'w0', 'user': 'w1', 'assistant': 'w2', 'tool': 'w3'}[m['role']] }} {{ m['content'] or '' }}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>\n{{ c['function'] | tojson }}\n</tool_call>{% endfor %} "
    "</s> {% endfor %}{% if add_generation_prompt %}<s> w2 {% endif %}")


def save_bpe_tokenizer(out, chat_template: str = TOOL_TEMPLATE) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = chat_template
    fast.save_pretrained(str(out))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tiny import make_model
    from ortspec.export import export_bundle
    work = tmp_path_factory.mktemp("structured")
    target = make_model("llama", work / "t", vocab=V, seed=21, scale=3.0, tokenizer=False)
    draft = make_model("llama", work / "d", vocab=V, seed=21, scale=3.0, perturb=0.3, tokenizer=False)
    for d in (target, draft):
        save_bpe_tokenizer(d)
    return export_bundle(target=str(target), draft=str(draft), out=work / "b", progress=None)


@pytest.fixture(scope="module")
def gen(bundle):
    return SpeculativeGenerator.load(bundle, drafter="model", threads=1)


@pytest.mark.parametrize("fmt, message", [
    ({"regex": "(ab"}, "invalid regex"),
    ({"json_schema": "object"}, "must be a dict"),
    ({"grammar": "start: (("}, "invalid grammar"),
    (42, "response_format must be"),
    ({"type": "object", "properties": {"a": {"type": "no-such-type"}}}, "invalid json schema"),
])
def test_bad_formats_fail_before_model_work(gen, fmt, message):
    rounds = gen.target.run_time_s
    with pytest.raises(ConstraintError, match=message):
        gen.generate(input_ids=PROMPT, max_new_tokens=4, response_format=fmt)
    assert gen.target.run_time_s == rounds  # no pass ran


def test_a_bundle_without_tokenizer_is_refused(ids_bundle):
    g = SpeculativeGenerator.load(ids_bundle, drafter="none", threads=1)
    with pytest.raises(ConstraintError, match="tokenizer"):
        g.generate(input_ids=[1, 2, 3], max_new_tokens=4, response_format={"regex": "a+"})


@pytest.mark.parametrize("fmt", [{"regex": REGEX}, SCHEMA, "json", {"grammar": 'root ::= "x" [a-c]+ "y"'}])
def test_greedy_constrained_speculation_is_target_only(gen, fmt):
    """Every drafter and gamma gives the constrained target-only tokens; a finished answer fits the format."""
    alone = gen.sibling("none").generate(input_ids=PROMPT, max_new_tokens=40, response_format=fmt)
    assert alone.token_ids
    for drafter in ("model", "prompt_lookup", "hybrid"):
        for gamma in (1, 3, "auto"):
            got = gen.sibling(drafter).generate(input_ids=PROMPT, max_new_tokens=40, num_draft_tokens=gamma,
                                                response_format=fmt)
            assert got.token_ids == alone.token_ids, (drafter, gamma)
    if alone.finish_reason == "eos":
        _check_fits(fmt, alone.text)


def _check_fits(fmt, text: str) -> None:
    if fmt == "json" or "type" in fmt:
        value = json.loads(text)
        if fmt != "json":
            import jsonschema
            jsonschema.validate(value, fmt)
    elif "regex" in fmt:
        assert re.fullmatch(fmt["regex"], text), text
    else:
        assert re.fullmatch("x[a-c]+y", text), text


def test_sampled_json_answers_validate_and_forced_tokens_are_free(gen):
    """Seeded sampled answers under a schema parse and validate; the schema's fixed keys come as forced drafts
    that the target accepts."""
    forced = accepted = finished = 0
    for seed in range(12):
        res = gen.generate(input_ids=PROMPT, max_new_tokens=48, do_sample=True, temperature=0.8, seed=seed,
                           response_format=SCHEMA)
        forced += res.stats.forced
        accepted += res.stats.forced_accepted
        if res.finish_reason == "eos":
            finished += 1
            _check_fits(SCHEMA, res.text)
    assert finished >= 8
    assert forced > 0 and accepted > 0


def test_rejected_drafts_roll_the_grammar_back(bundle):
    """A matcher moved over drafts and back gives the masks of a fresh one at every point."""
    g = SpeculativeGenerator.load(bundle, drafter="none", threads=1)
    vocab = Vocabulary(g.codec.tokenizer.to_str(), g.vocab_size)
    grammar = grammar_for(SCHEMA)
    eos = frozenset({2})
    moved = Constraint(grammar, vocab, eos, start=len(PROMPT))
    text = g.codec.encode('{"name":"ab","n":7}')
    for i in range(len(text) + 1):
        moved.allowed(PROMPT, text[:min(len(text), i + 3)])  # drafts ahead ...
        fresh = Constraint(grammar, vocab, eos, start=len(PROMPT))
        assert np.array_equal(moved.allowed(PROMPT + text[:i], []), fresh.allowed(PROMPT, text[:i]))  # ... then back
    assert moved.allowed(PROMPT, text[:2] + [5, 5, 5]) is None  # off the grammar: no mask (rows never read)


# -- exactness in distribution ---------------------------------------------------------------------------------
K, N = 4, 3000
SAMPLED = dict(temperature=2.5, top_p=0.95)  # (a flat target: a few hundred sequences of four tokens)
STAT_REGEX = r"(ab|cd|the|fox|dog| )+"       # model drafts, rejections, and forced tokens ("the" after "t")


def exact_sequences(g, fmt) -> dict:
    """P(first K tokens) under constrained target-only sampling, from the plain reference on whole rows."""
    config = SamplingConfig(do_sample=True, **SAMPLED)
    grammar = grammar_for(fmt)
    vocab = Vocabulary(g.codec.tokenizer.to_str(), g.vocab_size)
    out = {}

    def walk(prefix, prob):
        if len(prefix) == K or (prefix and prefix[-1] == 2):
            out[tuple(prefix)] = out.get(tuple(prefix), 0.0) + prob
            return
        allowed = Constraint(grammar, vocab, frozenset({2}), len(PROMPT)).allowed(PROMPT, prefix)
        logits = np.array(g.target.reference_logits(PROMPT + prefix)[-1], dtype=np.float32)
        logits[~allowed] = -np.inf
        scores = warped_scores(logits, PROMPT + prefix, config)
        p = softmax(np.where(top_p_keep(scores, config.top_p), scores, -np.inf))
        for t in np.flatnonzero(p > 0):
            walk(prefix + [int(t)], prob * p[t])

    walk([], 1.0)
    return out


def sampled_sequences(g, fmt, n: int, gamma) -> tuple[dict, int]:
    """Counts of the first K tokens over n seeded runs (each run for K + 2 tokens, so that rounds of gamma
    drafts reach past K), and the forced drafts proposed."""
    counts: dict = {}
    forced = 0
    for seed in range(n):
        res = g.generate(input_ids=PROMPT, max_new_tokens=K + 2, do_sample=True, seed=seed, num_draft_tokens=gamma,
                         response_format=fmt, **SAMPLED)
        key = tuple(res.token_ids[:K])
        counts[key] = counts.get(key, 0) + 1
        forced += res.stats.forced
    return counts, forced


def p_value(exact: dict, counts: dict) -> float:
    keys = list(exact)
    outside = sum(v for k, v in counts.items() if k not in exact)
    assert not outside, f"{outside} sampled sequences the constraint does not allow"
    c = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
    p = np.array([exact[k] for k in keys])
    return chi_square_p(*grouped(c, p, groups=30))


@pytest.fixture(scope="module")
def exact(gen):
    return exact_sequences(gen, {"regex": STAT_REGEX})


def test_constrained_sampling_is_exact(gen, exact):
    """Seeded constrained speculative runs (draft model, gamma 3, forced drafts) against the exact constrained
    target-only distribution of the first four tokens."""
    assert len(exact) > 100  # a distribution with room to be wrong in
    counts, forced = sampled_sequences(gen, {"regex": STAT_REGEX}, N, 3)
    assert forced > 0
    assert p_value(exact, counts) > ALPHA


def _mask_only(monkeypatch, which: str) -> None:
    """Mask only the target's rows ("target") or only the draft's ("draft"): the loop masks the target's
    pipeline first, then the draft's."""
    made = []
    real = loop_module.MaskedPipeline

    def masked(pipe, mask):
        made.append(pipe)
        first = len(made) % 2 == 1
        return real(pipe, mask) if first == (which == "target") else pipe

    monkeypatch.setattr(loop_module, "MaskedPipeline", masked)


def test_a_mask_on_the_target_only_is_still_exact(gen, exact, monkeypatch):
    """The acceptance rules hold for any proposal: an unmasked draft only wastes drafts the target rejects."""
    _mask_only(monkeypatch, "target")
    counts, _ = sampled_sequences(gen, {"regex": STAT_REGEX}, N // 2, 3)
    assert p_value(exact, counts) > ALPHA


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the draft's masked rows refuse the text the target left)
def test_negative_control_a_mask_on_the_draft_only_is_caught(gen, exact, monkeypatch):
    """The rule broken on purpose: the target's rows read unmasked (only the draft's masked). The same check
    must fail."""
    _mask_only(monkeypatch, "draft")
    counts, _ = sampled_sequences(gen, {"regex": STAT_REGEX}, 600, 3)
    with pytest.raises(AssertionError):
        assert p_value(exact, counts) > ALPHA


# -- the server, through the official client -------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    pytest.importorskip("uvicorn")
    openai = pytest.importorskip("openai")
    from test_serve import start_server
    proc, url = start_server(bundle, tmp_path_factory.mktemp("serve") / "server.log")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    yield client, client.models.list().data[0].id
    proc.terminate()
    proc.wait(timeout=30)


CHAT = [{"role": "user", "content": "a record please"}]


def test_server_answers_a_json_schema_and_a_json_object(server, gen):
    client, model = server
    fmt = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}
    whole = client.chat.completions.create(model=model, messages=CHAT, max_tokens=48, temperature=0,
                                           response_format=fmt)
    answer = whole.choices[0]
    assert answer.finish_reason == "stop"
    _check_fits(SCHEMA, answer.message.content)
    assert answer.message.content == gen.generate(messages=CHAT, max_new_tokens=48, do_sample=False,
                                                  response_format=SCHEMA).text  # the Python API's answer
    pieces = client.chat.completions.create(model=model, messages=CHAT, max_tokens=48, temperature=0,
                                            response_format=fmt, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == answer.message.content
    anything = client.chat.completions.create(model=model, messages=CHAT, max_tokens=48, temperature=0.8, seed=3,
                                              response_format={"type": "json_object"})
    if anything.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(anything.choices[0].message.content), dict)


@pytest.mark.parametrize("fmt", [{"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}},
                                 {"type": "xml"}, "json"])
def test_server_refuses_bad_formats_as_openai_does(server, fmt):
    import openai
    client, model = server
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, response_format=fmt)
    assert err.value.body["param"] == "response_format"


# -- the command line ------------------------------------------------------------------------------------------

def _cli(*args) -> subprocess.CompletedProcess:
    """The ortspec command in a process of its own (it runs onnxruntime on the shared thread pool, which would
    hold for this process's later tests)."""
    code = "from ortspec.cli import main; raise SystemExit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_generate_flags(bundle, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    got = _cli("generate", bundle, "--prompt", "a record", "--json-schema", schema, "--json", "--max-new-tokens", 48)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    if out["finish_reason"] == "eos":
        _check_fits(SCHEMA, out["text"])
    got = _cli("generate", bundle, "--prompt", "ab", "--regex", REGEX, "--json")
    assert got.returncode == 0 and re.fullmatch(REGEX, json.loads(got.stdout)["text"]), got.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for flags, needle in ((["--json-schema", bad], "is not JSON"),
                          (["--json-schema", tmp_path / "missing.json"], "cannot read"),
                          (["--regex", "(ab"], "invalid regex")):
        got = _cli("generate", bundle, "--prompt", "ab", *flags)
        assert got.returncode == 2 and needle in got.stderr, got.stderr
    got = _cli("generate", bundle, "--prompt", "ab", "--regex", "a", "--json-object")  # one constraint at a time
    assert got.returncode == 2 and "not allowed with" in got.stderr, got.stderr


def test_structured_bench_prints_every_mode(bundle):
    """tools/structured_bench.py: each sampling and decoding mode gets a row with a positive speed."""
    from pathlib import Path
    tool = Path(__file__).resolve().parents[1] / "tools" / "structured_bench.py"
    proc = subprocess.run([sys.executable, str(tool), str(bundle), "--limit", "1", "--max-new-tokens", "12",
                           "--compact"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("greedy", "sampled"))]
    assert len(rows) == 6 and all(float(r[4] if r[1] == "+" else r[3]) > 0 for r in rows), proc.stdout


# -- tool calls --------------------------------------------------------------------------------------------------
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}},
]


def _params(name: str) -> dict:
    return next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)


def test_server_tool_calls_round_trip(server):
    """A required call, a named call (whole and streamed) and a second turn that returns the call's result."""
    import jsonschema
    client, model = server
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        r = client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, tool_choice=choice,
                                           max_tokens=80, temperature=0)
        answer = r.choices[0]
        assert answer.finish_reason == "tool_calls", answer
        call = answer.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), _params(call.function.name))
    assert call.function.name == "add"
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, max_tokens=80,
                                                 temperature=0, tool_choice=choice, stream=True))
    deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, d.function.arguments) for d in deltas] == [("add", call.function.arguments)]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
    follow = CHAT + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": "42"}]
    r = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, tool_choice="none", max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)
    r = client.chat.completions.create(model=model, messages=follow, tools=TOOLS, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")  # auto: the model's choice


CALL = '<tool_call>\n{"name":"add","arguments":{"a":1,"b":2}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>'


@pytest.mark.parametrize("answer, texts, refused", [
    (None, ["ab cd, the fox.\n\nok", "", CALL, CALL + "\n" + CALL2, "Let me add.\n" + CALL],
     ["ab <tool_call> cd", '<tool_call>\n{"name":"nope","arguments":{}}\n</tool_call>',
      '<tool_call>\n{"name":"add","arguments":{"a":1}}\n</tool_call>', CALL + " and more"]),
    ("json", ['{"a": [1, 2]}', CALL, CALL + "\n" + CALL2], ["ab cd", "ok " + CALL]),
])
def test_auto_tool_choice_holds_an_answer_or_calls(gen, answer, texts, refused):
    """``tool_choice: "auto"`` on a template with <tool_call> tags: a text answer (without the tag), or calls
    each held to a function's schema; with a JSON answer format, that JSON or calls. Every token of an allowed
    text passes its mask and the text may end there; a refused one is masked out at some token or cannot end."""
    from ortspec.tools import calls_or_answer, check_tools, uses_call_tags
    assert uses_call_tags(gen.codec.chat_template)
    grammar = grammar_for(calls_or_answer(check_tools(TOOLS), answer))
    vocab = Vocabulary(gen.codec.tokenizer.to_str(), gen.vocab_size)

    def held(text: str) -> bool:
        constraint, ids = Constraint(grammar, vocab, frozenset({2}), len(PROMPT)), gen.codec.encode(text)
        for i, t in enumerate(ids):
            allowed = constraint.allowed(PROMPT, ids[:i])
            if allowed is None or not allowed[t]:
                return False
        return constraint.complete(PROMPT + ids)
    assert [held(t) for t in texts] == [True] * len(texts)
    assert [held(t) for t in refused] == [False] * len(refused)


def test_server_auto_tool_choice_answers_text_or_valid_calls(server, gen):
    """With tool_choice "auto" the model chooses; whatever it chooses is well formed. A bias towards "<" (and
    against "{") under a JSON answer format makes it choose a call: the call's keys are forced, its arguments
    valid (one call: the random model would go on adding calls until max_tokens cut one, a "length" finish).
    Without the bias, sampled answers are text without the tag, or valid calls."""
    import jsonschema
    client, model = server
    lt, brace = gen.codec.encode("<")[0], gen.codec.encode("{")[0]
    for stream in (False, True):
        r = client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, max_tokens=80, temperature=0,
                                           response_format={"type": "json_object"}, stream=stream,
                                           parallel_tool_calls=False,
                                           logit_bias={str(lt): 100, str(brace): -100})
        if stream:
            chunks = [ch for ch in r if ch.choices]
            calls = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or [])]
            finish = chunks[-1].choices[0].finish_reason
        else:
            calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        assert finish == "tool_calls" and calls, r
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), _params(call.function.name))
    for seed in range(4):
        r = client.chat.completions.create(model=model, messages=CHAT, tools=TOOLS, max_tokens=24, seed=seed,
                                           temperature=1.0)
        message = r.choices[0].message
        assert "<tool_call>" not in (message.content or ""), message
        for call in message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), _params(call.function.name))


def test_calls_are_read_from_an_answer():
    from ortspec.tools import check_tools, read_calls
    tools = check_tools(TOOLS)
    text, calls = read_calls('Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', tools)
    assert text == "Sure." and json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert read_calls('{"name": "get_weather", "arguments": {"city": "Oslo"}}', tools)[0] is None
    assert read_calls('{"name": "nope", "arguments": {}}', tools)[1] == []  # not a function offered
    assert read_calls("just text", tools) == ("just text", [])


def test_grammar_engines_compare_on_the_bundles_tokenizer(bundle):
    """tools/grammar_engines.py: each engine installed compiles every schema and allows every token of a valid
    answer."""
    from pathlib import Path
    tool = Path(__file__).resolve().parents[1] / "tools" / "grammar_engines.py"
    proc = subprocess.run([sys.executable, str(tool), str(bundle)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.split()[-1:] in (["True"], ["False"])]
    engines = {r[0] for r in rows}
    assert "llguidance" in engines and all(r[-1] == "True" and float(r[3]) >= 0 for r in rows), proc.stdout


def test_a_gguf_style_tokenizer_is_read_as_byte_level(bundle):
    """GGUF conversions write a byte-level BPE with a decoder sequence (ByteFallback, Fuse, Replace, ByteLevel)
    and byte_fallback set: the grammar engine must still read "Ġ" as a space and "Ċ" as a newline, masking and
    consuming alike, or text the format does not allow gets through."""
    g = SpeculativeGenerator.load(bundle, drafter="none", threads=1)
    spec = json.loads(g.codec.tokenizer.to_str())
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    spec["model"]["byte_fallback"] = True
    vocab = Vocabulary(json.dumps(spec), g.vocab_size)
    text = "ab cd\nab"
    ids = g.codec.encode(text)
    constraint = Constraint(grammar_for({"regex": r"ab cd\nab"}), vocab, frozenset({2}), len(PROMPT))
    for i, t in enumerate(ids):
        allowed = constraint.allowed(PROMPT, ids[:i])
        assert allowed is not None and allowed[t], (i, g.codec.decode([t]))
    assert constraint.complete(PROMPT + ids)


def test_constrained_and_free_requests_alternate_without_leaking(bundle):
    """Constrained and free requests (greedy, sampled, bitwise or not) in turn on one generator and its siblings
    give the ids of fresh generators."""
    from test_request_lifecycle import SAMPLED as LIFE_SAMPLED, run_alternating
    settings = [dict(), dict(response_format={"regex": REGEX}), dict(LIFE_SAMPLED),
                dict(LIFE_SAMPLED, response_format=SCHEMA), dict(bitwise=False, response_format="json"),
                dict(LIFE_SAMPLED, top_k=0), dict(response_format=SCHEMA)]
    run_alternating(bundle, settings, prompt=PROMPT, max_new_tokens=20, threads=1)


def test_objects_admit_only_their_declared_keys_each_once_unless_the_schema_opens_them():
    """closed_objects: every object that declares properties and says nothing of other keys is closed, at every
    depth; a schema that opens an object keeps it open; the grammar then refuses an undeclared key."""
    from ortspec.constrain import closed_objects
    item = {"type": "object", "properties": {"x": {"type": "integer"}}}
    schema = {"type": "object", "required": ["a"],
              "properties": {"a": {"type": "string"}, "list": {"type": "array", "items": item},
                             "either": {"anyOf": [item, {"type": "null"}]},
                             "open": {"type": "object", "properties": {"y": {}}, "additionalProperties": True},
                             "free": {"type": "object"}, "ref": {"$ref": "#/$defs/thing"}},
              "$defs": {"thing": item}}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    props = closed["properties"]
    assert props["list"]["items"]["additionalProperties"] is False
    assert props["either"]["anyOf"][0]["additionalProperties"] is False and props["either"]["anyOf"][1] == {"type": "null"}
    assert props["open"]["additionalProperties"] is True and "additionalProperties" not in props["free"]
    assert closed["$defs"]["thing"]["additionalProperties"] is False
    assert schema["properties"]["list"]["items"] is item and "additionalProperties" not in item  # not changed in place


def test_a_tool_call_grammar_refuses_undeclared_and_repeated_keys(bundle):
    """Against the bundle's tokenizer: the forced call's grammar takes the declared arguments and refuses an extra
    key or a repeated one; the same schema left open (the negative control) takes the extra key."""
    llg = pytest.importorskip("llguidance")
    import llguidance.hf
    from transformers import PreTrainedTokenizerFast
    from ortspec.constrain import grammar_for
    from ortspec.tools import call_schema
    fast = PreTrainedTokenizerFast(tokenizer_file=str(bundle / "tokenizer.json"), eos_token="</s>")
    engine = llguidance.hf.from_tokenizer(fast, n_vocab=V)
    params = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string", "maxLength": 40}}}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": params}}]

    def takes(grammar, text):
        m = llg.LLMatcher(engine, grammar)
        ids = fast.encode(text, add_special_tokens=False)
        return m.try_consume_tokens(ids) == len(ids) and not m.is_error()

    call = grammar_for(call_schema(tools, "required"))
    assert takes(call, '{"name":"get_weather","arguments":{"city":"abc"}}')
    assert not takes(call, '{"name":"get_weather","arguments":{"city":"abc","description":"x"}}')
    assert not takes(call, '{"name":"get_weather","arguments":{"city":"abc","city":"d"}}')
    left_open = llg.LLMatcher.grammar_from_json_schema(json.dumps(params))
    assert takes(left_open, '{"city":"abc","description":"x"}')  # what the grammar admitted before
