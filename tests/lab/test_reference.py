"""`concord sim`'s all-reduce reference run: built from any run config — one that sets consensus
control, a codec, hyperparameters or overlap explicitly, and a run's own config.toml, which sets
every key — and run to the comparison with exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from concord.core.config import load_config, reference_config


def test_the_reference_keeps_the_budget_and_drops_the_algorithm() -> None:
    cfg = load_config(
        None,
        [
            "peers=16", "topology=torus", "control.mode=constant", "control.factor=0.25",
            "algorithm=choco", "compression.codec=topk", "hyper.gamma=0.5", "epochs=3",
            "seed=7", "dataset.samples=2000", "optim.lr=0.05",
        ],
        environ={},
    )  # fmt: skip
    ref = reference_config(cfg, "allreduce")
    assert ref.algorithm == "allreduce"
    assert (ref.peers, ref.epochs, ref.seed, ref.topology) == (16, 3.0, 7, "torus")
    assert (ref.dataset.samples, ref.optim.lr) == (2000, 0.05)
    assert ref.compression.codec == "none"
    assert ref.controlled_phases() == []
    assert ref.name == "allreduce-reference"


def _sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "concord.lab.cli", "sim", "--engine", "vectorized", "--quiet",
         "--set", "peers=4", "--set", "epochs=1", "--set", "dataset.samples=2000", *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip


def test_a_controlled_run_and_its_config_toml_end_with_the_comparison(tmp_path: Path) -> None:
    first = _sim("--set", "control.mode=adaptive", "--out", "a", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Final accuracy next to the reference" in first.stdout
    # the run's own config.toml sets every key, control.mode included: re-runnable as is
    again = subprocess.run(
        [sys.executable, "-m", "concord.lab.cli", "sim", "a/config.toml", "--quiet", "--out",
         "b"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Final accuracy next to the reference" in again.stdout
    assert (tmp_path / "b" / "reference" / "summary.json").is_file()
