"""``concord sweep --preset NAME``: named reproduction grids with their own report.

A preset is a grid of **rows** (algorithm setups: algorithm, topology, hyperparameters and a tuned
learning rate per column) × **columns** (data settings, e.g. the Dirichlet α of the partition) ×
seeds, on top of a base configuration. It runs through the ordinary sweep machinery
(`sim.sweep.run_sweep`: spawn process pool, failure as data, ``table.csv`` rewritten after each
run) and then writes a report (`sim.preset_report`): ``report.md`` with the setup, the exact
command, mean ± std tables and the expected orderings checked against the measurements, and PNG
plots.

Presets (ALGORITHMS.md §9 items 7 and 9):

- ``relaysgd-dirichlet`` — Vogels et al. 2021 (RelaySum), Table 2 at MNIST-1D scale: 16 peers,
  Dirichlet α ∈ {1, 0.1, 0.01} (§5.6), metric = the worst peer's test accuracy (the paper's) and
  the averaged model's;
- ``detag-unshuffled`` — Lu & De Sa 2021 (DeTAG), the "unshuffled data" experiment (§6.6): a ring
  of 8, label-sorted data with the first X % shuffled, X ∈ {0, 25, 50, 100}, plus the slack matrix
  W_κ = κW + (1 − κ)I with κ = 0.01.

Learning rates: ``--tune`` runs each row over its ``lr_grid`` at one seed (``tune_seed``, not one
of the reported seeds) and reports the best lr per (row, column) by the preset's metric; those
choices are what the rows' ``lrs`` hold (the tuning reports are committed next to the results).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from sim.report import read_summary
from sim.sweep import RunFn, SweepRun, csv_row, run_sweep, slug, write_csv


@dataclass(frozen=True)
class Setup:
    """A row: ``overrides`` (dotted config keys: algorithm, topology, kappa, hyper.*), the lr used
    per column key (``lrs``) and the grid ``--tune`` searches (``lr_grid``, > 0, distinct).
    ``only``: the column keys this row runs in (empty: every column)."""

    key: str
    label: str
    overrides: Mapping[str, object]
    lrs: Mapping[str, float]
    lr_grid: tuple[float, ...]
    only: tuple[str, ...] = ()

    def runs_in(self, column: str) -> bool:
        return not self.only or column in self.only


@dataclass(frozen=True)
class Setting:
    """A column: its ``overrides`` (e.g. ``partition.alpha``) and a numeric ``value`` for plots."""

    key: str
    label: str
    overrides: Mapping[str, object]
    value: float


@dataclass(frozen=True)
class Relation:
    """An expected ordering in one column: ``higher`` beats ``lower`` by more than ``margin``
    (fraction; negative = "at most |margin| worse", i.e. "≈ or better")."""

    column: str
    higher: str
    lower: str
    margin: float = 0.0


@dataclass(frozen=True)
class Preset:
    """A named grid. ``base``: config overrides of every run ("dotted.key=value" strings, the
    way ``--set`` takes them). ``metric``: the sweep metric ("worst" | "avg") the tables lead
    with and ``--tune`` selects by; ``tune_columns``: the columns ``--tune`` runs (empty: all).
    ``expected``: orderings the report checks against the measured means."""

    name: str
    title: str
    setup: str
    base: tuple[str, ...]
    rows: tuple[Setup, ...]
    columns: tuple[Setting, ...]
    column_name: str
    metric: str
    seeds: tuple[int, ...] = (0, 1, 2)
    tune_seed: int = 100
    tune_columns: tuple[str, ...] = ()
    expected: tuple[Relation, ...] = ()
    expected_text: str = ""
    lr_note: str = ""
    log_x: bool = False

    def __post_init__(self) -> None:
        problems: list[str] = []
        cols = [c.key for c in self.columns]
        for what, keys in (("row", [r.key for r in self.rows]), ("column", cols)):
            if len(set(keys)) != len(keys):
                problems.append(f"{what} keys repeat: {keys}")
        for row in self.rows:
            if unknown := [c for c in row.only if c not in cols]:
                problems.append(f"row {row.key!r}: only names unknown columns {unknown}")
            if missing := [c for c in cols if row.runs_in(c) and c not in row.lrs]:
                problems.append(f"row {row.key!r} has no lr for columns {missing}")
            if not row.lr_grid or len(set(row.lr_grid)) != len(row.lr_grid):
                problems.append(f"row {row.key!r}: lr_grid must be non-empty and distinct")
        if unknown := [c for c in self.tune_columns if c not in cols]:
            problems.append(f"tune_columns names unknown columns {unknown}")
        rows = {r.key for r in self.rows}
        problems.extend(
            f"expected relation {rel} names an unknown row or column"
            for rel in self.expected
            if rel.column not in cols or not {rel.higher, rel.lower} <= rows
        )
        if self.metric not in ("worst", "avg"):
            problems.append(f"metric {self.metric!r} must be 'worst' or 'avg'")
        if problems:
            raise ValueError(f"preset {self.name!r} is invalid: " + "; ".join(problems))

    def tuned_columns(self) -> tuple[str, ...]:
        """The column keys ``--tune`` runs (``tune_columns``, or every column)."""
        return self.tune_columns or tuple(c.key for c in self.columns)

    def tunes(self, row: Setup, column: str) -> bool:
        """Whether ``--tune`` runs ``row`` in ``column`` (a one-value grid has nothing to tune)."""
        return len(row.lr_grid) > 1 and row.runs_in(column) and column in self.tuned_columns()

    def row(self, key: str) -> Setup:
        return next(r for r in self.rows if r.key == key)


@dataclass(frozen=True)
class PresetGrid:
    """rows × columns × seeds of a preset (``tune``: rows × lr_grid × columns × seeds), as a
    `sim.sweep.Grid`. Run names: ``<row>_<column>_s<seed>`` (tuning: ``<row>-lr<lr>_…``)."""

    preset: Preset
    seeds: tuple[int, ...]
    tune: bool = False
    runs_: list[SweepRun] = field(init=False, repr=False, compare=False)
    cell_of: dict[str, tuple[str, str, float]] = field(init=False, repr=False, compare=False)
    """run name → (row key, column key, lr)"""

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("seeds is empty; give at least one, e.g. 0,1,2")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds has duplicates: {list(self.seeds)!r}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be integers >= 0, got {list(self.seeds)!r}")
        object.__setattr__(self, "cell_of", {})
        object.__setattr__(self, "runs_", self._expand())

    def _expand(self) -> list[SweepRun]:
        runs: list[SweepRun] = []
        preset = self.preset
        for row, col, seed in itertools.product(preset.rows, preset.columns, self.seeds):
            if not row.runs_in(col.key) or (self.tune and not preset.tunes(row, col.key)):
                continue
            lrs = row.lr_grid if self.tune else (row.lrs[col.key],)
            for lr in lrs:
                over: dict[str, object] = {**col.overrides, **row.overrides}
                over.update({"optim.lr": lr, "seed": seed})
                key = f"{row.key}-lr{lr:g}" if self.tune else row.key
                label = f"{row.label}, lr {lr:g}" if self.tune else row.label
                name = "_".join(slug(p) for p in (key, col.key, f"s{seed}"))
                topology = str(row.overrides.get("topology", "")) or None
                run = SweepRun(
                    name=name,
                    kind="setup",
                    row=label,
                    plan=None,
                    topology=topology,
                    factor=None,
                    control_mode="none",
                    seed=seed,
                    overrides=over,
                    column=col.label,
                )
                runs.append(run)
                self.cell_of[name] = (row.key, col.key, lr)
        return runs

    def runs(self) -> list[SweepRun]:
        return list(self.runs_)

    def schedule(self) -> tuple[list[SweepRun], dict[tuple[str, str, int], list[SweepRun]]]:
        return self.runs(), {}  # no calibration passes: every run is uncontrolled


def run_without_plots(
    cfg: Any, out_dir: Path, *, progress: bool = False, calibration_cache: Path | None = None
) -> Mapping[str, Any]:
    """`sim.engine.run` without the per-run PNGs (1–3 s each on a small CPU; the report plots
    every run's curves instead). Module-level, so it pickles into the sweep's workers."""
    from sim.engine import run

    return run(cfg, out_dir, progress=progress, calibration_cache=calibration_cache, plots=False)


@dataclass(frozen=True)
class _Runs:
    """A fixed list of runs as a `sim.sweep.Grid` (the part of a preset grid still to run)."""

    items: list[SweepRun]

    def runs(self) -> list[SweepRun]:
        return list(self.items)

    def schedule(self) -> tuple[list[SweepRun], dict[tuple[str, str, int], list[SweepRun]]]:
        return self.runs(), {}


def _finished(grid: PresetGrid, out: Path) -> dict[str, dict[str, Any]]:
    """Table rows of the runs of ``grid`` whose run directory in ``out`` has a summary.json."""
    rows = {}
    for run in grid.runs():
        run_dir = out / "runs" / run.name
        summary = read_summary(run_dir)
        if summary is not None:
            rows[run.name] = csv_row(run, {"status": "ok", "summary": summary}, run_dir)
    return rows


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError naming the valid ones otherwise."""
    from sim.preset_defs import PRESETS

    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
    return PRESETS[name]


def list_presets() -> list[tuple[str, str]]:
    """(name, title) of every preset."""
    from sim.preset_defs import PRESETS

    return [(p.name, p.title) for p in PRESETS.values()]


def select(preset: Preset, rows: Sequence[str] | None, columns: Sequence[str] | None) -> Preset:
    """``preset`` with only the rows / columns whose keys are listed (None: all of them)."""
    keep_rows = preset.rows
    keep_cols = preset.columns
    for what, keys, items in (("row", rows, preset.rows), ("column", columns, preset.columns)):
        valid = [i.key for i in items]
        if keys is not None and (unknown := [k for k in keys if k not in valid]):
            raise ValueError(f"preset {preset.name!r} has no {what} {unknown}; valid: {valid}")
    if rows is not None:
        keep_rows = tuple(r for r in preset.rows if r.key in rows)
    if columns is not None:
        keep_cols = tuple(c for c in preset.columns if c.key in columns)
    row_keys, col_keys = {r.key for r in keep_rows}, {c.key for c in keep_cols}
    expected = tuple(
        e for e in preset.expected
        if e.column in col_keys and {e.higher, e.lower} <= row_keys
    )  # fmt: skip
    rows_only = tuple(
        replace(r, only=tuple(c for c in r.only if c in col_keys)) if r.only else r
        for r in keep_rows
        if not r.only or any(c in col_keys for c in r.only)
    )
    tune = tuple(c for c in preset.tune_columns if c in col_keys)
    return replace(preset, rows=rows_only, columns=keep_cols, expected=expected, tune_columns=tune)


def command_line(
    name: str,
    seeds: Sequence[int],
    jobs: int,
    out: Path,
    overrides: Sequence[str],
    tune: bool,
    rows: Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
) -> str:
    """The ``concord sweep`` command that regenerates a preset report."""
    parts = ["concord", "sweep", "--preset", name]
    if tune:
        parts.append("--tune")
    parts += ["--seeds", ",".join(str(s) for s in seeds), "--jobs", str(jobs), "--out", str(out)]
    if rows is not None:
        parts += ["--rows", ",".join(rows)]
    if columns is not None:
        parts += ["--columns", ",".join(columns)]
    for item in overrides:
        parts += ["--set", item]
    return shlex.join(parts)


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
    """
    from core.config import apply_overrides, load_config
    from sim.preset_report import write_report

    preset = select(get_preset(name), rows, columns)
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
        todo = _Runs([r for r in grid.runs() if r.name not in done])
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
                "reused_runs": len(done)}  # fmt: skip
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
        cores=os.cpu_count(),
    )
    console.print(f"report: {report}")
    return out
