"""PNG plots of one run, drawn from its ``metrics.jsonl``.

:func:`write_plots` writes four files into the run directory:

- ``accuracy.png`` — test accuracy (%) of the averaged model x̄, of the mean peer and of the worst
  peer against epoch (the band between worst and best peer is shaded when recorded);
- ``consensus.png`` — exact consensus distance Ξ_t, the estimator Θ_t (Kong et al. 2021, App. A)
  and the control target against step, log-y, training phases shaded and marked;
- ``rounds.png`` — gossip rounds per step and its moving average, with the cumulative count on a
  twin axis (three colours);
- ``bytes.png`` — cumulative bytes sent against epoch.

Only matplotlib's object API with the Agg canvas is used (``Figure`` + ``FigureCanvasAgg``), never
``pyplot``, so the global backend and figure registry of the calling program are left alone.

Series handling: null/missing values are skipped, and a series that is null everywhere is left out
(an axis with nothing to show says so); a point with no neighbour to join gets a marker, so that
every legend entry has something visible behind it. Lines connect measured points within a
training phase and break between phases. Series longer than ``MAX_POINTS`` are reduced by min/max
decimation per bucket, which keeps spikes (e.g. a burst of extra gossip rounds) visible at a
fraction of the cost. The consensus axis takes its limits from every step but the first
(`_log_limits`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from concord.core.records import EvalRecord, MetricsRecord, StepRecord
from concord.runtime.records import read_metrics, run_title

if TYPE_CHECKING:
    from matplotlib.typing import LegendLocType

MAX_POINTS = 4000
"""Upper bound (≥ 4) on plotted points per line segment; longer series are min/max decimated."""

_FIGSIZE = (7.5, 4.2)
_DPI = 120

Array = np.ndarray[Any, np.dtype[np.float64]]


def _column(records: Sequence[MetricsRecord], key: str) -> Array:
    """Field ``key`` of every record as float64; null, missing or non-numeric values become NaN."""
    out = np.full(len(records), np.nan)
    for i, record in enumerate(records):
        value = getattr(record, key, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[i] = float(value)
    return out


def _decimate(x: Array, y: Array, max_points: int = MAX_POINTS) -> tuple[Array, Array]:
    """At most ~``max_points`` points of (x, y): per bucket, the points holding the min and max y.

    ``x``, ``y``: 1-D, same length, finite. Order is preserved, so the result is still a path.
    """
    if x.size <= max_points:
        return x, y
    edges = np.linspace(0, x.size, max_points // 2 + 1).astype(np.int64)
    keep: list[int] = []
    for lo, hi in itertools.pairwise(edges):
        if hi <= lo:
            continue
        chunk = y[lo:hi]
        a, b = lo + int(np.argmin(chunk)), lo + int(np.argmax(chunk))
        keep.extend((a, b) if a <= b else (b, a))
    idx = np.unique(np.asarray(keep, dtype=np.int64))
    return x[idx], y[idx]


def _by_phase(x: Array, y: Array, phase: Array, *, positive: bool = False) -> tuple[Array, Array]:
    """Finite points of (x, y), decimated per phase, with a NaN break between phases.

    ``phase`` has the same length as ``x`` (NaN = unknown phase, treated as one phase of its own).
    ``positive`` additionally drops y ≤ 0 (for log axes).
    """
    keep = np.isfinite(x) & np.isfinite(y)
    if positive:
        keep &= y > 0
    xs, ys, ps = x[keep], y[keep], np.nan_to_num(phase[keep], nan=-1.0)
    if xs.size == 0:
        return xs, ys
    cuts = np.flatnonzero(np.diff(ps) != 0) + 1
    parts_x: list[Array] = []
    parts_y: list[Array] = []
    for seg_x, seg_y in zip(np.split(xs, cuts), np.split(ys, cuts), strict=True):
        dx, dy = _decimate(seg_x, seg_y)
        if parts_x:
            parts_x.append(np.array([np.nan]))
            parts_y.append(np.array([np.nan]))
        parts_x.append(dx)
        parts_y.append(dy)
    return np.concatenate(parts_x), np.concatenate(parts_y)


def _phase_runs(phase: Array) -> list[tuple[int, int, int]]:
    """Maximal runs of equal known phase in step order: (phase, first index, last index + 1)."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, phase.size + 1):
        if i == phase.size or phase[i] != phase[start] or not np.isfinite(phase[i]):
            if np.isfinite(phase[start]):
                runs.append((int(phase[start]), start, i))
            start = i
    return runs


