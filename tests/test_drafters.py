"""Long copies drafted long, and the hybrid drafter (lookups where the context matches, the model otherwise):
their choices, and greedy output equal to target-only decoding while they make them."""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ortspec import SpeculativeGenerator
from ortspec.drafting import HybridDrafter, PromptLookupDrafter
from ortspec.config import SamplingConfig
from ortspec.sampling import LogitsPipeline

TEXT = [1] + list(range(20, 60)) + [7, 8] + list(range(20, 40))  # a copy of 20..59 is under way at the end


def test_copy_run_grows_proposals_and_a_rejection_ends_it():
    d = PromptLookupDrafter()
    committed = list(TEXT)
    draft = d.propose(committed, 2, None, False, None, limit=30)
    assert draft.tokens == [40, 41]                       # gamma: no run yet
    committed = committed + [40, 41, 42]                  # accepted whole, and the target's next token
    draft = d.propose(committed, 2, None, False, None, limit=30)
    assert draft.tokens == [43, 44, 45]                   # the run (3) bounds the proposal
    committed = committed + [43, 44, 45, 46]
    draft = d.propose(committed, 2, None, False, None, limit=30)
    assert draft.tokens == list(range(47, 54))            # 3 + 4 = 7 proven
    committed = committed + [47, 48, 5]                   # rejected at the third token
    d.observe(committed)
    assert d.length(2, 30) == 2                           # the run is over


def test_long_proposals_are_bounded_by_limit_and_longest():
    d = PromptLookupDrafter()
    d._run = 500
    assert d.length(3, 10) == 10
    assert d.length(3, 1000) == PromptLookupDrafter.LONG_MAX
    assert d.length(0, 10) == 0


def test_cost_model_sizes_long_proposals():
    d = PromptLookupDrafter()
    d._run, d.copy_alpha = 50, 0.8
    d.pass_costs = [1.0] + [1.0 + 0.01 * k for k in range(1, 9)]   # a memory-bound target: passes cost ~ the same
    flat = d.length(2, 50)
    d.pass_costs = [1.0 * k for k in range(1, 10)]                 # a pass costs k steps: long ones never pay
    steep = d.length(2, 50)
    assert flat > 10 and steep == 2


def test_a_new_request_starts_without_a_run():
    d = PromptLookupDrafter()
    committed = list(TEXT)
    d.propose(committed, 2, None, False, None, limit=30)
    d.propose(committed + [40, 41, 42], 2, None, False, None, limit=30)
    d.propose([1, 2, 3, 2], 2, None, False, None, limit=30)  # another context
    assert d._run == 0


def scan_lookup(committed, gamma, lo=1, hi=3):
    """The lookup rule by brute force: scan every earlier window for the longest tail that recurs."""
    seq = np.asarray(committed, dtype=np.int64)
    if gamma < 1:
        return [], 0
    for n in range(min(hi, len(seq) - 1), lo - 1, -1):
        hits = np.nonzero((np.lib.stride_tricks.sliding_window_view(seq[:-1], n) == seq[-n:]).all(axis=1))[0]
        if hits.size:
            starts = hits + n
            full = starts[starts + gamma <= seq.size]
            start = int(full[-1] if full.size else starts[-1])
            return [int(t) for t in seq[start:start + gamma]], n
    return [], 0


def test_indexed_lookup_equals_a_full_scan_as_contexts_grow_shrink_and_change():
    rng, d, seq = random.Random(0), PromptLookupDrafter(), []
    for _ in range(3000):
        r = rng.random()
        if r < 0.05:
            seq = seq[:rng.randrange(len(seq) + 1)]                       # rolled back
        elif r < 0.07:
            seq = [rng.randrange(6) for _ in range(rng.randrange(30))]   # another request
        elif r < 0.09 and seq:
            seq = seq[:-3] + [rng.randrange(6)]                           # a changed tail
        else:
            seq = seq + [rng.randrange(6) for _ in range(rng.randrange(4))]
        gamma = rng.randrange(6)
        assert d.match(seq, gamma) == scan_lookup(seq, gamma), (seq, gamma)
        # the index holds the windows of the current text only: nothing grows with use
        d._index.update(seq)
        assert sum(map(len, d._index.starts.values())) == sum(max(len(seq) - n + 1, 0) for n in (1, 2, 3))
        assert all(d._index.starts.values())


