"""Re-running a report's cell and comparing it with the committed values (`concord.lab.verify`).

The run goes through the sweep machinery (`concord.lab.sweep.run_sweep`: a spawned worker, the
engine's run without plots; a constant-target cell computes its calibration pass first), and a
table compares every metric of the manifest: accuracies within ``tol`` pp, gossip rounds and
bytes exact, or within ``count_tol`` (relative) under consensus control (or ``ada-feedback``).
The recorded machine is compared with this one (`environment`): a mismatch is reported as the
likely reason of a difference, not as an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from concord.core.records import RunSummary
from concord.lab.presets.report import environment
from concord.lab.presets.spec import RunList
from concord.lab.sweep import RunFn, run_sweep, run_without_plots
from concord.lab.verify.diagnose import (
    CodeState,
    HostState,
    compare_code,
    compare_hosts,
    rerun_at_commit,
    seed_tolerance,
)
from concord.lab.verify.manifest import Metric, Target, VerifyError, number
from concord.runtime.records import read_summary

__all__ = [
    "ACCURACY_TOL_PP",
    "CONTROLLED_COUNT_TOL",
    "SEED_SPREAD_K",
    "Check",
    "Outcome",
    "compare",
    "rerun",
]

ACCURACY_TOL_PP = 0.5
"""Default tolerance of the accuracies, in percentage points."""
SEED_SPREAD_K = 2.0
"""On a host other than the recorded one (or one the report does not record), an accuracy's
tolerance is max(``tol``, `SEED_SPREAD_K` × the standard deviation of the cell's committed seeds):
another host changes the float trajectory about as much as another seed does. On the recorded
host a re-run is bit-identical, so the tolerance stays ``tol``."""
CONTROLLED_COUNT_TOL = 0.10
"""Default relative tolerance of gossip rounds and bytes of a run under consensus control."""


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


def configure(target: Target) -> tuple[Any, Any]:
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
    target: Target,
    summary: RunSummary | None,
    peers: int,
    tol: float,
    count_tol: float,
    *,
    spread: bool = False,
) -> list[Check]:
    """One check per metric the committed CSV row has a value for (``summary`` None: the
    re-run failed, every check fails). ``spread``: an accuracy's tolerance is the cell's
    seed-spread one (`seed_tolerance`, `SEED_SPREAD_K`), at least ``tol``."""
    checks = []
    for metric in target.metrics:
        committed = number(target.cell.record.get(metric.column))
        if committed is None:
            continue
        rerun = None if summary is None else metric.read(summary, peers)
        if metric.accuracy:
            values = target.seeds.get(metric.column, ())
            limit = seed_tolerance(values, tol, SEED_SPREAD_K) if spread else tol
        else:
            limit = count_tol
        if rerun is None:
            ok = False
        elif metric.accuracy:
            ok = 100 * abs(rerun - committed) <= limit + 1e-9
        else:
            ok = abs(rerun - committed) <= count_tol * abs(committed) + 1e-9
        checks.append(Check(metric, committed, rerun, round(limit, 4), ok))
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


def _machine(recorded: Mapping[str, Any], here: Mapping[str, Any]) -> list[str]:
    """The environment table: the recorded torch, CPU, threads, Python and cores against this
    machine's (the host facts that decide: `compare_hosts`)."""
    body = []
    for key, label in (*_MACHINE, *_INFO):
        old = recorded.get(key)
        new = here.get(key)
        verdict = "not recorded" if old is None else "same" if str(old) == str(new) else "differs"
        body.append([label, "—" if old is None else str(old), str(new), verdict])
    return _table(["environment", "recorded", "this machine", ""], body)


def _state(host: HostState) -> str:
    """`Outcome.state` of a host comparison: "same", "differs: <facts>", "not recorded"."""
    return "differs: " + ", ".join(host.facts) if host.state == "differs" else host.state


def check_tolerances(tol: float, count_tol: float | None) -> None:
    if not math.isfinite(tol) or tol < 0:
        raise VerifyError(f"--tol must be a number of percentage points >= 0, got {tol}")
    if count_tol is not None and (not math.isfinite(count_tol) or count_tol < 0):
        raise VerifyError(f"--count-tol must be a fraction >= 0, got {count_tol}")


@dataclass(frozen=True)
class Outcome:
    """A verified cell: the directory as given, its `Target`, the checks (those of a re-run that
    failed have no re-run values; ``error`` says why), the relative tolerance of its rounds and
    bytes, this machine (`environment`), the host's state (`_state`: "same", "differs: <facts>",
    "not recorded"), the host and code comparisons (`compare_hosts`, `compare_code`) and the
    conclusion: "reproduces", "host" (the host explains the difference), "code" (the code
    does), "regression" (neither differs), "undecided" (both differ), "unknown" (the report
    records neither), "failed"."""

    given: str
    target: Target
    checks: tuple[Check, ...]
    count_tol: float
    error: str | None
    here: Mapping[str, Any]
    state: str
    host: HostState
    code: CodeState
    cause: str

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)


