"""A fresh drafter of a named kind (none, prompt_lookup, model, hybrid), over a draft model where it needs one."""
from __future__ import annotations

from .base import Drafter, NoDrafter
from .hybrid import HybridDrafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter


def make_drafter(kind: str, lm=None, window: int | None = None, source=None) -> Drafter:
    """A drafter of ``kind``; "model" and "hybrid" draft with ``lm`` (a CausalLM), reading a long context through
    ``window`` tokens, or over ``source``'s cache (a self-draft; ModelDrafter)."""
    if kind == "none":
        return NoDrafter()
    if kind == "prompt_lookup":
        return PromptLookupDrafter()
    if kind in ("model", "hybrid") and lm is not None:
        model = ModelDrafter(lm, window, source)
        return HybridDrafter(model) if kind == "hybrid" else model
    raise ValueError(f"cannot make a {kind!r} drafter" + (" without a draft model" if kind in ("model", "hybrid")
                                                          else ""))
