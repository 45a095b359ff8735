"""Files shipped inside the package: the benchmark prompt sets and the text quality checks read."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

DEV_PROMPTS = "dev.jsonl"      # 12 chat prompts (code, edit, summary, chat): bench's and verify's default
LONG_PROMPTS = "long.jsonl"    # long edit and summary prompts (800-2,800 tokens)
QUALITY_TEXT = "quality.txt"   # the text ``ortspec quality`` reads by default
TOOL_QUESTIONS = "tool_questions.json"  # function tools as apps write them, questions as users ask (tools/tool_calls.py)


def shipped(name: str) -> Path:
    """The path of a file shipped in ``ortspec/data`` (installed packages are unpacked: a real path)."""
    return Path(str(resources.files("ortspec").joinpath("data", name)))