@pytest.fixture(scope="module")
def small(small_bundle):
    return SpeculativeGenerator.load(small_bundle)


def test_hybrid_choice_without_costs_takes_matches_of_two_tokens_or_more(small):
    h = HybridDrafter(small.drafter)
    assert h._choose(2, 4, 4) == ("lookup", 4) and h._choose(3, 1, 4) == ("lookup", 1)
    assert h._choose(1, 4, 4) == h._choose(0, 0, 4) == ("model", 4)


def test_hybrid_choice_with_costs_weighs_the_model_draft(small):
    h = HybridDrafter(small.drafter)
    h.pass_costs, h.draft_cost = [1.0, 1.05, 1.1, 1.15, 1.2], 0.05
    h.alpha_model, h.alpha_by_order[1] = 0.9, 0.2
    assert h._choose(1, 4, 4) == ("model", 4)   # a weak unigram lookup loses to a good cheap draft
    h.alpha_by_order[1] = 0.95
    assert h._choose(1, 4, 4) == ("lookup", 4)
    h.draft_cost = 2.0                           # an expensive draft: even a poor lookup is worth its free pass
    h.alpha_by_order[1] = 0.3
    assert h._choose(1, 4, 4)[0] == "lookup"


def test_hybrid_drafts_nothing_where_neither_source_pays(small):
    """Passes that cost per token (a quantized target on a CPU) and a costly draft: a poor lookup and the model
    both predict a loss, so the round drafts nothing; a good lookup still drafts; and after PROBE_EVERY
    rounds without a match the model drafts once to re-measure its acceptance."""
    h = HybridDrafter(small.drafter)
    h.pass_costs, h.draft_cost = [1.0, 1.0, 1.8, 2.6, 3.4], 0.6
    h.alpha_model, h.alpha_by_order[1], h.alpha_by_order[3] = 0.5, 0.3, 0.95
    assert h._choose(0, 0, 4) == (None, 0)
    assert h._choose(1, 4, 4) == ("lookup", 1)  # its first token rides free in the pass of two bitwise runs anyway
    h.pass_costs = [1.0, 1.8, 2.6, 3.4, 4.2]    # one-position passes (not bitwise): nothing is free
    assert h._choose(1, 4, 4) == (None, 0)
    assert h._choose(3, 4, 4)[0] == "lookup"    # a trusted match still pays
    h.pass_costs = [1.0, 1.0, 1.8, 2.6, 3.4]
    sampling = SamplingConfig()
    pipe = LogitsPipeline(sampling, small.vocab_size)
    rng = np.random.default_rng(0)
    committed = [1, 2, 3, 4, 5, 6, 7, 8]         # no repeat: no n-gram matches
    drafts = [h.propose(committed, 4, pipe, False, rng) for _ in range(HybridDrafter.PROBE_EVERY)]
    assert [len(d.tokens) for d in drafts[:-1]] == [0] * (HybridDrafter.PROBE_EVERY - 1)
    assert len(drafts[-1].tokens) == 4 and h.model_rounds == 1 and h.idle_rounds == HybridDrafter.PROBE_EVERY - 1
    # a draft step thought to cost more than any draft could win back: alone the model is probed all the same
    # (its step is re-timed only in its own rounds); in a batch it is not (the control)
    for crowded, probes in ((False, 1), (True, 0)):
        h.set_costs([1.0, 1.0, 1.8, 2.6, 3.4], 50.0, crowded)
        before = h.model_rounds
        drafts = [h.propose(committed, 4, pipe, False, rng) for _ in range(HybridDrafter.PROBE_EVERY)]
        assert h.model_rounds - before == probes and sum(len(d.tokens) for d in drafts) == 4 * probes


