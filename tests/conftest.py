"""Shared fixtures: tiny random models and bundles, exported once per session."""
from __future__ import annotations

import json
from pathlib import Path
import sys

import pytest

sys.path.insert(0, str(Path(__file__).parent))
REPO = Path(__file__).resolve().parent.parent
DEV_PROMPTS = REPO / "runtime" / "data" / "dev.jsonl"


def _export(**kwargs):
    from ortspec.export import export_bundle
    return export_bundle(progress=None, **kwargs)


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def hf_models(workdir) -> dict:
    """HF directories: llama/qwen2/gpt2 (vocab 128), a second llama, small-vocab pair, foreign tokenizer."""
    from tiny import make_model
    m = {}
    for fam in ("llama", "qwen2", "gpt2"):
        m[fam] = make_model(fam, workdir / fam, vocab=128, seed=0)
    m["llama_b"] = make_model("llama", workdir / "llama_b", vocab=128, seed=0, perturb=0.05)
    m["small_target"] = make_model("llama", workdir / "small_target", vocab=16, seed=2, scale=4.0)
    m["small_draft"] = make_model("llama", workdir / "small_draft", vocab=16, seed=2, scale=4.0, perturb=0.1)
    m["foreign"] = make_model("llama", workdir / "foreign", vocab=128, seed=4, tokenizer_shift=1)
    m["no_tok"] = make_model("llama", workdir / "no_tok", vocab=64, seed=5, tokenizer=False)
    return m


@pytest.fixture(scope="session")
def llama_bundle(workdir, hf_models) -> Path:
    """Llama target with an INT4 copy of itself as draft."""
    return _export(target=str(hf_models["llama"]), draft="self", draft_quant="int4", out=workdir / "b_llama")


@pytest.fixture(scope="session", params=["fused", "optimum"])
def pair_bundle(request, workdir, hf_models) -> Path:
    """Llama target with a perturbed llama as draft (many rejections), as both graph kinds:
    fused (static in-place KV cache) and optimum (concat cache, trimmed on rollback)."""
    return _export(target=str(hf_models["llama"]), draft=str(hf_models["llama_b"]),
                   out=workdir / f"b_pair_{request.param}", graph=request.param)


@pytest.fixture(scope="session")
def small_bundle(workdir, hf_models) -> Path:
    """Vocab-16 target and a different vocab-16 draft, for exact-distribution tests."""
    return _export(target=str(hf_models["small_target"]), draft=str(hf_models["small_draft"]),
                   out=workdir / "b_small")


@pytest.fixture(scope="session")
def small_subset_bundle(workdir, hf_models) -> Path:
    """The vocab-16 pair with a draft whose output layer covers ids 0..9 only (q = 0 for 10..15)."""
    return _export(target=str(hf_models["small_target"]), draft=str(hf_models["small_draft"]),
                   out=workdir / "b_small_subset", draft_vocab=10)


@pytest.fixture(scope="session")
def small_self_bundle(workdir, hf_models) -> Path:
    """The vocab-16 target with an INT4 copy of itself as draft (which reads the target's cache)."""
    return _export(target=str(hf_models["small_target"]), draft="self", draft_quant="int4",
                   out=workdir / "b_small_self")


@pytest.fixture(scope="session")
def small_int8_bundle(workdir, hf_models) -> Path:
    """The vocab-16 target drafted by its own dynamic-INT8 copy: nearly every draft passes."""
    return _export(target=str(hf_models["small_target"]), draft="self", draft_quant="int8",
                   out=workdir / "b_small_int8")


@pytest.fixture(scope="session")
def small_copy_bundle(workdir, hf_models) -> Path:
    """The vocab-16 target drafted by an fp32 copy of itself (its own graph): q equals p."""
    return _export(target=str(hf_models["small_target"]), draft=str(hf_models["small_target"]),
                   out=workdir / "b_small_copy")


@pytest.fixture(scope="session")
def ids_bundle(workdir, hf_models) -> Path:
    """A target-only bundle without a tokenizer (token ids in, token ids out)."""
    return _export(target=str(hf_models["no_tok"]), out=workdir / "b_ids")


@pytest.fixture(scope="session")
def dev_prompts() -> list[str]:
    return [json.loads(line)["prompt"] for line in DEV_PROMPTS.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    """The real SmolLM2-135M-Instruct pair of recipe smollm2-135m (fp32 target, 8-bit-weight self-draft)."""
    pytest.importorskip("torch")
    from ortspec.export import export_bundle
    from ortspec.export.recipes import resolve_recipe
    out = tmp_path_factory.mktemp("real") / "smollm2-135m"
    return export_bundle(out=out, progress=None, **resolve_recipe("smollm2-135m", progress=lambda m: None))
