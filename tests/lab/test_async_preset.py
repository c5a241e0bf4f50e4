"""The ``async`` preset (`concord.lab.presets.asynchronous`) and its report
(`concord.lab.presets.async_report`): the grid the report describes, the virtual clock of the
synchronous rows, the curves of a run directory and the generated reading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from concord.core.config import apply_overrides, load_config
from concord.core.records import EvalRecord
from concord.lab.presets import asynchronous as spec
from concord.lab.presets import get_study
from concord.lab.presets.async_report import (
    TARGET_MARGIN,
    links,
    reading,
    run_curves,
    summarize,
    sync_clock,
    sync_step_seconds,
)
from concord.lab.presets.spec import PresetGrid
from tests.records import step_record


def test_grid_is_what_the_report_says() -> None:
    """4 rows × (n 16 / 64 × spread 1/2/8 × iid / α 0.1) × 5 seeds, the synchronous rows in
    the 1× columns only: 2·2·5 + 2·6·5 = 80 runs per n."""
    assert get_study("async").name == "async"
    grid = PresetGrid(spec.ASYNC, spec.ASYNC.seeds)
    runs = grid.runs()
    assert spec.ASYNC.seeds == (0, 1, 2, 3, 4)
    assert len(spec.ASYNC.columns) == 12
    assert len(runs) == 160
    assert sum(r.name.split("_")[1].startswith("n16-") for r in runs) == 80
    base = load_config(None, ["engine=vectorized", *spec.ASYNC.base], environ={})
    assert base.epochs == 4
    assert base.model.name == "mlp"
    assert base.optim.milestones == []
    assert "4 epochs" in spec.ASYNC.setup
    assert "lr 0.1" in spec.ASYNC.setup
    for run in runs:
        row, column, _ = grid.cell_of[run.name]
        over = run.overrides
        if row in spec.SYNC_ROWS:
            assert "-x1-" in column
            assert not any(k.startswith("async.") for k in over)
        else:
            assert row in spec.ASYNC_ROWS
        if "-x1-" not in column and row in spec.ASYNC_ROWS:
            spread = float(column.split("-")[1][1:])
            speeds = over["async.speeds"]
            assert isinstance(speeds, list)
            assert len(speeds) == over["peers"]
            assert (min(speeds), max(speeds)) == (1.0, spread)
    # every run's configuration validates (the asynchronous ones with their speeds)
    for run in runs[:: len(runs) // 16]:
        cfg = apply_overrides(base, run.overrides)
        assert cfg.peers in spec.SIZES


def test_speeds_are_a_fixed_shuffle() -> None:
    a = spec.speeds(16, 8)
    assert a == spec.speeds(16, 8)  # no seed: the same for every run
    assert sorted(a) == [1 + 7 * i / 15 for i in range(16)]
    assert a != sorted(a)
    with pytest.raises(ValueError, match="spread >= 1"):
        spec.speeds(16, 0.5)


def test_sync_step_closed_form() -> None:
    """A synchronous step = slowest peer × compute_s + the longest delay of the links it uses
    (exact: sums of the inputs)."""
    delays = [[0.0, 0.25, 0.5], [0.125, 0.0, 0.75], [1.0, 2.0, 0.0]]
    assert sync_step_seconds([1.0, 3.0, 2.0], 0.5, delays, [(0, 1), (1, 0)]) == 1.5 + 0.25
    assert sync_step_seconds([1.0, 3.0, 2.0], 0.5, delays, links("complete", 3)) == 1.5 + 2.0
    assert sync_step_seconds([2.0], 1.0, [[0.0]], []) == 2.0
    assert sorted(links("ring", 4)) == sorted(
        [(0, 3), (0, 1), (1, 0), (1, 2), (2, 1), (2, 3), (3, 2), (3, 0)]
    )
    assert sync_clock(16, 8, "ring") == 8.0
    assert sync_clock(64, 1, "complete") == 1.0
    with pytest.raises(ValueError, match="chain"):
        links("chain", 4)


def _write_run(path: Path, records: list[Any]) -> None:
    path.mkdir(parents=True)
    lines = [json.dumps(r.to_json()) for r in records]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _eval(step: int, epoch: float, acc: float) -> EvalRecord:
    return EvalRecord(step=step, epoch=epoch, accuracy_avg_model=acc, accuracy_worst_peer=acc)


def test_curves_of_a_synchronous_and_an_asynchronous_run(tmp_path: Path) -> None:
    """A synchronous run appears once per spread, step t ending at (t + 1) × spread; an
    asynchronous one on its records' clock, its epochs scaled by the local steps done."""
    sync = [step_record(t) for t in range(4)] + [_eval(1, 0.5, 0.4), _eval(3, 1.0, 0.6)]
    _write_run(tmp_path / "s", sync)
    rows = run_curves("dsgd", "n16-x1-iid", 0, "s", tmp_path / "s")
    assert [(r["spread"], r["virtual_time"]) for r in rows] == [
        (1.0, 2.0), (1.0, 4.0), (2.0, 4.0), (2.0, 8.0), (8.0, 16.0), (8.0, 32.0)
    ]  # fmt: skip
    assert [r["epochs"] for r in rows[:2]] == [0.5, 1.0]
    # 16 peers; 16 then 8 local steps per window: half the samples of a synchronous run by t=1
    steps = [
        step_record(t, virtual_time=t + 1.0, local_steps=16 if t == 0 else 8, staleness_mean=s)
        for t, s in ((0, 0.0), (1, 1.0), (2, 2.0), (3, 1.0))
    ]
    _write_run(tmp_path / "a", [*steps, _eval(1, 0.5, 0.3), _eval(3, 1.0, 0.5)])
    rows = run_curves("ad-psgd", "n16-x8-iid", 0, "a", tmp_path / "a")
    assert [(r["spread"], r["virtual_time"], r["epochs"]) for r in rows] == [
        (8.0, 2.0, 0.5 * 24 / 32), (8.0, 4.0, 1.0 * 40 / 64)
    ]  # fmt: skip
    assert rows[-1]["staleness_mean"] == pytest.approx(1.0)  # mean of 0, 1, 2, 1; exact


