"""`ortspec serve` against the official openai client: a real server process on a free 127.0.0.1 port."""
from __future__ import annotations

import http.client
import json
from pathlib import Path
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from ortspec import SpeculativeGenerator  # noqa: E402
from ortspec.drafting import common_prefix  # noqa: E402
from ortspec.wire import ApiError, StopText, parse_request  # noqa: E402

MODEL = "tinyserve"
LONG = {"max_tokens": 4000, "ignore_eos": True, "num_draft_tokens": 0}  # ~15 s on two cores: never finishes here
CHAT = [{"role": "system", "content": "w4 w5"}, {"role": "user", "content": "w10 w11 w12 w13"}]


@pytest.fixture(scope="module")
def serve_bundle(workdir) -> Path:
    """A 4,096-position llama (wide enough that 4,000 tokens take seconds) with an INT4 self-draft."""
    from tiny import make_model
    from conftest import _export
    hf = make_model("llama", workdir / "serve_hf", vocab=128, seed=0, positions=4096, hidden=256, layers=4)
    return _export(target=str(hf), draft="self", draft_quant="int4", out=workdir / MODEL)


def start_server(bundle: Path, log: Path, *flags: str):
    code = "from ortspec.cli import main; raise SystemExit(main())"
    err = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", str(bundle), "--port", "0", *flags],
                            stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        text = log.read_text()
        if " on http://" in text:
            url = text.split(" on ", 1)[1].split("/v1", 1)[0]
            return proc, url
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"server did not start:\n{log.read_text()}")


@pytest.fixture(scope="module")
def server(serve_bundle, tmp_path_factory):
    proc, url = start_server(serve_bundle, tmp_path_factory.mktemp("serve") / "server.log", "--max-queue", "40")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def guarded(serve_bundle, tmp_path_factory):
    """A second server: API key, one request running and one waiting at most, 2 s per request."""
    proc, url = start_server(serve_bundle, tmp_path_factory.mktemp("serve2") / "server.log", "--api-key", "sekrit",
                             "--parallel", "1", "--max-queue", "1", "--request-timeout", "2")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def api(serve_bundle):
    return SpeculativeGenerator.load(serve_bundle)


