"""PNG plots of a preset sweep's report (`concord.lab.presets.report`): the metric against the
column setting, the metric against the bytes sent per peer, training curves per column, and the
metric against the lr of a tuning sweep.

Only matplotlib's object API with the Agg canvas is used (as `concord.runtime.plots`), never pyplot.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter, ScalarFormatter

from concord.core.records import EvalRecord, MetricsRecord, StepRecord
from concord.lab.presets.cells import Cells
from concord.lab.presets.spec import Preset, Setting
from concord.lab.sweep import METRICS
from concord.runtime.records import read_metrics

_DPI = 110


def tuned_columns(preset: Preset) -> list[Setting]:
    """The columns a ``--tune`` sweep of ``preset`` runs."""
    return [c for c in preset.columns if c.key in preset.tuned_columns()]


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _figure(panels: int, width: float = 5.2) -> tuple[Figure, list[Axes]]:
    fig = Figure(figsize=(width * panels, 4.0), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def _legend(fig: Figure, ax: Axes) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside right center", fontsize=8)


def plot_metric(preset: Preset, cells: Cells, path: Path) -> Path:
    keys = [METRICS[preset.metric]] + ([METRICS["avg"]] if preset.metric != "avg" else [])
    keys.append(METRICS["worst"] if preset.metric == "avg" else METRICS["mean"])
    fig, axes = _figure(len(keys))
    xs = np.arange(len(preset.columns), dtype=float)
    for ax, (key, description) in zip(axes, keys, strict=True):
        for i, row in enumerate(preset.rows):
            stats = [cells.stats(row.key, c.key, key) for c in preset.columns]
            mean = np.array([100 * s.mean for s in stats])
            std = np.array([100 * s.std for s in stats])
            mean[[not row.runs_in(c.key) for c in preset.columns]] = np.nan
            ax.errorbar(xs, mean, yerr=std, marker="o", ms=4, capsize=3, lw=1.3,
                        label=row.label, color=f"C{i}")  # fmt: skip
        ax.set_xticks(xs, [textwrap.fill(c.label, 9) for c in preset.columns], fontsize=9)
        ax.set_xlabel(preset.column_name)
        ax.set_ylabel(f"test accuracy (%), {description}")
        ax.grid(alpha=0.3)
        ax.set_title(f"{description}, mean ± std over seeds", fontsize=10)
    _legend(fig, axes[0])
    fig.suptitle(preset.title, fontsize=10)
    fig.savefig(path, dpi=_DPI)
    return path


_MARKERS = "osD^vP*Xhp<>"


def plot_bytes(preset: Preset, cells: Cells, path: Path) -> Path:
    """The preset's metric against the mean MB sent per peer (log x when the points span more
    than a decade; the cells' rows carry ``bytes_per_peer``): one point per (row, column),
    mean ± std over seeds on both axes, a marker and colour per row, each point labelled with
    its column."""
    key, description = METRICS[preset.metric]
    fig = Figure(figsize=(8.0, 5.6), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    xs: list[float] = []
    for i, row in enumerate(preset.rows):
        marker, color = _MARKERS[i % len(_MARKERS)], f"C{i % 10}"
        labelled = False
        for col in preset.columns:
            if not row.runs_in(col.key):
                continue
            acc = cells.stats(row.key, col.key, key)
            sent = cells.stats(row.key, col.key, "bytes_per_peer")
            if not acc.values or not sent.values or sent.mean <= 0:
                continue  # nothing measured, or nothing sent (no place on a log axis)
            x, y = sent.mean / 1e6, 100 * acc.mean
            xs.append(x)
            label = None if labelled else row.label
            ax.errorbar(x, y, xerr=sent.std / 1e6, yerr=100 * acc.std, ls="none", ms=6,
                        capsize=3, label=label, marker=marker, color=color)  # fmt: skip
            labelled = True
            if len(preset.columns) > 1:
                ax.annotate(col.label, (x, y), xytext=(5, 4), textcoords="offset points",
                            fontsize=7, color=color)  # fmt: skip
    if xs and max(xs) > 10 * min(xs):
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.set_xlabel("MB sent per peer over the run (mean over seeds)")
    ax.set_ylabel(f"test accuracy (%), {description}")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(f"{description} against communication, mean ± std over seeds", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=8)
    fig.suptitle(preset.title, fontsize=10)
    fig.savefig(path, dpi=_DPI)
    return path


def _curves(records: Sequence[MetricsRecord]) -> tuple[np.ndarray, ...]:
    """Steps and averaged-model accuracies (%) of the evaluations; steps and training losses."""
    evals = [
        (r.step, float(r.accuracy_avg_model))
        for r in records
        if isinstance(r, EvalRecord)
        and r.accuracy_avg_model is not None
        and _finite(r.accuracy_avg_model)
    ]
    steps = [
        (r.step, float(r.loss))
        for r in records
        if isinstance(r, StepRecord) and r.loss is not None and _finite(r.loss)
    ]
    e_x = np.array([float(step) for step, _ in evals])
    e_y = np.array([100 * acc for _, acc in evals])
    s_x = np.array([float(step) for step, _ in steps])
    s_y = np.array([loss for _, loss in steps])
    return e_x, e_y, s_x, s_y


def _bucket_mean(x: np.ndarray, y: np.ndarray, buckets: int = 50) -> tuple[np.ndarray, np.ndarray]:
    if x.size == 0:
        return x, y
    edges = np.linspace(0, x.size, min(buckets, x.size) + 1).astype(int)
    pairs = [(a, b) for a, b in itertools.pairwise(edges) if b > a]
    bx = np.array([x[a:b].mean() for a, b in pairs])
    by = np.array([y[a:b].mean() for a, b in pairs])
    return bx, by


def _seed_mean(series: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds on the common prefix of x (runs of one cell share their x grid)."""
    series = [s for s in series if s[0].size]
    if not series:
        return np.array([]), np.array([])
    n = min(s[0].size for s in series)
    return series[0][0][:n], np.mean([s[1][:n] for s in series], axis=0)