def test_hybrid_still_looks_up_while_auto_pauses_the_model(small_bundle, tmp_path, monkeypatch):
    """Auto pausing model drafts (gamma 0) leaves the hybrid its lookups (the vocab-16 target loops, so they
    match and pay); a fixed gamma of 0 drafts nothing; output equals target-only decoding either way."""
    from ortspec.control.controllers import AutoController
    b = tmp_path / "b"
    shutil.copytree(small_bundle, b)  # auto calibrates once and stores the profile in the bundle
    monkeypatch.setattr(AutoController, "choose", lambda self: 0)
    gen = SpeculativeGenerator.load(b, drafter="hybrid")
    target_only = gen.sibling("none")
    ids = [1, 6, 9, 5]
    want = target_only.generate(input_ids=ids, max_new_tokens=80, eos_token_id=[], do_sample=False).token_ids
    got = gen.generate(input_ids=ids, max_new_tokens=80, eos_token_id=[], do_sample=False, num_draft_tokens="auto")
    assert got.token_ids == want
    assert gen.drafter.lookup_rounds > 0 and gen.drafter.model_rounds == 0
    before = gen.drafter.lookup_rounds
    fixed = gen.generate(input_ids=ids, max_new_tokens=80, eos_token_id=[], do_sample=False, num_draft_tokens=0)
    assert fixed.token_ids == want and gen.drafter.lookup_rounds == before


def test_hybrid_reads_the_costs_timed_in_the_request(small_bundle, tmp_path):
    """With no stored profile, the hybrid's choice uses the pass costs and draft step its request timed."""
    b = tmp_path / "b"
    shutil.copytree(small_bundle, b)
    gen = SpeculativeGenerator.load(b, drafter="hybrid")
    assert gen.stored_profile() is None
    gen.generate(input_ids=[1, 5, 9, 5], max_new_tokens=60, eos_token_id=[], do_sample=False, num_draft_tokens=3)
    assert gen.drafter.pass_costs and gen.drafter.draft_cost is not None and gen.drafter.draft_cost > 0
    assert gen.stored_profile() is None          # a fixed gamma measures nothing on disk


@pytest.mark.parametrize("drafter", ["prompt_lookup", "hybrid"])
def test_greedy_output_equals_target_only_through_long_copies(small, drafter):
    """The vocab-16 target falls into loops that lookups copy: proposals far longer than gamma are made,
    and every token equals target-only decoding."""
    target_only, gen = small.sibling("none"), small.sibling(drafter)
    longest = 0
    for k in range(6):
        ids = [1, 5 + k, 9, 5]
        want = target_only.generate(input_ids=ids, max_new_tokens=150, eos_token_id=[], do_sample=False)
        got = gen.generate(input_ids=ids, max_new_tokens=150, eos_token_id=[], do_sample=False, num_draft_tokens=2)
        assert got.token_ids == want.token_ids, k
        longest = max(longest, len(got.stats.proposed_at))
    assert longest > 16  # past the cap fixed draft lengths have
    if drafter == "hybrid":
        assert gen.drafter.lookup_rounds > 0 and gen.drafter.model_rounds > 0


def test_hybrid_drafter_is_offered(small_bundle, pair_bundle):
    gen = SpeculativeGenerator.load(small_bundle, drafter="hybrid")
    assert gen.drafter.name == "hybrid" and gen.drafter.lm is not None
    assert SpeculativeGenerator.load(pair_bundle).sibling("hybrid").drafter.name == "hybrid"


def _with_decoding(bundle, tmp_path, decoding):
    """A copy of ``bundle`` whose manifest carries ``decoding`` (what a recipe's [decoding] table writes)."""
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "ortspec.json").read_text())
    (copy / "ortspec.json").write_text(json.dumps(dict(manifest, decoding=decoding)))
    return copy


