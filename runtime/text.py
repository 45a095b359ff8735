"""Tokenizer and chat template, from the bundle's files (tokenizers + jinja2)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from .errors import BundleError


class TextCodec:
    """Encodes prompts (optionally through the chat template) and decodes ids."""

    def __init__(self, tokenizer_file: Path, tokenizer_config: dict):
        from tokenizers import Tokenizer
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:
            raise BundleError(f"cannot read {tokenizer_file}: {exc}; re-export the bundle") from None
        self.config = tokenizer_config
        self.chat_template = _pick_template(tokenizer_config.get("chat_template"))

    def encode(self, text: str, chat: bool = False, system: str | None = None) -> list[int]:
        if chat:
            return self.tokenizer.encode(self.render_chat(text, system), add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, prompt: str, system: str | None = None) -> str:
        """Apply the chat template with add_generation_prompt, as transformers does."""
        if not self.chat_template:
            raise ValueError("this bundle's tokenizer has no chat template; drop chat=True / --chat")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(f"chat template error: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = _tojson
        messages = ([{"role": "system", "content": system}] if system else []) + \
                   [{"role": "user", "content": prompt}]
        special = {k: _token_text(self.config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=True, **special)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the bundle's chat template failed to render: {exc}") from None


class StreamDecoder:
    """Turns a growing id list into text deltas, holding back incomplete characters."""

    def __init__(self, codec: TextCodec | None):
        self.codec = codec
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: Sequence[int]) -> str:
        if self.codec is None:
            return ""
        self.ids.extend(ids)
        text = self.codec.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""  # a multi-byte character is not complete yet
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else text
        self.emitted = text
        return delta

    def flush(self) -> str:
        if self.codec is None:
            return ""
        text = self.codec.decode(self.ids)
        delta = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return delta


def _pick_template(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


def _token_text(value) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _tojson(value, indent=None):
    import json
    return json.dumps(value, ensure_ascii=False, indent=indent)
