"""Bitwise exactness: a position's logits do not depend on how the runtime passes it to the target.

Checked bit for bit (np.array_equal, never a tolerance) for every target kind the exporter makes, on tiny
random models of two families. Fused targets are exported row-invariant (export.rows): every pass size, one
position included, gives the same bits. Each check has a negative control: the same target exported without
that rewrite (``tiny.kernel_copy``), whose one-position passes take other kernels, is caught.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ortspec import SpeculativeGenerator
from ortspec.bundle import load_bundle
from ortspec.exactness import greedy_check, invariance_check
from ortspec.engine import CausalLM, PassOptions, pass_bounds

BITWISE = PassOptions(bitwise=True)

CONTEXT = [1, 17, 5, 99, 42, 8, 63, 120, 4, 77]
SIZES = range(1, 18)  # every verify pass the runtime makes: 1 (target only) .. 17 (16 drafts + 1)


def target_lm(bundle_dir, role="target"):
    b = load_bundle(bundle_dir)
    spec = getattr(b, role)
    return CausalLM(spec, str(b.file(spec.path)))




@pytest.fixture(scope="module")
def kinds(workdir, hf_models):
    """Targets of every kind: fp32 (fused, optimum), fp16 fused, INT4 and 8-bit-weight, for llama and qwen2."""
    from ortspec.export import export_bundle
    out = {}
    for fam in ("llama", "qwen2"):
        src = str(hf_models[fam])
        out[f"{fam}-fp32"] = export_bundle(target=src, out=workdir / f"bw_{fam}_fp32", progress=None)
        out[f"{fam}-fp16"] = export_bundle(target=src, out=workdir / f"bw_{fam}_fp16", dtype="fp16", progress=None)
        out[f"{fam}-int4"] = export_bundle(target=src, out=workdir / f"bw_{fam}_int4", target_quant="int4",
                                           draft="self", draft_quant="int4", progress=None)
        out[f"{fam}-int8w"] = export_bundle(target=src, out=workdir / f"bw_{fam}_int8w", target_quant="int8w",
                                            progress=None)
    out["llama-fp32-optimum"] = export_bundle(target=str(hf_models["llama"]), out=workdir / "bw_llama_optimum",
                                              graph="optimum", progress=None)
    out["qwen2-int4a-h8"] = export_bundle(target=str(hf_models["qwen2"]), out=workdir / "bw_qwen2_int4a_h8",
                                          target_quant="int4a-h8", progress=None)
    from tiny import kernel_copy, make_model
    for name in ("llama-fp32", "llama-int4", "qwen2-int8w"):  # the negative controls: the builder's own graphs
        out[name + "-kernel"] = kernel_copy(out[name], workdir / f"bw_{name}_kernel")
    for fam in ("qwen3", "phi3", "gemma2", "gemma3"):  # windows, soft caps, q/k norms: fused graphs too
        src = make_model(fam, workdir / f"bw_src_{fam}", vocab=128, seed=0)
        out[f"{fam}-fp32"] = export_bundle(target=str(src), out=workdir / f"bw_{fam}_fp32", progress=None)
    return out


KINDS = ["llama-fp32", "llama-fp16", "llama-int4", "llama-int8w", "qwen2-fp32", "qwen2-fp16", "qwen2-int4",
         "qwen2-int8w", "llama-fp32-optimum", "qwen2-int4a-h8", "qwen3-fp32", "phi3-fp32", "gemma2-fp32",
         "gemma3-fp32"]


def test_a_block_size_is_recorded_and_a_long_block_target_runs_passes_of_any_size(workdir, hf_models):
    """int4a:128 gives the draft's 4-bit matrices blocks of 128 weights (recorded in the manifest). onnxruntime
    computes rows of such matrices in pairs, so the last row of an odd pass takes another path: an ordinary graph
    in such blocks has a kernel tile of 2 (the negative control, with the tile of 32 that blocks of 32 have,
    sees it; bitwise passes of an even size give every position the same bits). A target in blocks of 64 is
    made row-invariant: those matrices always see an even count, and every pass size, odd or one, gives the
    same bits with no pass padded (row tile 1)."""
    import onnx
    from ortspec.export import export_bundle
    src = str(hf_models["llama"])
    b = load_bundle(export_bundle(target=src, draft="self", draft_quant="int4a:128", out=workdir / "bw_d128",
                                  progress=None))
    graph = onnx.load(str(b.file(b.draft.path)), load_external_data=False).graph
    blocks = {a.i for n in graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")
              for a in n.attribute if a.name == "block_size"}
    assert blocks == {128} and b.draft.quantization["block_size"] == 128
    assert b.draft.row_tile == 2 and b.draft.rows is None and b.target.row_tile == 1 and b.target.rows == "invariant"

    lm = target_lm(b.root, "draft")  # (an ordinary graph: drafts need not be bitwise)
    lm.row_tile = 32  # the rule of blocks of 32: odd passes of 3 or more keep their lone last row
    report = invariance_check(lm, CONTEXT, positions=20, sizes=[2, 3, 4, 5])
    assert not report["invariant"]
    assert report["sizes"][3]["equal_rows"] < 20 and report["sizes"][2]["equal_rows"] == 20
    lm.row_tile, lm.CHUNK = 2, 32
    assert invariance_check(lm, CONTEXT, positions=20, sizes=[2, 3, 4, 5])["invariant"]
    ids = [int(t) for t in np.random.default_rng(5).integers(3, 120, 151)]
    whole = lm.prefill(ids, options=BITWISE)  # an odd feed longer than a pass: one throwaway position makes
    lm.CHUNK = 128                            # every pass even
    assert np.array_equal(lm.prefill(ids, options=BITWISE), whole) and lm.length == 151
    assert np.array_equal(lm.prefill(ids[:77], keep=3, options=BITWISE), whole[74:77])

    t64 = load_bundle(export_bundle(target=src, target_quant="int4:64", out=workdir / "bw_t64", progress=None))
    assert t64.target.quantization["block_size"] == 64 and t64.target.kernel_tile == 2
    lm = target_lm(t64.root)
    assert lm.row_tile == 1  # (the probe at load agreed)
    report = invariance_check(lm, CONTEXT, positions=20, sizes=SIZES, bitwise=False)
    assert report["invariant"], report


@pytest.mark.parametrize("kind", KINDS)
def test_every_pass_size_gives_the_same_bits(kinds, kind):
    report = invariance_check(target_lm(kinds[kind]), CONTEXT, positions=20, sizes=SIZES)
    assert report["invariant"], report
    assert all(v["equal_rows"] == 20 and v["max_abs_diff"] == 0.0 for v in report["sizes"].values())


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "llama-fp32-optimum"])
def test_a_row_invariant_target_needs_no_padded_pass(kinds, kind):
    """A fused target is exported row-invariant: one-position passes, run as they are (not bitwise: nothing
    padded), give the bits of a pass of many, and the tile is 1, so bitwise decoding pads nothing either."""
    lm = target_lm(kinds[kind])
    assert lm.spec.rows == "invariant" and lm.row_tile == 1
    report = invariance_check(lm, CONTEXT, positions=20, sizes=[1, 2, 3, 5], bitwise=False)
    assert report["invariant"], report


@pytest.mark.parametrize("kind", ["llama-fp32-kernel", "llama-int4-kernel", "qwen2-int8w-kernel",
                                  "llama-fp32-optimum"])
def test_negative_control_one_position_passes_are_caught(kinds, kind):
    """Left as its builder wrote it (or an optimum graph, never rewritten), a target's one-position pass takes
    other kernels: the same check must see it, and bitwise passes (a lone row run with the token before it)
    avoid it."""
    lm = target_lm(kinds[kind])
    assert lm.spec.rows is None and lm.row_tile > 1
    report = invariance_check(lm, CONTEXT, positions=20, sizes=[1, 2, 4], bitwise=False)
    assert not report["invariant"]
    assert report["sizes"][1]["equal_rows"] < 20 and report["sizes"][2]["equal_rows"] == 20
    assert invariance_check(lm, CONTEXT, positions=20, sizes=[1, 2, 4])["invariant"]


def test_the_probe_at_load_falls_back_where_rows_disagree(kinds):
    """A graph said to be row-invariant whose kernels still give a lone row other bits (here: an ordinary graph
    whose manifest says "invariant"): the probe at load sees it and bitwise passes avoid lone rows again."""
    b = load_bundle(kinds["llama-int4-kernel"])
    spec = dataclasses.replace(b.target, rows="invariant")
    lm = CausalLM(spec, str(b.file(spec.path)))
    assert not lm.rows_agree() and lm.row_tile == spec.kernel_tile == 32 and lm.length == 0
    assert invariance_check(lm, CONTEXT, positions=20, sizes=[1, 2, 3])["invariant"]
    good = target_lm(kinds["llama-int4"])
    assert good.rows_agree() and good.row_tile == 1


def test_long_feeds_in_chunks_give_the_same_bits(kinds):
    lm = target_lm(kinds["llama-int4"])
    ids = [int(t) for t in np.random.default_rng(3).integers(3, 120, 150)]
    whole = lm.prefill(ids, options=BITWISE)
    lm.CHUNK = 32  # passes of 32, 32, 32, 31 (not 32 + 1: the short tail borrows one), 23
    assert pass_bounds(len(ids), 32, lm.ROW_TILE) == [0, 32, 64, 96, 128, 150]
    seen = []
    lm.progress = lambda done, total: seen.append((done, total))
    assert np.array_equal(lm.prefill(ids, options=BITWISE), whole)
    assert seen == [(32, 150), (64, 150), (96, 150), (128, 150), (150, 150)]
    lm.progress = None
    assert np.array_equal(lm.prefill(ids[:129], keep=3, options=BITWISE), whole[126:129])
    assert pass_bounds(129, 32, 32) == [0, 32, 64, 96, 127, 129] and pass_bounds(129, 32) == [0, 32, 64, 96, 128, 129]


def test_logits_only_where_used(kinds):
    """The output layer runs on the kept rows only; rows for a round live in leased slots that stay few and
    bounded, and what a caller holds is never overwritten."""
    lm = target_lm(kinds["llama-fp32"])
    ids = [int(t) for t in np.random.default_rng(4).integers(3, 120, 200)]
    full = lm.prefill(ids)
    assert np.array_equal(lm.prefill(ids, keep=2), full[-2:])
    held = [lm.prefill(ids[:n], keep=2) for n in (30, 90, 170, 40, 60)]  # callers holding results: their own
    for n in range(20, 200, 7):  # prompts of many lengths, a round each: one slot serves them all
        lm.new_round()
        lm.reset()
        lm.forward(ids[:n], keep=1, reuse=True)
        assert lm.graph._slots.leased == 1  # (the passes run for their keys and values alone gave theirs back)
    for n, rows in zip((30, 90, 170, 40, 60), held):
        assert np.array_equal(rows, full[n - 2:n])


def test_passes_reuse_their_bound_buffers(kinds):
    """Decoding passes, a round each, write into the host buffer (and small inputs) bound before: no binding per
    pass, and every pass's rows are still those of a fresh prefill. Within a round every pass takes a buffer of
    its own, so rows read later in the round are never overwritten."""
    lm = target_lm(kinds["llama-fp32"])
    ids = [int(t) for t in np.random.default_rng(5).integers(3, 120, 40)]
    full = lm.prefill(ids)
    lm.prefill(ids[:20], keep=1)
    binding, bound = lm.cache.binding.io, []
    real = binding.bind_output
    # (the logits' binding: the graph's top entries are bound beside it whenever it is)
    binding.bind_output = lambda *a, **k: (bound.append(a[4]) if a[0] == lm.spec.logits else None, real(*a, **k))
    real_value = binding.bind_ortvalue_output  # (a kept buffer binds a value made over it once)
    binding.bind_ortvalue_output = lambda name, value: (
        bound.append(value.data_ptr()) if name == lm.spec.logits else None, real_value(name, value))
    for n in range(20, 39):
        lm.new_round()
        rows = lm.forward(ids[n:n + 2], keep=1, reuse=True)  # two positions each (bitwise passes)
        assert np.array_equal(rows[0], full[n + 1]), n
        lm.rollback(n + 1)
    assert lm.cache.binding.io is binding and len(bound) <= 1, bound
    lm.rollback(30)
    lm.new_round()
    held = lm.forward(ids[30:32], keep=1, reuse=True)  # rows read later in the round: the next pass takes another
    lm.rollback(31)
    again = lm.forward(ids[31:33], keep=1, reuse=True)
    assert held.base is not again.base
    assert np.array_equal(held[0], full[31])
    assert np.array_equal(again[0], full[32])
    lm.rollback(32)
    lm.release_rows()  # ``again`` is not read any more: the next pass writes its buffer, still bound
    bound[:] = []
    third = lm.forward(ids[32:34], keep=1, reuse=True)
    assert third.base is again.base and not bound and np.array_equal(third[0], full[33])
    # where binding copies host inputs (a GPU provider), every pass binds them again: the branch, run on CPU
    del held, again, third
    lm.graph.device, bound[:] = "cuda", []
    for n in range(20, 24):
        lm.new_round()
        lm.rollback(n)
        assert np.array_equal(lm.forward(ids[n:n + 2], keep=1, reuse=True)[0], full[n + 1]), n
    lm.graph.device = "cpu"
    assert len(bound) == 4


@pytest.mark.parametrize("kind", ["llama-int4", "qwen2-int8w", "llama-fp16"])
def test_target_only_equals_speculative_on_quantized_targets(kinds, kind):
    prompts = [CONTEXT, [1, 8, 8, 8, 8, 8, 9, 8, 8], [1, 120, 3, 77, 64, 12, 33, 7, 90, 101, 4]]
    drafters = ("model", "prompt_lookup") if kind == "llama-int4" else ("prompt_lookup",)
    report = greedy_check(str(kinds[kind]), prompts, gammas=[1, 2, 4, "auto"], drafters=drafters, max_new_tokens=40)
    assert report.runs == 3 * 4 * len(drafters)
    assert report.mismatches == 0 and not report.near_ties_allowed, report.to_dict()


@pytest.mark.parametrize("drafter", ["none", "model", "prompt_lookup"])
def test_the_same_call_twice_gives_the_same_tokens(kinds, drafter):
    """The second call reuses the cached prompt and feeds only its last token: the same bits all the same."""
    gen = SpeculativeGenerator.load(kinds["llama-int4"], drafter=drafter)
    for p in ([1, 17, 5, 99], [1, 9, 9, 31, 2, 64, 5]):
        first = gen.generate(input_ids=p, max_new_tokens=40, strict=True).token_ids
        assert gen.generate(input_ids=p, max_new_tokens=40, strict=True).token_ids == first
        continued = gen.generate(input_ids=p + first[:7], max_new_tokens=20).token_ids  # reuses generated K/V
        fresh = SpeculativeGenerator.load(kinds["llama-int4"], drafter=drafter)
        assert fresh.generate(input_ids=p + first[:7], max_new_tokens=20).token_ids == continued


def test_strict_is_bitwise(kinds):
    """strict=True compares each committed row with a fresh prefill bit for bit, and catches one-position passes
    (on a target not made row-invariant, where they take other kernels)."""
    from ortspec.generator import InvariantError
    SpeculativeGenerator.load(kinds["llama-int4"], drafter="none").generate(input_ids=CONTEXT, max_new_tokens=30,
                                                                             strict=True)
    gen = SpeculativeGenerator.load(kinds["llama-int4-kernel"], drafter="none")
    gen.generate(input_ids=CONTEXT, max_new_tokens=30, strict=True)
    lm, real = gen.target, gen.target.forward_rows

    def one_row_passes(ids, keep=None, options=None):
        return real(ids, keep, dataclasses.replace(options, bitwise=False))
    lm.forward_rows = one_row_passes  # (a decoding round's passes)
    with pytest.raises(InvariantError, match="bitwise"):
        gen.generate(input_ids=CONTEXT, max_new_tokens=30, strict=True)


def test_int8_dynamic_targets_are_refused(workdir, hf_models):
    from ortspec.export import export_bundle
    with pytest.raises(ValueError, match="int8w"):
        export_bundle(target=str(hf_models["llama"]), out=workdir / "bw_int8", target_quant="int8", progress=None)
    assert not (workdir / "bw_int8").exists()


def test_upgrade_makes_an_older_target_row_invariant(kinds, tmp_path):
    """`ortspec export --upgrade`: a target exported before the rewrite gets it (weights untouched, its stored
    pass costs dropped: timed on the old graph), then passes of every size give the same bits, and greedy
    decoding gives the tokens it gave before."""
    import shutil
    from ortspec.export import api
    old = tmp_path / "old"
    shutil.copytree(kinds["llama-int4-kernel"], old)
    (old / "ortspec-profile.json").write_text("{}")
    prompts = [CONTEXT, [1, 8, 8, 8, 8, 8, 9, 8, 8]]
    before = [SpeculativeGenerator.load(old, drafter="prompt_lookup").generate(input_ids=p, max_new_tokens=30)
              .token_ids for p in prompts]
    weights = (old / "target" / "model.onnx.data").stat().st_mtime_ns
    assert api.upgrade_bundle(old, progress=None) == ["target"]
    b = load_bundle(old)
    assert b.target.rows == "invariant" and (old / "target" / "model.onnx.data").stat().st_mtime_ns == weights
    assert not (old / "ortspec-profile.json").exists() and api.upgrade_bundle(old, progress=None) == []
    lm = target_lm(old)
    assert lm.row_tile == 1
    assert invariance_check(lm, CONTEXT, positions=20, sizes=[1, 2, 3, 7], bitwise=False)["invariant"]
    gen = SpeculativeGenerator.load(old, drafter="prompt_lookup")
    assert [gen.generate(input_ids=p, max_new_tokens=30).token_ids for p in prompts] == before


def test_a_row_invariant_target_fills_its_context_to_the_last_position(workdir, hf_models):
    """The attention's extra row writes one slot past a pass: the KV buffers keep that slot, and the model one
    position fewer (its rotary tables end at its last). A prompt up to that capacity decodes to the end, bit for
    bit as a fresh prefill, and one position more is refused clearly."""
    from ortspec.errors import CacheOverflowError
    lm = target_lm(workdir / "bw_llama_int4")
    assert lm.capacity == lm.spec.max_positions - 1
    ids = [int(t) for t in np.random.default_rng(9).integers(3, 120, lm.capacity)]
    whole = lm.prefill(ids)
    lm.rollback(lm.capacity - 5)
    for at in range(lm.capacity - 5, lm.capacity):
        assert np.array_equal(lm.forward(ids[at:at + 1])[0], whole[at])
    with pytest.raises(CacheOverflowError, match="exceed"):
        lm.forward([5])


def _rows_seen(rows) -> tuple:
    """What the verification rules can read of a pass's rows: the whole rows, and (where the graph's TopK brought
    them) each row's top entries and normalizer."""
    if isinstance(rows, np.ndarray):
        return (rows.copy(),)
    ids, values, bound = rows.top(4)
    return rows.numpy().copy(), ids.copy(), values.copy(), bound.copy(), [rows.row_norm(i) for i in range(len(rows))]


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x == y if isinstance(x, list) else np.array_equal(x, y) for x, y in zip(a, b))