def _mark_phases(
    ax: Axes, x: Array, runs: list[tuple[int, int, int]], *, label: bool, top: bool = True
) -> None:
    """Shade every other phase, draw a dashed line at each phase change, optionally name phases.

    ``x``: the x coordinate of every step record (step or epoch); ``runs`` from :func:`_phase_runs`.
    """
    if len(runs) < 2:
        return
    span = x[np.isfinite(x)]
    if span.size and span[-1] > span[0]:
        ax.set_xlim(span[0], span[-1])  # show every phase, even where a series is not defined
    for k, (ph, lo, hi) in enumerate(runs):
        x0 = x[lo]
        x1 = x[hi] if hi < x.size else x[hi - 1]
        if not (math.isfinite(x0) and math.isfinite(x1)):
            continue
        if k % 2 == 1:
            ax.axvspan(x0, x1, color="0.5", alpha=0.08, lw=0)
        if k > 0:
            ax.axvline(x0, color="0.4", ls="--", lw=0.8)
        if label:
            ax.text(
                x0,
                0.99 if top else 0.01,
                f" phase {ph}",
                transform=ax.get_xaxis_transform(),
                va="top" if top else "bottom",
                ha="left",
                fontsize=8,
                color="0.3",
                clip_on=True,
                in_layout=False,
            )


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} recorded", transform=ax.transAxes, ha="center", va="center")
    ax.set_xticks([])
    ax.set_yticks([])


def _frame(
    ax: Axes,
    x: Array,
    runs: list[tuple[int, int, int]],
    xlabel: str,
    ylabel: str,
    *,
    ticks: Literal["major", "minor", "both"] = "major",
    legend: LegendLocType | None = None,
) -> None:
    """What every drawn figure has: its phases marked along ``x``, its axis labels, a light
    grid at the ``ticks`` and, ``legend`` given, the legend at that ``loc``."""
    _mark_phases(ax, x, runs, label=True)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which=ticks)
    if legend is not None:
        ax.legend(loc=legend, fontsize=8)


def _new_figure(title: str) -> tuple[Figure, Axes]:
    """A figure of one panel titled ``title``."""
    fig = Figure(figsize=_FIGSIZE, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=10)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=_DPI)
    return path


class _RunSeries:
    """Columns of a run's step and eval records (float64 arrays, NaN = not measured)."""

    def __init__(self, records: Sequence[MetricsRecord]) -> None:
        steps: list[MetricsRecord] = [r for r in records if isinstance(r, StepRecord)]
        evals: list[MetricsRecord] = [r for r in records if isinstance(r, EvalRecord)]
        self.step = {k: _column(steps, k) for k in _STEP_KEYS}
        self.eval = {k: _column(evals, k) for k in _EVAL_KEYS}
        self.runs = _phase_runs(self.step["phase"])
        # Phase of each eval record: that of the last step record at or before its step.
        s_step, e_step = self.step["step"], self.eval["step"]
        self.eval_phase = np.full(e_step.size, np.nan)
        if s_step.size and np.all(np.isfinite(s_step)) and np.all(np.diff(s_step) >= 0):
            idx = np.searchsorted(s_step, e_step, side="right") - 1
            ok = (idx >= 0) & np.isfinite(e_step)
            self.eval_phase[ok] = self.step["phase"][idx[ok]]


_STEP_KEYS = (
    "step",
    "epoch",
    "phase",
    "rounds",
    "theta",
    "target",
    "xi",
    "bytes_sent",
    "rounds_total",
)
_EVAL_KEYS = (
    "step",
    "epoch",
    "accuracy_avg_model",
    "accuracy_mean_peer",
    "accuracy_worst_peer",
    "accuracy_best_peer",
    "xi",
)


