"""``concord sweep --preset consensus-control``: the shape of Kong et al. 2021's Table 2 at CPU
scale, with every number of its report generated from its own ``runs.csv``.

Grid (vectorized engine, the recipe of ``examples/paper-mnist1d.toml``: MNIST-1D, cnn1d, a ring,
local batch 16, Nesterov 0.9, weight decay 1e-4, 5 % warm-up, LR ×0.1 at 50 % and 75 %, plus
`concord.lab.presets.recipes.BASELINE_FIX`: gradients clipped at norm 2, LR 0.2): for each
n (``--columns n32,n64``; default both) and each seed, the all-reduce baseline and, for each
phase k (``dec-phase-k``: gossip in phase k only, exact averaging elsewhere), the uncontrolled
run and constant targets ½, ¼ (and ⅛) × the max of the statistic over phase k of an uncontrolled
calibration pass — the exact consensus distance Ξ (``xi``), its estimator Θ (``theta``) and the
sketch estimate Ξ̂ (``sketch``) side by side — plus the paper's adaptive target (factor × an EMA
of the gradient norm). Cells are rows (``--rows``; `CELLS`); seeds are paired (every cell runs on
the same seeds as all-reduce).

Output (``--out``): ``runs.csv`` (one row per run: n, phase, target, statistic, seed, accuracy,
gossip_rounds, bytes_per_peer, …), ``report.md`` (mean ± 95 % confidence interval per cell, the
paired difference to all-reduce, rounds against the uncontrolled run, the issue's checks), and
``accuracy-rounds.png`` / ``xi-n<N>.png``; each run's directory under ``runs/``.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from concord.core.config import apply_overrides, load_config
from concord.lab.presets.consensus_separation import separation
from concord.lab.presets.recipes import BASELINE_FIX, MNIST1D_RECIPE
from concord.lab.presets.report import environment, reproducibility_section, run_manifest
from concord.lab.presets.spec import PresetRequest, RunList, Study, command_line
from concord.lab.report import CellStats, markdown_grid, pm
from concord.lab.sweep import SweepRun, run_sweep, run_without_plots, write_table

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
from concord.runtime.records import read_summary

NAME = "consensus-control"
TITLE = "Consensus control, Table 2 shape (MNIST-1D, ring, n = 16 to 256)"
MAX_ROUNDS = 50
"""``control.max_rounds`` of every run: the most gossip rounds a controlled step may run."""
BASE = (*MNIST1D_RECIPE, *BASELINE_FIX, "topology=ring", "algorithm=dsgd",
        f"control.max_rounds={MAX_ROUNDS}")  # fmt: skip
SEEDS = (0, 1, 2, 3, 4)
COLUMNS = {"n16": 16, "n32": 32, "n64": 64, "n128": 128, "n256": 256}
DEFAULT_COLUMNS = ("n32", "n64")  # n16, n128, n256 for the scaling in n (``--columns``)
RUNS_CSV = (
    "n", "phase", "target", "statistic", "seed", "accuracy_avg_model", "gossip_rounds",
    "bytes_per_peer", "mode", "factor", "accuracy_worst_peer", "final_xi", "late_rounds_per_step",
    "late_xi",
    "wall_seconds", "status", "run",
)  # fmt: skip
RUNS_METRICS = {
    "accuracy_avg_model": "accuracy_avg_model",
    "accuracy_worst_peer": "accuracy_worst_peer",
    "gossip_rounds_total": "gossip_rounds",
    "bytes_per_peer": "bytes_per_peer",
}
"""The compared metrics of ``runs.csv`` (preset.json's ``metrics``): metric → column."""


@dataclass(frozen=True)
class Cell:
    """A row of the report: phase ("all" for all-reduce), target label, statistic, mode and
    factor (None: no control)."""

    key: str
    phase: str
    target: str
    statistic: str
    mode: str
    factor: float | None

    def overrides(self) -> dict[str, object]:
        if self.phase == "all":
            return {"algorithm": "allreduce", "topology": "complete", "plan": "exact",
                    "control.mode": "none"}  # fmt: skip
        out: dict[str, object] = {"plan": f"dec-phase-{self.phase}", "control.mode": self.mode}
        if self.mode != "none":
            out |= {"control.phases": [int(self.phase)], "control.factor": self.factor,
                    "control.statistic": self.statistic}  # fmt: skip
        return out


def _cells() -> list[Cell]:
    cells = [Cell("allreduce", "all", "allreduce", "", "none", None)]
    for k in ("1", "2", "3"):
        cells.append(Cell(f"p{k}-none", k, "none", "", "none", None))
        for stat in ("xi", "theta", "sketch"):
            for label, factor in (("1/2", 0.5), ("1/4", 0.25), ("1/8", 0.125)):
                key = f"p{k}-{label.replace('/', 'over')}-{stat}"
                cells.append(Cell(key, k, label, stat, "constant", factor))
        cells.append(Cell(f"p{k}-adaptive-theta", k, "adaptive", "theta", "adaptive", 0.25))
    return cells


CELLS = {c.key: c for c in _cells()}
# what runs without --rows: phase 1 in full (the paper's main row), phases 2 and 3 at ¼ Θ/Ξ
DEFAULT_ROWS = (
    "allreduce",
    "p1-none", "p1-1over2-xi", "p1-1over4-xi", "p1-1over2-theta", "p1-1over4-theta",
    "p1-adaptive-theta",
    "p2-none", "p2-1over4-xi", "p2-1over4-theta",
    "p3-none", "p3-1over4-xi", "p3-1over4-theta",
)  # fmt: skip


def grid(rows: Sequence[str], columns: Sequence[str], seeds: Sequence[int]) -> list[SweepRun]:
    """Every run, all-reduce and calibration-sharing runs first (`run_sweep` holds the runs of
    a calibration group until its first has cached the calibration pass)."""
    runs = []
    for col in columns:
        n = COLUMNS[col]
        for seed in seeds:
            for key in rows:
                c = CELLS[key]
                group = None
                if c.mode == "constant":
                    group = (f"dec-phase-{c.phase}/{c.statistic}/n{n}", "ring", seed)
                runs.append(
                    SweepRun(
                        name=f"n{n}-{key}-s{seed}",
                        kind="baseline" if c.phase == "all" else "plan",
                        row=key,
                        plan=None if c.phase == "all" else f"dec-phase-{c.phase}",
                        topology=None if c.phase == "all" else "ring",
                        factor=c.factor,
                        control_mode=c.mode,
                        seed=seed,
                        overrides={"peers": n, "seed": seed, **c.overrides()},
                        calibration_group=group,
                        column=col,
                    )
                )
    return runs


def late_phase(run_dir: Path, phase: str) -> tuple[float | None, float | None]:
    """Mean gossip rounds per step and mean Ξ (after the step) over the second half of the
    gossip phase ``phase`` of a run (None for all-reduce or a run without its metrics)."""
    path = run_dir / "metrics.jsonl"
    if phase == "all" or not path.is_file():
        return None, None
    steps = [
        r
        for r in map(json.loads, path.read_text(encoding="utf-8").splitlines())
        if r.get("kind") == "step" and str(r.get("phase")) == phase
    ]
    late = steps[len(steps) // 2 :]
    if not late:
        return None, None
    xis = [float(r["xi"]) for r in late if r.get("xi") is not None]
    return (
        statistics.fmean(float(r["rounds"]) for r in late),
        statistics.fmean(xis) if xis else None,
    )


def _row(run: SweepRun, out: Path) -> dict[str, Any]:
    c = CELLS[run.row]
    n = int(str(run.overrides["peers"]))
    late_rounds, late_xi = late_phase(out / "runs" / run.name, c.phase)
    row = {
        "n": n, "phase": c.phase, "target": c.target, "statistic": c.statistic,
        "seed": run.seed, "mode": c.mode, "factor": c.factor,
        "late_rounds_per_step": None if late_rounds is None else round(late_rounds, 4),
        "late_xi": late_xi, "status": "failed", "run": run.name,
    }  # fmt: skip
    s = read_summary(out / "runs" / run.name)
    if s is not None:
        row |= {
            "accuracy_avg_model": s.accuracy_avg_model,
            "accuracy_worst_peer": s.accuracy_worst_peer,
            "gossip_rounds": s.gossip_rounds_total,
            "bytes_per_peer": round(s.bytes_sent_total / n),
            "final_xi": s.final_consensus_distance,
            "wall_seconds": s.wall_seconds,
            "status": "ok",
        }
    return row


def write_runs_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """The preset's ``runs.csv`` (`RUNS_CSV`)."""
    write_table(path, RUNS_CSV, rows)


OLD_COLUMNS = {"accuracy": "accuracy_avg_model", "worst_peer": "accuracy_worst_peer"}
"""runs.csv columns before typed records (one name per metric: docs/records.md) → today's."""


def read_runs_csv(path: Path) -> list[dict[str, Any]]:
    """``runs.csv`` with typed cells (old column names mapped: `OLD_COLUMNS`)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [{OLD_COLUMNS.get(k, k): v for k, v in r.items()} for r in csv.DictReader(f)]
    for r in rows:
        for k in ("n", "seed", "gossip_rounds", "bytes_per_peer"):
            r[k] = int(float(r[k])) if r[k] != "" else None
        for k in ("accuracy_avg_model", "accuracy_worst_peer", "final_xi",
                  "late_rounds_per_step", "late_xi", "wall_seconds"):  # fmt: skip
            r[k] = float(r[k]) if r.get(k, "") != "" else None
    return rows


def _ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % confidence interval (`CellStats.ci95`)."""
    stats = CellStats(tuple(values), len(values))
    return stats.mean, stats.ci95


STATISTICS = {"xi": "Ξ (exact)", "theta": "Θ (estimator)", "sketch": "Ξ̂ (sketch)"}
"""Control statistic → its name in the report (``control.statistic``)."""


def _label(r: Mapping[str, Any]) -> str:
    if r["target"] == "allreduce":
        return "all-reduce"
    if r["target"] == "none":
        return f"phase {r['phase']}, uncontrolled"
    stat = STATISTICS[r["statistic"]]
    if r["target"] == "adaptive":
        return f"phase {r['phase']}, adaptive (¼ · EMA ‖g‖, on {stat})"
    return f"phase {r['phase']}, {r['target']} · max {stat}"


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (n, cell): accuracy mean ± CI, the paired difference to all-reduce,
    rounds (mean) and their ratio to the uncontrolled run of the same phase."""
    ok = [r for r in rows if r["status"] == "ok" and r["accuracy_avg_model"] is not None]
    keys: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in ok:
        keys.setdefault((r["n"], r["phase"], r["target"], r["statistic"]), []).append(r)
    out = []
    for (n, phase, target, stat), group in keys.items():
        base = {r["seed"]: r for r in keys.get((n, "all", "allreduce", ""), [])}
        unc = keys.get((n, phase, "none", ""), [])
        acc = [100 * r["accuracy_avg_model"] for r in group]
        diffs = [100 * (r["accuracy_avg_model"] - base[r["seed"]]["accuracy_avg_model"])
                 for r in group
                 if r["seed"] in base]  # fmt: skip
        rounds = statistics.fmean(r["gossip_rounds"] for r in group)
        unc_rounds = statistics.fmean(r["gossip_rounds"] for r in unc) if unc else math.nan
        out.append({
            "n": n, "phase": phase, "target": target, "statistic": stat,
            "label": _label(group[0]), "seeds": sorted(r["seed"] for r in group),
            "acc": _ci(acc), "diff": _ci(diffs) if diffs else (math.nan, math.nan),
            "rounds": rounds,
            "rounds_ratio": rounds / unc_rounds if unc_rounds and unc_rounds > 0 else math.nan,
            "bytes_per_peer": statistics.fmean(r["bytes_per_peer"] for r in group),
            "late_rounds": _fmean(r.get("late_rounds_per_step") for r in group),
            "late_xi": _fmean(r.get("late_xi") for r in group),
        })  # fmt: skip
    order = {"allreduce": 0, "none": 1, "1/2": 2, "1/4": 3, "1/8": 4, "adaptive": 5}
    out.sort(key=lambda e: (e["n"], e["phase"] != "all", e["phase"], order[e["target"]],
                            e["statistic"]))  # fmt: skip
    return out


def _fmean(values: Any) -> float:
    got = [float(v) for v in values if v is not None]
    return statistics.fmean(got) if got else math.nan


def checks(cells: Sequence[Mapping[str, Any]], n: int = 64) -> list[tuple[str, bool | None, str]]:
    """The issue's claims at n, phase 1: (claim, holds (None: not measured), the numbers)."""
    by = {(c["n"], c["phase"], c["target"], c["statistic"]): c for c in cells}
    unc = by.get((n, "1", "none", ""))
    out: list[tuple[str, bool | None, str]] = []
    if unc is None:
        return [(f"n = {n}, phase 1 measured", None, "no runs")]
    d = unc["diff"][0]
    out.append(("uncontrolled ≥ 1 pp below all-reduce", d <= -1.0, f"{d:+.2f} pp"))
    for stat in ("xi", "theta"):
        q = by.get((n, "1", "1/4", stat))
        if q is None:
            continue
        out.append((f"¼ · max {stat} within 0.5 pp of all-reduce", abs(q["diff"][0]) <= 0.5
                    or q["diff"][0] > 0, f"{q['diff'][0]:+.2f} pp"))  # fmt: skip
        out.append((f"¼ · max {stat}: rounds ≤ 4 × uncontrolled", q["rounds_ratio"] <= 4.0,
                    f"{q['rounds_ratio']:.2f}×"))  # fmt: skip
    return out


def _figure(width: float) -> Figure:
    """A new figure ``width`` inches wide, 4.2 high, drawn by Agg (matplotlib is imported only
    when a report draws)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 4.2))
    FigureCanvasAgg(fig)
    return fig


def _annotate(ax: Axes, xlabel: str, ylabel: str, title: str, legend_size: int) -> None:
    """Axis labels, title, a light grid and the legend of one panel."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


def _save(fig: Figure, out: Path, name: str, written: list[str]) -> None:
    """Lay ``fig`` out, write it as ``out/name`` and list ``name`` in ``written``."""
    fig.tight_layout()
    fig.savefig(out / name, dpi=120)
    written.append(name)


def _plots(
    out: Path, rows: Sequence[Mapping[str, Any]], cells: Sequence[Mapping[str, Any]]
) -> list[str]:
    """accuracy-rounds.png and xi-n<N>.png (phase 1, first seed); the files written."""
    written: list[str] = []
    ns = sorted({c["n"] for c in cells})
    fig = _figure(5.5 * len(ns))
    for i, n in enumerate(ns):
        ax = fig.add_subplot(1, len(ns), i + 1)
        for c in (c for c in cells if c["n"] == n):
            marker = {"xi": "o", "theta": "s", "sketch": "^", "": "D"}[c["statistic"]]
            ax.errorbar(c["rounds"], c["acc"][0], yerr=c["acc"][1], fmt=marker, capsize=3,
                        label=c["label"])  # fmt: skip
        _annotate(
            ax,
            "gossip rounds over the run (mean)",
            "test accuracy, averaged model (%), mean ± 95 % CI",
            f"n = {n}, ring",
            6,
        )
    _save(fig, out, "accuracy-rounds.png", written)
    by = {(c["n"], c["phase"], c["target"], c["statistic"]): c for c in cells}
    series = [("none", "", "uncontrolled"), ("1/4", "xi", "¼ · max Ξ"),
              ("1/4", "theta", "¼ · max Θ")]  # fmt: skip
    if len([n for n in ns if (n, "1", "none", "") in by]) >= 2:
        fig = _figure(6)
        ax = fig.add_subplot(1, 1, 1)
        for target, stat, label in series:
            pts = [(n, by[(n, "1", target, stat)]["diff"]) for n in ns
                   if (n, "1", target, stat) in by]  # fmt: skip
            if pts:
                xs, ys, err = [n for n, _ in pts], [d[0] for _, d in pts], [d[1] for _, d in pts]
                ax.errorbar(xs, ys, yerr=err, fmt="o-", capsize=3, label=label)
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        _annotate(
            ax,
            "peers n (ring)",
            "dec-phase-1 − all-reduce, test accuracy (pp), mean ± 95 % CI",
            "Phase-1 degradation against n (paired seeds)",
            7,
        )
        _save(fig, out, "scaling.png", written)
    for n in ns:
        seed = min(r["seed"] for r in rows if r["n"] == n)
        drawn = [r for r in rows if (r["n"], r["seed"]) == (n, seed) and r["phase"] == "1"
                 and r["status"] == "ok"]  # fmt: skip
        have = [(out / "runs" / str(r["run"]) / "metrics.jsonl").is_file() for r in drawn]
        if not all(have) and (out / f"xi-n{n}.png").is_file():
            # a report rebuilt from runs.csv alone, or resumed with only some of the runs here:
            # keep the old plot rather than draw a part of its lines
            written.append(f"xi-n{n}.png")
            continue
        fig = _figure(7)
        ax = fig.add_subplot(1, 1, 1)
        for r in drawn:
            path = out / "runs" / str(r["run"]) / "metrics.jsonl"
            if not path.is_file():
                continue
            pts = [(d["step"], d["xi"]) for d in map(json.loads, path.read_text().splitlines())
                   if d.get("kind") == "step" and d.get("xi") is not None]  # fmt: skip
            if pts:
                ax.plot(*zip(*pts, strict=True), lw=0.8, label=_label(r))
        if not ax.lines:
            if (out / f"xi-n{n}.png").is_file():
                written.append(f"xi-n{n}.png")
            continue
        ax.set_yscale("log")
        _annotate(
            ax,
            "step",
            "consensus distance Ξ (exact, after the step)",
            f"Ξ over training, n = {n}, seed {seed}, dec-phase-1",
            6,
        )
        _save(fig, out, f"xi-n{n}.png", written)
    return written


PAPER_RATIO = 3.5
"""Kong et al.'s rounds of the ¼ Ξ target against the uncontrolled run (phase 1 decentralized),
counting one round for every all-reduce step of phases 2–3."""
OTHER_PHASE1_RATIO = 5.8
"""The same ratio measured by an independent implementation of the setting, over phase 1
alone (its gossip rounds only): what this report's ratio compares with."""
COMPARED_N = 64
"""The n this report's ratio is compared with `OTHER_PHASE1_RATIO` at (the largest n of the
grid when the comparison was written; the ratio grows with n on a ring)."""


def reading(
    cells: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]] = ()
) -> list[str]:
    """Findings computed from the cells (so that every number of the report is the CSV's) and,
    for the paired tests between cells (`separation`), from the rows of ``runs.csv``."""
    by = {(c["n"], c["phase"], c["target"], c["statistic"]): c for c in cells}
    ns = sorted({c["n"] for c in cells})
    out = ["## Reading (computed from the table)", ""]
    gaps = [(n, by[(n, "1", "none", "")]["diff"]) for n in ns if (n, "1", "none", "") in by]
    if gaps:
        text = ", ".join(f"n = {n}: {pm(d)} pp" for n, d in gaps)
        out.append(
            f"- **Decentralizing phase 1, against n** (uncontrolled dec-phase-1 minus all-reduce, "
            f"paired; `scaling.png`): {text}. Phases 2 and 3 decentralized: "
            + ", ".join(
                f"n = {n} phase {k}: {pm(by[(n, k, 'none', '')]['diff'])} pp"
                for n in ns
                for k in ("2", "3")
                if (n, k, "none", "") in by
            )
            + "."
        )
    spread = [(n, by[(n, "all", "allreduce", "")]) for n in ns if (n, "all", "allreduce", "") in by]
    if spread:
        out.append(
            "- **The all-reduce baseline's spread over seeds, against n** (global batch 16·n at "
            "the same lr and epochs, so fewer and larger steps as n grows): "
            + ", ".join(f"n = {n}: {pm(c['acc'])} %" for n, c in spread)
            + ". A wide interval here widens every Δ of that n."
        )
    for n in ns:
        xi, th, none = (by.get((n, "1", t, s)) for t, s in (("1/4", "xi"), ("1/4", "theta"),
                                                              ("none", "")))  # fmt: skip
        if xi is None or th is None or none is None:
            continue
        out.append(
            f"- **n = {n}: a target on Θ is not a target on Ξ.** ¼ · max Θ stops after "
            f"{th['late_rounds']:.1f} rounds per step (late in phase 1) and leaves the exact Ξ at "
            f"{th['late_xi']:.3g} — {th['late_xi'] / xi['late_xi']:.1f}× what ¼ · max Ξ keeps it "
            f"at ({xi['late_xi']:.3g}, with {xi['late_rounds']:.1f} rounds per step; "
            f"uncontrolled: {none['late_xi']:.3g}). Θ = ‖x after − x before‖² of a round "
            "shrinks with the fast-mixing components of the disagreement, while Ξ on a ring is "
            "dominated by the slow ones: controlling on Θ buys {:.2f}× the rounds and "
            "{} pp of the accuracy, controlling on Ξ {:.2f}× the rounds and {} pp.".format(
                th["rounds_ratio"], pm(th["diff"]), xi["rounds_ratio"], pm(xi["diff"])
            )
        )
    for n in ns:
        xi = by.get((n, "1", "1/4", "xi"))
        if xi is not None and xi["late_rounds"] >= MAX_ROUNDS / 2:
            out.append(
                f"- **n = {n}: the ¼ Ξ target runs into the round cap.** Late in phase 1 it takes "
                f"{xi['late_rounds']:.1f} rounds per step on average, against the cap of "
                f"{MAX_ROUNDS} (`control.max_rounds`): a step that reaches the cap ends above the "
                f"target, so this cell's Ξ, late ({xi['late_xi']:.3g}) and accuracy are those of "
                "the capped controller, and its rounds a lower bound of what the target asks."
            )
    with_xi = [n for n in ns if (n, "1", "1/4", "xi") in by]
    # the n of the comparison with OTHER_PHASE1_RATIO; else the largest n the ¼ Ξ target ran at
    big = COMPARED_N if COMPARED_N in with_xi else (max(with_xi) if with_xi else None)
    xi, none = by.get((big, "1", "1/4", "xi")), by.get((big, "1", "none", ""))
    if xi is not None and none is not None:
        ratio = xi["rounds_ratio"]
        near = abs(ratio - OTHER_PHASE1_RATIO) <= 0.15 * OTHER_PHASE1_RATIO  # within 15 %
        agree = "in line with" if near else "against"
        others = ", ".join(f"n = {n}: {by[(n, '1', '1/4', 'xi')]['rounds_ratio']:.2f}×"
                           for n in with_xi if n != big)  # fmt: skip
        out.append(
            f"- **Rounds of the ¼ Ξ target.** The paper's about {PAPER_RATIO}× the uncontrolled "
            "rounds counted one round for every all-reduce step of phases 2–3 as well; counted "
            "over phase 1 alone, an independent implementation of the same setting (an external "
            "audit of this report, MNIST-1D, n = 64; its code is not in this repository) costs "
            f"{OTHER_PHASE1_RATIO}×, {agree} this table's n = {big}: {ratio:.2f}×"
            + (f" (the other sizes: {others})" if others else "")
            + ". The cost is steady, not a warm-up effect: late in "
            f"phase 1 it takes {xi['late_rounds']:.1f} rounds per step (the first steps need "
            "one: Ξ starts at 0, every replica at x⁰). The uncontrolled Ξ grows through the "
            f"phase toward the maximum the target is ¼ of (late in phase 1 it averages "
            f"{none['late_xi']:.3g}; the controlled run keeps {xi['late_xi']:.3g}), so late "
            f"steps must cut Ξ about {none['late_xi'] / xi['late_xi']:.1f}×, which the ring's "
            "slow modes make expensive."
        )
    for n in ns:
        quarter, eighth = by.get((n, "1", "1/4", "theta")), by.get((n, "1", "1/8", "theta"))
        if quarter is None or eighth is None:
            continue
        same = eighth["rounds_ratio"] <= 1.1 * quarter["rounds_ratio"]  # within 10 %
        xi = by.get((n, "1", "1/4", "xi"))
        numbers = (
            f"⅛ · max Θ runs {eighth['rounds_ratio']:.2f}× the uncontrolled rounds "
            f"({eighth['late_rounds']:.1f} per step late in phase 1) against "
            f"{quarter['rounds_ratio']:.2f}× for ¼ · max Θ ({quarter['late_rounds']:.1f}); its Ξ, "
            f"late: {eighth['late_xi']:.3g} against {quarter['late_xi']:.3g}"
        )
        if same:
            out.append(
                f"- **n = {n}: halving a Θ target buys almost nothing.** {numbers}. Θ, the change "
                "a round makes, falls fast once the fast-mixing components are gone, so a lower "
                "Θ target is met after about the same rounds while the slow components of Ξ stay."
            )
        else:
            out.append(
                f"- **n = {n}: halving a Θ target buys whole rounds.** {numbers}"
                + (f" (¼ · max Ξ: {xi['late_xi']:.3g})" if xi is not None else "")
                + f"; accuracy {pm(eighth['diff'])} pp against {pm(quarter['diff'])} pp (Δ vs "
                "all-reduce). The stop rule moves by whole rounds: a lower target that Θ no "
                "longer meets after the second round of a step costs a third, and each extra "
                "round removes little of the slow part of Ξ."
            )
    for n in ns:
        out += separation(rows, n)
    out.append("")
    return out