def _curve(row: str, seed: int, points: list[tuple[float, float, float]]) -> list[dict[str, Any]]:
    """(epochs, virtual time, accuracy) per evaluation of one run, n = 16, 8×, iid."""
    return [
        {"run": f"{row}_s{seed}", "row": row, "n": 16, "spread": 8.0, "data": "iid", "seed": seed,
         "step": k, "epochs": e, "virtual_time": t, "accuracy_avg_model": a,
         "accuracy_worst_peer": a - 0.1, "staleness_mean": 0.5 if row in spec.ASYNC_ROWS else None}
        for k, (e, t, a) in enumerate(points)
    ]  # fmt: skip


def test_summary_and_reading_of_a_synthetic_table() -> None:
    """Asynchrony ahead at the asynchronous horizon (100 s) and AD-PSGD equal to D-SGD at equal
    epochs: the reading says so, from the numbers (tolerance: exact arithmetic on the inputs,
    linear interpolation between evaluations)."""
    curves = []
    for seed in (0, 1):
        curves += _curve("allreduce", seed, [(1, 400, 0.6), (2, 800, 0.7)])
        curves += _curve("dsgd", seed, [(0.5, 200, 0.5), (1, 400, 0.6), (2, 800, 0.7)])
        curves += _curve("ad-psgd", seed, [(0.5, 50, 0.5), (1, 100, 0.6)])
        curves += _curve("async-sgp", seed, [(0.5, 50, 0.45), (1, 100, 0.55)])
    summary = {s["row"]: s for s in summarize(curves)}
    assert summary["allreduce"]["target"] == pytest.approx(0.7 - TARGET_MARGIN)
    assert summary["dsgd"]["ttt"].mean == 800
    assert summary["ad-psgd"]["reached"] == 0
    assert summary["ad-psgd"]["dsgd_same_epochs"].mean == pytest.approx(0.6)
    assert summary["ad-psgd"]["at_h"].mean == pytest.approx(0.6)
    assert summary["dsgd"]["at_h"].values == ()  # D-SGD's first evaluation is at 200 s
    assert summary["ad-psgd"]["s_per_epoch"].mean == 100
    text = "\n".join(reading(summarize(curves)))
    assert "n = 16, iid, 8×: at equal virtual time best is ad-psgd (60.00 %)" in text
    assert "AD-PSGD +0.00 pp against D-SGD (within tolerance)" in text
    assert "held in 1 of 1 settings" in text
    assert "async SGP does 1.00 epochs (100 s/epoch), -5.00 pp against D-SGD at equal" in text
    assert "fewer virtual seconds per epoch in 1 of the 1 with unequal speeds" in text
    # AD-PSGD 5 pp below D-SGD at equal samples: staleness costs
    worse = [
        {**c, "accuracy_avg_model": c["accuracy_avg_model"] - 0.05} if c["row"] == "ad-psgd" else c
        for c in curves
    ]
    text = "\n".join(reading(summarize(worse)))
    assert "AD-PSGD -5.00 pp against D-SGD (staleness costs)" in text
    assert "held in 0 of 1 settings" in text
    assert "ahead beyond it in 0, behind in 1 (n = 16, iid, 8×)" in text