def _cause(host: HostState, code: CodeState) -> str:
    if host.state == "differs":
        return "undecided" if code.state == "differs" else "host"
    if host.state == "same":
        return "code" if code.state == "differs" else "regression"
    return "code" if code.state == "differs" else "unknown"


def _verdict_lines(name: str, failed: Sequence[str], host: HostState, code: CodeState) -> str:
    """The verdict of a cell that differs, from what differs: the host, the code, both or
    neither (`_cause`)."""
    text = f"verdict: {name} DIFFERS in {', '.join(failed)}"
    cause = _cause(host, code)
    if cause == "host":
        same = "the same code as the report" if code.state == "same" else "code not compared"
        return (
            f"{text}: {host.describe()}; {same} ({code.describe()}). Float results are "
            "machine-dependent (BLAS summation order, CPU kernels, amplified by training): the "
            "host is the likely reason — not a regression, not by itself an error in the report."
        )
    if cause == "undecided":
        return (
            f"{text}: {host.describe()}; and {code.describe()}. Both differ: the host alone can "
            "explain it; --at-commit re-runs the cell with the report's code on this host to "
            "decide."
        )
    if cause == "code" and host.state == "same":
        return (
            f"{text}, on the recorded torch, CPU and thread count: not explained by the machine "
            f"({host.describe()}); {code.describe()} — the code change is the reason (a "
            "regression, or an intended change)."
        )
    if cause == "regression":
        return (
            f"{text}, on the recorded torch, CPU and thread count: not explained by the machine "
            f"({host.describe()}), and {code.describe()}: a real regression (the data, the "
            "configuration or nondeterminism changed since the report?)."
        )
    if cause == "code":
        return (
            f"{text}. The report records no host facts (the same host is not established), "
            f"and {code.describe()}: the host or the code; --at-commit re-runs the cell with "
            "the report's code on this host to decide."
        )
    return (
        f"{text}. The report records no host facts: if it came from another host (CPU flags, "
        "BLAS or torch build), that is the likely reason (float results are "
        f"machine-dependent); {code.describe()}."
    )


def _close(a: float | None, b: float | None, accuracy: bool, tol: float, count_tol: float) -> bool:
    if a is None or b is None:
        return False
    if accuracy:
        return 100 * abs(a - b) <= tol + 1e-9
    return abs(a - b) <= count_tol * abs(b) + 1e-9


def _at_commit(
    target: Target,
    checks: Sequence[Check],
    code: CodeState,
    out_dir: Path,
    peers: int,
    tol: float,
    count_tol: float,
    echo: Callable[[str], None],
) -> str | None:
    """Re-run the cell with the report's commit (`rerun_at_commit`) and decide: "host" (it gives
    this re-run's values), "code" (it gives the committed values), None (neither, or it failed)."""
    commit = str(code.recorded)
    echo(f"--at-commit: re-running {target.run.name} with the report's code ({commit[:10]}) in a "
         "temporary git worktree …")  # fmt: skip
    summary, output = rerun_at_commit(target, commit, out_dir / "at-commit")
    if summary is None:
        echo(f"--at-commit: the re-run at {commit[:10]} failed:")
        for line in output.splitlines()[-15:]:
            echo(f"  {line}")
        return None
    body, as_here, as_committed = [], True, True
    for c in checks:
        value = c.metric.read(summary, peers)
        here_ok = _close(value, c.rerun, c.metric.accuracy, tol, count_tol)
        committed_ok = _close(value, c.committed, c.metric.accuracy, c.tolerance, count_tol)
        as_here, as_committed = as_here and here_ok, as_committed and committed_ok
        body.append([c.metric.label, _fmt_value(c.metric, c.committed),
                     _fmt_value(c.metric, c.rerun), _fmt_value(c.metric, value)])  # fmt: skip
    for line in _table(["metric", "committed", "re-run here", f"at {commit[:10]}"], body):
        echo(line)
    if as_here:
        return "host"
    return "code" if as_committed else None


