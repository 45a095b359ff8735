"""thread_pool="shared": same tokens as per-session pools; once it exists, per-session loads and export are
refused with clear errors (subprocess: the pool is process-wide)."""
from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import sys
from ortspec import SpeculativeGenerator
from ortspec.errors import ExportError
from ortspec.export import export_bundle
bundle, source, out = sys.argv[1:4]
ids = [1, 5, 6, 7, 9]
ref = list(SpeculativeGenerator.load(bundle).sibling("none").generate(input_ids=ids, max_new_tokens=40).token_ids)
gen = SpeculativeGenerator.load(bundle, thread_pool="shared", threads=2)
for g in (1, 3, "auto"):
    assert list(gen.generate(input_ids=ids, max_new_tokens=40, num_draft_tokens=g).token_ids) == ref, g
assert list(gen.sibling("none").generate(input_ids=ids, max_new_tokens=40).token_ids) == ref
again = SpeculativeGenerator.load(bundle, thread_pool="shared")  # joins the same pool
assert list(again.generate(input_ids=ids, max_new_tokens=40).token_ids) == ref
try:
    SpeculativeGenerator.load(bundle)
except ValueError as exc:
    print("session refused:", exc)
try:
    export_bundle(target=source, out=out, progress=None)
except ExportError as exc:
    print("export refused:", exc)
"""


def test_shared_thread_pool(pair_bundle, hf_models, tmp_path):
    proc = subprocess.run([sys.executable, "-c", CODE, str(pair_bundle), str(hf_models["llama"]),
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "session refused:" in proc.stdout and "thread_pool='shared'" in proc.stdout
    assert "export refused:" in proc.stdout and "shared thread pool" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_bad_thread_pool_value(pair_bundle):
    from ortspec import SpeculativeGenerator
    with pytest.raises(ValueError, match="thread_pool"):
        SpeculativeGenerator.load(pair_bundle, thread_pool="global")
