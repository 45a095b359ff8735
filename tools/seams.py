#!/usr/bin/env python3
"""Where the project's modules meet other than through their interfaces: import circles (counting every import,
those made only for type checking and inside functions too), reaches into another object's private members
(``obj._name`` where ``obj`` is not ``self``, ``cls`` or ``super()``) and imports of another module's private names
(``from x import _name``).

    python tools/seams.py            # counts, then each place
    python tools/seams.py --counts   # counts only

tests/test_layout.py holds the project to none of each, with the exceptions it names.
"""
from __future__ import annotations

import argparse
import ast
from pathlib import Path
import sys

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"ortspec": ROOT / "runtime", "ortspec.export": ROOT / "export",
            "ortspec.export.pairs": ROOT / "models"}  # (the recipes: data, and a docstring)


def modules() -> dict[str, Path]:
    """Every module of the package under its import name."""
    out = {}
    for name, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
            if name == "ortspec" and parts[:1] == ["export"]:
                continue
            out[".".join([name, *parts])] = path
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def imports(module: str, path: Path, known: set[str], type_checking: bool = True) -> dict[str, list[str]]:
    """Project modules ``module`` imports anywhere in its body -> the names it takes from each (``*`` for the
    module itself). ``type_checking=False`` leaves out imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    skip = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                skip.update(id(n) for n in ast.walk(node))
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                target = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            pairs = [(f"{target}.{a.name}", a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            pairs = [(a.name, "*") for a in node.names]
        else:
            continue
        for full, taken in pairs:
            name = full
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.setdefault(name, []).append("*" if name == full else taken)
    return found


def circles(type_checking: bool = True) -> list[list[str]]:
    """One circle per strongly connected group of modules (a package's __init__ re-exporting its own submodules
    is not a circle through the package)."""
    mods = modules()
    graph = {m: set(imports(m, p, set(mods), type_checking)) for m, p in mods.items()}
    for m in graph:
        graph[m] = {t for t in graph[m] if not (m.startswith(t + ".") and mods[t].name == "__init__.py")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for t in sorted(graph[m]):
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            group = []
            while True:
                t = stack.pop()
                group.append(t)
                if t == m:
                    break
            if len(group) > 1:
                groups.append(sorted(group))
    sys.setrecursionlimit(10000)
    for m in sorted(graph):
        if m not in index:
            visit(m)
    return groups


def private_reaches() -> list[tuple[str, int, str]]:
    """(module, line, source) of every ``obj._name`` whose ``obj`` is not ``self`` or ``cls``."""
    out = []
    for module, path in modules().items():
        text = path.read_text()
        lines = text.split("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super":
                    continue  # the object's own class chain
                out.append((module, node.lineno, f"{ast.unparse(owner)}.{node.attr}: {lines[node.lineno - 1].strip()}"))
    return out


def private_imports() -> list[tuple[str, str, str]]:
    """(module, imported module, name) of every private name imported from another module."""
    mods = modules()
    return [(m, target, name) for m, p in mods.items() for target, names in imports(m, p, set(mods)).items()
            for name in names if _private(name)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", action="store_true", help="print the three counts only")
    args = ap.parse_args()
    groups, reaches, taken = circles(), private_reaches(), private_imports()
    print(f"circles {len(groups)}, private reaches {len(reaches)}, private imports {len(taken)}")
    if not args.counts:
        for g in groups:
            print("circle: " + " <-> ".join(g))
        for m, line, src in reaches:
            print(f"reach: {m}:{line}: {src}")
        for m, target, name in taken:
            print(f"import: {m} takes {target}.{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
