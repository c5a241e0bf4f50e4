"""The run plots on records shaped as each engine writes them: every legend entry has a visible
line or marker behind it, the consensus axis is not stretched to step 0's Θ, and the series of
rounds.png have distinct colours."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from concord.core.records import MetricsRecord, StepRecord, metrics_record
from concord.runtime.plots import figures, write_plots

STEPS = 900  # ≥ 400: rounds.png draws its moving average
PHASES = (300, 600)  # phase changes (steps)


def _records(engine: str) -> list[MetricsRecord]:
    """A three-phase run with consensus control: the vectorized engine records Ξ at every step
    and evaluates the averaged model every 100 steps; the processes engine (peers' records,
    merged) has per-peer evaluations only, then the averaged model and Ξ once, at the end.
    Written as unversioned lines (the old ``acc_*`` names), read as records."""
    records: list[dict[str, Any]] = []
    for t in range(STEPS):
        phase = 1 + sum(t >= p for p in PHASES)
        theta = 1.6e-7 if t == 0 else 0.05 * math.exp(-t / 300) * (1 + 0.2 * math.sin(t))
        step: dict[str, Any] = {
            "kind": "step", "step": t, "epoch": (t + 1) / 30, "phase": phase, "loss": 2.0,
            "rounds": 1 + (t % 7 == 0) + (t % 13 == 0), "theta": theta,
            "target": 0.06 * math.exp(-t / 300), "bytes_sent": 1000 * (t + 1),
            "rounds_total": t + 1 + t // 7 + t // 13, "lr": 0.1, "train_acc": None,
            "grad_norm": None,
        }  # fmt: skip
        if engine == "vectorized":
            step["xi"] = 0.0 if t == 0 else 1.2 * theta
        records.append(step)
        if (t + 1) % 100 == 0:
            acc = 0.5 + 0.4 * t / STEPS
            ev: dict[str, Any] = {"kind": "eval", "step": t, "epoch": (t + 1) / 30,
                                  "acc_mean_peer": acc, "acc_worst_peer": acc - 0.05,
                                  "acc_best_peer": acc + 0.03}  # fmt: skip
            if engine == "vectorized":
                ev |= {"acc_avg_model": acc + 0.02, "xi": 1.2 * theta}
            records.append(ev)
    if engine == "processes":
        records.append({"kind": "eval", "step": STEPS - 1, "epoch": STEPS / 30,
                        "acc_avg_model": 0.93, "xi": 2e-3, "acc_mean_peer": 0.9,
                        "acc_worst_peer": 0.85, "acc_best_peer": 0.93})  # fmt: skip
    return [metrics_record(r, where=f"metrics.jsonl:{i}") for i, r in enumerate(records, 1)]


def _lines(fig: Figure) -> dict[str, Line2D]:
    """The labelled lines (not the phase marks, whose labels start with "_")."""
    lines = (line for ax in fig.axes for line in ax.get_lines())
    return {
        str(line.get_label()): line for line in lines if not str(line.get_label()).startswith("_")
    }


def _legend_labels(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]


def _shows_something(line: Line2D) -> bool:
    """At least two joined finite points, or a marker on a finite point."""
    y = np.asarray(line.get_ydata(), dtype=float)
    x = np.asarray(line.get_xdata(), dtype=float)
    finite = np.isfinite(x) & np.isfinite(y)
    joined = bool((finite[1:] & finite[:-1]).any()) and line.get_linestyle() != "None"
    marked = bool(finite.any()) and line.get_marker() not in (None, "None", "", " ")
    return line.get_visible() and (joined or marked)


@pytest.mark.parametrize("engine", ["vectorized", "processes"])
def test_every_legend_entry_has_something_drawn_behind_it(engine: str) -> None:
    drawn = figures(_records(engine), "t")
    for name in ("accuracy", "consensus", "rounds"):
        fig = drawn[name]
        lines = _lines(fig)
        labels = _legend_labels(fig)
        assert labels, name
        for label in labels:
            assert _shows_something(lines[label]), f"{name}: {label!r} draws nothing visible"
    labels = _legend_labels(drawn["accuracy"]) + _legend_labels(drawn["consensus"])
    assert "averaged model x̄" in labels
    assert "exact Ξ" in labels


def test_a_single_final_measurement_is_a_star() -> None:
    drawn = figures(_records("processes"), "t")
    for name, label in (("accuracy", "averaged model x̄"), ("consensus", "exact Ξ")):
        line = _lines(drawn[name])[label]
        assert line.get_marker() == "*"
        assert np.isfinite(np.asarray(line.get_ydata(), dtype=float)).sum() == 1


@pytest.mark.parametrize("engine", ["vectorized", "processes"])
def test_the_consensus_axis_ignores_step_zero(engine: str) -> None:
    fig = figures(_records(engine), "t")["consensus"]
    (ax,) = fig.axes
    bottom, top = ax.get_ylim()
    later = [
        r.theta
        for r in _records(engine)
        if isinstance(r, StepRecord) and r.step > 0 and r.theta is not None
    ]
    assert bottom > 1e-5  # not the 1.6e-7 of step 0
    assert bottom <= min(later)  # every later Θ is inside
    assert top >= 0.06  # and the target


def test_rounds_series_have_distinct_colours() -> None:
    fig = figures(_records("vectorized"), "t")["rounds"]
    lines = _lines(fig)
    assert set(lines) == {"rounds per step", "moving average", "cumulative"}
    colours = {to_hex(line.get_color()) for line in lines.values()}
    assert len(colours) == 3


@pytest.mark.parametrize("engine", ["vectorized", "processes"])
def test_the_pngs_are_written(engine: str, tmp_path: Path) -> None:
    with open(tmp_path / "metrics.jsonl", "w", encoding="utf-8") as f:
        for record in _records(engine):
            f.write(json.dumps(record.to_json()) + "\n")
    paths = write_plots(tmp_path)
    assert [p.name for p in paths] == ["accuracy.png", "consensus.png", "rounds.png", "bytes.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
