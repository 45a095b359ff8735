"""Tiny random causal LMs with word-level tokenizers, saved as Hugging Face directories."""
from __future__ import annotations

from pathlib import Path

# roles as words (system w0, user w1, assistant w2); like real templates, the generation prompt opens an
# assistant message, so a conversation's next turn starts with the previous turn's tokens
CHAT_TEMPLATE = ("{% for m in messages %}<s> {{ {'system': 'w0', 'user': 'w1', 'assistant': 'w2'}[m['role']] }} "
                 "{{ m['content'] }} </s> {% endfor %}{% if add_generation_prompt %}<s> w2 {% endif %}")


def save_tokenizer(vocab: int, out: Path, shift: int = 0) -> None:
    """Word-level tokenizer: <unk>=0, <s>=1, </s>=2, then w0, w1, ... (``shift`` renames words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>"] + [f"w{i + shift}" for i in range(vocab - 3)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


# families the fused builder covers beyond llama/qwen2, with each family's features switched on at sizes a
# ten-token test reaches: windows of 4-5 positions, soft caps the random logits exceed, partial rotary,
# a local rotary table different from the global one
FAMILY_CONFIGS = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=4)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM",
              dict(use_sliding_window=True, sliding_window=4, max_window_layers=1)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=5, partial_rotary_factor=0.5,
                                                  num_attention_heads=2, num_key_value_heads=1)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(sliding_window=4, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                    final_logit_softcapping=3.0, layer_types=["sliding_attention", "full_attention"])),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM",
               dict(sliding_window=4, query_pre_attn_scalar=24, rope_theta=1e6, rope_local_base_freq=1e4,
                    rope_scaling={"rope_type": "linear", "factor": 2.0},
                    layer_types=["sliding_attention", "full_attention"])),
}


def make_model(family: str, out: Path, vocab: int = 128, seed: int = 0, layers: int = 2,
               tokenizer: bool = True, tokenizer_shift: int = 0, scale: float = 1.0,
               perturb: float = 0.0, perturb_seed: int = 99, positions: int = 256, hidden: int = 64) -> Path:
    """A random model (``positions`` of context, llama/qwen2 of width ``hidden``); ``perturb`` > 0 adds noise (relative to each tensor's spread) with its own seed,
    giving a draft that resembles, but differs from, the same-seed target."""
    import torch
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3 // 2, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.2))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3 // 2, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, initializer_range=0.2))
    elif family in FAMILY_CONFIGS:
        import transformers
        config_cls, model_cls, extra = FAMILY_CONFIGS[family]
        common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 3 // 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=positions, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=family.startswith("gemma"), initializer_range=0.2)
        extra = dict(extra)
        if "layer_types" in extra:
            extra["layer_types"] = [extra["layer_types"][i % 2] for i in range(layers)]
        common["head_dim"] = hidden // extra.get("num_attention_heads", 4)
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**{**common, **extra}))
    elif family == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=layers, n_head=4,
                                           n_positions=256, bos_token_id=1, eos_token_id=2, initializer_range=0.2))
    else:
        raise ValueError(family)
    if scale != 1.0:  # sharper logits: the random model gets a peaked, more realistic distribution
        with torch.no_grad():
            head = model.get_output_embeddings()
            head.weight.mul_(scale)
    if perturb:
        gen = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for param in model.parameters():
                if param.ndim > 1:
                    param.add_(torch.randn(param.shape, generator=gen) * param.std() * perturb)
    model.save_pretrained(str(out))
    if tokenizer:
        save_tokenizer(vocab, out, tokenizer_shift)
    return out


def kernel_copy(bundle: Path, out: Path) -> Path:
    """A copy of ``bundle`` (weights hard-linked, or copied across file systems) whose target graph is the one
    its builder wrote, before the row-invariant rewrite (export.rows.undo_rows): the kernels' own behaviour,
    for negative controls. The manifest's checksums follow the new graph."""
    import json
    import os
    import shutil

    import onnx

    from ortspec.bundle import MANIFEST, sha256_file
    from ortspec.export.rows import undo_rows

    def place(src: str, dst: str) -> None:
        if not src.endswith(".data"):  # (the manifest and graphs are written: copies of their own)
            shutil.copy2(src, dst)
            return
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    shutil.copytree(bundle, out, copy_function=place)
    manifest = json.loads((out / MANIFEST).read_text())
    entry = manifest["models"]["target"]
    graph = out / entry["path"]
    model = onnx.load(str(graph), load_external_data=False)
    if not undo_rows(model):
        raise ValueError(f"{bundle}'s target is not row-invariant")
    onnx.save(model, str(graph))
    entry["sha256"][graph.name] = sha256_file(graph)
    entry["size_bytes"][graph.name] = graph.stat().st_size
    entry["rows"] = None
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return out
