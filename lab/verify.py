"""``concord report verify DIR``: re-run one cell of a committed report and compare it.

``DIR`` is a report directory: a generic preset's (`concord.lab.presets`: ``table.csv``, with
``preset.json`` when the sweep recorded one) or ``consensus-control``'s (``runs.csv`` and
``preset.json``). The run's configuration is recovered, most exact first:

1. ``preset.json`` holds ``runs`` (`concord.lab.presets.report.run_manifest`): the recorded
   engine, base items, ``--set`` items and the run's own overrides;
2. otherwise the preset by name from the current catalog: name, ``--tune`` and ``--set`` items
   of the sweep command (``preset.json``'s ``command`` / ``commands``, else the
   ``concord sweep --preset`` command of ``report.md``; the preset name else from the directory's
   name), the grid rebuilt and the run found by name. A generic run keeps the lr its CSV row
   records where the catalog's lr has changed since (said in the output).

The run is chosen by ``--run NAME`` or ``--row KEY --column KEY [--seed S]`` (keys or the CSV's
labels), by default the first run of the CSV that succeeded. It re-runs through the sweep
machinery (`concord.lab.sweep.run_sweep`: a spawned worker, the engine's run without plots; a
constant-target cell computes its uncontrolled calibration pass first, as in the sweep) into
``--out`` (default: a fresh temporary directory), and a table compares, for every metric the CSV
has, the committed value with the re-run's:

- accuracies (averaged model, worst peer): within ``tol`` percentage points (default 0.5 pp —
  well above the CSV's float rounding; a re-run on the recorded machine gives the same numbers);
- gossip rounds and bytes (all peers, or per peer): exact by default, since the configuration
  fixes them; ``count_tol`` (relative) when consensus control is on (or ``ada-feedback``, whose
  graph follows Θ), default ±10 %, since the rounds then follow the float trajectory.

It also compares the recorded machine (torch, CPU, torch threads per run; `environment`) with
this one: float results are machine-dependent, so a mismatch is reported as the likely reason of
a difference, not as an error. Exit codes (`verify_main`): 0 all within tolerance, 1 a metric
differs (or the re-run failed), 2 bad input (`VerifyError`).

Several reports in one command (`verify_reports`): ``DIR [DIR ...]``, each ``DIR`` or
``DIR::RUN`` (`parse_directories`; ``--run`` and ``--row/--column/--seed`` only with a single
``DIR``). ``--csv`` writes the reproducibility record, one row per directory, run and metric
(`record_rows`, `RECORD_COLUMNS`), and ``--markdown`` a report generated from those rows
(`render_markdown`: the command, the date, this machine, a table per directory, a summary).
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from concord.lab.presets.report import environment
from concord.lab.report import markdown_grid
from concord.lab.sweep import RunFn, SweepRun, hold_for_calibration, run_sweep, run_without_plots

__all__ = [
    "ACCURACY_TOL_PP",
    "CONTROLLED_COUNT_TOL",
    "RECORD_COLUMNS",
    "Check",
    "Choice",
    "Outcome",
    "Target",
    "VerifyError",
    "command_line",
    "load_target",
    "parse_directories",
    "parse_sweep_command",
    "record_rows",
    "render_markdown",
    "summarize",
    "verify_main",
    "verify_reports",
    "write_record_csv",
]

ACCURACY_TOL_PP = 0.5
"""Default tolerance of the accuracies, in percentage points."""
CONTROLLED_COUNT_TOL = 0.10
"""Default relative tolerance of gossip rounds and bytes of a run under consensus control."""

CONSENSUS = "consensus-control"
_CONSENSUS_RUN = re.compile(r"^n(\d+)-(.+)-s(\d+)$")


class VerifyError(ValueError):
    """Bad input: a missing directory or file, an unknown run, row or column (exit 2)."""


@dataclass(frozen=True)
class Metric:
    """A compared value: its label, its column in the CSV, whether it is an accuracy (fraction,
    compared in pp) or a count (rounds, bytes), and how to read it from the re-run's summary
    (with the run's number of peers)."""

    label: str
    column: str
    accuracy: bool
    read: Callable[[Mapping[str, Any], int], float | None]
    unit: str = "%"  # of the reproducibility record (`record_rows`): %, rounds or bytes


def _number(value: object) -> float | None:
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        x = float(str(value))
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _key(name: str) -> Callable[[Mapping[str, Any], int], float | None]:
    return lambda summary, peers: _number(summary.get(name))


def _per_peer(summary: Mapping[str, Any], peers: int) -> float | None:
    sent = _number(summary.get("bytes_sent_total"))
    return None if sent is None else float(round(sent / peers))


GENERIC_METRICS = (
    Metric("accuracy (averaged model)", "accuracy_avg_model", True, _key("accuracy_avg_model")),
    Metric("accuracy (worst peer)", "accuracy_worst_peer", True, _key("accuracy_worst_peer")),
    Metric("gossip rounds", "gossip_rounds_total", False, _key("gossip_rounds_total"), "rounds"),
    Metric("bytes sent (all peers)", "bytes_sent_total", False, _key("bytes_sent_total"), "bytes"),
)
CONSENSUS_METRICS = (
    Metric("accuracy (averaged model)", "accuracy", True, _key("accuracy_avg_model")),
    Metric("accuracy (worst peer)", "worst_peer", True, _key("accuracy_worst_peer")),
    Metric("gossip rounds", "gossip_rounds", False, _key("gossip_rounds_total"), "rounds"),
    Metric("bytes sent per peer", "bytes_per_peer", False, _per_peer, "bytes"),
)


@dataclass(frozen=True)
class Cell:
    """A run of the CSV: name, row / column keys and labels, seed, the CSV row itself."""

    name: str
    row_key: str
    column_key: str
    row_label: str
    column_label: str
    seed: int | None
    record: Mapping[str, str]


@dataclass(frozen=True)
class Target:
    """What `verify_main` re-runs: the run with its config items (``load_config`` items: engine,
    base, --set), the committed CSV row, the metrics that CSV has, and how all this was found."""

    directory: Path
    csv_name: str
    preset: str
    run: SweepRun
    cell: Cell
    items: tuple[str, ...]
    metrics: tuple[Metric, ...]
    recorded: Mapping[str, Any]
    source: str
    chosen: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    """One line of the comparison table."""

    metric: Metric
    committed: float
    rerun: float | None
    tolerance: float  # pp for accuracies, relative for counts
    ok: bool

    @property
    def delta(self) -> float | None:
        if self.rerun is None:
            return None
        d = abs(self.rerun - self.committed)
        return 100 * d if self.metric.accuracy else d


# ---------------------------------------------------------------------------------------------
# Reading a report directory


def parse_sweep_command(command: str) -> dict[str, Any]:
    """The parts of a ``concord sweep --preset`` command line (line continuations allowed):
    ``preset``, ``seeds`` (list or None), ``set`` (the ``--set`` items), ``rows`` / ``columns``
    (key lists or None) and ``tune``."""
    words = shlex.split(command.replace("\\\n", " "))
    out: dict[str, Any] = {"preset": None, "seeds": None, "set": [], "rows": None,
                           "columns": None, "tune": False}  # fmt: skip
    i = 0
    while i < len(words):
        word, value = words[i], words[i + 1] if i + 1 < len(words) else None
        if "=" in word and word.startswith("--"):
            word, _, value = word.partition("=")
            step = 1
        else:
            step = 2
        if word == "--tune":
            out["tune"] = True
            i += 1
            continue
        if value is None or word not in ("--preset", "--seeds", "--set", "--rows", "--columns"):
            i += 1
            continue
        if word == "--preset":
            out["preset"] = value
        elif word == "--set":
            out["set"].append(value)
        elif word == "--seeds":
            out["seeds"] = [int(s) for s in value.split(",") if s.strip()]
        else:
            out[word.removeprefix("--")] = [k.strip() for k in value.split(",") if k.strip()]
        i += step
    return out


def _report_commands(directory: Path) -> list[str]:
    """The ``concord sweep --preset`` commands of report.md's first bash block holding any."""
    path = directory / "report.md"
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL):
        lines = block.replace("\\\n", " ").splitlines()
        found = [ln.strip() for ln in lines if ln.strip().startswith("concord sweep --preset")]
        if found:
            return found
    return []


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _read_meta(directory: Path) -> dict[str, Any]:
    path = directory / "preset.json"
    if not path.is_file():
        return {}
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise VerifyError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise VerifyError(f"{path}: expected a JSON object")
    return meta


