"""The `ortspec` command line: export, generate, serve, inspect, bench, verify, quality.

Thin front end over the public Python API. Errors print one line without a
traceback (exit 2 for bad arguments, 1 for everything else); --debug shows it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .errors import OrtspecError
from .shipped import QUALITY_TEXT, shipped

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
"""
EPILOG_SERVE = """examples:
  ortspec serve models/smollm2-135m                      # http://127.0.0.1:8000/v1, model id "smollm2-135m"
  ortspec serve models/qwen2.5-coder-int4 --port 8080 --num-draft-tokens auto
  ORTSPEC_API_KEY=secret ortspec serve models/smollm2-135m --host 0.0.0.0

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}'

requests: OpenAI's fields (messages/prompt, max_tokens, temperature (0 = greedy), top_p, seed, stop, stream,
stream_options.include_usage; n = 1) plus top_k, repetition_penalty, num_draft_tokens, drafter and
ignore_eos; fields left out take the bundle's generation config. Each response carries an "ortspec" field
with the request's speculative statistics (acceptance, tokens per round, mean draft length).
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


def _runtime_flags(p: argparse.ArgumentParser, drafter_default: str = "model", gamma: bool = True,
                   window: bool = True) -> None:
    g = p.add_argument_group("runtime")
    g.add_argument("--drafter", default=drafter_default, choices=["model", "hybrid", "prompt-lookup", "none"],
                   help="where drafts come from: the bundle's draft model; hybrid (n-grams of the text so far "
                        "where they match, the draft model otherwise, chosen per round); n-grams alone "
                        "(prompt-lookup: long copies of the prompt draft up to 60 tokens); or nothing (target "
                        "only). Default " + (drafter_default or "the draft model if the bundle "
                                                                "has one, else prompt-lookup"))
    if gamma:
        g.add_argument("--num-draft-tokens", default="4",
                       help="tokens drafted per round (integer) or 'auto' (cost model). Default 4")

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ortspec",
        description="Speculative decoding on ONNX Runtime whose output is distributed exactly as the target "
                    "model's. Export a draft/target pair into a bundle, then generate, benchmark or verify it.")
    parser.add_argument("--version", action="version", version=f"ortspec {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("export", help="export a target (and draft) model into a bundle",
                       description="Export causal LMs (hub id, local HF directory or .gguf file) into ONNX graphs "
                                   "with explicit past key/values, optionally with a quantized draft, as a bundle.",
                       epilog=EPILOG_EXPORT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="target model: hub id, model directory or .gguf file")
    p.add_argument("--draft", help="draft model (same kinds as --target), or 'self' for a quantized copy of the target")
    p.add_argument("--draft-quant", choices=["int8", "int4", "int4a", "int4a-h8", "int8w", "gguf"],
                   help="quantize the draft: int8 (dynamic: int8 weights per output column, activations per pass; "
                        "reads a prompt 2.4-3.8x faster than int4 at a similar step cost), int4 (MatMulNBits 4-bit, "
                        "block 32, symmetric), "
                        "int4a (4-bit with a zero point per block), int4a-h8 (int4a with an 8-bit output layer), "
                        "int8w (MatMulNBits 8-bit weights: most faithful cheap draft); gguf: a .gguf draft keeps "
                        "its file's own quantized weights even with --dtype fp32 (which then applies to the "
                        "target only)")
    p.add_argument("--target-quant", choices=["int8", "int4", "int4a", "int4a-h8", "int8w", "gguf"],
                   help="quantize the target weights: int4 or int8w (both row-local, so output stays bitwise "
                        "exact); int8 (dynamic, one activation scale per pass) is refused for targets; gguf: a "
                        ".gguf target keeps its file's own quantized weights even with --dtype fp32")
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
    _runtime_flags(p)

    p = sub.add_parser("serve", help="serve a bundle over an OpenAI-compatible HTTP API (needs the serve extra)",
                       description="A local OpenAI-compatible server: POST /v1/chat/completions and "
                                   "/v1/completions (streaming or not), GET /v1/models and /health. Requests run "
                                   "one at a time on one generator, in arrival order.",
                       epilog=EPILOG_SERVE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", help="bundle directory made by `ortspec export`")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it, so set --api-key)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--model-name", default=None, help="model id clients send and /v1/models lists (default: "
                                                      "the bundle directory's name)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 requests "
                                                   "(default: $ORTSPEC_API_KEY if set, else no key)")
    p.add_argument("--max-queue", type=int, default=32,
                   help="requests allowed to wait behind the running one; more get HTTP 429 (default 32)")
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
    p.add_argument("--prefixes", type=int, default=2, help="how many prompts serve as fixed prefixes (default 2)")
    p.add_argument("--k", default="1,2", help="lengths of the committed prefix to test, 1 and/or 2 (default 1,2)")
    p.add_argument("--greedy-tokens", type=int, default=32, help="new tokens per greedy comparison (default 32)")
    p.add_argument("--no-chat", action="store_true", help="feed prompts raw instead of through the chat template")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    _sampling_flags(p)
    p.set_defaults(do_sample=True)
    _runtime_flags(p, drafter_default=None, gamma=False, window=False)

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
    handler = {"export": cmd_export, "generate": cmd_generate, "inspect": cmd_inspect, "bench": cmd_bench,
               "verify": cmd_verify, "serve": cmd_serve,
               "quality": cmd_quality}[args.command]
    if not args.debug:
        _quiet_dependencies()
    try:
        return handler(args) or 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, OrtspecError) as exc:
        if args.debug:
            raise
        print(f"ortspec {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1


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


def _gamma(value: str):
    if value == "auto":
        return "auto"
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--num-draft-tokens must be an integer or 'auto', got {value!r}") from None


# The commands own their process: both models run on onnxruntime's one shared thread pool (faster).
POOL = "shared"


def cmd_export(args) -> int:
    try:
        from .export import export_bundle
        from .export.recipes import resolve_recipe
    except ImportError as exc:
        raise OrtspecError(f"export needs the export extra ({exc.name} is missing): "
                           "pip install 'ortspec[export]'") from None
    genai = getattr(args, "genai_config", False)
    genai_k = getattr(args, "genai_max_draft_tokens", 4)
    if getattr(args, "upgrade", False):
        from .export.api import upgrade_bundle
        if args.target or args.recipe:
            raise ValueError("--upgrade brings the existing bundle at --out up to date; it takes no --target/--recipe")
        done = upgrade_bundle(args.out, progress=lambda m: print(f"[ortspec export] {m}", file=sys.stderr))
        print(f"{args.out}: " + (f"upgraded ({', '.join(done)})" if done else "already current, nothing to do"))
        if not genai:
            return 0
    if genai and not args.target and not args.recipe:
        from .bundle import is_bundle
        from .export.genai import write_genai_config
        if not is_bundle(Path(args.out)):
            raise ValueError(f"{args.out} holds no bundle; to add genai configs name an existing bundle with "
                             "--out, or pass --target/--recipe to export one")
        print(f"wrote {write_genai_config(args.out, max_draft_tokens=genai_k)}")
        return 0
    kwargs = dict(target=args.target, draft=args.draft, draft_quant=args.draft_quant,
                  target_quant=args.target_quant, draft_vocab=getattr(args, "draft_vocab", None), generation=None,
                  dtype=getattr(args, "dtype", None), activations=getattr(args, "activations", "int8"))
    if args.recipe:
        recipe = resolve_recipe(args.recipe)
        kwargs = {k: (kwargs[k] if kwargs[k] is not None else v) for k, v in recipe.items()}
    if not kwargs["target"]:
        raise ValueError("pass --target SRC or --recipe NAME")
    out = export_bundle(out=args.out, overwrite=args.overwrite, trust_remote_code=args.trust_remote_code,
                        graph=getattr(args, "graph", "auto"),
                        genai_config=genai_k if genai else None, **kwargs)
    if args.json:
        print((Path(out) / "ortspec.json").read_text())
    return 0


def cmd_generate(args) -> int:
    from .generator import SpeculativeGenerator
    if args.prompt is not None and args.input_ids is not None:
        raise ValueError("pass --prompt or --input-ids, not both")
    ids = None
    if args.input_ids is not None:
        try:
            ids = [int(t) for t in args.input_ids.replace(" ", "").split(",") if t]
        except ValueError:
            raise ValueError("--input-ids must be comma-separated integers, e.g. 1,15,27") from None
    if args.recipe:
        from .bundle import is_bundle
        if not is_bundle(Path(args.bundle)):
            export_args = argparse.Namespace(target=None, draft=None, draft_quant=None, target_quant=None,
                                             draft_vocab=None,
                                             recipe=args.recipe, out=args.bundle, overwrite=False,
                                             trust_remote_code=False, json=False)
            cmd_export(export_args)
    gen = SpeculativeGenerator.load(args.bundle, provider=args.provider, drafter=args.drafter,
                                    threads=args.threads, thread_pool=POOL, draft_window=args.draft_window or None,
                                    draft_kv=args.draft_kv)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, temperature=args.temperature,
                  top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                  seed=args.seed, num_draft_tokens=_gamma(args.num_draft_tokens),
                  eos_token_id=args.eos_token_id, strict=args.strict, chat=args.chat, system=args.system)
    if args.json:
        res = gen.generate(args.prompt, ids, **kwargs)
        print(json.dumps(res.to_dict(), indent=2))
        return 0
    if sys.stderr.isatty():  # a long prompt is fed in passes: show how far the prefill is
        gen.target.progress = lambda done, total: print(f"\r[prefill] {done}/{total} tokens", end="" if done < total
                                                        else "\n", file=sys.stderr, flush=True)
    events = gen.stream(args.prompt, ids, **kwargs)
    for ev in events:
        sys.stdout.write(ev.text if gen.codec else " ".join(map(str, ev.token_ids)) + " ")
        sys.stdout.flush()
    sys.stdout.write("\n")
    stats, reason = events.result
    print(f"{stats.new_tokens} tokens in {stats.total_time_s:.2f} s (first after {stats.first_token_s:.2f} s): "
          f"{stats.tokens_per_s:.1f} tok/s, "
          f"acceptance {stats.acceptance_rate:.0%}, {stats.tokens_per_round:.2f} tokens/round, "
          f"stopped on {reason}" + (" (draft disabled)" if stats.draft_disabled else ""), file=sys.stderr)
    return 0


def cmd_quality(args) -> int:
    from .quality import compare_models, format_quality
    path = Path(args.text) if args.text else shipped(QUALITY_TEXT)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read --text {path}: {exc.strerror}") from None
    report = compare_models(args.bundle, args.reference, text, tokens=args.tokens, provider=args.provider,
                            threads=args.threads, which=args.model, reference_which=args.reference_model,
                            window=args.window,
                            progress=lambda d, n: print(f"\r[ortspec quality] {d}/{n} positions", end="",
                                                        file=sys.stderr, flush=True))
    print(file=sys.stderr)
    print(json.dumps(report, indent=2) if args.json else format_quality(report))
    return 0


def cmd_serve(args) -> int:
    import logging
    import os
    from .serve import serve
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    api_key = args.api_key if args.api_key is not None else os.environ.get("ORTSPEC_API_KEY") or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"ortspec serve: warning: listening on {args.host} without --api-key: anyone who can reach this "
              "machine can use the model", file=sys.stderr)

    def ready(url: str) -> None:
        print(f"ortspec serve: {args.bundle} on {url}/v1 (Ctrl-C stops)", file=sys.stderr, flush=True)

    serve(args.bundle, host=args.host, port=args.port, drafter=args.drafter,
          num_draft_tokens=_gamma(args.num_draft_tokens), provider=args.provider, threads=args.threads,
          draft_window=args.draft_window or None, draft_kv=args.draft_kv, max_queue=args.max_queue,
          request_timeout=args.request_timeout, api_key=api_key,
          model_id=args.model_name, max_body=args.max_body_bytes, default_max_tokens=args.default_max_tokens,
          ready=ready)
    return 0


def cmd_bench(args) -> int:
    from .bench import format_micro, format_table, load_prompts, micro_bench, plot, run_bench
    if args.micro:
        vocab = args.vocab
        if vocab is None:
            if args.bundle == "-":
                raise ValueError("--micro with BUNDLE '-' needs --vocab N")
            from .bundle import load_bundle
            vocab = load_bundle(args.bundle, verify="size").target.output_vocab
        if vocab < 2 or args.gamma < 1:
            raise ValueError("--vocab must be >= 2 and --gamma >= 1")
        if args.rounds < 1 or args.cold < 0:
            raise ValueError("--rounds must be >= 1 and --cold MB >= 0")
        rows = micro_bench(vocab=vocab, gamma=args.gamma, repeats=args.rounds, cold_mb=args.cold, rows=args.rows)
        if args.out:
            Path(args.out).write_text(json.dumps(rows, indent=2))
        print(json.dumps(rows, indent=2) if args.json else format_micro(rows))
        return 0
    prompts_path = Path(args.prompts) if args.prompts else _default_prompts()
    if not prompts_path.is_file():
        raise ValueError(f"prompts file {prompts_path} does not exist; pass --prompts FILE (jsonl with \"prompt\")")
    gammas = [_gamma(g.strip()) for g in args.num_draft_tokens.split(",") if g.strip()]
    if not gammas:
        raise ValueError("--num-draft-tokens needs at least one value, e.g. 1,2,4,auto")
    if args.repeat < 1:
        raise ValueError("--repeat must be >= 1")
    sampling = dict(do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                    repetition_penalty=args.repetition_penalty)
    items = load_prompts(prompts_path)
    if args.kind:
        kinds = sorted({it["kind"] for it in items})
        items = [it for it in items if it["kind"] in args.kind]
        if not items:
            raise ValueError(f"no prompt in {prompts_path} has kind {', '.join(args.kind)}; kinds there: "
                             f"{', '.join(k or '(none)' for k in kinds)}")
    if args.ids:
        unknown = sorted(set(args.ids) - {it.get("id") for it in items})
        if unknown:
            raise ValueError(f"no prompt in {prompts_path} has id {', '.join(unknown)}")
        items = [it for it in items if it.get("id") in args.ids]
    report = run_bench(args.bundle, items, gammas, drafter=args.drafter.replace("-", "_"),
                       max_new_tokens=args.max_new_tokens, repeat=args.repeat, chat=False if args.no_chat else None,
                       provider=args.provider, threads=args.threads, thread_pool=POOL, calibrate=args.calibrate, sampling=sampling,
                       draft_window=args.draft_window or None, draft_kv=args.draft_kv,
                       progress=lambda m: print(f"\r[ortspec bench] {m}    ", end="", file=sys.stderr, flush=True))
    print(file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(report, args.plot)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _recipe_names() -> list[str]:
    """The recipes shipped with ortspec.export (read without importing it: it needs the export extra)."""
    from importlib import resources
    try:
        pairs = resources.files("ortspec.export").joinpath("pairs")
        return sorted(p.name[:-5] for p in pairs.iterdir() if p.name.endswith(".toml"))
    except (ModuleNotFoundError, FileNotFoundError):
        return []


def _default_prompts() -> Path:
    from .shipped import DEV_PROMPTS
    return shipped(DEV_PROMPTS)


def cmd_verify(args) -> int:
    from .bench import load_prompts
    from .bundle import load_bundle
    from .config import SamplingConfig, resolve_sampling
    from .exactness import format_verify, run_verify
    names = ("temperature", "top_k", "top_p", "repetition_penalty")
    resolved = resolve_sampling(load_bundle(args.bundle).sampling_defaults, **{k: getattr(args, k) for k in names})
    sampling = {k: resolved[k] for k in names}
    SamplingConfig(do_sample=True, **sampling)  # refuse bad settings before any work
    gammas = [int(g) for g in args.num_draft_tokens.split(",") if g.strip()]
    if not gammas or min(gammas) < 1:
        raise ValueError("--num-draft-tokens needs positive integers, e.g. 1,4")
    ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    if not ks or not set(ks) <= {1, 2}:
        raise ValueError("--k takes 1 and/or 2")
    if args.samples < 100 or args.prefixes < 1 or args.greedy_tokens < 1:
        raise ValueError("--samples must be >= 100, --prefixes and --greedy-tokens >= 1")
    bundle = load_bundle(args.bundle)
    if args.drafter == "none":
        raise ValueError("--drafter none has nothing to verify; use model or prompt-lookup")
    if bundle.tokenizer_file is None:
        if not args.input_ids_file:
            raise ValueError("this bundle has no tokenizer: pass --input-ids-file (jsonl with \"input_ids\")")
        prompts = []
        for n, line in enumerate(Path(args.input_ids_file).read_text().splitlines(), 1):
            if line.strip():
                ids = json.loads(line).get("input_ids")
                if not isinstance(ids, list) or not ids:
                    raise ValueError(f"{args.input_ids_file}:{n} needs a non-empty \"input_ids\" list")
                prompts.append([int(t) for t in ids])
    else:
        from .text import TextCodec
        codec = TextCodec(bundle.tokenizer_file, bundle.tokenizer_config)
        chat = bool(codec.chat_template) and not args.no_chat
        items = load_prompts(Path(args.prompts) if args.prompts else _default_prompts())
        prompts = [codec.encode(it["prompt"], chat=chat) for it in items]
    drafter = args.drafter.replace("-", "_") if args.drafter else None
    report = run_verify(args.bundle, prompts, gammas, sampling, samples=args.samples, seed=args.seed or 0,
                        prefixes=args.prefixes, ks=ks, drafter=drafter, max_new_tokens=args.greedy_tokens,
                        provider=args.provider, threads=args.threads, thread_pool=POOL,
                        progress=lambda m: print(f"[ortspec verify] {m}", file=sys.stderr, flush=True))
    print(json.dumps(report, indent=2) if args.json else format_verify(report))
    return {"pass": 0, "fail": 1, "inconclusive": 2}[report["verdict"]]


def cmd_inspect(args) -> int:
    from .inspect import inspect_bundle, format_report
    report = inspect_bundle(args.bundle, checksums=not args.no_checksums)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
