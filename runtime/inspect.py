"""`ortspec inspect`: what a bundle holds, whether its files are intact, whether the pair fits."""
from __future__ import annotations

from pathlib import Path

from .bundle import check_compatible, load_bundle, sha256_file
from .config import DEFAULT_DRAFTER, DEFAULT_NUM_DRAFT_TOKENS, resolve_sampling
from .errors import BundleError, IncompatibleModelsError


def inspect_bundle(path: str, checksums: bool = True) -> dict:
    """A report dict; ``ok`` is False when a file is corrupted or the pair is incompatible."""
    try:
        bundle = load_bundle(path, verify="none")
    except IncompatibleModelsError as exc:
        # Report the models anyway: load again without the pairing check.
        return {"bundle": str(path), "ok": False, "errors": [str(exc)], "compatibility": str(exc), "models": {}}
    errors: list[str] = []
    models = {}
    raw = bundle.manifest["models"]
    for role, spec in (("target", bundle.target), ("draft", bundle.draft)):
        if spec is None:
            continue
        files = {}
        for rel in spec.files:
            p = bundle.file(rel)
            name = Path(rel).name
            size = p.stat().st_size
            entry = {"path": rel, "size_bytes": size, "size_ok": size == spec.size_bytes.get(name, size)}
            if checksums:
                entry["sha256_ok"] = sha256_file(p) == spec.sha256.get(name)
            if not entry["size_ok"] or entry.get("sha256_ok") is False:
                errors.append(f"{role} file {rel} is corrupted or truncated (checksum/size mismatch); re-export")
            files[name] = entry
        models[role] = {
            "architecture": spec.architecture, "layers": spec.num_layers, "kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "vocab_size": spec.vocab_size, "max_positions": spec.max_positions,
            "dtype": spec.dtype, "quantization": spec.quantization, "source": spec.source,
            "size_bytes": sum(f["size_bytes"] for f in files.values()), "files": files,
            "io": raw[role].get("io", {}), "vocab_subset": spec.vocab_subset, "top_logits": spec.top_logits,
            "logits_norm": spec.logits_norm, "rows": spec.rows,
        }
    compat = "no draft (target only)"
    if bundle.draft is not None:
        try:
            check_compatible(bundle)
            compat = "compatible: draft and target share the tokenizer"
        except (IncompatibleModelsError, BundleError) as exc:
            compat = str(exc)
            errors.append(compat)
    return {"bundle": str(Path(path).resolve()), "ok": not errors, "errors": errors, "models": models,
            "generation_defaults": bundle.sampling_defaults,
            "sampling_in_force": resolve_sampling(bundle.sampling_defaults),
            "decoding_defaults": bundle.decoding,
            "tokenizer": bundle.manifest.get("tokenizer"), "compatibility": compat,
            "export_versions": bundle.manifest.get("export_versions", {})}


