#!/usr/bin/env python3
"""Thread-pool settings compared: decoding speed of one bundle under each, interleaved runs.

    python tools/pool_cost.py models/smollm2-135m --rounds 5
    python tools/pool_cost.py models/qwen2.5-coder-int4 --prompts 3 --rounds 3

Settings: "shared" (onnxruntime's process-wide pool, as the ortspec commands
run), "session" (a pool per session, the Python API's default: threads spin
during a run and stop when it returns) and "session-nospin" (a pool per
session without spinning, the earlier default). Each run is a fresh process
(the shared pool cannot coexist with per-session pools in one), generating
--tokens greedy tokens for each of the first --prompts dev prompts, target-only
and with the draft model at γ = 4; the settings alternate round by round and the
median tokens/s of each is printed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from ortspec.shipped import DEV_PROMPTS, shipped

SETTINGS = ("shared", "session", "session-nospin")
PROMPTS = shipped(DEV_PROMPTS)


def one_run(setting: str, bundle: str, prompts: list[str], tokens: int) -> dict:
    import ortspec.model as model
    if setting == "session-nospin":
        made = model.session_options

        def no_spin(threads, thread_pool="session"):
            so = made(threads, thread_pool)
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            return so
        model.session_options = no_spin
    from ortspec import SpeculativeGenerator
    rates = {}
    for drafter in ("none", "model"):
        gen = SpeculativeGenerator.load(bundle, thread_pool="shared" if setting == "shared" else "session",
                                        drafter=drafter)
        gen.generate(prompt=prompts[0], max_new_tokens=8)  # warm-up
        made_tokens, spent = 0, 0.0
        for prompt in prompts:
            start = time.perf_counter()
            out = gen.generate(prompt=prompt, max_new_tokens=tokens, do_sample=False, num_draft_tokens=4)
            spent += time.perf_counter() - start
            made_tokens += len(out.token_ids)
        rates[drafter] = made_tokens / spent
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", type=int, default=4, help="first N dev prompts (default 4)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens per prompt (default 48)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each setting, alternating (default 3)")
    ap.add_argument("--prompt-file", default=str(PROMPTS))
    ap.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if min(args.prompts, args.tokens, args.rounds) < 1:
        sys.exit("--prompts, --tokens and --rounds must be positive")
    prompts = [json.loads(line)["prompt"] for line in open(args.prompt_file) if line.strip()][:args.prompts]
    if args.child:
        print(json.dumps(one_run(args.child, args.bundle, prompts, args.tokens)))
        return 0
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        for setting in SETTINGS:
            proc = subprocess.run([sys.executable, __file__, args.bundle, "--child", setting, "--prompts",
                                   str(args.prompts), "--tokens", str(args.tokens), "--prompt-file",
                                   args.prompt_file], capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"{setting} run failed:\n{proc.stderr[-2000:]}")
            runs[setting].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {setting:15s} " + "  ".join(f"{k} {v:6.2f} tok/s" for k, v in runs[setting][-1].items()),
                  flush=True)
    print(f"\nmedian tokens/s over {args.rounds} rounds ({args.prompts} prompts x {args.tokens} tokens, greedy)")
    print(f"{'setting':15s} {'target-only':>12s} {'draft γ=4':>10s}")
    for setting in SETTINGS:
        med = {k: statistics.median(run[k] for run in runs[setting]) for k in ("none", "model")}
        print(f"{setting:15s} {med['none']:12.2f} {med['model']:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