def client(url: str, key: str = "unused"):
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def request(url: str, method: str, path: str, body=None, headers=None, raw: bytes | None = None):
    """(status, parsed JSON body) with the standard library, for requests the openai client will not send."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, json.loads(payload)


def health(url: str) -> dict:
    return request(url, "GET", "/health")[1]


def wait_idle(url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = health(url)
        if h["running"] == 0 and h["waiting"] == 0:
            return h
        time.sleep(0.05)
    raise AssertionError(f"server still busy: {health(url)}")


def open_stream(url: str, body: dict, headers=None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}).encode(),
                 headers={"Content-Type": "application/json", **(headers or {})})
    return conn, conn.getresponse()


def sse_events(resp) -> list:
    """Parse data: lines until [DONE] (or the stream ends)."""
    out = []
    for line in resp:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            out.append("[DONE]")
            break
        out.append(json.loads(data))
    return out


# -- answers equal the Python API's -------------------------------------------------------------------------------

def test_models_and_health(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client(server).models.retrieve(MODEL).id == MODEL
    h = health(server)
    assert h["status"] == "ok" and h["model"] == MODEL


def test_greedy_chat_equals_python_api(server, api):
    want = api.generate(messages=CHAT, max_new_tokens=24, do_sample=False)
    r = client(server).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == want.text
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == {"eos": "stop", "length": "length"}[want.finish_reason]
    assert r.usage.completion_tokens == len(want.token_ids)
    assert r.usage.prompt_tokens == len(api.codec.encode_messages(CHAT))
    extra = r.model_extra["ortspec"]
    assert extra["drafter"] == "model" and extra["rounds"] >= 1 and 0 <= extra["acceptance_rate"] <= 1


def test_streaming_reassembles_to_the_same_text(server):
    c = client(server)
    whole = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, temperature=0, extra_body={
        "ignore_eos": True})
    chunks = list(c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
    assert len({ch.id for ch in chunks}) == 1


def test_completions_endpoint_equals_python_api(server, api):
    want = api.generate(prompt="w7 w8 w9", max_new_tokens=16, do_sample=False, eos_token_id=[])
    r = client(server).completions.create(model=MODEL, prompt="w7 w8 w9", max_tokens=16, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == "length"
    ids = api.codec.encode("w7 w8 w9")
    r2 = client(server).completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert r2.choices[0].text == want.text
    streamed = "".join(ch.choices[0].text for ch in client(server).completions.create(
        model=MODEL, prompt="w7 w8 w9", max_tokens=16, temperature=0, stream=True, extra_body={"ignore_eos": True}))
    assert streamed == want.text


def test_logprobs_are_the_python_apis(server, api):
    """Chat (whole and streamed) and completions report each token's log-probability and alternatives as the
    Python API does; a token past top-k reads -9999 (OpenAI's value for probability 0), never a non-JSON -inf."""
    c = client(server)
    want = api.generate(messages=CHAT, max_new_tokens=12, do_sample=False, logprobs=3, eos_token_id=[])
    r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0, logprobs=True,
                                  top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert [e.logprob for e in content] == [t.logprob for t in want.logprobs]
    assert [[x.logprob for x in e.top_logprobs] for e in content] == [[v for _, v in t.top] for t in want.logprobs]
    assert "".join(e.token for e in content) == r.choices[0].message.content
    chunks = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0, logprobs=True,
                                       top_logprobs=3, stream=True, extra_body={"ignore_eos": True})
    streamed = [e.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert streamed == [t.logprob for t in want.logprobs]
    legacy = c.completions.create(model=MODEL, prompt="w7 w8 w9", max_tokens=6, temperature=0.9, seed=2, logprobs=5,
                                  extra_body={"ignore_eos": True, "top_k": 2})
    lp = legacy.choices[0].logprobs
    mine = api.generate(prompt="w7 w8 w9", max_new_tokens=6, do_sample=True, temperature=0.9, seed=2, top_k=2,
                        logprobs=5, eos_token_id=[])
    assert lp.token_logprobs == [t.logprob for t in mine.logprobs]
    assert all(len(top) <= 5 and -9999.0 in top.values() for top in lp.top_logprobs)  # 3 of 5 past top-k 2
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == legacy.choices[0].text


def test_logit_bias_is_the_python_apis(server, api):
    """A bias of -100 on the token greedy decoding would choose first moves the answer as the Python API's."""
    plain = api.generate(messages=CHAT, max_new_tokens=8, do_sample=False, eos_token_id=[])
    first = plain.token_ids[0]
    want = api.generate(messages=CHAT, max_new_tokens=8, do_sample=False, eos_token_id=[], logit_bias={first: -100})
    assert want.token_ids[0] != first
    r = client(server).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0,
                                               logit_bias={str(first): -100}, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == want.text


def test_sampling_with_seed_is_the_python_apis(server, api):
    want = api.generate(messages=CHAT, max_new_tokens=20, do_sample=True, temperature=0.9, top_p=0.95, seed=7,
                        eos_token_id=[])
    r = client(server).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0.9,
                                               top_p=0.95, seed=7, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == want.text


def test_extra_knobs_keep_the_output(server):
    c = client(server)
    outs = {(d, g): c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=20, temperature=0,
                                              extra_body={"drafter": d, "num_draft_tokens": g, "ignore_eos": True})
            for d, g in (("model", 4), ("model", "auto"), ("hybrid", 3), ("prompt-lookup", 3), ("none", 0))}
    texts = {r.choices[0].message.content for r in outs.values()}
    assert len(texts) == 1
    assert outs[("none", 0)].model_extra["ortspec"]["drafted"] == 0
    assert outs[("prompt-lookup", 3)].model_extra["ortspec"]["drafter"] == "prompt_lookup"
    assert outs[("hybrid", 3)].model_extra["ortspec"]["drafter"] == "hybrid"


# -- stop strings ---------------------------------------------------------------------------------------------------

