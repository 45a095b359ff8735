"""Hashes of generated token ids, one per bundle, drafter, gamma and sampling mode: run before and after a change
that must not change output, and compare (the same machine: float rounding may differ between CPU kinds).

    python tools/token_ids.py models/smollm2-135m [more bundles] [--tokens 48] [--prompts 4] [--json out.json]

Greedy runs every gamma and "auto" (bitwise greedy output never depends on gamma). Sampled runs, seeded, use
fixed gammas only: an auto gamma follows the machine's timings, and another gamma draws other uniforms.
The hybrid drafter picks lookup or model per round from the target's pass costs, which it times as it runs: its
seeded sampled output would follow the machine's timings, so its costs are pinned here (PINNED_COSTS; the n-gram
lookup's too) and every run repeats.
Modes: greedy; "sampled" (temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.05); "plain" (temperature 1,
no truncation: the rows verified lazily); "nucleus" (temperature 0.8, top-p 0.9, no top-k).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
from pathlib import Path
import sys
import warnings

MODES = {
    "greedy": dict(do_sample=False),
    "sampled": dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
    "plain": dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0),
    "nucleus": dict(do_sample=True, temperature=0.8, top_p=0.9, top_k=0),
}
DRAFTERS = ("none", "model", "prompt_lookup", "hybrid")
GAMMAS = (1, 3, "auto")
PINNED_COSTS = ([1.0, 1.15, 1.3, 1.45], 0.2)  # the target's pass costs C_t(1..4) (then linear), a draft step


@contextlib.contextmanager
def pinned_costs():
    """The drafters that size their proposals by cost read PINNED_COSTS, whatever is timed, while inside."""
    package = Path(importlib.import_module("ortspec").__file__).parent
    # releases before 0.3 kept the drafters in one module (looked up in the package imported: an editable
    # install's finder could otherwise supply another release's subpackage)
    module = importlib.import_module("ortspec.drafting" if (package / "drafting").is_dir() else "ortspec.drafters")
    lookup, hybrid = module.PromptLookupDrafter, module.HybridDrafter
    costs, step = PINNED_COSTS
    saved = [(cls, name, cls.__dict__.get(name)) for cls, name in ((lookup, "pass_costs"), (hybrid, "pass_costs"),
                                                                   (hybrid, "draft_cost"))]
    fixed = {"pass_costs": property(lambda self: costs, lambda self, value: None),
             "draft_cost": property(lambda self: step, lambda self, value: None)}
    try:
        for cls, name, _ in saved:
            setattr(cls, name, fixed[name])
        yield
    finally:
        for cls, name, before in saved:
            if before is None:
                delattr(cls, name)
            else:
                setattr(cls, name, before)


def prompts_for(gen, count: int) -> list[dict]:
    """Chat prompts from the shipped set for a bundle with a tokenizer, else fixed id sequences."""
    if gen.codec is None:
        return [dict(input_ids=[(7 * i + 3 * j) % gen.vocab_size for j in range(5 + i)]) for i in range(count)]
    from ortspec.shipped import DEV_PROMPTS, shipped
    lines = shipped(DEV_PROMPTS).read_text().splitlines()
    return [dict(prompt=json.loads(line)["prompt"], chat=bool(gen.codec.chat_template)) for line in lines[:count]]


def hashes(bundle: str, tokens: int, count: int, drafters=DRAFTERS, gammas=GAMMAS, modes=tuple(MODES)) -> dict:
    """{"drafter/gamma/mode": sha256 of every prompt's token ids (first 16 hex digits)} for one bundle."""
    from ortspec import SpeculativeGenerator
    from ortspec.bundle import load_bundle
    base = SpeculativeGenerator.load(bundle, drafter="model" if load_bundle(bundle).draft else "none")
    out = {}
    with pinned_costs():
        _hash_all(base, tokens, count, drafters, gammas, modes, out)
    return out


def _hash_all(base, tokens, count, drafters, gammas, modes, out) -> None:
    for drafter in drafters:
        if drafter in ("model", "hybrid") and base.bundle.draft is None:
            continue
        gen = base.sibling(drafter)
        for gamma in gammas if drafter != "none" else (1,):
            for mode in modes:
                if gamma == "auto" and mode != "greedy":
                    continue
                digest = hashlib.sha256()
                for i, prompt in enumerate(prompts_for(gen, count)):
                    seed = 1000 + i if MODES[mode]["do_sample"] else None
                    res = gen.generate(**prompt, max_new_tokens=tokens, num_draft_tokens=gamma, seed=seed,
                                       **MODES[mode])
                    digest.update(json.dumps(res.token_ids).encode())
                out[f"{drafter}/{gamma}/{mode}"] = digest.hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundles", nargs="+", help="bundle directories")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per prompt (default 48)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per setting (default 4)")
    ap.add_argument("--json", help="also write {bundle: {setting: hash}} to this file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    table = {}
    for bundle in args.bundles:
        table[bundle] = hashes(bundle, args.tokens, args.prompts)
        for key, value in table[bundle].items():
            print(f"{bundle}  {key:28s} {value}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
