"""`concord sweep --preset`: grid construction of every preset, unknown names, and a tiny real run
(vectorized engine, 4 peers, a few steps) whose report, table and plots are checked."""

from __future__ import annotations

import csv
import io
import itertools
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from concord.core.config import apply_overrides, load_config
from concord.core.records import RunSummary
from concord.lab.cli import main
from concord.lab.presets import PresetGrid, get_preset, preset_main, select
from concord.lab.presets.catalog import PRESETS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_row_column_and_seed_with_its_overrides(name: str) -> None:
    preset = PRESETS[name]
    grid = PresetGrid(preset, (0, 1, 2))
    runs = {r.name: r for r in grid.runs()}
    cells = [(r.key, c.key) for r in preset.rows for c in preset.columns if r.runs_in(c.key)]
    assert len(runs) == len(cells) * 3  # names are unique
    seen = set()
    for run in grid.runs():
        row_key, col_key, lr = grid.cell_of[run.name]
        row, col = preset.row(row_key), next(c for c in preset.columns if c.key == col_key)
        assert dict(run.overrides) == {
            **row.overrides, **col.overrides, "optim.lr": row.lrs[col_key], "seed": run.seed,
        }  # fmt: skip
        assert lr == row.lrs[col_key]
        assert run.row == row.label
        assert run.column == col.label
        seen.add((row_key, col_key, run.seed))
    assert seen == {(r, c, seed) for (r, c), seed in itertools.product(cells, [0, 1, 2])}


def test_rows_limited_to_columns_run_only_there() -> None:
    preset = PRESETS["detag-unshuffled"]
    grid = PresetGrid(preset, (0, 1, 2))
    slack = [grid.cell_of[r.name][:2] for r in grid.runs() if r.overrides.get("kappa") == 0.01]
    assert sorted(set(slack)) == [("detag-k0.01", "x0"), ("dsgt-k0.01", "x0")]
    assert len(slack) == 2 * 3
    full = sum(not r.only for r in preset.rows)
    assert full >= 4  # D-SGD, D², DSGT, DeTAG run in every column
    assert len(grid.runs()) == (full * 4 + 2) * 3
    tune = PresetGrid(preset, (100,), tune=True)  # tuned on X = 0 and X = 100 % only
    assert {grid_cell[1] for grid_cell in tune.cell_of.values()} == {"x0", "x100"}
    assert len(tune.runs()) == (full * 2 + 2) * len(preset.row("dsgd").lr_grid)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_run_of_the_preset_is_a_valid_config(name: str) -> None:
    preset = PRESETS[name]
    base = load_config(None, ["engine=vectorized", *preset.base], environ={})
    for run in PresetGrid(preset, (0,)).runs():
        cfg = apply_overrides(base, run.overrides)
        assert cfg.algorithm == run.overrides["algorithm"]
        assert cfg.optim.lr == run.overrides["optim.lr"]
        # no consensus control; a fixed number of rounds per step for equal-budget rows
        fixed = run.overrides.get("control.mode") == "fixed"
        assert cfg.control.mode == ("fixed" if fixed else "none")
        assert cfg.control.rounds == run.overrides.get("control.rounds", 1)
        assert cfg.threads == 1  # sweeps run with --jobs 1 next to other work: one core


def test_tuning_grid_runs_every_lr_of_every_row() -> None:
    preset = PRESETS["relaysgd-dirichlet"]
    grid = PresetGrid(preset, (100,), tune=True)
    expected = sum(
        len(r.lr_grid) * sum(r.runs_in(c.key) for c in preset.columns)
        for r in preset.rows
        if len(r.lr_grid) > 1  # a one-lr row (stability check) has nothing to tune
    )  # every column (no tune_columns), rows limited by Setup.only
    assert any(len(r.lr_grid) == 1 for r in preset.rows)
    assert not any(grid.cell_of[r.name][0] == "allreduce-lr0.1" for r in grid.runs())
    assert len(grid.runs()) == expected
    trees = [r for r in grid.runs() if grid.cell_of[r.name][0] == "relaysgd-trees"]
    assert sorted({r.overrides["optim.lr"] for r in trees}) == sorted(  # type: ignore[type-var]
        preset.row("relaysgd-trees").lr_grid
    )
    assert {r.seed for r in grid.runs()} == {100}
    assert "relaysgd-trees-lr0.3_a0.01_s100" in grid.cell_of


