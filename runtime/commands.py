"""What each `ortspec` command does once its arguments are parsed (cli.py parses them)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import OrtspecError
from .shipped import QUALITY_TEXT, shipped


def _gamma(value: str | None, flag: str = "--num-draft-tokens"):
    if value is None or value == "auto":  # (None: the bundle's default)
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{flag} must be an integer or 'auto', got {value!r}") from None


# The commands own their process: both models run on onnxruntime's one shared thread pool (faster).
POOL = "shared"


def cmd_export(args) -> int:
    try:
        from .export import export_bundle
        from .export.recipes import resolve_recipe
    except ImportError as exc:
        raise OrtspecError(f"export needs the export extra ({exc.name} is missing): "
                           "pip install 'ortspec[export]'") from None
    genai = vars(args).get("genai_config", False)
    genai_k = vars(args).get("genai_max_draft_tokens", 4)
    if vars(args).get("upgrade", False):
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
                  target_quant=args.target_quant, draft_vocab=vars(args).get("draft_vocab", None), generation=None,
                  decoding=None, dtype=vars(args).get("dtype", None),
                  activations=vars(args).get("activations", "int8"),
                  gguf_layout=vars(args).get("gguf_layout"))
    gamma = _gamma(vars(args).get("default_num_draft_tokens"), "--default-num-draft-tokens")
    decoding = {k: v for k, v in (("drafter", vars(args).get("default_drafter")), ("num_draft_tokens", gamma))
                if v is not None}
    if args.recipe:
        recipe = resolve_recipe(args.recipe)
        kwargs = {k: (kwargs[k] if kwargs[k] is not None else v) for k, v in recipe.items()}
    kwargs["decoding"] = dict(kwargs.get("decoding") or {}, **decoding) or None  # the flags win over a recipe's
    kwargs["gguf_layout"] = kwargs.get("gguf_layout") or "compact"
    if not kwargs["target"]:
        raise ValueError("pass --target SRC or --recipe NAME")
    out = export_bundle(out=args.out, overwrite=args.overwrite, trust_remote_code=args.trust_remote_code,
                        graph=vars(args).get("graph", "auto"),
                        genai_config=genai_k if genai else None, **kwargs)
    _time_for_auto(out)
    if args.json:
        print((Path(out) / "ortspec.json").read_text())
    return 0


def _time_for_auto(out) -> None:
    """A bundle that decodes with the draft length "auto" when a call does not say gets this machine's pass
    costs now (stored beside it, as the first "auto" request would), so that its first answer does not stop to
    measure them."""
    import time
    from .bundle import load_bundle
    from .generator import SpeculativeGenerator
    if load_bundle(out, verify="none").default_num_draft_tokens != "auto":
        return
    started = time.perf_counter()
    gen = SpeculativeGenerator.load(out, verify="none")  # (a pool per session: export stays possible in-process)
    if gen.stored_profile() is None:
        gen.profile()
        print(f"[ortspec export] timed this machine's pass costs for the draft length 'auto' "
              f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)


def _prediction(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--prediction: cannot read {path} ({exc})") from exc


def _response_format(args):
    """The constraint the generate flags ask for (None: free text), compiled once here to fail early."""
    from .constrain import ConstraintError, grammar_for
    fmt = None
    if args.json_object:
        fmt = "json"
    elif args.regex is not None:
        fmt = {"regex": args.regex}
    for flag, path in (("--json-schema", args.json_schema), ("--grammar", args.grammar)):
        if path is None:
            continue
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConstraintError(f"{flag}: cannot read {path} ({exc.strerror})") from None
        if flag == "--grammar":
            fmt = {"grammar": text}
            continue
        try:
            fmt = {"json_schema": json.loads(text)}
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"--json-schema: {path} is not JSON ({exc})") from None
    if fmt is not None:
        grammar_for(fmt)
    return fmt


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
    response_format = _response_format(args)
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
                  eos_token_id=args.eos_token_id, strict=args.strict, chat=args.chat, system=args.system,
                  response_format=response_format, prediction=_prediction(args.prediction))
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
    gamma = gen.default_num_draft_tokens if kwargs["num_draft_tokens"] is None else kwargs["num_draft_tokens"]
    print(f"{stats.new_tokens} tokens in {stats.total_time_s:.2f} s (first after {stats.first_token_s:.2f} s): "
          f"{stats.tokens_per_s:.1f} tok/s, "
          f"acceptance {stats.acceptance_rate:.0%}, {stats.tokens_per_round:.2f} tokens/round "
          f"(drafter {gen.drafter.name}, draft tokens {gamma}), "
          f"stopped on {reason}" + (f"; prediction: {stats.prediction_accepted} tokens accepted, "
                                    f"{stats.prediction_rejected} rejected" if args.prediction else "")
          + (f"; draft disabled: {stats.draft_error}" if stats.draft_disabled else ""),
          file=sys.stderr)
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
          parallel=_parallel(args.parallel), batch=args.batch,
          request_timeout=args.request_timeout, api_key=api_key,
          model_id=args.model_name, max_body=args.max_body_bytes, default_max_tokens=args.default_max_tokens,
          ready=ready)
    return 0


def _parallel(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--parallel must be 'auto' or an integer >= 1, got {value!r}")
    return n


def cmd_bench(args) -> int:
    from .bench import format_table, load_prompts, run_bench
    from .microbench import format_micro, micro_bench
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
    report = run_bench(args.bundle, items, gammas, drafter=args.drafter and args.drafter.replace("-", "_"),
                       max_new_tokens=args.max_new_tokens, repeat=args.repeat, chat=False if args.no_chat else None,
                       provider=args.provider, threads=args.threads, thread_pool=POOL, calibrate=args.calibrate, sampling=sampling,
                       draft_window=args.draft_window or None, draft_kv=args.draft_kv,
                       progress=lambda m: print(f"\r[ortspec bench] {m}    ", end="", file=sys.stderr, flush=True))
    print(file=sys.stderr)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    if args.plot:
        from .figures import bench as plot_bench
        plot_bench(report, args.plot)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0


def _default_prompts() -> Path:
    from .shipped import DEV_PROMPTS
    return shipped(DEV_PROMPTS)


def cmd_verify(args) -> int:
    from .bench import load_prompts
    from .bundle import load_bundle
    from .config import SamplingConfig, resolve_sampling
    from .exactness import format_verify, run_verify
    names = ("temperature", "top_k", "top_p", "repetition_penalty")
    resolved = resolve_sampling(load_bundle(args.bundle).sampling_defaults, **{k: vars(args)[k] for k in names})
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


def cmd_profile(args) -> int:
    import os
    from .bundle import load_bundle
    from .profile import llama_bench, memory_bandwidth, pass_bytes, profile_model, report
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or any(m not in ("target", "draft") for m in models):
        raise SystemExit("--models takes target, draft or both (comma-separated)")
    try:
        sizes = sorted({int(x) for x in args.positions.split(",")})
    except ValueError:
        raise SystemExit(f"--positions must be comma-separated pass sizes, got {args.positions!r}") from None
    bundle = load_bundle(args.bundle, verify="size")
    if "draft" in models and bundle.draft is None:
        models.remove("draft")
    gguf = args.gguf or (bundle.target.source.get("ref") if bundle.target.source.get("kind") == "gguf" else None)
    if args.llama_cpp and not (gguf and os.path.isfile(gguf)):
        raise SystemExit("--llama-cpp needs the GGUF file to time: pass --gguf FILE (the bundle's target was not "
                         "exported from a GGUF file on this machine)")
    say = (lambda m: print(f"[ortspec profile] {m}", file=sys.stderr)) if not args.json else None
    threads = args.threads or os.cpu_count() or 1
    profiles = []
    for which in models:
        profiles += profile_model(bundle, which, sizes if which == "target" else [1], args.context, args.repeat,
                                  args.threads, say)
    bandwidth = memory_bandwidth(threads)
    read = {m: pass_bytes(bundle.target if m == "target" else bundle.draft, args.context) for m in models}
    peer = None
    if args.llama_cpp:
        if say:
            say(f"llama-bench on {gguf}")
        peer = llama_bench(args.llama_cpp, gguf, sizes, args.context, threads)
    if args.json:
        print(json.dumps({"bundle": str(args.bundle), "context": args.context, "threads": threads,
                          "bandwidth_gb_s": round(bandwidth / 1e9, 2), "bytes": read,
                          "passes": [p.as_dict() for p in profiles],
                          "llama_cpp_ms": peer and {str(k): round(v, 3) for k, v in peer.items()},
                          "gguf": gguf if peer else None}, indent=2))
    else:
        print(report(profiles, bandwidth, read, peer))
    return 0


def cmd_inspect(args) -> int:
    from .inspect import inspect_bundle, format_report
    report = inspect_bundle(args.bundle, checksums=not args.no_checksums)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else 1

