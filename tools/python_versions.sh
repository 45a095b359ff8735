#!/usr/bin/env bash
# The runtime on every supported Python. For each interpreter (arguments, or the pyenv 3.10, 3.12 and 3.13 found
# here): a virtual environment under build/py/ with ortspec[cpu] and the test tools, the tests that need no export
# (sampling kernels, verification rules and their statistical tests, the code's layout), and greedy and seeded
# sampled generations from tiny bundles this interpreter (the one running the export extra) exported, compared
# token for token with its own.
# Usage: bash tools/python_versions.sh [PYTHON ...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ "$#" -eq 0 ]; then
  set -- $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[023].* 2>/dev/null | sed 's#$#/bin/python#')
fi
[ "$#" -gt 0 ] || { echo "no other Python found; pass interpreters as arguments"; exit 2; }

WORK=$ROOT/build/py
mkdir -p "$WORK"
# tiny bundles and their reference outputs, made by this interpreter (torch lives here)
python3 - "$WORK" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "tests")
from tiny import make_model
from ortspec import SpeculativeGenerator
from ortspec.export import export_bundle
work = Path(sys.argv[1])
out = {}
for name, vocab in (("small", 64), ("wide", 5003)):
    bundle = work / f"bundle-{name}"
    if not bundle.exists():
        target = make_model("llama", work / f"hf-{name}", vocab=vocab, seed=3, scale=2.0)
        draft = make_model("llama", work / f"hf-{name}-d", vocab=vocab, seed=3, scale=2.0, perturb=0.1)
        export_bundle(target=str(target), draft=str(draft), out=bundle, progress=None)
out = {"bundles": [str(work / "bundle-small"), str(work / "bundle-wide")]}
(work / "bundles.json").write_text(json.dumps(out))
EOF
cat > "$WORK/generate.py" <<'EOF'
import json, sys
from ortspec import SpeculativeGenerator
runs = []
for bundle in json.load(open(sys.argv[1]))["bundles"]:
    gen = SpeculativeGenerator.load(bundle)
    for kw in (dict(), dict(do_sample=True, temperature=0.8, top_p=0.9, seed=3),
               dict(do_sample=True, top_k=20, repetition_penalty=1.1, seed=4)):
        runs.append(gen.generate(input_ids=[1, 5, 9, 5, 7], max_new_tokens=24, **kw).token_ids)
print(json.dumps(runs))
EOF
python3 "$WORK/generate.py" "$WORK/bundles.json" > "$WORK/expected.json"

# the tests that need no export (torch is installed for this interpreter only)
TESTS=()
for name in fast_paths verify_exact verify_stats fast_sampling stats_module layout; do
  TESTS+=("$ROOT/tests/test_$name.py")
done

status=0
for py in "$@"; do
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  env=$WORK/venv-$version
  [ -x "$env/bin/python" ] || "$py" -m venv "$env"
  "$env/bin/python" -m pip install --quiet --disable-pip-version-check "$ROOT[cpu]" pytest hypothesis scipy
  echo "== Python $version"
  (cd "$WORK" && "$env/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" -c "$ROOT/pyproject.toml" \
      "${TESTS[@]}") \
    || status=1
  got=$("$env/bin/python" "$WORK/generate.py" "$WORK/bundles.json")
  if [ "$got" = "$(cat "$WORK/expected.json")" ]; then
    echo "Python $version: the same token ids as $(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') (6 generations)"
  else
    echo "Python $version: token ids differ"; status=1
  fi
done
exit $status