def _int(value: object) -> int | None:
    x = _number(value)
    return None if x is None else int(x)


@dataclass(frozen=True)
class _Recovered:
    """Every run the recovery knows (by name), its (row key, column key), the config items."""

    runs: Mapping[str, SweepRun]
    keys: Mapping[str, tuple[str, str]]
    items: tuple[str, ...]
    source: str


def _from_manifest(meta: Mapping[str, Any]) -> _Recovered:
    runs: dict[str, SweepRun] = {}
    keys: dict[str, tuple[str, str]] = {}
    for e in meta["runs"]:
        group = e.get("calibration_group")
        runs[e["name"]] = SweepRun(
            name=e["name"],
            kind=e.get("kind", "setup"),
            row=e.get("row", e.get("row_key", "")),
            plan=e.get("plan"),
            topology=e.get("topology"),
            factor=e.get("factor"),
            control_mode=e.get("control_mode", "none"),
            seed=int(e["seed"]),
            overrides=dict(e["overrides"]),
            calibration_group=None if not group else (str(group[0]), str(group[1]), int(group[2])),
            column=e.get("column"),
        )
        keys[e["name"]] = (str(e.get("row_key")), str(e.get("column_key")))
    items = (f"engine={meta.get('engine', 'vectorized')}", *meta["base"], *meta.get("set", []))
    return _Recovered(runs, keys, tuple(items), "the configuration recorded in preset.json")


def _commands(meta: Mapping[str, Any], directory: Path) -> list[str]:
    if meta.get("commands"):
        return [str(c) for c in meta["commands"]]
    if meta.get("command"):
        return [str(meta["command"])]
    return _report_commands(directory)


def _from_catalog(
    name: str, meta: Mapping[str, Any], commands: Sequence[str], cells: Sequence[Cell]
) -> _Recovered:
    from concord.lab.presets.catalog import get_preset
    from concord.lab.presets.spec import PresetGrid

    try:
        preset = get_preset(name)
    except ValueError as exc:
        raise VerifyError(f"{exc} (the report's preset)") from None
    parsed = parse_sweep_command(commands[0]) if commands else parse_sweep_command("")
    overrides = [str(o) for o in meta.get("overrides", parsed["set"])]
    seeds = tuple(sorted({c.seed for c in cells if c.seed is not None})) or preset.seeds
    runs: dict[str, SweepRun] = {}
    keys: dict[str, tuple[str, str]] = {}
    tunes = [bool(meta.get("tune", parsed["tune"]))] if (meta or commands) else [False, True]
    for tune in tunes:
        grid = PresetGrid(preset, seeds, tune=tune)
        for run in grid.runs():
            runs.setdefault(run.name, run)
            keys.setdefault(run.name, grid.cell_of[run.name][:2])
    items = ("engine=vectorized", *preset.base, *overrides)
    source = (
        f"the preset {name!r} of the current catalog (lab/presets/catalog.py) with "
        f"{'--set ' + ' --set '.join(overrides) if overrides else 'no --set'}: this report "
        "predates recorded run configurations, so a catalog changed since changes the re-run"
    )
    return _Recovered(runs, keys, items, source)


def _cells(
    records: Sequence[Mapping[str, str]],
    consensus_csv: bool,
    keys: Mapping[str, tuple[str, str]],
) -> list[Cell]:
    """The CSV's runs with their (row key, column key) from ``keys`` (consensus-control: else
    parsed from the run name; a generic run not in ``keys``: its labels only)."""
    cells = []
    for r in records:
        if consensus_csv:
            name = r.get("run", "")
            m = _CONSENSUS_RUN.match(name)
            row, col = (m.group(2), f"n{m.group(1)}") if m else ("", "")
            row, col = keys.get(name, (row, col))
            cells.append(Cell(name, row, col, row, col, _int(r.get("seed")), r))
        else:
            name = r.get("name", "")
            row, col = keys.get(name, ("", ""))
            row_label, col_label = r.get("row", ""), r.get("column", "")
            cells.append(Cell(name, row, col, row_label, col_label, _int(r.get("seed")), r))
    return cells


def _listing(values: Sequence[object], limit: int = 12) -> str:
    unique = list(dict.fromkeys(str(v) for v in values if v not in (None, "")))
    shown = ", ".join(unique[:limit])
    return shown + (f", … ({len(unique)} in all)" if len(unique) > limit else "")


