#!/usr/bin/env python3
"""OpenVINO GenAI as a peer for tools/compare_peers.py: a worker, run by an interpreter that has openvino-genai
(a virtual environment of its own: `pip install openvino-genai`; it is not an ortspec dependency).

    PYTHON tools/openvino_peer.py TARGET.gguf [--draft DRAFT_IR_DIR] [--threads 2]

Loads the target, a pipeline over it with prompt lookup and, given a draft, one speculating with it, on the
CPU. The draft must be an OpenVINO IR directory (openvino_model.xml, as optimum-intel exports one): OpenVINO
GenAI 2026.4 takes a draft GGUF file only as a directory and fails to read Qwen2.5-Coder-0.5B's Q4_K_M file
("gguf_tensor_to_f16 failed"). The worker then answers one JSON request per line on stdin with one JSON line
on stdout:

    {"mode": "target" | "draft" | "lookup", "prompt": "...", "max_new_tokens": 96, "gamma": 4,
     "sampling": null | {"temperature": .., "top_p": .., "top_k": .., "repetition_penalty": ..}}
 -> {"tokens": N, "decode_s": S, "text": "..."}

The prompt is the user's message: OpenVINO GenAI applies the model's chat template itself. ``decode_s`` is
OpenVINO's own generation time less its time to the first token: decode-only, as llama.cpp's counters and
compare_peers' ortspec rows are timed.
"""
from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("target")
    ap.add_argument("--draft")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import openvino_genai as og
    opts = {"INFERENCE_NUM_THREADS": args.threads}
    pipes = {"target": og.LLMPipeline(args.target, "CPU", **opts)}
    pipes["lookup"] = og.LLMPipeline(args.target, "CPU", prompt_lookup=True, **opts)
    if args.draft:
        pipes["draft"] = og.LLMPipeline(args.target, "CPU", draft_model=og.draft_model(args.draft, "CPU", **opts),
                                        **opts)
    print(json.dumps({"ready": sorted(pipes)}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        cfg = og.GenerationConfig()
        cfg.max_new_tokens = int(req["max_new_tokens"])
        cfg.apply_chat_template = True
        sampling = req.get("sampling")
        cfg.do_sample = bool(sampling)
        if sampling:
            cfg.temperature, cfg.top_p = sampling["temperature"], sampling["top_p"]
            cfg.top_k, cfg.repetition_penalty = sampling["top_k"], sampling["repetition_penalty"]
            cfg.rng_seed = int(req.get("seed", 0))
        if req["mode"] == "draft":
            cfg.num_assistant_tokens = int(req.get("gamma", 4))
        elif req["mode"] == "lookup":
            cfg.num_assistant_tokens, cfg.max_ngram_size = int(req.get("gamma", 4)), 3
        out = pipes[req["mode"]].generate([req["prompt"]], cfg)  # (a list: results with their metrics)
        metrics = out.perf_metrics
        tokens = int(metrics.get_num_generated_tokens())
        decode = (metrics.get_generate_duration().mean - metrics.get_ttft().mean) / 1e3
        print(json.dumps({"tokens": tokens, "decode_s": decode, "text": out.texts[0]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