def test_unknown_preset_row_column_and_seeds_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown preset 'nope'; valid: relaysgd-dirichlet, detag"):
        get_preset("nope")
    with pytest.raises(ValueError, match=r"no row \['sgd'\]; valid: \['dsgd'"):
        select(PRESETS["detag-unshuffled"], ["sgd"], None)
    with pytest.raises(ValueError, match="seeds has duplicates"):
        PresetGrid(PRESETS["detag-unshuffled"], (1, 1))
    result = CliRunner().invoke(main, ["sweep", "--preset", "nope"])
    assert result.exit_code == 2
    assert "valid: relaysgd-dirichlet, detag-unshuffled" in result.output
    bad_row = CliRunner().invoke(main, ["sweep", "--preset", "detag-unshuffled", "--rows", "x"])
    assert bad_row.exit_code == 2
    assert "has no row ['x']; valid: ['dsgd', 'd2', 'dsgt', 'detag'" in bad_row.output
    listed = CliRunner().invoke(main, ["sweep", "--list-presets"])
    assert listed.exit_code == 0
    listed_names = [line.split()[0] for line in listed.output.splitlines()]
    assert listed_names == [*PRESETS, "consensus-control", "async", "consensus-pystdlib"]


def test_tiny_preset_run_writes_report_table_and_plots(tmp_path: Path) -> None:
    """2 rows × 2 columns × 2 seeds of relaysgd-dirichlet, 4 peers, 8 steps, real engine."""
    out = preset_main(
        "relaysgd-dirichlet",
        seeds=[0, 1],
        jobs=1,
        out_dir=tmp_path / "tiny",
        overrides=["peers=4", "dataset.samples=600", "epochs=1", "eval.every=0.5"],
        rows=["allreduce", "relaysgd-trees"],
        columns=["a1", "a0.01"],
        console=Console(file=io.StringIO()),
    )
    with open(out / "table.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 2 * 2
    assert {r["status"] for r in rows} == {"ok"}
    assert {(r["row"], r["column"], r["seed"]) for r in rows} == set(
        itertools.product(
            ["all-reduce", "RelaySGD (double binary trees)"],
            ["α = 1", "α = 0.01"],
            ["0", "1"],
        )
    )
    preset = PRESETS["relaysgd-dirichlet"]
    want = {
        (row.label, col.label): row.lrs[col.key]
        for row in preset.rows
        for col in preset.columns
        if row.runs_in(col.key)
    }
    for r in rows:  # each run trained with its row's tuned lr for its column
        assert float(r["lr"]) == want[r["row"], r["column"]], r["name"]
    assert want["RelaySGD (double binary trees)", "α = 1"] != want["all-reduce", "α = 1"]
    assert all(0.0 <= float(r["accuracy_worst_peer"]) <= 1.0 for r in rows)
    report = (out / "report.md").read_text()
    command = json.loads((out / "preset.json").read_text())["command"]
    assert command.startswith("concord sweep --preset relaysgd-dirichlet --seeds 0,1 --jobs 1")
    assert "--set peers=4" in command
    assert "--rows allreduce,relaysgd-trees --columns a1,a0.01" in command
    assert f"```bash\n{command}\n```" in report
    for label in ("| all-reduce |", "| RelaySGD (double binary trees) |"):
        assert report.count(label) >= 4, label  # rows table + accuracy and loss tables
    assert "| row | α = 1 | α = 0.01 |" in report
    assert "| D-SGD (ring) |" not in report  # unselected rows are left out everywhere
    assert "α = 0.01: RelaySGD (double binary trees) ≥ all-reduce − 2 pt:" in report
    pngs = ["metric.png", "curves-a1.png", "curves-a0.01.png"]
    for png in pngs:
        assert f"]({png})" in report
        data = (out / png).read_bytes()
        assert data[:8] == PNG_MAGIC, png
        assert len(data) > 10_000, png  # a drawn figure, not an empty canvas
    assert not list((out / "runs").glob("*/accuracy.png"))  # no per-run plots in preset sweeps
    # the report can be rewritten from the finished sweep alone
    (out / "report.md").unlink()
    preset_main(
        "relaysgd-dirichlet",
        seeds=[0, 1],
        out_dir=out,
        overrides=["peers=4", "dataset.samples=600", "epochs=1", "eval.every=0.5"],
        rows=["allreduce", "relaysgd-trees"],
        columns=["a1", "a0.01"],
        report_only=True,
        console=Console(file=io.StringIO()),
    )
    assert _undated((out / "report.md").read_text()) == _undated(report)


def _undated(report: str) -> str:
    return re.sub(r"Generated \d{4}-\d\d-\d\d", "Generated <date>", report)


def fake_run(
    cfg: object, out_dir: Path, *, progress: bool = False, calibration_cache: Path | None = None
) -> dict[str, object]:
    """Writes summary.json like the engine (that is what --resume looks for) and counts calls."""
    with open(out_dir.parent.parent / "calls.txt", "a") as f:
        f.write(out_dir.name + "\n")
    summary = RunSummary(
        engine="vectorized", algorithm="dsgd", topology="ring", peers=2, steps=3, epochs=1,
        seed=0, plan="gossip", control_mode="none", control_factor=None,
        accuracy_avg_model=0.5, accuracy_worst_peer=0.4, accuracy_mean_peer=0.45,
        gossip_rounds_total=3, bytes_sent_total=0, bytes_raw_total=0,
        final_consensus_distance=None, partition_sha256=None, wall_seconds=0.0,
        run_dir=str(out_dir),
    ).to_json()  # fmt: skip
    (out_dir / "summary.json").write_text(json.dumps(summary))
    return dict(summary)


def test_resume_reuses_finished_runs_and_runs_the_rest(tmp_path: Path) -> None:
    def run(rows: list[str], resume: bool) -> None:
        preset_main(
            "detag-unshuffled", seeds=[0], out_dir=tmp_path, rows=rows, columns=["x0"],
            resume=resume, run_fn=fake_run, console=Console(file=io.StringIO()),
        )  # fmt: skip

    run(["dsgd"], resume=False)
    assert (tmp_path / "calls.txt").read_text().split() == ["dsgd_x0_s0"]
    run(["dsgd", "dsgt"], resume=True)
    assert (tmp_path / "calls.txt").read_text().split() == ["dsgd_x0_s0", "dsgt_x0_s0"]
    with open(tmp_path / "table.csv", newline="") as f:
        table = {r["name"]: r for r in csv.DictReader(f)}
    assert set(table) == {"dsgd_x0_s0", "dsgt_x0_s0"}
    assert {r["status"] for r in table.values()} == {"ok"}
    assert table["dsgd_x0_s0"]["accuracy_avg_model"] == "0.5"  # read back from its summary
    assert json.loads((tmp_path / "preset.json").read_text())["reused_runs"] == 1
    assert "| DSGT | 50.00 |" in (tmp_path / "report.md").read_text()


def test_every_preset_runs_through_one_study_table(tmp_path: Path) -> None:
    """consensus-control is an entry of the same table as the catalog's presets (no name test):
    the list, the unknown-name error and its own refusal of --tune come from there."""
    from concord.lab.presets import Study, get_study, studies

    table = studies()
    assert list(table) == [*PRESETS, "consensus-control", "async", "consensus-pystdlib"]
    assert all(isinstance(s, Study) and s.name == name for name, s in table.items())
    assert get_study("consensus-control").title.startswith("Consensus control")
    with pytest.raises(ValueError, match=r"unknown preset 'nope'; valid: .*, consensus-control"):
        preset_main("nope")
    with pytest.raises(ValueError, match="--tune: preset 'consensus-control' has no lr grid"):
        preset_main("consensus-control", tune=True, out_dir=tmp_path / "cc")
    assert not (tmp_path / "cc").exists()  # refused before anything is written
