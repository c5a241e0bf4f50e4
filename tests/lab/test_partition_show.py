"""`concord partition show` and `concord --plugin-path`: the per-peer table, the digest, the heat
map, user partition schemes found through the plug-in path, and clear errors."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from concord.core.plugins import PLUGIN_PATH_ENV
from concord.lab.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SMALL = ["--set", "dataset.samples=2000"]  # mnist1d: 1600 training samples
CONFIG = """\
peers = 8
seed = 0

[dataset]
name = "mnist1d"

[partition]
scheme = "dirichlet"
alpha = 0.1
"""
PLUGIN_MODULE = "concord_test_halves"  # a name no other test imports
PARTITION_MODULE = """\
import numpy as np


def by_halves(labels, n, seed):
    order = np.argsort(labels, kind="stable")
    return np.array_split(order, n)
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """CliRunner runs in-process: the command's changes to the environment, sys.path and
    sys.modules are undone after each test; the working directory is a scratch one."""
    monkeypatch.setenv(PLUGIN_PATH_ENV, "")  # restored (here: removed) afterwards
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    yield
    sys.modules.pop(PLUGIN_MODULE, None)


def _show(*args: str) -> Result:
    return CliRunner().invoke(main, [*args], catch_exceptions=False)


def _rows(output: str) -> list[list[str]]:
    """The table's peer rows (a peer id, then the numeric columns)."""
    return [line.split() for line in output.splitlines() if re.match(r"^\s*\d+\s+\d+\s", line)]


def _digest(output: str) -> str:
    found = re.findall(r"^sha256 ([0-9a-f]{64})$", output, flags=re.M)
    assert len(found) == 1, output
    return str(found[0])


def test_show_prints_peers_digest_and_writes_a_png(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text(CONFIG, encoding="utf-8")
    r = _show("partition", "show", str(config), *SMALL)
    assert r.exit_code == 0, r.output
    rows = _rows(r.output)
    assert [int(row[0]) for row in rows] == list(range(8))
    sizes = [int(row[1]) for row in rows]
    assert sum(sizes) == 1600  # the training split of 2000 mnist1d samples
    counts = [[int(v) for v in row[5:]] for row in rows]
    assert all(len(c) == 10 and sum(c) == s for c, s in zip(counts, sizes, strict=True))
    assert re.search(r"^\s*all\s+1600\s", r.output, flags=re.M)
    assert "dirichlet (alpha=0.1)" in r.output
    assert "digests match" in r.output
    png = tmp_path / "partition.png"  # the default, in the working directory
    data = png.read_bytes()
    assert len(data) > 0
    assert data.startswith(PNG_MAGIC)

    again = _show("partition", "show", str(config), *SMALL, "--png", str(tmp_path / "b.png"))
    assert again.exit_code == 0, again.output
    assert _digest(again.output) == _digest(r.output)
    other = _show("partition", "show", str(config), *SMALL, "--set", "seed=1", "--png", "c.png")
    assert other.exit_code == 0, other.output
    assert _digest(other.output) != _digest(r.output)


def test_bad_config_is_a_clear_error() -> None:
    r = CliRunner().invoke(main, ["partition", "show", "--set", "peers=0"])
    assert r.exit_code == 2
    assert "peers" in r.output
    assert not Path("partition.png").exists()


def test_plugin_path_finds_a_user_partition_scheme(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / f"{PLUGIN_MODULE}.py").write_text(PARTITION_MODULE, encoding="utf-8")
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not where the module is: only --plugin-path finds it
    args = ["partition", "show", *SMALL, "--set", "peers=4", "--png", "p.png"]
    spec = f"partition.scheme={PLUGIN_MODULE}:by_halves"
    missing = _show(*args, "--set", spec)
    assert missing.exit_code == 2
    assert f"{PLUGIN_MODULE}:by_halves" in missing.output
    assert "Traceback" not in missing.output

    r = _show("--plugin-path", str(plugins), *args, "--set", spec)
    assert r.exit_code == 0, r.output
    assert os.environ[PLUGIN_PATH_ENV].split(os.pathsep)[0] == str(plugins.resolve())
    rows = _rows(r.output)
    assert [int(row[1]) for row in rows] == [400, 400, 400, 400]
    assert f"{PLUGIN_MODULE}:by_halves" in r.output
    assert (elsewhere / "p.png").read_bytes().startswith(PNG_MAGIC)


def test_plugin_path_prepends_to_the_inherited_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.setenv(PLUGIN_PATH_ENV, "/already/there")
    r = _show("--plugin-path", str(first), "--plugin-path", str(second), "topology", "ring",
              "-n", "4")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert os.environ[PLUGIN_PATH_ENV].split(os.pathsep) == [
        str(first.resolve()),
        str(second.resolve()),
        "/already/there",
    ]


def test_plugin_path_must_be_an_existing_directory(tmp_path: Path) -> None:
    gone = tmp_path / "no-such-dir"
    r = CliRunner().invoke(main, ["--plugin-path", str(gone), "partition", "show"])
    assert r.exit_code != 0
    assert str(gone) in r.output
    assert "does not exist" in r.output
    assert os.environ[PLUGIN_PATH_ENV] == ""
