"""How close one bundle's model is to another's: teacher-forced agreement, KL and NLL on a text.

Both targets read the same token ids (the candidate bundle's tokenizer; the two
must share it). At every position we compare the next-token distributions:
top-1 agreement (same argmax), mean KL(reference || candidate), and each
model's negative log-likelihood of the text's actual next token.
"""
from __future__ import annotations

from pathlib import Path
import time

import numpy as np

from .checks import is_int

CHUNK = 64  # positions per pass: bounded logits memory whatever the text length


def log_softmax(rows: np.ndarray) -> np.ndarray:
    x = rows.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare_models(candidate: str, reference: str, text: str, tokens: int | None = 400, provider: str = "cpu",
                   threads: int | None = None, which: str = "target", progress=None,
                   reference_which: str | None = None, window: int | None = None) -> dict:
    """Teacher-force the first ``tokens`` tokens of ``text`` through the candidate bundle's ``which`` model
    ("target" or "draft") and the reference bundle's ``reference_which`` (default: the same role), and
    compare their next-token distributions position by position. A bundle's draft against its own target
    is ``compare_models(b, b, text, which="draft", reference_which="target")``.

    With ``window`` W the tokens are cut into consecutive windows of W tokens, each read from an empty cache,
    and only the second half of each window is scored (positions W // 2 .. W - 2, each predicting the next
    token), as llama.cpp's ``llama-perplexity --kl-divergence`` scores its chunks of ``-c W`` tokens: the two
    tools' numbers on one text are then comparable. ``tokens`` None takes every whole window of the text
    (without a window: 400 tokens); a remainder shorter than a window is left out, as there."""
    from .bundle import load_bundle
    from .engine import CausalLM
    from .text import TextCodec

    reference_which = reference_which or which
    for role in (which, reference_which):
        if role not in ("target", "draft"):
            raise ValueError(f"the model must be 'target' or 'draft', got {role!r}")
    if window is not None and not is_int(window, 4):
        raise ValueError(f"window must be an integer >= 4 (tokens per window, half of them scored), got {window!r}")
    if tokens is None:
        tokens = 400 if window is None else None
    elif not is_int(tokens, 2):
        raise ValueError(f"tokens must be an integer >= 2, got {tokens!r}")
    lms, names = [], []
    for root, role in ((candidate, which), (reference, reference_which)):
        b = load_bundle(root)
        spec = b.target if role == "target" else b.draft
        if spec is None:
            raise ValueError(f"bundle {root} has no {role} model")
        lms.append(CausalLM(spec, str(b.file(spec.path)), provider, threads))
        names.append(f"{Path(root).name} {role}")
        if len(lms) == 1:
            if b.tokenizer_file is None:
                raise ValueError(f"bundle {root} has no tokenizer to read the text with")
            codec = TextCodec(b.tokenizer_file, b.tokenizer_config)
    ids = codec.encode(text)[:tokens]
    if window is None:
        if len(ids) < 2:
            raise ValueError("the text encodes to fewer than 2 tokens; pass a longer text")
        segments, skip = [(0, len(ids))], 0
    else:
        count = len(ids) // window
        if not count:
            raise ValueError(f"the text gives {len(ids)} tokens, fewer than one window of {window}: pass a longer "
                             "text, a smaller window or more tokens")
        context = min(lm.capacity for lm in lms)
        if window > context:
            raise ValueError(f"a window of {window} tokens exceeds the models' context of {context}")
        segments, skip = [(k * window, (k + 1) * window) for k in range(count)], window // 2
    n = sum(b - a - 1 - skip for a, b in segments)  # scored positions (each has a next token)
    agree, kl, nll = 0, 0.0, [0.0, 0.0]
    started, done = time.perf_counter(), 0
    for a, b in segments:
        for lm in lms:
            lm.reset()
        for lo in range(a, b - 1, CHUNK):
            hi = min(lo + CHUNK, b - 1)
            feed = ids[lo:hi]
            scored = min(len(feed), hi - (a + skip))  # the chunk's last positions that are scored
            rows = [lm.forward(feed, keep=max(scored, 1)) for lm in lms]
            if scored > 0:
                cand, ref = (log_softmax(r) for r in rows)
                nxt = np.asarray(ids[hi - scored + 1:hi + 1])
                agree += int(np.sum(cand.argmax(-1) == ref.argmax(-1)))
                kl += float(np.sum(np.exp(ref) * (ref - cand)))
                for j, lp in enumerate((cand, ref)):
                    nll[j] -= float(np.sum(lp[np.arange(scored), nxt]))
                done += scored
            if progress:
                progress(done, n)
    return {"candidate": names[0], "reference": names[1], "positions": n,
            "window": window, "windows": len(segments) if window else None,
            "top1_agreement": agree / n, "mean_kl": kl / n,
            "nll_candidate": nll[0] / n, "nll_reference": nll[1] / n,
            "nll_change": nll[0] / nll[1] - 1 if nll[1] else float("nan"),
            "seconds": time.perf_counter() - started}


def format_quality(r: dict) -> str:
    how = "" if not r.get("window") else (f" in {r['windows']} windows of {r['window']} tokens (second halves "
                                          "scored, as llama-perplexity scores its chunks)")
    return (f"{r['candidate']} against {r['reference']}, {r['positions']} positions teacher-forced{how}:\n"
            f"  top-1 agreement {r['top1_agreement']:.1%}, mean KL(reference || candidate) {r['mean_kl']:.4f}\n"
            f"  NLL of the text {r['nll_candidate']:.3f} vs {r['nll_reference']:.3f} ({r['nll_change']:+.1%})")
