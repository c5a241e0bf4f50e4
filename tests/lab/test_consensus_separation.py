"""The consensus-control reading's paired tests (`concord.lab.presets.consensus_separation`):
a controlled cell whose accuracy moves by the same amount on every seed is separated from the
uncontrolled run, one whose difference changes sign over the seeds is not, and the bullet names
both, with every pair of variants; and the reading generated from the committed runs.csv carries
the n = 128 bullet the committed report shows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from concord.lab.presets.consensus import read_runs_csv, reading, summarize
from concord.lab.presets.consensus_separation import paired_accuracy, separated, separation

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def _row(target: str, stat: str, seed: int, acc: float) -> dict[str, Any]:
    return {"n": 128, "phase": "1", "target": target, "statistic": stat, "seed": seed,
            "accuracy_avg_model": acc, "gossip_rounds": 240, "bytes_per_peer": 1,
            "status": "ok", "run": f"{target}-{stat}-{seed}"}  # fmt: skip


def _rows() -> list[dict[str, Any]]:
    rows = []
    for seed, base in enumerate([0.84, 0.86, 0.82, 0.85, 0.83]):
        rows.append(_row("none", "", seed, base))
        rows.append(_row("1/4", "xi", seed, base + 0.05 + 0.001 * seed))  # +5 pp, steady
        rows.append(_row("1/4", "theta", seed, base + (0.01 if seed % 2 else -0.01)))  # ±1 pp
    return rows


def test_a_steady_gain_is_separated_and_a_sign_changing_one_is_not() -> None:
    rows = _rows()
    seeds, mean, half = paired_accuracy(rows, 128, ("1/4", "xi"), ("none", ""))
    assert seeds == [0, 1, 2, 3, 4]
    assert mean == pytest.approx(5.2, abs=1e-9)  # 5 pp + 0.1 pp · mean seed (2)
    # t(4) = 2.776 times the sd of 5.0, 5.1, …, 5.4 over √5; tolerance: float sums
    assert half == pytest.approx(2.776 * math.sqrt(0.025) / math.sqrt(5), rel=1e-3)
    assert separated(mean, half) is True
    seeds, mean, half = paired_accuracy(rows, 128, ("1/4", "theta"), ("none", ""))
    assert mean == pytest.approx(-0.2, abs=1e-9)  # −1, +1, −1, +1, −1
    assert separated(mean, half) is False
    assert separated(1.0, math.nan) is None  # one seed: no interval, no verdict
    assert paired_accuracy(rows, 64, ("1/4", "xi"), ("none", "")) == ([], math.nan, math.nan)


def test_the_bullet_names_what_is_separated_from_uncontrolled_and_from_each_other() -> None:
    (line,) = separation(_rows(), 128)
    assert line.startswith("- **n = 128, phase 1: which variants are separated at 95 %**")
    assert "Separated from uncontrolled: ¼ · max Ξ; not separated: ¼ · max Θ." in line
    assert "Separated from each other: ¼ · max Ξ − ¼ · max Θ." in line
    assert "¼ · max Ξ +5.20 ± " in line
    assert "3 comparisons" in line
    assert separation(_rows(), 64) == []  # nothing at that n


def test_the_committed_reading_states_the_n128_separations() -> None:
    rows = read_runs_csv(RESULTS / "consensus-control" / "runs.csv")
    text = "\n".join(reading(summarize(rows), rows))
    bullet = next(ln for ln in text.splitlines() if ln.startswith("- **n = 128, phase 1: which"))
    for name in ("¼ · max Ξ", "¼ · max Θ", "⅛ · max Θ", "adaptive"):
        assert f"{name} +" in bullet or f"{name} -" in bullet  # each against uncontrolled
    report = (RESULTS / "consensus-control" / "report.md").read_text(encoding="utf-8")
    assert bullet in report  # the committed report is the generated text
