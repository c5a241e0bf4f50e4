"""Reading a run directory and rendering its results as terminal tables.

A run directory (written by the engine) holds ``config.toml`` (resolved config),
``manifest.json``, ``metrics.jsonl`` (one JSON object per line, ``kind`` = ``"step"`` or
``"eval"``), ``partition.json`` and ``summary.json``. This module reads those files and renders
:mod:`rich` tables:

- :func:`final_table` — the end-of-run table of a `concord.core.records.RunSummary`
  (accuracies in %, gossip rounds, bytes, Ξ, wall time);
- :func:`compare_table` — several summaries side by side, e.g. a controlled run next to its
  all-reduce reference, with the accuracy difference to the first row;
- :func:`grid_layout` / :func:`rich_grid` / :func:`markdown_grid` — a sweep's Table-2-shaped grid
  (Kong et al. 2021, Table 2): rows = phase plans (+ baselines), columns = control factors, cells
  mean ± std over seeds. They work on plain row dicts, so a grid can be rebuilt from table.csv.

Accuracies in summaries/metrics are fractions in [0, 1]; they are shown in percent. Missing or null
values are shown as "—", never as 0.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from concord.core.records import RunSummary

MISSING = "—"

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def human_bytes(n: float) -> str:
    """Binary-prefixed size: 0 → "0 B", 1536 → "1.50 KiB", 3·2**30 → "3.00 GiB".

    ``n`` must be a finite number ≥ 0 (a byte count); three significant-ish digits are kept.
    """
    if isinstance(n, bool) or not isinstance(n, int | float) or not math.isfinite(n) or n < 0:
        raise ValueError(f"human_bytes needs a finite byte count >= 0, got n={n!r}")
    value = float(n)
    unit = 0
    while value >= 1024.0 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024.0
        unit += 1
    return f"{int(value)} B" if unit == 0 else f"{value:.2f} {_BYTE_UNITS[unit]}"


def format_duration(seconds: float) -> str:
    """Wall time: "8.4 s", "12 min 05 s", "3 h 02 min"."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"format_duration needs a finite duration >= 0, got seconds={seconds!r}")
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _number(value: object) -> float | None:
    """A finite float from a summary field, or None for null/missing/NaN/non-numbers."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def fmt_percent(value: object, digits: int = 2) -> str:
    """A fraction in [0, 1] as a percentage ("92.71 %"), or "—"."""
    x = _number(value)
    return MISSING if x is None else f"{100.0 * x:.{digits}f} %"


def _fmt_count(value: object) -> str:
    x = _number(value)
    return MISSING if x is None else f"{x:,.0f}"


def _fmt_bytes(value: object) -> str:
    x = _number(value)
    return MISSING if x is None or x < 0 else human_bytes(x)


def _fmt_float(value: object) -> str:
    x = _number(value)
    return MISSING if x is None else f"{x:.4g}"


def _fmt_wall(value: object) -> str:
    x = _number(value)
    return MISSING if x is None or x < 0 else format_duration(x)


def _fmt_control(summary: RunSummary) -> str:
    factor = _number(summary.control_factor)
    if summary.control_mode == "none" or factor is None:
        return summary.control_mode
    return f"{summary.control_mode} × {factor:g}"


def _run_label(summary: RunSummary) -> str:
    if summary.label is not None:
        return summary.label
    parts = [summary.algorithm, summary.topology, f"n={summary.peers}", summary.plan]
    control = _fmt_control(summary)
    if control != "none":
        parts.append(control)
    return " ".join(parts)


def final_table(summary: RunSummary) -> Table:
    """The end-of-run table: one "quantity | value" row per summary field worth reading."""
    table = Table(
        title=f"Concord run — {_run_label(summary)}", show_header=False, title_justify="left"
    )
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("algorithm", summary.algorithm),
        ("topology", summary.topology),
        ("peers", _fmt_count(summary.peers)),
        ("plan", summary.plan),
        ("control", _fmt_control(summary)),
        ("seed", str(summary.seed)),
        ("steps / epochs", f"{_fmt_count(summary.steps)} / {summary.epochs:g}"),
        ("test accuracy, averaged model", fmt_percent(summary.accuracy_avg_model)),
        ("test accuracy, mean peer", fmt_percent(summary.accuracy_mean_peer)),
        ("test accuracy, worst peer", fmt_percent(summary.accuracy_worst_peer)),
        ("gossip rounds", _fmt_count(summary.gossip_rounds_total)),
        ("bytes sent", _fmt_bytes(summary.bytes_sent_total)),
        ("final consensus distance Ξ", _fmt_float(summary.final_consensus_distance)),
        ("wall time", _fmt_wall(summary.wall_seconds)),
        ("run directory", summary.run_dir),
    ]
    for name, value in rows:
        table.add_row(name, value)
    return table


def compare_table(rows: Sequence[RunSummary], *, title: str = "Comparison") -> Table:
    """Summaries side by side, one row each; "Δ acc" is the averaged-model accuracy minus row 0's.

    A row is named by its ``label`` if it has one, else by algorithm/topology/plan/control.
    """
    if not rows:
        raise ValueError("compare_table needs at least one summary in rows, got an empty sequence")
    table = Table(title=title, title_justify="left")
    table.add_column("run", style="bold")
    for header in ("acc avg model", "Δ acc", "acc mean peer", "acc worst peer", "rounds", "bytes"):
        table.add_column(header, justify="right")
    table.add_column("final Ξ", justify="right")
    table.add_column("wall", justify="right")
    reference = _number(rows[0].accuracy_avg_model)
    for index, row in enumerate(rows):
        acc = _number(row.accuracy_avg_model)
        if index == 0 or acc is None or reference is None:
            delta = MISSING
        else:
            delta = f"{100.0 * (acc - reference):+.2f} pt"
        table.add_row(
            _run_label(row),
            fmt_percent(acc),
            delta,
            fmt_percent(row.accuracy_mean_peer),
            fmt_percent(row.accuracy_worst_peer),
            _fmt_count(row.gossip_rounds_total),
            _fmt_bytes(row.bytes_sent_total),
            _fmt_float(row.final_consensus_distance),
            _fmt_wall(row.wall_seconds),
        )
    return table


# ---------------------------------------------------------------------------------------------
# Sweep grids (Kong et al. 2021, Table 2): rows = phase plans (+ baselines), columns = factors.


T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip
"""Two-sided 95 % quantiles of Student's t by degrees of freedom (`t95`)."""