def _choose(
    cells: Sequence[Cell],
    where: str,
    run: str | None,
    row: str | None,
    column: str | None,
    seed: int | None,
) -> tuple[Cell, str]:
    cells_text = (
        f"rows: {_listing([c.row_key or c.row_label for c in cells], 40)}; columns: "
        f"{_listing([c.column_key or c.column_label for c in cells], 40)}; seeds: "
        f"{_listing([c.seed for c in cells], 40)}"
    )
    runs_text = f"runs: {_listing([c.name for c in cells])}"
    if run is not None and (row, column, seed) != (None, None, None):
        raise VerifyError("give either --run NAME or --row/--column/--seed, not both")
    if run is not None:
        found = [c for c in cells if c.name == run]
        if not found:
            raise VerifyError(f"no run {run!r} in {where}; {runs_text} (or {cells_text})")
        return found[0], f"run {run!r} (--run)"
    if row is None and column is None and seed is None:
        ok = [c for c in cells if _ok(c)]
        if not ok:
            raise VerifyError(f"no run of {where} succeeded: nothing to compare")
        first = ok[0]
        which = "the first run" if first is cells[0] else "the first run that succeeded"
        return first, f"{which} of {where} (pick another with --run or --row/--column/--seed)"
    if row is None or column is None:
        raise VerifyError(f"--row and --column go together (--seed optional); {cells_text}")
    for what, value, keys in (
        ("row", row, {c.row_key for c in cells} | {c.row_label for c in cells}),
        ("column", column, {c.column_key for c in cells} | {c.column_label for c in cells}),
    ):
        if value not in keys:
            raise VerifyError(f"no {what} {value!r} in {where}; {cells_text}")
    found = [
        c
        for c in cells
        if row in (c.row_key, c.row_label)
        and column in (c.column_key, c.column_label)
        and (seed is None or c.seed == seed)
    ]
    if not found:
        seeds = _listing(
            [
                c.seed
                for c in cells
                if row in (c.row_key, c.row_label) and column in (c.column_key, c.column_label)
            ]
        )
        raise VerifyError(
            f"row {row!r}, column {column!r} has no seed {seed} in {where}; its seeds: {seeds}"
        )
    if seed is None:
        found = [c for c in found if c.seed == found[0].seed]
    if len(found) > 1:
        raise VerifyError(
            f"row {row!r}, column {column!r}, seed {found[0].seed} matches {len(found)} runs "
            f"of {where} ({_listing([c.name for c in found])}): pick one with --run"
        )
    how = f"row {row!r}, column {column!r}, seed {found[0].seed}"
    return found[0], how + (" (the first seed of the cell)" if seed is None else "")


def _ok(cell: Cell) -> bool:
    return cell.record.get("status") == "ok"


def load_target(
    directory: str | Path,
    *,
    run: str | None = None,
    row: str | None = None,
    column: str | None = None,
    seed: int | None = None,
) -> Target:
    """The run of the report in ``directory`` to re-run and what to compare it with; raises
    `VerifyError` naming the problem (and the valid choices) for bad input."""
    directory = Path(directory)
    if not directory.is_dir():
        raise VerifyError(f"report directory {directory} does not exist (or is not a directory)")
    meta = _read_meta(directory)
    consensus_csv = (directory / "runs.csv").is_file() and (
        meta.get("preset") == CONSENSUS or not (directory / "table.csv").is_file()
    )
    csv_name = "runs.csv" if consensus_csv else "table.csv"
    if not (directory / csv_name).is_file():
        raise VerifyError(
            f"{directory} holds no table.csv (a preset report's) nor runs.csv "
            "(consensus-control's): not a report directory"
        )
    records = _read_csv(directory / csv_name)
    where = str(directory / csv_name)
    if not records:
        raise VerifyError(f"{where} has no runs")
    commands = _commands(meta, directory)
    name = meta.get("preset")
    if name is None and commands:
        name = parse_sweep_command(commands[0])["preset"]
    if name is None:
        name = CONSENSUS if consensus_csv else _name_from_path(directory)
    manifest = None
    if isinstance(meta.get("runs"), list) and "base" in meta:
        manifest = _from_manifest(meta)
    field = "run" if consensus_csv else "name"
    missing = manifest is None or any(r.get(field) not in manifest.runs for r in records)
    catalog: _Recovered | None = None
    if not consensus_csv and missing:
        if name is None and manifest is None:
            raise VerifyError(
                f"{directory} has no preset.json and its report.md no `concord sweep --preset` "
                "command: cannot tell which preset produced it"
            )
        try:
            catalog = _from_catalog(str(name), meta, commands, _cells(records, False, {}))
        except VerifyError:
            if manifest is None:
                raise
    keys = {**(catalog.keys if catalog else {}), **(manifest.keys if manifest else {})}
    cells = _cells(records, consensus_csv, keys)
    cell, chosen = _choose(cells, where, run, row, column, seed)
    if not _ok(cell):
        status = cell.record.get("status") or "unknown"
        raise VerifyError(
            f"run {cell.name!r} has status {status!r} in {where}: no committed values to "
            f"compare; pick a run that succeeded, e.g. "
            f"{_listing([c.name for c in cells if _ok(c)], 5)}"
        )
    notes: list[str] = []
    if manifest is not None and cell.name in manifest.runs:
        sweep_run, items, source = manifest.runs[cell.name], manifest.items, manifest.source
    elif consensus_csv:
        sweep_run, items, source = _consensus_run(cell, meta, commands, where)
    elif catalog is not None and cell.name in catalog.runs:
        sweep_run, items, source = catalog.runs[cell.name], catalog.items, catalog.source
        lr = _number(cell.record.get("lr"))
        if lr is not None and sweep_run.overrides.get("optim.lr") != lr:
            notes.append(
                f"the catalog's lr for this cell is now {sweep_run.overrides.get('optim.lr')}; "
                f"the re-run uses the committed {lr:g} (table.csv)"
            )
            sweep_run = replace(sweep_run, overrides={**sweep_run.overrides, "optim.lr": lr})
    else:
        raise VerifyError(
            f"run {cell.name!r} of {where} is neither in preset.json's runs nor in the grid of "
            f"preset {name!r} of the current catalog (changed since the report?)"
        )
    if manifest is not None and cell.name not in manifest.runs:
        notes.append(f"preset.json records no configuration for {cell.name}: rebuilt")
    metrics = CONSENSUS_METRICS if consensus_csv else GENERIC_METRICS
    present = tuple(m for m in metrics if m.column in cell.record)
    return Target(
        directory,
        csv_name,
        str(name),
        sweep_run,
        cell,
        items,
        present,
        meta,
        source,
        chosen,
        tuple(notes),
    )


