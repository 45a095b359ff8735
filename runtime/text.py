"""Tokenizer and chat template, from the bundle's files (tokenizers + jinja2)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import BundleError
from .tools import generic_messages, template_messages, tool_style


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
        self._compiled = None  # the chat template compiled (on first use)

    def id_count(self) -> int:
        """One past the largest id the tokenizer knows (added tokens included)."""
        return max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def encode(self, text: str, chat: bool = False, system: str | None = None) -> list[int]:
        if chat:
            return self.tokenizer.encode(self.render_chat(text, system), add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=True).ids

    def encode_messages(self, messages: Sequence[dict], tools: list[dict] | None = None) -> list[int]:
        """Token ids of a conversation rendered by the chat template, ready for the assistant's turn (``tools``:
        function definitions the template shows the model)."""
        return self.tokenizer.encode(self.render_messages(messages, tools), add_special_tokens=False).ids

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a piece of text as it would appear inside an answer (no special tokens added)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, prompt: str, system: str | None = None) -> str:
        """One user turn (after an optional system message) through the chat template."""
        return self.render_messages(([{"role": "system", "content": system}] if system else [])
                                    + [{"role": "user", "content": prompt}])

    def render_messages(self, messages: Sequence[dict], tools: list[dict] | None = None) -> str:
        """Apply the chat template with add_generation_prompt, as transformers does. A template that never shows
        tools (``tools.tool_style`` "generic") gets them, and earlier calls and results, as
        ``tools.generic_messages`` writes them."""
        if not self.chat_template:
            raise ValueError("this bundle's tokenizer has no chat template; pass a plain prompt instead "
                             "(drop chat=True / --chat / messages)")
        import jinja2

        special = {k: _token_text(self.config.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}

        def render(shown: list[dict]) -> str:
            return self._template().render(messages=shown, tools=tools, add_generation_prompt=True, **special)
        try:
            messages = check_messages(messages)
            if tool_style(self.chat_template) != "generic":
                return render(template_messages(messages))
            try:
                return render(generic_messages(messages, tools))
            except (ValueError, jinja2.TemplateError):
                if not tools:
                    raise
                # a template that refuses a system message (Gemma 2's): the functions open the first user turn
                return render(generic_messages(messages, tools, system=False))
        except jinja2.TemplateError as exc:
            raise ValueError(f"the bundle's chat template failed to render: {exc}") from None

    def _template(self):
        """The chat template, compiled on first use (compiling costs more than rendering)."""
        if self._compiled is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                raise ValueError(f"chat template error: {message}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = _tojson
            self._compiled = env.from_string(self.chat_template)
        return self._compiled


ROLES = ("system", "user", "assistant", "tool")


def check_messages(messages) -> list[dict]:
    """A conversation as the chat template expects it: [{"role": system|user|assistant|tool, "content": str}, ...].

    Content may also be a list of text parts ([{"type": "text", "text": ...}]), which are joined; a
    "developer" message is a system message. An assistant message may carry OpenAI's ``tool_calls`` (its content
    then may be empty or null), a tool message its ``tool_call_id`` and ``name``. Anything else is refused with a
    message naming the entry.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {\"role\": ..., \"content\": ...} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be an object with role and content, got {type(m).__name__}")
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}")
        content = m.get("content")
        calls = m.get("tool_calls") if role == "assistant" else None
        if calls is not None:
            _check_calls(calls, i)
            content = content or ""
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError(f"messages[{i}].content: only text parts ({{\"type\": \"text\", \"text\": "
                                     "...}) are supported")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}")
        entry = {"role": role, "content": content}
        if calls:
            entry["tool_calls"] = calls
        for key in ("tool_call_id", "name") if role == "tool" else ():
            if isinstance(m.get(key), str):
                entry[key] = m[key]
        out.append(entry)
    return out


def _check_calls(calls, i: int) -> None:
    ok = isinstance(calls, list) and all(
        isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
        and isinstance(c["function"].get("arguments", "{}"), (str, dict)) for c in calls)
    if not ok:
        raise ValueError(f"messages[{i}].tool_calls must be a list of {{\"id\": ..., \"type\": \"function\", "
                         "\"function\": {\"name\": ..., \"arguments\": ...}}")


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
