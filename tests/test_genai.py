"""genai_config.json export: onnxruntime-genai runs the bundle's own graphs and produces ortspec's tokens."""
from __future__ import annotations

import json
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

from ortspec import SpeculativeGenerator
from ortspec.errors import ExportError
from ortspec.export.genai import CONFIG, VARIANT, _pattern, genai_greedy, write_genai_config

PROMPTS = ([1, 5, 6, 7], [1, 9, 9, 9, 3, 4, 100, 2, 17])  # the second holds the eos id mid-prompt


def _copy(bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / bundle.name
    shutil.copytree(bundle, dst)
    return dst


def _genai_tokens(where: Path, ids: list[int], new: int, **spec) -> tuple[list[int], dict]:
    og = pytest.importorskip("onnxruntime_genai")
    return genai_greedy(og.Model(str(where)), ids, new, **spec)


def _check_same_tokens(bundle: Path, new: int = 40) -> None:
    base = SpeculativeGenerator.load(bundle, drafter="none")
    for ids in PROMPTS:
        ref = list(base.generate(input_ids=ids, max_new_tokens=new).token_ids)
        alone, _ = _genai_tokens(bundle / "target", ids, new)
        assert alone == ref[:len(alone)] and len(alone) == len(ref)
        if (bundle / "draft").is_dir():
            paired, stats = _genai_tokens(bundle, ids, new, max_draft_tokens=3)
            assert paired == alone
            assert stats["draft_tokens_proposed"] > 0 and stats["target_forward_passes"] < new


def test_genai_runs_both_graph_kinds(pair_bundle, tmp_path):
    bundle = _copy(pair_bundle, tmp_path)
    root = write_genai_config(bundle, max_draft_tokens=3)
    config = json.loads(root.read_text())
    assert config["speculative"] == {"max_draft_tokens": 3}
    assert config["model"]["decoder"]["filename"].startswith("target/")
    assert config["model"]["draft"]["filename"].startswith("draft/")
    static = json.loads((bundle / "ortspec.json").read_text())["models"]["target"]["kv_cache"] == "static"
    assert config["search"]["past_present_share_buffer"] is static
    # both kinds take logits_to_keep, which genai does not feed: a variant derives it (and the fused
    # graph's lengths) and shares the weight file instead of copying it
    graph_size = (bundle / "target" / "model.onnx").stat().st_size
    assert (bundle / "target" / VARIANT).stat().st_size < graph_size + 4096
    _check_same_tokens(bundle)
    SpeculativeGenerator.load(bundle)  # the bundle itself is untouched


def test_genai_runs_quantized_self_draft(llama_bundle, tmp_path):
    bundle = _copy(llama_bundle, tmp_path)
    write_genai_config(bundle)
    _check_same_tokens(bundle)


def test_export_writes_genai_config(hf_models, tmp_path):
    from ortspec.export import export_bundle
    out = export_bundle(target=str(hf_models["qwen2"]), out=tmp_path / "b", genai_config=2, progress=None)
    assert (out / "target" / CONFIG).is_file()
    config = json.loads((out / CONFIG).read_text())
    assert config["model"]["type"] == "qwen2" and "draft" not in config and "speculative" not in config
    _check_same_tokens(out)


def test_cli_adds_genai_config_to_existing_bundle(pair_bundle, tmp_path):
    bundle = _copy(pair_bundle, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "export", "--genai-config", "--out", str(bundle),
                           "--genai-max-draft-tokens", "6"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((bundle / CONFIG).read_text())["speculative"]["max_draft_tokens"] == 6
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run([sys.executable, "-m", "ortspec.cli", "export", "--genai-config", "--out", str(empty)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "holds no bundle" in proc.stderr
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize("bad", [0, 17, 2.5, True, "4"])
def test_bad_max_draft_tokens_is_refused_before_writing(pair_bundle, tmp_path, bad):
    bundle = _copy(pair_bundle, tmp_path)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        write_genai_config(bundle, max_draft_tokens=bad)
    assert not (bundle / CONFIG).exists()


def test_layer_name_pattern():
    names = [f"past_key_values.{i}.key" for i in range(12)]
    assert _pattern(names, "past key") == "past_key_values.%d.key"
    assert _pattern([f"l0_{i}_k" for i in range(3)], "x") == "l0_%d_k"
    with pytest.raises(ExportError, match="numbered pattern"):
        _pattern(["a.0.key", "a.1.key", "b.2.key"], "past key")


def test_compare_peers_runs_genai_on_the_same_graphs(pair_bundle, tmp_path):
    bundle = _copy(pair_bundle, tmp_path)
    out = tmp_path / "peers.json"
    tool = Path(__file__).resolve().parent.parent / "tools" / "compare_peers.py"
    proc = subprocess.run([sys.executable, str(tool), str(bundle), "--peers", "genai", "--limit", "2",
                           "--max-new-tokens", "12", "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = {r["runtime"]: r for r in json.loads(out.read_text())["summary"]}
    assert {"ortspec target-only", "genai target-only", "genai draft model K=4", "genai n-gram K=4"} <= set(rows)
    assert all(r["tokens_per_s"] > 0 for r in rows.values())
    assert rows["genai target-only"]["runs_with_other_tokens"] == 0
    assert rows["genai draft model K=4"]["runs_with_other_tokens"] == 0


def test_model_without_bos(pair_bundle, tmp_path):
    """Qwen has no BOS token: the config must leave the key out (genai rejects null)."""
    bundle = _copy(pair_bundle, tmp_path)
    manifest = json.loads((bundle / "ortspec.json").read_text())
    for model in manifest["models"].values():
        model["special_ids"]["bos_token_id"] = None
    (bundle / "ortspec.json").write_text(json.dumps(manifest))
    write_genai_config(bundle)
    assert "bos_token_id" not in json.loads((bundle / CONFIG).read_text())["model"]
    _check_same_tokens(bundle, new=12)