BATCH_SIZES = ([1, 2, 3, 5], [1, 1, 1, 1], [4, 1], [2], [7, 3, 1], [2, 40, 1, 9])
BATCH_OPTIONS = [PassOptions(True, 0, 0.0), PassOptions(True, 6, 1 / 0.7), PassOptions(False, 12, 1.0),
                 PassOptions(True, 6, 2.0)]


def batched_and_alone(lm: CausalLM, swap: bool = False, options: list = BATCH_OPTIONS) -> list[bool]:
    """For each of BATCH_SIZES' passes (one per request, after contexts of different lengths; every other request
    reads its last row only): whether a request's rows from one batched pass of four slots equal, bit for bit, those of its own ``forward_rows`` (whole rows,
    top entries, normalizers), with the same cache afterwards (its tokens and the next pass's rows). ``swap``:
    the negative control, a batch that hands two requests each other's feed."""
    from ortspec.engine.batch import BatchedPasses
    from ortspec.engine import PassNeed
    batch = BatchedPasses(lm, 4)
    verdicts = []
    for trial, sizes in enumerate(BATCH_SIZES):
        contexts = [[(11 + 37 * i + 7 * s + trial) % 120 for i in range(9 + 5 * s)] for s in range(len(sizes))]
        feeds = [[(5 + 3 * j + s) % 120 for j in range(n)] for s, n in enumerate(sizes)]
        alone, together = [lm.twin() for _ in sizes], [lm.twin() for _ in sizes]
        for s, ctx in enumerate(contexts):
            alone[s].prefill(ctx)
            together[s].prefill(ctx)
        keeps = [len(f) if s % 2 == 0 else 1 for s, f in enumerate(feeds)]  # (a prompt's rest keeps its last row)
        want = [_rows_seen(a.forward_rows(f, keep=keeps[s], options=options[s]))
                for s, (a, f) in enumerate(zip(alone, feeds))]
        jobs = [PassNeed(t, f, keeps[s], options[s]) for s, (t, f) in enumerate(zip(together, feeds))]
        if swap and len(jobs) > 1:
            (jobs[0].ids, jobs[0].keep), (jobs[1].ids, jobs[1].keep) = (jobs[1].ids, jobs[1].keep), \
                (jobs[0].ids, jobs[0].keep)
        got = [_rows_seen(r) for r in batch.run(jobs)]
        for s in range(len(sizes)):
            ok = _same(want[s], got[s]) and alone[s].tokens == together[s].tokens and \
                alone[s].canonical_length == together[s].canonical_length
            nxt = [7, 9, 11]  # the keys and values the batched pass wrote: the next pass reads them
            ok = ok and np.array_equal(alone[s].forward(nxt), together[s].forward(nxt))
            verdicts.append(ok)
    assert batch.passes == len(BATCH_SIZES)
    return verdicts


