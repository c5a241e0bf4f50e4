"""The reproducibility record of ``concord report verify``: one CSV row per verified cell and
metric (`record_rows`, `RECORD_COLUMNS`), its summary (`summarize`), plot (`plot_record`) and
markdown report (`render_markdown`)."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path

from concord.lab.report import markdown_grid
from concord.lab.verify.manifest import number
from concord.lab.verify.rerun import Outcome

__all__ = [
    "MACHINE_DEPENDENT",
    "RECORD_COLUMNS",
    "plot_record",
    "record_rows",
    "render_markdown",
    "summarize",
    "write_record_csv",
]


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
    "host",
    "host_differs",
    "code",
    "cause",
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
    no ``rerun``), the recorded torch / CPU / threads (empty: not recorded), this machine's,
    ``same_machine`` (true: the host facts are equal), ``host`` (same, differs, not recorded:
    no host facts, and torch, CPU and threads equal or not recorded), ``host_differs`` (the
    differing facts, "; "-separated), ``code`` (same, differs, unknown: the report's commit
    against this checkout) and ``cause`` (the cell's conclusion: reproduces, host, code,
    regression, undecided, unknown, failed)."""
    rows = []
    for o in outcomes:
        recorded, here = o.target.recorded, o.here
        common = {"directory": o.given, "run": o.target.cell.name}
        machine = {
            **{f"recorded_{k}": _text(recorded.get(k)) for k in ("torch", "cpu", "threads")},
            **{f"this_{k}": _text(here.get(k)) for k in ("torch", "cpu", "threads")},
            "same_machine": "true" if o.state == "same" else "false",
            "host": o.host.state,
            "host_differs": "; ".join(o.host.facts),
            "code": o.code.state,
            "cause": o.cause,
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
    """Why a differing cell differs, from its host (or, in an older record, machine) columns:
    "machine", "same", "unknown"."""
    host = row.get("host")
    if host:
        return {"same": "same", "differs": "machine"}.get(host, "unknown")
    if not row["recorded_torch"]:
        return "unknown"
    return "same" if row["same_machine"] == "true" else "machine"


_REASONS = {
    "machine": "on a machine other than the recorded one (torch, CPU or threads differ): the "
    "machine is the likely reason",
    "same": "on the recorded machine (same torch, CPU and threads): not explained by the machine "
    "(the code, the data or the configuration changed since the report?)",
    "unknown": "whose report does not record its host facts: if it came from another host (a "
    "CPU model name does not identify one), that is the likely reason",
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
            "unknown": "the report does not record its host facts",
        }[reason]
        if first.get("cause") == "host" and reason == "machine":
            why += " (--at-commit or the same code: the host, not the code)"
        elif first.get("cause") in ("undecided", "code") and first.get("code") == "differs":
            why += "; the code differs from the report's commit too"
            why += " (--at-commit decides)" if first.get("cause") == "undecided" else ""
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
            committed = number(r["committed"])
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
        if first.get("host_differs"):
            lines.append(f"Host facts that differ: {first['host_differs']}.")
        if first.get("code"):
            lines.append(f"Code against the report's commit: {first['code']}; conclusion: "
                         f"{first.get('cause') or '—'}.")  # fmt: skip
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
