"""The shared onnxruntime thread pool: same tokens, and export refuses to run under it (subprocess: it is
process-wide)."""
from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
from ortspec import SpeculativeGenerator, use_shared_thread_pool
from ortspec.errors import ExportError
from ortspec.export import export_bundle
bundle, source, out = sys.argv[1:4]
ids = [1, 5, 6, 7, 9]
ref = list(SpeculativeGenerator.load(bundle).sibling("none").generate(input_ids=ids, max_new_tokens=40).token_ids)
assert use_shared_thread_pool(2) and use_shared_thread_pool(2)
gen = SpeculativeGenerator.load(bundle)
for g in (1, 3, "auto"):
    assert list(gen.generate(input_ids=ids, max_new_tokens=40, num_draft_tokens=g).token_ids) == ref, g
assert list(gen.sibling("none").generate(input_ids=ids, max_new_tokens=40).token_ids) == ref
try:
    export_bundle(target=source, out=out, progress=None)
except ExportError as exc:
    print("refused:", exc)
"""


def test_shared_thread_pool(pair_bundle, hf_models, tmp_path):
    proc = subprocess.run([sys.executable, "-c", CODE, str(pair_bundle), str(hf_models["llama"]),
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "shared thread pool" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_shared_thread_pool_rejects_bad_threads():
    from ortspec import use_shared_thread_pool
    import pytest
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="threads"):
            use_shared_thread_pool(bad)
