"""GGUF quantized weights kept as the file has them: decoders, operators, and a real file end to end."""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from ortspec.export.gguf_weights import LAYOUT, BlockWeight, decode, rotary_row_order  # noqa: E402

HALVES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2],
          "Q6_K": [208]}  # byte offsets of the float16 fields in each block


def random_tensor(qtype: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random GGUF bytes of ``qtype``: every code and packed scale random, the float16 fields finite."""
    rng = np.random.default_rng(seed)
    _, _, nbytes, per = LAYOUT[qtype]
    b = rng.integers(0, 256, (rows, cols // per, nbytes), dtype=np.uint8)
    for at in HALVES[qtype]:
        half = rng.normal(0, 0.02, b.shape[:2]).astype(np.float16)
        b[..., at:at + 2] = half.view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(rows, -1)


@pytest.mark.parametrize("qtype", sorted(LAYOUT))
def test_each_block_type_decodes_to_ggufs_own_dequantization(qtype):
    raw = random_tensor(qtype, 5, 512)
    w = decode(qtype, raw, 512)
    ref = dequantize(raw, getattr(GGMLQuantizationType, qtype)).reshape(5, 512)
    assert np.array_equal(w.dequantize(), ref)  # bit for bit: the same formula on the same numbers
    bits, block = LAYOUT[qtype][:2]
    assert (w.bits, w.block) == (bits, block) and int(w.codes.max()) < 2 ** bits


def test_a_wrong_layout_is_caught():
    """Negative control: swapping the nibble halves of Q4_0 (a plausible layout mistake) must not pass."""
    raw = random_tensor("Q4_0", 4, 256, seed=3)
    w = decode("Q4_0", raw, 256)
    codes = w.codes.reshape(4, -1, 32)
    swapped = BlockWeight(np.concatenate([codes[..., 16:], codes[..., :16]], -1).reshape(4, 256), w.scales,
                          None, 4, 32, "Q4_0")
    ref = dequantize(raw, GGMLQuantizationType.Q4_0).reshape(4, 256)
    assert not np.array_equal(swapped.dequantize(), ref)


def _matmul_nbits(w: BlockWeight, x: np.ndarray, level: int) -> np.ndarray:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    rows, cols = w.shape
    inits = [numpy_helper.from_array(w.packed(), "B"), numpy_helper.from_array(w.scales.reshape(-1), "S")]
    ins = ["A", "B", "S"]
    if w.zero_points() is not None:
        inits.append(numpy_helper.from_array(w.zero_points().reshape(-1), "Z"))
        ins.append("Z")
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=cols, N=rows, bits=w.bits,
                            block_size=w.block, accuracy_level=level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, cols])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"A": x})[0]


@pytest.mark.parametrize("qtype", sorted(LAYOUT))
def test_matmul_nbits_holds_the_decoded_weights(qtype):
    """onnxruntime reads the packed codes, scales and zero points as the decoder means them: x @ W.T with
    x = unit rows returns W's columns (fp32 accumulation, accuracy level 0). Offsets are added by the graph,
    so the operator alone must give scale * (code - zero)."""
    raw = random_tensor(qtype, 48, 256, seed=1)
    w = decode(qtype, raw, 256)
    eye = np.eye(256, dtype=np.float32)
    got = _matmul_nbits(w, eye, level=0).T
    codes = w.codes.astype(np.float32).reshape(48, -1, w.block)
    want = (w.scales[..., None] * (codes - w.zero)).reshape(48, 256)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_rotary_row_order_undoes_llama_cpp_permutation():
    heads, dim = 3, 8
    hf = np.arange(heads * dim)[:, None].repeat(4, 1)
    # llama.cpp's converter interleaves the two rotary halves of each head
    cpp = hf.reshape(heads, 2, dim // 2, 4).swapaxes(1, 2).reshape(heads * dim, 4)
    assert np.array_equal(cpp[rotary_row_order(heads * dim, heads)], hf)


# -- a real file: SmolLM2-135M-Instruct Q4_1 (Q8_0 embedding), end to end ------------------------------------

@pytest.fixture(scope="module")
def smol_gguf_bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from ortspec.export import export_bundle
    from ortspec.export.recipes import resolve_recipe
    source = resolve_recipe("smollm2-135m", progress=lambda m: None)["target"]
    out = tmp_path_factory.mktemp("gguf") / "smol-gguf"
    return export_bundle(target=source, out=out, progress=None), source


@pytest.mark.slow
def test_real_file_every_tensor_decodes_both_ways(smol_gguf_bundle):
    from gguf import GGUFReader
    _, source = smol_gguf_bundle
    seen = {}
    for t in GGUFReader(source).tensors:
        qtype = t.tensor_type.name
        if qtype not in LAYOUT:
            continue
        cols = int(t.shape[0])
        raw = np.asarray(t.data).reshape(-1, np.asarray(t.data).shape[-1])
        ours = decode(qtype, raw, cols).dequantize()
        theirs = dequantize(raw, t.tensor_type).reshape(ours.shape)
        assert np.array_equal(ours, theirs), t.name
        seen[qtype] = seen.get(qtype, 0) + 1
    assert seen == {"Q4_1": 210, "Q8_0": 1}


@pytest.mark.slow
def test_real_file_bundle_is_the_gguf_model(smol_gguf_bundle, smol):
    import json
    from ortspec import SpeculativeGenerator
    from ortspec.quality import compare_models
    bundle, _ = smol_gguf_bundle
    manifest = json.loads((bundle / "ortspec.json").read_text())
    q = manifest["models"]["target"]["quantization"]
    assert q["method"] == "gguf" and q["types"] == {"Q4_1": 210, "Q8_0": 1} and q["layout"] == "compact"
    # the compact layout: each 4-bit matrix with its minimums folded in (one node); the Q8_0 output layer in
    # 8-bit blocks of 64 (576 columns)
    assert q["quantized_nodes"]["MatMulNBits"] == 30 * 4 + 1 and q["quantized_nodes"]["GatherBlockQuantized"] == 1
    size = sum(f.stat().st_size for f in (bundle / "target").iterdir())
    assert size < 150e6  # 4.5-bit body, 8.5-bit embedding: about a quarter of the fp32 graph
    fid = q["fidelity"]  # measured at export against the file's float model (PyTorch)
    assert fid["positions"] == 256 and fid["top1"] > 0.92 and fid["mean_kl"] < 0.008
    from ortspec.inspect import format_report, inspect_bundle
    text = format_report(inspect_bundle(str(bundle)))
    assert "weights: the GGUF file's own, compact layout" in text and "fidelity to the source's float model" in text
    from conftest import REPO
    report = compare_models(str(bundle), str(smol), (REPO / "runtime" / "data" / "quality.txt").read_text(),
                            tokens=200)
    # the same weights as the fp32 export of the file; what differs is activation rounding (accuracy level 4),
    # halved by centered zero points (96.5% / 0.003 here; zero points at 0 gave 92.0% / 0.015)
    assert report["top1_agreement"] > 0.94 and report["mean_kl"] < 0.006
    from ortspec.bundle import load_bundle
    from ortspec.exactness import invariance_check
    from ortspec.engine import CausalLM
    b = load_bundle(bundle)
    lm = CausalLM(b.target, str(b.file(b.target.path)))
    context = SpeculativeGenerator.load(bundle, drafter="none").codec.encode("Write a haiku about caches.")
    inv = invariance_check(lm, context, positions=12, sizes=range(1, 10))
    assert inv["invariant"], inv  # every pass size the runtime uses gives the same bits per position
    gen = SpeculativeGenerator.load(bundle, drafter="prompt_lookup")
    ref = SpeculativeGenerator.load(bundle, drafter="none")
    for prompt in ("The capital of France is", "def fibonacci(n):"):
        a = gen.generate(prompt=prompt, max_new_tokens=24, do_sample=False)
        b = ref.generate(prompt=prompt, max_new_tokens=24, do_sample=False)
        assert a.token_ids == b.token_ids  # speculation over the imported target is exact


@pytest.mark.slow
def test_the_exact_layout_holds_the_files_weights_and_the_compact_one_is_as_faithful(smol_gguf_bundle, smol,
                                                                                    tmp_path):
    """gguf_layout="exact": every weight the file's to float rounding (the minimums through float products, the
    Q8_0 output layer in its own blocks of 32). The compact default re-rounds the 8-bit output layer and the
    minimums to 8-bit grids: against the file's float model (the fp32 export) it is as faithful as the exact
    layout to within a small margin, and its graph is smaller."""
    import json
    import onnx
    from ortspec.export import export_bundle
    from ortspec.quality import compare_models
    from conftest import REPO
    compact, source = smol_gguf_bundle
    exact = export_bundle(target=source, out=tmp_path / "smol-exact", gguf_layout="exact", progress=None)
    q = json.loads((exact / "ortspec.json").read_text())["models"]["target"]["quantization"]
    assert q["layout"] == "exact" and q["quantized_nodes"]["MatMulNBits"] == 30 * 4 + 1
    from ortspec.inspect import format_report, inspect_bundle
    assert "weights: the GGUF file's own, as it has them (exact layout)" in format_report(inspect_bundle(str(exact)))
    graph = onnx.load(str(exact / "target" / "model.onnx"), load_external_data=False)
    head = next(n for n in graph.graph.node if n.name == "logits_node")
    assert {a.name: a.i for a in head.attribute}["block_size"] == 32
    text = (REPO / "runtime" / "data" / "quality.txt").read_text()
    r = {name: compare_models(str(b), str(smol), text, tokens=200) for name, b in (("exact", exact),
                                                                                 ("compact", compact))}
    assert r["compact"]["mean_kl"] < 1.3 * r["exact"]["mean_kl"] + 1e-4, r
    assert r["compact"]["top1_agreement"] >= r["exact"]["top1_agreement"] - 0.02, r
    size = {name: sum(f.stat().st_size for f in (b / "target").iterdir()) for name, b in (("exact", exact),
                                                                                          ("compact", compact))}
    assert size["compact"] < size["exact"], size
    with pytest.raises(ValueError, match="gguf_layout must be"):
        export_bundle(target=source, out=tmp_path / "bad", gguf_layout="compact:48", progress=None)


@pytest.mark.slow
def test_fp32_activations_give_the_files_model_to_float_rounding(smol_gguf_bundle, smol, tmp_path):
    """--activations fp32: the 4-bit matrices (all but the 8-bit output layer here) read float inputs; the model
    then agrees with the file's fp32 export almost everywhere (int8 inputs: ~93% on this text), stays pass-size
    invariant, and speculation over it stays exact."""
    import onnx
    from ortspec import SpeculativeGenerator
    from ortspec.bundle import load_bundle
    from ortspec.exactness import invariance_check
    from ortspec.export import export_bundle
    from ortspec.engine import CausalLM
    from ortspec.quality import compare_models
    from conftest import REPO
    _, source = smol_gguf_bundle
    bundle = export_bundle(target=source, out=tmp_path / "smol-fp32-act", activations="fp32", progress=None)
    graph = onnx.load(str(bundle / "target" / "model.onnx"), load_external_data=False)
    levels = {n.name: next(a.i for a in n.attribute if a.name == "accuracy_level")
              for n in graph.graph.node if n.op_type == "MatMulNBits"}
    assert levels.pop("logits_node") == 4 and set(levels.values()) == {1} and len(levels) == 30 * 4
    from ortspec.inspect import format_report, inspect_bundle
    assert "quantization gguf (MatMulNBits, fp32 activations)" in format_report(inspect_bundle(str(bundle)))
    report = compare_models(str(bundle), str(smol), (REPO / "runtime" / "data" / "quality.txt").read_text(),
                            tokens=200)
    assert report["top1_agreement"] >= 0.98 and report["mean_kl"] < 0.002
    b = load_bundle(bundle)
    lm = CausalLM(b.target, str(b.file(b.target.path)))
    gen = SpeculativeGenerator.load(bundle, drafter="prompt_lookup")
    ref = SpeculativeGenerator.load(bundle, drafter="none")
    inv = invariance_check(lm, ref.codec.encode("Write a haiku about caches."), positions=12, sizes=range(1, 10))
    assert inv["invariant"], inv
    a = gen.generate(prompt="def fibonacci(n):", max_new_tokens=24, do_sample=False)
    assert a.token_ids == ref.generate(prompt="def fibonacci(n):", max_new_tokens=24, do_sample=False).token_ids


def test_fp32_activations_need_a_gguf_file_kept_as_it_is(tmp_path):
    from ortspec.export import export_bundle
    for kwargs in ({"target": "HuggingFaceTB/SmolLM2-135M-Instruct"},
                   {"target": "model.gguf", "dtype": "fp32"},
                   {"target": "model.gguf", "target_quant": "int4"}):
        with pytest.raises(ValueError, match="activations applies to the matrices of a .gguf file"):
            export_bundle(out=tmp_path / "b", activations="fp32", progress=None, **kwargs)
    with pytest.raises(ValueError, match="activations must be"):
        export_bundle(target="model.gguf", out=tmp_path / "b", activations="int4", progress=None)


def test_keeping_a_gguf_files_weights_needs_a_gguf_file(tmp_path):
    from ortspec.export import export_bundle
    cases = [({"target": "HuggingFaceTB/SmolLM2-135M-Instruct", "target_quant": "gguf"}, "is not a .gguf file"),
             ({"target": "t.gguf", "draft": "d/", "draft_quant": "gguf"}, "is not a .gguf file"),
             ({"target": "t.gguf", "draft": "self", "draft_quant": "gguf"}, "quantized copy of the target"),
             ({"target": "t.gguf", "draft": "d.gguf", "draft_quant": "gguf", "draft_vocab": 100}, "pick one"),
             ({"target": "t.gguf", "target_quant": "gguf4"}, "target_quant: unknown quantization 'gguf4'"),
             ({"target": "t.gguf", "target_quant": "int4:48"}, "16, 32, 64, 128 or 256"),
             ({"target": "t.gguf", "draft": "self", "draft_quant": "int8:64"}, "goes with a MatMulNBits method"),
             ({"target": "t.gguf", "gguf_layout": "dense"}, "gguf_layout must be 'compact', 'compact:B'"),
             ({"target": "t.gguf", "gguf_layout": "exact:64"}, "gguf_layout must be")]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            export_bundle(out=tmp_path / "b", progress=None, **kwargs)
    assert not (tmp_path / "b").exists()


@pytest.mark.slow
def test_fp32_target_with_a_draft_kept_as_its_file_has_it(smol_gguf_bundle, tmp_path):
    """--dtype fp32 --draft-quant gguf: the target dequantized to float, the draft the file's own blocks (the
    same file here); speculation over them equals target-only decoding."""
    import json
    from ortspec import SpeculativeGenerator
    from ortspec.export import export_bundle
    _, source = smol_gguf_bundle
    bundle = export_bundle(target=source, draft=source, draft_quant="gguf", dtype="fp32",
                           out=tmp_path / "fp32-gguf-draft", progress=None)
    models = json.loads((bundle / "ortspec.json").read_text())["models"]
    assert models["draft"]["quantization"]["method"] == "gguf"
    assert models["draft"]["quantization"]["types"] == {"Q4_1": 210, "Q8_0": 1}
    assert not models["target"].get("quantization")
    gen = SpeculativeGenerator.load(bundle)
    ref = SpeculativeGenerator.load(bundle, drafter="none")
    for prompt in ("def fibonacci(n):", "The three laws of caching are"):
        a = gen.generate(prompt=prompt, max_new_tokens=24, do_sample=False, num_draft_tokens=4)
        assert a.token_ids == ref.generate(prompt=prompt, max_new_tokens=24, do_sample=False).token_ids
        assert a.stats.acceptance_rate > 0.5


# -- the quality command ------------------------------------------------------------------------------------------

def test_quality_of_a_model_against_itself_and_a_noisier_copy(llama_bundle, tmp_path):
    import json
    import subprocess
    import sys
    from ortspec.quality import compare_models
    text = " ".join(f"w{(i * 7) % 120}" for i in range(90))
    same = compare_models(str(llama_bundle), str(llama_bundle), text, tokens=80)
    assert same["positions"] == 79 and same["top1_agreement"] == 1.0 and same["mean_kl"] == 0.0
    assert same["nll_candidate"] == same["nll_reference"]
    draft = compare_models(str(llama_bundle), str(llama_bundle), text, tokens=80, which="draft")
    assert draft["mean_kl"] == 0.0  # the draft against itself
    path = tmp_path / "t.txt"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "quality", str(llama_bundle), "--reference",
                           str(llama_bundle), "--text", str(path), "--tokens", "80", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["top1_agreement"] == 1.0
    with pytest.raises(ValueError, match="tokens"):
        compare_models(str(llama_bundle), str(llama_bundle), text, tokens=1)
    # the INT4 self-draft of a random model against its own fp32 target: a different model
    own = compare_models(str(llama_bundle), str(llama_bundle), text, tokens=80, which="draft",
                         reference_which="target")
    assert own["candidate"].endswith("draft") and own["reference"].endswith("target")
    assert own["mean_kl"] > 0.01 and own["top1_agreement"] < 1.0


def test_quality_windows_score_second_halves_from_an_empty_cache(llama_bundle, tmp_path):
    """--window W scores as llama-perplexity does: consecutive windows of W tokens, each read from an empty cache,
    positions W // 2 .. W - 2 scored. Checked against a direct computation (one pass per window) of the INT4 draft
    against its fp32 target, a pair that disagrees."""
    import json
    import subprocess
    import sys
    from ortspec.bundle import load_bundle
    from ortspec.engine import CausalLM
    from ortspec.quality import log_softmax, compare_models
    from ortspec.text import TextCodec
    text = " ".join(f"w{(i * 11) % 97}" for i in range(200))
    b = load_bundle(llama_bundle)
    ids = TextCodec(b.tokenizer_file, b.tokenizer_config).encode(text)
    window = 48
    count = len(ids) // window
    assert count >= 3 and len(ids) % window  # a remainder that must be left out
    lms = [CausalLM(spec, str(b.file(spec.path))) for spec in (b.draft, b.target)]
    agree, kl, nll = 0, 0.0, [0.0, 0.0]
    for k in range(count):
        seg = ids[k * window:(k + 1) * window]
        rows = []
        for lm in lms:
            lm.reset()
            rows.append(log_softmax(lm.forward(seg[:-1])[window // 2:]))
        cand, ref = rows
        nxt = np.asarray(seg[window // 2 + 1:])
        agree += int(np.sum(cand.argmax(-1) == ref.argmax(-1)))
        kl += float(np.sum(np.exp(ref) * (ref - cand)))
        for j, lp in enumerate(rows):
            nll[j] -= float(lp[np.arange(len(nxt)), nxt].sum())
    n = count * (window - 1 - window // 2)
    got = compare_models(str(llama_bundle), str(llama_bundle), text, tokens=None, which="draft",
                         reference_which="target", window=window)
    assert (got["positions"], got["windows"], got["window"]) == (n, count, window)
    assert abs(got["top1_agreement"] - agree / n) <= 1 / n  # a near-tie may round either way across pass sizes
    assert got["top1_agreement"] < 1.0 and got["mean_kl"] > 0.01
    np.testing.assert_allclose([got["mean_kl"], got["nll_candidate"], got["nll_reference"]],
                               [kl / n, nll[0] / n, nll[1] / n], rtol=1e-3)
    # the same text without windows scores every position with the whole text as context: other numbers
    whole = compare_models(str(llama_bundle), str(llama_bundle), text, tokens=count * window, which="draft",
                           reference_which="target")
    assert whole["positions"] == count * window - 1 and whole["window"] is None
    # tokens bounds the windows taken; bad windows are refused with what to change
    two = compare_models(str(llama_bundle), str(llama_bundle), text, tokens=2 * window + 5, window=window)
    assert two["windows"] == 2 and two["top1_agreement"] == 1.0 and two["mean_kl"] == 0.0
    for bad, match in ((3, "window must be"), (True, "window must be"), (len(ids) + 1, "fewer than one window")):
        with pytest.raises(ValueError, match=match):
            compare_models(str(llama_bundle), str(llama_bundle), text, tokens=None, window=bad)
    path = tmp_path / "t.txt"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "quality", str(llama_bundle), "--reference",
                           str(llama_bundle), "--model", "draft", "--reference-model", "target", "--text", str(path),
                           "--window", str(window), "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["positions"], report["windows"]) == (n, count)
    assert report["mean_kl"] == pytest.approx(got["mean_kl"], rel=1e-9)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_K", "Q5_1", "Q5_K"])
def test_centered_zero_points_keep_the_weights_and_halve_activation_rounding_error(qtype):
    """Per-block zero points at the codes' mean (offsets absorbing scale * zero) are the file's weights to float
    rounding — as onnxruntime reads them (level 0, unit rows) — and at accuracy level 4 (int8 activations) the
    product's error is well below that of zero point 0, the layout used before (the negative control)."""
    raw = random_tensor(qtype, 64, 512, seed=2)
    w = decode(qtype, raw, 512)
    c = w.centered()
    assert c.zeros is not None and c.centered() is c and int(c.zeros.max()) < 2 ** w.bits
    ref = dequantize(raw, getattr(GGMLQuantizationType, qtype)).reshape(64, 512)
    np.testing.assert_allclose(c.dequantize(), ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())

    def product(v, x, level):
        offsets = v.offsets.astype(np.float64)
        sums = x.reshape(x.shape[0], -1, v.block).sum(-1).astype(np.float64)
        return _matmul_nbits(v, x, level).astype(np.float64) + sums @ offsets.T

    eye = np.eye(512, dtype=np.float32)
    np.testing.assert_allclose(product(c, eye, 0).T, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((16, 512)) * np.exp(rng.standard_normal(512))).astype(np.float32)
    exact = x.astype(np.float64) @ ref.astype(np.float64).T
    err = {name: np.sqrt(np.mean((product(v, x, 4) - exact) ** 2)) for name, v in (("zero", w), ("centered", c))}
    assert err["centered"] < 0.7 * err["zero"], err


