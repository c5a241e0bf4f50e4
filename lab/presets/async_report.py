"""The report of ``concord sweep --preset async`` (`concord.lab.presets.asynchronous`):
``curves.csv``, ``report.md`` and the PNGs, in the sweep's output directory.

- ``curves.csv``: one row per evaluation of every run that succeeded, on the virtual clock:
  ``virtual_time`` (seconds), ``epochs`` (samples processed by all peers / training-set size)
  and the accuracies. An asynchronous run's clock is its step records' ``virtual_time`` and its
  samples their ``local_steps``; a synchronous run appears once per speed spread, its step
  lasting `sync_step_seconds` (the slowest peer's compute plus the step's longest delay). It is
  written from the run directories when they are there, else read back (``--report-only`` on a
  copied report).
- ``report.md``: every number from ``curves.csv`` and ``table.csv`` — final accuracy (averaged
  model, worst peer), the horizon, virtual seconds per epoch, accuracy at equal virtual time
  and at equal samples, time to a target, staleness — and a reading generated from them
  (`reading`), which checks AD-PSGD's claim (Lian et al., ICML 2018: the same accuracy per
  epoch as D-SGD, epochs faster).
- ``time-n<N>.png`` / ``epochs-n<N>.png``: the averaged model's accuracy against virtual time /
  epochs, a panel per (data, spread), a line per row (mean over seeds).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from concord.core.config_async import AsyncConfig
from concord.core.records import EvalRecord, StepRecord
from concord.lab.presets import asynchronous as spec
from concord.lab.presets.report import reproducibility_section
from concord.lab.presets.spec import Preset, PresetGrid, PresetRequest, Study, command_line
from concord.lab.report import CellStats, format_duration, markdown_grid
from concord.runtime.records import read_metrics

CURVES = ("run", "row", "n", "spread", "data", "seed", "step", "epochs", "virtual_time",
          "accuracy_avg_model", "accuracy_worst_peer", "staleness_mean")  # fmt: skip
TARGET_MARGIN = 0.005
"""Time to target: the first evaluation at or above all-reduce's final accuracy (mean over seeds,
same n and data) minus this (0.5 percentage point)."""
CLAIM_TOL = 0.01
"""AD-PSGD's "same accuracy per epoch" holds where it is within this (1 pp) or within the seed
spread (the larger std of the two cells) of D-SGD at the same epochs."""


def links(topology: str, n: int) -> list[tuple[int, int]]:
    """The directed links one synchronous step uses: every pair (all-reduce on ``complete``), or
    the two ring neighbours (D-SGD on ``ring``)."""
    if topology == "complete":
        return [(i, j) for i in range(n) for j in range(n) if i != j]
    if topology == "ring":
        return [(i, (i + d) % n) for i in range(n) for d in (-1, 1)]
    raise ValueError(f"topology {topology!r}: no synchronous clock; use 'complete' or 'ring'")


def sync_step_seconds(
    speeds: Sequence[float],
    compute_s: float,
    delays: Sequence[Sequence[float]],
    edges: Iterable[tuple[int, int]],
) -> float:
    """Virtual seconds of one synchronous step: every peer computes (the slowest, max(speeds) ×
    ``compute_s``, decides), then the step's messages travel at once (the longest one-way delay
    of the links ``edges`` it uses) — a barrier per step."""
    if not speeds:
        raise ValueError("sync_step_seconds: no speeds")
    return max(speeds) * compute_s + max((delays[i][j] for i, j in edges), default=0.0)


def sync_clock(n: int, spread: float, topology: str) -> float:
    """A synchronous row's step in seconds at (n, spread): the preset's speeds and delays."""
    section = AsyncConfig(compute_s=spec.COMPUTE_S)  # the preset sets no delay
    return sync_step_seconds(
        spec.speeds(n, spread), section.compute_s, section.delay_matrix(n), links(topology, n)
    )


_TOPOLOGY = {"allreduce": "complete", "dsgd": "ring"}


def _column(key: str) -> tuple[int, float, str]:
    for n in spec.SIZES:
        for spread in spec.SPREADS:
            for data, _, _ in spec.DATA:
                if spec.column_key(n, spread, data) == key:
                    return n, float(spread), data
    raise ValueError(f"column {key!r} is not one of the async preset's")


def run_curves(row: str, column: str, seed: int, name: str, run_dir: Path) -> list[dict[str, Any]]:
    """The ``curves.csv`` rows of one run (every evaluation; a synchronous run once per
    spread)."""
    records = read_metrics(run_dir)
    steps = {r.step: r for r in records if isinstance(r, StepRecord)}
    evals = [r for r in records if isinstance(r, EvalRecord)]
    n, spread, data = _column(column)
    asynchronous = row in spec.ASYNC_ROWS
    spreads = [spread] if asynchronous else [float(s) for s in spec.SPREADS]
    out = []
    for s in spreads:
        local, stale, count = 0, 0.0, 0
        ordered = sorted(steps)
        it = iter(ordered)
        seen = -1
        for ev in evals:
            while seen < ev.step:
                seen = next(it)
                rec = steps[seen]
                local += rec.local_steps if rec.local_steps is not None else n
                if rec.staleness_mean is not None:
                    stale, count = stale + rec.staleness_mean, count + 1
            epoch = float(ev.epoch or 0.0)
            if asynchronous:
                vt = float(steps[ev.step].virtual_time or 0.0)
                epoch *= local / (n * (ev.step + 1))  # samples done / samples of a sync run
            else:
                vt = (ev.step + 1) * sync_clock(n, s, _TOPOLOGY[row])
            out.append({"run": name, "row": row, "n": n, "spread": s, "data": data,
                        "seed": seed, "step": ev.step, "epochs": epoch, "virtual_time": vt,
                        "accuracy_avg_model": ev.accuracy_avg_model,
                        "accuracy_worst_peer": ev.accuracy_worst_peer,
                        "staleness_mean": stale / count if count else None})  # fmt: skip
    return out


def _num(value: object) -> float | None:
    if value in (None, ""):
        return None
    x = float(str(value))
    return x if math.isfinite(x) else None


def read_curves(path: Path) -> list[dict[str, Any]]:
    """``curves.csv`` with its numbers as floats / ints (empty: None)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out = []
    for r in rows:
        item: dict[str, Any] = {"run": r["run"], "row": r["row"], "data": r["data"]}
        for key in ("n", "seed", "step"):
            item[key] = int(r[key])
        for key in ("spread", "epochs", "virtual_time", "accuracy_avg_model",
                    "accuracy_worst_peer", "staleness_mean"):  # fmt: skip
            item[key] = _num(r[key])
        out.append(item)
    return out