def test_stop_across_a_token_boundary(server):
    c = client(server)
    full = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].message.content
    words = full.split(" ")
    assert len(words) >= 6
    stop = words[3][-2:] + " " + words[4][:2]  # ends inside one token, starts inside the next
    want = full[:full.index(stop)]
    r = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30, temperature=0, stop=[stop, "zzz"],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 30
    chunks = list(c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30, temperature=0, stop=stop,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("pieces, stops, want, hit", [
    (["ab", "cSTO", "Pxyz"], ["STOP"], "abc", True),
    (["S", "T", "O", "X"], ["STOP"], "STOX", False),
    (["xx", "END", "yy"], ["STOP", "END"], "xx", True),
    (["aEN", "Dxx STOPyy"], ["STOP", "END"], "a", True),   # the earliest stop wins
    (["plain text"], [], "plain text", False),
])
def test_stop_text_holds_back_only_possible_starts(pieces, stops, want, hit):
    st = StopText(stops)
    out, stopped = "", False
    for p in pieces:
        text, stopped = st.push(p)
        out += text
        if stopped:
            break
    if not stopped:
        out += st.flush()
    assert (out, stopped) == (want, hit)


# -- concurrency, disconnects ------------------------------------------------------------------------------------

def test_concurrent_clients_get_what_they_get_alone(server):
    requests = []
    for i in range(8):
        msgs = [{"role": "user", "content": f"w{20 + i} w{40 + i} w{60 + i}"}]
        for j in range(4):
            sampled = dict(temperature=0.8, seed=100 * i + j) if j % 2 else dict(temperature=0)
            requests.append((i, dict(messages=msgs, max_tokens=12, **sampled)))
    c = client(server)
    alone = [c.chat.completions.create(model=MODEL, extra_body={"ignore_eos": True}, **kw).choices[0].message.content
             for _, kw in requests]
    together: dict[int, str] = {}
    errors: list = []

    def worker(who: int) -> None:
        mine = client(server)
        try:
            for k, (i, kw) in enumerate(requests):
                if i == who:
                    together[k] = mine.chat.completions.create(model=MODEL, extra_body={"ignore_eos": True},
                                                               **kw).choices[0].message.content
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and [together[k] for k in range(len(requests))] == alone
    wait_idle(server)


def test_a_repeated_system_prompt_comes_from_a_slots_cache(server, api):
    """Two requests sharing a system prompt, one after the other: the second reports the shared tokens as
    cached (OpenAI's usage.prompt_tokens_details.cached_tokens) and answers as it does alone."""
    system = {"role": "system", "content": " ".join(f"w{i}" for i in range(70, 100))}
    c = client(server)
    first = c.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": "w1 w2"}],
                                      max_tokens=6, temperature=0)
    msgs = [system, {"role": "user", "content": "w3 w4 w5"}]
    second = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)
    shared = common_prefix(api.codec.encode_messages([system, {"role": "user", "content": "w1 w2"}]),
                           api.codec.encode_messages(msgs))
    assert first.usage.prompt_tokens_details.cached_tokens < shared
    assert shared - 1 <= second.usage.prompt_tokens_details.cached_tokens <= shared
    assert second.choices[0].message.content == api.generate(messages=msgs, max_new_tokens=6, do_sample=False).text
    assert health(server)["parallel"] >= 1


def test_a_client_dropped_mid_stream_frees_the_server(server):
    before = health(server)["cancelled"]
    conn, resp = open_stream(server, {"model": MODEL, "messages": CHAT, **LONG})
    assert resp.status == 200
    got = 0
    for line in resp:  # read a few content chunks, then hang up
        got += line.startswith(b"data: ")
        if got >= 4:
            break
    conn.sock.close()
    conn.close()
    h = wait_idle(server)
    assert h["cancelled"] == before + 1
    assert h["last"]["finish_reason"] == "cancelled" and h["last"]["completion_tokens"] < LONG["max_tokens"]
    r = client(server).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_client_that_gives_up_on_a_whole_answer_frees_the_server(server):
    before = health(server)["cancelled"]
    u = urlparse(server)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=1.0)
    conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": MODEL, "messages": CHAT, **LONG}),
                 headers={"Content-Type": "application/json"})
    with pytest.raises(OSError):  # the answer would take ~15 s: the client times out and hangs up
        conn.getresponse()
    conn.close()
    h = wait_idle(server)
    assert h["cancelled"] == before + 1 and h["last"]["completion_tokens"] < LONG["max_tokens"]


# -- bad input: documented statuses, JSON errors, never a 500 -----------------------------------------------------

