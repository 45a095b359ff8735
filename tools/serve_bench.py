#!/usr/bin/env python3
"""The load benchmark: several clients at once against `ortspec serve` (one request at a time, and N slots) and
llama.cpp's server with N slots on the same file, interleaved.

    python tools/serve_bench.py models/smollm2-135m --counts 1,4,8 --parallel 4 \
        --llama-server ~/.cache/llama-cpp/bin --gguf ~/.cache/ortspec/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    python tools/serve_bench.py models/qwen2.5-coder-gguf --counts 1,4 --repeat 3 --out load.json

Every server starts at once, each on a free 127.0.0.1 port (child processes; an idle one takes no CPU): ortspec
with --parallel 1, ortspec with --parallel N (and with --unbatched, --parallel N --no-batch), and with
--llama-server, llama-server -np N. For each server in turn, a 16-token streamed request's time to first token
alone and then while a 512-token answer runs (``--probe-repeat`` times, medians). Then ``--repeat`` rounds: in
each, every client count on every server, the servers in a rotating order, the clients each sending
``--requests-each`` requests of a fixed mix (short and long, streamed and whole, greedy and sampled at T 0.7,
top-p 0.8, top-k 20, repetition 1.05) one after another. Reported per server and count: aggregate completion tokens/s (the median of the rounds), its
ratio to the one-at-a-time server (the median of the rounds' ratios: each round's servers ran minutes apart at
most, on the same machine's load), first-token and per-token latency percentiles over every round's requests,
and the server's resident memory after the count's last round (its slots empty again).
"""
from __future__ import annotations

import argparse
import http.client
import json
from pathlib import Path
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from serve_soak import pct, rss_mb, run_clients, sse_chunks, start_server  # (this file's directory is on the path)

LOAD_PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
                "Explain what a hash map is, with an example.", "Write a haiku about the sea.",
                "List five uses of a binary search tree.", "Describe how HTTP caching works.",
                "Write a SQL query that counts orders per customer.", "What does a compiler do?",
                "Summarize the rules of chess in a few sentences."]


