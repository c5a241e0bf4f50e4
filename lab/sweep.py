"""``concord sweep``: a grid of runs shaped like Table 2 of Kong et al. 2021 (consensus control).

Grid = phase plans × control factors × topologies × seeds, plus optional baseline rows
(``allreduce``: exact averaging throughout; ``gossip``: uncontrolled gossip in every phase).
Each grid point becomes one named run with config overrides:

- factor ``None`` ("none") → ``control.mode = "none"`` (uncontrolled gossip in the plan's phase);
- factor c > 0 → ``control.mode = "constant"``, ``control.factor = c`` (target c·Ξ_max, Ξ_max from
  an uncontrolled calibration pass; factors 1, 0.5, 0.25 are the paper's columns Ξ_max, ½Ξ_max,
  ¼Ξ_max) — or ``"adaptive"`` (target c·EMA of the mean local gradient norm) with
  ``control_mode="adaptive"``.

Execution: runs go to a ``ProcessPoolExecutor`` with the **spawn** start method (torch hangs after
fork), ``jobs`` workers, each limited to ``max(1, cores // jobs)`` torch threads. All runs share one
calibration cache (``out_dir/calibration``). A constant-mode run computes the calibration of its
(plan, topology, seed) group when the cache lacks it, so to avoid two workers computing the same
calibration at once, only the first constant-mode run of each group is submitted at the start
(with every run that needs no calibration); the group's other constant-mode runs are submitted as
soon as that first run has finished (successfully or not) — a dependency-driven form of "wave 1
creates the calibrations, wave 2 reuses them".

Failure is data: a run that raises, or whose config does not validate, is recorded with status
"error" and the sweep goes on. If a worker process dies (e.g. killed by the OOM killer) the pool
breaks; the runs that were in flight are then re-run one at a time, each in a fresh process, so
only the culprit fails. ``table.csv`` is rewritten after every finished run (unfinished runs show
status "pending"), ``table.md`` and the printed Table 2 at the end. ``concord sweep`` then exits 1
if any run failed (:func:`read_failures`; every run or some: the tables are written either way,
and a sweep with holes in its table is not a result to build on without looking), naming how many
and the first errors.

Output layout: ``out_dir/runs/<name>/`` (one run directory each), ``out_dir/calibration/``,
``out_dir/sweep.json`` (the grid), ``out_dir/table.csv``, ``out_dir/table.md``.

:func:`run_sweep` executes any :class:`Grid`: besides :class:`Sweep`, the presets of
`concord.lab.presets` (rows = algorithm setups × columns = data settings × seeds, with their own
report).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import multiprocessing
import os
import re
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, Protocol

from rich.console import Console

from concord.core.records import JSON, RunSummary
from concord.lab.report import grid_layout, markdown_grid, rich_grid

METRICS: Mapping[str, tuple[str, str]] = {
    "avg": ("accuracy_avg_model", "averaged model"),
    "mean": ("accuracy_mean_peer", "mean peer"),
    "worst": ("accuracy_worst_peer", "worst peer"),
}
"""``--metric`` choices → (summary key, description)."""

CONTROL_MODES = ("constant", "adaptive")


@dataclass(frozen=True)
class Baseline:
    """A reference row: its label in the tables, its overrides, whether it depends on topology."""

    label: str
    overrides: Mapping[str, object]
    per_topology: bool


BASELINES: Mapping[str, Baseline] = {
    "allreduce": Baseline("all-reduce", {"algorithm": "allreduce", "control.mode": "none"}, False),
    "gossip": Baseline("gossip (uncontrolled)", {"plan": "gossip", "control.mode": "none"}, True),
}
"""``--baseline`` names → definition (the "gossip" plan = plain gossip in every phase)."""

# fmt: off
CSV_COLUMNS = (
    "name", "kind", "row", "plan", "topology", "factor", "control_mode", "seed", "status",
    "accuracy_avg_model", "accuracy_worst_peer", "accuracy_mean_peer", "gossip_rounds_total",
    "bytes_sent_total", "final_consensus_distance", "wall_seconds", "error", "run_dir",
    "column", "lr",
)
# fmt: on
"""Columns of table.csv (one row per run; factor "none" = uncontrolled, empty = not measured;
``column``: the setting of a preset grid's column, ``lr``: the run's ``optim.lr`` override)."""


class RunFn(Protocol):
    """The engine's ``run`` (``concord.sim.engine.run``); must be a module-level function
    (pickled)."""

    def __call__(
        self, cfg: Any, out_dir: Path, *, progress: bool = ..., calibration_cache: Path | None = ...
    ) -> Mapping[str, JSON]: ...


@dataclass(frozen=True)
class SweepRun:
    """One grid point. ``overrides`` are dotted config keys (see
    ``concord.core.config.apply_overrides``).

    ``calibration_group`` is (plan, topology, seed) for constant-mode runs, else None.
    ``column`` labels the column of a preset grid (`concord.lab.presets`: rows = algorithm setups,
    columns = data settings); None in a plans × factors grid.
    """

    name: str
    kind: str  # "plan" | "baseline"
    row: str  # Table-2 row label: the plan name or the baseline's label
    plan: str | None
    topology: str | None  # None: topology-free baseline (all-reduce)
    factor: float | None  # None: uncontrolled
    control_mode: str  # "none" | "constant" | "adaptive"
    seed: int
    overrides: Mapping[str, object] = field(hash=False)
    calibration_group: tuple[str, str, int] | None = None
    column: str | None = None


class Grid(Protocol):
    """What :func:`run_sweep` executes: a :class:`Sweep`, or a preset's rows × columns × seeds
    (`concord.lab.presets.PresetGrid`)."""

    def runs(self) -> list[SweepRun]: ...

    def schedule(self) -> tuple[list[SweepRun], dict[tuple[str, str, int], list[SweepRun]]]: ...


def parse_factor(value: str | float | None) -> float | None:
    """ "none"/"uncontrolled"/None → None; "1", "0.5", "1/4" or a number → a finite float > 0."""
    if value is None or (
        isinstance(value, str) and value.strip().lower() in ("none", "uncontrolled")
    ):
        return None
    try:
        factor = float(Fraction(value.strip())) if isinstance(value, str) else float(value)
    except (ValueError, ZeroDivisionError):
        factor = math.nan
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(
            f"factor {value!r} is not valid; use a number > 0 (e.g. 1, 0.5, 1/4) or 'none'"
        )
    return factor


def _split(items: Sequence[Any]) -> list[Any]:
    """Flatten comma-separated strings ("a,b" → "a", "b"), so lists and CLI strings both work."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, str):
            out.extend(part.strip() for part in item.split(",") if part.strip())
        else:
            out.append(item)
    return out


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "x"


