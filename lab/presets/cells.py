"""A preset sweep's table rows grouped into cells: (row, column, lr) with one value per seed."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from concord.lab.presets.spec import PresetGrid
from concord.lab.report import CellStats
from concord.runtime.records import read_steps

__all__ = ["Cells", "cell_value", "final_train_loss"]


def cell_value(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    if row.get("status") != "ok" or value in (None, ""):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def final_train_loss(run_dir: str | Path) -> float | None:
    """Mean of the step records' ``loss`` over the last 10 % of the steps (None if none)."""
    try:
        records = read_steps(run_dir)
    except (FileNotFoundError, ValueError):
        return None
    losses = [r.loss for r in records if r.loss is not None and _finite(r.loss)]
    if not losses:
        return None
    tail = losses[-max(1, len(losses) // 10) :]
    return statistics.fmean(tail)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Cells:
    """Table rows grouped by (row key, column key, lr) with per-seed values."""

    def __init__(self, grid: PresetGrid, rows: Sequence[Mapping[str, Any]]) -> None:
        by_name = {r["name"]: dict(r) for r in rows}
        self.grid = grid
        self.rows: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
        for run in grid.runs():
            row_key, col_key, lr = grid.cell_of[run.name]
            record = by_name.get(run.name, {"status": "pending"})
            record.setdefault("train_loss", None)
            if record.get("status") == "ok" and record.get("train_loss") is None:
                record["train_loss"] = final_train_loss(record.get("run_dir", ""))
            self.rows.setdefault((row_key, col_key, lr), []).append(record)

    def stats(self, row: str, col: str, key: str, lr: float | None = None) -> CellStats:
        lr = self.lr(row, col) if lr is None else lr
        cell = self.rows.get((row, col, lr), [])
        values = tuple(v for r in cell if (v := cell_value(r, key)) is not None)
        return CellStats(values, len(cell), sum(r.get("status") != "ok" for r in cell))

    def lr(self, row: str, col: str) -> float:
        """The row's lr in the column (NaN where the row does not run)."""
        return float(self.grid.preset.row(row).lrs.get(col, math.nan))
