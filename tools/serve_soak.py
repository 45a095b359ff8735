#!/usr/bin/env python3
"""Mixed load on `ortspec serve` from concurrent clients, every answer checked (loopback only, bounded).

    python tools/serve_soak.py models/smollm2-135m                      # 8 clients, 180 s
    python tools/serve_soak.py models/qwen2.5-coder-int4 --clients 8 --seconds 300 --max-queue 4 --out soak.json

Starts `ortspec serve BUNDLE` on a free 127.0.0.1 port (a child process). Each client sends, until the time or
request budget is spent, a random mix of: whole answers, streamed answers, streams it cancels after two chunks
(closing the connection), JSON-schema answers, tool calls (tool_choice "required"), and invalid requests (bad
JSON, a negative temperature, an unknown model). Every response must be valid — a well-formed completion or
stream, a finished JSON answer that parses, a tool call with JSON arguments — or a documented error: 400 for the
invalid ones, 429 when the queue is full (then the client waits a moment). It checks that no request is lost or
answered twice (every completion id once, the server's served count equal to the requests it admitted), that
the server's memory stays flat (resident set after the run against after a warm-up), and reports latency
percentiles per kind. Exit status 1 if any check fails.

The load benchmark (throughput and latency by client count, beside llama.cpp's server) is tools/serve_bench.py.
"""
from __future__ import annotations

import argparse
import http.client
import json
from pathlib import Path
import random
import subprocess
import sys
import tempfile
import threading
import time

KINDS = ("whole", "stream", "cancel", "schema", "tool", "invalid")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "count"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": {"type": "object", "required": ["city"],
                                                          "properties": {"city": {"type": "string",
                                                                                  "maxLength": 20}}}}}]
PROMPTS = ["Write a haiku about rivers.", "List three prime numbers.", "What is a KV cache?",
           "Explain recursion briefly.", "Name a color and a fruit."]


def start_server(bundle: str, flags: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    code = "from ortspec.cli import main; raise SystemExit(main())"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", bundle, "--host", "127.0.0.1", "--port", "0",
                             *flags], stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        text = log.read_text()
        if " on http://" in text:
            return proc, text.split(" on ", 1)[1].split("/v1", 1)[0]
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the server did not start:\n{log.read_text()}")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sse_chunks(resp):
    """A stream's chunks, parsed, in order; None last where the stream ended with [DONE]."""
    for line in resp:
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            yield None
            return
        yield json.loads(data)