def write_curves(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CURVES)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _cell(r[k]) for k in CURVES})


def _cell(value: object) -> object:
    """A CSV cell: floats to 7 significant digits (accuracies are float32 fractions of a
    4 000-sample test set; epochs and seconds need no more), None empty."""
    if value is None:
        return ""
    return f"{value:.7g}" if isinstance(value, float) else value


# ---------------------------------------------------------------------------------------------
# Cells: (row, n, spread, data) over seeds


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """ys at x, linear between evaluations; None outside the measured range."""
    if not xs or x < xs[0] - 1e-9 or x > xs[-1] + 1e-9:
        return None
    return float(np.interp(x, xs, ys))


Cell = tuple[str, int, float, str]
"""(row, n, spread, data)"""


def _runs(curves: Sequence[Mapping[str, Any]]) -> dict[Cell, list[list[Mapping[str, Any]]]]:
    """The curves of each cell, one list of evaluations (by step) per run."""
    by_run: dict[tuple[str, float], list[Mapping[str, Any]]] = {}
    for r in curves:
        by_run.setdefault((r["run"], r["spread"]), []).append(r)
    cells: dict[Cell, list[list[Mapping[str, Any]]]] = {}
    for points in by_run.values():
        points = sorted(points, key=lambda p: p["step"])
        p = points[0]
        cells.setdefault((p["row"], p["n"], p["spread"], p["data"]), []).append(points)
    return cells