def rerun(
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
    at_commit: bool = False,
    code_root: Path | None = None,
) -> Outcome:
    """Re-run ``target`` into ``out_dir``, print the comparison and the verdict. ``kept``: False
    when ``out_dir`` is a temporary directory, removed at the end. ``at_commit``: when the code
    differs from the report's, also re-run the cell with the report's commit (`_at_commit`).
    ``code_root``: the checkout whose code runs here (default: this concord's)."""
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
        RunList([target.run]),
        out_dir,
        lambda o: apply_overrides(base, o),
        run_fn or run_without_plots,
        jobs=1,
        console=console or Console(stderr=True),
    )
    outcome = rows[0]
    summary = read_summary(out_dir / "runs" / name)
    here = environment(threads=cfg.threads, jobs=1, engine=cfg.engine)
    machine = _machine(target.recorded, here)
    host = compare_hosts(target.recorded, here)
    code = compare_code(target, code_root)
    state = _state(host)
    spread = host.state != "same"
    peers = int(cfg.peers)
    echo("")
    if outcome.get("status") != "ok" or summary is None:
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
        checks = compare(target, None, peers, tol, count_tol, spread=spread)
        return Outcome(given, target, tuple(checks), count_tol, error, here, state, host, code,
                       "failed")  # fmt: skip
    checks = compare(target, summary, peers, tol, count_tol, spread=spread)
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
    if spread and any(len(target.seeds.get(c.metric.column, ())) > 1 for c in checks):
        echo(f"(accuracies: max({tol:g} pp, {SEED_SPREAD_K:g} × the std of the cell's "
             f"{len(target.seeds[checks[0].metric.column])} committed seeds), the host not "
             "being the recorded one)")  # fmt: skip
    echo("")
    for line in machine:
        echo(line)
    echo(host.describe())
    echo(code.describe())
    echo("")
    failed = [c.metric.label for c in checks if not c.ok]

    def result(cause: str) -> Outcome:
        return Outcome(given, target, tuple(checks), count_tol, None, here, state, host, code,
                       cause)  # fmt: skip

    if not checks:
        echo(f"verdict: {target.csv_name} records none of the compared metrics for {name}")
        return result("unknown")
    if not failed:
        echo(f"verdict: {name} reproduces: every metric within tolerance")
        if host.state == "differs":
            echo(f"(on another host — {host.describe()}; float results are machine-dependent)")
        return result("reproduces")
    cause = _cause(host, code)
    echo(_verdict_lines(name, failed, host, code))
    if at_commit and code.state == "differs":
        decided = _at_commit(target, checks, code, out_dir, peers, tol, count_tol, echo)
        if decided == "host":
            cause = "host"
            echo(f"verdict after --at-commit: {name} differs because the HOST differs, not the "
                 f"code: the report's commit {str(code.recorded)[:10]} gives this re-run's "
                 f"values here ({host.describe()}).")  # fmt: skip
        elif decided == "code":
            cause = "code"
            echo(f"verdict after --at-commit: {name} differs because the CODE changed: the "
                 f"report's commit {str(code.recorded)[:10]} reproduces the committed values "
                 "on this host (a regression, or an intended change).")  # fmt: skip
        else:
            echo("verdict after --at-commit: undecided (the report's commit gives neither the "
                 "committed values nor this re-run's).")  # fmt: skip
    elif at_commit:
        echo(f"(--at-commit: not needed, {code.describe()})")
    echo(f"(the re-run: {out_dir / 'runs' / name})")
    return result(cause)
