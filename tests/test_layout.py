"""The code's shape, as docs/design.md states it: no import cycle, modules of one purpose (a one-line docstring,
at most ~500 lines), no reference-count tricks, no probing of the project's own objects."""
from __future__ import annotations

import ast
from pathlib import Path
import re

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"ortspec": ROOT / "runtime", "ortspec.export": ROOT / "export",
            "ortspec.export.pairs": ROOT / "models"}  # (the recipes: data, and a docstring)
MAX_LINES = 500
# modules allowed past MAX_LINES, and why
LONGER: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for name, root in PACKAGES.items():
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if name == "ortspec" and parts[:1] == ["export"]:
                continue
            out[".".join([name, *parts])] = path
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``module`` imports anywhere in its body (function-level imports too; not imports made only
    for type checking)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    skip = set()
    for node in ast.walk(tree):  # ``if TYPE_CHECKING:`` blocks
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            skip.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def test_no_import_cycles():
    modules = _modules()
    graph = {m: _imports(m, p, set(modules)) for m, p in modules.items()}
    # a package's __init__ re-exporting its modules is not a cycle through the package: edges into a package
    # stand for the submodule named, so drop edges from a submodule to its own package's __init__
    for m in graph:
        graph[m] = {t for t in graph[m] if not (m.startswith(t + ".") and modules[t].name == "__init__.py")}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_modules_are_short_and_say_what_they_are_for():
    for module, path in _modules().items():
        text = path.read_text()
        doc = ast.get_docstring(ast.parse(text))
        assert doc and doc.strip().split("\n")[0].strip(), f"{module}: no one-line purpose at its top"
        lines = text.count("\n")
        assert lines <= MAX_LINES or module in LONGER, f"{module}: {lines} lines (at most {MAX_LINES})"


def test_no_reference_counts_and_no_probing_of_our_own_objects():
    """Buffers are leased (arena.RoundPool), never handed out by reference count; what the code asks of its own
    objects is declared on their base classes, never probed. (verify.Uniforms delegates the rest of NumPy's
    Generator interface to it: that is NumPy's, not a probe.)"""
    for module, path in _modules().items():
        text = path.read_text()
        assert "getrefcount" not in text, module
        for m in re.finditer(r"\b(hasattr|getattr)\(", text):
            line = text[:m.start()].count("\n") + 1
            source = text.split("\n")[line - 1]
            allowed = module == "ortspec.verify" and "self.rng" in source
            assert allowed or module.startswith("ortspec.export"), f"{module}:{line}: {source.strip()}"


def test_every_package_is_declared_for_the_wheel():
    """pyproject.toml lists packages by name: a new subpackage missing there would be left out of the wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert found == declared, f"missing from pyproject.toml: {sorted(found - declared)}; " \
                              f"declared but absent: {sorted(declared - found)}"