@dataclass(frozen=True)
class Sweep:
    """The grid. Hyperparameters: ``plans`` (plan names, may be empty if there are baselines),
    ``factors`` (each None or > 0, distinct), ``topologies`` (≥ 1), ``seeds`` (≥ 1 distinct ints),
    ``baselines`` (names in :data:`BASELINES`), ``control_mode`` ("constant" | "adaptive")."""

    plans: tuple[str, ...]
    factors: tuple[float | None, ...]
    topologies: tuple[str, ...]
    seeds: tuple[int, ...]
    baselines: tuple[str, ...] = ()
    control_mode: str = "constant"

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.plans and not self.baselines:
            problems.append("plans is empty and there are no baselines: nothing to run")
        if self.plans and not self.factors:
            problems.append("factors is empty; give e.g. 1,0.5,0.25 or none")
        for name, items in (
            ("plans", self.plans),
            ("factors", self.factors),
            ("seeds", self.seeds),
        ):
            if len(set(items)) != len(items):
                problems.append(f"{name} has duplicates: {list(items)!r}")
        if not self.topologies:
            problems.append("topologies is empty; give at least one, e.g. ring")
        if not self.seeds:
            problems.append("seeds is empty; give at least one, e.g. 0")
        if any(isinstance(s, bool) or not isinstance(s, int) for s in self.seeds):
            problems.append(f"seeds must be integers, got {list(self.seeds)!r}")
        if unknown := [b for b in self.baselines if b not in BASELINES]:
            problems.append(f"baselines {unknown!r} unknown; valid: {', '.join(BASELINES)}")
        if self.control_mode not in CONTROL_MODES:
            problems.append(
                f"control_mode {self.control_mode!r} invalid; valid: constant, adaptive"
            )
        if problems:
            raise ValueError("invalid sweep: " + "; ".join(problems))

    def runs(self) -> list[SweepRun]:
        """Every run, plan rows first (topology, plan, factor, seed order), then baselines.

        A controlled run of plan "dec-phase-K" also gets ``control.phases = [K]`` (the phase it
        gossips in; the other phases are exact and cannot be controlled).
        """
        runs: list[SweepRun] = []
        for topology, plan, factor, seed in itertools.product(
            self.topologies, self.plans, self.factors, self.seeds
        ):
            mode = "none" if factor is None else self.control_mode
            over: dict[str, object] = {"plan": plan, "topology": topology, "seed": seed}
            over["control.mode"] = mode
            if factor is not None:
                over["control.factor"] = factor
                k = plan.removeprefix("dec-phase-")
                if k != plan and k.isdigit():
                    over["control.phases"] = [int(k)]
            tag = "none" if factor is None else f"{mode[0]}{factor:g}"
            name = "_".join(slug(p) for p in (plan, tag, topology, f"s{seed}"))
            group = (plan, topology, seed) if mode == "constant" else None
            runs.append(
                SweepRun(name, "plan", plan, plan, topology, factor, mode, seed, over, group)
            )
        for key in self.baselines:
            base = BASELINES[key]
            topologies: Sequence[str | None] = self.topologies if base.per_topology else [None]
            for topo, seed in itertools.product(topologies, self.seeds):
                over = {**base.overrides, "seed": seed}
                if topo is not None:
                    over["topology"] = topo
                parts = [key, f"s{seed}"] if topo is None else [key, topo, f"s{seed}"]
                name = "_".join(slug(p) for p in parts)
                mode = str(base.overrides.get("control.mode", "none"))
                runs.append(
                    SweepRun(name, "baseline", base.label, None, topo, None, mode, seed, over)
                )
        return runs

    def schedule(self) -> tuple[list[SweepRun], dict[tuple[str, str, int], list[SweepRun]]]:
        return hold_for_calibration(self.runs())