# -- the compact layout ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", ["Q6_K", "Q8_0", "Q5_0", "Q5_K"])
def test_8bit_types_re_rounded_to_longer_blocks_move_each_weight_by_at_most_half_a_step(qtype):
    """requantize8: each weight of the file lands on the nearest point of its block's 8-bit grid (at most half a
    step away), onnxruntime reads the codes as meant (level 0, unit rows), and the change is small against the
    weights: Q6_K's 6-bit grid is four times coarser than the 8-bit one."""
    from ortspec.export.gguf_weights import requantize8
    raw = random_tensor(qtype, 32, 512, seed=4)
    w = decode(qtype, raw, 512)
    exact = w.dequantize()
    for block in (64, 128):
        r = requantize8(w, block)
        assert (r.bits, r.block, r.offsets) == (8, block, None) and r.qtype == f"{qtype}~8:{block}"
        got = r.dequantize()
        step = np.repeat(r.scales, block, axis=1)
        assert np.all(np.abs(got - exact) <= step * (0.5 + 1e-5) + 1e-12)
        assert np.sum((got - exact) ** 2) < 1e-3 * np.sum(exact.astype(np.float64) ** 2)
        onnx_sees = _matmul_nbits(r, np.eye(512, dtype=np.float32), level=0).T
        np.testing.assert_allclose(onnx_sees, got, rtol=1e-6, atol=1e-6 * np.abs(got).max())
    # negative control: zero points off by one (a plausible slip) break the half-step bound
    slipped = BlockWeight(r.codes, r.scales, None, 8, r.block, r.qtype, (r.zeros.astype(np.int16) + 1).clip(0, 255)
                          .astype(np.uint8))
    assert not np.all(np.abs(slipped.dequantize() - exact) <= step * (0.5 + 1e-5) + 1e-12)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_K", "Q5_K"])
