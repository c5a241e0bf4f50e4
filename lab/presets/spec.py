"""What a preset is: rows (algorithm setups) × columns (data settings) × seeds, on a base config,
and the grid of runs it expands to (`PresetGrid`). See `concord.lab.presets` for the command."""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from concord.lab.sweep import SweepRun, hold_for_calibration, slug


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
    `concord.lab.sweep.Grid`. Run names: ``<row>_<column>_s<seed>`` (tuning: ``<row>-lr<lr>_…``)."""

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


@dataclass(frozen=True)
class RunList:
    """A fixed list of runs as a `concord.lab.sweep.Grid`: what is left of a preset's grid to run
    (``--resume``), or the one cell ``concord report verify`` re-runs. Runs of a calibration
    group wait for its first run's calibration pass (`hold_for_calibration`)."""

    items: Sequence[SweepRun]

    def runs(self) -> list[SweepRun]:
        return list(self.items)

    def schedule(self) -> tuple[list[SweepRun], dict[tuple[str, str, int], list[SweepRun]]]:
        return hold_for_calibration(self.items)


@dataclass(frozen=True)
class PresetRequest:
    """What one ``concord sweep --preset NAME`` asks of a study (`concord.lab.presets.preset_main`
    documents each option): seeds (None: the study's), jobs, output directory, ``--set`` items,
    ``--tune``, ``--report-only``, ``--resume``, ``--rows`` / ``--columns``, the engine's run and
    the console."""

    seeds: Sequence[int] | None = None
    jobs: int | None = None
    out_dir: Path | None = None
    overrides: Sequence[str] = ()
    tune: bool = False
    report_only: bool = False
    resume: bool = False
    rows: Sequence[str] | None = None
    columns: Sequence[str] | None = None
    run_fn: Any = None  # a `concord.lab.sweep.RunFn` (None: the sweep's, without plots)
    console: Any = None  # a rich Console (None: a new one)


@dataclass(frozen=True)
class Study:
    """An entry of ``concord sweep --preset``: its name, title and how it runs a request (its grid
    through `concord.lab.sweep.run_sweep`, ``preset.json`` with the run manifest, its report);
    returns the output directory. A `Preset` runs as one (`concord.lab.presets.run.run_preset`),
    a study with its own grid and report (consensus-control) supplies its ``main``."""

    name: str
    title: str
    main: Callable[[PresetRequest], Path]


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