def _name_from_path(directory: Path) -> str | None:
    from concord.lab.presets.catalog import PRESETS

    for part in (directory.resolve().name, directory.resolve().parent.name):
        if part in PRESETS:
            return part
    return None


def _consensus_run(
    cell: Cell, meta: Mapping[str, Any], commands: Sequence[str], where: str
) -> tuple[SweepRun, tuple[str, ...], str]:
    from concord.lab.presets import consensus

    if cell.row_key not in consensus.CELLS or cell.column_key not in consensus.COLUMNS:
        raise VerifyError(
            f"run {cell.name!r} of {where}: row {cell.row_key!r} / column {cell.column_key!r} "
            f"is not a cell of the current consensus-control grid (rows: "
            f"{', '.join(consensus.CELLS)}; columns: {', '.join(consensus.COLUMNS)})"
        )
    if cell.seed is None:
        raise VerifyError(f"run {cell.name!r} of {where} has no seed")
    chosen = [str(o) for o in meta.get("overrides", [])]
    for text in commands:  # the last command whose grid holds the run wrote its row
        p = parse_sweep_command(text)
        if (
            cell.row_key in (p["rows"] or consensus.DEFAULT_ROWS)
            and cell.column_key in (p["columns"] or consensus.DEFAULT_COLUMNS)
            and cell.seed in (p["seeds"] or consensus.SEEDS)
        ):
            chosen = list(p["set"])
    (run,) = consensus.grid([cell.row_key], [cell.column_key], [cell.seed])
    items = ("engine=vectorized", *consensus.BASE, *chosen)
    source = (
        "the consensus-control grid (lab/presets/consensus.py) with "
        f"{'--set ' + ' --set '.join(chosen) if chosen else 'no --set'} from preset.json"
    )
    return run, items, source


# ---------------------------------------------------------------------------------------------
# Re-running and comparing


@dataclass(frozen=True)
class _One:
    run: SweepRun

    def runs(self) -> list[SweepRun]:
        return [self.run]

    def schedule(self) -> tuple[list[SweepRun], dict[tuple[str, str, int], list[SweepRun]]]:
        return hold_for_calibration([self.run])


def _config(target: Target) -> tuple[Any, Any]:
    from concord.core.config import apply_overrides, load_config

    try:
        base = load_config(None, list(target.items), environ={})
        return base, apply_overrides(base, target.run.overrides)
    except ValueError as exc:
        raise VerifyError(f"the configuration of run {target.run.name!r} does not validate "
                          f"(from {target.source}): {exc}") from None  # fmt: skip


def _controlled(cfg: Any) -> bool:
    return bool(cfg.controlled_phases()) or cfg.algorithm == "ada-feedback"


def compare(
    target: Target, summary: Mapping[str, Any], peers: int, tol: float, count_tol: float
) -> list[Check]:
    """One check per metric the committed CSV row has a value for."""
    checks = []
    for metric in target.metrics:
        committed = _number(target.cell.record.get(metric.column))
        if committed is None:
            continue
        rerun = metric.read(summary, peers)
        if rerun is None:
            ok = False
        elif metric.accuracy:
            ok = 100 * abs(rerun - committed) <= tol + 1e-9
        else:
            ok = abs(rerun - committed) <= count_tol * abs(committed) + 1e-9
        checks.append(Check(metric, committed, rerun, tol if metric.accuracy else count_tol, ok))
    return checks


def _fmt_value(metric: Metric, value: float | None) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.2f} %" if metric.accuracy else f"{value:,.0f}"


def _fmt_delta(check: Check) -> str:
    d = check.delta
    if d is None:
        return "—"
    if check.metric.accuracy:
        return f"{d:.2f} pp"
    rel = f" ({100 * d / abs(check.committed):.1f} %)" if check.committed and d else ""
    return f"{d:,.0f}{rel}"


def _fmt_tol(check: Check) -> str:
    if check.metric.accuracy:
        return f"{check.tolerance:g} pp"
    return "exact" if check.tolerance == 0 else f"±{100 * check.tolerance:g} %"


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return lines


_MACHINE = (("torch", "torch"), ("cpu", "CPU"), ("threads", "torch threads per run"))
_INFO = (("python", "Python"), ("cores", "logical cores"))


def _machine(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> tuple[list[str], str]:
    """The environment table and the state: "same", "differs: …" or "not recorded"."""
    body = []
    differs = []
    for key, label in (*_MACHINE, *_INFO):
        old = recorded.get(key)
        new = here.get(key)
        if old is None:
            verdict = "not recorded"
        elif str(old) == str(new):
            verdict = "same"
        else:
            verdict = "differs"
            if (key, label) in _MACHINE:
                differs.append(label)
        body.append([label, "—" if old is None else str(old), str(new), verdict])
    lines = _table(["environment", "recorded", "this machine", ""], body)
    if recorded.get("torch") is None:
        return lines, "not recorded"
    return lines, ("differs: " + ", ".join(differs)) if differs else "same"


def _check_tolerances(tol: float, count_tol: float | None) -> None:
    if not math.isfinite(tol) or tol < 0:
        raise VerifyError(f"--tol must be a number of percentage points >= 0, got {tol}")
    if count_tol is not None and (not math.isfinite(count_tol) or count_tol < 0):
        raise VerifyError(f"--count-tol must be a fraction >= 0, got {count_tol}")


@dataclass(frozen=True)
class Outcome:
    """A verified cell: the directory as given, its `Target`, the checks (those of a re-run that
    failed have no re-run values; ``error`` says why), the relative tolerance of its rounds and
    bytes, this machine (`environment`) and `_machine`'s state ("same", "differs: …", "not
    recorded")."""

    given: str
    target: Target
    checks: tuple[Check, ...]
    count_tol: float
    error: str | None
    here: Mapping[str, Any]
    state: str

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)


