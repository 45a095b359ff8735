"""The `ortspec` command line: export, generate, inspect, bench, verify.

Thin front end over the public Python API. Errors print one line without a
traceback (exit 2 for bad arguments, 1 for everything else); --debug shows it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import OrtspecError

EPILOG_EXPORT = """examples:
  ortspec export --recipe smollm2-135m --out models/smollm2-135m
  ortspec export --target HuggingFaceTB/SmolLM2-360M-Instruct --draft HuggingFaceTB/SmolLM2-135M-Instruct \\
                 --draft-quant int4 --out models/smol
  ortspec export --target ./qwen-1.5b.gguf --draft self --draft-quant int4 --out models/qwen
"""
EPILOG_GENERATE = """examples:
  ortspec generate models/smollm2-135m --prompt "Write a haiku about caches" --chat
  ortspec generate models/smollm2-135m --prompt "def fib(n):" --drafter prompt-lookup --json
  ortspec generate models/smollm2-135m --prompt "Once" --sample --temperature 0.8 --top-p 0.9 --seed 1
"""


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (Hugging Face generate semantics)")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    g.add_argument("--sample", "--do-sample", dest="do_sample", action="store_true",
                   help="sample instead of greedy decoding")
    g.add_argument("--temperature", type=float, default=1.0, help="softmax temperature (> 0) when sampling")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus: smallest set reaching this mass (1 = off)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1 = off)")
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    g.add_argument("--eos-token-id", type=int, action="append", default=None,
                   help="stop token id (repeatable; default: the bundle's)")


def _runtime_flags(p: argparse.ArgumentParser, drafter_default: str = "model") -> None:
    g = p.add_argument_group("runtime")
    g.add_argument("--drafter", default=drafter_default, choices=["model", "prompt-lookup", "none"],
                   help="where drafts come from: the bundle's draft model, n-grams of the text so far, "
                        f"or nothing (target only). Default {drafter_default}")
    g.add_argument("--num-draft-tokens", default="4",
                   help="tokens drafted per round (integer) or 'auto' (cost model). Default 4")
    g.add_argument("--provider", default="cpu", choices=["cpu", "cuda"], help="onnxruntime execution provider")
    g.add_argument("--threads", type=int, default=None, help="intra-op threads per session (default: onnxruntime's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ortspec",
        description="Speculative decoding on ONNX Runtime whose output is distributed exactly as the target "
                    "model's. Export a draft/target pair into a bundle, then generate, benchmark or verify it.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("export", help="export a target (and draft) model into a bundle",
                       description="Export causal LMs (hub id, local HF directory or .gguf file) into ONNX graphs "
                                   "with explicit past key/values, optionally with a quantized draft, as a bundle.",
                       epilog=EPILOG_EXPORT, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="target model: hub id, model directory or .gguf file")
    p.add_argument("--draft", help="draft model (same kinds as --target), or 'self' for a quantized copy of the target")
    p.add_argument("--draft-quant", choices=["int8", "int4"], help="quantize the draft weights")
    p.add_argument("--target-quant", choices=["int8", "int4"], help="quantize the target weights")
    p.add_argument("--recipe", help="a known pair from models/*.toml (e.g. smollm2-135m, qwen2.5-coder) or a .toml path; "
                                    "fetches the weights and fills in --target/--draft/--*-quant")
    p.add_argument("--graph", default="auto", choices=["auto", "fused", "optimum"],
                   help="fused: onnxruntime contrib operators with an in-place KV cache (Llama/Qwen2/Mistral, "
                        "fastest); optimum: optimum's text-generation-with-past export (any architecture it "
                        "knows); auto (default): fused where supported")
    p.add_argument("--out", required=True, help="bundle directory to create")
    p.add_argument("--overwrite", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow running model code shipped with a hub repository (off by default)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON when done")

    p = sub.add_parser("generate", help="generate text with speculative decoding",
                       description="Stream text from a bundle; a one-line summary goes to stderr.",
                       epilog=EPILOG_GENERATE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", help="bundle directory made by `ortspec export`")
    p.add_argument("--recipe", help="export this recipe (models/*.toml) into BUNDLE first if BUNDLE holds no bundle")
    p.add_argument("--prompt", help="prompt text")
    p.add_argument("--input-ids", help="comma-separated token ids instead of --prompt (bundles without a tokenizer)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the bundle's chat template")
    p.add_argument("--system", help="system message for --chat")
    p.add_argument("--json", action="store_true", help="print the result and stats as JSON instead of streaming")
    p.add_argument("--strict", action="store_true", help="check cache and logits invariants every round (slow)")
    _sampling_flags(p)
    _runtime_flags(p)

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
    handler = {"export": cmd_export, "generate": cmd_generate, "inspect": cmd_inspect}[args.command]
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


def _gamma(value: str):
    if value == "auto":
        return "auto"
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"--num-draft-tokens must be an integer or 'auto', got {value!r}") from None


def cmd_export(args) -> int:
    try:
        from .export import export_bundle
        from .export.recipes import resolve_recipe
    except ImportError as exc:
        raise OrtspecError(f"export needs the export extra ({exc.name} is missing): "
                           "pip install 'ortspec[export]'") from None
    kwargs = dict(target=args.target, draft=args.draft, draft_quant=args.draft_quant,
                  target_quant=args.target_quant)
    if args.recipe:
        recipe = resolve_recipe(args.recipe)
        kwargs = {k: (kwargs[k] if kwargs[k] is not None else v) for k, v in recipe.items()}
    if not kwargs["target"]:
        raise ValueError("pass --target SRC or --recipe NAME")
    out = export_bundle(out=args.out, overwrite=args.overwrite, trust_remote_code=args.trust_remote_code,
                        graph=getattr(args, "graph", "auto"), **kwargs)
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
                                             recipe=args.recipe, out=args.bundle, overwrite=False,
                                             trust_remote_code=False, json=False)
            cmd_export(export_args)
    gen = SpeculativeGenerator.load(args.bundle, provider=args.provider, drafter=args.drafter,
                                    threads=args.threads)
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, temperature=args.temperature,
                  top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                  seed=args.seed, num_draft_tokens=_gamma(args.num_draft_tokens),
                  eos_token_id=args.eos_token_id, strict=args.strict, chat=args.chat, system=args.system)
    if args.json:
        res = gen.generate(args.prompt, ids, **kwargs)
        print(json.dumps(res.to_dict(), indent=2))
        return 0
    events = gen.stream(args.prompt, ids, **kwargs)
    for ev in events:
        sys.stdout.write(ev.text if gen.codec else " ".join(map(str, ev.token_ids)) + " ")
        sys.stdout.flush()
    sys.stdout.write("\n")
    stats, reason = events.result
    print(f"{stats.new_tokens} tokens in {stats.total_time_s:.2f} s: {stats.tokens_per_s:.1f} tok/s, "
          f"acceptance {stats.acceptance_rate:.0%}, {stats.tokens_per_round:.2f} tokens/round, "
          f"stopped on {reason}" + (" (draft disabled)" if stats.draft_disabled else ""), file=sys.stderr)
    return 0


def cmd_inspect(args) -> int:
    from .inspect import inspect_bundle, format_report
    report = inspect_bundle(args.bundle, checksums=not args.no_checksums)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