BEFORE = "before-fix"
"""Subdirectory of a report holding the same grid under the recipe before the baseline fix
(its own ``runs.csv`` and report); `before_after` compares the two."""


def before_after(out: Path, cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "effect of the fix on every method" section: every cell of this report against the
    same cell in ``out/before-fix/runs.csv`` (empty when there is none)."""
    path = out / BEFORE / "runs.csv"
    if not path.is_file():
        return []
    before = {
        (c["n"], c["phase"], c["target"], c["statistic"]): c for c in summarize(read_runs_csv(path))
    }
    lines = [
        "## Effect of the baseline fix on every cell",
        "",
        f"The same cells under the recipe before the fix ([`{BEFORE}/runs.csv`]({BEFORE}/runs.csv)"
        f", its report: [`{BEFORE}/report.md`]({BEFORE}/report.md)); accuracy mean ± 95 % CI, "
        "Δ the paired difference to all-reduce of the same recipe.",
        "",
    ]
    header = ["n", "cell", "accuracy before (%)", "accuracy after (%)", "change (pp)",
              "Δ before (pp)", "Δ after (pp)", "rounds before", "rounds after"]  # fmt: skip
    body = []
    for c in cells:
        b = before.get((c["n"], c["phase"], c["target"], c["statistic"]))
        if b is None:
            continue
        diffs = ("", "") if c["phase"] == "all" else (pm(b["diff"]), pm(c["diff"]))
        body.append([str(c["n"]), c["label"], pm(b["acc"]), pm(c["acc"]),
                     f"{c['acc'][0] - b['acc'][0]:+.2f}", *diffs, f"{b['rounds']:.0f}",
                     f"{c['rounds']:.0f}"])  # fmt: skip
    lines += [*markdown_grid(header, body).splitlines(), ""]
    return lines


NOTES = {
    256: "This column ran on the code after commit 4417a5f (ReplicaLinear: weight gradient "
    "row-major), the other sizes before it; its cells are paired with each other on the same "
    "code. Seeds 0–2 of its first four cells ran one at a time on the 2 shared cores (load "
    "average 7–17), seeds 3–4 and the ⅛ Θ and adaptive cells two at a time on an idle machine.",
}
"""Facts about a column of the committed report that its runs.csv cannot show (by n)."""


def _seeds_note(rows: Sequence[Mapping[str, Any]], n: int, meta: Mapping[str, Any]) -> list[str]:
    """`NOTES` of column n; for a column run on fewer seeds than the report's also which seeds
    and the wall time per run of each cell (runs.csv's ``wall_seconds``; calibration passes not
    included)."""
    mine = [r for r in rows if r["n"] == n and r["status"] == "ok"]
    seeds = sorted({int(r["seed"]) for r in mine})
    if not mine:
        return []
    if len(seeds) >= len(meta.get("seeds", seeds)):
        return [NOTES[n], ""] if n in NOTES else []
    times: dict[str, list[float]] = {}
    for r in mine:
        if r.get("wall_seconds") is not None:
            times.setdefault(_label(r), []).append(float(r["wall_seconds"]))
    text = "; ".join(f"{label} {statistics.fmean(v):.0f} s" for label, v in times.items())
    return [
        f"Seeds at n = {n}: {', '.join(map(str, seeds))}. Wall time per run (mean over them): "
        f"{text}. {NOTES.get(n, '')}".rstrip(),
        "",
    ]


def _title(cells: Sequence[Mapping[str, Any]]) -> str:
    """The report's title: `TITLE` with the sizes the table has."""
    ns = sorted({int(c["n"]) for c in cells})
    if not ns:
        return TITLE
    sizes = f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]} to {ns[-1]}"
    return TITLE.replace("n = 16 to 256", sizes)


