"""Replicas of `ortspec serve` on Ray Serve (ortspec.replicas): a local Ray cluster, two replicas behind Ray's HTTP
proxy, answered through the official openai client."""
from __future__ import annotations

import os
import socket

import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")
pytest.importorskip("starlette")

from ortspec import SpeculativeGenerator  # noqa: E402
from ortspec.replicas import application, build  # noqa: E402

CHAT = [{"role": "user", "content": "w10 w11 w12 w13"}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(llama_bundle):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 2 ** 20, log_to_driver=False,
             configure_logging=False)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application(str(llama_bundle), replicas=2, num_cpus=1, parallel=2, threads=1, model_id="tiny"),
                  name="ortspec", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_through_the_official_client(cluster, llama_bundle):
    status = serve.status().applications["ortspec"]
    assert status.status == "RUNNING"
    (deployment,) = status.deployments.values()
    assert deployment.replica_states.get("RUNNING") == 2
    client = openai.OpenAI(base_url=cluster + "/v1", api_key="unused", max_retries=2, timeout=120)
    want = SpeculativeGenerator.load(llama_bundle).generate(messages=CHAT, max_new_tokens=8, do_sample=False).text
    for _ in range(4):  # spread over both replicas: every one answers as the model does alone
        r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, temperature=0)
        assert r.choices[0].message.content == want
    parts = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == want
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_health_and_metrics_answer_through_the_proxy(cluster):
    import http.client
    from urllib.parse import urlparse
    import json
    u = urlparse(cluster)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    body = json.loads(resp.read())
    assert resp.status == 200 and body["status"] == "ok" and body["parallel"] == 2
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    assert resp.status == 200 and b"ortspec_slots" in resp.read()
    conn.close()


def test_bad_options_are_refused_before_any_cluster_work(llama_bundle):
    with pytest.raises(ValueError, match="unknown server options"):
        application(str(llama_bundle), paralel=2)
    with pytest.raises(ValueError, match="replicas"):
        application(str(llama_bundle), replicas=0)
    with pytest.raises(ValueError, match="bundle"):
        build({"replicas": "2"})