def pm(x: tuple[float, float], scale: int = 2) -> str:
    """A (mean, 95 % half-width) pair as "m ± h" at `scale` decimals; "—" without a mean, the
    mean alone without a half-width (one seed)."""
    m, h = x
    if math.isnan(m):
        return "—"
    return f"{m:.{scale}f} ± {h:.{scale}f}" if not math.isnan(h) else f"{m:.{scale}f}"


def t95(k: int) -> float:
    """Two-sided 95 % quantile of Student's t with k degrees of freedom (`T95`, the nearest
    tabulated k below; more than 30: 1.96; NaN below 1)."""
    if k < 1:
        return math.nan
    return T95[max(d for d in T95 if d <= k)] if k <= 30 else 1.96


@dataclass(frozen=True)
class CellStats:
    """The values of one grid cell (one per seed whose run succeeded and measured it).

    ``runs``: runs in the cell; ``failures``: how many of them failed. ``std`` is the sample
    standard deviation (ddof = 1, the usual "± over seeds"); 0 for a single value.
    """

    values: tuple[float, ...]
    runs: int
    failures: int = 0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    @property
    def ci95(self) -> float:
        """Half-width of the mean's 95 % confidence interval: Student's t over len − 1 degrees
        of freedom × std / √len (NaN for fewer than two values)."""
        k = len(self.values)
        if k < 2:
            return math.nan
        return t95(k - 1) * self.std / math.sqrt(k)

    def format(self, *, scale: float = 1.0, digits: int = 2, spread: bool = True) -> str:
        """ "mean ± std" of the values × ``scale``, "(k/n)" when only k of n runs have a value;
        "failed" when every run failed, "—" when none measured it, "" for an empty cell."""
        if not self.values:
            if not self.runs:
                return ""
            return "failed" if self.failures == self.runs else MISSING
        text = f"{scale * self.mean:,.{digits}f}"
        if spread and len(self.values) > 1:
            text += f" ± {scale * self.std:,.{digits}f}"
        if len(self.values) < self.runs:
            text += f" ({len(self.values)}/{self.runs})"
        return text