Columns = tuple[Sequence[str], Callable[[Mapping[str, Any]], Sequence[str]]]


def provenance_lines(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[str]:
    """A report's commands (the CSV's provenance), seeds, failed runs and machine."""
    commands = [str(c) for c in meta.get("commands", [meta["command"]])]
    failed = [r["run"] for r in rows if r["status"] != "ok"]
    return [
        "Every number below is computed from [`runs.csv`](runs.csv), written by"
        + (" (in this order; `--resume` keeps the earlier runs):" if len(commands) > 1 else ":"),
        "",
        "```bash",
        *commands,
        "```",
        "",
        f"Seeds: {', '.join(map(str, meta['seeds']))}. Runs: {len(rows)} ({len(failed)} failed"
        f"{': ' + ', '.join(failed) if failed else ''}). Wall time {meta['wall_seconds'] / 60:.1f}"
        f" min on {meta['cores']} core(s); torch {meta['torch']}, {meta['cpu']}, "
        f"{meta['threads']} torch thread(s) per run, {meta['jobs']} run(s) at a time.",
        "",
    ]


def cell_table(
    cells: Sequence[Mapping[str, Any]], n: int, extra: Columns | None = None
) -> list[str]:
    """The table of the cells at n; `extra` (headers, a cell's values) goes after the Δ column."""
    heads, values = extra if extra is not None else ((), lambda c: ())
    head = ["cell", "seeds", "accuracy (%)", "Δ vs all-reduce (pp)", *heads, "gossip rounds",
            "× uncontrolled", "rounds / step, late", "Ξ, late", "MB sent per peer"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for c in (c for c in cells if c["n"] == n):
        ratio = "" if math.isnan(c["rounds_ratio"]) else f"{c['rounds_ratio']:.2f}"
        late_r = "" if math.isnan(c["late_rounds"]) else f"{c['late_rounds']:.1f}"
        late_x = "" if math.isnan(c["late_xi"]) else f"{c['late_xi']:.3g}"
        row = [c["label"], str(len(c["seeds"])), pm(c["acc"]),
               "" if c["phase"] == "all" else pm(c["diff"]), *values(c), f"{c['rounds']:.0f}",
               ratio, late_r, late_x, f"{c['bytes_per_peer'] / 1e6:.1f}"]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return lines


def claims_lines(cells: Sequence[Mapping[str, Any]], n: int, heading: str) -> list[str]:
    """The paper's claims at n with their verdicts (`checks`) under `heading`."""
    lines = [heading, ""]
    for claim, holds, numbers in checks(cells, n):
        verdict = {True: "holds", False: "**does not hold**", None: "not measured"}[holds]
        lines.append(f"- {claim}: {verdict} ({numbers})")
    return lines


def finish_report(
    out: Path,
    lines: list[str],
    plots: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    meta: Mapping[str, Any],
) -> Path:
    """A consensus study's report: ``lines``, its figures and its reproducibility section, as
    the file report.md in ``out``."""
    lines = [*lines]
    lines += [f"![accuracy against rounds]({p})" for p in plots if p == "accuracy-rounds.png"]
    lines += [f"![degradation against n]({p})" for p in plots if p == "scaling.png"]
    lines += [f"![Ξ over training]({p})" for p in plots if p.startswith("xi-")]
    lines.append("")
    lines.append(reproducibility_section(meta, directory=out, run=rows[0]["run"] if rows else None))
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_report(out: Path, rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> Path:
    cells = summarize(rows)
    plots = _plots(out, rows, cells) if cells else []
    lines = [
        f"# {_title(cells)}",
        "",
        "Kong et al. (ICML 2021), Table 2, at CPU scale: MNIST-1D generated locally (20 000 "
        "samples, 16 000 for training), cnn1d, a ring of n peers, i.i.d. partition, local batch "
        "16, Nesterov 0.9, weight decay 1e-4, 5 % linear warm-up, LR ×0.1 at 50 % and 75 %, "
        f"60 epochs, and the stable baseline's fix ({', '.join(f'`{x}`' for x in BASELINE_FIX)}: "
        "each replica's gradient clipped at norm 2 and the paper recipe's LR 0.1 doubled; "
        "[baseline-stability](../baseline-stability/report.md)). `dec-phase-k`: gossip in "
        "phase k, exact averaging in the others. "
        "Constant targets are the factor × the max of the named statistic over phase k of an "
        "uncontrolled calibration pass of the same seed — **Ξ** the exact consensus distance "
        "(vectorized engine only), **Θ** the estimator real peers use; the adaptive target is "
        "¼ × an EMA of the gradient norm (the paper's practical guideline), controlled on Θ. "
        + (
            "**Ξ̂** the sketch estimate of Ξ (`control.statistic = 'sketch'`, the "
            "[theta-xi study](../theta-xi/report.md)). "
            if any(r["statistic"] == "sketch" for r in rows)
            else ""
        )
        + "Accuracy: the averaged model on the 4 000 test samples after the last step. "
        "Cells: mean ± 95 % confidence interval (Student's t) over the seeds; Δ: the paired "
        "difference to all-reduce on the same seed; *late*: means over the second half of the "
        "gossip phase (rounds per step, and the exact Ξ after the step — measured for every "
        "run, whatever its control statistic).",
        "",
    ]
    lines += provenance_lines(rows, meta)
    for n in sorted({c["n"] for c in cells}):
        lines += [f"## n = {n}", "", *cell_table(cells, n), ""]
        lines += _seeds_note(rows, n, meta)
        lines += [*claims_lines(cells, n, f"Claims at n = {n}, phase 1:"), ""]
    lines += reading(cells, rows)
    lines += before_after(out, cells)
    return finish_report(out, lines, plots, rows, meta)


def study_main(request: PresetRequest) -> Path:
    """Run the grid (or, ``report_only``, only rewrite the report from ``runs.csv``)."""
    if request.tune:
        raise ValueError(f"--tune: preset {NAME!r} has no lr grid (the recipe's lr 0.1)")
    seeds, jobs, out_dir, overrides = (request.seeds, request.jobs, request.out_dir,
                                       request.overrides)  # fmt: skip
    rows, columns, resume, run_fn = request.rows, request.columns, request.resume, request.run_fn
    report_only = request.report_only
    row_keys = list(rows) if rows else list(DEFAULT_ROWS)
    col_keys = list(columns) if columns else list(DEFAULT_COLUMNS)
    for key in row_keys:
        if key not in CELLS:
            raise ValueError(f"unknown row {key!r}; rows: {', '.join(CELLS)}")
    for key in col_keys:
        if key not in COLUMNS:
            raise ValueError(f"unknown column {key!r}; columns: {', '.join(COLUMNS)}")
    seed_list = list(seeds) if seeds else list(SEEDS)
    jobs = jobs or 1
    out = out_dir or Path("runs") / time.strftime(f"{NAME}-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    console = request.console or Console()
    runs = grid(row_keys, col_keys, seed_list)
    if report_only:
        meta = json.loads((out / "preset.json").read_text(encoding="utf-8"))
        table = read_runs_csv(out / "runs.csv")
    else:
        base = load_config(None, ["engine=vectorized", *BASE, *overrides], environ={})
        for run in runs:  # every run validates before anything starts
            apply_overrides(base, run.overrides)
        picked = (row_keys if rows else None, col_keys if columns else None)
        command = command_line(NAME, seed_list, jobs, out, overrides, False, *picked)
        done = {r.name for r in runs if resume and read_summary(out / "runs" / r.name)}
        todo = RunList([r for r in runs if r.name not in done])
        console.print(f"{NAME}: {len(runs)} runs ({len(done)} reused), jobs {jobs}\n{command}")
        started = time.perf_counter()
        if todo.runs():
            run_sweep(todo, out, lambda o: apply_overrides(base, o), run_fn or run_without_plots,
                      jobs=jobs, console=console)  # fmt: skip
        wall = time.perf_counter() - started
        previous = out / "preset.json"
        commands = [command]
        seeds_all = list(seed_list)
        if resume and previous.is_file():
            old = json.loads(previous.read_text(encoding="utf-8"))
            wall += float(old["wall_seconds"])
            earlier = old.get("commands", [old["command"]])
            commands = earlier + ([] if command in earlier else [command])
            seeds_all = sorted(set(old.get("seeds", [])) | set(seed_list))
        manifest = run_manifest(runs, base=BASE, overrides=overrides, table="runs.csv",
                                name_column="run", metrics=RUNS_METRICS)  # fmt: skip
        if resume and previous.is_file():  # the earlier grids' runs stay verifiable
            mine = {r.name for r in runs}
            manifest["runs"] = [e for e in old.get("runs", []) if e["name"] not in mine] + manifest[
                "runs"
            ]
        meta = {
            "preset": NAME, "command": command, "commands": commands, "wall_seconds": wall,
            "seeds": seeds_all, "overrides": list(overrides),
            **environment(threads=1, jobs=jobs), **manifest,
        }  # fmt: skip
        (out / "preset.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        table = [_row(r, out) for r in runs]
        if resume and (out / "runs.csv").is_file():  # the earlier grids' rows stay
            mine = {r["run"] for r in table}
            kept = [r for r in read_runs_csv(out / "runs.csv") if r["run"] not in mine]
            table = kept + table
        write_runs_csv(out / "runs.csv", table)
        table = read_runs_csv(out / "runs.csv")  # the report reads what the CSV says
    report = write_report(out, table, meta)
    console.print(f"report: {report}")
    return out


STUDY = Study(NAME, TITLE, study_main)
"""consensus-control in the catalog of ``concord sweep --preset`` (`concord.lab.presets.run`)."""