def hold_for_calibration(
    runs: Sequence[SweepRun],
) -> tuple[list[SweepRun], dict[tuple[str, str, int], list[SweepRun]]]:
    """(runs to start at once, runs held back until their calibration group's first run ends:
    then they find its calibration pass cached). The first list puts the calibrating runs
    first: they are the longest (calibration + run)."""
    first: list[SweepRun] = []
    rest: list[SweepRun] = []
    held: dict[tuple[str, str, int], list[SweepRun]] = {}
    for run in runs:
        group = run.calibration_group
        if group is None:
            rest.append(run)
        elif group in held:
            held[group].append(run)
        else:
            held[group] = []
            first.append(run)
    return first + rest, held


# ---------------------------------------------------------------------------------------------
# Worker side (runs in spawned processes; everything here must be importable and picklable).

_threads = 1


def _worker_init(threads: int) -> None:
    """Limit intra-op threads: env vars for a torch imported later, set_num_threads if loaded."""
    global _threads
    _threads = threads
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)


@dataclass(frozen=True)
class Outcome:
    """How one run of a sweep ended: ``status`` "ok" with the run's ``summary``, or "error"
    with what went wrong (``error``); ``wall``: the seconds the run took (None: not measured,
    e.g. its worker died). Returned by the sweep's worker processes (pickled)."""

    status: Literal["ok", "error"]
    summary: RunSummary | None = None
    error: str = ""
    wall: float | None = None

    @classmethod
    def ok(cls, summary: RunSummary, wall: float | None = None) -> Outcome:
        """A run that ended with ``summary``."""
        return cls(status="ok", summary=summary, wall=wall)

    @classmethod
    def failed(cls, error: str, wall: float | None = None) -> Outcome:
        """A run that failed with ``error`` (one line: the exception's type and message)."""
        return cls(status="error", error=error, wall=wall)


