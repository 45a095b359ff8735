"""Exactness checks of a pair on this machine: greedy equality with near-tie analysis.

A batched verify pass and a single-token step may differ in the last float
bits, which can flip an argmax when the top two logits are (nearly) tied. Any
divergence from target-only greedy output is therefore classified: a
*near-tie* when the target's top-2 margin at the diverging position (from a
fresh prefill of the common prefix) is below ``tie_tolerance``, else a real
*mismatch*.
"""
from __future__ import annotations

from dataclasses import dataclass, field, asdict
from typing import Sequence

import numpy as np

from .logits import LogitsPipeline
from .config import SamplingConfig


@dataclass
class Divergence:
    prompt_index: int
    drafter: str
    gamma: int
    position: int          # index into the new tokens
    target_token: int      # what target-only greedy produced
    speculative_token: int
    margin: float          # top-1 minus top-2 target logit at that position
    near_tie: bool


@dataclass
class GreedyReport:
    prompts: int = 0
    runs: int = 0
    mismatches: int = 0
    near_ties: int = 0
    divergences: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "runs": self.runs, "mismatches": self.mismatches,
                "near_ties": self.near_ties, "divergences": [asdict(d) for d in self.divergences]}


def greedy_check(bundle_dir: str, prompts: Sequence[list[int]], gammas: Sequence[int],
                 drafters: Sequence[str] = ("model",), max_new_tokens: int = 64,
                 tie_tolerance: float = 1e-4, provider: str = "cpu", threads: int | None = None,
                 repetition_penalty: float = 1.0, progress=None) -> GreedyReport:
    """Compare speculative greedy output with target-only greedy output, token for token."""
    from .generator import SpeculativeGenerator

    base = SpeculativeGenerator.load(bundle_dir, provider=provider, drafter="none", threads=threads, verify="none")
    gens = {d: SpeculativeGenerator.load(bundle_dir, provider=provider, drafter=d, threads=threads, verify="none")
            for d in drafters}
    pipe = LogitsPipeline(SamplingConfig(repetition_penalty=repetition_penalty), base.vocab_size)
    report = GreedyReport(prompts=len(prompts))
    kw = dict(max_new_tokens=max_new_tokens, repetition_penalty=repetition_penalty)
    for i, ids in enumerate(prompts):
        want = base.generate(input_ids=ids, **kw).token_ids
        for drafter, gen in gens.items():
            for gamma in gammas:
                got = gen.generate(input_ids=ids, num_draft_tokens=gamma, **kw).token_ids
                report.runs += 1
                if progress:
                    progress(report.runs)
                if got == want:
                    continue
                pos = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                context = list(ids) + want[:pos]
                scores = pipe.scores(base.target.reference_logits(context)[-1:], context)[0]
                top = np.sort(scores)[-2:]
                margin = float(top[1] - top[0])
                tie = margin < tie_tolerance
                report.divergences.append(Divergence(
                    i, drafter, gamma, pos, int(want[pos]) if pos < len(want) else -1,
                    int(got[pos]) if pos < len(got) else -1, margin, tie))
                if tie:
                    report.near_ties += 1
                else:
                    report.mismatches += 1
    return report
