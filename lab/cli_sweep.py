"""``concord sweep`` and ``concord report verify``: grids of runs, their tables and reports, and
the re-run of a committed report's cell."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from concord.core.config import ConfigError
from concord.lab.cli_common import fail, out_option, set_option


@click.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--plans",
    default="dec-phase-1",
    show_default=True,
    help="comma-separated plans (rows), e.g. dec-phase-1,dec-phase-2",
)
@click.option(
    "--factors",
    default="none,0.5,0.25",
    show_default=True,
    help="comma-separated target factors (columns); 'none' = uncontrolled",
)
@click.option("--topologies", default=None, help="comma-separated topologies (default: config's)")
@click.option("--seeds", default=None, help="comma-separated seeds (default: 0; a preset's own)")
@click.option("--baseline", "baselines", multiple=True, help="baseline rows, e.g. allreduce")
@click.option(
    "--control-mode",
    type=click.Choice(["constant", "adaptive"]),
    default="constant",
    show_default=True,
    help="how numeric factors set targets",
)
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="parallel runs")
@click.option(
    "--metric",
    type=click.Choice(["avg", "worst", "mean"]),
    default="avg",
    show_default=True,
    help="accuracy reported in the table",
)
@set_option
@out_option("directory of the sweep's runs, table and report")
@click.option(
    "--preset",
    default=None,
    metavar="NAME",
    help="a named reproduction grid with its own report (see --list-presets); --jobs default 1",
)
@click.option("--list-presets", is_flag=True, help="list the presets and exit")
@click.option("--tune", is_flag=True, help="preset: run each row's lr grid at the tune seed")
@click.option(
    "--report-only", is_flag=True, help="preset: rewrite the report of a finished --out sweep"
)
@click.option("--resume", is_flag=True, help="preset: reuse the finished runs in --out")
@click.option("--rows", "preset_rows", default=None, help="preset: only these row keys (a,b)")
@click.option("--columns", "preset_columns", default=None, help="preset: only these column keys")
def sweep(
    config: Path | None,
    plans: str,
    factors: str,
    topologies: str | None,
    seeds: str | None,
    baselines: Sequence[str],
    control_mode: str,
    jobs: int | None,
    metric: str,
    overrides: Sequence[str],
    out: Path | None,
    preset: str | None,
    list_presets: bool,
    tune: bool,
    report_only: bool,
    resume: bool,
    preset_rows: str | None,
    preset_columns: str | None,
) -> None:
    """Run a grid (plans × factors × topologies × seeds) and print a Table-2-shaped summary.

    With --preset NAME: run a named grid of algorithm setups × data settings × seeds and write
    report.md, table.csv and PNG plots into --out.

    Exit 0: every run succeeded; 1: one run or more failed (the tables are written all the same,
    each run's error in table.csv and its error.txt); 2: bad input, nothing ran."""
    from concord.core.config import load_config
    from concord.lab.sweep import sweep_main

    if list_presets or preset is not None:
        _sweep_preset(
            preset,
            list_presets,
            config,
            seeds,
            jobs,
            overrides,
            out,
            (tune, report_only, resume),
            (_keys(preset_rows), _keys(preset_columns)),
        )
        return
    seeds = "0" if seeds is None else seeds
    try:
        cfg = load_config(config, list(overrides))
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ConfigError as exc:
        fail(str(exc))
    except ValueError:
        fail(f"--seeds must be comma-separated integers; got {seeds!r}")
    topo_list = [t.strip() for t in topologies.split(",")] if topologies else [cfg.topology]
    try:
        swept = sweep_main(
            config_path=config,
            overrides=list(overrides),
            plans=[p.strip() for p in plans.split(",") if p.strip()],
            factors=[f.strip() for f in factors.split(",") if f.strip()],
            topologies=topo_list,
            seeds=seed_list,
            baselines=list(baselines),
            jobs=jobs,
            out_dir=out,
            metric=metric,
            control_mode=control_mode,
        )
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    _exit_if_runs_failed(swept)


def _exit_if_runs_failed(out: Path) -> None:
    """Exit 1 naming the failed runs of the sweep in ``out``, if any (`concord.lab.sweep`)."""
    from concord.lab.sweep import read_failures

    table = out / "table.csv"  # a --resume with nothing left to run may have none
    if table.is_file() and (message := read_failures(table).message()) is not None:
        fail(message, 1)


def _keys(text: str | None) -> list[str] | None:
    return None if text is None else [k.strip() for k in text.split(",") if k.strip()]


def _sweep_preset(
    name: str | None,
    list_only: bool,
    config: Path | None,
    seeds: str | None,
    jobs: int | None,
    overrides: Sequence[str],
    out: Path | None,
    flags: tuple[bool, bool, bool],
    subset: tuple[list[str] | None, list[str] | None],
) -> None:
    from concord.lab.presets import list_presets, preset_main

    tune, report_only, resume = flags
    if list_only or name is None:
        for preset_name, title in list_presets():
            click.echo(f"{preset_name:<20}  {title}")
        return
    if config is not None:
        fail("--preset defines its own configuration; use --set KEY=VALUE instead of a CONFIG")
    if (report_only or resume) and out is None:
        fail("--report-only and --resume need --out, the directory of the sweep")
    try:
        seed_list = None if seeds is None else [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds must be comma-separated integers; got {seeds!r}")
    try:
        swept = preset_main(
            name,
            seeds=seed_list,
            jobs=jobs,
            out_dir=out,
            overrides=list(overrides),
            tune=tune,
            report_only=report_only,
            resume=resume,
            rows=subset[0],
            columns=subset[1],
        )
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    if not report_only:
        _exit_if_runs_failed(swept)


@click.group("report")
def report_group() -> None:
    """Check the reports of preset sweeps (committed under docs/results/<preset>/)."""


@report_group.command("verify")
@click.argument("directories", nargs=-1, required=True, metavar="DIR[::RUN]...")
@click.option("--run", "run_name", default=None, metavar="NAME", help="a run name of the CSV")
@click.option("--row", default=None, metavar="KEY", help="the cell's row (key or label)")
@click.option("--column", default=None, metavar="KEY", help="the cell's column (key or label)")
@click.option("--seed", type=int, default=None, help="the cell's seed (default: its first)")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="directory of the re-runs (default: a fresh temporary directory); with several DIRs, "
    "one sub-directory <i>-<name> per DIR",
)
@click.option(
    "--tol",
    type=float,
    default=0.5,
    show_default=True,
    help="tolerance of the accuracies, in percentage points",
)
@click.option(
    "--count-tol",
    type=float,
    default=None,
    metavar="FRACTION",
    help="relative tolerance of gossip rounds and bytes (default: 0, exact, without consensus "
    "control; 0.1 with it, since its rounds follow the float trajectory)",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PATH",
    help="write the reproducibility record: one row per directory, run and metric (overwritten)",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PATH",
    help="write a markdown report generated from the --csv rows (needs --csv; overwritten)",
)
@click.option(
    "--at-commit",
    is_flag=True,
    help="when both the host and the code differ from the report's, re-run the cell with the "
    "report's commit too (a temporary git worktree) to decide which explains a difference",
)
@click.pass_context
def report_verify(
    ctx: click.Context,
    directories: tuple[str, ...],
    run_name: str | None,
    row: str | None,
    column: str | None,
    seed: int | None,
    out: str | None,
    tol: float,
    count_tol: float | None,
    csv_path: str | None,
    markdown_path: str | None,
    at_commit: bool,
) -> None:
    """Re-run one cell of the report in each DIR (table.csv, or consensus-control's runs.csv)
    with its recorded configuration and compare accuracy, worst peer, gossip rounds and bytes
    with the committed values; also compare the recorded torch, CPU and threads with this
    machine's (float results are machine-dependent). Default cell: the CSV's first run that
    succeeded; DIR::RUN picks the run RUN of DIR; --run, or --row/--column/--seed, only with a
    single DIR. --csv and --markdown write a reproducibility record of all the cells.
    Exit 0: every metric within tolerance; 1: a metric differs; 2: bad input."""
    from click.core import ParameterSource

    from concord.lab.verify import VerifyError, command_line, parse_directories, verify_reports

    given = [
        (option, value)
        for option, name, value in (
            ("--run", "run_name", run_name),
            ("--row", "row", row),
            ("--column", "column", column),
            ("--seed", "seed", seed),
            ("--out", "out", out),
            ("--tol", "tol", tol),
            ("--count-tol", "count_tol", count_tol),
            ("--csv", "csv_path", csv_path),
            ("--markdown", "markdown_path", markdown_path),
            ("--at-commit", "at_commit", at_commit or None),
        )
        if value is not None and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ]
    try:
        choices = parse_directories(directories, run=run_name, row=row, column=column, seed=seed)
        code = verify_reports(
            choices,
            out=out,
            tol=tol,
            count_tol=count_tol,
            csv_path=csv_path,
            markdown_path=markdown_path,
            command=command_line(directories, given),
            echo=click.echo,
            at_commit=at_commit,
        )
    except VerifyError as exc:
        fail(str(exc))
    sys.exit(code)