def test_a_bundles_decoding_defaults_apply_where_a_call_leaves_them_out(small_bundle, tmp_path):
    plain = SpeculativeGenerator.load(small_bundle)  # no decoding entry: ortspec's defaults
    assert plain.drafter.name == "model" and plain.default_num_draft_tokens == 4
    assert max(plain.generate(input_ids=[1, 2, 3], max_new_tokens=16, do_sample=False).stats.round_gammas) == 4
    b = _with_decoding(small_bundle, tmp_path, {"drafter": "hybrid", "num_draft_tokens": 2})
    gen = SpeculativeGenerator.load(b)
    assert gen.drafter.name == "hybrid" and gen.default_num_draft_tokens == 2
    res = gen.generate(input_ids=[1, 2, 3], max_new_tokens=16, do_sample=False)
    assert max(res.stats.round_gammas) == 2
    explicit = gen.generate(input_ids=[1, 2, 3], max_new_tokens=16, do_sample=False, num_draft_tokens=3)
    assert max(explicit.stats.round_gammas) == 3 and explicit.token_ids == res.token_ids
    assert SpeculativeGenerator.load(b, drafter="none").drafter.name == "none"  # a call's choice wins
    from ortspec.scheduler import Engine
    assert Engine(gen, "m").default_gamma == 2 and Engine(gen, "m", default_gamma="auto").default_gamma == "auto"
    from ortspec.inspect import format_report, inspect_bundle
    assert "decoding when a call sets nothing: drafter=hybrid, num_draft_tokens=2  (from the manifest)" in \
        format_report(inspect_bundle(str(b), checksums=False))
    for flags, said in (((), "(drafter hybrid, draft tokens 2)"),
                        (("--drafter", "model", "--num-draft-tokens", "3"), "(drafter model, draft tokens 3)")):
        proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "generate", str(b), "--input-ids", "1,2,3",
                               "--max-new-tokens", "6", "--greedy", *flags], capture_output=True, text=True)
        assert proc.returncode == 0 and said in proc.stderr, proc.stderr


def test_an_export_that_decodes_with_auto_times_the_machine_once(small_bundle, tmp_path, capsys):
    from ortspec.commands import _time_for_auto
    b = _with_decoding(small_bundle, tmp_path, {"num_draft_tokens": "auto"})
    (b / "ortspec-profile.json").unlink(missing_ok=True)
    _time_for_auto(b)
    assert SpeculativeGenerator.load(b).stored_profile()["draft_cost"] > 0
    assert "timed this machine's pass costs" in capsys.readouterr().err
    _time_for_auto(b)  # stored: not again
    assert capsys.readouterr().err == ""
    plain = tmp_path / "plain"
    shutil.copytree(small_bundle, plain)
    (plain / "ortspec-profile.json").unlink(missing_ok=True)
    _time_for_auto(plain)  # a bundle that does not decode with auto by default is left as it is
    assert not (plain / "ortspec-profile.json").exists()


@pytest.mark.parametrize("decoding, needle", [
    ({"drafter": "lookahead"}, "drafter must be one of"),
    ({"num_draft_tokens": 99}, "num_draft_tokens must be"),
    ({"gamma": 4}, "decoding defaults take"),
    ("hybrid", "decoding defaults take"),
])
def test_a_malformed_decoding_entry_is_named(small_bundle, tmp_path, decoding, needle):
    from ortspec.bundle import load_bundle
    from ortspec.errors import BundleError
    with pytest.raises(BundleError, match=needle):
        load_bundle(_with_decoding(small_bundle, tmp_path, decoding), verify="none")


def test_a_decoding_default_needing_a_draft_is_refused_without_one(ids_bundle, tmp_path):
    from ortspec.bundle import load_bundle
    from ortspec.errors import BundleError
    with pytest.raises(BundleError, match="no draft model"):
        load_bundle(_with_decoding(ids_bundle, tmp_path, {"drafter": "hybrid"}), verify="none")
    assert load_bundle(_with_decoding(ids_bundle, tmp_path / "2", {"drafter": "prompt-lookup"})).decoding == \
        {"drafter": "prompt_lookup"}


