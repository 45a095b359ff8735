"""Grammar engines side by side on a bundle's tokenizer: compile time per JSON schema and mask time per token.

    python tools/grammar_engines.py models/smollm2-135m

For each JSON-record schema of tools/structured_bench.py and a valid compact answer to it, each engine compiles
the schema, then walks the answer's tokens, writing the mask of allowed tokens before each one (and checking
that the token is allowed). Engines: llguidance (what ortspec uses) and outlines-core (where installed; it
takes regular expressions and JSON schemas, not context-free grammars). The tokenizer must be byte-level BPE
(GPT-2 style), as outlines-core is given the bytes of each token here. The one-time cost of reading the
vocabulary is printed per engine.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from structured_bench import TASKS  # noqa: E402

ANSWERS = ['{"title":"Dune","author":"Frank Herbert","year":1965,"genres":["science fiction"]}',
           '{"name":"Paris","country":"France","population":2100000,"on_river":true}',
           '{"username":"ada","email":"ada@example.com","age":36,"interests":["math","poetry"]}',
           '{"name":"Pancakes","servings":4,"minutes":20,"ingredients":["flour","milk","eggs"]}']


def _byte_level() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


class Llguidance:
    name = "llguidance"

    def __init__(self, tok, eos: int):
        import llguidance
        from ortspec.constrain import engine_view  # (the tokenizer as ortspec hands it to llguidance)
        self.llg, self.size = llguidance, tok.get_vocab_size()
        self.tokenizer = llguidance.LLTokenizer(engine_view(tok.to_str()), n_vocab=self.size, eos_token=eos)

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            json.dumps(dict(schema, **{"x-guidance": {"whitespace_flexible": False}})))
        return self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)

    @staticmethod
    def mask(state, bits: np.ndarray) -> None:
        state.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)

    @staticmethod
    def advance(state, token: int) -> None:
        state.consume_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok, eos: int):
        import outlines_core
        self.oc, table, tokens = outlines_core, _byte_level(), {}
        for i in range(tok.get_vocab_size()):
            text = tok.id_to_token(i)
            if i == eos or text is None:
                continue
            try:
                key = bytes(table[ch] for ch in text)
            except KeyError:  # (an added token: its text as it is)
                key = text.encode()
            tokens.setdefault(key, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, tokens)

    def compile(self, schema: dict):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    @staticmethod
    def mask(state, bits: np.ndarray) -> None:
        state.write_mask_into(bits.ctypes.data, bits.size, bits.itemsize)

    @staticmethod
    def advance(state, token: int) -> None:
        state.advance(token)


def measure(engine, tok, size: int) -> list[dict]:
    rows = []
    bits = np.zeros((size + 31) // 32, dtype=np.int32)
    for (_, schema), text in zip(TASKS, ANSWERS):
        ids = tok.encode(text, add_special_tokens=False).ids
        t0 = time.perf_counter()
        state = engine.compile(schema)
        compiled = time.perf_counter() - t0
        allowed = True
        t0 = time.perf_counter()
        for t in ids:
            engine.mask(state, bits)
            allowed &= bool((bits[t // 32] >> (t % 32)) & 1)
            engine.advance(state, t)
        rows.append(dict(engine=engine.name, schema=next(iter(schema["properties"])), tokens=len(ids),
                         compile_ms=1000 * compiled, mask_ms=1000 * (time.perf_counter() - t0) / len(ids),
                         allowed=allowed))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", help="a bundle directory (its tokenizer.json is read)")
    ap.add_argument("--eos", type=int, default=None, help="end-of-sequence id (default: the bundle's first)")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer
    from ortspec.bundle import load_bundle
    tok = Tokenizer.from_file(str(Path(args.bundle) / "tokenizer.json"))
    eos = args.eos if args.eos is not None else sorted(load_bundle(args.bundle).eos_token_ids)[0]
    print(f"{args.bundle}: {tok.get_vocab_size()} tokens; compact JSON answers, a mask before every token")
    print(f"{'engine':14s} {'schema':10s} {'tokens':>6s} {'compile ms':>11s} {'mask ms/token':>14s} allowed")
    for cls in (Llguidance, OutlinesCore):
        t0 = time.perf_counter()
        try:
            engine = cls(tok, eos)
        except ImportError:
            print(f"{cls.name:14s} not installed")
            continue
        print(f"{cls.name:14s} vocabulary read in {1000 * (time.perf_counter() - t0):.0f} ms")
        for r in measure(engine, tok, tok.get_vocab_size()):
            print(f"{r['engine']:14s} {r['schema']:10s} {r['tokens']:6d} {r['compile_ms']:11.1f} {r['mask_ms']:14.3f} "
                  f"{r['allowed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
