"""Greedy mismatches between speculative and target-only decoding, with and without bitwise passes.

    python tools/bitwise_report.py models/smollm2-int4-target --max-new-tokens 64

Runs every dev prompt (chat template) x gamma 1, 2, 4, auto x both drafters against target-only decoding,
once with one-position passes allowed (bitwise=False, how ortspec decoded before bitwise passes) and once
bitwise (the default), and counts runs whose tokens differ; also how often the same call made twice on one
generator (prefix reuse) gives other tokens, and the target's pass-size invariance.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ortspec import SpeculativeGenerator
from ortspec.bench import load_prompts
from ortspec.bundle import load_bundle
from ortspec.exactness import greedy_check, invariance_check
from ortspec.engine import CausalLM
from ortspec.shipped import DEV_PROMPTS, shipped

PROMPTS = shipped(DEV_PROMPTS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    gen = SpeculativeGenerator.load(args.bundle, drafter="none", thread_pool="shared")
    items = load_prompts(Path(args.prompts))[: args.limit]
    prompts = [gen.codec.encode(it["prompt"], chat=True) for it in items]
    drafters = ("model", "prompt_lookup") if load_bundle(args.bundle).draft else ("prompt_lookup",)
    out = {"bundle": args.bundle, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens}
    b = gen.bundle
    inv = invariance_check(CausalLM(b.target, str(b.file(b.target.path)), thread_pool="shared"), prompts[0],
                           positions=18, sizes=range(1, 18))
    out["invariant"] = inv["invariant"]
    out["one_position_max_abs_diff"] = inv["one_position_passes"]["max_abs_diff"]
    for bitwise in (False, True):
        r = greedy_check(args.bundle, prompts, [1, 2, 4, "auto"], drafters=drafters,
                         max_new_tokens=args.max_new_tokens, bitwise=bitwise, thread_pool="shared")
        twice = sum(gen.generate(input_ids=p, max_new_tokens=args.max_new_tokens, bitwise=bitwise, do_sample=False).token_ids
                    != gen.generate(input_ids=p, max_new_tokens=args.max_new_tokens, bitwise=bitwise, do_sample=False).token_ids
                    for p in prompts)
        out["bitwise" if bitwise else "one_position"] = {"runs": r.runs, "differing_runs": r.mismatches,
                                                         "same_call_twice_differs": twice}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{args.bundle}: pass-size invariant with bitwise passes: {out['invariant']} "
          f"(one-position passes differ by up to {out['one_position_max_abs_diff']:.3g})")
    for key, label in (("one_position", "one-position passes allowed"), ("bitwise", "bitwise passes")):
        r = out[key]
        print(f"  {label:<28} speculative != target-only in {r['differing_runs']}/{r['runs']} runs; "
              f"same call twice differs on {r['same_call_twice_differs']}/{len(prompts)} prompts")


if __name__ == "__main__":
    main()
