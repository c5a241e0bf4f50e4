"""Re-running a report's cell and comparing it with the committed values (`concord.lab.verify`).

The run goes through the sweep machinery (`concord.lab.sweep.run_sweep`: a spawned worker, the
engine's run without plots; a constant-target cell computes its calibration pass first), and a
table compares every metric of the manifest: accuracies within ``tol`` pp, gossip rounds and
bytes exact, or within ``count_tol`` (relative) under consensus control (or ``ada-feedback``).
The recorded machine is compared with this one (`environment`): a mismatch is reported as the
likely reason of a difference, not as an error.
"""

from __future__ import annotations

import json
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


def with_corpus(here: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """``here`` (`environment`) with the ``data.*`` host facts of the re-run in ``run_dir`` (its
    ``manifest.json``: the corpus its worker read, e.g. ``data.pystdlib-chars.corpus_sha256``),
    which this process, which loaded no dataset, does not have."""
    out = dict(here)
    try:
        recorded = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return out
    facts = recorded.get("host") if isinstance(recorded, dict) else None
    if isinstance(facts, dict) and isinstance(out.get("host"), dict):
        data = {k: v for k, v in facts.items() if str(k).startswith("data.")}
        out["host"] = {**out["host"], **data}
    return out


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
    conclusion (`cause_of`): "reproduces", "host" (the host explains the difference), "code"
    (the code does), "regression" (neither differs), "undecided" (two explanations remain),
    "unknown" (the report does not record its host, and the code is not known to differ),
    "failed"."""

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


def cause_of(host: HostState, code: CodeState) -> str:
    """The cause of a difference from the host's and the code's states (rows: the host):

    ============  =========  ==========  =========
    host, code    differs    same        unknown
    ============  =========  ==========  =========
    differs       undecided  host        host
    same          code       regression  undecided
    not recorded  undecided  unknown     unknown
    ============  =========  ==========  =========

    "corpus" before all: the dataset's corpus (``data.*`` host facts, e.g. the standard library
    of ``pystdlib-chars``) differs from the recorded one — the cell trained on other data.
    "undecided": the host or the code (``--at-commit`` can decide when the code differs), or on
    the same host the code or a regression (the code unknown); "unknown": the host is not
    recorded and the code not known to differ."""
    if host.corpus:
        return "corpus"
    if host.state == "differs":
        return "undecided" if code.state == "differs" else "host"
    if host.state == "same":
        return {"differs": "code", "same": "regression"}.get(code.state, "undecided")
    return "undecided" if code.state == "differs" else "unknown"


def _verdict_lines(name: str, failed: Sequence[str], host: HostState, code: CodeState) -> str:
    """The verdict of a cell that differs, from what differs: the host, the code, both or
    neither (`cause_of`)."""
    text = f"verdict: {name} DIFFERS in {', '.join(failed)}"
    cause = cause_of(host, code)
    if cause == "corpus":
        return (
            f"{text}: {host.describe()}; {code.describe()}. The dataset was read from this "
            "host's files and they are not the recorded ones (another Python's standard "
            "library): the cell trained on other data, so its numbers need not match — run it "
            "with the recorded Python (the report's preset.json names the corpus hashes)."
        )
    if cause == "host":
        same = "the same code as the report" if code.state == "same" else "code not compared"
        return (
            f"{text}: {host.describe()}; {same} ({code.describe()}). Float results are "
            "machine-dependent (BLAS summation order, CPU kernels, amplified by training): the "
            "host is the likely reason — not a regression, not by itself an error in the report."
        )
    if cause == "undecided" and host.state == "differs":
        return (
            f"{text}: {host.describe()}; and {code.describe()}. Both differ: the host alone can "
            "explain it; --at-commit re-runs the cell with the report's code on this host to "
            "decide."
        )
    if cause == "undecided" and host.state == "same":
        return (
            f"{text}, on the recorded torch, CPU and thread count: not explained by the machine "
            f"({host.describe()}); {code.describe()}: undecided — a change of the code or a "
            "regression."
        )
    if cause == "code":
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
    if cause == "undecided":
        return (
            f"{text}. The report records no host facts (the same host is not established), "
            f"and {code.describe()}: undecided — the host or the code; --at-commit re-runs the "
            "cell with the report's code on this host to decide."
        )
    return (
        f"{text}. The report records no host facts: if it came from another host (CPU flags, "
        "BLAS or torch build), that is the likely reason (float results are "
        f"machine-dependent); {code.describe()}."
    )


def _within(value: float | None, other: float | None, check: Check) -> bool:
    """``value`` within ``check``'s own tolerance of ``other`` (the table's: pp for accuracies,
    relative to ``other`` for counts)."""
    if value is None or other is None:
        return False
    if check.metric.accuracy:
        return 100 * abs(value - other) <= check.tolerance + 1e-9
    return abs(value - other) <= check.tolerance * abs(other) + 1e-9


def decide_at_commit(
    checks: Sequence[Check], values: Sequence[float | None]
) -> tuple[str | None, str]:
    """What the report's commit re-run here (``values``, one per check) says: "host" when it
    gives this re-run's values, "code" when it gives the committed ones, None (undecided) when
    neither or both; with the reason. An exact (bitwise) match decides first: the same code on
    the same host gives the same bits; else each value is compared, against both, within its
    check's tolerance (the table's: `compare`)."""
    pairs = list(zip(checks, values, strict=True))
    if pairs and all(v is not None and v == c.rerun for c, v in pairs):
        return "host", "bitwise this re-run's values"
    if pairs and all(v is not None and v == c.committed for c, v in pairs):
        return "code", "exactly the committed values"
    here = bool(pairs) and all(_within(v, c.rerun, c) for c, v in pairs)
    committed = bool(pairs) and all(_within(v, c.committed, c) for c, v in pairs)
    if here and committed:
        return None, "within tolerance of both this re-run's and the committed values"
    if here:
        return "host", "this re-run's values within tolerance"
    if committed:
        return "code", "the committed values within tolerance"
    return None, "neither the committed values nor this re-run's"


def _at_commit(
    target: Target,
    checks: Sequence[Check],
    code: CodeState,
    out_dir: Path,
    peers: int,
    echo: Callable[[str], None],
    code_root: Path | None,
) -> tuple[str | None, str]:
    """Re-run the cell with the report's commit (`rerun_at_commit`) and decide
    (`decide_at_commit`): "host", "code" or None (undecided), with the reason — also when the
    re-run could not be made (no git checkout, the commit cannot be checked out, a stale
    output directory) or failed."""
    commit = str(code.recorded)
    echo(f"--at-commit: re-running {target.run.name} with the report's code ({commit[:10]}) in a "
         "temporary git worktree …")  # fmt: skip
    try:
        summary, output = rerun_at_commit(target, commit, out_dir / "at-commit",
                                          code_root=code_root)  # fmt: skip
    except (VerifyError, OSError) as exc:
        echo(f"--at-commit: not run: {exc}")
        return None, f"the re-run at {commit[:10]} could not be made: {exc}"
    if summary is None:
        echo(f"--at-commit: the re-run at {commit[:10]} failed:")
        for line in output.splitlines()[-15:]:
            echo(f"  {line}")
        return None, f"the re-run at {commit[:10]} failed"
    values = [c.metric.read(summary, peers) for c in checks]
    body = [
        [c.metric.label, _fmt_value(c.metric, c.committed), _fmt_value(c.metric, c.rerun),
         _fmt_value(c.metric, v)]
        for c, v in zip(checks, values, strict=True)
    ]  # fmt: skip
    for line in _table(["metric", "committed", "re-run here", f"at {commit[:10]}"], body):
        echo(line)
    echo("(compared exactly first, else within each metric's tolerance of the table above)")
    decided, why = decide_at_commit(checks, values)
    return decided, f"the report's commit gives {why}"


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
    here = with_corpus(environment(threads=cfg.threads, jobs=1, engine=cfg.engine),
                       out_dir / "runs" / name)  # fmt: skip
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
    cause = cause_of(host, code)
    echo(_verdict_lines(name, failed, host, code))
    if at_commit and code.state == "differs":
        decided, why = _at_commit(target, checks, code, out_dir, peers, echo, code_root)
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
            cause = "undecided"
            echo(f"verdict after --at-commit: undecided ({why}).")
    elif at_commit and code.state == "unknown":
        echo(f"(--at-commit: not run, {code.describe()})")
    elif at_commit:
        echo(f"(--at-commit: not needed, {code.describe()})")
    echo(f"(the re-run: {out_dir / 'runs' / name})")
    return result(cause)
