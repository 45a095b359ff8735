#!/usr/bin/env python3
"""Bounded load test of `ortspec serve` on loopback, against the direct Python API.

    python tools/serve_load.py models/smollm2-135m
    python tools/serve_load.py models/qwen2.5-coder-int4 --requests 12 --clients 4 --max-tokens 64

Starts `ortspec serve BUNDLE` on a free 127.0.0.1 port (a child process) and
loads the same bundle in this process, then:

1. overhead, one client: per prompt and setting (greedy; sampled at T 0.7,
   top-p 0.8, top-k 20, repetition penalty 1.05) the same request through the
   direct API and through the server (streaming), interleaved with alternating
   order; tokens/s of each is new tokens / wall time from call to last token.
   Reports the median server/direct ratio (overhead = 1 - ratio).
2. concurrency: --requests requests from --clients threads at once; reports
   throughput (completion tokens/s over the wall time) and p50/p95 time to
   first token (queueing included) and the 429s seen.
3. follow-up turns: a chat turn, then its continuation (the reply plus a new
   user message); time to first token of the continuation with the previous
   turn cached against the same continuation sent cold.

Only loopback; the request count is fixed. --out writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import http.client
import json
from pathlib import Path
import statistics
import sys
import tempfile
import threading
import time

from ortspec.shipped import DEV_PROMPTS, shipped
from serve_soak import pct, run_clients, sse_chunks, start_server  # (this file's directory is on the path)

ROOT = Path(__file__).resolve().parent.parent
SAMPLED = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
FOLLOW_UPS = ["Thanks. Now make it shorter.", "Explain the second step in more detail.",
              "Rewrite that with comments.", "What are the edge cases?"]


def stream_request(url: str, body: dict) -> dict:
    """One streaming chat request with the standard library: text, tokens, time to first text, total time."""
    host, port = url.rsplit("//", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True,
                                                                   "stream_options": {"include_usage": True}}),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        payload = json.loads(resp.read())
        conn.close()
        return {"status": resp.status, "error": payload["error"]["message"]}
    text, first, usage = [], None, {}
    for chunk in sse_chunks(resp):
        if chunk is None:
            break
        if "error" in chunk:
            return {"status": 500, "error": chunk["error"]["message"]}
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            piece = choice["delta"].get("content")
            if piece:
                first = first or time.perf_counter()
                text.append(piece)
    total = time.perf_counter() - t0
    conn.close()
    return {"status": 200, "text": "".join(text), "tokens": usage.get("completion_tokens", 0),
            "ttft_s": (first or time.perf_counter()) - t0, "total_s": total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(shipped(DEV_PROMPTS)))
    ap.add_argument("--overhead-prompts", type=int, default=8, help="prompts for the overhead phase (default 8)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the overhead prompts (default 1)")
    ap.add_argument("--requests", type=int, default=16, help="requests in the concurrency phase (default 16)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent clients in that phase (default 4)")
    ap.add_argument("--turns", type=int, default=4, help="conversations in the follow-up phase (default 4)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--num-draft-tokens", default="4")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args()
    if min(args.requests, args.clients, args.overhead_prompts) < 1 or args.turns < 0:
        sys.exit("--requests, --clients and --overhead-prompts must be >= 1 and --turns >= 0")

    from ortspec import SpeculativeGenerator
    prompts = [json.loads(line)["prompt"] for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    gamma = args.num_draft_tokens if args.num_draft_tokens == "auto" else int(args.num_draft_tokens)
    log = Path(tempfile.mkdtemp()) / "server.log"
    proc, url = start_server(args.bundle, ["--num-draft-tokens", str(gamma), "--max-queue", str(args.requests)],
                             log)
    print(f"server {url} (log {log})", file=sys.stderr)
    gen = SpeculativeGenerator.load(args.bundle, thread_pool="shared")
    report: dict = {"bundle": args.bundle, "max_tokens": args.max_tokens, "num_draft_tokens": gamma}
    try:
        # 1. overhead against the direct API, one client, interleaved
        settings = {"greedy": ({"do_sample": False}, {"temperature": 0}),
                    "sampled": ({"do_sample": True, **SAMPLED}, SAMPLED)}
        for name, (api_kw, body_kw) in settings.items():
            ratios, direct_tps, server_tps = [], [], []
            chosen = prompts[:args.overhead_prompts]
            for i, prompt in enumerate(chosen * max(1, args.repeat)):
                messages = [{"role": "user", "content": prompt}]
                seed = {"seed": i % len(chosen)} if name == "sampled" else {}

                def direct():
                    t0 = time.perf_counter()
                    r = gen.generate(messages=messages, max_new_tokens=args.max_tokens, num_draft_tokens=gamma,
                                     **api_kw, **seed)
                    return r.text, len(r.token_ids) / (time.perf_counter() - t0)

                def served():
                    r = stream_request(url, {"messages": messages, "max_tokens": args.max_tokens, **body_kw, **seed})
                    if r["status"] != 200:
                        sys.exit(f"server error: {r}")
                    return r["text"], r["tokens"] / r["total_s"]

                if i == 0:  # warm both paths
                    direct(), served()
                first, second = (direct, served) if i % 2 == 0 else (served, direct)
                a, b = first(), second()
                (d_text, d_tps), (s_text, s_tps) = (a, b) if first is direct else (b, a)
                if d_text != s_text:
                    sys.exit(f"prompt {i} ({name}): the server's text differs from the direct API's")
                direct_tps.append(d_tps)
                server_tps.append(s_tps)
                ratios.append(s_tps / d_tps)
            med = statistics.median(ratios)
            report[f"overhead_{name}"] = {"direct_tok_s": statistics.median(direct_tps),
                                          "server_tok_s": statistics.median(server_tps),
                                          "ratio_median": med, "ratios": ratios}
            print(f"one client, {name}: direct {statistics.median(direct_tps):.1f} tok/s, server "
                  f"{statistics.median(server_tps):.1f} tok/s, server/direct median {med:.3f} "
                  f"(overhead {1 - med:+.1%}) over {len(ratios)} requests, texts identical")

        # 2. concurrency
        results: list[dict] = []
        lock = threading.Lock()
        jobs = [(k, prompts[k % len(prompts)]) for k in range(args.requests)]

        def client(which: int) -> None:
            for k, prompt in jobs[which::args.clients]:
                r = stream_request(url, {"messages": [{"role": "user", "content": prompt}],
                                         "max_tokens": args.max_tokens, "temperature": 0})
                with lock:
                    results.append(r)

        wall = run_clients(client, args.clients)
        ok = [r for r in results if r["status"] == 200]
        ttft = [r["ttft_s"] for r in ok]
        report["concurrency"] = {"clients": args.clients, "requests": args.requests, "ok": len(ok),
                                 "rejected_429": sum(r["status"] == 429 for r in results),
                                 "throughput_tok_s": sum(r["tokens"] for r in ok) / wall,
                                 "ttft_p50_s": pct(ttft, 0.5), "ttft_p95_s": pct(ttft, 0.95), "wall_s": wall}
        c = report["concurrency"]
        print(f"{args.clients} clients x {args.requests} requests: {c['ok']} ok, {c['rejected_429']} x 429, "
              f"{c['throughput_tok_s']:.1f} tok/s, time to first token p50 {c['ttft_p50_s']:.2f} s, "
              f"p95 {c['ttft_p95_s']:.2f} s (queueing included)")

        # 3. follow-up turns: cached previous turn vs cold
        warm, cold = [], []
        for i in range(args.turns):
            convo = [{"role": "user", "content": prompts[i % len(prompts)]}]
            turn1 = stream_request(url, {"messages": convo, "max_tokens": args.max_tokens, "temperature": 0})
            convo += [{"role": "assistant", "content": turn1["text"]},
                      {"role": "user", "content": FOLLOW_UPS[i % len(FOLLOW_UPS)]}]
            body = {"messages": convo, "max_tokens": 8, "temperature": 0}
            warm.append(stream_request(url, body)["ttft_s"])
            stream_request(url, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})  # evict
            cold.append(stream_request(url, body)["ttft_s"])
        if warm:
            report["follow_up"] = {"ttft_cached_s": warm, "ttft_cold_s": cold,
                                   "ratio_median": statistics.median(w / c for w, c in zip(warm, cold))}
            print(f"follow-up turn, time to first token: cached {statistics.median(warm) * 1000:.0f} ms vs cold "
                  f"{statistics.median(cold) * 1000:.0f} ms (median ratio "
                  f"{report['follow_up']['ratio_median']:.2f}) over {len(warm)} conversations")
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