def factor_label(factor: float | None, mode: str = "constant") -> str:
    """Column header of a control factor: None → "uncontrolled"; constant 0.5 → "½Ξ_max";
    adaptive 0.5 → "0.5·φ̂" (factor × EMA of the mean local gradient norm)."""
    if factor is None:
        return "uncontrolled"
    if mode == "adaptive":
        return f"{factor:g}·φ̂"
    prefix = {1.0: "", 0.5: "½", 0.25: "¼", 0.75: "¾", 0.125: "⅛"}.get(factor, f"{factor:g}·")
    return f"{prefix}Ξ_max"


def grid_layout(
    rows: Sequence[Mapping[str, Any]],
    value_key: str,
    topology: str,
    *,
    scale: float = 1.0,
    digits: int = 2,
    spread: bool = True,
) -> tuple[list[str], list[list[str]]]:
    """Header and body of one Table-2-shaped grid for ``topology``.

    ``rows``: one mapping per run with keys ``row`` (row label: plan or baseline), ``kind``
    ("plan" | "baseline"), ``topology`` (None/"" for a topology-free baseline, shown in every
    table), ``factor`` (float | None), ``control_mode``, ``status`` ("ok" counts) and ``value_key``.
    Columns are the factors of the plan rows in order of appearance; a baseline has no factor and
    its cell sits in the first column. Cells aggregate over the runs (seeds) that share them.
    """
    visible = [r for r in rows if r.get("topology") in (topology, None, "")]
    columns: list[tuple[float | None, str]] = []
    for r in rows:
        key = (r.get("factor"), str(r.get("control_mode", "constant")))
        if r.get("kind") == "plan" and key[0] not in [c[0] for c in columns]:
            columns.append(key)
    labels: list[tuple[str, str]] = []  # (kind, row label) in order of appearance, plans first
    for kind in ("plan", "baseline"):
        for r in visible:
            if r.get("kind") == kind and (kind, str(r["row"])) not in labels:
                labels.append((kind, str(r["row"])))
    body: list[list[str]] = []
    for kind, label in labels:
        mine = [r for r in visible if r.get("kind") == kind and str(r["row"]) == label]
        cells: list[str] = []
        for index, (factor, _mode) in enumerate(columns or [(None, "")]):
            if kind == "baseline":
                cell_rows = mine if index == 0 else []
            else:
                cell_rows = [r for r in mine if r.get("factor") == factor]
            values = tuple(
                float(v)
                for r in cell_rows
                if r.get("status") == "ok" and (v := _number(r.get(value_key))) is not None
            )
            failures = sum(r.get("status") != "ok" for r in cell_rows)
            cells.append(
                CellStats(values, len(cell_rows), failures).format(
                    scale=scale, digits=digits, spread=spread
                )
            )
        body.append([label, *cells])
    header = ["plan", *(factor_label(f, m) for f, m in columns)] if columns else ["plan", "value"]
    return header, body


def rich_grid(title: str, header: Sequence[str], body: Sequence[Sequence[str]]) -> Table:
    """A grid from :func:`grid_layout` as a rich table (row labels bold, cells right-aligned)."""
    table = Table(title=title, title_justify="left")
    table.add_column(header[0], style="bold")
    for name in header[1:]:
        table.add_column(name, justify="right")
    for row in body:
        table.add_row(*row)
    return table


def markdown_grid(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A grid (or any header + rows) as a GitHub-flavoured markdown table, "|" escaped."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    align = ["---", *("---:" for _ in header[1:])]
    return "\n".join([line(header), line(align), *(line(row) for row in body)]) + "\n"