def run_clients(work, clients: int) -> float:
    """``work(c)`` for c in range(clients), each on a thread of its own, all at once: the wall seconds."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


class Client:
    """One connection per request; every outcome is recorded as a dict with "kind", "status", "ok" and why not."""

    def __init__(self, url: str, model: str, max_tokens: int, timeout: float):
        host, port = url.rsplit("//", 1)[1].split(":")
        self.host, self.port, self.model, self.max_tokens, self.timeout = host, int(port), model, max_tokens, timeout

    def _post(self, body: bytes):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        return conn, conn.getresponse()

    def get(self, path: str) -> dict:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        conn.request("GET", path)
        try:
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def body(self, kind: str, rng: random.Random) -> dict:
        body = {"model": self.model, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
        if rng.random() < 0.5:
            body.update(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, seed=rng.randrange(1000))
        else:
            body["temperature"] = 0
        if kind == "schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
            body["max_tokens"] = max(self.max_tokens, 64)
        elif kind == "tool":
            body.update(tools=TOOLS, tool_choice="required", max_tokens=max(self.max_tokens, 64))
        return body

    def run(self, kind: str, rng: random.Random) -> dict:
        t0 = time.perf_counter()
        out = {"kind": kind, "ok": False}
        try:
            if kind == "invalid":
                self._invalid(rng, out)
            elif kind in ("stream", "cancel"):
                self._stream(self.body(kind, rng), kind == "cancel", out, t0)
            else:
                self._whole(self.body(kind, rng), kind, out)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            out["why"] = f"{type(exc).__name__}: {exc}"
        out["total_s"] = time.perf_counter() - t0
        return out

    def _invalid(self, rng: random.Random, out: dict) -> None:
        which = rng.randrange(3)
        raw = [b"{not json", json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                                          "temperature": -1}).encode(),
               json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}).encode()][which]
        conn, resp = self._post(raw)
        payload = json.loads(resp.read())
        conn.close()
        out["status"] = resp.status
        want = 404 if which == 2 else 400
        out["ok"] = resp.status in (want, 400) and isinstance(payload.get("error", {}).get("message"), str)
        if not out["ok"]:
            out["why"] = f"invalid request answered {resp.status}: {payload}"

    def _whole(self, body: dict, kind: str, out: dict) -> None:
        conn, resp = self._post(json.dumps(body).encode())
        payload = json.loads(resp.read())
        conn.close()
        out["status"] = resp.status
        if resp.status == 429:
            out["ok"] = True
            return
        if resp.status != 200:
            out["why"] = f"status {resp.status}: {payload}"
            return
        out["id"] = payload["id"]
        choice = payload["choices"][0]
        message, finish = choice["message"], choice["finish_reason"]
        usage = payload["usage"]
        good = usage["completion_tokens"] >= 1 and finish in ("stop", "length", "tool_calls")
        if kind == "schema" and finish == "stop":
            answer = json.loads(message["content"])
            good = good and isinstance(answer.get("name"), str) and isinstance(answer.get("count"), int)
        if kind == "tool":
            calls = message.get("tool_calls") or []
            good = good and (finish == "length" or bool(calls) and all(
                c["function"]["name"] == "get_weather" and isinstance(json.loads(c["function"]["arguments"]), dict)
                for c in calls))
        out["ok"] = good and isinstance(message.get("content") or "", str)
        out["finish"] = finish
        if not out["ok"]:
            out["why"] = f"malformed answer: {payload}"

    def _stream(self, body: dict, cancel: bool, out: dict, t0: float) -> None:
        body = dict(body, stream=True)
        conn, resp = self._post(json.dumps(body).encode())
        out["status"] = resp.status
        if resp.status != 200:
            payload = json.loads(resp.read())
            conn.close()
            out["ok"] = resp.status == 429
            if not out["ok"]:
                out["why"] = f"status {resp.status}: {payload}"
            return
        chunks, ids, finish, done = 0, set(), None, False
        for chunk in sse_chunks(resp):
            if chunk is None:
                done = True
                break
            if "error" in chunk:
                out["why"] = f"stream error: {chunk['error']}"
                conn.close()
                return
            ids.add(chunk["id"])
            for c in chunk["choices"]:
                finish = c.get("finish_reason") or finish
                if c.get("delta", {}).get("content") and "ttft_s" not in out:  # the first text (not the role)
                    out["ttft_s"] = time.perf_counter() - t0
            chunks += 1
            if cancel and chunks == 2:
                conn.close()  # the client goes away mid-stream
                out.update(ok=True, cancelled=True, id=ids.pop())
                return
        conn.close()
        out["ok"] = done and len(ids) == 1 and finish in ("stop", "length")
        out["id"] = ids.pop() if ids else None
        if not out["ok"]:
            out["why"] = f"stream ended without [DONE], one id and a finish reason ({done}, {ids}, {finish})"


def soak(url: str, pid: int, model: str, clients: int = 8, seconds: float = 180.0, max_requests: int = 10_000,
         max_tokens: int = 24, seed: int = 0, kinds: tuple = KINDS, timeout: float = 600.0) -> dict:
    """Run the mixed load against a started server; the report (see the module's docstring) with "failures"."""
    probe = Client(url, model, max_tokens, timeout)
    for kind in ("whole", "stream"):  # warm: the first answers load caches and allocate buffers
        probe.run(kind, random.Random(seed))
    time.sleep(0.5)
    before_mb, served_before = rss_mb(pid), probe.get("/health")["served"]
    results: list[dict] = []
    lock = threading.Lock()
    deadline, budget = time.monotonic() + seconds, [max_requests]

    def work(c: int) -> None:
        rng, client = random.Random(seed * 1000 + c), Client(url, model, max_tokens, timeout)
        while time.monotonic() < deadline:
            with lock:
                if budget[0] <= 0:
                    return
                budget[0] -= 1
            r = client.run(rng.choice(kinds), rng)
            with lock:
                results.append(r)
            if r.get("status") == 429:
                time.sleep(0.2 + rng.random() * 0.3)

    wall = run_clients(work, clients)
    # the server finishes cancelled generations within a round: wait until nothing runs or waits
    health = probe.get("/health")
    for _ in range(600):
        if not health["running"] and not health["waiting"]:
            break
        time.sleep(0.1)
        health = probe.get("/health")
    after_mb = rss_mb(pid)
    admitted = [r for r in results if r.get("status") == 200]
    ids = [r["id"] for r in admitted if r.get("id")]
    failures = [r for r in results if not r["ok"]]
    if len(ids) != len(set(ids)):
        failures.append({"kind": "-", "why": "a completion id answered twice"})
    served = health["served"] - served_before
    if served != len(admitted):
        failures.append({"kind": "-", "why": f"the server served {served} requests, the clients got {len(admitted)} "
                                             "admitted answers: a request was lost or answered twice"})
    by_kind = {}
    for kind in kinds:
        mine = [r for r in results if r["kind"] == kind]
        totals = [r["total_s"] for r in mine if r.get("status") == 200]
        ttft = [r["ttft_s"] for r in mine if "ttft_s" in r]
        by_kind[kind] = {"requests": len(mine), "ok": sum(r["ok"] for r in mine),
                         "rejected_429": sum(r.get("status") == 429 for r in mine),
                         "total_p50_s": pct(totals, 0.5), "total_p95_s": pct(totals, 0.95),
                         "total_p99_s": pct(totals, 0.99), "ttft_p50_s": pct(ttft, 0.5), "ttft_p95_s": pct(ttft, 0.95)}
    return {"clients": clients, "seconds": wall, "requests": len(results), "admitted": len(admitted),
            "served": served, "rss_before_mb": before_mb, "rss_after_mb": after_mb, "by_kind": by_kind,
            "failures": failures[:20], "failed": len(failures)}


# -- the load benchmark ----------------------------------------------------------------------------------------

def format_report(r: dict) -> str:
    lines = [f"{r['clients']} clients, {r['seconds']:.0f} s: {r['requests']} requests, {r['admitted']} admitted, "
             f"{r['served']} served by the server, {r['failed']} failed checks; server memory "
             f"{r['rss_before_mb']:.0f} MB after warm-up -> {r['rss_after_mb']:.0f} MB after the run",
             f"{'kind':<8}{'requests':>9}{'ok':>6}{'429':>6}{'p50 s':>8}{'p95 s':>8}{'p99 s':>8}{'ttft p50':>10}"]
    for kind, k in r["by_kind"].items():
        lines.append(f"{kind:<8}{k['requests']:>9}{k['ok']:>6}{k['rejected_429']:>6}{k['total_p50_s']:>8.2f}"
                     f"{k['total_p95_s']:>8.2f}{k['total_p99_s']:>8.2f}{k['ttft_p50_s']:>10.2f}")
    lines += [f"FAILED {f['kind']}: {f.get('why')}" for f in r["failures"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--seconds", type=float, default=180.0, help="how long the clients send (default 180)")
    ap.add_argument("--max-requests", type=int, default=10_000, help="stop after this many requests in all")
    ap.add_argument("--max-tokens", type=int, default=48, help="max_tokens of each request (default 48)")
    ap.add_argument("--max-queue", type=int, default=4, help="the server's --max-queue (default 4: 429s happen)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the report as JSON")
    args = ap.parse_args()
    if args.clients < 1 or args.seconds <= 0 or args.max_requests < 1 or args.max_tokens < 1 or args.max_queue < 0:
        ap.error("--clients, --max-requests and --max-tokens must be >= 1, --seconds > 0, --max-queue >= 0")
    log = Path(tempfile.mkdtemp()) / "server.log"
    model = "soak"
    proc, url = start_server(args.bundle, ["--max-queue", str(args.max_queue), "--model-name", model], log)
    print(f"server {url} (log {log})", file=sys.stderr)
    try:
        report = soak(url, proc.pid, model, args.clients, args.seconds, args.max_requests, args.max_tokens, args.seed)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(format_report(report))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
