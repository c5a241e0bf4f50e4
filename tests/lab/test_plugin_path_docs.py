"""docs/api.md's plug-in commands run as written: the page's ``my_study/writers.py`` under a
home directory, its config in another directory, and ``concord --plugin-path ~ …`` (the
directory that contains the package) run by bash, which expands the ``~``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")

# the page names this scheme but leaves its code to the reader: one writer's samples per peer
PARTITIONS = """
import numpy as np


def by_writer(labels, n, *, seed, groups=None):
    writers = np.unique(groups)
    return [np.flatnonzero(np.isin(groups, writers[i::n])) for i in range(n)]
"""
SMALL = ["--set", "peers=2", "--set", "epochs=1", "--set", "dataset.samples=400",
         "--set", "model=mlp", "--set", "model.hidden=[16]"]  # fmt: skip


def _block(language: str, marker: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", PAGE, flags=re.S)
    return next(b for b in blocks if marker in b)


def _command(start: str) -> str:
    line = next(ln for ln in _block("bash", start).splitlines() if ln.startswith(start))
    assert "--plugin-path ~ " in line  # the directory holding my_study/, not my_study itself
    return line


def _study(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    home = tmp_path / "home"
    (home / "my_study").mkdir(parents=True)
    (home / "my_study" / "writers.py").write_text(_block("python", "# my_study/writers.py"))
    (home / "my_study" / "partitions.py").write_text(PARTITIONS)
    work = tmp_path / "work"  # not the home directory: only --plugin-path finds my_study
    work.mkdir()
    (work / "run.toml").write_text(_block("toml", 'name = "my_study.writers:load"'))
    # the page's `concord` is the one installed beside this interpreter (CI runs the suite
    # with the venv's python, without activating the venv)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return work, {**os.environ, "HOME": str(home), "PATH": path}


def test_the_pages_sim_command_finds_the_plug_in(tmp_path: Path) -> None:
    work, env = _study(tmp_path)
    command = _command("concord --plugin-path ~ sim")
    out = tmp_path / "run"
    extra = [*SMALL, "--quiet", "--reference", "none", "--out", str(out)]
    done = subprocess.run(
        ["bash", "-c", command + ' "$@"', "bash", *extra],
        cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (out / "summary.json").is_file()
    assert '"writers"' in (out / "manifest.json").read_text()  # the plug-in's dataset name


def test_the_pages_partition_show_command_finds_the_scheme(tmp_path: Path) -> None:
    work, env = _study(tmp_path)
    command = _command("concord --plugin-path ~ partition show")
    done = subprocess.run(
        ["bash", "-c", command + ' "$@"', "bash", *SMALL, "--png", str(tmp_path / "p.png")],
        cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "sha256" in done.stdout
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