def test_minimums_folded_into_one_product_over_the_input_and_its_block_sums(qtype):
    """folded: each block's zero point is its minimum's nearest whole code and the remainder is the weight of the
    block sums, appended to the same matrix: with two parts, [x, sums padded to whole blocks, sums] (K not a
    whole number of blocks: onnxruntime pads the last). MatMulNBits gives x @ W.T with each remainder within half
    a step of the second part's grid; one part leaves it within half a step of its own, coarser grid; a negative
    control that drops the remainders (zero points rounded, nothing added) is far off."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from ortspec.export.gguf_weights import folded, folded_width
    raw = random_tensor(qtype, 24, 1536, seed=6)
    w = decode(qtype, raw, 1536)
    exact = w.dequantize().astype(np.float64)
    blocks = 1536 // w.block
    padded = -(-blocks // w.block) * w.block
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 1536)).astype(np.float32)
    sums = x.reshape(5, blocks, w.block).sum(-1)
    want = x.astype(np.float64) @ exact.T

    def run(f, joined):
        k = joined.shape[1]
        inits = [numpy_helper.from_array(f.packed(), "B"), numpy_helper.from_array(f.scales.reshape(-1), "S"),
                 numpy_helper.from_array(f.zero_points().reshape(-1), "Z")]
        node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=k, N=24,
                                bits=w.bits, block_size=w.block, accuracy_level=0)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [None, k])],
                                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"A": joined})[0].astype(np.float64)

    err = {}
    for parts in (1, 2):
        f = folded(w, parts)
        k = folded_width(1536, w.block, parts)
        assert f.offsets is None and f.bits == w.bits and f.shape[1] == 1536 + parts * padded and k == \
            1536 + (parts - 1) * padded + blocks
        joined = np.concatenate([x] + [np.pad(sums, ((0, 0), (0, padded - blocks)))] * (parts - 1) + [sums], axis=1)
        got = run(f, joined)
        step = np.repeat(f.scales[:, -padded // w.block:], w.block, axis=1)[:, :blocks]  # the last part's grid
        bound = np.abs(sums).astype(np.float64) @ (0.5 * step.T) + 1e-4 * np.abs(want).max()
        assert np.all(np.abs(got - want) <= bound), parts
        err[parts] = np.abs(got - want).max()
    assert err[2] < 0.25 * err[1], err  # the second part refines the first
    dropped = x.astype(np.float64) @ (folded(w, 1).dequantize()[:, :1536].astype(np.float64)).T
    assert np.abs(dropped - want).max() > 10 * err[1]


def test_a_layout_with_long_blocks_declares_them_so_passes_are_tiled_in_pairs(monkeypatch, tmp_path):
    """onnxruntime computes rows in pairs where a MatMulNBits has blocks of 64 or more, so the last row of an
    odd pass takes another path: a compact layout whose Q6_K matrices went to blocks of 128 must say so in the
    manifest (block_size), which gives its target a row tile of 2 (bitwise passes of even size); the exact
    layout of the same file (blocks of 16 and 32) keeps the tile of 32. Q4_K/Q6_K weights from random bytes,
    the graph builder stubbed out."""
    from types import SimpleNamespace
    from ortspec.bundle import ModelSpec
    from ortspec.export import fused, gguf_graph, gguf_weights, quantize
    blocks = {"q": decode("Q4_K", random_tensor("Q4_K", 8, 256, seed=7), 256),
              "v": decode("Q6_K", random_tensor("Q6_K", 8, 256, seed=8), 256)}
    monkeypatch.setattr(gguf_weights, "read_block_weights", lambda *a, **k: (dict(blocks), {"Q4_K": 1, "Q6_K": 1}))
    seen = {}
    monkeypatch.setattr(fused, "build_fused", lambda model, out, dtype, blocks, **kw: seen.update(blocks) or out)
    monkeypatch.setattr(quantize, "count_quantized", lambda path: {})
    src = SimpleNamespace(model=SimpleNamespace(state_dict=dict, config=None), info={"ref": "f.gguf"})
    tiles = {}
    for layout in ("compact", "exact"):
        entry = gguf_graph.gguf_graph(src, tmp_path, lambda m: None, "int8", layout)
        tiles[layout] = ModelSpec.kernel_tile.fget(SimpleNamespace(quantization=entry))
        assert entry["block_size"] == max(w.block for w in seen.values())
    assert seen["v"].block == 16 and tiles == {"compact": 2, "exact": 32}
