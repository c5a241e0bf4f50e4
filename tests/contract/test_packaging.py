"""The wheel is one top-level package, ``concord``, with everything it needs.

The repository keeps one folder per layer (core/, peer/, …) mapped onto ``concord.*`` by
pyproject.toml's ``[tool.setuptools]`` packages and package-dir. That mapping fails silently: a
subpackage missing from the list is left out of the wheel (while an editable install still finds
it), and a mapping mistake could install ``core`` as a top-level package. So: build the wheel from
a copy of the sources (``pip wheel --no-deps --no-build-isolation``: nothing is downloaded, the
repository gets no build/ directory) and check its contents, and import Concord from outside the
repository, both from the unpacked wheel and from the editable install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
NAME = PYPROJECT["project"]["name"]
VERSION = PYPROJECT["project"]["version"]
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]
# files the package needs besides its modules (package-data)
DATA_FILES = (
    "concord/py.typed",
    "concord/protos/data_plane.proto",
    "concord/core/data/digits.npz",
)
LAYER_FOLDERS = ("core", "protos", "peer", "orchestrator", "sim", "lab", "runtime")


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would put the repository on sys.path."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME"}}
    return {**env, "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1", **extra}


def _tree_packages(root: Path) -> dict[str, Path]:
    """Every package (folder with an __init__.py) under the mapped folders, by installed name."""
    found = {}
    for package, folder in PACKAGE_DIR.items():
        base = root / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            if "__pycache__" not in rel:
                found[".".join((package, *rel))] = init.parent
    return found


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what the build reads: pyproject, README and the mapped folders."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    for folder in set(PACKAGE_DIR.values()):
        shutil.copytree(
            ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    return src


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    proc = subprocess.run(
        [*pip, "-w", str(out), str(source)],
        env=_clean_env(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def test_pyproject_lists_every_package_of_the_tree() -> None:
    """A new subpackage must be added to [tool.setuptools] packages, or the wheel lacks it."""
    assert set(SETUPTOOLS["packages"]) == set(_tree_packages(ROOT))
    assert all(p == NAME or p.startswith(f"{NAME}.") for p in SETUPTOOLS["packages"])


def test_every_folder_with_modules_is_a_package() -> None:
    """A folder of modules without __init__.py would be a namespace package: never packaged."""
    for folder in {*PACKAGE_DIR.values()}:
        for module in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in module.parts:
                continue
            assert (module.parent / "__init__.py").is_file(), (
                f"{module.parent.relative_to(ROOT)} holds modules but no __init__.py"
            )


def test_wheel_holds_only_the_concord_package(names: set[str]) -> None:
    dist_info = f"{NAME}-{VERSION}.dist-info/"
    strays = sorted(n for n in names if not n.startswith((f"{NAME}/", dist_info)))
    assert strays == [], f"files outside {NAME}/ in the wheel: {strays[:10]}"
    assert f"{dist_info}METADATA" in names


def test_wheel_holds_every_module_and_data_file(source: Path, names: set[str]) -> None:
    missing = [f for f in DATA_FILES if f not in names]
    for package, folder in _tree_packages(source).items():
        prefix = package.replace(".", "/")
        shipped = (p.name for p in folder.iterdir() if p.suffix in {".py", ".pyi", ".typed"})
        missing += [f"{prefix}/{n}" for n in shipped if f"{prefix}/{n}" not in names]
    assert missing == []


def test_wheel_imports_outside_the_repository(wheel: Path, tmp_path: Path) -> None:
    """The unpacked wheel (a pure-Python wheel installs by unpacking) imports as concord.*, with
    its package data, and puts no layer folder (core, peer, …) at the top level."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    code = (
        "import importlib.util, pathlib, sys\n"
        "import concord, concord.peer, concord.sim\n"
        "from concord.core.data.datasets import read_digits\n"
        f"site = pathlib.Path({str(site)!r})\n"
        "for m in (concord, concord.peer, concord.sim):\n"
        "    assert site in pathlib.Path(m.__file__).parents, m.__file__\n"
        "assert read_digits()[0].shape == (1797, 64)\n"
        f"for name in {LAYER_FOLDERS!r}:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    assert spec is None or site not in pathlib.Path(spec.origin or '').parents, name\n"
    )
    proc = _python(code, cwd=tmp_path, PYTHONPATH=str(site))
    assert proc.returncode == 0, proc.stderr


def test_installed_concord_imports_outside_the_repository(tmp_path: Path) -> None:
    """The venv's install (editable here) gives ``concord.*`` and nothing else: ``import core``
    fails outside the repository (it would work if the repository root were on sys.path)."""
    ok = _python("import concord, concord.peer, concord.sim", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    bad = _python("import core", cwd=tmp_path)
    assert bad.returncode != 0
    assert "ModuleNotFoundError: No module named 'core'" in bad.stderr
    code = (
        "import importlib.util, pathlib\n"
        f"root = pathlib.Path({str(ROOT)!r})\n"
        f"for name in {LAYER_FOLDERS!r}:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    assert spec is None or root not in pathlib.Path(spec.origin or '').parents, name\n"
    )
    layers = _python(code, cwd=tmp_path)
    assert layers.returncode == 0, layers.stderr