def _rerun(
    given: str,
    target: Target,
    base: Any,
    cfg: Any,
    out_dir: Path,
    *,
    tol: float,
    count_tol: float | None,
    echo: Callable[[str], None],
    run_fn: RunFn | None,
    console: Console | None,
    kept: bool = True,
) -> Outcome:
    """Re-run ``target`` into ``out_dir``, print the comparison and the verdict. ``kept``: False
    when ``out_dir`` is a temporary directory, removed at the end."""
    name = target.run.name
    controlled = _controlled(cfg)
    if count_tol is None:
        count_tol = CONTROLLED_COUNT_TOL if controlled else 0.0
    cell = target.cell
    echo(f"report: {target.directory} (preset {target.preset}, {target.csv_name})")
    echo(f"run: {name} — {target.chosen}")
    row_name, column_name = cell.row_key or cell.row_label, cell.column_key or cell.column_label
    echo(f"  row {row_name!r}, column {column_name!r}, seed {cell.seed}")
    echo(f"config: {target.source}")
    for note in target.notes:
        echo(f"note: {note}")
    constant = controlled and cfg.control.mode == "constant"
    calibration = " (with its calibration pass)" if constant else ""
    where = out_dir if kept else "a temporary directory (removed at the end; --out DIR keeps it)"
    echo(f"re-running{calibration}: {cfg.engine} engine, {cfg.peers} peers, into {where}")
    out_dir.mkdir(parents=True, exist_ok=True)
    from concord.core.config import apply_overrides

    rows = run_sweep(
        _One(target.run),
        out_dir,
        lambda o: apply_overrides(base, o),
        run_fn or run_without_plots,
        jobs=1,
        console=console or Console(stderr=True),
    )
    outcome = rows[0]
    summary_path = out_dir / "runs" / name / "summary.json"
    summary: dict[str, Any] = {}
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    here = environment(threads=cfg.threads, jobs=1, engine=cfg.engine)
    machine, state = _machine(target.recorded, here)
    peers = int(cfg.peers)
    echo("")
    if outcome.get("status") != "ok" or not summary:
        error = str(outcome.get("error") or outcome.get("status") or "no summary.json")
        echo(f"the re-run failed: {error}")
        trace = out_dir / "runs" / name / "error.txt"
        if not kept and trace.is_file():  # its directory is about to go: show the traceback
            for line in trace.read_text(encoding="utf-8").rstrip().splitlines()[-20:]:
                echo(f"  {line}")
        else:
            echo(f"(its directory: {out_dir / 'runs' / name})")
        for line in machine:
            echo(line)
        checks = compare(target, {}, peers, tol, count_tol)
        return Outcome(given, target, tuple(checks), count_tol, error, here, state)
    checks = compare(target, summary, peers, tol, count_tol)
    result = Outcome(given, target, tuple(checks), count_tol, None, here, state)
    body = [
        [c.metric.label, _fmt_value(c.metric, c.committed), _fmt_value(c.metric, c.rerun),
         _fmt_delta(c), _fmt_tol(c), "ok" if c.ok else "DIFFERS"]
        for c in checks
    ]  # fmt: skip
    for line in _table(["metric", "committed", "re-run", "|Δ|", "tolerance", "verdict"], body):
        echo(line)
    if not controlled:
        echo("(rounds and bytes: exact, no consensus control)")
    else:
        echo(f"(rounds and bytes: ±{100 * count_tol:g} %, consensus control follows the floats)")
    echo("")
    for line in machine:
        echo(line)
    echo("")
    failed = [c.metric.label for c in checks if not c.ok]
    if not checks:
        echo(f"verdict: {target.csv_name} records none of the compared metrics for {name}")
        return result
    if not failed:
        echo(f"verdict: {name} reproduces: every metric within tolerance")
        if state.startswith("differs"):
            echo(f"(on a machine that {state}; float results are machine-dependent)")
        return result
    text = f"verdict: {name} DIFFERS in {', '.join(failed)}"
    if state.startswith("differs"):
        echo(
            f"{text}. This machine {state} from the recorded one: float results are "
            "machine-dependent (BLAS summation order, amplified by training), the likely reason "
            "of the difference — not by itself an error in the report."
        )
    elif state == "same":
        echo(
            f"{text}, on the recorded torch, CPU and thread count: not explained by the "
            "machine; the code, the data or the configuration changed since the report?"
        )
    else:
        echo(
            f"{text}. The report does not record its machine: if it came from another CPU or "
            "torch build, that is the likely reason (float results are machine-dependent)."
        )
    echo(f"(the re-run: {out_dir / 'runs' / name})")
    return result


# ---------------------------------------------------------------------------------------------
# Several reports, and the reproducibility record (CSV and markdown)

SEPARATOR = "::"
"""``DIR::RUN``: the run ``RUN`` of the report in ``DIR``."""


@dataclass(frozen=True)
class Choice:
    """A report directory as given on the command line and how its run is chosen (the arguments
    of `load_target`; all None: its first run that succeeded)."""

    directory: str
    run: str | None = None
    row: str | None = None
    column: str | None = None
    seed: int | None = None

    def selectors(self) -> list[tuple[str, object]]:
        """The options that choose the run (``--run``, ``--row``, ``--column``, ``--seed``) set
        on this choice, with their values."""
        options = (("--run", self.run), ("--row", self.row), ("--column", self.column),
                   ("--seed", self.seed))  # fmt: skip
        return [(option, value) for option, value in options if value is not None]


def _split(arg: str) -> tuple[str, str | None]:
    if SEPARATOR not in arg or Path(arg).is_dir():
        return arg, None
    directory, _, name = arg.rpartition(SEPARATOR)
    if not directory or not name:
        raise VerifyError(f"{arg!r}: expected DIR or DIR::RUN (a run name of the CSV after '::')")
    return directory, name


def parse_directories(
    args: Sequence[str],
    *,
    run: str | None = None,
    row: str | None = None,
    column: str | None = None,
    seed: int | None = None,
) -> list[Choice]:
    """The `Choice` of each ``DIR`` or ``DIR::RUN`` argument. The options ``run`` / ``row`` /
    ``column`` / ``seed`` (``--run`` …) choose the run of a single ``DIR``; with several, each
    directory's run is its ``::RUN`` (default: its first run that succeeded). Raises
    `VerifyError`: the options with several directories, a run chosen twice, an empty ``::RUN``."""
    if not args:
        raise VerifyError("give at least one report directory (DIR or DIR::RUN)")
    given = [option for option, _ in Choice("", run, row, column, seed).selectors()]
    if len(args) > 1 and given:
        verb = "applies" if len(given) == 1 else "apply"
        first = args[0].split(SEPARATOR)[0]
        raise VerifyError(
            f"{'/'.join(given)} {verb} to a single DIR, and {len(args)} directories were given: "
            f"choose each directory's run as DIR::RUN (e.g. {first}::NAME), or verify one "
            "directory per command"
        )
    choices = []
    for arg in args:
        directory, name = _split(arg)
        if name is None:
            choices.append(Choice(directory, run, row, column, seed))
        elif given:
            raise VerifyError(
                f"{arg}: the run is chosen twice, as DIR::RUN and with {'/'.join(given)}: give one"
            )
        else:
            choices.append(Choice(directory, name))
    return choices