def plot_curves(preset: Preset, cells: Cells, col: Setting, path: Path) -> Path:
    fig, (acc_ax, loss_ax) = _figure(2)
    for i, row in enumerate(preset.rows):
        if not row.runs_in(col.key):
            continue
        acc: list[tuple[np.ndarray, np.ndarray]] = []
        loss: list[tuple[np.ndarray, np.ndarray]] = []
        for record in cells.rows.get((row.key, col.key, cells.lr(row.key, col.key)), []):
            if record.get("status") != "ok":
                continue
            try:
                e_x, e_y, s_x, s_y = _curves(read_metrics(record["run_dir"]))
            except (FileNotFoundError, ValueError):
                continue
            acc.append((e_x, e_y))
            loss.append(_bucket_mean(s_x, s_y))
        for ax, series in ((acc_ax, acc), (loss_ax, loss)):
            x, y = _seed_mean(series)
            if x.size:
                ax.plot(x, y, lw=1.3, color=f"C{i}", label=row.label)
    acc_ax.set_ylabel("test accuracy (%), averaged model")
    loss_ax.set_ylabel("training loss (mean over peers)")
    loss_ax.set_yscale("log")
    for ax in (acc_ax, loss_ax):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3, which="both")
    _legend(fig, acc_ax)
    fig.suptitle(f"{preset.title} — {col.label} (mean over seeds)", fontsize=10)
    fig.savefig(path, dpi=_DPI)
    return path


def plot_lr(preset: Preset, cells: Cells, key: str, path: Path) -> Path:
    columns = tuned_columns(preset)
    fig, axes = _figure(len(columns), width=4.2)
    for ax, col in zip(axes, columns, strict=True):
        for i, row in enumerate(preset.rows):
            if not preset.tunes(row, col.key):
                continue
            pts = [(lr, cells.stats(row.key, col.key, key, lr)) for lr in row.lr_grid]
            xs = [lr for lr, s in pts if s.values]
            ys = [100 * s.mean for _, s in pts if s.values]
            ax.plot(xs, ys, marker="o", ms=4, lw=1.2, color=f"C{i}", label=row.label)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_title(col.label, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0].set_ylabel(f"test accuracy (%), {METRICS[preset.metric][1]}")
    _legend(fig, axes[0])
    fig.suptitle(f"{preset.title} — lr tuning", fontsize=10)
    fig.savefig(path, dpi=_DPI)
    return path
