"""Run reports: metrics reading, terminal tables, Table-2 grids, PNG plots of fabricated runs."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from rich.table import Table

from concord.core.records import EvalRecord, RunSummary, StepRecord
from concord.lab.report import (
    CellStats,
    compare_table,
    factor_label,
    final_table,
    grid_layout,
    human_bytes,
    markdown_grid,
)
from concord.runtime.plots import MAX_POINTS, _decimate, write_plots
from concord.runtime.records import read_metrics, run_title

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT_NAMES = ["accuracy.png", "consensus.png", "rounds.png", "bytes.png"]


def _render(table: Table) -> str:
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(table)
    return console.export_text()


def _fabricate_run(run_dir: Path, *, steps: int = 3000, measured: bool = True) -> None:
    """``steps`` steps in 3 phases (version-0 records: the old names); ``measured=False``
    leaves every optional series null and sends no bytes."""
    rng = np.random.default_rng(0)
    lines: list[dict[str, Any]] = []
    rounds_total = 0
    for s in range(steps):
        phase = 1 if s < steps // 2 else (2 if s < 3 * steps // 4 else 3)
        rounds = int(1 + (phase == 1) * rng.integers(0, 4))
        rounds_total += rounds
        xi = math.exp(-s / 1000) * (1 + 0.2 * rng.random())
        lines.append(
            {
                "kind": "step", "step": s, "epoch": s / 100, "phase": phase, "lr": 0.1,
                "loss": 1.0, "train_acc": 0.5, "rounds": rounds,
                "theta": (0.5 * xi if s % 5 == 0 else None) if measured else None,
                "target": (0.4 if phase == 1 else None) if measured else None,
                "xi": xi if measured else None,
                "grad_norm": 1.0,
                "bytes_sent": 4096 * rounds_total if measured else 0,
                "rounds_total": rounds_total,
            }
        )  # fmt: skip
        if measured and s % 250 == 0:
            acc = 0.1 + 0.8 * (1 - math.exp(-s / 800))
            lines.append(
                {
                    "kind": "eval", "step": s, "epoch": s / 100, "acc_avg_model": acc,
                    "loss_avg_model": 1.0, "acc_mean_peer": acc - 0.02,
                    "acc_worst_peer": acc - 0.05, "acc_best_peer": acc + 0.01, "xi": xi,
                }
            )  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def _assert_pngs(paths: list[Path], run_dir: Path) -> None:
    assert [p.name for p in paths] == PLOT_NAMES
    for path in paths:
        assert path.parent == run_dir
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE, path.name
        assert len(data) > 5_000, (
            f"{path.name} is only {len(data)} bytes"
        )  # real drawing, not blank


def test_write_plots_full_run(tmp_path: Path) -> None:
    _fabricate_run(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
    _assert_pngs(write_plots(tmp_path), tmp_path)


def test_write_plots_null_series(tmp_path: Path) -> None:
    # Ξ, Θ, target, bytes all null and no evaluation at all: every plot is still written.
    _fabricate_run(tmp_path, steps=50, measured=False)
    _assert_pngs(write_plots(tmp_path), tmp_path)


def test_write_plots_empty_metrics(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    _assert_pngs(write_plots(tmp_path), tmp_path)


def test_write_plots_missing_metrics(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl"):
        write_plots(tmp_path)


def test_plots_leave_pyplot_alone(tmp_path: Path) -> None:
    # In a fresh interpreter: drawing must not import pyplot (its global state belongs to users).
    _fabricate_run(tmp_path, steps=200)
    code = (
        "import sys; from concord.runtime.plots import write_plots; "
        f"write_plots({str(tmp_path)!r}); print('matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_decimate_keeps_spikes() -> None:
    x = np.arange(200_000, dtype=float)
    y = np.ones_like(x)
    y[123_457] = 9.0
    y[7] = -4.0
    dx, dy = _decimate(x, y)
    assert dx.size <= MAX_POINTS
    assert np.all(np.diff(dx) > 0)  # still a path in x order
    assert dy.max() == 9.0
    assert dx[dy.argmax()] == 123_457
    assert dy.min() == -4.0


def test_read_metrics(tmp_path: Path) -> None:
    step = StepRecord(
        step=0,
        epoch=0.0,
        phase=1,
        lr=0.1,
        loss=1.0,
        train_acc=0.5,
        rounds=1,
        theta=None,
        target=None,
        grad_norm=None,
        bytes_sent=0,
        rounds_total=1,
    )
    good = [step, EvalRecord(step=0, epoch=0.0, accuracy_avg_model=0.5)]
    text = "\n".join(json.dumps(x.to_json()) for x in good)
    (tmp_path / "metrics.jsonl").write_text(text + "\n\n" + '{"kind": "st')  # crash mid-write
    assert read_metrics(tmp_path) == good
    (tmp_path / "metrics.jsonl").write_text(text + "\nnot json\n" + text + "\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:3"):
        read_metrics(tmp_path)


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.50 KiB"
    assert human_bytes(3 * 2**30) == "3.00 GiB"
    with pytest.raises(ValueError, match="n=-1"):
        human_bytes(-1)


def test_run_title_from_config(tmp_path: Path) -> None:
    assert run_title(tmp_path) == tmp_path.name
    (tmp_path / "config.toml").write_text('algorithm = "dsgd"\ntopology = "torus"\npeers = 32\n')
    assert run_title(tmp_path) == "dsgd · torus · n=32"


SUMMARY = {
    "engine": "vectorized", "algorithm": "dsgd", "topology": "ring", "peers": 32, "steps": 1000,
    "epochs": 10.0, "seed": 0, "plan": "dec-phase-1", "control_mode": "constant",
    "control_factor": 0.5, "accuracy_avg_model": 0.9271, "accuracy_worst_peer": 0.9012,
    "accuracy_mean_peer": None, "gossip_rounds_total": 12345, "bytes_sent_total": 1536,
    "bytes_raw_total": 3072, "partition_sha256": None,
    "final_consensus_distance": 0.0123456, "wall_seconds": 754.0, "run_dir": "runs/x",
}  # fmt: skip


def test_final_table() -> None:
    text = _render(final_table(RunSummary.from_json(SUMMARY, where="summary.json")))
    for expected in ("92.71 %", "90.12 %", "12,345", "1.50 KiB", "0.01235", "12 min 34 s"):
        assert expected in text
    assert "constant × 0.5" in text
    assert "—" in text  # accuracy_mean_peer is null: shown as missing, not as 0 %


def test_compare_table_delta() -> None:
    summary = RunSummary.from_json(SUMMARY, where="summary.json")
    reference = dataclasses.replace(summary, label="all-reduce", accuracy_avg_model=0.9221)
    text = _render(compare_table([reference, summary]))
    assert "all-reduce" in text
    assert "+0.50 pt" in text
    with pytest.raises(ValueError, match="rows"):
        compare_table([])


def test_cell_stats_mean_std() -> None:
    cell = CellStats((0.90, 0.91, 0.92), 3)
    assert cell.mean == pytest.approx(0.91)
    assert cell.std == pytest.approx(0.01)  # sample std (ddof=1) of 0.90, 0.91, 0.92
    assert cell.format(scale=100) == "91.00 ± 1.00"
    assert CellStats((0.9,), 1).format(scale=100) == "90.00"
    assert CellStats((0.90, 0.92), 3).format(scale=100) == "91.00 ± 1.41 (2/3)"
    assert CellStats((), 2, failures=2).format() == "failed"
    assert CellStats((), 2).format() == "—"  # runs succeeded but did not measure this value
    assert CellStats((), 0).format() == ""


def test_factor_labels() -> None:
    assert [factor_label(f) for f in (1.0, 0.5, 0.25, 0.3, None)] == [
        "Ξ_max", "½Ξ_max", "¼Ξ_max", "0.3·Ξ_max", "uncontrolled",
    ]  # fmt: skip
    assert factor_label(2.0, "adaptive") == "2·φ̂"


def test_grid_layout() -> None:
    rows: list[dict[str, Any]] = [
        {"row": plan, "kind": "plan", "topology": "ring", "factor": factor,
         "control_mode": "constant", "status": "ok", "acc": base + shift + 0.02 * seed}
        for plan, base in (("dec-phase-1", 0.90), ("dec-phase-2", 0.93))
        for factor, shift in ((1.0, 0.0), (0.5, 0.01))
        for seed in (0, 1)
    ]  # fmt: skip
    rows.append({"row": "all-reduce", "kind": "baseline", "topology": None, "factor": None,
                 "control_mode": "none", "status": "ok", "acc": 0.95})  # fmt: skip
    rows.append({"row": "all-reduce", "kind": "baseline", "topology": None, "factor": None,
                 "control_mode": "none", "status": "error", "acc": None})  # fmt: skip
    header, body = grid_layout(rows, "acc", "ring", scale=100)
    assert header == ["plan", "Ξ_max", "½Ξ_max"]
    assert body == [
        ["dec-phase-1", "91.00 ± 1.41", "92.00 ± 1.41"],
        ["dec-phase-2", "94.00 ± 1.41", "95.00 ± 1.41"],
        ["all-reduce", "95.00 (1/2)", ""],
    ]
    markdown = markdown_grid(header, body)
    assert markdown.splitlines()[0] == "| plan | Ξ_max | ½Ξ_max |"
    assert markdown.splitlines()[1] == "| --- | ---: | ---: |"
