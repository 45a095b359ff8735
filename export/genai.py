"""genai_config.json for a bundle, so onnxruntime-genai runs the very same graphs.

onnxruntime-genai feeds a decoder ``input_ids``, ``attention_mask`` (ones over
every valid position) and, where the graph has one, ``position_ids``. ortspec's
graphs take more: ``logits_to_keep`` (how many positions get logits), and fused
graphs the valid length as ``seqlens_k`` / ``total_sequence_length`` instead of
a mask. So a small second graph file ``model.genai.onnx`` is written beside
``model.onnx``: the same nodes and the same external weight file (nothing is
copied; a row-invariant target's rewrite undone, ``rows.undo_rows``: genai sizes
the KV cache to the fed positions), with a few nodes in front that derive
those inputs from genai's::

    seqlens_k             = int32(ReduceSum(attention_mask, axis 1) - 1)
    total_sequence_length = int32(Shape(attention_mask)[1])
    logits_to_keep        = Shape(input_ids)[1:2]       (every fed position)

Files written (each atomically, the pair config last):

* ``<model dir>/genai_config.json`` for the target and the draft alone;
* ``genai_config.json`` at the bundle root: the target as ``model.decoder``,
  the draft as ``model.draft`` and ``speculative.max_draft_tokens``, which is
  onnxruntime-genai's draft-model speculative decoding.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ortspec.checks import is_int
from ortspec.bundle import Bundle, ModelSpec, load_bundle
from ortspec.errors import ExportError

CONFIG = "genai_config.json"
VARIANT = "model.genai.onnx"
# architectures whose ONNX graphs onnxruntime-genai drives as plain decoders, and its name for each
GENAI_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral",
               "GPT2LMHeadModel": "gpt2"}


def write_genai_config(bundle_dir: str | os.PathLike, max_draft_tokens: int = 4) -> Path:
    """Write onnxruntime-genai configs into an existing bundle; returns the root config's path."""
    if not is_int(max_draft_tokens, 1, 16):
        raise ValueError(f"max_draft_tokens must be an integer from 1 to 16 (onnxruntime-genai's range), "
                         f"got {max_draft_tokens!r}")
    bundle = load_bundle(bundle_dir, verify="size")
    sections = {}
    for role, spec in (("decoder", bundle.target), ("draft", bundle.draft)):
        if spec is None:
            continue
        model_dir = bundle.file(spec.path).parent
        filename = _genai_graph(bundle, spec)
        section = _decoder_section(spec, filename)
        sections[role] = (spec, section, model_dir)
    share = all(spec.kv_cache == "static" for spec, _, _ in sections.values())
    for role, (spec, section, model_dir) in sections.items():
        alone = dict(section, filename=Path(section["filename"]).name)
        _write_json(model_dir / CONFIG, _config(bundle, spec, {"decoder": alone}, share))
    target_spec, target_section, _ = sections["decoder"]
    models = {"decoder": target_section}
    if "draft" in sections:
        models["draft"] = sections["draft"][1]
    config = _config(bundle, target_spec, models, share)
    if "draft" in sections:
        config["speculative"] = {"max_draft_tokens": max_draft_tokens}
    root = bundle.root / CONFIG
    _write_json(root, config)
    return root


def _genai_graph(bundle: Bundle, spec: ModelSpec) -> str:
    """The graph file onnxruntime-genai should load for ``spec``, relative to the bundle."""
    if spec.kv_cache == "concat" and not spec.attention_mask:
        raise ExportError(f"{spec.path} takes no attention_mask, which onnxruntime-genai needs; "
                          "re-export with graph='optimum'")
    if spec.kv_cache == "concat" and not spec.logits_to_keep:
        return spec.path  # genai feeds every input this graph takes
    variant = Path(spec.path).with_name(VARIANT).as_posix()
    _write_variant(bundle.file(spec.path), bundle.root / variant, spec)
    return variant


def _write_variant(src: Path, dst: Path, spec: ModelSpec) -> None:
    """``src`` with the inputs genai does not feed derived from those it does (nodes in front)."""
    import onnx
    from onnx import TensorProto, helper

    from .rows import undo_rows
    model = onnx.load(str(src), load_external_data=False)  # weights stay in the shared data file
    undo_rows(model)  # (genai sizes the KV cache to the fed positions: no room for the extra attention row)
    graph = model.graph
    wanted = {spec.seqlens_k, spec.total_sequence_length, spec.logits_to_keep} - {None}
    kept = [i for i in graph.input if i.name not in wanted]
    if len(kept) != len(graph.input) - len(wanted):
        raise ExportError(f"{src} lacks the inputs {sorted(wanted)} its manifest names; re-export the bundle")
    mask = "attention_mask"
    nodes, inputs = [], list(kept)
    if spec.kv_cache == "static":
        if any(i.name == mask for i in graph.input):
            raise ExportError(f"{src} already has an input named {mask}")
        tag = "genai_mask"
        nodes += [
            helper.make_node("Constant", [], [f"{tag}/axes"], value=helper.make_tensor("v", TensorProto.INT64, [1], [1])),
            helper.make_node("ReduceSum", [mask, f"{tag}/axes"], [f"{tag}/valid"], keepdims=0),
            helper.make_node("Constant", [], [f"{tag}/one"], value=helper.make_tensor("v", TensorProto.INT64, [], [1])),
            helper.make_node("Sub", [f"{tag}/valid", f"{tag}/one"], [f"{tag}/last"]),
            helper.make_node("Cast", [f"{tag}/last"], [spec.seqlens_k], to=TensorProto.INT32),
            helper.make_node("Shape", [mask], [f"{tag}/shape"], start=1, end=2),
            helper.make_node("Squeeze", [f"{tag}/shape"], [f"{tag}/total"]),
            helper.make_node("Cast", [f"{tag}/total"], [spec.total_sequence_length], to=TensorProto.INT32),
        ]
        inputs = [kept[0], helper.make_tensor_value_info(mask, TensorProto.INT64, [1, "total_sequence_length"]),
                  *kept[1:]]
    if spec.logits_to_keep:  # genai reads the logits of every position it feeds
        nodes.append(helper.make_node("Shape", [spec.input_ids], [spec.logits_to_keep], start=1, end=2))
    body = list(graph.node)
    if spec.top_logits:  # genai reads whole rows: the TopK (its input and outputs) goes
        top = spec.top_logits
        inputs = [i for i in inputs if i.name != top["k"]]
        made = {top["values"], top["ids"]}
        body = [n for n in body if not made & set(n.output)]  # the TopK, and the Cast after it (fp16 graphs)
        gone = {top["values"], top["ids"]}
        if spec.logits_norm:  # and the normalizer after it
            norm = spec.logits_norm
            inputs = [i for i in inputs if i.name != norm["scale"]]
            body = [n for n in body if not n.name.startswith("norm/")]
            gone.add(norm["norm"])
        outputs = [o for o in graph.output if o.name not in gone]
        del graph.output[:]
        graph.output.extend(outputs)
    del graph.input[:]
    graph.input.extend(inputs)
    del graph.node[:]
    graph.node.extend(nodes + body)
    tmp = dst.with_name(dst.name + ".tmp")
    onnx.save(model, str(tmp))
    os.replace(tmp, dst)


