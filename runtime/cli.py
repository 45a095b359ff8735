"""The `ortspec` command line: export, generate, serve, inspect, bench, verify, quality.

Thin front end over the public Python API. Errors print one line without a
traceback (exit 2 for bad arguments, 1 for everything else); --debug shows it.
"""
from __future__ import annotations

import argparse
import re
import sys

from . import __version__
from .errors import OrtspecError

EPILOG_EXPORT = """examples:
  ortspec export --recipe smollm2-135m --out models/smollm2-135m
  ortspec export --target HuggingFaceTB/SmolLM2-360M-Instruct --draft HuggingFaceTB/SmolLM2-135M-Instruct \\
                 --draft-quant int4 --out models/smol
  ortspec export --target ./qwen-1.5b.gguf --draft self --draft-quant int4 --out models/qwen
  ortspec export --genai-config --out models/smollm2-135m   # add onnxruntime-genai configs to a bundle
  ortspec export --upgrade --out models/qwen2.5-coder       # a bundle exported by an earlier release, brought up to date
"""
EPILOG_GENERATE = """examples:
  ortspec generate models/smollm2-135m --prompt "Write a haiku about caches" --chat
  ortspec generate models/smollm2-135m --prompt "def fib(n):" --drafter prompt-lookup --json
  ortspec generate models/smollm2-135m --prompt "Once" --sample --temperature 0.8 --top-p 0.9 --seed 1
  ortspec generate models/smollm2-135m --chat --prompt "A user record for Ada, aged 36" --json-schema user.json
  ortspec generate models/smollm2-135m --chat --prompt "Today's date?" --regex "[0-9]{4}-[0-9]{2}-[0-9]{2}"
"""
EPILOG_SERVE = """examples:
  ortspec serve models/smollm2-135m                      # http://127.0.0.1:8000/v1, model id "smollm2-135m"
  ortspec serve models/qwen2.5-coder-int4 --port 8080 --num-draft-tokens auto
  ORTSPEC_API_KEY=secret ortspec serve models/smollm2-135m --host 0.0.0.0

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}'

requests: OpenAI's fields (messages/prompt, max_tokens, temperature (0 = greedy), top_p, seed, stop, stream,
stream_options.include_usage; n = 1; logprobs, top_logprobs; response_format json_object or json_schema,
with the structured extra) plus top_k, repetition_penalty, num_draft_tokens, drafter and ignore_eos; fields
left out take the bundle's generation config. Each response carries an "ortspec" field with the request's
speculative statistics (acceptance, tokens per round, mean draft length).
"""


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (Hugging Face generate semantics; a flag left out takes the bundle's "
                             "generation config, else transformers' default: greedy; when sampling, "
                             "temperature 1, top-k 50, top-p 1)")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    g.add_argument("--sample", "--do-sample", dest="do_sample", action="store_const", const=True, default=None,
                   help="sample instead of greedy decoding")
    g.add_argument("--greedy", dest="do_sample", action="store_const", const=False,
                   help="greedy decoding even when the bundle's generation config samples")
    g.add_argument("--temperature", type=float, default=None, help="softmax temperature (> 0) when sampling")
    g.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens (0 = off; default 50 when "
                   "sampling, unless the bundle's generation config says otherwise)")
    g.add_argument("--top-p", type=float, default=None, help="nucleus: smallest set reaching this mass (1 = off)")
    g.add_argument("--repetition-penalty", type=float, default=None, help="> 1 discourages repeats (1 = off)")
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    g.add_argument("--eos-token-id", type=int, action="append", default=None,
                   help="stop token id (repeatable; default: the bundle's)")


