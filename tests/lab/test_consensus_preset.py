"""The consensus-control preset (`concord.lab.presets.consensus`): its grid pairs every cell
with all-reduce on the same seeds and shares calibration passes; its statistics (mean ± 95 % CI,
paired differences, rounds against the uncontrolled run) and claims come from ``runs.csv``; a
tiny real sweep writes the CSV, the report and the plots."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from concord.lab.presets import preset_main
from concord.lab.presets.consensus import (
    BEFORE,
    CELLS,
    before_after,
    checks,
    grid,
    read_runs_csv,
    summarize,
    write_runs_csv,
)
from concord.lab.report import CellStats


def test_the_grid_pairs_seeds_and_groups_calibrations() -> None:
    runs = grid(["allreduce", "p1-none", "p1-1over4-xi", "p1-1over2-xi"], ["n64"], [0, 1])
    assert len(runs) == 8
    assert {r.seed for r in runs if r.row == "allreduce"} == {0, 1}
    xi = [r for r in runs if r.row in ("p1-1over4-xi", "p1-1over2-xi")]
    # the same calibration pass (phase 1, Ξ, n, seed) for both factors of a seed
    assert len({r.calibration_group for r in xi}) == 2
    assert all(r.overrides["peers"] == 64 for r in runs)
    assert CELLS["p1-1over4-xi"].overrides()["control.statistic"] == "xi"
    assert CELLS["allreduce"].overrides()["algorithm"] == "allreduce"


def test_the_confidence_interval_is_students_from_cellstats() -> None:
    """The report's "mean ± 95 % CI" is `CellStats.ci95`, the one interval of the lab."""
    stats = CellStats((1.0, 2.0, 3.0, 4.0, 5.0), 5)
    assert stats.mean == 3.0
    assert stats.ci95 == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5), rel=1e-4)  # t(4)
    rows = [_row("all", "allreduce", "", seed, acc, 0) for seed, acc in enumerate([0.91, 0.93])]
    (cell,) = summarize(rows)
    assert cell["acc"] == pytest.approx((92.0, 12.706 * stats_of([91.0, 93.0]).std / math.sqrt(2)))
    assert math.isnan(CellStats((1.0,), 1).ci95)  # one seed: no interval


def stats_of(values: list[float]) -> CellStats:
    return CellStats(tuple(values), len(values))


def _row(phase: str, target: str, stat: str, seed: int, acc: float, rounds: int) -> dict:
    return {"n": 64, "phase": phase, "target": target, "statistic": stat, "seed": seed,
            "accuracy_avg_model": acc, "gossip_rounds": rounds, "bytes_per_peer": 1000,
            "status": "ok", "run": f"r{seed}"}  # fmt: skip


def test_summaries_and_claims_follow_the_runs() -> None:
    rows = []
    for seed, base in enumerate([0.94, 0.95, 0.93]):
        rows.append(_row("all", "allreduce", "", seed, base, 0))
        rows.append(_row("1", "none", "", seed, base - 0.02, 480))
        rows.append(_row("1", "1/4", "theta", seed, base - 0.002, 1500))
    cells = {c["target"]: c for c in summarize(rows)}
    assert cells["none"]["diff"][0] == pytest.approx(-2.0)
    assert cells["none"]["diff"][1] == pytest.approx(0.0, abs=1e-9)  # paired: the same gap
    assert cells["1/4"]["rounds_ratio"] == pytest.approx(1500 / 480)
    found = {claim: holds for claim, holds, _ in checks(list(cells.values()), 64)}
    assert found["uncontrolled ≥ 1 pp below all-reduce"] is True
    assert found["¼ · max theta within 0.5 pp of all-reduce"] is True
    assert found["¼ · max theta: rounds ≤ 4 × uncontrolled"] is True


def test_the_fix_section_compares_every_cell_with_the_grid_before_it(tmp_path: Path) -> None:
    def grid_rows(shift: float) -> list[dict]:
        rows = []
        for seed, base in enumerate([0.94, 0.95, 0.93]):
            rows.append(_row("all", "allreduce", "", seed, base + shift, 0))
            rows.append(_row("1", "none", "", seed, base - 0.02, 480))
        return rows

    after = summarize(grid_rows(0.01))  # the fix lifts all-reduce by 1 pp, not gossip
    assert before_after(tmp_path, after) == []  # nothing to compare with
    (tmp_path / BEFORE).mkdir()
    full = [{**r, "mode": "none"} for r in grid_rows(0.0)]
    write_runs_csv(tmp_path / BEFORE / "runs.csv", full)
    lines = before_after(tmp_path, after)
    table = [line for line in lines if line.startswith("| 64 |")]
    assert len(table) == 2
    assert table[0].startswith("| 64 | all-reduce | 94.00 ± 2.48 | 95.00 ± 2.48 | +1.00 |")
    # gossip unchanged; its paired gap to all-reduce widens from −2 to −3 pp
    assert "| +0.00 | -2.00 ± 0.00 | -3.00 ± 0.00 | 480 | 480 |" in table[1]


def test_a_tiny_sweep_writes_the_csv_the_report_and_the_plots(tmp_path: Path) -> None:
    out = preset_main(
        "consensus-control",
        seeds=[0, 1],
        jobs=1,
        out_dir=tmp_path / "cc",
        overrides=["dataset.samples=2000", "epochs=2", "eval.every=1"],
        rows=["allreduce", "p1-none", "p1-1over4-theta"],
        columns=["n32"],
    )
    rows = read_runs_csv(out / "runs.csv")
    assert len(rows) == 6
    assert all(r["status"] == "ok" for r in rows)
    assert {r["target"] for r in rows} == {"allreduce", "none", "1/4"}
    report = (out / "report.md").read_text()
    assert "concord sweep --preset consensus-control --seeds 0,1" in report
    assert "## n = 32" in report
    for png in ("accuracy-rounds.png", "xi-n32.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --report-only rebuilds the same report from the CSV alone
    rows_again = ["allreduce", "p1-none", "p1-1over4-theta"]
    again = preset_main(
        "consensus-control", out_dir=out, report_only=True, rows=rows_again, columns=["n32"]
    )
    assert (again / "report.md").read_text() == report


def test_resume_adds_a_grid_and_keeps_the_earlier_rows_and_commands(tmp_path: Path) -> None:
    tiny = ["dataset.samples=2000", "epochs=2", "eval.every=1"]
    out = tmp_path / "cc"
    preset_main("consensus-control", seeds=[0, 1], out_dir=out, overrides=tiny,
                rows=["allreduce", "p1-none"], columns=["n32"])  # fmt: skip
    preset_main("consensus-control", seeds=[0, 1], out_dir=out, overrides=tiny, resume=True,
                rows=["allreduce", "p1-none"], columns=["n16"])  # fmt: skip
    rows = read_runs_csv(out / "runs.csv")
    assert sorted({r["n"] for r in rows}) == [16, 32]
    assert len(rows) == 8
    assert all(r["status"] == "ok" for r in rows)
    report = (out / "report.md").read_text()
    assert "--columns n32" in report
    assert "--columns n16" in report  # both commands that wrote the CSV
    assert (out / "scaling.png").is_file()  # two sizes: the degradation against n
