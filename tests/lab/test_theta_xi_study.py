"""The theta-xi study script (docs/results/theta-xi/study.py): ``tables --merge`` adds runs of
other seeds to its CSVs as if every run had been reduced at once (late-phase means weighted by
their counts) and refuses a run the CSVs already hold; the committed report is what ``report``
generates from the committed CSVs."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

STUDY = Path(__file__).resolve().parents[2] / "docs" / "results" / "theta-xi" / "study.py"


def _study() -> ModuleType:
    spec = importlib.util.spec_from_file_location("theta_xi_study", STUDY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _late(count: int, theta: float, xi: float) -> dict[str, Any]:
    return {"n": 128, "cell": "xi", "round": 1, "count": count, "theta": theta, "xi": xi,
            "theta_over_xi": theta / xi, "sketch_over_xi": 1.0}  # fmt: skip


def test_merge_weights_the_late_means_by_their_counts() -> None:
    study = _study()
    old_runs = [{"n": 128, "cell": "xi", "seed": s} for s in (0, 1, 2)]
    new_runs = [{"n": 128, "cell": "xi", "seed": s} for s in (3, 4)]
    # 360 rounds of the old seeds with mean Θ 1.0, 240 of the new ones with mean Θ 2.0
    runs, rows = study.merge_tables(old_runs, [_late(360, 1.0, 2.0)], new_runs,
                                    [_late(240, 2.0, 4.0)])  # fmt: skip
    assert [r["seed"] for r in runs] == [0, 1, 2, 3, 4]
    (row,) = rows
    assert row["count"] == 600
    # the mean over all 600 rounds; tolerance: float rounding of a weighted sum
    assert row["theta"] == pytest.approx(statistics.fmean([1.0] * 360 + [2.0] * 240), rel=1e-12)
    assert row["xi"] == pytest.approx((360 * 2.0 + 240 * 4.0) / 600, rel=1e-12)
    assert row["theta_over_xi"] == pytest.approx(0.5, rel=1e-12)


def test_merge_refuses_a_run_the_tables_already_hold() -> None:
    study = _study()
    old = [{"n": 128, "cell": "xi", "seed": 0}]
    with pytest.raises(ValueError, match=r"already in cells.csv .*\(128, 'xi', 0\)"):
        study.merge_tables(old, [], [{"n": "128", "cell": "xi", "seed": "0"}], [])


def test_the_committed_report_is_generated_from_the_committed_csvs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = _study()
    here = STUDY.parent
    for name in ("cells.csv", "rounds.csv"):
        (tmp_path / name).write_bytes((here / name).read_bytes())
    monkeypatch.setattr(study, "HERE", tmp_path)
    study.cmd_report()
    assert (tmp_path / "report.md").read_text(encoding="utf-8") == (here / "report.md").read_text(
        encoding="utf-8"
    )
    text = (here / "report.md").read_text(encoding="utf-8")
    for n in (64, 128):  # the check, at both sizes, on five seeds
        assert f"- n = {n}: ¼ · max Ξ̂ reaches the late Ξ of ¼ · max Ξ within 25 % on every " \
               "seed (5)" in text  # fmt: skip
