#!/usr/bin/env python3
"""Time outside onnxruntime per sampling setting (and greedy), target-only and speculating, interleaved in one process.

    python tools/host_share.py models/smollm2-135m
    python tools/host_share.py models/qwen2.5-coder --limit 4 --max-new-tokens 48 --num-draft-tokens auto

For each setting, every dev prompt runs target-only (drafter "none") and with the bundle's draft model, the
two in alternating order; the share of wall time spent outside onnxruntime's runs (the logits pipeline,
sampling, verification, the loop, the Python around each pass) is printed for each, with the host
milliseconds per round and the speedup (tokens per second speculating over target-only, the same prompts
and seeds). Read the two together: a change may buy acceptance with host time (a wider draft distribution
raises the share and the speed), or save host time and lose speed.

Comparing two releases: --against loads another release's runtime package (its ``runtime/`` directory, e.g.
of a ``git worktree add /tmp/prev <commit>``) into the same process and runs the two alternately on every
prompt (each first on every other prompt), so both see the same machine state; each cell then reads "other -> this",
"tok/s this/other" is this release's tokens per second over the other's (target-only / speculating), and the last
column says whether both gave the same tokens for the same seeds:

    git worktree add /tmp/prev HEAD~3
    python tools/host_share.py models/smollm2-135m --against /tmp/prev/runtime --repeat 2 --only "no top-k"

Which release's models are loaded first matters: compared with itself, the release loaded second read 0.1-0.3
points higher on this machine (host time per round too: where the sessions and objects land in memory), so run
a comparison both ways (--this-first swaps the order) and read both.

(--only TEXT, repeatable: only the settings whose names contain one of them.)
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
import sys

from ortspec.shipped import DEV_PROMPTS, shipped

# Every setting names all four knobs (those it does not change at their neutral values), so a bundle's own
# generation config (Qwen2.5's top-p 0.8, say) never fills one in: each row means the same on every bundle.
NEUTRAL = dict(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
SETTINGS = {
    "Qwen2.5 (T 0.7, top-p 0.8, top-k 20, rep 1.05)": dict(NEUTRAL, temperature=0.7, top_p=0.8, top_k=20,
                                                          repetition_penalty=1.05),
    "Llama-3 style (T 0.6, top-p 0.9, top-k 50)": dict(NEUTRAL, temperature=0.6, top_p=0.9, top_k=50),
    "top-k 50 (transformers' default)": dict(NEUTRAL, top_k=50),
    "temperature 0.7, no top-k": dict(NEUTRAL, temperature=0.7),
    "temperature 1.0, no top-k": dict(NEUTRAL),
    "top-p 0.9, no top-k": dict(NEUTRAL, top_p=0.9),
    "repetition penalty 1.1, no top-k": dict(NEUTRAL, repetition_penalty=1.1),
    "greedy": dict(NEUTRAL, do_sample=False),
}
PROMPTS = shipped(DEV_PROMPTS)


def load_release(path: Path, name: str = "ortspec_against"):
    """A release's runtime package (a directory holding its ``__init__.py``), imported as ``name`` beside any
    other (its modules import each other relatively)."""
    init = path / "__init__.py"
    if not (init.is_file() and (path / "generator.py").is_file()):
        raise ValueError(f"{path} is not a runtime package directory (no __init__.py and generator.py there); "
                         "pass a release's runtime/ directory, e.g. of a git worktree")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(PROMPTS), help="jsonl prompts (default: the dev prompts)")
    ap.add_argument("--limit", type=int, default=6, help="the first N prompts (default 6)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", default="4", help="gamma or 'auto' (default 4)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the prompts (default 1)")
    ap.add_argument("--only", action="append", metavar="TEXT",
                    help="run only the settings whose name contains TEXT (repeatable)")
    ap.add_argument("--against", type=Path, metavar="DIR",
                    help="another release's runtime/ directory: both run in this process, alternating")
    ap.add_argument("--this-first", action="store_true",
                    help="with --against: load this release's models first (by default the other's are)")
    args = ap.parse_args()
    if args.limit < 1 or args.max_new_tokens < 1 or args.repeat < 1:
        ap.error("--limit, --max-new-tokens and --repeat must be >= 1")
    gamma = args.num_draft_tokens if args.num_draft_tokens == "auto" else int(args.num_draft_tokens)
    settings_run = {k: v for k, v in SETTINGS.items()
                    if not args.only or any(part in k for part in args.only)}
    if not settings_run:
        ap.error(f"--only {' / '.join(args.only)} matches none of the settings: {'; '.join(SETTINGS)}")

    from ortspec import SpeculativeGenerator
    from ortspec.bench import load_prompts
    from ortspec.bundle import load_bundle
    from ortspec.errors import OrtspecError
    try:
        if load_bundle(args.bundle, verify="size").draft is None:
            ap.error(f"{args.bundle} has no draft model")
    except OrtspecError as exc:
        ap.error(str(exc))
    releases = {"this": SpeculativeGenerator}
    if args.against is not None:
        try:
            # both imported the same way (a copy of this release loaded beside the other, not the one imported
            # above): the two sides then differ only in which one's models are loaded first (--this-first)
            other = load_release(args.against).SpeculativeGenerator
            this = load_release(Path(sys.modules[SpeculativeGenerator.__module__].__file__).parent, "ortspec_this")
            releases = {"other": other, "this": this.SpeculativeGenerator}
        except ValueError as exc:
            ap.error(str(exc))
    prompts = [item["prompt"] for item in load_prompts(Path(args.prompts))][:args.limit]
    runs = {}  # (release, "none" | "model") -> generator
    for rel, cls in sorted(releases.items(), reverse=args.this_first):  # (the sessions made second read higher)
        gen = cls.load(args.bundle, thread_pool="shared")
        runs[rel, "model"], runs[rel, "none"] = gen, gen.sibling("none")
    chat = gen.codec is not None and bool(gen.codec.chat_template)
    encode = (lambda p: {"prompt": p, "chat": chat}) if gen.codec else (lambda p: {"input_ids": [1, 2, 3]})
    for g in runs.values():
        g.generate(**encode(prompts[0]), max_new_tokens=4, do_sample=True, seed=0)  # warm-up
    print(f"{args.bundle}: time outside onnxruntime, {len(prompts)} prompts x {args.max_new_tokens} tokens"
          f"{f' x {args.repeat} passes' if args.repeat > 1 else ''}, speculating with gamma {gamma}"
          + (f"; {args.against} -> this release, alternating" if args.against is not None else ""))
    if args.against is None:
        print(f"{'setting':<48}{'target-only':>14}{'speculating':>14}{'host ms/round (spec.)':>23}{'speedup':>11}")
    else:
        print(f"{'setting':<48}{'target-only':>17}{'speculating':>17}{'host ms/round (spec.)':>23}"
              f"{'speedup':>16}{'tok/s this/other':>18}{'same tokens':>13}")
    rels = list(releases)
    for name, settings in settings_run.items():
        spent = {key: [0.0, 0.0, 0, 0] for key in runs}  # host s, total s, rounds, tokens
        same = compared = 0
        for rep in range(args.repeat):
            for i, prompt in enumerate(prompts):
                # the two releases of a kind run back to back, each first on every other prompt, and the kinds
                # swap places every two prompts: each release meets the same places and predecessors
                m = rep * len(prompts) + i
                order = rels if m % 2 == 0 else rels[::-1]
                kinds = ("none", "model") if m // 2 % 2 == 0 else ("model", "none")
                tokens = {}
                for key in [(rel, kind) for kind in kinds for rel in order]:
                    out = runs[key].generate(**encode(prompt), max_new_tokens=args.max_new_tokens,
                                             num_draft_tokens=gamma, seed=i, **dict(dict(do_sample=True), **settings))
                    s, acc = out.stats, spent[key]
                    acc[0] += s.overhead_time_s
                    acc[1] += s.total_time_s
                    acc[2] += s.rounds
                    acc[3] += len(out.token_ids)
                    tokens[key] = out.token_ids
                if len(releases) > 1:
                    for kind in ("none", "model"):
                        compared += 1
                        same += tokens["other", kind] == tokens["this", kind]
        share = {k: 100 * v[0] / v[1] for k, v in spent.items()}
        per_round = {k: 1000 * v[0] / max(v[2], 1) for k, v in spent.items()}
        speed = {k: v[3] / v[1] for k, v in spent.items()}  # tokens per second
        speedup = {rel: speed[rel, "model"] / speed[rel, "none"] for rel in rels}
        if args.against is None:
            print(f"{name:<48}{share['this', 'none']:>13.2f}%{share['this', 'model']:>13.2f}%"
                  f"{per_round['this', 'model']:>23.3f}{speedup['this']:>10.2f}x", flush=True)
            continue
        cells = [f"{share['other', kind]:.2f} -> {share['this', kind]:.2f}%" for kind in ("none", "model")]
        ms = f"{per_round['other', 'model']:.3f} -> {per_round['this', 'model']:.3f}"
        up = f"{speedup['other']:.2f} -> {speedup['this']:.2f}x"
        ratio = " / ".join(f"{speed['this', kind] / speed['other', kind]:.3f}" for kind in ("none", "model"))
        print(f"{name:<48}{cells[0]:>17}{cells[1]:>17}{ms:>23}{up:>16}{ratio:>18}{f'{same}/{compared}':>13}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
