"""``concord sweep --preset consensus-pystdlib``: consensus control's Table-2 shape (the cells of
``consensus-control``, `concord.lab.presets.consensus`) on the natural-heterogeneity task
``pystdlib-chars`` — next character of the standard library's source, each peer holding whole
top-level packages — with every number of its report generated from its own ``runs.csv``.

Grid: for each n (``--columns n16,n32``; default both) and seed (default 0–4), the cells of
``consensus-control`` (``--rows``; default `DEFAULT_ROWS`: all-reduce, dec-phase-1 uncontrolled,
¼ · max Ξ and ¼ · max Θ; `OPTIONAL_ROWS` adds ⅛ · max Θ and the adaptive target) on
`BASE`: `concord.lab.presets.recipes.PYSTDLIB_RECIPE` at this module's CPU budget
(`concord.lab.presets.pystdlib.PYSTDLIB_BUDGET`), a ring, D-SGD, at most 50 rounds per step.
Seeds are paired (every cell runs on the seeds of all-reduce). The grid, the rows of
``runs.csv``, the summary, the claims and the plots are those of `concord.lab.presets.consensus`
(imported, unchanged); this module adds the held-out loss (``loss_avg_model``), the unigram /
bigram references, the corpus's identity in ``preset.json`` and a reading that compares every
finding with the committed MNIST-1D report (``docs/results/consensus-control/runs.csv``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from concord.core.config import apply_overrides, load_config
from concord.lab.presets import consensus as cc
from concord.lab.presets.pystdlib import PYSTDLIB_BUDGET
from concord.lab.presets.pystdlib_report import (
    RESULTS,
    ci,
    final_loss,
    record_corpus,
    references,
    references_text,
)
from concord.lab.presets.recipes import PYSTDLIB_RECIPE
from concord.lab.presets.report import environment, run_manifest
from concord.lab.presets.spec import PresetRequest, RunList, Study, command_line
from concord.lab.report import pm
from concord.lab.sweep import SweepRun, run_sweep, run_without_plots, write_table
from concord.runtime.records import read_summary

NAME = "consensus-pystdlib"
TITLE = "Consensus control, Table 2 shape on pystdlib-chars (char transformer, ring, n = 16 / 32)"
BASE = (
    *PYSTDLIB_RECIPE,
    *PYSTDLIB_BUDGET,
    "topology=ring",
    "algorithm=dsgd",
    "control.max_rounds=50",
)
SEEDS = (0, 1, 2, 3, 4)
COLUMNS = ("n16", "n32")
DEFAULT_ROWS = ("allreduce", "p1-none", "p1-1over4-xi", "p1-1over4-theta")
OPTIONAL_ROWS = ("p1-1over8-theta", "p1-adaptive-theta")
RUNS_CSV = (*cc.RUNS_CSV, "loss_avg_model")
MNIST1D = RESULTS / "consensus-control" / "runs.csv"
"""The MNIST-1D runs the reading compares with (read only)."""


def _row(run: SweepRun, out: Path) -> dict[str, Any]:
    return cc._row(run, out) | {"loss_avg_model": final_loss(out / "runs" / run.name)}


def read_runs_csv(path: Path) -> list[dict[str, Any]]:
    """``runs.csv`` with typed cells (`concord.lab.presets.consensus.read_runs_csv`, plus the
    loss)."""
    rows = cc.read_runs_csv(path)
    for r in rows:
        value = r.get("loss_avg_model")
        r["loss_avg_model"] = float(value) if value not in (None, "") else None
    return rows


def losses(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[Any, ...], tuple[float, float]]:
    """(n, phase, target, statistic) → the held-out loss, mean and 95 % CI half-width."""
    groups: dict[tuple[Any, ...], list[float]] = {}
    for r in rows:
        if r["status"] == "ok" and r.get("loss_avg_model") is not None:
            key = (r["n"], r["phase"], r["target"], r["statistic"])
            groups.setdefault(key, []).append(float(r["loss_avg_model"]))
    return {k: ci(v) for k, v in groups.items()}


def _key(c: Mapping[str, Any]) -> tuple[Any, ...]:
    return (c["n"], c["phase"], c["target"], c["statistic"])


def _times(x: float, digits: int = 2) -> str:
    return "not measured" if math.isnan(x) else f"{x:.{digits}f}×"


def _diff(c: Mapping[str, Any] | None) -> str:
    return "—" if c is None else pm(c["diff"])


def _closes(c: Mapping[str, Any] | None, unc: Mapping[str, Any] | None) -> bool | None:
    """Whether cell ``c`` closes at least half of the uncontrolled run's gap to all-reduce (None:
    a cell missing, or no gap: the uncontrolled run not below all-reduce)."""
    if c is None or unc is None or unc["diff"][0] >= 0:
        return None
    return bool(c["diff"][0] - unc["diff"][0] >= -0.5 * unc["diff"][0])


def reading(
    cells: Sequence[Mapping[str, Any]],
    mnist: Sequence[Mapping[str, Any]],
    refs: Mapping[str, float],
) -> list[str]:
    """What reproduced of the MNIST-1D findings (the committed consensus-control cells of the
    same n), each finding decided on both tables by the same rule."""
    here = {_key(c): c for c in cells}
    there = {_key(c): c for c in mnist}
    out = ["## Reading: what reproduced of the MNIST-1D findings (computed from both tables)", ""]
    ns = sorted({c["n"] for c in cells})

    def verdict(a: bool | None, b: bool | None) -> str:
        if a is None or b is None:
            return "not comparable"
        if a == b:
            return "reproduced" if a else "reproduced (absent in both)"
        return "**not reproduced**"

    for n in ns:
        unc_h, unc_m = here.get((n, "1", "none", "")), there.get((n, "1", "none", ""))
        rules: list[tuple[str, Any, Any]] = []
        if unc_h is not None:
            rules.append(("decentralizing phase 1 (uncontrolled) costs ≥ 1 pp against all-reduce",
                          lambda c: c["diff"][0] <= -1.0, ("1", "none", "")))  # fmt: skip
        for stat, sym in (("xi", "Ξ"), ("theta", "Θ")):
            rules.append((f"¼ · max {sym} ends within 0.5 pp of all-reduce (or above)",
                          lambda c: c["diff"][0] >= -0.5, ("1", "1/4", stat)))  # fmt: skip
            rules.append((f"¼ · max {sym} closes at least half the uncontrolled gap",
                          None, ("1", "1/4", stat)))  # fmt: skip
        measured = [c["label"] for c in mnist if c["n"] == n]
        out.append(f"**n = {n}** (MNIST-1D cells at this n: {', '.join(measured) or 'none'})")
        out.append("")
        for text, rule, (phase, target, stat) in rules:
            h, m = here.get((n, phase, target, stat)), there.get((n, phase, target, stat))
            if h is None:
                continue
            if rule is None:
                a, b = _closes(h, unc_h), _closes(m, unc_m)
                nums = (
                    f"pystdlib {_diff(h)} pp vs uncontrolled {_diff(unc_h)} pp; MNIST-1D "
                    f"{_diff(m)} vs {_diff(unc_m)}"
                )
            else:
                a = bool(rule(h))
                b = None if m is None else bool(rule(m))
                nums = f"pystdlib Δ {_diff(h)} pp, MNIST-1D Δ {_diff(m)} pp"
            words = {True: "holds", False: "does not hold", None: "undefined"}
            there_word = "not measured" if m is None else words[b]
            out.append(f"- {text}: pystdlib {words[a]}, MNIST-1D {there_word}: "
                       f"{verdict(a, b)} ({nums}).")  # fmt: skip
        xi, th = here.get((n, "1", "1/4", "xi")), here.get((n, "1", "1/4", "theta"))
        m_xi, m_th = there.get((n, "1", "1/4", "xi")), there.get((n, "1", "1/4", "theta"))
        if xi is not None and th is not None and not math.isnan(th["late_xi"]):
            ratio = th["late_xi"] / xi["late_xi"]
            m_ratio = (m_th["late_xi"] / m_xi["late_xi"]
                       if m_xi is not None and m_th is not None else math.nan)  # fmt: skip
            same = "reproduced" if (ratio > 1.5) == (m_ratio > 1.5) else "**not reproduced**"
            if math.isnan(m_ratio):
                same = "not comparable (MNIST-1D not measured)"
            out.append(
                f"- a target on Θ leaves the exact Ξ higher than a target on Ξ (late Ξ ratio "
                f"Θ-target / Ξ-target > 1.5): pystdlib {ratio:.1f}× (late Ξ {th['late_xi']:.3g} "
                f"vs {xi['late_xi']:.3g}, at {th['late_rounds']:.1f} vs {xi['late_rounds']:.1f} "
                f"rounds per step), MNIST-1D {_times(m_ratio, 1)}: "
                f"{same}."
            )
            out.append(
                f"- rounds against the uncontrolled run: ¼ · max Ξ {xi['rounds_ratio']:.2f}× "
                f"(MNIST-1D {_times(m_xi['rounds_ratio'] if m_xi else math.nan)}), ¼ · max Θ "
                f"{th['rounds_ratio']:.2f}× (MNIST-1D "
                f"{_times(m_th['rounds_ratio'] if m_th else math.nan)})."
            )
        out.append("")
    bigram = refs.get("bigram_accuracy")
    if bigram is not None and cells:
        worst = min(cells, key=lambda c: c["acc"][0])
        best = max(cells, key=lambda c: c["acc"][0])
        out += [
            f"- **The task is learned beyond the bigram reference** ({100 * bigram:.1f} %): "
            f"every cell's mean lies between {worst['acc'][0]:.2f} % ({worst['label']}, "
            f"n = {worst['n']}) and {best['acc'][0]:.2f} % ({best['label']}, n = {best['n']})"
            + (" — all above it." if worst["acc"][0] > 100 * bigram else " — not all above it."),
            "",
        ]
    return out


LOSS_HEADS = ("loss (nats)", "perplexity")


def write_report(out: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> Path:
    cells = cc.summarize(rows)
    loss = losses(rows)
    plots = cc._plots(out, rows, cells) if cells else []
    refs = meta.get("references") or {}
    mnist = cc.summarize(cc.read_runs_csv(MNIST1D)) if MNIST1D.is_file() else []

    def loss_values(c: Mapping[str, Any]) -> list[str]:
        lo = loss.get(_key(c), (math.nan, math.nan))
        return [pm(lo, 3), "—" if math.isnan(lo[0]) else f"{math.exp(lo[0]):.2f}"]

    lines = [
        f"# {TITLE}",
        "",
        "Kong et al. (ICML 2021), Table 2, on a second task with natural heterogeneity: "
        "next-character prediction on the Python standard library's source (`pystdlib-chars`: "
        "16 000 windows of 32 characters, 10 % of each package held out: 1 600 held-out "
        "windows, all evaluated), each of the n peers on a ring holding whole top-level "
        'packages (`partition.scheme = "groups"`), the 2-layer `char-transformer` at width 64 '
        "(4 heads), local batch 16, lr 1.0, Nesterov 0.9, gradients clipped at norm 1, 5 % "
        "warm-up, LR ×0.1 at 50 % and 75 %, 4 epochs (`PYSTDLIB_RECIPE` + `PYSTDLIB_BUDGET`, "
        "lab/presets/pystdlib.py; why this budget: docs/algorithms.md). `dec-phase-k`: gossip in "
        "phase k, exact averaging in the others. Constant targets are the factor × the max of "
        "the named statistic over phase k of an uncontrolled calibration pass of the same seed "
        "— **Ξ** the exact consensus distance (vectorized engine only), **Θ** the estimator "
        "real peers use; the adaptive target is ¼ × an EMA of the gradient norm, on Θ. "
        "Accuracy: the averaged model's next-character accuracy on the held-out windows after "
        "the last step; loss: its cross-entropy there (nats; perplexity = exp(loss)). Cells: "
        "mean ± 95 % confidence interval (Student's t) over the seeds; Δ: the paired "
        "difference to all-reduce on the same seed; *late*: means over the second half of the "
        "gossip phase.",
        "",
    ]
    lines += [*cc.provenance_lines(rows, meta), references_text(refs), ""]
    for n in sorted({c["n"] for c in cells}):
        lines += [f"## n = {n}", "", *cc.cell_table(cells, n, (LOSS_HEADS, loss_values)), ""]
        heading = f"Claims at n = {n}, phase 1 (those of consensus-control):"
        lines += [*cc.claims_lines(cells, n, heading), ""]
    lines += reading(cells, mnist, refs)
    return cc.finish_report(out, lines, plots, rows, meta)


def _check_keys(rows: Sequence[str], columns: Sequence[str]) -> None:
    for key in rows:
        if key not in cc.CELLS:
            raise ValueError(f"unknown row {key!r}; rows: {', '.join(cc.CELLS)}")
    for key in columns:
        if key not in COLUMNS:
            raise ValueError(f"unknown column {key!r}; columns: {', '.join(COLUMNS)}")


def study_main(request: PresetRequest) -> Path:
    """Run the grid (or, ``report_only``, only rewrite the report from ``runs.csv``)."""
    if request.tune:
        raise ValueError(f"--tune: preset {NAME!r} has no lr grid (the budget's lr 1.0)")
    row_keys = list(request.rows) if request.rows else list(DEFAULT_ROWS)
    col_keys = list(request.columns) if request.columns else list(COLUMNS)
    _check_keys(row_keys, col_keys)
    seed_list = list(request.seeds) if request.seeds else list(SEEDS)
    jobs, overrides, resume = request.jobs or 1, request.overrides, request.resume
    out = request.out_dir or Path("runs") / time.strftime(f"{NAME}-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    console = request.console or Console()
    runs = cc.grid(row_keys, col_keys, seed_list)
    if request.report_only:
        meta = json.loads((out / "preset.json").read_text(encoding="utf-8"))
        table = read_runs_csv(out / "runs.csv")
    else:
        base = load_config(None, ["engine=vectorized", *BASE, *overrides], environ={})
        for run in runs:  # every run validates before anything starts
            apply_overrides(base, run.overrides)
        picked = (row_keys if request.rows else None, col_keys if request.columns else None)
        command = command_line(NAME, seed_list, jobs, out, overrides, False, *picked)
        done = {r.name for r in runs if resume and read_summary(out / "runs" / r.name)}
        todo = RunList([r for r in runs if r.name not in done])
        console.print(f"{NAME}: {len(runs)} runs ({len(done)} reused), jobs {jobs}\n{command}")
        started = time.perf_counter()
        if todo.runs():
            run_sweep(todo, out, lambda o: apply_overrides(base, o),
                      request.run_fn or run_without_plots, jobs=jobs, console=console)  # fmt: skip
        wall = time.perf_counter() - started
        previous = out / "preset.json"
        old: dict[str, Any] = {}
        commands, seeds_all = [command], list(seed_list)
        if resume and previous.is_file():
            old = json.loads(previous.read_text(encoding="utf-8"))
            wall += float(old["wall_seconds"])
            earlier = old.get("commands", [old["command"]])
            commands = earlier + ([] if command in earlier else [command])
            seeds_all = sorted(set(old.get("seeds", [])) | set(seed_list))
        manifest = run_manifest(runs, base=BASE, overrides=overrides, table="runs.csv",
                                name_column="run", metrics=cc.RUNS_METRICS)  # fmt: skip
        if old:  # the earlier grids' runs stay verifiable
            mine = {r.name for r in runs}
            manifest["runs"] = [e for e in old.get("runs", []) if e["name"] not in mine] + manifest[
                "runs"
            ]
        refs = old.get("references") or references(["engine=vectorized", *BASE, *overrides])
        meta = {
            "preset": NAME, "command": command, "commands": commands, "wall_seconds": wall,
            "seeds": seeds_all, "overrides": list(overrides), "references": refs,
            **environment(threads=1, jobs=jobs), **manifest,
        }  # fmt: skip
        previous.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        record_corpus(out, [r.name for r in runs])
        meta = json.loads(previous.read_text(encoding="utf-8"))
        table = [_row(r, out) for r in runs]
        if resume and (out / "runs.csv").is_file():  # the earlier grids' rows stay
            mine_rows = {r["run"] for r in table}
            kept = [r for r in read_runs_csv(out / "runs.csv") if r["run"] not in mine_rows]
            table = kept + table
        write_table(out / "runs.csv", RUNS_CSV, table)
        table = read_runs_csv(out / "runs.csv")  # the report reads what the CSV says
    report = write_report(out, table, meta)
    console.print(f"report: {report}")
    return out


STUDY = Study(NAME, TITLE, study_main)
"""consensus-pystdlib in the catalog of ``concord sweep --preset`` (`concord.lab.presets.run`)."""
