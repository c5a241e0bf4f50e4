"""The report of a preset sweep (`concord.lab.presets`): ``report.md`` and PNG plots in the sweep's
output directory, next to its ``table.csv``.

- ``report.md``: title, setup, the exact command, the rows (algorithm, topology, hyperparameters,
  lr per column), tables of mean ± std over seeds (the preset's metric first, then the other
  accuracy, the final training loss, gossip rounds and bytes), the expected orderings checked
  against the measured means, failed runs, and wall time. A tuning sweep (``--tune``) instead
  tables the metric per lr and names the best lr per (row, column).
- ``metric.png``: the metric and the averaged model's accuracy against the column setting, one
  line per row (mean ± std over seeds);
- ``curves-<column>.png``: per column, the averaged model's test accuracy and the training loss
  (mean over peers of the local mini-batch loss, averaged over 50 buckets of steps) against the
  step, one line per row, mean over seeds;
- ``bytes.png``: the metric against the bytes each peer sent (log scale), one point per
  (row, column) with error bars over seeds, a marker and colour per row — for compression studies;
- ``lr.png`` (tuning only): the metric against the lr, a panel per column, a line per row.

The plots are drawn by `concord.lab.presets.plots`.

Every report ends with a "Reproducibility" section (`reproducibility_section`): the machine and
versions that produced it (`environment`, recorded in the sweep's ``preset.json`` next to each run's
configuration, `run_manifest`), why float results are machine-dependent, and the
``concord report verify`` command (`concord.lab.verify`) that re-runs a cell and compares it.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import shlex
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from concord.lab.presets.cells import Cells, cell_value
from concord.lab.presets.plots import (
    plot_bytes,
    plot_curves,
    plot_lr,
    plot_metric,
    tuned_columns,
)
from concord.lab.presets.spec import Preset, PresetGrid, Setup
from concord.lab.report import format_duration, markdown_grid
from concord.lab.sweep import METRICS, SweepRun
from concord.lab.verify.paths import MANIFEST_VERSION, TABLE_METRICS, code_dirty
from concord.runtime.records import read_summary

_DPI = 110

# ---------------------------------------------------------------------------------------------
# Reproducibility: what produced a report, and how to check one of its cells

MACHINE_EXAMPLE = (
    "one measured example: D-SGD (ring), α = 0.01, seed 2 of `relaysgd-dirichlet` gave 51.78 % "
    "(averaged model) on one CPU against the 61.37 % committed"
)


def cpu_model() -> str:
    """The CPU's model name (``model name`` in /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def environment(
    *, threads: int | None = None, jobs: int | None = None, engine: str = "vectorized"
) -> dict[str, Any]:
    """The machine and versions a sweep runs on, as a report records them (top-level keys of its
    ``preset.json``): ``torch``, ``python``, ``platform``, ``cpu`` (model name), ``cores``
    (logical), ``threads`` (torch threads per run: the config's ``threads``; None → what
    `concord.lab.sweep.run_sweep` gives each of its ``jobs`` workers, cores // jobs), ``jobs``
    (runs at a time), ``engine``, ``host`` (`concord.runtime.hostinfo.host_facts`: the facts that
    decide whether two hosts compute the same bits — CPU family/model/stepping/flags, numpy's
    BLAS, torch's build and CPU capability, thread variables) and ``git_commit`` (the commit of
    the code, None outside a git checkout) with ``git_dirty`` (uncommitted changes to the code:
    True, False, or None when unknown)."""
    import numpy  # noqa: F401  (loaded, so that host_facts records its BLAS)
    import torch

    from concord.runtime.hostinfo import host_facts
    from concord.runtime.rundir import git_commit

    cores = os.cpu_count() or 1
    return {
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": cores,
        "threads": threads if threads is not None else max(1, cores // (jobs or 1)),
        "jobs": jobs,
        "engine": engine,
        "host": host_facts(),
        "git_commit": git_commit(),
        "git_dirty": code_dirty(),
    }


def run_manifest(
    runs: Sequence[SweepRun],
    *,
    base: Sequence[str],
    overrides: Sequence[str] = (),
    engine: str = "vectorized",
    keys: Mapping[str, tuple[str, str]] | None = None,
    table: str = "table.csv",
    name_column: str = "name",
    metrics: Mapping[str, str] = TABLE_METRICS,
) -> dict[str, Any]:
    """What re-creates each run's config (``concord report verify``), for a ``preset.json``
    (`MANIFEST_VERSION`): ``engine``, ``base`` (the preset's "dotted.key=value" items), ``set``
    (the command's ``--set`` items, applied after ``base``), ``runs``: every `SweepRun` (its
    fields; the config of run r is ``base``, then ``set``, then ``r.overrides``) with ``row_key``
    and ``column_key`` from ``keys`` (run name → (row key, column key); None: ``run.row`` and
    ``run.column``), and the table of the results: ``table`` (its file name), ``name_column``
    (the column naming each row's run) and ``metrics`` (compared metric → its column)."""
    entries = []
    for run in runs:
        row_key, column_key = keys[run.name] if keys is not None else (run.row, run.column)
        entries.append(
            {
                "name": run.name,
                "row_key": row_key,
                "column_key": column_key,
                "kind": run.kind,
                "row": run.row,
                "column": run.column,
                "plan": run.plan,
                "topology": run.topology,
                "factor": run.factor,
                "control_mode": run.control_mode,
                "seed": run.seed,
                "overrides": dict(run.overrides),
                "calibration_group": (
                    None if run.calibration_group is None else list(run.calibration_group)
                ),
            }
        )
    return {
        "manifest_version": MANIFEST_VERSION,
        "table": table,
        "name_column": name_column,
        "metrics": dict(metrics),
        "engine": engine,
        "base": list(base),
        "set": list(overrides),
        "runs": entries,
    }


def reproducibility_section(
    env: Mapping[str, Any] | None, *, directory: str | Path, run: str | None
) -> str:
    """The "## Reproducibility" section of a report: the machine and versions in ``env`` (an
    `environment` dict, or a ``preset.json`` holding its keys; None or missing keys: "not
    recorded"), that float results are machine-dependent, and the ``concord report verify``
    command that re-runs ``run`` of the report in ``directory`` (None: the command without
    ``--run``, i.e. its first run)."""
    env = env or {}

    def get(key: str) -> str:
        value = env.get(key)
        return "not recorded" if value is None or value == "" else str(value)

    if env.get("torch") is None:
        machine = (
            "The sweep that produced this report did not record its machine (it predates "
            "recorded environments)."
        )
    else:
        jobs = env.get("jobs")
        machine = (
            f"Produced with torch {get('torch')} and Python {get('python')} on {get('cpu')} "
            f"({get('cores')} logical cores; {get('platform')}): {get('threads')} torch "
            f"thread(s) per run"
            + (f", {jobs} run(s) at a time" if jobs is not None else "")
            + f", {get('engine')} engine. `preset.json` records these and every run's "
            "configuration"
            + (
                ", with the host facts that decide bit-equality across hosts (`host`: CPU "
                "family, model, stepping and flags, numpy's BLAS, torch's build and CPU "
                "capability, thread variables) and the code's commit (`git_commit`)."
                if isinstance(env.get("host"), dict)
                else "."
            )
        )
    command = ["concord", "report", "verify", str(directory)]
    if run is not None:
        command += ["--run", run]
    return "\n".join(
        [
            "## Reproducibility",
            "",
            machine,
            "",
            "Float results are machine-dependent. A run is deterministic for a given seed, torch "
            "build, CPU and thread count, but the same cell re-run on another CPU can differ by "
            "more than the spread over seeds: the BLAS kernels chosen there sum in another order "
            f"and training amplifies the difference ({MACHINE_EXAMPLE}). Gossip rounds and bytes "
            "are fixed by the configuration, unless consensus control (or another schedule that "
            "follows the measurements) is on. Compare cells within one report; to compare "
            "machines, re-run a cell.",
            "",
            "Check a cell on your machine: the command re-runs it with its recorded configuration "
            "and compares accuracy, worst peer, gossip rounds and bytes with this report; a "
            "difference is attributed to the host or to the code, naming what differs "
            "(`--at-commit` re-runs the report's commit when both differ) "
            "(`--row`, `--column`, `--seed` pick another cell; give the directory this report "
            "and its CSV were copied to, if not this one):",
            "",
            "```bash",
            shlex.join(command),
            "```",
            "",
        ]
    )


def _table(
    preset: Preset, cells: Cells, key: str, *, scale: float, digits: int, lr: bool = False
) -> str:
    header = ["row", *(c.label for c in preset.columns)]
    body = []
    for row in preset.rows:
        line = [row.label]
        for col in preset.columns:
            if not row.runs_in(col.key):
                line.append("—")
                continue
            text = cells.stats(row.key, col.key, key).format(scale=scale, digits=digits) or "—"
            line.append(f"{text} (lr {cells.lr(row.key, col.key):g})" if lr else text)
        body.append(line)
    return markdown_grid(header, body)


def _rows_table(preset: Preset) -> str:
    header = ["row", "overrides", *(f"lr, {c.label}" for c in preset.columns)]
    body = [
        [
            r.label,
            ", ".join(f"{k}={v}" for k, v in r.overrides.items()),
            *(f"{r.lrs[c.key]:g}" if r.runs_in(c.key) else "—" for c in preset.columns),
        ]
        for r in preset.rows
    ]
    return markdown_grid(header, body)


def _checks(preset: Preset, cells: Cells, key: str) -> str:
    lines = []
    for rel in preset.expected:
        hi = cells.stats(rel.higher, rel.column, key)
        lo = cells.stats(rel.lower, rel.column, key)
        col = next(c for c in preset.columns if c.key == rel.column).label
        want = (
            f"> {preset.row(rel.lower).label} + {100 * rel.margin:g} pt"
            if rel.margin >= 0
            else f"≥ {preset.row(rel.lower).label} − {100 * -rel.margin:g} pt"
        )
        if not hi.values or not lo.values:
            verdict = "not measured"
        else:
            holds = hi.mean - lo.mean > rel.margin
            verdict = "**holds**" if holds else "**does not hold**"
            verdict += f" ({100 * hi.mean:.2f} vs {100 * lo.mean:.2f} %)"
        lines.append(f"- {col}: {preset.row(rel.higher).label} {want}: {verdict}")
    return "\n".join(lines)


def _knob_families(preset: Preset) -> list[tuple[str, list[tuple[float, Setup]]]]:
    """Rows that share every override but one numeric key (the knob, e.g. a compressor's
    ``compression.gamma``), with its values: (key, [(value, row) sorted by value]), two rows
    at least, in the order of the rows."""
    groups: dict[tuple[str, frozenset[tuple[str, str]]], list[tuple[float, Setup]]] = {}
    for row in preset.rows:
        for key, value in row.overrides.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            rest = frozenset((k, str(v)) for k, v in row.overrides.items() if k != key)
            groups.setdefault((key, rest), []).append((float(value), row))
    return [(key, sorted(members, key=lambda m: m[0])) for (key, _), members in groups.items()
            if len({v for v, _ in members}) >= 2]  # fmt: skip


def _trend(means: Sequence[float], values: Sequence[float], knob: str) -> str:
    """How the means move as the knob grows: rises, falls, peaks at …, or not monotonic."""
    steps = [b - a for a, b in itertools.pairwise(means)]
    if all(d > 0 for d in steps):
        return f"rises with {knob}"
    if all(d < 0 for d in steps):
        return f"falls as {knob} grows"
    best = max(range(len(means)), key=lambda i: means[i])
    if all(d > 0 for d in steps[:best]) and all(d < 0 for d in steps[best:]):
        return f"peaks at {knob} = {values[best]:g}, lower on either side"
    return "not monotonic in " + knob


def knob_reading(preset: Preset, cells: Cells, key: str) -> list[str]:
    """The "Across each knob" section, computed from the table: for each family of rows that
    differ in one numeric override (`_knob_families`) and each column, the metric's mean ± std
    at every value of the knob, whether it rises, falls or peaks (by the means; failed runs end
    the trend), so that no reading claims a trend the table does not have."""
    families = _knob_families(preset)
    if not families:
        return []
    lines = [
        "## Across each knob (computed from the table)",
        "",
        "Rows that differ only in one numeric setting: the metric (mean ± std over seeds) as "
        "it grows. The trend is read from the means of the cells whose runs all succeeded; a "
        "step between neighbours smaller than the larger of their two std is named as within "
        "the seed spread.",
        "",
    ]
    for knob, members in families:
        name = knob.rsplit(".", 1)[-1]
        stems = {row.label.rsplit(", ", 1)[0] for _, row in members}
        labels = stems.pop() if len(stems) == 1 else " / ".join(row.label for _, row in members)
        for col in preset.columns:
            present = [(v, row) for v, row in members if row.runs_in(col.key)]
            if len(present) < 2:
                continue
            parts, values, means, stds, failed = [], [], [], [], []
            for value, row in present:
                stats = cells.stats(row.key, col.key, key)
                text = stats.format(scale=100.0, digits=2) or "—"
                parts.append(f"{name} {value:g}: {text}")
                if stats.values and len(stats.values) == stats.runs:
                    values.append(value)
                    means.append(stats.mean)
                    stds.append(stats.std)
                elif stats.failures:
                    failed.append(value)
            trend = _trend(means, values, name) if len(means) >= 2 else "too few succeeded"
            close = [
                f"{values[i]:g} → {values[i + 1]:g}"
                for i in range(len(means) - 1)
                if abs(means[i + 1] - means[i]) < max(stds[i], stds[i + 1])
            ]
            if close:
                trend += f" (within the seed spread: {', '.join(close)})"
            if failed:
                trend += f"; runs fail at {name} = {', '.join(f'{v:g}' for v in failed)}"
            lines.append(f"- {labels}, {col.label}: {'; '.join(parts)} — {trend}.")
    lines.append("")
    return lines


# ---------------------------------------------------------------------------------------------
# The report


def _tuned_rows(preset: Preset) -> list[Setup]:
    return [r for r in preset.rows if any(preset.tunes(r, c.key) for c in preset.columns)]


def best_lrs(preset: Preset, cells: Cells, key: str) -> dict[str, dict[str, float | None]]:
    """row key → column key → the lr of ``lr_grid`` with the highest mean ``key`` (None: none
    succeeded). Ties go to the smaller lr."""
    out: dict[str, dict[str, float | None]] = {}
    for row in _tuned_rows(preset):
        out[row.key] = {}
        for col in tuned_columns(preset):
            if not preset.tunes(row, col.key):
                continue
            scored = [
                (s.mean, -lr, lr)
                for lr in row.lr_grid
                if (s := cells.stats(row.key, col.key, key, lr)).values
            ]
            out[row.key][col.key] = max(scored)[2] if scored else None
    return out


def _tuning_section(preset: Preset, cells: Cells, key: str) -> tuple[str, dict[str, Any]]:
    chosen = best_lrs(preset, cells, key)
    columns = tuned_columns(preset)
    parts = []
    for row in _tuned_rows(preset):
        header = ["lr", *(c.label for c in columns)]
        body = []
        for lr in row.lr_grid:
            line = [f"{lr:g}"]
            for col in columns:
                text = cells.stats(row.key, col.key, key, lr).format(scale=100.0) or "—"
                line.append(f"**{text}**" if chosen[row.key].get(col.key) == lr else text)
            body.append(line)
        parts.append(f"### {row.label}\n\n{markdown_grid(header, body)}")
    header = ["row", *(c.label for c in columns)]
    body = [
        [
            row.label,
            *(
                _fmt_lr(chosen[row.key][c.key], row) if c.key in chosen[row.key] else "—"
                for c in columns
            ),
        ]
        for row in _tuned_rows(preset)
    ]
    summary = "## Chosen lr (best of the grid)\n\n" + markdown_grid(header, body)
    return summary + "\n" + "\n".join(parts), chosen


def _fmt_lr(lr: float | None, row: Setup) -> str:
    if lr is None:
        return "none succeeded"
    edge = " (grid edge)" if lr in (min(row.lr_grid), max(row.lr_grid)) else ""
    return f"{lr:g}{edge}"


def write_report(
    preset: Preset,
    grid: PresetGrid,
    rows: Sequence[Mapping[str, Any]],
    out: Path,
    *,
    command: str,
    overrides: Sequence[str] = (),
    base: Any,
    wall_seconds: float,
    cores: int | None,
    env: Mapping[str, Any] | None = None,
) -> Path:
    """Write report.md and the PNGs into ``out``; returns the report's path. ``env``: the
    `environment` the runs ran in (None: not recorded), for the "Reproducibility" section."""
    peers = {run.name: _peers(run, base) for run in grid.runs()}
    rows = [{**r, "bytes_per_peer": _per_peer(r, peers.get(str(r.get("name"))))} for r in rows]
    cells = Cells(grid, rows)
    key, description = METRICS[preset.metric]
    seeds = ", ".join(str(s) for s in grid.seeds)
    runs = len(grid.runs())
    steps = _steps(rows)
    sizes = sorted(set(peers.values()))
    if len(sizes) > 1:  # the columns (or rows) set the number of peers
        steps = "see the curves (it depends on n)"
        replicas = f"all n replicas (n = {', '.join(map(str, sizes))})"
    else:
        replicas = f"all {sizes[0] if sizes else base.peers} replicas"
    lines = [
        f"# {preset.title}" + (" — lr tuning" if grid.tune else ""),
        "",
        preset.setup,
        "",
        f"Seeds: {seeds}. Runs: {runs}. Steps per run: {steps}. Engine: vectorized (one process "
        f"trains {replicas} batched). Generated {time.strftime('%Y-%m-%d')}, sweep "
        f"wall time {format_duration(wall_seconds)} on {cores} core(s) "
        f"({len({r['name'] for r in rows if r.get('status') == 'ok'})} runs ok; mean wall time "
        f"per run {_mean_wall(rows)}).",
        "",
        *(
            [
                f"**Sizes changed from the preset's with** `{' '.join(overrides)}` (the setup "
                "paragraph above describes the preset's own).",
                "",
            ]
            if overrides
            else []
        ),
        "Regenerate (then copy `report.md`, `table.csv`, `preset.json` and `*.png` from the output "
        "directory):",
        "",
        "```bash",
        command,
        "```",
        "",
    ]
    written: list[Path] = []
    if grid.tune:
        text, chosen = _tuning_section(preset, cells, key)
        lines += [f"Metric: test accuracy (%), {description}, at seed(s) {seeds}.", "", text]
        (out / "tuning.json").write_text(json.dumps(chosen, indent=2) + "\n", encoding="utf-8")
        written.append(plot_lr(preset, cells, key, out / "lr.png"))
        lines += ["", "![lr](lr.png)", ""]
    else:
        lines += [
            "## Rows",
            "",
            preset.lr_note,
            "",
            _rows_table(preset),
            f"## Test accuracy (%), {description} — mean ± std over seeds",
            "",
            _table(preset, cells, key, scale=100.0, digits=2),
        ]
        for other in ("avg", "worst"):
            if other != preset.metric:
                okey, odesc = METRICS[other]
                lines += [f"## Test accuracy (%), {odesc}", "", _table(preset, cells, okey,
                          scale=100.0, digits=2)]  # fmt: skip
        lines += [
            "## Final training loss (mean over peers, last 10 % of the steps)",
            "",
            _table(preset, cells, "train_loss", scale=1.0, digits=3),
            "## Gossip rounds and bytes sent (all peers), per run",
            "",
            _table(preset, cells, "gossip_rounds_total", scale=1.0, digits=0),
            _table(preset, cells, "bytes_sent_total", scale=2.0**-20, digits=1).replace(
                "| row |", "| MiB sent |", 1
            ),
            "## Expected orderings, checked",
            "",
            preset.expected_text,
            "",
            _checks(preset, cells, key),
            "",
            *knob_reading(preset, cells, key),
            "## Plots",
            "",
            "![metric vs setting](metric.png)",
            "",
        ]
        written.append(plot_metric(preset, cells, out / "metric.png"))
        written.append(plot_bytes(preset, cells, out / "bytes.png"))
        lines += [
            f"![{description} against bytes sent per peer](bytes.png)",
            "",
        ]
        for col in preset.columns:
            name = f"curves-{col.key}.png"
            written.append(plot_curves(preset, cells, col, out / name))
            lines += [f"![{col.label}]({name})", ""]
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        lines += ["## Failed runs", ""]
        lines += [f"- `{r['name']}`: {r.get('error') or r.get('status')}" for r in failed]
        lines.append("")
    first = next((str(r["name"]) for r in rows if r.get("status") == "ok"), None)
    lines.append(reproducibility_section(env, directory=out, run=first))
    path = out / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


def _peers(run: SweepRun, base: Any) -> int:
    return int(str(run.overrides.get("peers", base.peers)))


def _per_peer(row: Mapping[str, Any], peers: int | None) -> float | None:
    sent = cell_value(row, "bytes_sent_total")
    return None if sent is None or not peers else sent / peers


def _mean_wall(rows: Sequence[Mapping[str, Any]]) -> str:
    walls = [w for r in rows if (w := cell_value(r, "wall_seconds")) is not None]
    return format_duration(statistics.fmean(walls)) if walls else "—"


def _steps(rows: Sequence[Mapping[str, Any]]) -> str:
    for row in rows:
        if row.get("status") == "ok" and row.get("run_dir"):
            summary = read_summary(Path(str(row["run_dir"])))
            if summary is not None:
                return str(summary.steps)
    return "—"