def _runtime_flags(p: argparse.ArgumentParser, bundle_default: bool = True, gamma: bool = True,
                   window: bool = True) -> None:
    g = p.add_argument_group("runtime")
    g.add_argument("--drafter", default=None, choices=["model", "hybrid", "prompt-lookup", "none"],
                   help="where drafts come from: the bundle's draft model; hybrid (n-grams of the text so far "
                        "where they match, the draft model otherwise, chosen per round); n-grams alone "
                        "(prompt-lookup: long copies of the prompt draft up to 60 tokens); or nothing (target "
                        "only). Default: " + ("the bundle's (a recipe sets it: `ortspec inspect` shows it), else "
                                             "model" if bundle_default else "the draft model if the bundle has "
                                                                              "one, else prompt-lookup"))
    if gamma:
        g.add_argument("--num-draft-tokens", default=None,
                       help="tokens drafted per round (integer) or 'auto' (cost model). Default: the bundle's, "
                            "else 4")

    if window:
        g.add_argument("--draft-window", type=int, default=512, metavar="N",
                       help="the draft model reads a long context as its first tokens plus about the last N "
                            "(0: all of it). Never changes the output. Default 512")
        g.add_argument("--draft-kv", default="auto", choices=["auto", "own"],
                       help="auto: a self-draft (the target's weights quantized) runs on the target's KV cache and "
                            "reads the target's keys and values for the committed text, so it never reads the prompt "
                            "and drafts from the better cache (--draft-window then does not apply); own: the draft "
                            "keeps and computes its own. Never changes the output. Default auto")
    g.add_argument("--provider", default="cpu", choices=["cpu", "cuda"], help="onnxruntime execution provider")
    g.add_argument("--threads", type=int, default=None, help="intra-op threads per session (default: onnxruntime's)")


class CommandLine(argparse.ArgumentParser):
    """ortspec's parser, which keeps its subcommands' parsers by name (``commands``)."""

    commands: dict[str, argparse.ArgumentParser]


