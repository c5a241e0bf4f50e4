"""docs/api.md runs as written, and `concord` exports what it promises."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import concord

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "api.md"


def python_cells() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def test_the_page_has_cells() -> None:
    assert len(python_cells()) >= 4


def test_the_notebook_cells_run_in_order(tmp_path: Path) -> None:
    """All cells in one interpreter, as a notebook runs them (cwd: a scratch directory)."""
    script = "\n\n".join(python_cells())
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "runs" / "notebook" / "summary.json").is_file()
    problems = [line.split(":")[0] for line in out.stdout.splitlines()[-3:]]
    assert problems == ["peers", "algorithm", "optim.lr"]  # the ConfigError cell, every key


@pytest.mark.parametrize("name", concord.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert getattr(concord, name) is not None


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'simulat'"):
        _ = concord.simulat  # type: ignore[attr-defined]


def test_errors_share_one_root() -> None:
    errors = [getattr(concord, n) for n in concord.__all__ if n.endswith("Error")]
    assert len(errors) >= 15
    assert all(issubclass(e, concord.ConcordError) for e in errors)
    assert issubclass(concord.ConfigError, ValueError)
    assert issubclass(concord.UnknownNameError, KeyError)


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert concord.__version__ == version("concord")


def test_all_is_the_lazy_names_the_version_and_every_error() -> None:
    """`__all__` lists each lazily loaded name and re-exports `concord.errors.__all__` (one list
    of exceptions, not a copy that drifts)."""
    from concord import errors

    assert sorted(concord.__all__) == sorted([*concord._LAZY, "__version__", *errors.__all__])
    assert len(concord.__all__) == len(set(concord.__all__))