def summarize(curves: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One dict per (row, n, spread, data): `CellStats` over seeds of the final accuracies
    (``final``, ``worst``), ``horizon`` (virtual seconds), ``epochs``, ``s_per_epoch``,
    ``at_h`` (accuracy at the asynchronous horizon of that (n, spread): the fastest peer's
    steps, where every run of the cell was measured), ``ttt`` (virtual seconds to the target)
    and ``reached`` / ``runs``, ``staleness``, and ``dsgd_same_epochs`` (asynchronous rows: D-SGD's
    accuracy at the asynchronous row's epochs, same seed)."""
    cells = _runs(curves)
    targets: dict[tuple[int, str], float] = {}
    for (row, n, _, data), runs in cells.items():
        if row == "allreduce":
            finals = [float(r[-1]["accuracy_avg_model"]) for r in runs]
            targets[(n, data)] = statistics.fmean(finals) - TARGET_MARGIN
    horizons: dict[tuple[int, float], float] = {}
    for (row, n, spread, _), runs in cells.items():
        if row in spec.ASYNC_ROWS:
            h = min(float(r[-1]["virtual_time"]) for r in runs)
            horizons[(n, spread)] = min(h, horizons.get((n, spread), math.inf))
    out = []
    for (row, n, spread, data), runs in sorted(cells.items(), key=_order):
        k = len(runs)
        target = targets.get((n, data))
        ttt = [_first_at(r, target) for r in runs] if target is not None else []
        horizon = horizons.get((n, spread))
        dsgd = {r[0]["seed"]: r for r in cells.get(("dsgd", n, spread, data), [])}
        same = [
            _interp(float(r[-1]["epochs"]), *_xy(dsgd[r[0]["seed"]], "epochs"))
            if row in spec.ASYNC_ROWS and r[0]["seed"] in dsgd else None
            for r in runs
        ]  # fmt: skip
        out.append({
            "row": row, "n": n, "spread": spread, "data": data, "target": target,
            "final": _stats(k, [r[-1]["accuracy_avg_model"] for r in runs]),
            "worst": _stats(k, [r[-1]["accuracy_worst_peer"] for r in runs]),
            "horizon": _stats(k, [r[-1]["virtual_time"] for r in runs]),
            "epochs": _stats(k, [r[-1]["epochs"] for r in runs]),
            "s_per_epoch": _stats(k, [r[-1]["virtual_time"] / r[-1]["epochs"] for r in runs]),
            "at_h": _stats(k, [_at(horizon, r) for r in runs]),
            "ttt": _stats(k, ttt), "reached": sum(t is not None for t in ttt), "runs": len(runs),
            "staleness": _stats(k, [r[-1]["staleness_mean"] for r in runs]),
            "dsgd_same_epochs": _stats(k, same),
        })  # fmt: skip
    return out


def _at(horizon: float | None, points: Sequence[Mapping[str, Any]]) -> float | None:
    """The accuracy of one run at virtual time ``horizon`` (None: not measured there)."""
    return None if horizon is None else _interp(horizon, *_xy(points, "virtual_time"))


def _stats(runs: int, values: Iterable[float | None]) -> CellStats:
    """The values that were measured, of ``runs`` runs."""
    return CellStats(tuple(v for v in values if v is not None), runs)


def _order(item: tuple[tuple[str, int, float, str], Any]) -> tuple[int, str, float, int]:
    row, n, spread, data = item[0]
    rows = [*spec.SYNC_ROWS, *spec.ASYNC_ROWS]
    return n, data, spread, rows.index(row) if row in rows else len(rows)


def _xy(points: Sequence[Mapping[str, Any]], x: str) -> tuple[list[float], list[float]]:
    xs = [float(p[x]) for p in points]
    # an evaluation at step 0 is not recorded: the curve starts at the first evaluation
    return xs, [float(p["accuracy_avg_model"]) for p in points]


def _first_at(points: Sequence[Mapping[str, Any]], target: float | None) -> float | None:
    for p in points:
        if target is not None and float(p["accuracy_avg_model"]) >= target:
            return float(p["virtual_time"])
    return None


# ---------------------------------------------------------------------------------------------
# The reading, generated from the summary


def _where(labels: Sequence[str]) -> str:
    return f"{len(labels)} ({'; '.join(labels)})" if labels else "0"


def _pp(a: CellStats, b: CellStats) -> str:
    return f"{100 * (a.mean - b.mean):+.2f} pp"


def _close(a: CellStats, b: CellStats, tol: float) -> bool:
    return abs(a.mean - b.mean) <= max(tol, a.std, b.std)


def reading(summary: Sequence[Mapping[str, Any]]) -> list[str]:
    """The reading of the summary (`summarize`), one line per (n, data, spread) and a verdict
    on AD-PSGD's claim: at equal virtual time (the asynchronous horizon) which row is ahead,
    by how much asynchrony wins over its synchronous counterpart; at equal samples what
    staleness costs (AD-PSGD against D-SGD at AD-PSGD's epochs); every comparison against the
    seed spread."""
    cell = {(s["row"], s["n"], s["spread"], s["data"]): s for s in summary}
    groups = sorted({(s["n"], s["data"], s["spread"]) for s in summary})
    lines: list[str] = []
    same_holds, same_total, faster, hetero = 0, 0, 0, 0
    ahead: list[str] = []
    behind: list[str] = []
    for n, data, spread in groups:
        here = {row: cell[(row, n, spread, data)] for row in (*spec.SYNC_ROWS, *spec.ASYNC_ROWS)
                if (row, n, spread, data) in cell}  # fmt: skip
        at_h = {row: s["at_h"] for row, s in here.items() if s["at_h"].values}
        if not at_h:
            continue
        best = max(at_h, key=lambda r: at_h[r].mean)
        label = f"n = {n}, {data}, {spread:g}×"
        parts = [f"at equal virtual time best is {best} ({100 * at_h[best].mean:.2f} %)"]
        ad, ds = here.get("ad-psgd"), here.get("dsgd")
        if ad is not None and ds is not None and ad["at_h"].values and ds["at_h"].values:
            verb = ("ties" if _close(ad["at_h"], ds["at_h"], 0.0)
                    else "wins" if ad["at_h"].mean > ds["at_h"].mean else "loses")  # fmt: skip
            parts.append(f"AD-PSGD {verb} against D-SGD ({_pp(ad['at_h'], ds['at_h'])})")
        if ad is not None and ad["dsgd_same_epochs"].values:
            same = ad["dsgd_same_epochs"]
            same_total += 1
            holds = _close(ad["final"], same, CLAIM_TOL)
            same_holds += holds
            if not holds:
                (ahead if ad["final"].mean > same.mean else behind).append(label)
            parts.append(
                f"at equal samples ({ad['epochs'].mean:.2f} epochs) AD-PSGD "
                f"{_pp(ad['final'], same)} against D-SGD ("
                + ("within tolerance" if holds else "staleness costs" if ad["final"].mean
                   < same.mean else "AD-PSGD ahead") + ")"
            )  # fmt: skip
            if spread > 1:
                hetero += 1
                faster += ds is not None and ad["s_per_epoch"].mean < ds["s_per_epoch"].mean
            if ds is not None:
                parts.append(f"virtual s/epoch {ad['s_per_epoch'].mean:.0f} vs "
                             f"{ds['s_per_epoch'].mean:.0f}")  # fmt: skip
        sgp = here.get("async-sgp")
        if sgp is not None and sgp["dsgd_same_epochs"].values:
            parts.append(
                f"async SGP does {sgp['epochs'].mean:.2f} epochs ({sgp['s_per_epoch'].mean:.0f} "
                f"s/epoch), {_pp(sgp['final'], sgp['dsgd_same_epochs'])} against D-SGD at "
                "equal samples"
            )
        if sgp is not None and sgp["staleness"].values and ad is not None:
            st = ad["staleness"].mean if ad["staleness"].values else math.nan
            parts.append(f"mean staleness AD-PSGD {st:.2f}, async SGP "
                         f"{sgp['staleness'].mean:.2f} steps")  # fmt: skip
        lines.append(f"- {label}: " + "; ".join(parts) + ".")
    if same_total:
        lines += [
            "",
            f"AD-PSGD's claim (Lian et al., ICML 2018), per epoch: the same accuracy as D-SGD at "
            f"the same number of samples held in {same_holds} of {same_total} settings (within "
            f"{100 * CLAIM_TOL:g} pp or the seed spread; AD-PSGD ahead beyond it in "
            f"{_where(ahead)}, behind in {_where(behind)}); fewer virtual seconds per epoch in "
            f"{faster} of the {hetero} with unequal speeds (at 1× both take one step per second "
            "by construction).",
        ]
    return lines


# ---------------------------------------------------------------------------------------------
# Tables, plots, report.md


LIMITS = (
    "## Limits of this study",
    "",
    "- No message delay (`async.delays = 0`): AD-PSGD averages atomically, so the staleness "
    "column (of the neighbour information mixed, in steps) is 0 for it; its staleness is in the "
    "gradient (read at the step's start, applied at its end after neighbours averaged into the "
    "model), which the records do not count. Asynchronous SGP's is the age of the shares it "
    "mixes (bounded by τ = 2 by waiting).",
    "- One untuned lr (0.1) for every row, 4 epochs of the fastest peer, the `mlp`: short "
    "runs, far from converged; the orderings are about this budget. Epochs count samples, so "
    "at n = 64 the same 4 epochs are 60 steps of a global batch of 1 024 (248 of 256 at "
    "n = 16), and every row ends lower there.",
    "- An asynchronous run has the synchronous run's number of engine steps: at a spread > 1 "
    "it ends earlier in virtual time and with fewer samples. The equal-time comparison is at "
    "its horizon; the synchronous rows' time to target is beyond it.",
    "- AD-PSGD and D-SGD differ at 1× too: AD-PSGD averages pairwise with one ring neighbour per "
    "step (alternating), D-SGD with both (weights ⅓); equal speeds make AD-PSGD D-SGD on those "
    "matchings, not on the ring (docs/algorithms.md#asynchronous-simulation).",
)


def _fmt(s: CellStats, scale: float = 100.0, digits: int = 2) -> str:
    return s.format(scale=scale, digits=digits) or "—"


def _table(summary: Sequence[Mapping[str, Any]], n: int) -> str:
    header = ["data", "spread", "row", "final acc (avg)", "final acc (worst)", "horizon (s)",
              "epochs", "s / epoch", "acc at async horizon", "time to target (s)",
              "staleness"]  # fmt: skip
    body = []
    for s in summary:
        if s["n"] != n:
            continue
        ttt = _fmt(s["ttt"], 1.0, 0)  # "(k/5)": only k runs reached the target
        body.append([s["data"], f"{s['spread']:g}×", s["row"], _fmt(s["final"]), _fmt(s["worst"]),
                     _fmt(s["horizon"], 1.0, 0), _fmt(s["epochs"], 1.0, 2),
                     _fmt(s["s_per_epoch"], 1.0, 0), _fmt(s["at_h"]), ttt,
                     _fmt(s["staleness"], 1.0, 2)])  # fmt: skip
    return markdown_grid(header, body)


_COLORS = {"allreduce": "black", "dsgd": "tab:blue", "ad-psgd": "tab:red", "async-sgp": "tab:green"}


def plot_curves(curves: Sequence[Mapping[str, Any]], n: int, x: str, path: Path) -> Path | None:
    """Averaged-model accuracy against ``x`` (virtual_time | epochs), a panel per (data, spread),
    a line per row, mean over seeds (the runs of a cell share their evaluation steps)."""
    cells = {k: v for k, v in _runs(curves).items() if k[1] == n}
    if not cells:
        return None
    datas = [d for d, _, _ in spec.DATA if any(k[3] == d for k in cells)]
    fig = Figure(figsize=(4.2 * len(spec.SPREADS), 3.4 * len(datas)), dpi=110,
                 layout="constrained")  # fmt: skip
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(datas), len(spec.SPREADS), squeeze=False)
    for i, data in enumerate(datas):
        for j, spread in enumerate(spec.SPREADS):
            ax = axes[i][j]
            for row in (*spec.SYNC_ROWS, *spec.ASYNC_ROWS):
                runs = cells.get((row, n, float(spread), data))
                if not runs:
                    continue
                k = min(len(r) for r in runs)
                xs = [statistics.fmean(float(r[t][x]) for r in runs) for t in range(k)]
                ys = [100 * statistics.fmean(float(r[t]["accuracy_avg_model"]) for r in runs)
                      for t in range(k)]  # fmt: skip
                ax.plot(xs, ys, color=_COLORS.get(row), label=row, lw=1.4)
            if x == "virtual_time":
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"n = {n}, {data}, spread {spread}×", fontsize=9)
            ax.set_xlabel("virtual seconds" if x == "virtual_time" else "epochs (samples)")
            ax.set_ylabel("test accuracy, averaged model (%)")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=8)
    fig.savefig(path)
    return path


