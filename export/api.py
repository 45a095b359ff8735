"""export_bundle: sources -> ONNX graphs (+ quantized draft) -> a self-describing bundle.

The bundle is assembled in a hidden temporary directory beside ``out`` and
renamed into place only when complete, so an interrupted export never leaves a
directory that loads.
"""
from __future__ import annotations

import errno
import gc
import json
import os
from pathlib import Path
import shutil
import sys
import time
from typing import Callable

from ortspec import __version__
from ortspec.bundle import (FORMAT_VERSION, MANIFEST, ModelSpec, is_bundle, load_bundle, sha256_file,
                            write_manifest)
from ortspec.control.calibrate import PROFILE_FILE
from ortspec.errors import ExportError, IncompatibleModelsError

from .config import KEEP, ExportConfig, ModelRequest
from .genai import write_genai_config
from .gguf_graph import fidelity_to_source, gguf_graph, reference_rows
from .graph import (DATA_SUFFIX, add_top_outputs, choose_graph, export_model, graph_facts, restrict_vocab,
                    subset_ranges)
from .load import Source, describe, load_source, special_ids, tokenizer_difference
from .quantize import quantize
from .rows import make_row_invariant

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(f"[ortspec export] {msg}", file=sys.stderr, flush=True)


def export_bundle(target: str | ExportConfig, progress: Progress | None = _stderr, **options) -> Path:
    """Export a target (and a draft) into a bundle: ``export_bundle(ExportConfig(...))``, or the same options as
    keywords, ``export_bundle(target=..., draft=..., out=..., ...)`` (ExportConfig says what each one means).
    ``progress`` is called with a line of text per step (None: silent).

    Returns the bundle path. Raises ValueError for bad options (before any work), ExportError /
    IncompatibleModelsError when the export cannot be done. The bundle is assembled beside ``out`` and renamed
    into place only when complete.
    """
    if isinstance(target, ExportConfig):
        if options:
            raise TypeError(f"export_bundle takes an ExportConfig or keyword options, not both ({sorted(options)})")
        config = target
    else:
        config = ExportConfig(target=target, **options)
    say = progress or (lambda _m: None)
    from ortspec.engine import shared_thread_pool_active
    if shared_thread_pool_active():
        raise ExportError("this process runs onnxruntime on its shared thread pool (thread_pool='shared'), which "
                          "the exporters' own onnxruntime sessions cannot use; export in another process or "
                          "before loading any bundle")
    out = config.out
    _check_out(out, config.overwrite)
    for model in config.models():
        if model.source != "self":
            describe(model.source)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    started = time.perf_counter()
    try:
        manifest = _build(tmp, config, say)
        if config.generation:
            path = tmp / "generation_config.json"
            generation = json.loads(path.read_text()) if path.is_file() else {}
            path.write_text(json.dumps(dict(generation, **config.generation), indent=2))
        write_manifest(tmp, dict(manifest, decoding=config.decoding) if config.decoding else manifest)
        load_bundle(tmp, verify="size")  # what we wrote must load
        if config.genai_config is not None:
            say("writing onnxruntime-genai configs")
            write_genai_config(tmp, max_draft_tokens=config.genai_config)
        _publish(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENOSPC:
            raise ExportError(f"out of disk space while writing {out}; free space on "
                              f"{out.parent.resolve()} (a bundle needs about 3x the model's fp32 size) "
                              "and retry") from None
        raise ExportError(f"cannot write {out}: {exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"bundle ready at {out} ({time.perf_counter() - started:.0f} s)")
    return out


UPGRADED = ".upgrade"  # a graph file's suffix while an upgrade's manifest points at it


def upgrade_bundle(out: str | os.PathLike, progress: Progress | None = print) -> list[str]:
    """Bring an existing bundle's graphs to the current format without re-exporting: graphs exported before
    they returned each row's largest logits get the TopK, target graphs without it each row's normalizer
    (``add_top_outputs``), fused target graphs rows that take one path at any pass size (``make_row_invariant``).
    Weights are not touched.
    Returns what was upgraded ("target", "draft"); nothing when the bundle is current.

    Every step leaves a bundle that loads: the new graph is written beside the old one and the manifest is
    switched to it in one rename; the old file is then rewritten and the manifest switched back to its name.
    """
    say = progress or (lambda message: None)
    root = Path(out).expanduser().resolve()
    bundle = load_bundle(root, verify="size")  # a bundle that loads, or the error saying why not
    done = []
    for leftover in root.glob("*/*" + UPGRADED):  # an interrupted upgrade's copy the manifest no longer names
        if not any(leftover == bundle.file(s.path) for s in (bundle.target, bundle.draft) if s is not None):
            leftover.unlink()
    for role in ("target", "draft"):
        spec = getattr(bundle, role)
        if spec is None:
            continue
        path = bundle.file(spec.path)
        if path.name.endswith(UPGRADED):  # an interrupted upgrade ran the new graph under the other name
            _move_back(root, role, path)
            done.append(role)
            continue
        norm = role == "target"
        rows = norm and spec.rows is None and spec.kv_cache == "static"
        if spec.top_logits and (spec.logits_norm or not norm) and not rows:
            continue
        beside = path.with_name(path.name + UPGRADED)
        what = [w for w, missing in (("the TopK of each row's logits", not spec.top_logits),
                                      ("each row's normalizer", norm and not spec.logits_norm),
                                      ("rows that take one path at any pass size", rows)) if missing]
        say(f"{role}: adding {' and '.join(what)} to {spec.path}")
        wrote = add_top_outputs(path, beside, norm=norm)
        if rows:
            wrote = make_row_invariant(beside if wrote else path, beside) or wrote
            stale = root / PROFILE_FILE  # its pass costs were timed on the old graph: timed again on first use
            if stale.is_file():
                stale.unlink()
                say("the stored pass costs were timed on the old graph: they are measured again on first use")
        if not wrote:
            _switch_manifest(root, role, path)  # the graph has them already; the manifest now says so
        else:
            _switch_manifest(root, role, beside)  # the bundle now runs the new graph under the other name
            _move_back(root, role, beside)
        done.append(role)
    load_bundle(root, verify="size")
    return done


def _move_back(root: Path, role: str, beside: Path) -> None:
    """The new graph under its usual name again: copied over the old file, the manifest switched, the copy
    removed (the graph file holds no weights: it is small)."""
    usual = beside.with_name(beside.name[:-len(UPGRADED)])
    tmp = usual.with_name(usual.name + ".tmp")
    shutil.copyfile(beside, tmp)
    os.replace(tmp, usual)
    _switch_manifest(root, role, usual)
    beside.unlink()


def _switch_manifest(root: Path, role: str, graph: Path) -> None:
    """Point the manifest's model ``role`` at ``graph`` (its checksum, size, input/output names, top_logits and
    logits_norm)
    with one atomic rename."""
    manifest = json.loads((root / MANIFEST).read_text())
    entry = manifest["models"][role]
    facts = graph_facts(graph)
    old = Path(entry["path"]).name
    for table in ("sha256", "size_bytes"):
        entry[table].pop(old, None)
    entry["path"] = graph.relative_to(root).as_posix()
    entry["sha256"][graph.name] = sha256_file(graph)
    entry["size_bytes"][graph.name] = graph.stat().st_size
    entry["top_logits"] = facts["top_logits"]
    entry["logits_norm"] = facts["logits_norm"]
    entry["rows"] = facts["rows"]
    entry["io"] = {"inputs": facts["inputs"], "outputs": facts["outputs"]}
    manifest.update(format_version=FORMAT_VERSION, ortspec_version=__version__)  # (this release's format now)
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(tmp, root / MANIFEST)


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"output {out} exists and is not a directory; choose another --out")
    if out.is_dir() and any(out.iterdir()):
        if not is_bundle(out):
            raise ExportError(f"output directory {out} is not empty and is not a bundle; choose an empty or new "
                              "directory (ortspec never deletes files it did not write)")
        if not overwrite:
            raise ExportError(f"{out} already holds a bundle; pass --overwrite (overwrite=True) to replace it")


def _remove_stale_partials(out: Path) -> None:
    """Delete work directories left by exports to ``out`` that were killed."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        try:
            pid = int(stale.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
            if pid != os.getpid():
                continue  # another export to the same path is running
        except (ValueError, ProcessLookupError):
            pass
        except PermissionError:
            continue
        shutil.rmtree(stale, ignore_errors=True)


def _publish(tmp: Path, out: Path) -> None:
    """Move the finished bundle into place; an old bundle is replaced only now."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build(tmp: Path, config: ExportConfig, say: Progress) -> dict:
    """Both models' graphs (each through ``_graph``, then ``_quantized``), the tokenizer and the manifest's
    entries, in ``tmp``."""
    requests = {m.role: m for m in config.models()}
    target, draft = requests["target"], requests.get("draft")
    say(f"loading target {target.source}")
    src = load_source(target.source, config.trust_remote_code)
    _check_disk(tmp, src.model, 2 + (draft is not None))
    target_info = _model_facts(src)
    target_graph, target_blocks = _graph(src, target, config, tmp, say)
    fp32 = target_graph if target_blocks is None else None
    if draft is not None and draft.source == "self" and target_blocks is not None:
        fp32 = export_model(src.model, tmp / "target-fp32", choose_graph(src.model, config.graph), "fp32")
    tok_info = _save_tokenizer(src, tmp) if src.tokenizer is not None else None
    if tok_info is None:
        say("the target ships no tokenizer: the bundle will take token ids only")
    if src.generation_config is not None:
        src.generation_config.save_pretrained(str(tmp))
    # a target that will be rounded (the file's blocks, or re-quantized) is later measured against these
    reference = reference_rows(src) if (target_blocks or target.quant) and src.tokenizer is not None else None
    del src.model
    gc.collect()
    models = {}
    if draft is not None:
        say("preparing draft")
        draft_dir = tmp / "draft"
        d_tok = None
        if draft.source == "self":  # the target's float graph, quantized below
            draft_info = dict(target_info, source={"kind": "self", "ref": "target", "of": target_info["source"]})
            draft_graph, draft_blocks = fp32, None
        else:
            dsrc = load_source(draft.source, config.trust_remote_code)
            problem = tokenizer_difference(src.tokenizer, dsrc.tokenizer)
            if problem:
                raise IncompatibleModelsError(f"draft {draft.source} and target {target.source} do not share a "
                                              f"tokenizer: {problem}; pick a draft from the same model family")
            draft_info = _model_facts(dsrc)
            draft_graph, draft_blocks = _graph(dsrc, draft, config, tmp, say)
            if dsrc.tokenizer is not None:
                dsrc.tokenizer.backend_tokenizer.save(str(tmp / "draft-tokenizer.json"))
                d_tok = "draft/tokenizer.json"
            del dsrc
            gc.collect()
        subset = None
        if config.draft_vocab is not None:
            draft_graph, subset = _restrict_draft(tmp, draft_graph, config.draft_vocab, draft_info, target_info,
                                                  in_place=not draft.quant, say=say)
        quant = _quantized(draft, draft_graph, draft_dir, say) or draft_blocks
        if d_tok:
            os.replace(tmp / "draft-tokenizer.json", draft_dir / "tokenizer.json")
        models["draft"] = _spec(tmp, draft_dir / "model.onnx", draft_info, quant, d_tok, subset)
        shutil.rmtree(tmp / "draft-fp32", ignore_errors=True)
        shutil.rmtree(tmp / "draft-subset", ignore_errors=True)
    t_quant = _quantized(target, fp32, tmp / "target", say) or target_blocks
    shutil.rmtree(tmp / "target-fp32", ignore_errors=True)
    models["target"] = _spec(tmp, tmp / "target" / "model.onnx", target_info, t_quant, None, norm=True)
    if reference is not None:  # a rounded target: how far it is from the source's float model, measured once
        say("measuring the target's fidelity to the source's float model")
        models["target"]["quantization"]["fidelity"] = fidelity_to_source(reference, tmp, models["target"])
    return {"created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "models": {"target": models["target"], **({"draft": models["draft"]} if "draft" in models else {})},
            "tokenizer": tok_info, "export_versions": _versions()}


def _graph(src: Source, model: ModelRequest, config: ExportConfig, tmp: Path,
           say: Progress) -> tuple[Path, dict | None]:
    """One model's graph, target or draft alike: the GGUF file's own quantized weights where they are kept
    (``_keeps_blocks``; written where the model ends up, with the manifest's quantization entry), else a float
    graph (where the model ends up, or beside it in ``<role>-fp32/`` when a re-quantization follows). (graph,
    the kept blocks' quantization entry or None)."""
    kind = choose_graph(src.model, config.graph)
    final = tmp / model.role
    # (a draft whose output layer is restricted to a vocabulary subset is rebuilt from float weights)
    requant = model.quant or (model.role == "draft" and config.draft_vocab is not None and "vocab")
    size = f"{_params(src.model) / 1e6:.0f}M parameters"
    if _keeps_blocks(src, config.dtype, requant, kind, say, model.keep):
        say(f"exporting {model.role} ({size}) with the GGUF file's quantized weights")
        blocks = gguf_graph(src, final, say, config.activations, config.gguf_layout)
        return final / "model.onnx", blocks
    say(f"exporting {model.role} ({size}) to a {kind} ONNX graph")
    where = tmp / f"{model.role}-fp32" if model.quant else final
    return export_model(src.model, where, kind, config.dtype or "fp32"), None


def _quantized(model: ModelRequest, graph: Path | None, final: Path, say: Progress) -> dict | None:
    """Re-quantize one model's float graph into ``final`` when its request says so: the manifest's quantization
    entry, or None."""
    if not model.quant:
        return None
    say(f"quantizing {model.role} to {model.quant}")
    return quantize(graph, final, model.quant)


def _keeps_blocks(src: Source, dtype: str | None, requant, kind: str, say: Progress, asked: bool = False) -> bool:
    """Whether this source's graph keeps its GGUF quantized weights: a .gguf file, no precision asked for
    (dtype None, no re-quantization), and a fused graph to hold them. ``asked``: the caller asked for exactly
    that (quant "gguf", whatever dtype says), so a model that cannot keep them is an error."""
    if src.info["kind"] != "gguf" or (dtype is not None and not asked) or requant:
        return False
    if kind != "fused":
        if asked:
            raise ExportError(f"{src.info['ref']} needs the optimum graph, which takes float weights only: its "
                              "GGUF quantized weights cannot be kept; leave out quant 'gguf'")
        say("this model needs the optimum graph, which takes float weights only: the GGUF file is dequantized")
        return False
    return True


def _save_tokenizer(src: Source, tmp: Path) -> dict:
    src.tokenizer.save_pretrained(str(tmp))
    config_path = tmp / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    jinja = tmp / "chat_template.jinja"
    if jinja.is_file():  # newer transformers keep the template beside the config
        config["chat_template"] = jinja.read_text()
        jinja.unlink()
    template = config.get("chat_template") or getattr(src.tokenizer, "chat_template", None)
    if template and not config.get("chat_template"):
        config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False))
    for extra in tmp.glob("*"):
        if extra.is_file() and extra.name not in TOKENIZER_FILES:
            extra.unlink()  # vocab.json/merges.txt duplicates of tokenizer.json
    ids = special_ids(src.tokenizer, src.generation_config)
    return {"file": "tokenizer.json", "vocab_size": len(src.tokenizer), **ids,
            "chat_template": bool(config.get("chat_template"))}


