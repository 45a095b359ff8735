#!/usr/bin/env bash
# The CUDA check: run from the repository root on a machine with an NVIDIA GPU and no network.
#   1. installs the onnxruntime-gpu wheel carried in .whl/ (whole, or as the parts tools/gpu_wheel.sh makes) and
#      ortspec from this tree into a private directory (the machine's own packages stay as they are);
#   2. builds random-weight bundles of SmolLM2-135M and Qwen2.5-Coder-1.5B/0.5B shape (tools/gpu_make_bundles.py);
#   3. runs `ortspec verify` on the provider: greedy equality, the distribution test and its negative control;
#   4. runs tools/gpu_check.py: pass-size invariance, step costs for 1-9 positions, host share per round,
#      speculative vs target-only tokens/s, and the speedups the cost model predicts with real acceptance.
# Every report goes under $OUT (default ./gpu-reports): gpu_check.log, verify_*.json, gpu_check.json/.md.
#
# Environment: PROVIDER (cuda; cpu rehearses the same steps), SHAPES (real; tiny builds toy sizes: the test
# suite runs the whole script that way on the CPU), SAMPLES (distribution-test generations, 20000), WHEELS
# (where the wheels or their parts are, .whl).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-reports}"
PROVIDER="${PROVIDER:-cuda}"
SHAPES="${SHAPES:-real}"
SAMPLES="${SAMPLES:-20000}"
WHEELS="${WHEELS:-.whl}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ortspec-gpu-XXXXXX")"
SITE="$WORK/site"
BUNDLES="$WORK/bundles"
export PYTHONUNBUFFERED=1

{
  echo "== environment ($PROVIDER, $SHAPES shapes)"; date -u
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  if compgen -G "$WHEELS/*.part-*" > /dev/null; then
    bash tools/gpu_wheel.sh join "$WHEELS"
  fi
  if compgen -G "$WHEELS/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl
  fi
  # ortspec itself, laid out as pyproject's package-dir does (no build tools needed on that machine)
  mkdir -p "$SITE" && cp -r runtime "$SITE/ortspec" && cp -r export "$SITE/ortspec/export"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  python3 - "$PROVIDER" <<'PY'
import sys
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.get_available_providers())
if sys.argv[1] == "cuda":
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* packages, when that is where they are
    assert "CUDAExecutionProvider" in ort.get_available_providers(), "no CUDA provider: carry onnxruntime-gpu in .whl/"
PY
  echo "== bundles"
  python3 tools/gpu_make_bundles.py "$BUNDLES" --shapes "$SHAPES"
  ORTSPEC="python3 -m ortspec.cli"
  printf '%s\n' '{"input_ids": [1, 5, 9, 5]}' '{"input_ids": [1, 7, 3, 3, 8]}' > "$WORK/ids.jsonl"
  rc=0
  echo "== verify ($PROVIDER, tiny pair: greedy, distribution test with power, negative control)"
  $ORTSPEC verify "$BUNDLES/tiny-fp32" --provider "$PROVIDER" --input-ids-file "$WORK/ids.jsonl" \
      --samples "$SAMPLES" --json > "$OUT/verify_tiny.json" || { echo "verify tiny exit $?"; rc=1; }
  for b in smollm2-fp16 qwen-fp16; do
    # Random weights spread a large vocabulary's mass too thinly for the distribution test to have power (its
    # negative control is not rejected: "inconclusive"); these bundles must pass the greedy check and must not
    # fail the distribution test. The tiny pair above is the distribution certificate on this provider.
    echo "== verify ($PROVIDER, $b: greedy equality at gamma 1, 2, 4, 8)"
    $ORTSPEC verify "$BUNDLES/$b" --provider "$PROVIDER" --input-ids-file "$WORK/ids.jsonl" \
        --samples 1000 --greedy-tokens 64 --num-draft-tokens 1,2,4,8 --json > "$OUT/verify_$b.json" || true
    python3 - "$OUT/verify_$b.json" <<'PY' || rc=1
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["greedy"]["mismatches"] == 0 and r["verdict"] != "fail"
print(f"   verdict {r['verdict']}, greedy mismatches {r['greedy']['mismatches']} of {r['greedy']['runs']} runs, "
      f"invariant {r['invariance']['invariant']}: {'ok' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
  done
  echo "== invariance, step costs, decoding"
  if [ "$SHAPES" = tiny ]; then
    python3 tools/gpu_check.py "$BUNDLES" --provider "$PROVIDER" --out "$OUT" --tokens 24 --prompts 2 --reps 2
  else
    python3 tools/gpu_check.py "$BUNDLES" --provider "$PROVIDER" --out "$OUT"
  fi
  echo "== done (verify: $([ $rc = 0 ] && echo pass || echo FAIL))"; date -u
  rm -rf "$WORK"
  exit $rc
} 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
