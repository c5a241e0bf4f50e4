"""``concord sweep --preset NAME``: named reproduction grids with their own report.

A preset is a grid of **rows** (algorithm setups: algorithm, topology, hyperparameters and a tuned
learning rate per column) × **columns** (data settings, e.g. the Dirichlet α of the partition) ×
seeds, on top of a base configuration. It runs through the ordinary sweep machinery
(`concord.lab.sweep.run_sweep`: spawn process pool, failure as data, ``table.csv`` rewritten after
each run) and then writes a report (`concord.lab.presets.report`): ``report.md`` with the setup, the
exact command, mean ± std tables and the expected orderings checked against the measurements, and
PNG plots.

Presets (docs/algorithms.md#reproduction-targets, items 7 and 9):

- ``relaysgd-dirichlet`` — Vogels et al. 2021 (RelaySum), Table 2 at MNIST-1D scale: 16 peers,
  Dirichlet α ∈ {1, 0.1, 0.01} (docs/algorithms.md#data-partitions), metric = the worst peer's test
  accuracy (the paper's) and the averaged model's;
- ``detag-unshuffled`` — Lu & De Sa 2021 (DeTAG), the "unshuffled data" experiment: a ring
  of 8, label-sorted data with the first X % shuffled, X ∈ {0, 25, 50, 100}, plus the slack matrix
  W_κ = κW + (1 − κ)I with κ = 0.01.

Learning rates: ``--tune`` runs each row over its ``lr_grid`` at one seed (``tune_seed``, not one
of the reported seeds) and reports the best lr per (row, column) by the preset's metric; those
choices are what the rows' ``lrs`` hold (the tuning reports are committed next to the results).
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from concord.core.config import apply_overrides, load_config
from concord.lab.presets import async_report, consensus, consensus_pystdlib, pystdlib
from concord.lab.presets.catalog import PRESETS
from concord.lab.presets.report import environment, run_manifest, write_report
from concord.lab.presets.spec import (
    Preset,
    PresetGrid,
    PresetRequest,
    RunList,
    Study,
    command_line,
    select,
)
from concord.lab.sweep import Outcome, RunFn, csv_row, run_sweep, run_without_plots, write_csv
from concord.runtime.records import read_summary


def _cell_keys(grid: PresetGrid) -> dict[str, tuple[str, str]]:
    """run name → (row key, column key)."""
    return {name: (row, col) for name, (row, col, _) in grid.cell_of.items()}


def _finished(grid: PresetGrid, out: Path) -> dict[str, dict[str, Any]]:
    """Table rows of the runs of ``grid`` whose run directory in ``out`` has a summary.json."""
    rows = {}
    for run in grid.runs():
        run_dir = out / "runs" / run.name
        summary = read_summary(run_dir)
        if summary is not None:
            rows[run.name] = csv_row(run, Outcome.ok(summary), run_dir)
    return rows


def preset_main(
    name: str,
    *,
    seeds: Sequence[int] | None = None,
    jobs: int | None = None,
    out_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    tune: bool = False,
    report_only: bool = False,
    resume: bool = False,
    rows: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    run_fn: RunFn | None = None,
    console: Console | None = None,
) -> Path:
    """Run preset ``name`` and write its report into ``out_dir``; returns ``out_dir``.

    ``seeds`` None → the preset's (``tune``: its tune seed); ``jobs`` None → 1; ``overrides``:
    "dotted.key=value" applied after the preset's base (e.g. smaller sizes for a quick look; the
    report's command line includes them). ``report_only``: run nothing, rewrite the report of
    the finished sweep in ``out_dir`` from its table.csv, run directories and preset.json.
    ``resume``: reuse every run of ``out_dir`` that has a summary.json (matched by run name —
    keep the preset and overrides unchanged), run the others (e.g. lrs added to a grid, or runs
    an interrupted sweep did not reach); the wall time then adds up the sweeps.
    ``rows`` / ``columns`` (keys; ``--rows`` / ``--columns``) keep only those rows / columns of
    the preset. Raises ValueError (ConfigError) for an unknown preset, row or column,
    bad seeds or a base config that does not validate, before any run starts.

    ``preset.json`` (next to table.csv) records the command, seeds, ``--set`` items, the
    environment (`concord.lab.presets.report.environment`: torch, CPU, threads, …) and every
    run's configuration (`concord.lab.presets.report.run_manifest`), which ``concord report
    verify`` re-runs a cell from.
    """
    request = PresetRequest(
        seeds=seeds,
        jobs=jobs,
        out_dir=None if out_dir is None else Path(out_dir),
        overrides=tuple(overrides),
        tune=tune,
        report_only=report_only,
        resume=resume,
        rows=rows,
        columns=columns,
        run_fn=run_fn,
        console=console,
    )
    return get_study(name).main(request)


def studies() -> dict[str, Study]:
    """Every entry of ``concord sweep --preset`` by name: the catalog's presets
    (`concord.lab.presets.catalog.PRESETS`, run by `run_preset`), then consensus-control and
    async (`concord.lab.presets.async_report`)."""
    grids = {p.name: Study(p.name, p.title, partial(run_preset, p)) for p in PRESETS.values()}
    relay = pystdlib.relay_study(run_preset)
    return {**grids, consensus.NAME: consensus.STUDY, "async": async_report.study(run_preset),
            consensus_pystdlib.NAME: consensus_pystdlib.STUDY, relay.name: relay}  # fmt: skip


def get_study(name: str) -> Study:
    """The study called ``name``; ValueError naming the valid ones otherwise."""
    table = studies()
    if name not in table:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(table)}")
    return table[name]


def list_presets() -> list[tuple[str, str]]:
    """(name, title) of every preset (`studies`)."""
    return [(s.name, s.title) for s in studies().values()]


def run_preset(preset: Preset, request: PresetRequest) -> Path:
    """Run ``preset``'s grid as ``request`` asks and write its report (`preset_main`)."""
    name, seeds, jobs, out_dir = preset.name, request.seeds, request.jobs, request.out_dir
    overrides, tune, rows, columns = request.overrides, request.tune, request.rows, request.columns
    report_only, resume, run_fn = request.report_only, request.resume, request.run_fn
    console = request.console
    preset = select(preset, rows, columns)
    seed_list = tuple(seeds) if seeds else ((preset.tune_seed,) if tune else preset.seeds)
    grid = PresetGrid(preset, seed_list, tune=tune)
    jobs = 1 if jobs is None else jobs
    base = load_config(None, ["engine=vectorized", *preset.base, *overrides], environ={})
    for run in grid.runs():  # every row × column validates before anything runs
        apply_overrides(base, run.overrides)

    def configure(extra: Mapping[str, object]) -> Any:
        return apply_overrides(base, extra)

    suffix = "-tune" if tune else ""
    out = (
        Path(out_dir)
        if out_dir is not None
        else Path("runs") / time.strftime(f"{name}{suffix}-%Y%m%d-%H%M%S")
    )
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    if report_only:
        meta = json.loads((out / "preset.json").read_text(encoding="utf-8"))
        with open(out / "table.csv", newline="", encoding="utf-8") as f:
            table: list[dict[str, Any]] = list(csv.DictReader(f))
        command, wall = str(meta["command"]), float(meta["wall_seconds"])
        overrides = [str(o) for o in meta["overrides"]]
    else:
        command = command_line(name, seed_list, jobs, out, overrides, tune, rows, columns)
        done = _finished(grid, out) if resume else {}
        todo = RunList([r for r in grid.runs() if r.name not in done])
        console.print(
            f"preset {name}: {len(grid.runs())} runs ({len(done)} reused), jobs {jobs}\n{command}"
        )
        started = time.perf_counter()
        fresh = (
            run_sweep(todo, out, configure, run_fn or run_without_plots, jobs=jobs, console=console)
            if todo.runs()
            else []
        )
        wall = time.perf_counter() - started
        if done:
            previous = out / "preset.json"
            if previous.is_file():
                wall += float(json.loads(previous.read_text(encoding="utf-8"))["wall_seconds"])
            by_name = {r["name"]: r for r in fresh} | done
            table = [by_name[r.name] for r in grid.runs()]
            write_csv(out / "table.csv", table)
        else:
            table = fresh
        meta = {"preset": name, "command": command, "wall_seconds": wall, "tune": tune,
                "seeds": list(seed_list), "overrides": list(overrides),
                "rows": None if rows is None else list(rows),
                "columns": None if columns is None else list(columns),
                "reused_runs": len(done),
                **environment(threads=base.threads, jobs=jobs, engine=base.engine),
                **run_manifest(grid.runs(), base=preset.base, overrides=overrides,
                               engine=base.engine, keys=_cell_keys(grid))}  # fmt: skip
        (out / "preset.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    report = write_report(
        preset,
        grid,
        table,
        out,
        command=command,
        overrides=overrides,
        base=base,
        wall_seconds=wall,
        cores=meta.get("cores", os.cpu_count()),
        env=meta,
    )
    console.print(f"report: {report}")
    return out
