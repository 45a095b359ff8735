"""Reading source models: Hugging Face hub id, local HF directory, or a GGUF file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ortspec.bundle import sha256_file
from ortspec.errors import ExportError


@dataclass
class Source:
    model: object          # transformers PreTrainedModel, float32, eval mode
    tokenizer: object      # transformers fast tokenizer
    info: dict             # {"kind": "hub"|"hf_dir"|"gguf", "ref": str, "sha256"?: str}
    generation_config: object | None


def describe(src: str) -> dict:
    """Classify a source string without loading anything."""
    path = Path(src).expanduser()
    if src.lower().endswith(".gguf"):
        if not path.is_file():
            raise ExportError(f"GGUF file {src!r} does not exist; check the path")
        return {"kind": "gguf", "ref": str(path.resolve())}
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ExportError(f"{src!r} is not a Hugging Face model directory (no config.json); pass a model "
                              "directory, a .gguf file or a hub id like HuggingFaceTB/SmolLM2-135M")
        return {"kind": "hf_dir", "ref": str(path.resolve())}
    if src.startswith((".", "/", "~")) or src.count("/") > 1 or not src.strip():
        raise ExportError(f"{src!r} does not exist; pass an existing model directory, a .gguf file, "
                          "or a hub id like HuggingFaceTB/SmolLM2-135M")
    return {"kind": "hub", "ref": src}


def load_source(src: str, trust_remote_code: bool = False) -> Source:
    """Load model + tokenizer in float32 on the CPU; GGUF weights are dequantized."""
    info = describe(src)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    kwargs: dict = {"trust_remote_code": trust_remote_code}
    if info["kind"] == "gguf":
        path = Path(info["ref"])
        where, kwargs["gguf_file"] = str(path.parent), path.name
        info["sha256"] = sha256_file(path)
    else:
        where = info["ref"]
    try:
        tokenizer = _tokenizer(AutoTokenizer, where, info, kwargs)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32, **kwargs)
    except ValueError as exc:
        msg = str(exc)
        if "trust_remote_code" in msg:
            raise ExportError(f"{src} needs custom code from its repository; review it and pass "
                              "--trust-remote-code to allow running it") from None
        if info["kind"] == "gguf":
            raise ExportError(f"cannot load GGUF {src}: {msg.splitlines()[0]}; transformers can dequantize "
                              "GGUF files of the llama, qwen2, mistral, phi3, gpt2 and similar families") from None
        raise ExportError(f"cannot load {src}: {msg.splitlines()[0]}") from None
    except OSError as exc:
        hint = ("no network access to the hub here? download the model and pass its directory"
                if info["kind"] == "hub" else "check that the directory holds a complete model")
        raise ExportError(f"cannot load {src}: {str(exc).splitlines()[0]}; {hint}") from None
    if tokenizer is not None and not getattr(tokenizer, "is_fast", False):
        raise ExportError(f"{src} has no fast (tokenizer.json) tokenizer; ortspec bundles need one")
    model.eval()
    # A directory's generation_config.json sets the bundle's EOS ids and sampling defaults: one that cannot be
    # read is an error, not a silent fall back to other defaults. Without one, the model's own apply.
    own = Path(where) / "generation_config.json" if info["kind"] == "hf_dir" else None
    try:
        gen = GenerationConfig.from_pretrained(where, **({} if info["kind"] != "gguf" else kwargs))
    except (OSError, ValueError) as exc:  # (transformers reports a missing or an unreadable file as OSError)
        if own is not None and own.is_file():
            raise ExportError(f"{own} cannot be read ({str(exc).splitlines()[0]}); fix it, or remove it to export "
                              "with the model's own generation defaults (EOS ids, sampling settings)") from exc
        gen = getattr(model, "generation_config", None)
    return Source(model, tokenizer, info, gen)


def _tokenizer(auto, where: str, info: dict, kwargs: dict):
    """The source's tokenizer; None for a model directory that ships none (ids-only bundle)."""
    if info["kind"] == "hf_dir":
        names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
        if not any((Path(where) / n).is_file() for n in names):
            return None
    return auto.from_pretrained(where, **kwargs)


def special_ids(tokenizer, generation_config=None) -> dict:
    """Stop/bos/pad ids as `generate` would use them: the generation config's eos wins over the tokenizer's."""
    eos = set()
    gen_eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    if gen_eos is not None:
        eos.update([int(gen_eos)] if isinstance(gen_eos, int) else [int(e) for e in gen_eos])
    elif tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(int(tokenizer.eos_token_id))
    if tokenizer is None:
        return {"eos_token_ids": sorted(eos), "bos_token_id": getattr(generation_config, "bos_token_id", None),
                "pad_token_id": getattr(generation_config, "pad_token_id", None)}
    return {"eos_token_ids": sorted(eos), "bos_token_id": tokenizer.bos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def tokenizer_difference(target_tok, draft_tok) -> str | None:
    """First difference between two tokenizers' vocabularies or special ids, or None."""
    from ortspec.bundle import special_difference, vocab_difference
    if (target_tok is None) != (draft_tok is None):
        return "one model ships a tokenizer and the other does not"
    if target_tok is None:
        return None
    problem = vocab_difference(target_tok.get_vocab(), draft_tok.get_vocab())
    if problem:
        return problem
    return special_difference(special_ids(target_tok), special_ids(draft_tok))