def _model_facts(src: Source) -> dict:
    cfg = src.model.config
    max_pos = (getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
               or getattr(cfg, "n_ctx", None) or 2048)
    return {"architecture": (cfg.architectures or [type(src.model).__name__])[0],
            "max_positions": int(max_pos), "source": src.info,
            "special_ids": special_ids(src.tokenizer, src.generation_config)}


def _restrict_draft(tmp: Path, graph: Path, first: int, draft_info: dict, target_info: dict, in_place: bool,
                    say: Progress) -> tuple[Path, dict]:
    """The draft graph with a vocabulary-subset output layer, and its manifest entry."""
    full = graph_facts(graph)["vocab_size"]
    if first >= full:
        raise ValueError(f"draft_vocab={first} keeps the whole vocabulary of {full} ids; choose fewer")
    special = []
    for info in (draft_info, target_info):
        ids = info.get("special_ids") or {}
        special += list(ids.get("eos_token_ids") or []) + [ids.get(k) for k in ("bos_token_id", "pad_token_id")]
    ranges = subset_ranges(first, [i for i in special if i is not None], full)
    kept = sum(b - a for a, b in ranges)
    say(f"restricting the draft's output layer to {kept} of {full} token ids")
    (tmp / "draft-subset").mkdir()
    out = restrict_vocab(graph, tmp / "draft-subset" / "model.onnx", ranges)
    if in_place:  # the unquantized draft already sits in draft/: replace it
        for name in (out.name, out.name + DATA_SUFFIX):
            os.replace(out.parent / name, graph.parent / name)
        out = graph
    return out, {"full_size": full, "ranges": ranges}