def test_draft_window_view_keeps_the_first_tokens_and_a_recent_stretch():
    from ortspec.drafting import ModelDrafter
    d = ModelDrafter(lm=None, window=32)
    short = list(range(30))
    assert d.view(short) == short
    long = list(range(100))
    v = d.view(long)
    assert v[:4] == [0, 1, 2, 3] and v[-1] == 99 and 32 <= len(v) - 4 <= 32 + 16
    # the stretch's start moves in steps of half a window: one more token keeps the same view plus it
    assert d.view(long + [100]) == v + [100]
    with pytest.raises(ValueError, match="draft_window"):
        ModelDrafter(lm=None, window=8)


@pytest.mark.parametrize("drafter", ["model", "hybrid"])
def test_windowed_draft_keeps_output_and_reads_less(pair_bundle, drafter):
    full = SpeculativeGenerator.load(pair_bundle, drafter=drafter)
    windowed = SpeculativeGenerator.load(pair_bundle, drafter=drafter, draft_window=24)
    ids = [1] + [int(t) for t in (list(range(3, 60)) + list(range(10, 50)))]
    want = full.sibling("none").generate(input_ids=ids, max_new_tokens=40, eos_token_id=[], do_sample=False)
    got = windowed.generate(input_ids=ids, max_new_tokens=40, eos_token_id=[], do_sample=False, num_draft_tokens=3,
                            strict=True)  # strict: the draft cache must hold exactly the windowed view
    assert got.token_ids == want.token_ids
    assert windowed.drafter.lm.length <= 4 + 24 + 12 + 3
    twin = windowed.sibling(drafter).drafter
    assert twin.lm is windowed.drafter.lm and getattr(twin, "model", twin).window == 24
    with pytest.raises(ValueError, match="draft_window"):
        SpeculativeGenerator.load(pair_bundle, draft_window=0)


def test_a_long_prompt_gets_its_first_token_from_the_target_alone(pair_bundle, monkeypatch):
    monkeypatch.setattr(SpeculativeGenerator, "LAZY_PREFILL", 16)
    gen = SpeculativeGenerator.load(pair_bundle)
    ids = [1] + list(range(3, 60))
    res = gen.generate(input_ids=ids, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[], do_sample=False)
    assert res.stats.round_gammas[0] == 0 and max(res.stats.round_gammas[1:]) == 3
    want = gen.sibling("none").generate(input_ids=ids, max_new_tokens=20, eos_token_id=[], do_sample=False)
    assert res.token_ids == want.token_ids


# -- a self-draft reading its target's cache ---------------------------------------------------------------------

def _sharing(bundle):
    """A target that has read 30 tokens, a second model of the same graph on its cache, the tokens, and the
    target's logits of a fresh prefill of all of them."""
    from ortspec.bundle import load_bundle
    from ortspec.engine import CausalLM
    b = load_bundle(bundle)
    path = str(b.file(b.target.path))
    source, twin = CausalLM(b.target, path), CausalLM(b.target, path)
    ids = [1] + list(range(3, 60))
    fresh = source.reference_logits(ids)
    source.forward(ids[:30])
    twin.share_cache(source)
    return source, twin, ids, fresh


def test_a_shared_cache_gives_the_sources_bits_and_never_disturbs_them(llama_bundle, pair_bundle):
    """A model on another's KV buffers (share_cache): over the owner's prefix it computes the owner's own bits,
    what it writes past the owner's valid length never changes what the owner computes next, it follows the
    owner's buffers when they grow, and only a cache of the same layout on the same device can be shared."""
    from ortspec.bundle import load_bundle
    from ortspec.engine import CausalLM
    source, twin, ids, fresh = _sharing(llama_bundle)
    twin.follow(30)
    assert twin.tokens == ids[:30]
    assert np.array_equal(twin.forward(ids[30:32]), fresh[30:32])  # over the owner's keys and values
    twin.forward([7, 8, 9])  # written past the owner's valid length (positions 32..34)
    assert np.array_equal(source.forward(ids[30:36]), fresh[30:36])  # the owner's own values, bit for bit
    source.reserve(source.cache.stored + 300)  # the owner's buffers are replaced: the twin follows them
    twin.follow(36)
    assert np.array_equal(twin.forward(ids[36:38]), fresh[36:38])
    with pytest.raises(ValueError, match="not all in a shared cache"):
        twin.follow(source.length + 1)
    other = load_bundle(pair_bundle)
    lm = CausalLM(other.draft, str(other.file(other.draft.path)))
    assert lm.can_share(source) == (other.draft.kv_cache == "static")