def _execute(run_fn: RunFn, cfg: Any, run_dir: str, calibration_cache: str) -> Outcome:
    """Run one grid point; never raises for a failed run (the outcome says "error"), nor for
    a summary that is not a valid `RunSummary` document."""
    torch = sys.modules.get("torch")  # imported when run_fn's module was unpickled
    if torch is not None:
        torch.set_num_threads(_threads)
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        doc = run_fn(cfg, path, progress=False, calibration_cache=Path(calibration_cache))
        summary = RunSummary.from_json(doc, where=str(path / "summary.json"))
    except Exception as exc:
        (path / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        return Outcome.failed(f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
    return Outcome.ok(summary, time.perf_counter() - start)


def run_without_plots(
    cfg: Any, out_dir: Path, *, progress: bool = False, calibration_cache: Path | None = None
) -> Mapping[str, JSON]:
    """`concord.sim.engine.run` without the per-run PNGs (1–3 s each on a small CPU; the report
    plots every run's curves instead). Module-level, so it pickles into the sweep's workers."""
    from concord.sim.engine import run

    return run(cfg, out_dir, progress=progress, calibration_cache=calibration_cache, plots=False)


def _default_run_fn() -> RunFn:
    from concord.sim.engine import run

    return run


# ---------------------------------------------------------------------------------------------
# Parent side.


def csv_row(run: SweepRun, outcome: Outcome | None, run_dir: Path) -> dict[str, Any]:
    """``run``'s table.csv row: its grid point and ``outcome`` (None: pending)."""
    summary = None if outcome is None else outcome.summary
    row: dict[str, Any] = {
        "name": run.name,
        "kind": run.kind,
        "row": run.row,
        "plan": run.plan if run.plan is not None else run.row,
        "topology": run.topology,
        "factor": run.factor,
        "control_mode": run.control_mode,
        "seed": run.seed,
        "status": outcome.status if outcome else "pending",
        "error": outcome.error[:500].replace("\n", " ") if outcome else "",
        "run_dir": str(run_dir),
        "column": run.column,
        "lr": run.overrides.get("optim.lr"),
    }
    if summary is not None:
        row.update(
            accuracy_avg_model=summary.accuracy_avg_model,
            accuracy_worst_peer=summary.accuracy_worst_peer,
            accuracy_mean_peer=summary.accuracy_mean_peer,
            gossip_rounds_total=summary.gossip_rounds_total,
            bytes_sent_total=summary.bytes_sent_total,
            final_consensus_distance=summary.final_consensus_distance,
            wall_seconds=summary.wall_seconds,
        )
    elif outcome is not None and outcome.wall is not None:
        row["wall_seconds"] = outcome.wall
    return row


def write_table(path: Path, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    """``rows`` as a CSV file of ``columns`` (a missing or None cell is empty), replaced
    atomically."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    tmp = path.with_suffix(".csv.tmp")
    tmp.write_text(buffer.getvalue(), encoding="utf-8")
    tmp.replace(path)


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """A sweep's ``table.csv`` (`CSV_COLUMNS`; an unset factor reads "none")."""
    cells = [
        {**row, "factor": "none" if row.get("factor") is None else row["factor"]} for row in rows
    ]
    write_table(path, CSV_COLUMNS, cells)


def _run_isolated(args: tuple[Any, ...], threads: int) -> Outcome:
    """One run in a fresh single-worker pool, so that a dying process only fails this run."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_worker_init, initargs=(threads,)) as p:
        try:
            return p.submit(_execute, *args).result()
        except BrokenProcessPool:
            return Outcome.failed("worker process died (killed or crashed)")


def run_sweep(
    sweep: Grid,
    out_dir: Path,
    configure: Callable[[Mapping[str, object]], Any],
    run_fn: RunFn,
    *,
    jobs: int,
    console: Console | None = None,
) -> list[dict[str, Any]]:
    """Execute the grid; returns one table row per run (see :data:`CSV_COLUMNS`), grid order.

    ``configure(overrides)`` builds a run's config (ValueError → that run fails, not the sweep).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got jobs={jobs}")
    console = console or Console(stderr=True)
    runs = sweep.runs()
    first, held = sweep.schedule()
    jobs = min(jobs, len(runs))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    cache = out_dir / "calibration"
    cache.mkdir(parents=True, exist_ok=True)
    rows = {run.name: csv_row(run, None, out_dir / "runs" / run.name) for run in runs}
    csv_path = out_dir / "table.csv"
    write_csv(csv_path, list(rows.values()))
    ready: deque[SweepRun] = deque(first)
    args: dict[str, tuple[Any, ...]] = {}
    finished = 0

    def finish(run: SweepRun, outcome: Outcome) -> None:
        nonlocal finished
        finished += 1
        row = rows[run.name] = csv_row(run, outcome, out_dir / "runs" / run.name)
        write_csv(csv_path, list(rows.values()))
        if run.calibration_group is not None:
            ready.extend(held.pop(run.calibration_group, []))
        if row["status"] == "ok":
            acc = row["accuracy_avg_model"]
            detail = f"acc {100 * acc:.2f} %" if isinstance(acc, int | float) else "ok"
            console.print(f"[{finished}/{len(runs)}] {run.name}: [green]{detail}[/green]")
        else:
            console.print(f"[{finished}/{len(runs)}] {run.name}: [red]{row['error']}[/red]")

    ctx = multiprocessing.get_context("spawn")
    pool: ProcessPoolExecutor | None = None
    inflight: dict[Future[Outcome], SweepRun] = {}
    try:
        while ready or inflight:
            while ready:
                run = ready.popleft()
                try:
                    cfg = configure(run.overrides)
                except Exception as exc:  # ConfigError and any other: this run fails, not all
                    finish(run, Outcome.failed(f"config: {exc}"))
                    continue
                args[run.name] = (run_fn, cfg, str(out_dir / "runs" / run.name), str(cache))
                if pool is None:
                    pool = ProcessPoolExecutor(
                        jobs, mp_context=ctx, initializer=_worker_init, initargs=(threads,)
                    )
                inflight[pool.submit(_execute, *args[run.name])] = run
            if not inflight:
                continue
            done, _ = wait(inflight, return_when=FIRST_COMPLETED)
            if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                done, _ = wait(inflight)  # the whole pool is gone: collect every in-flight run
            suspects: list[SweepRun] = []
            for fut in done:
                run = inflight.pop(fut)
                err = fut.exception()
                if isinstance(err, BrokenProcessPool):
                    suspects.append(run)
                elif err is not None:  # e.g. the config or run_fn could not be pickled
                    finish(run, Outcome.failed(f"{type(err).__name__}: {err}"))
                else:
                    finish(run, fut.result())
            if suspects and pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
                pool = None
                for run in suspects:
                    finish(run, _run_isolated(args[run.name], threads))
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return [rows[run.name] for run in runs]


@dataclass(frozen=True)
class Failures:
    """The runs of a sweep's ``table.csv`` that did not succeed (status other than "ok")."""

    table: Path
    total: int
    failed: tuple[tuple[str, str], ...]  # (run name, error)

    def message(self) -> str | None:
        """None when every run succeeded; else how many failed, and the first errors."""
        if not self.failed:
            return None
        n = len(self.failed)
        head = f"every run failed ({n})" if n == self.total else f"{n} of {self.total} runs failed"
        shown = "; ".join(
            f"{name}: {error or 'no error recorded'}" for name, error in self.failed[:3]
        )
        more = f"; and {n - 3} more" if n > 3 else ""
        return (
            f"{head} — {shown}{more} (every error: {self.table}; tracebacks: each run's error.txt)"
        )


def read_failures(table: Path) -> Failures:
    """The failed runs listed in ``table`` (the ``table.csv`` that `run_sweep` writes)."""
    with open(table, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    failed = tuple(
        (str(r.get("name", "")), str(r.get("error") or "")) for r in rows if r.get("status") != "ok"
    )
    return Failures(table, len(rows), failed)


def _md_cell(value: object) -> str:
    if value is None:
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def render_tables(
    rows: Sequence[Mapping[str, Any]], sweep: Sweep, metric: str, console: Console
) -> str:
    """Print Table 2 (metric, mean ± std %) and mean gossip rounds per topology; return markdown."""
    key, description = METRICS[metric]
    seeds = len(sweep.seeds)
    parts: list[str] = []
    for topology in sweep.topologies:
        for title, value_key, scale, digits, spread in (
            (f"Test accuracy (%), {description}, mean ± std over {seeds} seed(s) — {topology}",
             key, 100.0, 2, True),
            (f"Gossip rounds (mean over seeds) — {topology}", "gossip_rounds_total", 1.0, 0, False),
        ):  # fmt: skip
            header, body = grid_layout(
                rows, value_key, topology, scale=scale, digits=digits, spread=spread
            )
            console.print(rich_grid(title, header, body))
            parts.append(f"## {title}\n\n{markdown_grid(header, body)}")
    per_run = [[_md_cell(r.get(k)) for k in CSV_COLUMNS[:16]] for r in rows]
    parts.append("## Runs\n\n" + markdown_grid(list(CSV_COLUMNS[:16]), per_run))
    return "\n".join(parts)


def sweep_main(
    config_path: str | Path | None,
    overrides: Sequence[str],
    plans: Sequence[str],
    factors: Sequence[str | float | None],
    topologies: Sequence[str],
    seeds: Sequence[int | str],
    baselines: Sequence[str],
    jobs: int | None,
    out_dir: str | Path | None,
    metric: str = "avg",
    run_fn: RunFn | None = None,
    *,
    control_mode: str = "constant",
    configure: Callable[[Mapping[str, object]], Any] | None = None,
    console: Console | None = None,
) -> Path:
    """Run a sweep and write its tables; returns the output directory.

    List arguments accept comma-separated strings ("dec-phase-1,dec-phase-2"). ``overrides`` are
    "dotted.key=value" strings applied to the base config before the grid's own keys. ``jobs``
    None → number of CPU cores; ``out_dir`` None → runs/sweep-<date-time>. ``configure`` (for
    tests) replaces load_config + apply_overrides; ``run_fn`` defaults to
    ``concord.sim.engine.run``.
    Raises ValueError (ConfigError) for a bad grid or base config before any run starts.
    """
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r} invalid; valid: {', '.join(METRICS)}")
    try:
        seed_list = [int(s) for s in _split(seeds)]
    except ValueError:
        raise ValueError(f"seeds must be integers, got {list(seeds)!r}") from None
    sweep = Sweep(
        plans=tuple(_split(plans)),
        factors=tuple(parse_factor(f) for f in _split(factors)),
        topologies=tuple(_split(topologies)),
        seeds=tuple(seed_list),
        baselines=tuple(_split(baselines)),
        control_mode=control_mode,
    )
    jobs = (os.cpu_count() or 1) if jobs is None else jobs
    if configure is None:
        from concord.core.config import apply_overrides, load_config

        base = load_config(config_path, ["engine=vectorized", *overrides])  # sweeps: in-process

        def configure(extra: Mapping[str, object]) -> Any:
            return apply_overrides(base, extra)

    out = (
        Path(out_dir)
        if out_dir is not None
        else Path("runs") / time.strftime("sweep-%Y%m%d-%H%M%S")
    )
    out.mkdir(parents=True, exist_ok=True)
    grid = {
        "config": None if config_path is None else str(config_path),
        "overrides": list(overrides),
        "plans": list(sweep.plans),
        "factors": ["none" if f is None else f for f in sweep.factors],
        "topologies": list(sweep.topologies),
        "seeds": list(sweep.seeds),
        "baselines": list(sweep.baselines),
        "control_mode": sweep.control_mode,
        "metric": metric,
        "jobs": jobs,
        "runs": [{"name": r.name, "overrides": dict(r.overrides)} for r in sweep.runs()],
    }
    (out / "sweep.json").write_text(json.dumps(grid, indent=2), encoding="utf-8")
    console = console or Console()
    rows = run_sweep(sweep, out, configure, run_fn or _default_run_fn(), jobs=jobs, console=console)
    markdown = render_tables(rows, sweep, metric, console)
    (out / "table.md").write_text(f"# Concord sweep — {out.name}\n\n{markdown}", encoding="utf-8")
    console.print(f"tables: {out / 'table.csv'}, {out / 'table.md'}")
    return out