def _spec(root: Path, graph: Path, info: dict, quant: dict | None, tokenizer: str | None,
          subset: dict | None = None, norm: bool = False) -> dict:
    """The manifest entry of one exported graph; a target's (``norm``) graph gets each row's normalizer and is
    made row-invariant first (export.rows: bitwise passes of any size)."""
    add_top_outputs(graph, norm=norm)
    if norm:
        make_row_invariant(graph)
    facts = graph_facts(graph)
    files = [graph, graph.with_name(graph.name + DATA_SUFFIX)]
    files = [f for f in files if f.is_file()]
    spec = ModelSpec(
        path=graph.relative_to(root).as_posix(),
        data=files[1].relative_to(root).as_posix() if len(files) > 1 else None,
        architecture=info["architecture"], num_layers=facts["num_layers"],
        num_kv_heads=facts["num_kv_heads"], head_dim=facts["head_dim"], vocab_size=facts["vocab_size"],
        max_positions=info["max_positions"], dtype=facts["dtype"], input_ids=facts["input_ids"],
        attention_mask=facts["attention_mask"], position_ids=facts["position_ids"], logits=facts["logits"],
        kv_inputs=tuple(map(tuple, facts["kv_inputs"])), kv_outputs=tuple(map(tuple, facts["kv_outputs"])),
        quantization=quant, source=info["source"],
        sha256={f.name: sha256_file(f) for f in files}, size_bytes={f.name: f.stat().st_size for f in files},
        special_ids=info["special_ids"], tokenizer=tokenizer, kv_cache=facts["kv_cache"],
        seqlens_k=facts["seqlens_k"], total_sequence_length=facts["total_sequence_length"], vocab_subset=subset,
        logits_to_keep=facts["logits_to_keep"], top_logits=facts["top_logits"], logits_norm=facts["logits_norm"],
        rows=facts["rows"])
    return dict(spec.to_dict(), io={"inputs": facts["inputs"], "outputs": facts["outputs"]})


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _check_disk(where: Path, model, copies: int) -> None:
    need = _params(model) * 4 * copies
    free = shutil.disk_usage(where).free
    if free < need:
        raise ExportError(f"not enough disk space in {where.parent}: about {need / 1e9:.1f} GB needed, "
                          f"{free / 1e9:.1f} GB free; free space or choose another --out")


def _versions() -> dict:
    out = {}
    for name in ("torch", "transformers", "optimum", "onnx", "onnxruntime"):
        try:
            from importlib.metadata import version
            out[name] = version(name if name != "optimum" else "optimum-onnx")
        except Exception:
            out[name] = None
    return out