def _reused(meta: Mapping[str, Any]) -> list[str]:
    """A sentence on the runs this sweep took over from an earlier one in its directory."""
    reused = meta.get("reused_runs") or []
    n = len(reused) if isinstance(reused, list) else int(reused)
    if not n:
        return []
    return [
        f"This sweep ran with `--resume`: {n} of its runs were taken over from an earlier sweep "
        f"in the same directory and were not re-run (the others ran at commit "
        f"`{str(meta.get('git_commit', '?'))[:7]}`). The command above, in a fresh directory, "
        "re-runs them all on the checked-out code.",
        "",
    ]


def _not_run(out: Path, meta: Mapping[str, Any], table: Sequence[Mapping[str, Any]]) -> list[str]:
    seeds = tuple(int(s) for s in meta["seeds"])
    full = PresetGrid(spec.ASYNC, seeds).runs()
    ok = {r["name"] for r in table if r.get("status") == "ok"}
    missing = [r for r in full if r.name not in ok]
    if not missing:
        return []
    columns = sorted({r.name.split("_")[1] for r in missing})
    resume = command_line(spec.NAME, seeds, 1, out, meta.get("overrides", []), False)
    return [
        "## Not run",
        "",
        f"{len(missing)} of the {len(full)} runs of the full grid (seeds "
        f"{', '.join(map(str, seeds))}) did not run (or failed), in the columns "
        f"{', '.join(f'`{c}`' for c in columns)}. Complete them, reusing every finished run of "
        "the output directory (the run directories under `runs/` of the directory the sweep "
        "wrote, not committed here; on a fresh checkout this command runs the whole grid):",
        "",
        "```bash",
        resume + " --resume",
        "```",
        "",
    ]


