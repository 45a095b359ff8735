"""Tokens/s of JSON-schema answers: target-only, speculative, and speculative with forced tokens as free drafts.

    python tools/structured_bench.py models/smollm2-135m [--gamma 4] [--max-new-tokens 96] [--repeat 1] [--compact]

Each prompt asks for a JSON record and carries a schema for it. On one loaded pair, every prompt runs in each
mode — target-only (drafter "none", forced drafts off), "speculative" (the bundle's draft model, forced drafts
off) and "+ forced" (the draft model, tokens the schema forces proposed as free drafts) — in an order that
rotates from prompt to prompt, greedy and sampled (temperature 0.7, top-p 0.8, top-k 20, repetition penalty
1.05; one seed per prompt, the same for every mode). Printed per sampling mode and decoding mode: tokens/s over
all prompts, the speedup over target-only, the acceptance of model drafts, forced drafts proposed and accepted,
and the constraint's cost (milliseconds in the matcher per generated token, and its share of the wall time).
--compact asks for JSON without free whitespace (llguidance's "whitespace_flexible": false), which forces more
of the text (every key, colon and comma).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from ortspec import SpeculativeGenerator

SAMPLINGS = {"greedy": dict(do_sample=False),
             "sampled": dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)}
MODES = ("target-only", "speculative", "+ forced")
_STR, _INT = {"type": "string", "maxLength": 40}, {"type": "integer"}


def _record(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


TASKS = [
    ("Describe a classic novel as JSON with its title, author, publication year and up to three genres.",
     _record(title=_STR, author=_STR, year=_INT, genres={"type": "array", "items": _STR, "maxItems": 3})),
    ("Give a JSON record of a European capital city: name, country, population and whether it is on a river.",
     _record(name=_STR, country=_STR, population=_INT, on_river={"type": "boolean"})),
    ("Return a JSON object for a fictional user account: username, email, age and a list of two interests.",
     _record(username=_STR, email=_STR, age=_INT, interests={"type": "array", "items": _STR, "maxItems": 2})),
    ("Write a JSON object for a simple pancake recipe: name, servings, minutes and up to four ingredients.",
     _record(name=_STR, servings=_INT, minutes=_INT,
             ingredients={"type": "array", "items": _STR, "maxItems": 4})),
]


def run(bundle: str, gamma, max_new: int, repeat: int) -> list[dict]:
    base = SpeculativeGenerator.load(bundle, drafter="model")
    gens = {"target-only": base.sibling("none"), "speculative": base, "+ forced": base.sibling("model")}
    gens["target-only"].forced_drafts = gens["speculative"].forced_drafts = False
    rows = []
    for sname, sampling in SAMPLINGS.items():
        totals = {m: dict(tokens=0, seconds=0.0, drafted=0, accepted=0, forced=0, forced_accepted=0, mask_s=0.0)
                  for m in MODES}
        for r in range(repeat):
            for i, (prompt, schema) in enumerate(TASKS):
                for j in range(len(MODES)):
                    mode = MODES[(i + j + r) % len(MODES)]
                    t0 = time.perf_counter()
                    res = gens[mode].generate(prompt, chat=True, max_new_tokens=max_new, seed=100 + i,
                                              num_draft_tokens=gamma, response_format=schema, **sampling)
                    seconds = time.perf_counter() - t0
                    t, s = totals[mode], res.stats
                    t["tokens"] += len(res.token_ids)
                    t["seconds"] += seconds
                    t["drafted"] += s.drafted
                    t["accepted"] += s.accepted
                    t["forced"] += s.forced
                    t["forced_accepted"] += s.forced_accepted
                    t["mask_s"] += s.constraint_time_s
        alone = totals["target-only"]["tokens"] / totals["target-only"]["seconds"]
        for mode in MODES:
            t = totals[mode]
            speed = t["tokens"] / t["seconds"]
            rows.append(dict(sampling=sname, mode=mode, tokens=t["tokens"], tok_s=speed, speedup=speed / alone,
                             acceptance=t["accepted"] / t["drafted"] if t["drafted"] else 0.0,
                             forced=t["forced"], forced_accepted=t["forced_accepted"],
                             mask_ms_per_token=1000 * t["mask_s"] / max(1, t["tokens"]),
                             mask_share=t["mask_s"] / t["seconds"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--gamma", default="4", help="draft tokens per round, or auto (default 4)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=1, help="passes over the prompts (default 1)")
    ap.add_argument("--limit", type=int, default=len(TASKS), help="prompts to use (default all four)")
    ap.add_argument("--compact", action="store_true", help="JSON without free whitespace (forces more tokens)")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    del TASKS[args.limit:]
    if args.compact:
        for _, schema in TASKS:
            schema["x-guidance"] = {"whitespace_flexible": False}
    gamma = args.gamma if args.gamma == "auto" else int(args.gamma)
    rows = run(args.bundle, gamma, args.max_new_tokens, args.repeat)
    print(f"{args.bundle}: JSON-schema answers, {len(TASKS)} prompts x {args.repeat}, up to {args.max_new_tokens} "
          f"tokens, gamma {gamma}, interleaved" + (", compact JSON" if args.compact else ""))
    print(f"{'sampling':9s} {'mode':12s} {'tokens':>6s} {'tok/s':>7s} {'speedup':>8s} {'accept':>7s} "
          f"{'forced (acc.)':>14s} {'mask ms/tok':>12s} {'mask share':>11s}")
    for r in rows:
        print(f"{r['sampling']:9s} {r['mode']:12s} {r['tokens']:6d} {r['tok_s']:7.1f} {r['speedup']:7.2f}x "
              f"{r['acceptance']:7.0%} {r['forced']:6d} ({r['forced_accepted']:4d}) {r['mask_ms_per_token']:12.3f} "
              f"{r['mask_share']:10.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