BAD = [
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": CHAT}, 400, "model_not_found"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "n": 2}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "temperature": -1}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "temperature": "hot"}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "top_p": 0}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 0}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "seed": -3}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "stop": ["a", "b", "c", "d", "e"]}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "top_logprobs": 3}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "logprobs": True, "top_logprobs": 21}, 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": "w1", "logprobs": -1}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "logit_bias": {"5": 300}}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "logit_bias": {"x": 1}}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "logit_bias": {"99999": 1}}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "tools": [{"type": "function"}]}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "tool_choice": "required"}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "tools": [
        {"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function",
                                                                            "function": {"name": "g"}}}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "functions": [{"name": "f"}]}, 400,
     "unsupported_parameter"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "presence_penalty": 0.5}, 400,
     "unsupported_parameter"),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "num_draft_tokens": 99}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "drafter": "llama"}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "stream_options": {"include_usage": True}}, 400,
     None),
    ("/v1/chat/completions", {"model": MODEL}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, None),
    ("/v1/chat/completions", [1, 2], 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": ["w1", "w2"]}, 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 999]}, 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": "w1", "echo": True}, 400, "unsupported_parameter"),
    ("/v1/completions", {"model": MODEL, "messages": CHAT}, 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": " ".join(["w5"] * 4100)}, 400, "context_length_exceeded"),
    ("/v1/completions", {"model": MODEL, "prompt": "w1 w2", "max_tokens": 5000}, 400, "context_length_exceeded"),
]


@pytest.mark.parametrize("path, body, status, code", BAD)
def test_bad_requests_get_their_status(server, path, body, status, code):
    got, payload = request(server, "POST", path, body)
    assert got == status, payload
    assert isinstance(payload["error"]["message"], str) and payload["error"]["message"]
    assert "Traceback" not in payload["error"]["message"]
    if code:
        assert payload["error"]["code"] == code


def test_limits_are_named_and_other_failures_are_json(server):
    status, payload = request(server, "POST", "/v1/completions", {"model": MODEL, "prompt": " ".join(["w5"] * 4100)})
    # (a row-invariant target: 4096 positions less the one its attention row takes)
    assert "4095 tokens" in payload["error"]["message"] and "4100" in payload["error"]["message"]
    status, payload = request(server, "POST", "/v1/completions", {"model": MODEL, "prompt": "w1 w2", "max_tokens": 5000})
    assert "4094" in payload["error"]["message"]  # 4095 - 2 prompt tokens + 1
    assert request(server, "POST", "/v1/chat/completions", raw=b"{not json")[0] == 400
    assert request(server, "POST", "/v1/chat/completions", raw=b"x" * (5 << 20))[0] == 413
    assert request(server, "GET", "/v1/nothing")[0] == 404
    assert request(server, "GET", "/v1/chat/completions")[0] == 405
    assert request(server, "GET", "/v1/models/other")[0] == 404
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(model="other", messages=CHAT)
    wait_idle(server)


def test_api_key_queue_limit_and_timeout(guarded):
    key = {"Authorization": "Bearer sekrit"}
    assert request(guarded, "GET", "/v1/models")[0] == 401
    assert request(guarded, "GET", "/v1/models", headers={"Authorization": "Bearer sekrix"})[0] == 401
    assert request(guarded, "GET", "/v1/models", headers=key)[0] == 200
    assert health(guarded)["status"] == "ok"  # health needs no key
    with pytest.raises(openai.AuthenticationError):
        client(guarded, "wrong").chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    assert client(guarded, "sekrit").chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4).choices

    body = {"model": MODEL, "messages": CHAT, **LONG}
    conn_a, a = open_stream(guarded, body, key)           # runs
    conn_b, b = open_stream(guarded, body, key)           # waits (max queue 1)
    assert a.status == b.status == 200
    status, payload = request(guarded, "POST", "/v1/chat/completions", body, key)
    assert status == 429 and "--max-queue" in payload["error"]["message"]
    for conn, resp in ((conn_a, a), (conn_b, b)):          # both run out of their 2 s
        events = sse_events(resp)
        assert "--request-timeout" in events[-2]["error"]["message"] and events[-1] == "[DONE]"
        conn.close()
    wait_idle(guarded)
    status, payload = request(guarded, "POST", "/v1/chat/completions", {**body, "stream": False}, key)
    assert status == 504 and "--request-timeout" in payload["error"]["message"]
    wait_idle(guarded)