def write_async_report(out: Path, *, console: Any = None) -> Path:
    """Write ``curves.csv`` (from the run directories, if there), ``report.md`` and the PNGs of
    the async sweep in ``out``; returns the report's path."""
    meta = json.loads((out / "preset.json").read_text(encoding="utf-8"))
    with open(out / "table.csv", newline="", encoding="utf-8") as f:
        table = list(csv.DictReader(f))
    keys = {r["name"]: (r["row_key"], r["column_key"], int(r["seed"])) for r in meta["runs"]}
    curves: list[dict[str, Any]] = []
    fresh = [r for r in table if r.get("status") == "ok" and r["name"] in keys
             and (out / "runs" / r["name"] / "metrics.jsonl").is_file()]  # fmt: skip
    if fresh:
        for r in fresh:
            row, column, seed = keys[r["name"]]
            curves += run_curves(row, column, seed, r["name"], out / "runs" / r["name"])
        write_curves(out / "curves.csv", curves)
    else:
        curves = read_curves(out / "curves.csv")
    summary = summarize(curves)
    ok = [r for r in table if r.get("status") == "ok"]
    walls = [w for r in ok if (w := _num(r.get("wall_seconds"))) is not None]
    lines = [
        f"# {spec.ASYNC.title}",
        "",
        spec.ASYNC.setup,
        "",
        f"Seeds: {', '.join(map(str, meta['seeds']))}. Runs: {len(table)} ({len(ok)} ok). "
        f"Generated {time.strftime('%Y-%m-%d')} from `table.csv` and `curves.csv`; sweep wall "
        f"time {format_duration(float(meta['wall_seconds']))} on {meta.get('cores')} core(s), "
        f"mean per run {format_duration(statistics.fmean(walls)) if walls else '—'}.",
        "",
        "Regenerate (then copy `report.md`, `table.csv`, `curves.csv`, `preset.json`, "
        "`time-*.png` and `epochs-*.png`; `--report-only --out DIR` rewrites the report of a "
        "copied directory from its CSVs):",
        "",
        "```bash",
        str(meta["command"]),
        "```",
        "",
        *_reused(meta),
        *_not_run(out, meta, table),
        "## How time and samples are counted",
        "",
        "- An asynchronous run's clock is its step records' `virtual_time` (one engine step = "
        "the fastest peer's local step, 1 s); its samples are the local steps its peers "
        "completed × the batch. A synchronous step waits for the slowest peer: spread × 1 s "
        "plus the longest message delay of the step (0 here). All-reduce and D-SGD run once "
        "(the 1× columns; their trajectory does not depend on the speeds) and are put on the "
        "clock of each spread.",
        f"- **acc at async horizon**: the averaged model's accuracy at the virtual time the "
        "asynchronous runs end (the fastest peer's 4 epochs of steps), linear between "
        "evaluations — the equal-time comparison. **time to target**: virtual seconds to the "
        f"first evaluation at or above all-reduce's final accuracy − {100 * TARGET_MARGIN:g} pp "
        "(same n and data; (k/5): only k seeds reached it within their run). **staleness**: "
        "mean over the run of the step records' `staleness_mean` (steps).",
        "",
    ]
    for n in sorted({s["n"] for s in summary}):
        lines += [f"## n = {n} (accuracy %, mean ± std over seeds)", "", _table(summary, n)]
    lines += ["## Reading (generated from the table)", "", *reading(summary), "", *LIMITS, ""]
    lines += ["## Plots", ""]
    for n in sorted({s["n"] for s in summary}):
        for x, stem in (("virtual_time", "time"), ("epochs", "epochs")):
            if plot_curves(curves, n, x, out / f"{stem}-n{n}.png") is not None:
                lines += [f"![accuracy vs {x}, n = {n}]({stem}-n{n}.png)", ""]
    first = next((r["name"] for r in ok), None)
    lines.append(reproducibility_section(meta, directory=out, run=first))
    path = out / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    if console is not None:
        console.print(f"async report: {path}")
    return path


def study(run_preset: Callable[[Preset, PresetRequest], Path]) -> Study:
    """The ``async`` entry of ``concord sweep --preset``: ``run_preset``
    (`concord.lab.presets.run.run_preset`: the sweep, ``table.csv``, ``preset.json``,
    ``--resume``, ``--report-only``) on the preset, then this module's report in place of the
    generic one. ``run_preset`` is passed in, since the runner's module lists this study."""

    def main(request: PresetRequest) -> Path:
        out = run_preset(spec.ASYNC, request)
        generic = ["metric.png", "bytes.png", *(f"curves-{c.key}.png" for c in spec.COLUMNS)]
        for name in generic:  # the generic report's plots, of a report replaced below
            (out / name).unlink(missing_ok=True)
        write_async_report(out, console=request.console)
        return out

    return Study(spec.NAME, spec.ASYNC.title, main)