def command_line(directories: Sequence[str], options: Sequence[tuple[str, object]] = ()) -> str:
    """``concord report verify`` with ``directories`` (as given) and ``options`` (name, value;
    True: a flag), quoted for a shell."""
    words = ["concord", "report", "verify", *directories]
    for option, value in options:
        words += [option] if value is True else [option, str(value)]
    return shlex.join(words)


def _default_command(
    choices: Sequence[Choice],
    out: str | Path | None,
    tol: float,
    count_tol: float | None,
    csv_path: str | Path | None,
    markdown_path: str | Path | None,
) -> str:
    args = [
        c.directory + (SEPARATOR + c.run if c.run and len(choices) > 1 else "") for c in choices
    ]
    options: list[tuple[str, object]] = []
    if len(choices) == 1:
        options += choices[0].selectors()
    for option, value in (("--out", out), ("--count-tol", count_tol), ("--csv", csv_path),
                          ("--markdown", markdown_path)):  # fmt: skip
        if value is not None:
            options.append((option, value))
    if tol != ACCURACY_TOL_PP:
        options.append(("--tol", tol))
    return command_line(args, options)


RECORD_COLUMNS = (
    "directory",
    "run",
    "metric",
    "unit",
    "committed",
    "rerun",
    "abs_delta",
    "tolerance",
    "verdict",
    "recorded_torch",
    "recorded_cpu",
    "recorded_threads",
    "this_torch",
    "this_cpu",
    "this_threads",
    "same_machine",
)
"""The reproducibility record's columns (`record_rows`)."""


def _plain(x: float | None) -> str:
    if x is None:
        return ""
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.4f}".rstrip("0").rstrip(".")


def _text(value: object) -> str:
    return "" if value is None else str(value)


def record_rows(outcomes: Sequence[Outcome]) -> list[dict[str, str]]:
    """One row (`RECORD_COLUMNS`, all text) per verified cell and metric: ``directory`` as given,
    ``run``, ``metric``, ``unit`` ("%": ``committed`` / ``rerun`` in percent, ``abs_delta`` and
    ``tolerance`` in percentage points; "rounds" or "bytes": absolute counts, ``tolerance`` the
    largest ``abs_delta`` allowed, 0 exact), ``verdict`` (ok, DIFFERS, FAILED: the re-run failed,
    no ``rerun``), the recorded torch / CPU / threads (empty: not recorded), this machine's and
    ``same_machine`` (true: all three equal)."""
    rows = []
    for o in outcomes:
        recorded, here = o.target.recorded, o.here
        common = {"directory": o.given, "run": o.target.cell.name}
        machine = {
            **{f"recorded_{k}": _text(recorded.get(k)) for k in ("torch", "cpu", "threads")},
            **{f"this_{k}": _text(here.get(k)) for k in ("torch", "cpu", "threads")},
            "same_machine": "true" if o.state == "same" else "false",
        }
        if not o.checks:
            rows.append({**common, "metric": "(none compared)", "unit": "", "committed": "",
                         "rerun": "", "abs_delta": "", "tolerance": "", "verdict": "FAILED",
                         **machine})  # fmt: skip
        for c in o.checks:
            if c.metric.accuracy:
                values = {
                    "committed": f"{100 * c.committed:.4f}",
                    "rerun": "" if c.rerun is None else f"{100 * c.rerun:.4f}",
                    "abs_delta": "" if c.delta is None else f"{c.delta:.4f}",
                    "tolerance": f"{c.tolerance:g}",
                }
            else:
                values = {
                    "committed": _plain(c.committed),
                    "rerun": _plain(c.rerun),
                    "abs_delta": _plain(c.delta),
                    "tolerance": _plain(c.tolerance * abs(c.committed)),
                }
            verdict = "FAILED" if o.error is not None else "ok" if c.ok else "DIFFERS"
            rows.append({**common, "metric": c.metric.label, "unit": c.metric.unit, **values,
                         "verdict": verdict, **machine})  # fmt: skip
    return rows


