"""Logits rows kept on the device (logits="device"): the host reads each row's largest entries and a bound on
the rest, and must reach the same bits as reading the whole row. On the CPU provider the same code runs with
host memory as the device, so these tests cover the CUDA path's logic."""
from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest

from ortspec import SpeculativeGenerator
from ortspec.config import SamplingConfig
from ortspec.sampling import LogitsPipeline
from ortspec.sampling.processors import penalize
from ortspec.engine import DeviceRows, topk_graph
from ortspec.engine.rows import Columns, RowCounts, RowReading

SETTINGS = {
    "greedy": dict(do_sample=False),
    "greedy penalty": dict(do_sample=False, repetition_penalty=1.3),
    "greedy banned": dict(do_sample=False, bad_words_ids=[[5], [7, 9]]),
    "qwen defaults": dict(do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
    "top-k 5 hot": dict(do_sample=True, temperature=1.5, top_k=5),
    "top-k strong penalty": dict(do_sample=True, top_k=10, repetition_penalty=3.0, bad_words_ids=[[4], [6, 8]]),
    "temperature only": dict(do_sample=True, temperature=0.8, top_k=0),
    "top-p only": dict(do_sample=True, top_p=0.9, top_k=0),
    "penalty below 1": dict(do_sample=True, top_k=10, repetition_penalty=0.8),
}
READS_TOP = {"greedy", "greedy penalty", "greedy banned", "qwen defaults", "top-k 5 hot", "top-k strong penalty"}


def _ids(n: int, seed: int, vocab: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1] + [int(t) for t in rng.integers(3, min(vocab, 60), n)]


def _run(gen, setting, prompts, **kw):
    out = []
    for j, ids in enumerate(prompts):
        res = gen.generate(input_ids=ids, max_new_tokens=24, num_draft_tokens=3, seed=100 + j, eos_token_id=[],
                           **SETTINGS[setting], **kw)
        out.append((res.token_ids, res.stats.accepted, res.stats.drafted))
    return out


@pytest.fixture(scope="module")
def generators(pair_bundle):
    return (SpeculativeGenerator.load(pair_bundle, logits="host"),
            SpeculativeGenerator.load(pair_bundle, logits="device"))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_device_rows_give_the_same_tokens(generators, setting):
    host, device = generators
    assert not host.target.logits_on_device and device.target.logits_on_device
    prompts = [_ids(6 + 3 * j, j, 128) for j in range(4)]
    device.target.rows_read = device.target.rows_copied = 0
    assert _run(device, setting, prompts) == _run(host, setting, prompts)
    lm = device.target
    if setting in READS_TOP:  # decided from the top entries; a row is copied only when they do not settle it
        assert lm.rows_read > 0 and lm.rows_copied <= lm.rows_read // 4
    else:
        assert lm.rows_copied > 0


def test_subset_draft_maps_columns_to_ids(small_subset_bundle):
    host = SpeculativeGenerator.load(small_subset_bundle, logits="host")
    device = SpeculativeGenerator.load(small_subset_bundle, logits="device")
    prompts = [_ids(5, j, 16) for j in range(3)]
    for setting in ("greedy", "qwen defaults", "top-k 5 hot"):
        assert _run(device, setting, prompts) == _run(host, setting, prompts), setting


def test_wrong_rule_is_caught(generators, monkeypatch):
    """Negative control: trusting the top entries without the bound check (and reading no extra entries)
    picks wrong top-k sets once the penalty pushes entries down, and the comparison above notices."""
    host, device = generators
    prompts = [_ids(6 + 3 * j, j, 128) for j in range(4)]

    def trusting(self, drow, k, base, new, dtype=np.float32):
        ids, vals, _ = drow.top(k)
        vals = vals.astype(dtype)
        hit = np.isin(ids, self.processors.seen_tokens(base, new))
        vals[hit] = penalize(vals[hit], self.config.repetition_penalty)
        kth = np.partition(vals, ids.size - k)[ids.size - k]
        return ids[vals >= kth], vals[vals >= kth], kth

    monkeypatch.setattr(LogitsPipeline, "_device_top", trusting)
    assert _run(device, "top-k strong penalty", prompts) != _run(host, "top-k strong penalty", prompts)


def _reading(width: int) -> RowReading:
    """What DeviceRows read of a model: identity columns and a TopK graph on the device."""
    session = ort.InferenceSession(topk_graph(1))

    def device_top(value, k):
        b = session.io_binding()
        b.bind_ortvalue_input("logits", value)
        b.bind_cpu_input("k", np.array([k], dtype=np.int64))
        b.bind_output("values", "cpu")
        b.bind_output("indices", "cpu")
        session.run_with_iobinding(b)
        return tuple(v.numpy()[0] for v in b.get_outputs())
    return RowReading(Columns(None, width), width, width, None, device_top, RowCounts())


@pytest.mark.parametrize("config", [
    SamplingConfig(do_sample=True, temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05),
    SamplingConfig(do_sample=True, top_k=50),
    SamplingConfig(do_sample=True, top_k=3, repetition_penalty=2.0, bad_words_ids=((11,), (3, 4))),
    SamplingConfig(do_sample=True, top_k=1),
], ids=["qwen", "top-k 50", "penalty and bans", "top-k 1"])
def test_device_row_distributions_equal_the_host_rows(config):
    """Rows with planted ties (at the maximum, at the k-th entry, across the bound) and many penalized
    entries (from the context and from the new tokens): the distribution from a PassRow equals the one from
    the full host row, bit for bit."""
    rng = np.random.default_rng(7)
    width, vocab = 3000, 2990  # the graph is wider than the vocabulary, as padded real models are
    rows = rng.normal(0, 2, (6, width)).astype(np.float32)
    rows[1, [10, 500, 2000]] = rows[1].max() + 1          # ties at the maximum
    rows[2, rng.choice(width, 40, replace=False)] = 3.0   # a wide tie around the k-th entry
    rows[3, :] = np.round(rows[3])                        # many ties everywhere
    rows[4, 2995] = 50.0                                  # the largest entry is padding, outside the vocabulary
    base = [int(t) for t in np.argsort(rows[0])[-30:]] + [3, 4]  # the largest entries get penalized
    device = DeviceRows(_reading(width), ort.OrtValue.ortvalue_from_numpy(rows[None]))
    pipe = LogitsPipeline(config, vocab)
    for i in range(len(rows)):
        new = [int(t) for t in rng.integers(0, vocab, i)]
        if i % 2:  # new tokens among the largest entries (penalized as the context's are)
            new += [int(t) for t in np.argsort(rows[i, :vocab])[-3:]]
        want = pipe.row(rows[i].copy(), base, new)
        got = pipe.row(device[i], base, new)
        assert np.array_equal(got.ids, want.ids) and np.array_equal(got.probs, want.probs), i
        assert int(pipe.greedy(device[i:i + 1], base, new)[0]) == int(pipe.greedy(rows[i:i + 1], base, new)[0])
    assert device.reading.counts.read >= len(rows)
    assert pipe._device_top(device[5], config.top_k, base, []) is not None  # a plain row is settled on top


def test_logits_place_is_checked(pair_bundle):
    with pytest.raises(ValueError, match="logits must be one of"):
        SpeculativeGenerator.load(pair_bundle, logits="gpu")
