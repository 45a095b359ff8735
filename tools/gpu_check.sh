#!/usr/bin/env bash
# CUDA check, run on a machine with an NVIDIA GPU and no network (about 6 minutes):
#   1. installs onnxruntime-gpu and ortspec from wheels carried in .whl/ (no network),
#   2. builds fused fp16/fp32 bundles of SmolLM2-135M shape (tools/gpu_make_bundles.py),
#   3. runs `ortspec verify --provider cuda` (greedy equality + distribution test + negative control),
#   4. runs `ortspec bench --provider cuda` (step costs, speedup, time outside onnxruntime),
# writing every report under $OUT (default ./gpu-reports).
#
# Prepare the wheels on a machine with network first (Python 3.12 on the GPU machine):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d .whl onnxruntime-gpu
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-reports}"
mkdir -p "$OUT"
SITE=/tmp/ortspec-site
export PYTHONUNBUFFERED=1

{
  echo "== environment"; date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" .
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  python3 - <<'PY'
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.get_available_providers())
assert "CUDAExecutionProvider" in ort.get_available_providers(), "no CUDA provider: carry onnxruntime-gpu in .whl/"
PY
  echo "== bundles"
  time python3 tools/gpu_make_bundles.py /tmp/ortspec-bundles
  ORTSPEC="python3 -m ortspec.cli"
  echo "== verify (cuda, tiny pair: distribution test with power)"
  echo '{"input_ids": [1, 5, 9, 5]}' > /tmp/ids.jsonl; echo '{"input_ids": [1, 7, 3, 3, 8]}' >> /tmp/ids.jsonl
  rm -f /tmp/ortspec-bundles/*/tokenizer.json
  $ORTSPEC verify /tmp/ortspec-bundles/tiny-fp32 --provider cuda --input-ids-file /tmp/ids.jsonl \
      --samples 20000 --json > "$OUT/verify_tiny_cuda.json" || echo "verify exit $?"
  echo "== verify (cuda, SmolLM2-shaped fp16: greedy equality)"
  $ORTSPEC verify /tmp/ortspec-bundles/smollm2-fp16 --provider cuda --input-ids-file /tmp/ids.jsonl \
      --samples 2000 --greedy-tokens 64 --num-draft-tokens 1,2,4,8 --json > "$OUT/verify_smol_cuda.json" || echo "verify exit $?"
  echo "== bench (cuda, step costs and overhead)"
  for b in smollm2-fp16 smollm2-fp32; do
    python3 - "$b" "$OUT" <<'PY'
import json, sys
from ortspec.calibrate import measure
from ortspec import SpeculativeGenerator
name, out = sys.argv[1], sys.argv[2]
gen = SpeculativeGenerator.load(f"/tmp/ortspec-bundles/{name}", provider="cuda")
prof = measure(gen.target, gen.drafter.lm, context=128, max_k=9, reps=20)
res = gen.generate(input_ids=[1] + list(range(100, 160)), max_new_tokens=256, num_draft_tokens=4, eos_token_id=[])
s = res.stats
report = {"profile": prof, "stats": s.to_dict(),
          "outside_onnxruntime": s.overhead_time_s / s.total_time_s}
json.dump(report, open(f"{out}/bench_{name}_cuda.json", "w"), indent=2)
print(name, "C_t(1..9) ms", [round(c * 1e3, 2) for c in prof["target_costs"]], "C_d ms", round(prof["draft_cost"] * 1e3, 2),
      "outside ORT", f"{report['outside_onnxruntime']:.1%}")
PY
  done
  echo "== done"; date -u
} 2>&1 | tee "$OUT/gpu_check.log"
