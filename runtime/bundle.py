"""The bundle format: a directory with `ortspec.json`, ONNX graphs and tokenizer files.

The runtime reads every name and shape from the manifest; nothing is guessed
from file or tensor names. Export writes manifests through `ModelSpec.to_dict`
and `write_manifest` so that both sides share one schema.
"""
from __future__ import annotations

from dataclasses import dataclass, field, asdict
import hashlib
import json
import os
from pathlib import Path

from .checks import is_int
from .config import DEFAULT_DRAFTER, DEFAULT_NUM_DRAFT_TOKENS, check_decoding
from .errors import BundleError, IncompatibleModelsError

MANIFEST = "ortspec.json"
FORMAT = "ortspec-bundle"
# The bundle format: 2 when graphs take ``logits_to_keep`` and return each kept row's largest logits (and a
# target's normalizer: manifest keys ``top_logits``, ``logits_norm``); 1 before. This release reads both (a
# version-1 bundle's rows are read whole; ``ortspec export --upgrade`` brings it to 2) and writes 2.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class ModelSpec:
    """Everything the runtime needs to drive one exported graph."""

    path: str                       # relative to the bundle: "target/model.onnx"
    data: str | None                # its single external-data file, or None
    architecture: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int                 # logits width
    max_positions: int
    dtype: str                      # "float32" | "float16"
    input_ids: str
    attention_mask: str | None      # concat graphs
    position_ids: str | None
    logits: str
    kv_inputs: tuple[tuple[str, str], ...]
    kv_outputs: tuple[tuple[str, str], ...]
    quantization: dict | None
    source: dict
    sha256: dict                    # file name -> hex digest
    size_bytes: dict
    special_ids: dict               # eos_token_ids, bos_token_id, pad_token_id
    tokenizer: str | None = None    # this model's own tokenizer.json when it differs in source
    kv_cache: str = "concat"        # "concat": present = past + new; "static": shared fixed-capacity buffers
    seqlens_k: str | None = None    # static graphs: total length - 1
    total_sequence_length: str | None = None
    # a draft whose output layer covers only some token ids: {"full_size": V, "ranges": [[start, stop], ...]};
    # logit column j belongs to the j-th id of the ranges, every other id has probability 0
    vocab_subset: dict | None = None
    # int64 [1] input: the output layer runs on the last that many positions only (None: every position)
    logits_to_keep: str | None = None
    # the graph's TopK over each kept row: {"k": int64 [1] input, "values": float32 [1, rows, k] output,
    # "ids": int64 [1, rows, k] output (logits columns)}; None in graphs exported without it
    top_logits: dict | None = None
    # a target graph's normalizer of each kept row: {"scale": float32 [1] input (1 / temperature), "norm": float32
    # [1, rows] output, sum_i exp((logit_i - max) * scale), "block": entries summed first (then over the blocks)};
    # None in graphs without it
    logits_norm: dict | None = None
    # "invariant": a target graph rewritten so that every row takes one path whatever the pass size (export.rows:
    # the attention always sees a row more, row-pairing matrices an even count); its KV buffers then need
    # ``kv_headroom`` slots past the valid length. None: an ordinary graph
    rows: str | None = None

    @property
    def kernel_tile(self) -> int:
        """Rows onnxruntime's CPU kernels compute together in an ordinary graph's passes: 2 where its weights are
        in 4- or 8-bit blocks of 64 or more (MatMulNBits then takes rows in pairs, and a row left alone goes
        another way), else 32 (a lone row, and with head size 16 the last of 32k + 1, goes another way)."""
        q = self.quantization or {}
        return 2 if q.get("op") == "MatMulNBits" and int(q.get("block_size", 32)) >= 64 else 32

    @property
    def row_tile(self) -> int:
        """The tile bitwise passes avoid: they never have ``row_tile * k + 1`` positions (``CausalLM.forward``).
        1 (no pass size avoided) for a row-invariant graph, else ``kernel_tile``. (A row-invariant graph runs at
        1 only once a probe on the machine at hand agrees: ``CausalLM.row_tile``.)"""
        return 1 if self.rows == "invariant" else self.kernel_tile

    @property
    def kv_headroom(self) -> int:
        """KV slots a pass writes past the positions it feeds (a row-invariant graph's attention row)."""
        return 1 if self.rows == "invariant" else 0

    @classmethod
    def from_dict(cls, d: dict, role: str) -> "ModelSpec":
        if not isinstance(d, dict):
            raise BundleError(f"manifest entry models.{role} is not an object; re-export the bundle")
        try:
            spec = cls(
                path=str(d["path"]), data=d.get("data"), architecture=str(d["architecture"]),
                num_layers=int(d["num_layers"]), num_kv_heads=int(d["num_kv_heads"]),
                head_dim=int(d["head_dim"]), vocab_size=int(d["vocab_size"]),
                max_positions=int(d["max_positions"]), dtype=str(d["dtype"]),
                input_ids=str(d["input_ids"]), attention_mask=d.get("attention_mask"),
                position_ids=d.get("position_ids"), logits=str(d["logits"]),
                kv_inputs=tuple((str(k), str(v)) for k, v in d["kv_inputs"]),
                kv_outputs=tuple((str(k), str(v)) for k, v in d["kv_outputs"]),
                quantization=d.get("quantization"), source=dict(d.get("source") or {}),
                sha256=dict(d["sha256"]), size_bytes=dict(d.get("size_bytes") or {}),
                special_ids=dict(d.get("special_ids") or {}), tokenizer=d.get("tokenizer"),
                kv_cache=str(d.get("kv_cache", "concat")), seqlens_k=d.get("seqlens_k"),
                total_sequence_length=d.get("total_sequence_length"),
                vocab_subset=_vocab_subset(d.get("vocab_subset"), int(d["vocab_size"]), role),
                logits_to_keep=d.get("logits_to_keep"), top_logits=_top_logits(d.get("top_logits"), role),
                logits_norm=_logits_norm(d.get("logits_norm"), d.get("top_logits"), role),
                rows=d.get("rows"),
            )
        except BundleError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(f"manifest entry models.{role} is malformed ({exc!r}); "
                              "re-export the bundle with `ortspec export`") from None
        names = [spec.input_ids, spec.logits, spec.path] + [n for p in spec.kv_inputs + spec.kv_outputs for n in p]
        optional = [spec.data, spec.attention_mask, spec.position_ids, spec.seqlens_k, spec.total_sequence_length,
                    spec.tokenizer, spec.logits_to_keep]
        if not all(isinstance(n, str) and n for n in names) or not all(o is None or isinstance(o, str) for o in optional):
            raise BundleError(f"manifest entry models.{role} has a name or path that is not a string; re-export")
        if spec.quantization is not None and not isinstance(spec.quantization, dict):
            raise BundleError(f"manifest entry models.{role}.quantization is malformed; re-export")
        if spec.num_layers < 1 or len(spec.kv_inputs) != spec.num_layers or len(spec.kv_outputs) != spec.num_layers:
            raise BundleError(f"models.{role}: num_layers={spec.num_layers} but {len(spec.kv_inputs)} KV input "
                              f"pairs and {len(spec.kv_outputs)} output pairs; re-export the bundle")
        if min(spec.num_kv_heads, spec.head_dim, spec.vocab_size, spec.max_positions) < 1:
            raise BundleError(f"models.{role}: sizes must be positive; re-export the bundle")
        if spec.kv_cache not in ("concat", "static"):
            raise BundleError(f"models.{role}: unknown kv_cache {spec.kv_cache!r} (concat or static); "
                              "upgrade ortspec or re-export")
        needed = ([spec.seqlens_k, spec.total_sequence_length] if spec.kv_cache == "static"
                  else [spec.attention_mask])
        if not all(needed):
            raise BundleError(f"models.{role}: the {spec.kv_cache} cache needs its length inputs named; re-export")
        if spec.dtype not in ("float32", "float16"):
            raise BundleError(f"models.{role}: unsupported dtype {spec.dtype!r} (float32 or float16)")
        if spec.rows not in (None, "invariant") or (spec.rows and spec.kv_cache != "static"):
            raise BundleError(f"models.{role}: rows must be \"invariant\" (a fused graph's) or absent, got "
                              f"{spec.rows!r}; upgrade ortspec or re-export")
        return spec

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kv_inputs"] = [list(p) for p in self.kv_inputs]
        d["kv_outputs"] = [list(p) for p in self.kv_outputs]
        return d

    @property
    def files(self) -> list[str]:
        return [f for f in (self.path, self.data) if f]

    @property
    def output_vocab(self) -> int:
        """Width of the logits the runtime hands out (the full vocabulary for a vocab-subset draft)."""
        return int(self.vocab_subset["full_size"]) if self.vocab_subset else self.vocab_size


