"""Structured output: a JSON schema, regular expression or grammar compiled to a token mask that follows the text."""
from __future__ import annotations

import json
import time
from typing import Sequence

import numpy as np

from .errors import OrtspecError
from .sampling.masked import TokenMask

KINDS = ("json_schema", "regex", "grammar", "lark")
ANY_OBJECT = {"type": "object"}  # OpenAI's "json_object": any JSON object


class ConstraintError(OrtspecError, ValueError):
    """A response format that cannot be compiled (a bad schema, pattern or grammar), or a constraint that no
    token can satisfy."""


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ConstraintError("structured output needs the structured extra (llguidance): "
                              "pip install 'ortspec[structured]'") from None
    return llguidance


# where a JSON schema nests other schemas: one schema under each of these keys, ...
_ONE = ("items", "additionalItems", "not", "if", "then", "else", "contains", "propertyNames", "unevaluatedItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")          # ... a list of schemas, ...
_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")  # ... a name -> schema map
_OPEN = ("additionalProperties", "patternProperties", "unevaluatedProperties")  # keys that say "other keys too"


def closed_objects(schema):
    """A JSON schema read as OpenAI's strict mode reads it, which is how apps write tool parameters: an object that
    declares ``properties`` and says nothing of other keys admits only those (``additionalProperties: false``),
    each at most once. Left open, a grammar admits any further key, and any number of them: a small model
    then writes ``"description": ...`` after ``"description": ...`` until max_tokens. A schema that says
    otherwise (additionalProperties, patternProperties, unevaluatedProperties) is kept as written."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _ONE or key in _LIST or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = closed_objects(value)
        elif key in _MAP and isinstance(value, dict):
            out[key] = {name: closed_objects(sub) for name, sub in value.items()}
        else:
            out[key] = value
    if isinstance(out.get("properties"), dict) and not any(k in out for k in _OPEN):
        out["additionalProperties"] = False
    return out


def grammar_for(response_format) -> str:
    """The llguidance grammar of a response format: a JSON schema (a dict), ``{"json_schema": schema}``,
    ``{"regex": pattern}``, ``{"grammar": text}`` (Lark, or GBNF as llama.cpp writes it: told by "::="),
    ``{"lark": text}`` (Lark only), or ``"json"`` (any JSON object). Checked here, before any model work."""
    llg = _llguidance()
    if isinstance(response_format, str) and response_format == "json":
        kind, value = "json_schema", ANY_OBJECT
    elif isinstance(response_format, dict) and len(response_format) == 1 and next(iter(response_format)) in KINDS:
        kind, value = next(iter(response_format.items()))
    elif isinstance(response_format, dict):
        kind, value = "json_schema", response_format
    else:
        raise ConstraintError(f"response_format must be a JSON schema (a dict), {{'regex': ...}}, "
                              f"{{'grammar': ...}} or 'json', got {response_format!r:.80}")
    if kind == "json_schema":
        if not isinstance(value, dict):
            raise ConstraintError(f"a JSON schema must be a dict, got {type(value).__name__}")
        try:
            grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(closed_objects(value)))
        except (TypeError, ValueError) as exc:
            raise ConstraintError(f"invalid JSON schema: {exc}") from None
    elif not isinstance(value, str) or not value:
        raise ConstraintError(f"{kind} must be a non-empty string, got {value!r:.80}")
    elif kind == "regex":
        grammar = llg.LLMatcher.grammar_from_regex(value)
    elif kind == "lark":
        grammar = llg.LLMatcher.grammar_from_lark(value)
    else:
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            text = gbnf_to_lark(value) if "::=" in value else value  # GBNF (told by "::=") to Lark
        except Exception as exc:  # (the converter raises its own kinds)
            raise ConstraintError(f"invalid grammar: {exc}") from None
        grammar = llg.LLMatcher.grammar_from_lark(text)
    error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar)
    if error:
        raise ConstraintError(f"invalid {kind.replace('_', ' ')}: {messages[0] if messages else 'rejected'}")
    return grammar


def engine_view(tokenizer_json: str) -> str:
    """The tokenizer as the grammar engine is to read it. A byte-level BPE whose decoder is a sequence with a
    ByteLevel step (as GGUF conversions write it: ByteFallback, Fuse, Replace, ByteLevel; with byte_fallback
    set on the model) is given that step alone, without byte fallback: the engine tells a tokenizer's kind by
    them, and would read "Ġ" or "Ċ" as those characters instead of a space and a newline (masking by one
    reading and consuming by the other). ``Vocabulary`` checks every token's bytes either way."""
    spec = json.loads(tokenizer_json)
    decoder, pre = spec.get("decoder") or {}, spec.get("pre_tokenizer") or {}
    steps = [pre] + list(pre.get("pretokenizers") or [])
    if decoder.get("type") == "Sequence" and any(s.get("type") == "ByteLevel" for s in steps):
        level = [d for d in decoder.get("decoders") or [] if d.get("type") == "ByteLevel"]
        if level:
            spec["decoder"] = level[0]
            if isinstance(spec.get("model"), dict) and spec["model"].get("byte_fallback"):
                spec["model"] = dict(spec["model"], byte_fallback=False, fuse_unk=False)  # (byte-level: no <0x..>)
            return json.dumps(spec)
    return tokenizer_json


