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
from concord.lab.verify.manifest import Metric, Target, VerifyError, number
from concord.runtime.records import read_summary

__all__ = ["ACCURACY_TOL_PP", "CONTROLLED_COUNT_TOL", "Check", "Outcome", "compare", "rerun"]

ACCURACY_TOL_PP = 0.5
"""Default tolerance of the accuracies, in percentage points."""
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
    target: Target, summary: RunSummary | None, peers: int, tol: float, count_tol: float
) -> list[Check]:
    """One check per metric the committed CSV row has a value for (``summary`` None: the
    re-run failed, every check fails)."""
    checks = []
    for metric in target.metrics:
        committed = number(target.cell.record.get(metric.column))
        if committed is None:
            continue
        rerun = None if summary is None else metric.read(summary, peers)
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


def check_tolerances(tol: float, count_tol: float | None) -> None:
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
    machine, state = _machine(target.recorded, here)
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
        checks = compare(target, None, peers, tol, count_tol)
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