def _pattern(names: list[str], what: str) -> str:
    """'past_key_values.%d.key' from the per-layer names, which must follow one pattern."""
    first = names[0]
    if "0" not in first:
        raise ExportError(f"cannot derive a per-layer name pattern for {what} from {first!r}")
    for cut in range(len(first)):
        if first[cut] != "0":
            continue
        pattern = first[:cut] + "%d" + first[cut + 1:]
        if all(pattern % i == name for i, name in enumerate(names)):
            return pattern
    raise ExportError(f"the {what} names ({names[0]!r}, ...) do not follow one numbered pattern, "
                      "which onnxruntime-genai needs")


def _decoder_section(spec: ModelSpec, filename: str) -> dict:
    inputs = {"input_ids": spec.input_ids, "attention_mask": spec.attention_mask or "attention_mask",
              "past_key_names": _pattern([k for k, _ in spec.kv_inputs], "past key"),
              "past_value_names": _pattern([v for _, v in spec.kv_inputs], "past value")}
    if spec.position_ids:
        inputs["position_ids"] = spec.position_ids
    outputs = {"logits": spec.logits,
               "present_key_names": _pattern([k for k, _ in spec.kv_outputs], "present key"),
               "present_value_names": _pattern([v for _, v in spec.kv_outputs], "present value")}
    return {"filename": filename, "session_options": {"log_id": "ortspec-genai", "provider_options": []},
            "inputs": inputs, "outputs": outputs, "num_hidden_layers": spec.num_layers,
            "num_key_value_heads": spec.num_kv_heads, "head_size": spec.head_dim,
            # onnxruntime-genai reads these two only for some model types; the graphs fix the real values
            "num_attention_heads": spec.num_kv_heads, "hidden_size": spec.num_kv_heads * spec.head_dim}


def _config(bundle: Bundle, spec: ModelSpec, models: dict, share: bool) -> dict:
    kind = GENAI_TYPES.get(spec.architecture)
    if kind is None:
        raise ExportError(f"onnxruntime-genai has no decoder type for {spec.architecture}; supported: "
                          f"{', '.join(sorted(GENAI_TYPES))}")
    eos = bundle.eos_token_ids
    special = spec.special_ids or {}
    pad = special.get("pad_token_id")
    model = {"type": kind, "vocab_size": spec.vocab_size, "context_length": spec.max_positions,
             "eos_token_id": eos if len(eos) != 1 else eos[0],
             "pad_token_id": pad if pad is not None else -1, **models}
    if special.get("bos_token_id") is not None:  # genai wants a number or nothing (Qwen has no BOS)
        model["bos_token_id"] = special["bos_token_id"]
    return {"model": model,
            "search": {"do_sample": False, "num_beams": 1, "max_length": spec.max_positions, "min_length": 0,
                       "temperature": 1.0, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.0,
                       "no_repeat_ngram_size": 0, "num_return_sequences": 1, "early_stopping": True,
                       "length_penalty": 1.0, "diversity_penalty": 0.0, "past_present_share_buffer": share}}


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def genai_greedy(model, ids: list[int], max_new_tokens: int, sampling: dict | None = None,
                 **speculative) -> tuple[list[int], dict]:
    """Decode ``ids`` with an ``onnxruntime_genai.Model`` (greedy, or with ``sampling``: search options such as
    temperature, top_k, top_p, repetition_penalty, random_seed); returns (new token ids, speculative stats).

    ``speculative`` goes to ``GeneratorParams.set_speculative_options`` (e.g. max_draft_tokens,
    ngram_size, min_adaptive_k); the stats are empty when none is given.
    """
    import numpy as np
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + max_new_tokens, do_sample=bool(sampling), **(sampling or {}))
    if speculative:
        params.set_speculative_options(**speculative)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([ids], dtype=np.int32))
    while not gen.is_done():
        gen.generate_next_token()
    stats = gen.get_speculative_stats() if speculative else {}
    return [int(t) for t in gen.get_sequence(0)][len(ids):], stats
