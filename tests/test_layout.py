"""The code's shape, as docs/design.md states it: no import cycle (counting every import), no reach into another
object's private members or another module's private names, modules of one purpose (a one-line docstring, at most
~500 lines), no reference-count tricks, no probing of the project's own objects."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
import re

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500
# modules allowed past MAX_LINES, and why
LONGER: dict[str, str] = {}


def _seams():
    """tools/seams.py, which finds the modules, their imports, circles and private reaches."""
    spec = importlib.util.spec_from_file_location("seams", ROOT / "tools" / "seams.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SEAMS = _seams()
_modules = SEAMS.modules


def test_no_import_cycles():
    """Counting every import: at module level, inside functions, and those made only for type checking."""
    assert SEAMS.circles(type_checking=True) == [], "import circles"


def test_no_module_reaches_into_another_objects_private_members():
    assert SEAMS.private_reaches() == []


def test_no_module_imports_another_modules_private_names():
    assert SEAMS.private_imports() == []


def test_the_seam_checks_catch_what_they_look_for(tmp_path, monkeypatch):
    """A negative control: a circle made only for type checking, a reach and a private import are found."""
    (tmp_path / "__init__.py").write_text('"""A package."""\n')
    (tmp_path / "a.py").write_text('"""A."""\nfrom .b import _hidden\n\n\ndef f(x):\n    return x._inside\n')
    (tmp_path / "b.py").write_text('"""B."""\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
                                   '    from .a import f\n_hidden = 1\n')
    monkeypatch.setattr(SEAMS, "PACKAGES", {"toy": tmp_path})
    assert SEAMS.circles(type_checking=True) == [["toy.a", "toy.b"]]
    assert SEAMS.circles(type_checking=False) == []
    assert [(m, src.split(":")[0]) for m, _, src in SEAMS.private_reaches()] == [("toy.a", "x._inside")]
    assert SEAMS.private_imports() == [("toy.a", "toy.b", "_hidden")]


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
