"""A report directory's run manifest (``preset.json``) and the cell of its table to re-run.

Every configuration comes from the manifest (`concord.lab.presets.report.run_manifest`,
version `MANIFEST_VERSION`): its ``engine``, ``base`` and ``set`` items and the chosen run's
``overrides``; its ``table`` (the CSV of the results), ``name_column`` and ``metrics`` (compared
metric → column) say what to compare. A version-1 manifest (no ``manifest_version``) reads as
version 2 with ``table.csv``, ``name`` and the generic metric columns.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from concord.core.records import RunSummary
from concord.lab.sweep import SweepRun
from concord.lab.verify.paths import MANIFEST_VERSION, TABLE_METRICS

__all__ = ["METRICS", "Cell", "Metric", "Target", "VerifyError", "load_target", "number"]


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
    read: Callable[[RunSummary, int], float | None]
    unit: str = "%"  # of the reproducibility record (`record_rows`): %, rounds or bytes


def number(value: object) -> float | None:
    """``value`` as a finite float (None: empty, not a number, infinite)."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        x = float(str(value))
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _per_peer(summary: RunSummary, peers: int) -> float | None:
    return float(round(summary.bytes_sent_total / peers))


METRICS: Mapping[str, Metric] = {
    m.column: m
    for m in (
        Metric(
            "accuracy (averaged model)",
            "accuracy_avg_model",
            True,
            lambda s, _: number(s.accuracy_avg_model),
        ),
        Metric(
            "accuracy (worst peer)",
            "accuracy_worst_peer",
            True,
            lambda s, _: number(s.accuracy_worst_peer),
        ),
        Metric(
            "gossip rounds",
            "gossip_rounds_total",
            False,
            lambda s, _: number(s.gossip_rounds_total),
            "rounds",
        ),
        Metric(
            "bytes sent (all peers)",
            "bytes_sent_total",
            False,
            lambda s, _: number(s.bytes_sent_total),
            "bytes",
        ),
        Metric("bytes sent per peer", "bytes_per_peer", False, _per_peer, "bytes"),
    )
}
"""Every metric a manifest's ``metrics`` may name, by name (``column``: the table.csv one)."""


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
    seeds: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Metric column → the committed values of every seed of the cell that succeeded (the
    cell: the runs with the same row and column keys), for its seed-spread tolerance."""


@dataclass(frozen=True)
class Manifest:
    """A parsed ``preset.json``: the table, the metrics, the config items and every run."""

    path: Path
    meta: Mapping[str, Any]
    table: str
    name_column: str
    metrics: tuple[Metric, ...]
    items: tuple[str, ...]
    runs: Mapping[str, SweepRun]
    keys: Mapping[str, tuple[str, str]]

    @property
    def source(self) -> str:
        note = self.meta.get("reconstructed")
        where = f"the configuration recorded in {self.path.name}"
        return f"{where} ({note})" if note else where


def _fail(path: Path, what: str) -> VerifyError:
    return VerifyError(f"{path}: {what}")


def _run(path: Path, i: int, e: object) -> tuple[SweepRun, tuple[str, str]]:
    if not isinstance(e, dict) or not isinstance(e.get("name"), str):
        raise _fail(path, f"runs[{i}] is not an object with a string 'name'")
    try:
        group = e.get("calibration_group")
        run = SweepRun(
            name=e["name"],
            kind=e.get("kind", "setup"),
            row=str(e.get("row", e.get("row_key", ""))),
            plan=e.get("plan"),
            topology=e.get("topology"),
            factor=e.get("factor"),
            control_mode=e.get("control_mode", "none"),
            seed=int(e["seed"]),
            overrides=dict(e["overrides"]),
            calibration_group=None if not group else (str(group[0]), str(group[1]), int(group[2])),
            column=e.get("column"),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise _fail(path, f"runs[{i}] ({e['name']}): {type(exc).__name__}: {exc}") from None
    return run, (str(e.get("row_key")), str(e.get("column_key")))


def read_manifest(directory: Path) -> Manifest:
    """``directory/preset.json`` as a `Manifest`; `VerifyError` naming the file, the version and
    what is missing otherwise."""
    path = directory / "preset.json"
    if not path.is_file():
        raise VerifyError(
            f"{directory} has no preset.json: `concord report verify` re-runs a cell from the "
            f"report's run manifest (preset.json, version {MANIFEST_VERSION}, written by "
            "`concord sweep --preset`); a report without one cannot be verified"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise VerifyError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise _fail(path, "expected a JSON object")
    version = meta.get("manifest_version", 1)
    if version not in (1, MANIFEST_VERSION):
        raise _fail(path, f"manifest version {version!r}: this concord reads versions 1 and "
                          f"{MANIFEST_VERSION}")  # fmt: skip
    if not isinstance(meta.get("runs"), list) or not isinstance(meta.get("base"), list):
        raise _fail(
            path,
            f"manifest version {version} without 'runs' and 'base': it records no run "
            "configurations (a report older than recorded manifests)",
        )
    table = str(meta.get("table", "table.csv"))
    names = meta.get("metrics", TABLE_METRICS)
    if not isinstance(names, dict) or not names:
        raise _fail(path, "'metrics' must map metric names to table columns")
    if unknown := [m for m in names if m not in METRICS]:
        raise _fail(path, f"unknown metrics {unknown}; known: {', '.join(METRICS)}")
    metrics = tuple(
        Metric(METRICS[m].label, str(col), METRICS[m].accuracy, METRICS[m].read, METRICS[m].unit)
        for m, col in names.items()
    )
    runs: dict[str, SweepRun] = {}
    keys: dict[str, tuple[str, str]] = {}
    for i, entry in enumerate(meta["runs"]):
        run, key = _run(path, i, entry)
        runs[run.name], keys[run.name] = run, key
    items = (f"engine={meta.get('engine', 'vectorized')}", *meta["base"], *meta.get("set", []))
    return Manifest(path, meta, table, str(meta.get("name_column", "name")), metrics,
                    tuple(str(i) for i in items), runs, keys)  # fmt: skip


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _int(value: object) -> int | None:
    x = number(value)
    return None if x is None else int(x)


def _listing(values: Sequence[object], limit: int = 12) -> str:
    unique = list(dict.fromkeys(str(v) for v in values if v not in (None, "")))
    shown = ", ".join(unique[:limit])
    return shown + (f", … ({len(unique)} in all)" if len(unique) > limit else "")


def _ok(cell: Cell) -> bool:
    return cell.record.get("status") == "ok"


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
    in_cell = [
        c for c in cells if row in (c.row_key, c.row_label) and column in (c.column_key,
                                                                            c.column_label)
    ]  # fmt: skip
    found = [c for c in in_cell if seed is None or c.seed == seed]
    if not found:
        seeds = _listing([c.seed for c in in_cell])
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


def load_target(
    directory: str | Path,
    *,
    run: str | None = None,
    row: str | None = None,
    column: str | None = None,
    seed: int | None = None,
) -> Target:
    """The run of the report in ``directory`` to re-run and what to compare it with, all from
    its manifest (`read_manifest`); raises `VerifyError` naming the problem (and the valid
    choices) for bad input."""
    directory = Path(directory)
    if not directory.is_dir():
        raise VerifyError(f"report directory {directory} does not exist (or is not a directory)")
    manifest = read_manifest(directory)
    table = directory / manifest.table
    if not table.is_file():
        raise VerifyError(f"{directory} holds no {manifest.table} (the table {manifest.path} "
                          "names): not a report directory")  # fmt: skip
    records = _read_csv(table)
    where = str(table)
    if not records:
        raise VerifyError(f"{where} has no runs")
    if manifest.name_column not in records[0]:
        raise VerifyError(f"{where} has no column {manifest.name_column!r} (preset.json's "
                          "name_column)")  # fmt: skip
    cells = []
    for r in records:
        name = r.get(manifest.name_column, "")
        row_key, col_key = manifest.keys.get(name, ("", ""))
        labels = (r.get("row") or row_key, r.get("column") or col_key)
        cells.append(Cell(name, row_key, col_key, *labels, _int(r.get("seed")), r))
    cell, chosen = _choose(cells, where, run, row, column, seed)
    if not _ok(cell):
        status = cell.record.get("status") or "unknown"
        raise VerifyError(
            f"run {cell.name!r} has status {status!r} in {where}: no committed values to "
            f"compare; pick a run that succeeded, e.g. "
            f"{_listing([c.name for c in cells if _ok(c)], 5)}"
        )
    if cell.name not in manifest.runs:
        raise VerifyError(
            f"run {cell.name!r} of {where} is not in the runs of {manifest.path}: its "
            "configuration is not recorded"
        )
    present = tuple(m for m in manifest.metrics if m.column in cell.record)
    same = [
        c for c in cells if _ok(c) and (c.row_key, c.column_key) == (cell.row_key, cell.column_key)
    ]
    siblings = same if cell.row_key and cell.column_key else [cell]  # fmt: skip
    seeds = {
        m.column: tuple(x for c in siblings if (x := number(c.record.get(m.column))) is not None)
        for m in present
    }
    return Target(directory, manifest.table, str(manifest.meta.get("preset", directory.name)),
                  manifest.runs[cell.name], cell, manifest.items, present, manifest.meta,
                  manifest.source, chosen, seeds=seeds)  # fmt: skip
