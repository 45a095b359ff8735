"""Goodness-of-fit helpers for the statistical tests."""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
import multiprocessing
import os
from pathlib import Path

import numpy as np
from ortspec.stats import pooled_chi_square

ALPHA = 0.001


def chi_square_p(counts, probs) -> float:
    """Chi-square goodness-of-fit p-value on pooled cells (the runtime's own, checked against SciPy)."""
    return pooled_chi_square(counts, probs)[0]


def grouped(counts: np.ndarray, probs: np.ndarray, groups: int = 50, apart=()) -> tuple[np.ndarray, np.ndarray]:
    """Counts and probabilities summed over groups of the tokens of positive probability, by probability (the
    tokens ``apart`` a group of their own)."""
    order = np.argsort(probs, kind="stable")
    order = order[(probs[order] > 0) & ~np.isin(order, apart)]
    parts = np.array_split(order, groups) + ([np.asarray(apart)] if len(apart) else [])
    return np.array([counts[g].sum() for g in parts]), np.array([probs[g].sum() for g in parts])


@contextmanager
def worker_pool(workers: int):
    """Spawned worker processes for seeded generations; they import this module (the tests directory goes on
    their path)."""
    tests_dir = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [tests_dir, os.environ.get("PYTHONPATH")]))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        yield ex


_GENERATORS: dict = {}


def sample_prefixes(job: dict) -> tuple[np.ndarray, int, int]:
    """Worker: counts of the first ``k`` generated tokens over ``seeds`` (runs in a pool process)."""
    from ortspec import SpeculativeGenerator, generator
    from ortspec.exactness import wrong_verify
    key = (job["bundle"], job["drafter"])
    if key not in _GENERATORS:
        _GENERATORS[key] = SpeculativeGenerator.load(job["bundle"], drafter=job["drafter"], threads=1)
    gen = _GENERATORS[key]
    if job["gamma"] == "auto":  # pretend a cheap draft so that "auto" drafts, with gamma varying per round
        gen.memory.data = {"target_costs": [1.0, 1.02, 1.04, 1.06, 1.08, 1.1, 1.12, 1.14, 1.16], "draft_cost": 0.05}
    k, vocab = job["k"], gen.vocab_size
    counts = np.zeros((vocab,) * k, dtype=np.int64)
    drafted = accepted = 0
    gen.sampled_verify = wrong_verify if job["wrong"] else generator.verify_dists
    try:
        for seed in job["seeds"]:
            gen.timing_prior.clear()  # every request plans from the pretended costs, not those timed before it
            res = gen.generate(input_ids=job["prompt"], max_new_tokens=job["max_new_tokens"], do_sample=True,
                               seed=seed, num_draft_tokens=job["gamma"], eos_token_id=[], **job["sampling"])
            counts[tuple(res.token_ids[:k])] += 1
            drafted += res.stats.drafted
            accepted += res.stats.accepted
    finally:
        gen.sampled_verify = generator.verify_dists
    return counts, drafted, accepted


def sample_pairs(job: dict) -> tuple[np.ndarray, int, int]:
    """Worker: the first two generated tokens of each seed's generation, as an [n, 2] array (runs in a pool
    process; for vocabularies too wide for ``sample_prefixes``' count table)."""
    from ortspec import SpeculativeGenerator, generator
    from ortspec.exactness import wrong_verify
    key = (job["bundle"], job["drafter"])
    if key not in _GENERATORS:
        _GENERATORS[key] = SpeculativeGenerator.load(job["bundle"], drafter=job["drafter"], threads=1)
    gen = _GENERATORS[key]
    pairs, drafted, accepted = [], 0, 0
    gen.sampled_verify = {False: generator.verify_dists, True: wrong_verify, "accept": accept_all}[job["wrong"]]
    try:
        for seed in job["seeds"]:
            res = gen.generate(input_ids=job["prompt"], max_new_tokens=job["max_new_tokens"], do_sample=True,
                               seed=seed, num_draft_tokens=job["gamma"], eos_token_id=[], **job["sampling"])
            pairs.append(res.token_ids[:2])
            drafted += res.stats.drafted
            accepted += res.stats.accepted
    finally:
        gen.sampled_verify = generator.verify_dists
    return np.array(pairs, dtype=np.int64).reshape(-1, 2), drafted, accepted


def accept_all(draft_tokens, draft_dists, target_dist, rng, min_mass=None):
    """A wrong verifier for negative controls where drafts carry little of p (flat rows): every draft passes."""
    from ortspec.verify import Verdict
    n = len(draft_tokens)
    return Verdict(n, target_dist(n).sample(rng), True)