def build_parser() -> CommandLine:
    parser = CommandLine(
        prog="ortspec",
        description="Speculative decoding on ONNX Runtime whose output is distributed exactly as the target "
                    "model's. Export a draft/target pair into a bundle, then generate, benchmark or verify it.")
    parser.add_argument("--version", action="version", version=f"ortspec {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = sub.choices

    p = sub.add_parser("export", help="export a target (and draft) model into a bundle",
                       description="Export causal LMs (hub id, local HF directory or .gguf file) into ONNX graphs "
                                   "with explicit past key/values, optionally with a quantized draft, as a bundle.",
                       epilog=EPILOG_EXPORT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="target model: hub id, model directory or .gguf file")
    p.add_argument("--draft", help="draft model (same kinds as --target), or 'self' for a quantized copy of the target")
    p.add_argument("--draft-quant", metavar="{int8,int4,int4a,int4s,int4a-h8,int8w,gguf}[:B]",
                   help="quantize the draft: int8 (dynamic: int8 weights per output column, activations per pass; "
                        "reads a prompt 2.4-3.8x faster than int4 at a similar step cost), int4 (MatMulNBits 4-bit, "
                        "block 32, symmetric), "
                        "int4a (4-bit with a zero point per block), int4s (int4a with searched scales: more "
                        "faithful, slower to export), int4a-h8 (int4a with an 8-bit output layer), "
                        "int8w (MatMulNBits 8-bit weights: most faithful cheap draft); a MatMulNBits method takes "
                        "blocks of B weights as int4:64 (faster, less faithful); gguf: a .gguf draft keeps "
                        "its file's own quantized weights even with --dtype fp32 (which then applies to the "
                        "target only)")
    p.add_argument("--target-quant", metavar="{int4,int4a,int4s,int4a-h8,int8w,gguf}[:B]",
                   help="re-quantize the target weights: int4, int4a, int4s or int8w (all row-local, so output "
                        "stays bitwise exact), blocks of 32 or as int4s:64 (faster; its bitwise passes have an even "
                        "number of positions). From a .gguf file this makes a smaller, different model (int4s:64 "
                        "of a Q4_K_M file: KL 0.04 against the file's float model, where the file kept as it is "
                        "reads 0.0006); export measures it and inspect shows it. int8 (dynamic, one activation "
                        "scale per pass) is refused for targets; gguf: a .gguf target keeps its file's own "
                        "quantized weights even with --dtype fp32")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="cheaper draft: its output layer computes only token ids 0..N-1 and the special tokens "
                        "(BPE vocabularies put frequent tokens first); the rest get draft probability 0 and the "
                        "verifier's residual keeps the output exact")
    p.add_argument("--recipe", help=f"a known pair ({', '.join(_recipe_names())}) or a .toml path like them; "
                                    "fetches the weights and fills in --target/--draft/--*-quant")
    p.add_argument("--graph", default="auto", choices=["auto", "fused", "optimum"],
                   help="fused: onnxruntime contrib operators with an in-place KV cache (Llama, Qwen2/3, Mistral, "
                        "Phi-3, Gemma 2/3; fastest); optimum: optimum's text-generation-with-past export (any "
                        "architecture it knows); auto (default): fused where supported")
    p.add_argument("--dtype", default=None, choices=["fp32", "fp16"],
                   help="float weights of this precision (fp16 is for the CUDA provider, fused graphs only). "
                        "Default: a .gguf source keeps its quantized weights as the file has them (Q4_0, Q4_1, "
                        "Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: the GGUF model itself, no second rounding) unless "
                        "--target-quant/--draft-quant re-quantizes; any other source, fp32. --dtype fp32 "
                        "dequantizes a GGUF file")
    p.add_argument("--activations", default="int8", choices=["int8", "fp32"],
                   help="how the matrices of a .gguf file kept as they are read their inputs: int8 (default: "
                        "rounded per block, as llama.cpp's CPU kernels do; fastest) or fp32 (the 4-bit matrices "
                        "read float inputs: closer to the file's model in float, e.g. Qwen2.5-Coder-1.5B Q4_K_M "
                        "98.2%% top-1 agreement instead of 97.2%%, but decoding steps cost 1.3-2.9x as much)")
    p.add_argument("--gguf-layout", metavar="{compact,compact:B,exact}", default=None,
                   help="how a .gguf file's quantized matrices are held when kept: compact (default: the 4-bit "
                        "types as the file has them, their per-block minimums folded into the same product; the "
                        "5- and 6-bit types re-rounded to 8-bit codes in blocks of 128 - a pass reads ~12%% "
                        "fewer bytes and costs 4-7%% less, the weights move far less than the file's own "
                        "rounding; compact:B for blocks of B) or exact (every weight the file's to float "
                        "rounding, slower)")
    p.add_argument("--default-drafter", choices=["model", "hybrid", "prompt-lookup", "none"],
                   help="the drafter a generation that does not name one uses (the manifest's decoding; a recipe "
                        "may set it). Default: model")
    p.add_argument("--default-num-draft-tokens", metavar="N|auto",
                   help="the draft length a generation that does not give one uses: an integer or auto (export "
                        "then times this machine's pass costs for it once). Default: 4")
    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow running model code shipped with a hub repository (off by default)")
    p.add_argument("--genai-config", action="store_true",
                   help="also write genai_config.json files so onnxruntime-genai runs the bundle's graphs (the "
                        "pair at the bundle root, each model alone in its directory); with --out naming an "
                        "existing bundle and no --target/--recipe, only adds them to that bundle")
    p.add_argument("--upgrade", action="store_true",
                   help="bring the existing bundle at --out to the current format without re-exporting: graphs "
                        "exported before they returned each row's largest logits get them (seconds; weights are "
                        "not touched, and the bundle loads at every step)")
    p.add_argument("--genai-max-draft-tokens", type=int, default=4, metavar="N",
                   help="speculative.max_draft_tokens in the pair's genai_config.json (1-16, default 4)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON when done")

    p = sub.add_parser("generate", help="generate text with speculative decoding",
                       description="Stream text from a bundle; a one-line summary goes to stderr.",
                       epilog=EPILOG_GENERATE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", help="bundle directory made by `ortspec export`")
    p.add_argument("--recipe", help="export this recipe (see `ortspec export --help`) into BUNDLE first if BUNDLE "
                                    "holds no bundle")
    p.add_argument("--prompt", help="prompt text")
    p.add_argument("--input-ids", help="comma-separated token ids instead of --prompt (bundles without a tokenizer)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the bundle's chat template")
    p.add_argument("--system", help="system message for --chat")
    p.add_argument("--json", action="store_true", help="print the result and stats as JSON instead of streaming")
    p.add_argument("--strict", action="store_true", help="check cache and logits invariants every round (slow)")
    _sampling_flags(p)
    g = p.add_argument_group("structured output (needs the structured extra; target and draft masked alike, so "
                             "the answer is distributed as constrained target-only decoding)").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE", help="answer with JSON that a JSON schema (this file) accepts")
    g.add_argument("--json-object", action="store_true", help="answer with any JSON object")
    g.add_argument("--regex", metavar="PATTERN", help="answer with text this regular expression matches whole")
    g.add_argument("--grammar", metavar="FILE", help="answer in a grammar: Lark, or GBNF as llama.cpp writes it")
    p.add_argument("--prediction", metavar="FILE",
                   help="text the answer will mostly repeat (a file being edited): its tokens are drafted where the "
                        "answer follows it, verified like any draft (the output stays the target's; only the "
                        "speed changes). The summary counts its tokens accepted and rejected")
    _runtime_flags(p)

    p = sub.add_parser("serve", help="serve a bundle over an OpenAI-compatible HTTP API (needs the serve extra)",
                       description="A local OpenAI-compatible server: POST /v1/chat/completions and "
                                   "/v1/completions (streaming or not), GET /v1/models, /health and /metrics (Prometheus). Up to "
                                   "--parallel requests run at once, each on KV caches of its own, a round at a "
                                   "time in turn, their target passes run as one (each answer is what it would be "
                                   "alone); more wait in arrival order.",
                       epilog=EPILOG_SERVE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", help="bundle directory made by `ortspec export`")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it, so set --api-key)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--model-name", default=None, help="model id clients send and /v1/models lists (default: "
                                                      "the bundle directory's name)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 requests "
                                                   "(default: $ORTSPEC_API_KEY if set, else no key)")
    p.add_argument("--parallel", default="auto", metavar="N",
                   help="requests that run at once, each in a slot with KV caches of its own (the weights are "
                        "loaded once); 'auto' (default): as many as fit in half the memory available with every "
                        "slot at the whole context, at most 4")
    p.add_argument("--no-batch", dest="batch", action="store_false",
                   help="run each request's target pass on its own; by default the passes of the requests "
                        "running at once go through the target as one (each row with the bits it gets alone)")
    p.add_argument("--max-queue", type=int, default=32,
                   help="requests allowed to wait while --parallel run; more get HTTP 429 (default 32)")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may take, waiting included; then it stops with HTTP 504 (default 600)")
    p.add_argument("--default-max-tokens", type=int, default=1024,
                   help="new tokens for a request that gives no max_tokens (capped by the context; default 1024)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20,
                   help="largest request body accepted; larger ones get HTTP 413 (default 4 MiB)")
    _runtime_flags(p)

    p = sub.add_parser("bench", help="measure speedup over target-only decoding, interleaved on the same prompts",
                       description="Runs target-only decoding and every draft length on each prompt in one "
                                   "process (rotating order), and reports tokens/s, speedup (median of per-prompt "
                                   "ratios), acceptance, tokens/round, time split, latency percentiles, and the "
                                   "cost model's ideal speedup after the first token from the acceptance and the "
                                   "pass costs timed in the same run, with efficiency = decode speedup over all "
                                   "prompts / ideal.")
    p.add_argument("bundle")
    p.add_argument("--prompts", default=None, help="jsonl file with a \"prompt\" per line (default: the shipped dev prompts)")
    p.add_argument("--num-draft-tokens", default="1,2,3,4,6,8,auto", help="comma-separated gammas and/or 'auto'")
    p.add_argument("--kind", action="append", default=None,
                   help="use only prompts whose \"kind\" is this (repeatable), e.g. --kind edit")
    p.add_argument("--id", action="append", default=None, dest="ids",
                   help="use only the prompt with this \"id\" (repeatable)")
    p.add_argument("--repeat", type=int, default=1, help="passes over the prompts (default 1)")
    p.add_argument("--no-chat", action="store_true", help="feed prompts raw instead of through the chat template")
    p.add_argument("--calibrate", action="store_true", help="re-measure step costs and store the profile")
    p.add_argument("--micro", action="store_true",
                   help="measure only the host math of one speculative round (logits pipeline, sampling, "
                        "verification) per sampling setting, on synthetic peaked and flat rows; BUNDLE may be "
                        "'-' (the vocabulary is --vocab then)")
    p.add_argument("--vocab", type=int, default=None, help="--micro: vocabulary width (default: the bundle's)")
    p.add_argument("--gamma", type=int, default=4, help="--micro: draft tokens per round (default 4)")
    p.add_argument("--cold", type=int, nargs="?", const=256, default=0, metavar="MB",
                   help="--micro: stream MB megabytes (default 256) through the CPU caches, untimed, before each draft "
                        "row and before the verification, as the model pass before each of them does in decoding "
                        "(it streams the model's weights: give their size): the host cost decoding pays, several "
                        "times the warm cost")
    p.add_argument("--rounds", type=int, default=30, help="--micro: rounds measured per setting and case (default 30)")
    p.add_argument("--rows", default="top", choices=["top", "whole"],
                   help="--micro: top (default): rows as current bundles' passes return them, with each row's largest "
                        "entries found by the graph; whole: whole rows only (bundles exported without the graph's "
                        "TopK, or logits='host')")
    p.add_argument("--out", help="write the report as JSON")
    p.add_argument("--plot", help="write speedup vs gamma and per-position acceptance as PNG (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    _sampling_flags(p)
    p.set_defaults(max_new_tokens=128)
    _runtime_flags(p, gamma=False)

    p = sub.add_parser("verify", help="certify on this machine that speculative output is the target's",
                       description="Runs (1) greedy equality against target-only decoding on the prompts, "
                                   "(2) a chi-square test of the first K committed tokens of full speculative rounds "
                                   "against the exact target-only distribution at fixed prefixes, with your sampling "
                                   "settings, and (3) the same test on a deliberately wrong verifier, which must "
                                   "fail. Exit code 0 pass, 1 fail, 2 inconclusive.")
    p.add_argument("bundle")
    p.add_argument("--prompts", help="jsonl with a \"prompt\" per line (default: the shipped dev prompts)")
    p.add_argument("--input-ids-file", help="jsonl with \"input_ids\" per line, for bundles without a tokenizer")
    p.add_argument("--num-draft-tokens", default="1,4", help="gammas for the greedy check; the largest is used "
                                                           "for the distribution check (default 1,4)")
    p.add_argument("--samples", type=int, default=20000, help="speculative generations for the distribution test")
    p.add_argument("--prefixes", type=int, default=2,
                   help="how many fixed prefixes the distribution test samples from (default 2): of the prompts, "
                        "each followed by up to 8 tokens of its greedy answer, those where a wrong rule would "
                        "show most")
    p.add_argument("--k", default="1,2", help="lengths of the committed prefix to test, 1 and/or 2 (default 1,2)")
    p.add_argument("--greedy-tokens", type=int, default=32, help="new tokens per greedy comparison (default 32)")
    p.add_argument("--no-chat", action="store_true", help="feed prompts raw instead of through the chat template")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _sampling_flags(p)
    p.set_defaults(do_sample=True)
    _runtime_flags(p, bundle_default=False, gamma=False, window=False)

    p = sub.add_parser("quality", help="compare a bundle's model with a reference bundle's on a text (agreement, "
                                       "KL, NLL)",
                       description="Teacher-forces a text through both bundles' targets (or drafts) and reports "
                                   "top-1 agreement of the next-token distributions, mean KL(reference || "
                                   "bundle), and each model's NLL of the text. E.g. a quantized export against "
                                   "the fp32 export of the same model.",
                       epilog="examples:\n  ortspec quality models/qwen-gguf --reference models/qwen-fp32\n"
                              "  ortspec quality models/qwen-gguf --reference models/qwen-fp32 --text notes.md "
                              "--window 512\n",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle")
    p.add_argument("--reference", required=True, help="the bundle to compare against (same tokenizer)")
    p.add_argument("--text", default=None, help="text file (default: the shipped data/quality.txt)")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens of the text to use (default 400; with --window, every whole window of the text)")
    p.add_argument("--window", type=int, default=None, metavar="W",
                   help="score as llama.cpp's llama-perplexity --kl-divergence -c W does: windows of W tokens, "
                        "each from an empty cache, their second halves scored (the two tools' numbers on one "
                        "text are then comparable)")
    p.add_argument("--model", default="target", choices=["target", "draft"], help="which model of BUNDLE")
    p.add_argument("--reference-model", default=None, choices=["target", "draft"],
                   help="which model of the reference (default: the same as --model); a draft against its own "
                        "target: BUNDLE --model draft --reference BUNDLE --reference-model target")
    p.add_argument("--provider", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("profile", help="where a pass's time goes: operator types, time outside them, the bytes bound, "
                                       "llama.cpp beside it",
                       description="Times passes of each size after a context (rolled back after each, as a "
                                   "rejected draft is) on a plain session, and splits them with onnxruntime's "
                                   "profiler on a second session: time per operator type, run time outside the "
                                   "operators, host time around the run. Prints the bound the bytes a pass must "
                                   "read (weights + cached keys and values) put on it at this machine's measured "
                                   "memory bandwidth and, given llama.cpp's binaries, llama-bench's time for "
                                   "passes of the same sizes on the same GGUF file (the bundle's source when it "
                                   "was exported from one). Passes have exactly the sizes given; target-only "
                                   "decoding runs 2-position passes (bitwise), a round of gamma drafts verifies "
                                   "gamma+1 positions, and a target in blocks of 64 or more runs an odd size as "
                                   "the next even one.",
                       epilog="example: ortspec profile models/qwen2.5-coder-int4 --llama-cpp ~/.cache/llama-cpp/bin")
    p.add_argument("bundle")
    p.add_argument("--models", default="target,draft", help="which models (default target,draft)")
    p.add_argument("--positions", default="1,2,5", help="pass sizes for the target (default 1,2,5); the draft "
                                                        "runs 1-position passes")
    p.add_argument("--context", type=int, default=200, help="cached tokens before each pass (default 200)")
    p.add_argument("--repeat", type=int, default=10, help="passes of each size measured (median; default 10)")
    p.add_argument("--threads", type=int, default=None, help="intra-op threads (default: one per core)")
    p.add_argument("--llama-cpp", metavar="DIR", help="directory of llama.cpp's binaries (llama-bench)")
    p.add_argument("--gguf", help="with --llama-cpp: the GGUF file to time (default: the target's source file)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")

    p = sub.add_parser("inspect", help="show a bundle's models, graph I/O, compatibility and checksums")
    p.add_argument("bundle")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-checksums", action="store_true", help="skip sha256 verification (sizes are still checked)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from . import commands
    handler = {"export": commands.cmd_export, "generate": commands.cmd_generate, "inspect": commands.cmd_inspect,
               "profile": commands.cmd_profile,
               "bench": commands.cmd_bench, "verify": commands.cmd_verify, "serve": commands.cmd_serve,
               "quality": commands.cmd_quality}[args.command]
    if not args.debug:
        _quiet_dependencies()
    try:
        return handler(args) or 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, OrtspecError) as exc:
        if args.debug:
            _show_causes(exc)
            raise
        words = _cli_words(str(exc), parser.commands[args.command])
        print(f"ortspec {args.command}: error: {words}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1


def _show_causes(exc: BaseException) -> None:
    """--debug: a traceback shows the error each re-raised one came from, even where it was raised ``from None``
    (which keeps a user's one-line message short)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__suppress_context__ = False
        exc = exc.__cause__ or exc.__context__


def _cli_words(message: str, parser: argparse.ArgumentParser) -> str:
    """An error message in the command's own words: the Python API's argument names that this command takes as
    flags become those flags (``max_new_tokens`` -> ``--max-new-tokens``, ``drafter='prompt_lookup'`` ->
    ``--drafter prompt-lookup``, ``do_sample=False`` -> ``--greedy``)."""
    flags = {}
    for line in parser.format_help().splitlines():  # each option's line starts with its flags (and aliases)
        m = re.match(r"  (-[^ ].*?)(?:\s{2,}|$)", line)
        for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(1)) if m else ():
            flags.setdefault(option[2:].replace("-", "_"), option)
    if "greedy" in flags:
        message = message.replace("do_sample=False", "--greedy").replace("do_sample=True", "--sample")

    def named(m: re.Match) -> str:
        name, value = m.group(1), m.group(3)
        flag = flags.get(name)
        if flag is None or (value is None and "_" not in name):  # (a plain word like "prompt" stays a word)
            return m.group(0)
        return flag if value is None else f"{flag} {value.replace('_', '-') if name == 'drafter' else value}"

    return re.sub(r"(?<![\w.-])([a-z][a-z0-9_]*)(?:=(['\"]?)([\w.-]+)\2)?(?![\w(])", named, message)


# the libraries export drives (and onnxruntime), whose notices and progress bars a command folds into its own
# progress lines; --debug shows them
DEPENDENCIES = ("transformers", "optimum", "torch", "accelerate", "gguf", "onnx", "onnxruntime", "onnx_ir",
                "huggingface_hub", "tqdm")


def _quiet_dependencies() -> None:
    """Silence third-party warnings, log notices and progress bars for this command's process (set before any of
    them is imported: tqdm and transformers read these when they load)."""
    import logging
    import os
    import warnings
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for name in DEPENDENCIES:
        logging.getLogger(name).setLevel(logging.ERROR)
    pattern = "|".join(DEPENDENCIES)
    warnings.filterwarnings("ignore", module=rf"({pattern})(\.|$)")


def _recipe_names() -> list[str]:
    """The recipes shipped with ortspec.export (read without importing it: it needs the export extra)."""
    from importlib import resources
    try:
        pairs = resources.files("ortspec.export").joinpath("pairs")
        return sorted(p.name[:-5] for p in pairs.iterdir() if p.name.endswith(".toml"))
    except (ModuleNotFoundError, FileNotFoundError):
        return []


if __name__ == "__main__":
    sys.exit(main())