def load_request(c: int, i: int, short: int, long: int) -> dict:
    """Client ``c``'s ``i``-th request of the load mix (the same on every server): every other one short, the
    rest long; half streamed; half greedy, half sampled (T 0.7, top-p 0.8, top-k 20, repetition 1.05)."""
    k = c * 7 + i
    body = {"messages": [{"role": "user", "content": LOAD_PROMPTS[k % len(LOAD_PROMPTS)]}],
            "max_tokens": short if k % 2 == 0 else long, "stream": (k // 2) % 2 == 0}
    if (k // 4) % 2:
        body.update(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, seed=k)
    else:
        body["temperature"] = 0
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    return body


def timed_request(url: str, model: str, body: dict, timeout: float = 900.0) -> dict:
    """One request, timed: total seconds, first-token seconds (streams), completion tokens, and the gaps
    between content chunks of a stream (per-token latency)."""
    host, port = url.rsplit("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(dict(body, model=model)).encode(),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = {"status": resp.status, "stream": body["stream"], "max_tokens": body["max_tokens"], "tokens": 0}
    try:
        if resp.status != 200 or not body["stream"]:
            payload = json.loads(resp.read())
            if resp.status == 200:
                out["tokens"] = payload["usage"]["completion_tokens"]
            return out
        last, gaps, chunks = None, [], 0
        for chunk in sse_chunks(resp):
            if chunk is None:
                break
            if chunk.get("usage"):
                out["tokens"] = chunk["usage"]["completion_tokens"]
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                now = time.perf_counter()
                chunks += 1
                if last is None:
                    out["ttft_s"] = now - t0
                else:
                    gaps.append(now - last)
                last = now
        out["tokens"] = out["tokens"] or chunks
        out["gaps_s"] = gaps
        return out
    finally:
        conn.close()
        out["total_s"] = time.perf_counter() - t0


def load(url: str, model: str, clients: int, requests_each: int = 4, short: int = 16, long: int = 128) -> dict:
    """``clients`` clients at once, each sending ``requests_each`` requests of the load mix one after another:
    aggregate completion tokens per second, time to first token (streams), seconds per token of a stream's
    decode ((total - first token) / (tokens - 1): a round's tokens come together) and total seconds
    (percentiles, and each request's)."""
    results: list[dict] = []
    lock = threading.Lock()

    def work(c: int) -> None:
        for i in range(requests_each):
            r = timed_request(url, model, load_request(c, i, short, long))
            with lock:
                results.append(r)

    wall = run_clients(work, clients)
    ok = [r for r in results if r["status"] == 200]
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["ttft_s"] for r in ok if "ttft_s" in r]
    per_token = [(r["total_s"] - r["ttft_s"]) / (r["tokens"] - 1) for r in ok
                 if "ttft_s" in r and r["tokens"] > 1]
    return {"clients": clients, "requests": len(results), "ok": len(ok), "tokens": tokens, "seconds": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_s": pct(ttft, 0.5), "ttft_p95_s": pct(ttft, 0.95),
            "per_token_p50_s": pct(per_token, 0.5), "per_token_p95_s": pct(per_token, 0.95),
            "total_p50_s": pct([r["total_s"] for r in ok], 0.5), "total_p95_s": pct([r["total_s"] for r in ok], 0.95),
            "ttft_s": ttft, "per_token_s": per_token, "total_s": [r["total_s"] for r in ok]}


def ttft_beside_a_long_answer(url: str, model: str, short: int = 16, long: int = 512) -> dict:
    """A short streamed greedy request's time to first token alone, then while a ``long``-token answer runs
    (sent once that answer's first token has come)."""
    body = {"messages": [{"role": "user", "content": LOAD_PROMPTS[2]}], "max_tokens": short, "temperature": 0,
            "stream": True}
    alone = timed_request(url, model, body)
    started = threading.Event()
    box: list = []

    def run_long() -> None:
        host, port = url.rsplit("//", 1)[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=900)
        conn.request("POST", "/v1/chat/completions", headers={"Content-Type": "application/json"},
                     body=json.dumps({"model": model, "messages": [{"role": "user", "content": LOAD_PROMPTS[0]}],
                                      "max_tokens": long, "temperature": 0, "stream": True,
                                      "ignore_eos": True}).encode())
        try:
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"the long answer was refused: {resp.status} {resp.read()[:300]!r}")
            for chunk in sse_chunks(resp):
                if chunk is None:
                    break
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    started.set()  # its first text, not the role chunk
            box.append(time.perf_counter())
        except Exception as exc:
            box.append(exc)
        finally:
            started.set()  # (a long answer that failed or ended without text: the probe goes on, and says so)
            conn.close()

    t = threading.Thread(target=run_long)
    t.start()
    started.wait(900)
    beside = timed_request(url, model, body)
    done_short = time.perf_counter()
    t.join()
    if box and isinstance(box[0], Exception):
        raise box[0]
    return {"alone_ttft_s": alone.get("ttft_s"), "beside_ttft_s": beside.get("ttft_s"),
            "ratio": (beside.get("ttft_s") or float("nan")) / (alone.get("ttft_s") or float("nan")),
            "short_ended_before_long": bool(box) and done_short < box[0]}


def probe(url: str, model: str, long: int, repeat: int) -> dict:
    """``ttft_beside_a_long_answer`` ``repeat`` times: the medians of the first token's times alone and beside
    the long answer, their ratio, and each run (a first token of 30 ms moves by tens of percent run to run)."""
    runs = [ttft_beside_a_long_answer(url, model, long=long) for _ in range(repeat)]
    alone = statistics.median(r["alone_ttft_s"] for r in runs)
    beside = statistics.median(r["beside_ttft_s"] for r in runs)
    return {"alone_ttft_s": alone, "beside_ttft_s": beside, "ratio": beside / alone,
            "short_ended_before_long": all(r["short_ended_before_long"] for r in runs), "runs": runs}


def start_llama_server(bin_dir: str, gguf: str, parallel: int, threads: int, ctx_per_slot: int,
                       log: Path) -> tuple[subprocess.Popen, str]:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([str(Path(bin_dir) / "llama-server"), "-m", gguf, "--host", "127.0.0.1", "--port",
                             str(port), "-t", str(threads), "-np", str(parallel), "-c", str(ctx_per_slot * parallel)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, url
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"llama-server did not start:\n{log.read_text()[-2000:]}")


def load_table(rows: list[dict]) -> str:
    lines = [f"{'server':<34}{'clients':>8}{'tok/s':>8}{'x 1-at-a-time':>15}{'ttft p50':>10}{'ttft p95':>10}"
             f"{'s/token p50':>13}{'p95':>8}{'total p95':>11}{'RSS MB':>8}"]
    for r in rows:
        lines.append(f"{r['server']:<34}{r['clients']:>8}{r['tokens_per_s']:>8.1f}{r['ratio']:>15.2f}"
                     f"{r['ttft_p50_s']:>10.2f}{r['ttft_p95_s']:>10.2f}{r['per_token_p50_s']:>13.3f}"
                     f"{r['per_token_p95_s']:>8.3f}{r['total_p95_s']:>11.2f}{r['rss_mb']:>8.0f}")
    return "\n".join(lines)


def summarize(name: str, clients: int, runs: list[dict], base: list[dict], rss: float) -> dict:
    """One table row from a server's rounds at one client count (``base``: the one-at-a-time server's rounds
    at that count, in the same order)."""
    ttft = [t for r in runs for t in r["ttft_s"]]
    per_token = [t for r in runs for t in r["per_token_s"]]
    totals = [t for r in runs for t in r["total_s"]]
    return {"server": name, "clients": clients, "rounds": [r["tokens_per_s"] for r in runs],
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs),
            "ratio": statistics.median(r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(runs, base)),
            "requests": sum(r["requests"] for r in runs), "ok": sum(r["ok"] for r in runs),
            "ttft_p50_s": pct(ttft, 0.5), "ttft_p95_s": pct(ttft, 0.95),
            "per_token_p50_s": pct(per_token, 0.5), "per_token_p95_s": pct(per_token, 0.95),
            "total_p95_s": pct(totals, 0.95), "rss_mb": rss}


def run(args, counts: list[int]) -> int:
    servers = [("ortspec serve --parallel 1", ["--parallel", "1"]),
               (f"ortspec serve --parallel {args.parallel}", ["--parallel", str(args.parallel)])]
    if args.unbatched:
        servers.append((f"ortspec serve --parallel {args.parallel} --no-batch",
                        ["--parallel", str(args.parallel), "--no-batch"]))
    if args.llama_server:
        servers.append((f"llama-server -np {args.parallel}", None))
    started = []
    try:
        for name, flags in servers:
            log = Path(tempfile.mkdtemp()) / "server.log"
            if flags is None:
                proc, url = start_llama_server(args.llama_server, args.gguf, args.parallel, args.threads,
                                               args.ctx_per_slot, log)
                model = "gguf"
            else:
                model = "load"
                proc, url = start_server(args.bundle, flags + ["--max-queue", "64", "--model-name", model], log)
            started.append((name, proc, url, model))
            print(f"{name}: {url} (log {log})", file=sys.stderr)
        probes = {}
        for name, proc, url, model in started:
            timed_request(url, model, load_request(0, 1, 8, 8))  # warm: caches, buffers
            probes[name] = probe(url, model, args.probe_tokens, args.probe_repeat)
            print(f"  {name}: a short request's first token {probes[name]['alone_ttft_s']:.3f} s alone, "
                  f"{probes[name]['beside_ttft_s']:.3f} s beside a long answer", file=sys.stderr)
        runs: dict = {}
        rss: dict = {}
        for rep in range(args.repeat):
            for c in counts:
                order = started[rep % len(started):] + started[:rep % len(started)]
                for name, proc, url, model in order:
                    r = load(url, model, c, args.requests_each, args.short, args.long)
                    runs.setdefault((name, c), []).append(r)
                    rss[(name, c)] = rss_mb(proc.pid)
                    print(f"  round {rep + 1}, {c} clients, {name}: {r['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    finally:
        for _, proc, _, _ in started:
            proc.terminate()
        for _, proc, _, _ in started:
            proc.wait(timeout=60)
    base_name = started[0][0]
    rows = [summarize(name, c, runs[(name, c)], runs[(base_name, c)], rss[(name, c)])
            for name, _, _, _ in started for c in counts]
    print(load_table(rows))
    print()
    for name, p in probes.items():
        print(f"{name}: a 16-token request's first token {p['alone_ttft_s']:.2f} s alone, "
              f"{p['beside_ttft_s']:.2f} s while a {args.probe_tokens}-token answer runs ({p['ratio']:.2f}x); "
              f"ended before it: {p['short_ended_before_long']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "ttft_beside_long": probes}, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--counts", default="1,2,4,8", help="client counts to run (default 1,2,4,8)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds over every count and server (default 2)")
    ap.add_argument("--parallel", type=int, default=4, help="slots of the concurrent servers (default 4)")
    ap.add_argument("--unbatched", action="store_true",
                    help="also run ortspec --parallel N --no-batch (each request's target pass on its own)")
    ap.add_argument("--requests-each", type=int, default=4, help="requests per client per round (default 4)")
    ap.add_argument("--short", type=int, default=16, help="max_tokens of the short requests (default 16)")
    ap.add_argument("--long", type=int, default=128, help="max_tokens of the long requests (default 128)")
    ap.add_argument("--llama-server", metavar="BIN_DIR", help="llama.cpp's binaries: run llama-server too")
    ap.add_argument("--gguf", help="the GGUF file llama-server runs (the bundle's source)")
    ap.add_argument("--threads", type=int, default=2, help="llama-server's threads (default 2)")
    ap.add_argument("--ctx-per-slot", type=int, default=2048, help="llama-server's context per slot (default 2048)")
    ap.add_argument("--probe-tokens", type=int, default=512,
                    help="tokens of the long answer the first-token probe runs beside (default 512)")
    ap.add_argument("--probe-repeat", type=int, default=3,
                    help="runs of the first-token probe per server, medians reported (default 3)")
    ap.add_argument("--out", help="write the rows and probes as JSON")
    args = ap.parse_args()
    if args.llama_server and not args.gguf:
        ap.error("--llama-server needs --gguf FILE")
    try:
        counts = [int(c) for c in args.counts.split(",")]
    except ValueError:
        ap.error(f"--counts takes client counts separated by commas, e.g. 1,4,8; got {args.counts!r}")
    if not counts or min(counts) < 1 or min(args.repeat, args.parallel, args.requests_each, args.probe_tokens,
                                              args.probe_repeat) < 1:
        ap.error("--counts, --repeat, --parallel, --requests-each, --probe-tokens and --probe-repeat must be >= 1")
    return run(args, counts)


if __name__ == "__main__":
    sys.exit(main())