@pytest.mark.parametrize("kind", ["llama-fp32", "qwen2-int4", "qwen2-fp16", "gemma2-fp32", "llama-int4-kernel"])
def test_a_batched_pass_gives_each_request_its_own_rows(kinds, kind):
    """Several requests' passes as one (engine.batch: every slot's rows side by side, each slot's attention over
    its own cache): each request's rows, top entries and normalizers carry the bits its own pass gives them, for
    passes of one to seven positions, greedy and sampling options mixed, and its cache holds what its own pass
    would have written — on row-invariant targets and on one left as its builder wrote it (its lone rows
    re-fed as bitwise passes feed them; the batched graph is made row-invariant: there only bitwise requests are
    promised their bits, a lone row of another request's own pass takes the single-row kernels)."""
    options = [dataclasses.replace(o, bitwise=True) for o in BATCH_OPTIONS] if kind.endswith("-kernel") \
        else BATCH_OPTIONS
    assert all(batched_and_alone(target_lm(kinds[kind]), options=options))


def test_negative_control_a_batch_that_mixes_up_requests_is_caught(kinds):
    verdicts = batched_and_alone(target_lm(kinds["llama-fp32"]), swap=True)
    assert not all(verdicts) and sum(verdicts) >= len(verdicts) - 2 * (len(BATCH_SIZES) - 1)