def _accuracy_figure(s: _RunSeries, title: str) -> Figure:
    fig, ax = _new_figure(f"{title} — test accuracy")
    epoch, phase = s.eval["epoch"], s.eval_phase
    markers = "o" if np.isfinite(epoch).sum() <= 30 else None
    lo, hi = s.eval["accuracy_worst_peer"], s.eval["accuracy_best_peer"]
    band = np.isfinite(epoch) & np.isfinite(lo) & np.isfinite(hi)
    if band.any():
        ax.fill_between(epoch[band], 100 * lo[band], 100 * hi[band], color="C2", alpha=0.12, lw=0)
    drawn = False
    for key, label, color in (
        ("accuracy_avg_model", "averaged model x̄", "C0"),
        ("accuracy_mean_peer", "mean peer", "C1"),
        ("accuracy_worst_peer", "worst peer", "C2"),
    ):
        x, y = _by_phase(epoch, 100 * s.eval[key], np.zeros_like(phase))
        if x.size:
            style = _visible(y, {"color": color, "marker": markers, "ms": 3, "lw": 1.3})
            ax.plot(x, y, label=label, **style)
            drawn = True
    if drawn:
        _frame(ax, s.step["epoch"], s.runs, "epoch", "test accuracy (%)", legend="lower right")
    else:
        _no_data(ax, "test accuracy")
    return fig


def _consensus_figure(s: _RunSeries, title: str) -> Figure:
    fig, ax = _new_figure(f"{title} — consensus distance")
    step, phase = s.step["step"], s.step["phase"]
    xi_x, xi_y, xi_phase = step, s.step["xi"], phase
    if not np.isfinite(xi_y).any():  # Ξ measured only at evaluations
        xi_x, xi_y, xi_phase = s.eval["step"], s.eval["xi"], s.eval_phase
    drawn = False
    series: list[tuple[Array, Array, Array, str, dict[str, Any]]] = [
        (xi_x, xi_y, xi_phase, "exact Ξ", {"color": "C0", "lw": 1.1}),
        (step, s.step["theta"], phase, "estimator Θ", {"color": "C1", "lw": 0.9, "alpha": 0.8}),
        (step, s.step["target"], phase, "target", {"color": "C3", "lw": 1.4, "ls": "--"}),
    ]
    shown_x: list[Array] = []
    shown_y: list[Array] = []
    for x, y, ph, label, style in series:
        px, py = _by_phase(x, y, ph, positive=True)
        if px.size:
            ax.plot(px, py, label=label, **_visible(py, style))
            shown_x.append(px)
            shown_y.append(py)
            drawn = True
    if drawn:
        ax.set_yscale("log")
        limits = _log_limits(np.concatenate(shown_x), np.concatenate(shown_y))
        if limits is not None:
            ax.set_ylim(*limits)
        _frame(ax, step, s.runs, "step", "consensus distance (log)", ticks="both", legend="best")
    else:
        _no_data(ax, "consensus distance")
    return fig


def _rounds_figure(s: _RunSeries, title: str) -> Figure:
    fig, ax = _new_figure(f"{title} — gossip rounds")
    step, rounds, phase = s.step["step"], s.step["rounds"], s.step["phase"]
    x, y = _by_phase(step, rounds, phase)
    if not x.size:
        _no_data(ax, "gossip rounds")
        return fig
    # three series, three colours: per step (light), its moving average, the cumulative count
    ax.plot(x, y, **_visible(y, {"color": "C0", "lw": 0.6, "alpha": 0.45}), label="rounds per step")
    mx, my = _moving_average(step, rounds)
    if mx.size:
        ax.plot(mx, my, color="C1", lw=1.4, label="moving average")
    ax.set_xlabel("step")
    ax.set_ylabel("gossip rounds per step")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    total = s.step["rounds_total"]
    if not np.isfinite(total).any():  # derive the cumulative count when it was not logged
        total = np.cumsum(np.nan_to_num(rounds, nan=0.0))
    tx, ty = _decimate(*_finite_pair(step, total))
    twin = ax.twinx()
    twin.plot(tx, ty, color="C3", lw=1.4, label="cumulative")
    twin.set_ylabel("cumulative gossip rounds")
    twin.set_ylim(bottom=0)
    _mark_phases(ax, step, s.runs, label=True, top=False)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    return fig