def write_record_csv(path: str | Path, rows: Sequence[Mapping[str, str]]) -> None:
    """Write (overwrite) the record's rows to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(RECORD_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _cells_of(rows: Sequence[Mapping[str, str]]) -> list[list[Mapping[str, str]]]:
    cells: dict[tuple[str, str], list[Mapping[str, str]]] = {}
    for r in rows:
        cells.setdefault((r["directory"], r["run"]), []).append(r)
    return list(cells.values())


def _differing_machine(row: Mapping[str, str]) -> list[str]:
    return [
        label
        for key, label in (("torch", "torch"), ("cpu", "CPU"), ("threads", "threads"))
        if row[f"recorded_{key}"] != row[f"this_{key}"]
    ]


def _reason(row: Mapping[str, str]) -> str:
    """Why a differing cell differs, from its machine columns: "machine", "same", "unknown"."""
    if not row["recorded_torch"]:
        return "unknown"
    return "same" if row["same_machine"] == "true" else "machine"


_REASONS = {
    "machine": "on a machine other than the recorded one (torch, CPU or threads differ): the "
    "machine is the likely reason",
    "same": "on the recorded machine (same torch, CPU and threads): not explained by the machine "
    "(the code, the data or the configuration changed since the report?)",
    "unknown": "whose report does not record its machine: if it came from another CPU or torch "
    "build, that is the likely reason",
}


def summarize(rows: Sequence[Mapping[str, str]]) -> tuple[str, list[str]]:
    """The summary line of the record's rows (cells within tolerance, cells that differ and why)
    and one line per differing cell."""
    cells = _cells_of(rows)
    ok = [c for c in cells if all(r["verdict"] == "ok" for r in c)]
    differ = [c for c in cells if c not in ok]
    n = len(cells)
    line = f"{len(ok)} of {n} cell{'s' if n != 1 else ''} reproduced within tolerance"
    elsewhere = sum(_reason(c[0]) == "machine" for c in ok)
    if elsewhere:
        line += f" ({elsewhere} of them on a machine other than the recorded one)"
    line += f", {len(differ)} differ{'s' if len(differ) == 1 else ''}"
    if not differ:
        return line + ".", []
    counts = {reason: sum(_reason(c[0]) == reason for c in differ) for reason in _REASONS}
    line += ": " + "; ".join(f"{k} {_REASONS[r]}" for r, k in counts.items() if k) + "."
    details = []
    for c in differ:
        first = c[0]
        failed = [r["metric"] for r in c if r["verdict"] == "DIFFERS"]
        what = "the re-run failed" if any(r["verdict"] == "FAILED" for r in c) else ""
        what = what or "differs in " + ", ".join(failed)
        reason = _reason(first)
        why = {
            "machine": f"the recorded machine differs ({', '.join(_differing_machine(first))}): "
            "the likely reason",
            "same": "on the recorded machine: not explained by the machine",
            "unknown": "the report does not record its machine",
        }[reason]
        details.append(f"`{first['directory']}` run `{first['run']}` {what}; {why}")
    return line, details


def _md_count(text: str) -> str:
    try:
        return f"{int(text):,}"
    except ValueError:
        return text


def _md_cells(r: Mapping[str, str]) -> list[str]:
    """A record row as the markdown table shows it: the CSV's numbers with their units (counts
    with thousands separators)."""
    percent = r["unit"] == "%"

    def value(text: str) -> str:
        return "—" if not text else f"{text} %" if percent else _md_count(text)

    if percent:
        delta = f"{r['abs_delta']} pp" if r["abs_delta"] else "—"
        tolerance = f"{r['tolerance']} pp"
    else:
        delta = _md_count(r["abs_delta"]) if r["abs_delta"] else "—"
        tol = r["tolerance"]
        if not tol:
            tolerance = "—"
        elif float(tol) == 0:
            tolerance = "exact"
        else:
            committed = _number(r["committed"])
            rel = f" ({100 * float(tol) / abs(committed):.3g} %)" if committed else ""
            tolerance = f"±{_md_count(tol)}{rel}"
    return [r["metric"], value(r["committed"]), value(r["rerun"]), delta, tolerance, r["verdict"]]


MACHINE_DEPENDENT = (
    "Float results are machine-dependent: the vectorized engine is deterministic for a given "
    "seed, torch build, CPU and thread count, but the same configuration on another CPU or torch "
    "build can end elsewhere (the BLAS kernels sum in another order and training amplifies it). "
    "Gossip rounds and bytes are fixed by the configuration, except under consensus control, "
    "whose rounds follow the float trajectory."
)


def plot_record(rows: Sequence[Mapping[str, str]], path: str | Path) -> Path:
    """The record's averaged-model accuracy differences (re-run − committed, pp), one row per
    cell (filled: recorded on this machine; open: elsewhere or unrecorded), against the band of
    the tolerance; written to ``path`` (PNG)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metric = "accuracy (averaged model)"
    points = [r for r in rows if r["metric"] == metric and r["rerun"] and r["committed"]]
    fig = Figure(figsize=(7.0, 1.6 + 0.4 * max(len(points), 1)), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    tol = max((float(r["tolerance"]) for r in points if r["tolerance"]), default=0.0)
    if tol > 0:
        ax.axvspan(-tol, tol, color="0.88", label=f"± {tol:g} pp (tolerance)")
    ax.axvline(0.0, color="0.4", lw=1)
    for i, r in enumerate(points):
        same = r["same_machine"] == "true"
        delta = float(r["rerun"]) - float(r["committed"])
        ax.scatter([delta], [i], s=40, facecolors="C0" if same else "none", edgecolors="C0")
    ax.scatter([], [], facecolors="C0", edgecolors="C0", label="recorded on this machine")
    ax.scatter([], [], facecolors="none", edgecolors="C0", label="recorded elsewhere / not")
    ax.set_yticks(range(len(points)), [f"{Path(r['directory']).name}: {r['run']}" for r in points],
                  fontsize=8)  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel("re-run here − committed, test accuracy of the averaged model (pp)")
    ax.grid(alpha=0.3, axis="x")
    fig.legend(fontsize=7, loc="outside lower center", ncols=3)
    ax.set_title("concord report verify: one cell per report", fontsize=10)
    out = Path(path)
    fig.savefig(out)
    return out


def render_markdown(
    rows: Sequence[Mapping[str, str]],
    *,
    command: str,
    csv_name: str,
    date: str,
    python: str,
    cores: object,
    plot: str | None = None,
) -> str:
    """The reproducibility report of the record's ``rows``: every number and machine field from
    them (``csv_name``: the CSV they were written to, relative to the markdown), besides the
    command, the date and this machine's Python and logical cores."""

    def unique(key: str) -> str:
        return ", ".join(dict.fromkeys(r[key] for r in rows if r[key])) or "—"

    lines = [
        "# Reproducibility check",
        "",
        f"Re-runs of committed report cells by `concord report verify` on {date}, every number "
        f"from `{csv_name}`. The command:",
        "",
        "```bash",
        command,
        "```",
        "",
        f"This machine: torch {unique('this_torch')}, Python {python}, CPU {unique('this_cpu')}, "
        f"{cores} logical cores, {unique('this_threads')} torch thread(s) per run.",
    ]
    for cell in _cells_of(rows):
        first = cell[0]
        lines += ["", f"## `{first['directory']}`: run `{first['run']}`", ""]
        if not first["recorded_torch"]:
            lines.append("The report does not record its machine.")
        else:
            recorded = (
                f"Recorded machine: torch {first['recorded_torch']}, CPU {first['recorded_cpu']}, "
                f"{first['recorded_threads'] or '—'} torch thread(s) per run"
            )
            differs = _differing_machine(first)
            lines.append(
                f"{recorded}: differs from this machine ({', '.join(differs)})."
                if differs
                else f"{recorded}: the same as this machine."
            )
        header = ["metric", "committed", "re-run", "|Δ|", "tolerance", "verdict"]
        lines += ["", markdown_grid(header, [_md_cells(r) for r in cell]).rstrip("\n")]
    line, details = summarize(rows)
    lines += ["", "## Summary", "", line]
    if details:
        lines += ["", *(f"- {d}" for d in details)]
    if plot is not None:
        lines += ["", f"![re-run minus committed accuracy]({plot})"]
    lines += ["", MACHINE_DEPENDENT, ""]
    return "\n".join(lines)


def _slug(directory: Path) -> str:
    name = directory.resolve().name or "report"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)


