"""Frozen, validated configuration objects for sampling and speculation."""
from __future__ import annotations

from dataclasses import dataclass

from .checks import is_int, is_number


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen, with Hugging Face `generate` semantics.

    Greedy (``do_sample=False``) takes the argmax after repetition penalty and
    banned words; sampling applies temperature, top-k and top-p as well.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) added to its logit before the processors

    def __post_init__(self) -> None:
        if not isinstance(self.do_sample, bool):
            raise ValueError(f"do_sample must be True or False, got {self.do_sample!r}")
        _check_number("temperature", self.temperature)
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0, got {self.temperature}; use do_sample=False for greedy decoding")
        if not is_int(self.top_k, 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {self.top_p}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(
                f"repetition_penalty must be > 0 (1.0 disables it), got {self.repetition_penalty}")
        words = tuple(tuple(int(t) for t in w) for w in self.bad_words_ids)
        if any(len(w) == 0 or min(w) < 0 for w in words):
            raise ValueError("bad_words_ids must be non-empty sequences of token ids >= 0")
        object.__setattr__(self, "bad_words_ids", words)
        bias = dict(self.logit_bias) if not isinstance(self.logit_bias, dict) else self.logit_bias
        checked = []
        for t, b in bias.items():
            if not is_int(t, 0):
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {t!r}")
            if not is_number(b, -100, 100):
                raise ValueError(f"logit_bias values must be numbers in [-100, 100], got {b!r} for token {t}")
            checked.append((int(t), float(b)))
        object.__setattr__(self, "logit_bias", tuple(sorted(checked)))


# The settings where neither a call nor the bundle's generation config gives one: transformers' defaults
# (greedy; when sampling, temperature 1, top-k 50, top-p 1, no penalty). top_k=0 turns top-k off.
SAMPLING_FALLBACK = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0}


def resolve_sampling(defaults: dict, **given) -> dict:
    """Each setting given (not None) wins, then the bundle's ``defaults``, then SAMPLING_FALLBACK."""
    return {k: given[k] if given.get(k) is not None else defaults.get(k, v) for k, v in SAMPLING_FALLBACK.items()}


DRAFT_TOP_K = 64  # the draft samples from at most this many tokens under a target's top-p nucleus
# Without top-p, p reaches past any draft's top 64 (over the whole vocabulary without a top-k), and on a close
# draft q's cut was most of what acceptance lost (SmolLM2 pair, no top-k: sum min(p, q) 0.91 -> 0.94 at
# temperature 1.0; under a top-p nucleus a wider q gained nothing and cost ~1 us per candidate of a flat row,
# right after each draft pass)
DRAFT_WIDE_TOP_K = 128
# Under a penalty without top-k or top-p, an untruncated q costs an exponential per vocabulary entry per draft
# row, and the residual of a rejection is taken over whole rows: above DENSE_DRAFT_VOCAB entries (151,936 for
# Qwen2.5) that took the host math of a round to 1.0-2.3 ms (``bench --micro``, warm), and the draft reads
# DRAFT_WIDE_TOP_K candidates instead (Qwen2.5 pair, penalty 1.1, 6 dev prompts x 48 tokens: sum min(p, q)
# 0.829 at 64, 0.836-0.861 at 128, 0.860 untruncated; tokens per round 3.16 / 3.56 / 3.56). More than
# DRAFT_WIDE_TOP_K would not come from the graph's top entries: the whole row would be read again.
DENSE_DRAFT_VOCAB = 65_536
DRAFT_SAMPLING = ("match", "temperature")


