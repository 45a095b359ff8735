"""The package as users get it: a wheel and an sdist built from this tree, the wheel installed into a fresh
virtual environment, and the commands run from it with the source tree nowhere on the path."""
from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO


def _run(args, cwd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, **kw)


def _site_dirs() -> list[str]:
    """This interpreter's site-packages directories (a virtual environment's, or the system's)."""
    import site
    import sysconfig
    found = [sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    if sys.prefix == sys.base_prefix:  # the system interpreter: its user site too, where pip may install
        found += site.getsitepackages() + [site.getusersitepackages()]
    return [d for d in found if d and Path(d).is_dir()]


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """(the wheel, the venv's bin directory, a working directory outside the tree)."""
    pytest.importorskip("build")
    work = tmp_path_factory.mktemp("wheel")
    dist = work / "dist"
    got = _run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--sdist", "--outdir", dist, REPO],
               cwd=work)
    assert got.returncode == 0, got.stderr[-2000:]
    wheel = next(dist.glob("ortspec-*.whl"))
    assert next(dist.glob("ortspec-*.tar.gz"))
    venv = work / "venv"
    assert _run([sys.executable, "-m", "venv", venv], cwd=work).returncode == 0
    bin_dir = venv / "bin"
    # The dependencies come from the site-packages of the interpreter running the tests (a virtual environment's
    # own, where the project was installed into one: `--system-site-packages` would see only the base
    # interpreter's); ortspec itself only from the wheel. A path line in a .pth file adds the directory without
    # running the .pth files inside it, so an editable install of the tree stays out of the new environment.
    site = _run([bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=work)
    (Path(site.stdout.strip()) / "_ortspec_test_dependencies.pth").write_text(
        "\n".join(dict.fromkeys(_site_dirs())) + "\n")
    got = _run([bin_dir / "python", "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", wheel],
               cwd=work)
    assert got.returncode == 0, got.stderr[-2000:]
    return wheel, bin_dir, work


def test_the_wheel_carries_the_recipes_and_prompt_sets(wheel_env):
    names = zipfile.ZipFile(wheel_env[0]).namelist()
    for want in ("ortspec/export/pairs/smollm2-135m.toml", "ortspec/export/pairs/qwen2.5-coder.toml",
                 "ortspec/data/dev.jsonl", "ortspec/data/long.jsonl", "ortspec/data/quality.txt",
                 "ortspec/reference.py", "ortspec/export/api.py"):
        assert want in names, want
    # every module of the source tree, subpackages included, is in the wheel
    for root, prefix in ((REPO / "runtime", "ortspec"), (REPO / "export", "ortspec/export")):
        for module in root.rglob("*.py"):
            assert f"{prefix}/{module.relative_to(root).as_posix()}" in names, module


def test_the_installed_package_is_the_wheels(wheel_env):
    from ortspec import __version__
    _, bin_dir, work = wheel_env
    got = _run([bin_dir / "ortspec", "--version"], cwd=work)
    assert got.returncode == 0 and got.stdout.strip() == f"ortspec {__version__}"
    got = _run([bin_dir / "python", "-c", "import ortspec, ortspec.export.recipes as r; "
                "print(ortspec.__file__); print(','.join(r.recipe_names()))"], cwd=work)
    where, names = got.stdout.split()
    assert Path(where).is_relative_to(bin_dir.parent) and not Path(where).is_relative_to(REPO), where
    assert {"smollm2-135m", "qwen2.5-coder"} <= set(names.split(","))


@pytest.mark.slow
def test_recipe_export_and_an_answer_from_the_wheel(wheel_env):
    """The README's first command as a user of the wheel runs it: only ortspec's own lines are printed."""
    _, bin_dir, work = wheel_env
    got = _run([bin_dir / "ortspec", "generate", work / "smol", "--recipe", "smollm2-135m", "--chat",
                "--prompt", "Explain a KV cache in one sentence.", "--max-new-tokens", "12"], cwd=work, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.strip()  # the answer
    lines = [line for line in got.stderr.splitlines() if line.strip()]
    assert lines and all(line.startswith("[ortspec") or line.startswith("ortspec") or " tok/s, " in line
                         for line in lines), lines
