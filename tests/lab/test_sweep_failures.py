"""``concord sweep`` says when runs failed and exits non-zero: real tiny sweeps (the vectorized
engine, one epoch) whose cells fail at run time in a dataset plug-in that raises for some seeds,
through the real command in a subprocess."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

PLUGIN = """
import numpy as np


def load(seed, num_samples=None):
    if seed in (1, 2):
        raise RuntimeError(f"no data for seed {seed}")
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples or 200, 8)).astype(np.float32)
    y = (x[:, :4].argmax(1)).astype(np.int64)
    return {"x_train": x[:160], "y_train": y[:160], "x_test": x[160:], "y_test": y[160:],
            "num_classes": 4, "name": "flaky"}
"""


def _sweep(tmp_path: Path, seeds: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "flaky_data.py").write_text(PLUGIN)
    out = tmp_path / f"sweep-{seeds.replace(',', '')}"
    sets = ["peers=2", "epochs=1", "dataset.name=flaky_data:load", "dataset.samples=200",
            "model=mlp", "model.hidden=[8]"]  # fmt: skip
    command = [sys.executable, "-m", "concord.lab.cli", "--plugin-path", str(plugins), "sweep",
               "--factors", "none", "--seeds", seeds, "--jobs", "1", "--out", str(out),
               *(a for s in sets for a in ("--set", s))]  # fmt: skip
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    return done, out


def _status(out: Path) -> dict[str, str]:
    with open(out / "table.csv", newline="", encoding="utf-8") as f:
        return {r["seed"]: r["status"] for r in csv.DictReader(f)}


def test_a_sweep_whose_every_run_failed_exits_1_and_says_so(tmp_path: Path) -> None:
    done, out = _sweep(tmp_path, "1,2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _status(out) == {"1": "error", "2": "error"}
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: every run failed (2)"), last
    assert "RuntimeError: no data for seed 1" in last
    assert str(out / "table.csv") in last
    assert (out / "table.md").is_file()  # the tables are written all the same


def test_a_sweep_with_some_failed_runs_exits_1_naming_how_many(tmp_path: Path) -> None:
    done, out = _sweep(tmp_path, "0,1")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _status(out) == {"0": "ok", "1": "error"}
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 1 of 2 runs failed"), last
    assert "_s1: RuntimeError: no data for seed 1" in last
    assert (out / "runs" / "dec-phase-1_none_ring_s0" / "summary.json").is_file()


def test_a_sweep_whose_runs_all_succeed_exits_0(tmp_path: Path) -> None:
    done, out = _sweep(tmp_path, "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _status(out) == {"0": "ok"}
    assert "failed" not in done.stderr