def test_stopping_the_server_stops_a_running_generation(serve_bundle, tmp_path):
    proc, url = start_server(serve_bundle, tmp_path / "server.log")
    try:
        conn, resp = open_stream(url, {"model": MODEL, "messages": CHAT, **LONG})
        assert resp.status == 200 and resp.readline()
        deadline = time.monotonic() + 60
        while health(url)["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.terminate()
        proc.wait(timeout=12)  # the generation alone would take ~15 s more; shutdown cancels it
        assert proc.returncode is not None
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()


# -- parsing (no server) ---------------------------------------------------------------------------------------

def test_silent_fields_take_the_bundles_defaults():
    job = parse_request({"messages": CHAT}, "chat", MODEL, ("model", "none"))
    assert job.options["do_sample"] is None and job.options["temperature"] is None and job.max_tokens is None
    assert parse_request({"messages": CHAT, "temperature": 0}, "chat", MODEL, ("model",)).options["do_sample"] is False
    assert parse_request({"messages": CHAT, "top_p": 0.5}, "chat", MODEL, ("model",)).options["do_sample"] is True
    assert parse_request({"messages": CHAT, "max_completion_tokens": 9, "max_tokens": 3}, "chat", MODEL,
                         ("model",)).max_tokens == 9
    with pytest.raises(ApiError):
        parse_request({"messages": CHAT, "drafter": "model"}, "chat", MODEL, ("prompt_lookup", "none"))


# -- multi-turn in the Python API ------------------------------------------------------------------------------

def test_a_follow_up_turn_feeds_only_its_new_tokens(api):
    turn1 = api.generate(messages=CHAT, max_new_tokens=12, do_sample=False, eos_token_id=[])
    cached = list(api.target.tokens)
    convo = CHAT + [{"role": "assistant", "content": turn1.text}, {"role": "user", "content": "w30 w31"}]
    ids = api.codec.encode_messages(convo)
    assert common_prefix(cached, ids) == len(cached)  # the reply re-encodes to the generated ids
    fed = []
    forward = api.target.forward_rows  # (a decoding round's passes)
    api.target.forward_rows = lambda feed, keep=None, options=None: fed.append(len(feed)) or forward(feed, keep, options)
    try:
        turn2 = api.generate(messages=convo, max_new_tokens=8, do_sample=False, eos_token_id=[], num_draft_tokens=4)
    finally:
        api.target.forward_rows = forward
    assert fed[0] <= len(ids) - len(cached) + 1 + 4  # new tokens (at most one re-fed) and the first round's drafts
    cold = SpeculativeGenerator.load(api.bundle.root).generate(messages=convo, max_new_tokens=8, do_sample=False,
                                                               eos_token_id=[])
    assert turn2.token_ids == cold.token_ids


@pytest.mark.parametrize("kwargs, needle", [
    (dict(messages=[{"role": "robot", "content": "x"}]), "role"),
    (dict(messages=[]), "non-empty"),
    (dict(messages=CHAT, system="hi"), "system"),
    (dict(messages=CHAT, prompt="w1"), "exactly one"),
    (dict(messages="w1 w2"), "list"),
])
def test_bad_messages_are_refused(api, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        api.generate(max_new_tokens=2, **kwargs)


@pytest.mark.slow
def test_mixed_load_from_eight_clients_every_answer_valid(tmp_path_factory):
    """tools/serve_soak.py's load, short: 8 clients for 20 s mixing whole and streamed answers, cancellations
    mid-stream, JSON-schema answers, tool calls and invalid requests on a server whose queue fills up. Every
    response is valid or a documented error (400, 404, 429), none is lost or answered twice, memory stays flat."""
    from test_structured import save_bpe_tokenizer
    from tiny import make_model
    from conftest import _export
    sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
    try:
        from serve_soak import KINDS, format_report, soak
    finally:
        sys.path.pop(0)
    work = tmp_path_factory.mktemp("soak")
    hf = make_model("llama", work / "hf", vocab=320, seed=21, scale=3.0, tokenizer=False)
    save_bpe_tokenizer(hf)
    bundle = _export(target=str(hf), draft="self", draft_quant="int4", out=work / "b")
    proc, url = start_server(bundle, work / "server.log", "--max-queue", "2", "--model-name", "soak")
    try:
        report = soak(url, proc.pid, "soak", clients=8, seconds=20, max_tokens=24, seed=1)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = format_report(report)
    print(text)
    assert report["failed"] == 0, text
    assert all(report["by_kind"][k]["ok"] >= 1 for k in KINDS), text
    assert report["admitted"] == report["served"] >= 20, text
    assert report["rss_after_mb"] < report["rss_before_mb"] + 150, text


def _metrics(url: str) -> dict:
    """GET /metrics, parsed by prometheus_client's own parser: {(name, labels without the model): value}."""
    from prometheus_client.parser import text_string_to_metric_families
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type").startswith("text/plain")
    text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model"))
            out[s.name, labels] = s.value
    return out


def test_metrics_parse_and_move_as_requests_run(server):
    before = _metrics(server)
    c = client(server)
    res = c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0,
                                    extra_body={"num_draft_tokens": 3, "drafter": "model"})
    spec = res.usage.model_extra["speculation"]
    assert spec["drafter"] == "model" and spec["drafted"] >= spec["accepted"] >= 0
    assert spec["acceptance_rate"] == res.model_extra["ortspec"]["acceptance_rate"]
    after = _metrics(server)

    def moved(name, labels=()):
        return after.get((name, labels), 0) - before.get((name, labels), 0)
    finish = res.choices[0].finish_reason
    assert moved("ortspec_requests_total", (("outcome", finish),)) == 1
    assert moved("ortspec_generated_tokens_total") == res.usage.completion_tokens
    assert moved("ortspec_prompt_tokens_total") == res.usage.prompt_tokens
    assert moved("ortspec_target_passes_total") >= 1
    drafted = sum(v - before.get(k, 0) for k, v in after.items() if k[0] == "ortspec_draft_tokens_total")
    accepted = sum(v - before.get(k, 0) for k, v in after.items() if k[0] == "ortspec_accepted_tokens_total")
    assert (drafted, accepted) == (spec["drafted"], spec["accepted"])
    assert ("ortspec_draft_tokens_total", (("drafter", "model"), ("position", "1"))) in after
    assert moved("ortspec_request_duration_seconds_count") == 1 and moved("ortspec_time_to_first_token_seconds_count") == 1
    assert after["ortspec_queue_depth", ()] == 0 and after["ortspec_running_requests", ()] == 0


def test_predicted_outputs_through_the_official_client(server):
    """OpenAI's `prediction` argument: the answer is the one without it (greedy), and usage counts the predicted
    tokens accepted and rejected; a prediction as content parts, streamed, gives the same."""
    c = client(server)
    kw = dict(model=MODEL, messages=CHAT, max_tokens=40, temperature=0,
              extra_body={"ignore_eos": True, "drafter": "none"})
    plain = c.chat.completions.create(**kw)
    text = plain.choices[0].message.content
    details = plain.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == details.rejected_prediction_tokens == 0
    got = c.chat.completions.create(**kw, prediction={"type": "content", "content": text})
    assert got.choices[0].message.content == text
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 20 and details.rejected_prediction_tokens == 0, details
    wrong = " ".join(f"w{i}" for i in range(60, 100))
    got = c.chat.completions.create(**kw, prediction={"type": "content", "content": wrong})
    assert got.choices[0].message.content == text
    parts = [{"type": "text", "text": text[:10]}, {"type": "text", "text": text[10:]}]
    pieces, usage = [], None
    for chunk in c.chat.completions.create(**kw, prediction={"type": "content", "content": parts}, stream=True,
                                           stream_options={"include_usage": True}):
        pieces += [ch.delta.content or "" for ch in chunk.choices]
        usage = chunk.usage or usage
    assert "".join(pieces) == text and usage.completion_tokens_details.accepted_prediction_tokens >= 20
    with pytest.raises(openai.BadRequestError, match="prediction"):
        c.chat.completions.create(**kw, prediction={"type": "image", "content": text})


def test_the_load_benchmark_measures_every_client_and_the_first_token_beside_a_long_answer(server):
    """tools/serve_bench.py's measures on the served tiny pair: every request of the mix answered and
    counted, and a short request sent while a long answer runs ends before it (the slots interleave)."""
    sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
    try:
        from serve_bench import load, ttft_beside_a_long_answer
    finally:
        sys.path.pop(0)
    report = load(server, MODEL, clients=2, requests_each=2, short=4, long=8)
    assert report["ok"] == report["requests"] == 4 and report["tokens"] > 0 and report["tokens_per_s"] > 0
    probe = ttft_beside_a_long_answer(server, MODEL, short=4, long=1500)
    assert probe["beside_ttft_s"] is not None and probe["short_ended_before_long"]
    wait_idle(server)