def _vocab_subset(value, width: int, role: str) -> dict | None:
    """Validate a manifest's vocab_subset: sorted, disjoint ranges inside full_size covering ``width`` ids."""
    if value is None:
        return None
    bad = BundleError(f"models.{role}.vocab_subset is malformed; re-export the bundle")
    if not isinstance(value, dict) or not isinstance(value.get("ranges"), list):
        raise bad
    full = value.get("full_size")
    if not is_int(full, 1):
        raise bad
    ranges, last, count = [], 0, 0
    for r in value["ranges"]:
        if (not isinstance(r, list) or len(r) != 2 or any(not is_int(x) for x in r)
                or not last <= r[0] < r[1] <= full):
            raise bad
        ranges.append([r[0], r[1]])
        last, count = r[1], count + r[1] - r[0]
    if count != width:
        raise BundleError(f"models.{role}.vocab_subset covers {count} ids but the graph has {width} logits; "
                          "re-export the bundle")
    return {"full_size": full, "ranges": ranges}


def _top_logits(value, role: str) -> dict | None:
    """Validate a manifest's top_logits: the names of the graph's TopK input and outputs."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"k", "values", "ids"} or \
            not all(isinstance(v, str) and v for v in value.values()):
        raise BundleError(f"models.{role}.top_logits is malformed (want the names k, values, ids); "
                          "re-export the bundle")
    return dict(value)


def _logits_norm(value, top, role: str) -> dict | None:
    """Validate a manifest's logits_norm: the names of its input and output and its block size (the graph reads
    the row's largest logit from its TopK, so it comes with top_logits)."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"scale", "norm", "block"} or not top or \
            not all(isinstance(value[n], str) and value[n] for n in ("scale", "norm")) or \
            isinstance(value["block"], bool) or not isinstance(value["block"], int) or value["block"] < 1:
        raise BundleError(f"models.{role}.logits_norm is malformed (want the names scale, norm and a block size "
                          "of at least 1, beside top_logits); re-export the bundle")
    return dict(value)


