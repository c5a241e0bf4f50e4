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
"""

from __future__ import annotations

import csv
import json
import math
import re
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from concord.lab.presets.report import environment
from concord.lab.sweep import RunFn, SweepRun, hold_for_calibration, run_sweep, run_without_plots

__all__ = [
    "ACCURACY_TOL_PP",
    "CONTROLLED_COUNT_TOL",
    "Check",
    "Target",
    "VerifyError",
    "load_target",
    "parse_sweep_command",
    "verify_main",
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
    Metric("gossip rounds", "gossip_rounds_total", False, _key("gossip_rounds_total")),
    Metric("bytes sent (all peers)", "bytes_sent_total", False, _key("bytes_sent_total")),
)
CONSENSUS_METRICS = (
    Metric("accuracy (averaged model)", "accuracy", True, _key("accuracy_avg_model")),
    Metric("accuracy (worst peer)", "worst_peer", True, _key("accuracy_worst_peer")),
    Metric("gossip rounds", "gossip_rounds", False, _key("gossip_rounds_total")),
    Metric("bytes sent per peer", "bytes_per_peer", False, _per_peer),
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
    echo: Callable[[str], None] = print,
    run_fn: RunFn | None = None,
    console: Console | None = None,
) -> int:
    """Re-run a cell of the report in ``directory`` and print the comparison; returns the exit
    code: 0 every metric within tolerance, 1 a metric differs or the re-run failed. Raises
    `VerifyError` for bad input (exit 2). ``tol``: accuracy tolerance in pp; ``count_tol``:
    relative tolerance of rounds and bytes (None: 0, or `CONTROLLED_COUNT_TOL` when consensus
    control is on). ``run_fn``: the engine's run (default: the sweep's, without plots)."""
    if not math.isfinite(tol) or tol < 0:
        raise VerifyError(f"--tol must be a number of percentage points >= 0, got {tol}")
    if count_tol is not None and (not math.isfinite(count_tol) or count_tol < 0):
        raise VerifyError(f"--count-tol must be a fraction >= 0, got {count_tol}")
    target = load_target(directory, run=run, row=row, column=column, seed=seed)
    base, cfg = _config(target)
    name = target.run.name
    if out is None:
        out_dir = Path(tempfile.mkdtemp(prefix="concord-verify-"))
    else:
        out_dir = Path(out)
        if (out_dir / "runs" / name).exists():
            raise VerifyError(
                f"--out {out_dir} already holds runs/{name}; choose another directory"
            )
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
    echo(f"re-running{calibration}: {cfg.engine} engine, {cfg.peers} peers, into {out_dir}")
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
    echo("")
    if outcome.get("status") != "ok" or not summary:
        echo(f"the re-run failed: {outcome.get('error') or outcome.get('status')}")
        echo(f"(its directory: {out_dir / 'runs' / name})")
        for line in machine:
            echo(line)
        return 1
    checks = compare(target, summary, int(cfg.peers), tol, count_tol)
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
        return 1
    if not failed:
        echo(f"verdict: {name} reproduces: every metric within tolerance")
        if state.startswith("differs"):
            echo(f"(on a machine that {state}; float results are machine-dependent)")
        return 0
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
    return 1