def verify_reports(
    choices: Sequence[Choice],
    *,
    out: str | Path | None = None,
    tol: float = ACCURACY_TOL_PP,
    count_tol: float | None = None,
    csv_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
    command: str | None = None,
    today: str | None = None,
    echo: Callable[[str], None] = print,
    run_fn: RunFn | None = None,
    console: Console | None = None,
) -> int:
    """Re-run the chosen cell of each report (`Choice`s; `parse_directories`) and print each
    comparison; with ``csv_path``, write the reproducibility record (`record_rows`), with
    ``markdown_path`` too (needs ``csv_path``) its report (`render_markdown`; ``command``: the
    command line it shows, default rebuilt from the arguments; ``today``: its date, default
    today's). Every input is checked before the first re-run. ``out``: one report's re-run goes
    to ``out/runs/NAME``, several to ``out/<i>-<directory name>/runs/NAME`` (default: a fresh
    temporary directory). Returns 0 every metric of every cell within tolerance, 1 any differs
    or a re-run failed; raises `VerifyError` for bad input (exit 2)."""
    _check_tolerances(tol, count_tol)
    if not choices:
        raise VerifyError("give at least one report directory (DIR or DIR::RUN)")
    csv_file = None if csv_path is None else Path(csv_path)
    md_file = None if markdown_path is None else Path(markdown_path)
    if md_file is not None and csv_file is None:
        raise VerifyError(
            "--markdown needs --csv: the markdown is generated from the CSV's rows and names it"
        )
    for path, option in ((csv_file, "--csv"), (md_file, "--markdown")):
        if path is not None and path.is_dir():
            raise VerifyError(f"{option} {path} is a directory: give a file path")
    if csv_file is not None and md_file is not None and csv_file.resolve() == md_file.resolve():
        raise VerifyError("--csv and --markdown name the same file")
    prepared = []
    seen: dict[tuple[Path, str], str] = {}
    for choice in choices:
        target = load_target(
            choice.directory, run=choice.run, row=choice.row, column=choice.column,
            seed=choice.seed,
        )  # fmt: skip
        key = (target.directory.resolve(), target.cell.name)
        if key in seen:
            raise VerifyError(
                f"run {target.cell.name!r} of {choice.directory} is chosen twice "
                f"({seen[key]} and {choice.directory}): verify each cell once"
            )
        seen[key] = choice.directory
        base, cfg = _config(target)
        prepared.append((choice, target, base, cfg))
    several = len(prepared) > 1
    # no --out: the re-runs go to a temporary directory, removed however this ends (a verdict,
    # a failed re-run, an error, Ctrl-C); with --out they stay
    kept = out is not None
    root = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="concord-verify-"))
    try:
        out_dirs = []
        for i, (_, target, _, _) in enumerate(prepared, 1):
            out_dir = root / f"{i}-{_slug(target.directory)}" if several else root
            if (out_dir / "runs" / target.run.name).exists():
                where = f"--out {root}" + (f": {out_dir}" if several else "")
                raise VerifyError(
                    f"{where} already holds runs/{target.run.name}; choose another directory"
                )
            out_dirs.append(out_dir)
        outcomes = []
        for i, ((choice, target, base, cfg), out_dir) in enumerate(
            zip(prepared, out_dirs, strict=True), 1
        ):
            if several:
                if i > 1:
                    echo("")
                echo(f"=== {i}/{len(prepared)}: {choice.directory} ===")
            outcomes.append(
                _rerun(choice.directory, target, base, cfg, out_dir, tol=tol, count_tol=count_tol,
                       echo=echo, run_fn=run_fn, console=console, kept=kept)
            )  # fmt: skip
        rows = record_rows(outcomes)
        if several:
            echo("")
            echo(f"summary: {summarize(rows)[0]}")
        if csv_file is not None:
            write_record_csv(csv_file, rows)
            echo(f"wrote {csv_file} ({len(rows)} rows)")
        if csv_file is not None and md_file is not None:
            here = outcomes[0].here
            md_file.parent.mkdir(parents=True, exist_ok=True)
            figure = plot_record(rows, md_file.with_suffix(".png"))
            echo(f"wrote {figure}")
            text = render_markdown(
                rows,
                command=command
                or _default_command(choices, out, tol, count_tol, csv_path, markdown_path),
                csv_name=Path(
                    os.path.relpath(csv_file.resolve(), md_file.resolve().parent)
                ).as_posix(),
                date=today or datetime.date.today().isoformat(),
                python=str(here.get("python")),
                cores=here.get("cores"),
                plot=figure.name,
            )
            md_file.write_text(text, encoding="utf-8")
            echo(f"wrote {md_file}")
        return 0 if all(o.ok for o in outcomes) else 1
    finally:
        if not kept:
            shutil.rmtree(root, ignore_errors=True)


def verify_main(
    directory: str | Path,
    *,
    run: str | None = None,
    row: str | None = None,
    column: str | None = None,
    seed: int | None = None,
    out: str | Path | None = None,
    tol: float = ACCURACY_TOL_PP,
    count_tol: float | None = None,
    csv_path: str | Path | None = None,
    markdown_path: str | Path | None = None,
    command: str | None = None,
    echo: Callable[[str], None] = print,
    run_fn: RunFn | None = None,
    console: Console | None = None,
) -> int:
    """Re-run a cell of the report in ``directory`` and print the comparison; returns the exit
    code: 0 every metric within tolerance, 1 a metric differs or the re-run failed. Raises
    `VerifyError` for bad input (exit 2). ``tol``: accuracy tolerance in pp; ``count_tol``:
    relative tolerance of rounds and bytes (None: 0, or `CONTROLLED_COUNT_TOL` when consensus
    control is on). ``run_fn``: the engine's run (default: the sweep's, without plots). The
    record: `verify_reports`."""
    return verify_reports(
        [Choice(str(directory), run, row, column, seed)],
        out=out,
        tol=tol,
        count_tol=count_tol,
        csv_path=csv_path,
        markdown_path=markdown_path,
        command=command,
        echo=echo,
        run_fn=run_fn,
        console=console,
    )