def _moving_average(x: Array, y: Array, buckets: int = 200) -> tuple[Array, Array]:
    """Trailing mean of y over windows of ~len/``buckets`` finite points; empty if too short."""
    x, y = _finite_pair(x, y)
    window = x.size // buckets
    if window < 2:
        return x[:0], y[:0]
    c = np.cumsum(np.concatenate(([0.0], y)))
    mean = (c[window:] - c[:-window]) / window
    return _decimate(x[window - 1 :], mean)


def _finite_pair(x: Array, y: Array) -> tuple[Array, Array]:
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def _visible(y: Array, style: dict[str, Any]) -> dict[str, Any]:
    """``style`` with a marker when some point of ``y`` (a `_by_phase` path: NaN = a break) has
    no neighbour to draw a line to — without one it would not show, and its legend entry would
    stand for nothing (e.g. the processes engine's averaged model and Ξ, measured once, at the
    end). A lone measurement gets a star."""
    finite = np.isfinite(y)
    left = np.concatenate(([False], finite[:-1]))
    right = np.concatenate((finite[1:], [False]))
    if not (finite & ~left & ~right).any():
        return style
    lone = int(finite.sum()) == 1
    if lone:  # not clipped: it is often the last point, on the right edge
        return {**style, "marker": "*", "ms": 9, "zorder": 3, "clip_on": False}
    return {**style, "marker": "o", "ms": 4, "zorder": 3}


def _log_limits(x: Array, y: Array) -> tuple[float, float] | None:
    """Log-axis limits of the consensus plot from the values that describe the run: every
    positive value but those of the first step. The replicas start from one initialisation, so
    the first step's Θ (and Ξ) measure a single local step (1e-7 with a warm-up lr of 0) — drawn
    down to there the axis would spend most of its decades on a value the run never returns
    to. That point stays plotted; its line leaves through the bottom edge."""
    keep = np.isfinite(x) & np.isfinite(y) & (y > 0)
    if not keep.any():
        return None
    later = keep & (x > np.min(x[keep]))
    values = y[later] if later.any() else y[keep]
    return float(np.min(values)) / 1.5, float(np.max(y[keep])) * 1.5


def _byte_unit(largest: float) -> tuple[float, str]:
    """The binary unit (factor, name) in which ``largest`` bytes reads as 1 … 1023."""
    names = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    power = 0
    while power < len(names) - 1 and largest >= 1024.0 ** (power + 1):
        power += 1
    return 1024.0**power, names[power]


def _bytes_figure(s: _RunSeries, title: str) -> Figure:
    fig, ax = _new_figure(f"{title} — communication")
    x, y = _decimate(*_finite_pair(s.step["epoch"], s.step["bytes_sent"]))
    if x.size:
        unit, name = _byte_unit(float(np.max(y)))
        ax.plot(x, y / unit, color="C0", lw=1.4)
        ax.set_ylim(bottom=0)
        _frame(ax, s.step["epoch"], s.runs, "epoch", f"bytes sent, cumulative, all peers ({name})")
    else:
        _no_data(ax, "bytes sent")
    return fig


def write_plots(run_dir: str | Path) -> list[Path]:
    """Write accuracy.png, consensus.png, rounds.png and bytes.png into ``run_dir``.

    Reads ``run_dir/metrics.jsonl`` (FileNotFoundError if absent) and, for the titles,
    summary.json or config.toml when present. Returns the written paths in that order; every file
    is written even when its series were never measured (the plot then says so).
    """
    run_dir = Path(run_dir)
    drawn = figures(read_metrics(run_dir), run_title(run_dir))
    return [_save(fig, run_dir / f"{name}.png") for name, fig in drawn.items()]


def figures(records: Sequence[MetricsRecord], title: str) -> dict[str, Figure]:
    """The four figures of a run's metrics records, by file stem: accuracy, consensus, rounds,
    bytes (`write_plots` saves them)."""
    series = _RunSeries(records)
    return {
        "accuracy": _accuracy_figure(series, title),
        "consensus": _consensus_figure(series, title),
        "rounds": _rounds_figure(series, title),
        "bytes": _bytes_figure(series, title),
    }