def format_report(r: dict) -> str:
    lines = [f"bundle {r['bundle']}"]
    for role, m in r.get("models", {}).items():
        q = m["quantization"]
        qs = "none"
        if q:
            detail = [str(q.get("op"))] + ([f"{q['activations']} activations"] if q.get("activations") else [])
            qs = f"{q['method']} ({', '.join(detail)})"
        lines.append(f"  {role}: {m['architecture']}, {m['layers']} layers, {m['kv_heads']} KV heads x "
                     f"{m['head_dim']}, vocab {m['vocab_size']}, max positions {m['max_positions']}, "
                     f"{m['dtype']}, quantization {qs}, {m['size_bytes'] / 1e6:.1f} MB")
        lines.append(f"    source: {m['source'].get('kind')} {m['source'].get('ref', '')}")
        if q and q.get("method") == "gguf":
            lines.append("    weights: the GGUF file's own, " + (
                "as it has them (exact layout)" if q.get("layout") == "exact" else
                f"compact layout ({q.get('layout_detail', '')})" if q.get("layout") == "compact" else "as it has them"))
        elif q and m["source"].get("kind") == "gguf":
            lines.append(f"    weights: re-quantized from the GGUF file ({q.get('method')}): a smaller, different model")
        if m.get("rows") == "invariant":
            lines.append("    passes: rows take one path at any pass size (bitwise passes of any size, one included)")
        fid = (q or {}).get("fidelity")
        if fid:
            lines.append(f"    fidelity to the source's float model: top-1 {fid['top1'] * 100:.1f}%, KL "
                         f"{fid['mean_kl']:.4f} ({fid['positions']} tokens of quality.txt, measured at export)")
        if m.get("vocab_subset"):
            sub = m["vocab_subset"]
            spans = ", ".join(f"{a}..{b - 1}" for a, b in sub["ranges"][:4]) + (", ..." if len(sub["ranges"]) > 4 else "")
            lines.append(f"    output layer: {m['vocab_size']} of {sub['full_size']} token ids ({spans}); "
                         "the others have draft probability 0")
        for name, f in m["files"].items():
            check = {True: "ok", False: "MISMATCH", None: "not checked"}[f.get("sha256_ok")]
            lines.append(f"    {name}: {f['size_bytes']} bytes, sha256 {check}")
        io = m.get("io") or {}
        ins, outs = io.get("inputs", {}), io.get("outputs", {})
        shown = [n for n in ins if not n.startswith("past_key_values.")]
        kv = [n for n in ins if n.startswith("past_key_values.")]
        for n in shown:
            lines.append(f"    in  {n} {ins[n]}")
        if kv:
            lines.append(f"    in  {kv[0]} .. {kv[-1]} ({len(kv)} tensors) {ins[kv[0]]}")
        for n in [n for n in outs if not n.startswith("present.")]:
            lines.append(f"    out {n} {outs[n]}")
        pres = [n for n in outs if n.startswith("present.")]
        if pres:
            lines.append(f"    out {pres[0]} .. {pres[-1]} ({len(pres)} tensors) {outs[pres[0]]}")
        lines.append("    top entries: " + ("each kept row's largest logits come with the pass (decoding reads those)"
                                           if m.get("top_logits") else
                                           "none (exported before graphs had them: rows are read whole; "
                                           "`ortspec export --upgrade --out BUNDLE` adds them)"))
        if role == "target":
            lines.append("    normalizer: " + (
                "each kept row's sum of exp((logit - max) / T) comes with the pass (verification without top-k "
                "reads it)" if m.get("logits_norm") else
                "none (exported before target graphs had one: verification without top-k reads whole rows; "
                "`ortspec export --upgrade --out BUNDLE` adds it)"))
    defaults = r.get("generation_defaults") or {}
    force = r.get("sampling_in_force") or {}
    lines.append("  sampling when a call sets nothing: " + ", ".join(
        f"{k}={v}" + ("" if k in defaults else "*") for k, v in force.items())
        + ("  (* transformers' default; the rest from generation_config.json)" if len(defaults) < len(force)
           else "  (from generation_config.json)"))
    decoding = r.get("decoding_defaults") or {}
    lines.append("  decoding when a call sets nothing: " + ", ".join(
        f"{k}={decoding.get(k, v)}" + ("" if k in decoding else "*")
        for k, v in (("drafter", DEFAULT_DRAFTER), ("num_draft_tokens", DEFAULT_NUM_DRAFT_TOKENS)))
        + ("  (* ortspec's default; the rest from the manifest)" if len(decoding) < 2 else "  (from the manifest)"))
    tok = r.get("tokenizer")
    if tok:
        lines.append(f"  tokenizer: {tok.get('vocab_size')} tokens, eos {tok.get('eos_token_ids')}, "
                     f"bos {tok.get('bos_token_id')}, chat template {'yes' if tok.get('chat_template') else 'no'}")
    else:
        lines.append("  tokenizer: none (token ids only)")
    lines.append(f"  pair: {r['compatibility']}")
    lines.append("  verdict: " + ("OK" if r["ok"] else "PROBLEMS:\n    " + "\n    ".join(r["errors"])))
    return "\n".join(lines)