class Vocabulary:
    """A bundle tokenizer as the grammar engine reads it (made once per generator: ~0.3 s for a 49k
    vocabulary), per set of end-of-sequence ids; every token's bytes checked against the tokenizer's own
    decoding the first time (a mask over misread tokens would let through text the format does not allow)."""

    def __init__(self, tokenizer_json: str, vocab_size: int):
        self.tokenizer_json, self.vocab_size = tokenizer_json, int(vocab_size)
        self._made: dict[frozenset, object] = {}
        self._checked = False

    def for_eos(self, eos: frozenset):
        if eos not in self._made:
            llg = _llguidance()
            try:
                made = llg.LLTokenizer(engine_view(self.tokenizer_json), n_vocab=self.vocab_size,
                                       eos_token=sorted(eos) or None)
            except Exception as exc:
                raise ConstraintError(f"the grammar engine cannot read this bundle's tokenizer: {exc}") from None
            if not self._checked:
                self._check(made)
                self._checked = True
            self._made[eos] = made
        return self._made[eos]

    def _check(self, engine) -> None:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_str(self.tokenizer_json)
        wrong = []
        for i in range(min(tok.get_vocab_size(), self.vocab_size)):
            text = tok.decode([i], skip_special_tokens=False)
            if not text or "\ufffd" in text or engine.is_special_token(i):
                continue  # (part of a character, or a special token: no bytes of its own to compare)
            if engine.decode_bytes([i]) != text.encode():
                wrong.append(i)
        if wrong:
            i = wrong[0]
            raise ConstraintError(
                f"the grammar engine reads {len(wrong)} of this tokenizer's tokens differently from the tokenizer "
                f"(token {i}: {engine.decode_bytes([i])!r} against {tok.decode([i], skip_special_tokens=False)!r});"
                " structured output cannot be held on this bundle")


class Constraint(TokenMask):
    """One request's constraint: a matcher over the generated tokens (the prompt is not constrained), moved to
    whatever context a row is read in — forward over new tokens, back (rolled back, as the caches are) over
    rejected drafts — with the mask of each state it reached kept until it is rolled back past."""

    def __init__(self, grammar: str, vocabulary: Vocabulary, eos: frozenset, start: int):
        llg = _llguidance()
        self.vocab_size, self.start = vocabulary.vocab_size, int(start)
        self.matcher = llg.LLMatcher(vocabulary.for_eos(eos), grammar, log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(f"the grammar engine refused the constraint: {self.matcher.get_error()}")
        self._consumed: list[int] = []
        self._masks: dict[int, np.ndarray] = {}  # consumed length -> the allowed tokens there
        self._bits = np.zeros((self.vocab_size + 31) // 32, dtype=np.int32)
        self.masks_made = 0
        self.time_s = 0.0  # spent moving the matcher and making masks

    def _move(self, tokens: Sequence[int]) -> bool:
        """Bring the matcher to the state after ``tokens`` (generated tokens); False when one of them is not
        allowed (the matcher then stands after the longest allowed prefix)."""
        have = self._consumed
        n = min(len(have), len(tokens))
        if have[:n] != list(tokens[:n]):
            n = next(i for i, (a, b) in enumerate(zip(have, tokens)) if a != int(b))
        if n < len(have):
            self.matcher.rollback(len(have) - n)
            del have[n:]
            for k in [k for k in self._masks if k > n]:
                del self._masks[k]
        rest = [int(t) for t in tokens[n:]]
        if not rest:
            return True
        took = self.matcher.try_consume_tokens(rest)
        have.extend(rest[:took])
        return took == len(rest)

    def allowed(self, base: Sequence[int], new: Sequence[int]) -> np.ndarray | None:
        t0 = time.perf_counter()
        try:
            return self._allowed(list(base[self.start:]) + list(new), len(base) - self.start)
        finally:
            self.time_s += time.perf_counter() - t0

    def _allowed(self, tokens: list[int], committed: int) -> np.ndarray | None:
        if not self._move(tokens):
            if len(self._consumed) < committed:  # only drafts may leave it: committed tokens come from masked rows
                raise ConstraintError("the committed text left the constraint (the grammar engine refused a token "
                                      "its own mask allowed); this is a bug, please report it")
            return None
        mask = self._masks.get(len(tokens))
        if mask is None:
            self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
            if self.matcher.is_error():
                raise ConstraintError(f"the grammar engine failed: {self.matcher.get_error()}")
            bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab_size]
            mask = self._masks[len(tokens)] = bits.astype(bool)
            self.masks_made += 1
            if not mask.any():
                raise ConstraintError("the constraint allows no token after the text so far (not even the end "
                                      "of the sequence); check the schema or grammar")
        return mask

    def forced(self, committed: Sequence[int]) -> list[int]:
        """Tokens the constraint allows as the only continuation of ``committed`` (a schema's fixed keys,
        closing brackets): drafts that cost no draft model step."""
        t0 = time.perf_counter()
        try:
            if not self._move(committed[self.start:]) or self.matcher.is_stopped():
                return []
            return list(self.matcher.compute_ff_tokens())
        finally:
            self.time_s += time.perf_counter() - t0

    def complete(self, committed: Sequence[int]) -> bool:
        """Whether the generated text so far is a whole answer (the constraint may end here)."""
        return self._move(committed[self.start:]) and self.matcher.is_accepting()