@dataclass(frozen=True)
class Bundle:
    """A loaded, validated bundle directory."""

    root: Path
    manifest: dict
    target: ModelSpec
    draft: ModelSpec | None
    tokenizer_file: Path | None
    tokenizer_config: dict = field(default_factory=dict)
    generation_config: dict = field(default_factory=dict)
    # the drafter and draft length decoding uses when a call leaves them out (the manifest's "decoding", which a
    # recipe sets; either may be absent: then "model" and 4)
    decoding: dict = field(default_factory=dict)

    def file(self, rel: str) -> Path:
        return safe_path(self.root, rel)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.target.special_ids.get("eos_token_ids") or []
        return [int(i) for i in ids]

    @property
    def default_drafter(self) -> str:
        """The drafter of a generation that names none: the manifest's "decoding", else "model" (a bundle without
        a draft model: "prompt_lookup", n-gram lookups sized by the cost model)."""
        return self.decoding.get("drafter", DEFAULT_DRAFTER if self.draft is not None else "prompt_lookup")

    @property
    def default_num_draft_tokens(self) -> int | str:
        """The draft length of a generation that gives none: the manifest's "decoding", else 4 ("auto" for a
        bundle without a draft model: its lookups are drafted where the cost model says they pay)."""
        if "num_draft_tokens" in self.decoding:
            return self.decoding["num_draft_tokens"]
        return DEFAULT_NUM_DRAFT_TOKENS if self.draft is not None or "drafter" in self.decoding else "auto"

    @property
    def sampling_defaults(self) -> dict:
        """The sampling settings of generation_config.json that ortspec uses when a call leaves them out
        (do_sample, temperature, top_k, top_p, repetition_penalty); values of the wrong type are ignored."""
        cfg = self.generation_config
        kinds = {"do_sample": (bool,), "temperature": (int, float), "top_k": (int,), "top_p": (int, float),
                 "repetition_penalty": (int, float)}
        out = {}
        for key, types in kinds.items():
            value = cfg.get(key)
            if isinstance(value, types) and (key == "do_sample" or not isinstance(value, bool)):
                out[key] = value
        return out


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return h.hexdigest()
            h.update(block)