def test_sharing_negative_control_a_draft_writing_below_the_owners_length_is_caught(llama_bundle):
    """What makes sharing safe is that the draft writes only from the owner's valid length on: a draft that
    wrote inside the owner's valid prefix would change the owner's next logits, and the comparison sees it."""
    source, twin, ids, fresh = _sharing(llama_bundle)
    twin.follow(20)
    twin.forward([7, 8, 9])  # positions 20..22, inside the owner's 30
    assert not np.array_equal(source.forward(ids[30:32]), fresh[30:32])


def test_a_self_draft_never_reads_the_prompt(llama_bundle, pair_bundle):
    gen = SpeculativeGenerator.load(llama_bundle)
    own = SpeculativeGenerator.load(llama_bundle, draft_kv="own")
    assert gen.drafter.source is gen.target and own.drafter.source is None
    assert SpeculativeGenerator.load(pair_bundle).drafter.source is None  # another model's cache means nothing
    passes = []
    run = gen.drafter.lm._pass
    gen.drafter.lm._pass = lambda ids, *rest: passes.append(len(ids)) or run(ids, *rest)
    ids = [1] + list(range(3, 60))
    want = own.sibling("none").generate(input_ids=ids, max_new_tokens=30, eos_token_id=[], do_sample=False)
    for sampled in (False, True):
        passes.clear()
        res = gen.generate(input_ids=ids, max_new_tokens=30, eos_token_id=[], do_sample=sampled, temperature=0.8,
                           seed=1, num_draft_tokens=3, strict=True)
        assert res.stats.round_gammas[0] == 0  # the first token is the target's prefill alone
        assert passes and max(passes) <= 2  # the last committed token (and a never-fed last draft), no prompt
        if not sampled:
            assert res.token_ids == want.token_ids
        else:  # again, with the prompt cached now: the same draws (the draft's state never depends on the cache)
            again = gen.generate(input_ids=ids, max_new_tokens=30, eos_token_id=[], do_sample=True, temperature=0.8,
                                 seed=1, num_draft_tokens=3)
            assert again.token_ids == res.token_ids and again.stats.round_gammas[0] == 0
    hybrid = gen.sibling("hybrid")
    assert hybrid.drafter.model.source is gen.target
    assert hybrid.generate(input_ids=ids, max_new_tokens=30, eos_token_id=[], do_sample=False,
                           num_draft_tokens=3).token_ids == want.token_ids
    with pytest.raises(ValueError, match="draft_kv"):
        SpeculativeGenerator.load(llama_bundle, draft_kv="target")


def test_common_prefix_finds_the_first_difference_anywhere():
    """Against a plain scan: a difference at every position of lists, tuples and arrays of either length,
    equal sequences, an empty one, and large ids (distinct int objects of equal value compare equal)."""
    from ortspec.drafting import common_prefix
    rng = np.random.default_rng(3)
    base = [int(t) for t in rng.integers(0, 150_000, 300)]

    def scan(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n
    for cut in range(0, 301, 7):
        other = [int(str(t)) for t in base]  # equal values, other objects
        if cut < 300:
            other[cut] += 1
        for a, b in ((base, other), (other[:cut + 5], base), (tuple(base), np.array(other)), (base, [])):
            assert common_prefix(a, b) == scan(list(a), list(b)), cut
    assert common_prefix(base, list(base)) == 300