def draft_sampling(target: SamplingConfig, policy: str = "match", vocab_size: int | None = None) -> SamplingConfig:
    """What the draft samples from. Any choice keeps the output exact, because the verifier sees the very
    distribution q each draft token was drawn from; it only moves acceptance (sum_x min(p, q)) and cost.

    "match": the target's own settings, with top-k capped at DRAFT_TOP_K (so q lives on a few ids and is cheap
    to compute, sample and compare), at DRAFT_WIDE_TOP_K where the target has no top-p, and none at all where
    the target keeps its whole vocabulary under a repetition penalty (no top-k, no top-p): the penalty pushes
    the context's tokens down and spreads p into the long tail, past any top-k of q (SmolLM2 pair, penalty
    1.1: sum min(p, q) 0.81 at 64, 0.86 at 128, 0.90 at 256, 0.97 untruncated; 75 -> 95 tokens/s from 128),
    on a ``vocab_size`` up to DENSE_DRAFT_VOCAB; above it DRAFT_WIDE_TOP_K (``vocab_size`` None: untruncated).
    "temperature": the target's temperature, penalty and banned words, that top-k, no top-p.
    """
    if policy not in DRAFT_SAMPLING:
        raise ValueError(f"draft sampling policy must be one of {', '.join(DRAFT_SAMPLING)}, got {policy!r}")
    if target.top_p < 1.0:
        top_k = min(target.top_k or DRAFT_TOP_K, DRAFT_TOP_K)
    elif target.top_k or target.repetition_penalty == 1.0:
        top_k = min(target.top_k or DRAFT_WIDE_TOP_K, DRAFT_WIDE_TOP_K)
    elif vocab_size is None or vocab_size <= DENSE_DRAFT_VOCAB:
        top_k = 0  # p keeps the whole vocabulary under a penalty: untruncated, a dense q
    else:
        top_k = DRAFT_WIDE_TOP_K  # (a dense q this wide costs more host time than it gains acceptance)
    top_p = target.top_p if policy == "match" else 1.0
    return SamplingConfig(target.do_sample, target.temperature, top_k, top_p, target.repetition_penalty,
                          target.bad_words_ids, target.logit_bias)


@dataclass(frozen=True)
class SpeculationConfig:
    """How many tokens to draft per round (a fixed count or "auto"), and whether target passes are bitwise.

    ``bitwise`` (default): no target pass has a single position (nor, for a target in blocks of 64 weights or
    more, any odd number: ``ModelSpec.row_tile``), so every committed token's logits come from onnxruntime's
    multi-row kernels, whose per-position results do not depend on what else shares the pass: greedy output
    is then identical, token for token, whatever the drafter, the draft length or the prefix reuse, and
    identical to target-only decoding. ``False`` lets target-only steps take the one-row kernels (a little
    faster on some targets; output then matches only up to their rounding).
    """

    num_draft_tokens: int | str = 4
    max_draft_tokens: int = 16
    bitwise: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.bitwise, bool):
            raise ValueError(f"bitwise must be True or False, got {self.bitwise!r}")
        n = self.num_draft_tokens
        if n == "auto":
            return
        if not is_int(n, 0, self.max_draft_tokens):
            raise ValueError(
                f"num_draft_tokens must be an integer in [0, {self.max_draft_tokens}] or 'auto', got {n!r}")


DRAFTERS = ("model", "prompt_lookup", "hybrid", "none")
DEFAULT_DRAFTER, DEFAULT_NUM_DRAFT_TOKENS = "model", 4  # where a call and the bundle leave them out


def check_generation(generation: dict | None) -> None:
    """Refuse sampling defaults for a bundle's generation_config.json that generation would refuse."""
    if generation is None:
        return
    keys = {"do_sample", "temperature", "top_k", "top_p", "repetition_penalty"}
    if not isinstance(generation, dict) or set(generation) - keys:
        raise ValueError(f"generation takes {', '.join(sorted(keys))}; got "
                         f"{sorted(set(generation) - keys) if isinstance(generation, dict) else generation!r}")
    SamplingConfig(**generation)


def check_decoding(decoding: object, has_draft: bool | None = None) -> dict:
    """A bundle's decoding defaults, {"drafter": one of DRAFTERS, "num_draft_tokens": an integer or "auto"}
    (either may be left out), checked and normalized ("prompt-lookup" -> "prompt_lookup"); ValueError if bad,
    or (``has_draft`` False) if it names a drafter that needs a draft model."""
    keys = ("drafter", "num_draft_tokens")
    if not isinstance(decoding, dict) or set(decoding) - set(keys):
        raise ValueError(f"decoding defaults take {' and '.join(keys)}, got {decoding!r}")
    out = dict(decoding)
    if "drafter" in out:
        drafter = out["drafter"].replace("-", "_") if isinstance(out["drafter"], str) else out["drafter"]
        if drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {out['drafter']!r}")
        out["drafter"] = drafter
    if "num_draft_tokens" in out:
        SpeculationConfig(out["num_draft_tokens"])
    if has_draft is False and out.get("drafter") in ("model", "hybrid"):
        raise ValueError(f"decoding names drafter {out['drafter']!r} but the bundle has no draft model: "
                         "pass a draft too")
    return out


def _check_number(name: str, value: object) -> None:
    if not is_number(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