def safe_path(root: Path, rel: str) -> Path:
    """Resolve a manifest path, refusing anything that leaves the bundle."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or "\\" in rel or "\0" in rel:
        raise BundleError(f"manifest path {rel!r} must be a relative path inside the bundle")
    if any(part == ".." for part in Path(rel).parts):
        raise BundleError(f"manifest path {rel!r} escapes the bundle directory ('..' is not allowed)")
    full = (root / rel).resolve()
    base = root.resolve()
    if base != full and base not in full.parents:
        raise BundleError(f"manifest path {rel!r} resolves outside the bundle (symlink to {full}); "
                          "bundles must be self-contained")
    return full


def write_manifest(root: Path, manifest: dict) -> None:
    from . import __version__
    manifest = dict(manifest, format=FORMAT, format_version=FORMAT_VERSION, ortspec_version=__version__)
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def is_bundle(path: Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def load_bundle(root: str | os.PathLike, verify: str = "full") -> Bundle:
    """Read and validate a bundle. verify: "full" (sha256), "size" or "none"."""
    if verify not in ("full", "size", "none"):
        raise ValueError(f"verify must be 'full', 'size' or 'none', got {verify!r}")
    root = Path(root)
    if not root.is_dir():
        raise BundleError(f"bundle directory {str(root)!r} does not exist; create one with `ortspec export`")
    mpath = root / MANIFEST
    if not mpath.is_file():
        raise BundleError(f"{str(root)!r} is not an ortspec bundle (no {MANIFEST}); "
                          "create one with `ortspec export --out DIR`")
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{mpath} is not valid JSON ({exc}); re-export the bundle") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{mpath} is not an ortspec manifest (format field missing); re-export the bundle")
    version = manifest.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        made = manifest.get("ortspec_version", "a newer release")
        raise BundleError(f"bundle format version {version} was written by ortspec {made}; this ortspec reads "
                          f"versions {READABLE_VERSIONS[0]}-{FORMAT_VERSION}: upgrade ortspec "
                          "(pip install -U ortspec)")
    if version not in READABLE_VERSIONS or isinstance(version, bool):
        raise BundleError(f"bundle format version {version!r} is not supported by this ortspec "
                          f"(reads {READABLE_VERSIONS[0]}-{FORMAT_VERSION}); re-export it or upgrade ortspec")
    models = manifest.get("models")
    if not isinstance(models, dict) or not models.get("target"):
        raise BundleError(f"{mpath} has no models.target entry; re-export the bundle")
    target = ModelSpec.from_dict(models["target"], "target")
    draft = ModelSpec.from_dict(models["draft"], "draft") if models.get("draft") else None
    for role, spec in (("target", target), ("draft", draft)):
        if spec is not None:
            _check_files(root, role, spec, verify)
    tok = manifest.get("tokenizer") or None
    if tok is not None and not isinstance(tok, dict):
        raise BundleError(f"{mpath}: the tokenizer entry is malformed; re-export the bundle")
    tokenizer_file = None
    tok_config: dict = {}
    gen_config: dict = {}
    if tok:
        tokenizer_file = safe_path(root, tok.get("file", "tokenizer.json"))
        if not tokenizer_file.is_file():
            raise BundleError(f"tokenizer file {tokenizer_file.name} is missing from {root}; re-export the bundle")
        tok_config = _read_json(root, "tokenizer_config.json")
    gen_config = _read_json(root, "generation_config.json")
    decoding = _decoding(manifest.get("decoding", {}), draft is not None, mpath)
    bundle = Bundle(root, manifest, target, draft, tokenizer_file, tok_config, gen_config, decoding)
    if draft is not None:
        check_compatible(bundle)
    return bundle


def _decoding(value, has_draft: bool, mpath: Path) -> dict:
    """The manifest's decoding defaults, checked (``config.check_decoding``) against the bundle's models."""
    try:
        return check_decoding(value, has_draft)
    except ValueError as exc:
        raise BundleError(f"{mpath}: the decoding entry does not fit this bundle ({exc}); fix it or re-export "
                          "the bundle") from None


def _read_json(root: Path, name: str) -> dict:
    path = root / name
    if not path.is_file():
        return {}
    safe_path(root, name)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON ({exc}); re-export the bundle") from None
    return data if isinstance(data, dict) else {}


def _check_files(root: Path, role: str, spec: ModelSpec, verify: str) -> None:
    for rel in spec.files:
        path = safe_path(root, rel)
        name = Path(rel).name
        if not path.is_file():
            raise BundleError(f"{role} file {rel} is missing; re-export the bundle")
        if name not in spec.sha256:
            raise BundleError(f"manifest has no sha256 for {role} file {rel}; re-export the bundle")
        if verify == "none":
            continue
        expected = spec.size_bytes.get(name)
        actual = path.stat().st_size
        if expected is not None and int(expected) != actual:
            raise BundleError(f"{role} file {rel} is {actual} bytes but the manifest says {expected} "
                              "(truncated or replaced); re-export the bundle")
        if verify == "full" and not _known_good(root, rel, path, spec.sha256[name]):
            if sha256_file(path) != spec.sha256[name]:
                raise BundleError(f"{role} file {rel} does not match its sha256 in the manifest "
                                  "(corrupted or modified); re-export the bundle")
            _remember_good(root, rel, path, spec.sha256[name])


VERIFIED = ".ortspec-verified.json"  # sha256 results keyed by file identity, to skip re-hashing


def _identity(path: Path, digest: str) -> str:
    st = path.stat()
    return f"{digest}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def _known_good(root: Path, rel: str, path: Path, digest: str) -> bool:
    try:
        return json.loads((root / VERIFIED).read_text()).get(rel) == _identity(path, digest)
    except (OSError, ValueError, AttributeError):
        return False


def _remember_good(root: Path, rel: str, path: Path, digest: str) -> None:
    """Record a verified file; silently skipped when the bundle is read-only."""
    try:
        memo = json.loads((root / VERIFIED).read_text()) if (root / VERIFIED).is_file() else {}
        memo = memo if isinstance(memo, dict) else {}
        memo[rel] = _identity(path, digest)
        tmp = root / (VERIFIED + ".tmp")
        tmp.write_text(json.dumps(memo))
        tmp.replace(root / VERIFIED)
    except (OSError, ValueError):
        pass


def vocab_difference(vocab_a: dict[str, int], vocab_b: dict[str, int]) -> str | None:
    """Describe the first id at which two token->id maps differ, or None."""
    inv_a = {i: t for t, i in vocab_a.items()}
    inv_b = {i: t for t, i in vocab_b.items()}
    shared = min(len(inv_a), len(inv_b))
    for i in range(max(len(inv_a), len(inv_b))):
        a, b = inv_a.get(i), inv_b.get(i)
        if a != b:
            if i >= shared and (a is None or b is None):
                continue  # one vocabulary is only longer: padded/extra ids are allowed
            return f"token id {i} is {a!r} in the target and {b!r} in the draft"
    return None


def special_difference(target: dict, draft: dict) -> str | None:
    for key in ("eos_token_ids", "bos_token_id", "pad_token_id"):
        a, b = target.get(key), draft.get(key)
        if a is not None and b is not None and a != b:
            return f"{key} is {a} in the target and {b} in the draft"
    return None


def check_compatible(bundle: Bundle) -> None:
    """Refuse a draft whose tokenizer differs from the target's."""
    draft = bundle.draft
    assert draft is not None
    problem = special_difference(bundle.target.special_ids, draft.special_ids)
    if problem is None and draft.tokenizer and bundle.tokenizer_file is not None:
        problem = vocab_difference(_vocab(bundle.tokenizer_file), _vocab(bundle.file(draft.tokenizer)))
    if problem:
        raise IncompatibleModelsError(f"draft and target do not share a tokenizer: {problem}; "
                                      "pick a draft from the same model family")


def _vocab(path: Path) -> dict[str, int]:
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    except Exception as exc:  # tokenizers raises plain Exception subclasses
        raise BundleError(f"cannot read tokenizer {path}: {exc}; re-export the bundle") from None
