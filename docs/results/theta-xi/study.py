"""Θ against Ξ along consensus-controlled runs (the theta-xi study; its report.md).

Runs phase 1 of the consensus-control preset's ``dec-phase-1`` cells (vectorized engine, ring,
MNIST-1D, cnn1d, the preset's recipe with the baseline fix; only the gossip phase is run, which
is all the Ξ comparison needs) and logs, after every gossip round, the estimator Θ, the exact
consensus distance Ξ and the sketch estimate Ξ̂ (`concord.core.control.sketch`), whatever
statistic the controller is fed. Cells: uncontrolled (which is also the calibration pass: the
max of each statistic over phase 1), and ¼ · max of Θ, Ξ and Ξ̂.

    python docs/results/theta-xi/study.py run --peers 64 --seeds 0,1,2,3,4 --out DIR
    python docs/results/theta-xi/study.py tables DIR [DIR ...]  # → cells.csv, rounds.csv here
    python docs/results/theta-xi/study.py report                # report.md from those two

``run`` writes DIR/steps.csv (one row per step: cell, seed, step, rounds, Ξ after the step) and
DIR/rounds.csv (one row per round: Θ, Ξ, Ξ̂); ``tables`` reduces them to this folder's cells.csv
(one row per run) and rounds.csv (late-phase means per round index within a step); ``report``
writes report.md from those two CSVs alone.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from concord.core.config import load_config
from concord.core.control.calibration import Calibration
from concord.core.control.consensus import round_statistic
from concord.lab.presets.consensus import BASE, read_runs_csv, summarize
from concord.lab.presets.consensus_separation import paired_accuracy, separated
from concord.lab.report import CellStats
from concord.sim.engine import Trainer

HERE = Path(__file__).resolve().parent
CELLS = ("none", "theta", "xi", "sketch")  # uncontrolled, then ¼ · max of each statistic
FACTOR = 0.25
_STUDY = "python docs/results/theta-xi/study.py"
COMMANDS = (
    f"{_STUDY} run --peers 64 --seeds 0,1,2,3,4 --out runs/theta-xi/n64",
    f"{_STUDY} run --peers 128 --seeds 0,1,2 --out runs/theta-xi/n128",
    f"{_STUDY} tables runs/theta-xi/n64 runs/theta-xi/n128",
    f"{_STUDY} run --peers 128 --seeds 3,4 --out runs/theta-xi/n128-s34",
    f"{_STUDY} tables --merge runs/theta-xi/n128-s34",
    f"{_STUDY} report",
)
"""The commands that wrote cells.csv and rounds.csv, in order (the report's header)."""
CONSENSUS = HERE.parent / "consensus-control" / "runs.csv"
"""The consensus-control report's runs: the accuracy of the same cells, trained to the end."""
ROUND_FIELDS = ("n", "cell", "seed", "step", "round", "rounds", "theta", "xi", "sketch")
STEP_FIELDS = ("n", "cell", "seed", "step", "rounds", "xi", "target")


def config(n: int, seed: int, cell: str, epochs: int | None) -> Any:
    sets = [
        *BASE,
        f"peers={n}",
        f"seed={seed}",
        "plan=dec-phase-1",
        "threads=1",
        "engine=vectorized",
    ]
    if epochs is not None:
        sets.append(f"epochs={epochs}")
    if cell == "none":  # one round per step, through the control hook (which logs the rounds)
        sets += ["control.mode=fixed", "control.rounds=1", "control.phases=[1]"]
    else:
        sets += ["control.mode=constant", f"control.factor={FACTOR}",
                 "control.phases=[1]", f"control.statistic={cell}"]  # fmt: skip
    return load_config(None, sets)


def run_cell(
    n: int, seed: int, cell: str, epochs: int | None, cal: dict[str, float]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One run through the end of phase 1, logging every round; returns (rounds, steps)."""
    cfg = config(n, seed, cell, epochs)
    calibration = None if cell == "none" else Calibration({1: cal[cell]}, cell)
    trainer = Trainer(cfg, calibration=calibration)
    phase1 = trainer.plan.phases[0]
    control = trainer.control
    inner = control.after_round
    rounds: list[dict[str, Any]] = []

    def logged(round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        rounds.append({
            "n": n, "cell": cell, "seed": seed, "step": control.step, "round": round_index,
            "theta": round_statistic("theta", control.step, x, theta_local),
            "xi": control.meter(x),
            "sketch": round_statistic("sketch", control.step, x, theta_local),
        })  # fmt: skip
        return inner(round_index, x, theta_local)

    control.after_round = logged  # type: ignore[method-assign]
    steps = []
    for step in range(phase1.start, phase1.end):
        rec = trainer.train_step(step)
        target = control.target
        steps.append({"n": n, "cell": cell, "seed": seed, "step": step, "rounds": rec.rounds,
                      "xi": rec.xi, "target": target})  # fmt: skip
    per_step: dict[int, int] = {}
    for r in rounds:
        per_step[r["step"]] = r["round"]
    for r in rounds:
        r["rounds"] = per_step[r["step"]]
    return rounds, steps


def write(path: Path, fields: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    new = not path.exists()
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        if new:
            w.writeheader()
        w.writerows(rows)


def cmd_run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for seed in [int(s) for s in args.seeds.split(",")]:
        t0 = time.perf_counter()
        rounds, steps = run_cell(args.peers, seed, "none", args.epochs, {})
        cal = {s: max(r[s] for r in rounds) for s in ("theta", "xi", "sketch")}
        write(out / "rounds.csv", ROUND_FIELDS, rounds)
        write(out / "steps.csv", STEP_FIELDS, steps)
        print(f"n={args.peers} seed={seed} none {time.perf_counter() - t0:.0f}s cal={cal}")
        for cell in args.cells.split(","):
            t0 = time.perf_counter()
            rounds, steps = run_cell(args.peers, seed, cell, args.epochs, cal)
            write(out / "rounds.csv", ROUND_FIELDS, rounds)
            write(out / "steps.csv", STEP_FIELDS, steps)
            total = sum(s["rounds"] for s in steps)
            print(f"n={args.peers} seed={seed} {cell} {time.perf_counter() - t0:.0f}s "
                  f"rounds={total}", flush=True)  # fmt: skip


RUN_FIELDS = (
    "n", "cell", "seed", "steps", "rounds", "late_rounds_per_step", "late_xi", "max_theta",
    "max_xi", "max_sketch", "max_theta_step", "max_xi_step", "sketch_over_xi_mean",
    "sketch_over_xi_sd", "sketch_over_xi_p01", "sketch_over_xi_p99",
)  # fmt: skip
LATE_FIELDS = ("n", "cell", "round", "count", "theta", "xi", "theta_over_xi", "sketch_over_xi")


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


def _argmax(rows: Sequence[dict[str, str]], column: str) -> dict[str, str]:
    """The row with the largest ``column`` (the first such)."""
    return max(rows, key=lambda r: float(r[column]))


def reduce_dirs(dirs: Sequence[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The raw logs of ``run`` in ``dirs`` → (one row per run, late-phase means per
    (n, cell, round index) with their count): the rows of cells.csv and rounds.csv."""
    runs: list[dict[str, Any]] = []
    late: dict[tuple[int, str, int], list[tuple[float, float, float]]] = defaultdict(list)
    for d in dirs:
        rounds = defaultdict(list)
        for r in _read(d / "rounds.csv"):
            rounds[(int(r["n"]), r["cell"], int(r["seed"]))].append(r)
        steps = defaultdict(list)
        for r in _read(d / "steps.csv"):
            steps[(int(r["n"]), r["cell"], int(r["seed"]))].append(r)
        for key, srows in sorted(steps.items()):
            n, cell, seed = key
            rrows = rounds[key]
            half = len(srows) // 2
            late_steps = srows[half:]
            first = int(srows[half]["step"])
            ratios = [float(r["sketch"]) / float(r["xi"]) for r in rrows if float(r["xi"]) > 0]
            top = {s: _argmax(rrows, s) for s in ("theta", "xi")}
            runs.append({
                "n": n, "cell": cell, "seed": seed, "steps": len(srows),
                "rounds": sum(int(r["rounds"]) for r in srows),
                "late_rounds_per_step": statistics.fmean(int(r["rounds"]) for r in late_steps),
                "late_xi": statistics.fmean(float(r["xi"]) for r in late_steps),
                "max_theta": float(top["theta"]["theta"]), "max_xi": float(top["xi"]["xi"]),
                "max_sketch": max(float(r["sketch"]) for r in rrows),
                "max_theta_step": int(top["theta"]["step"]),
                "max_xi_step": int(top["xi"]["step"]),
                "sketch_over_xi_mean": statistics.fmean(ratios),
                "sketch_over_xi_sd": statistics.pstdev(ratios),
                "sketch_over_xi_p01": _quantile(ratios, 0.01),
                "sketch_over_xi_p99": _quantile(ratios, 0.99),
            })  # fmt: skip
            for r in rrows:
                if int(r["step"]) >= first and float(r["xi"]) > 0:
                    late[(n, cell, int(r["round"]))].append(
                        (float(r["theta"]), float(r["xi"]), float(r["sketch"]))
                    )
    rows = []
    for (n, cell, rnd), v in sorted(late.items()):
        rows.append({
            "n": n, "cell": cell, "round": rnd, "count": len(v),
            "theta": statistics.fmean(a for a, _, _ in v),
            "xi": statistics.fmean(b for _, b, _ in v),
            "theta_over_xi": statistics.fmean(a / b for a, b, _ in v),
            "sketch_over_xi": statistics.fmean(c / b for _, b, c in v),
        })  # fmt: skip
    return runs, rows


MEANS = ("theta", "xi", "theta_over_xi", "sketch_over_xi")
"""The columns of rounds.csv that are means over its ``count`` rounds."""


def merge_tables(
    old_runs: Sequence[dict[str, Any]],
    old_late: Sequence[dict[str, Any]],
    new_runs: Sequence[dict[str, Any]],
    new_late: Sequence[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """cells.csv and rounds.csv with the runs of other seeds added: the run rows side by side,
    the late-phase means of a (n, cell, round) weighted by their counts (a mean over the union
    of the rounds, as if ``tables`` had read every run at once). A run already in ``old_runs``
    is an error: its rounds would count twice."""

    def key(r: dict[str, Any]) -> tuple[int, str, int]:
        return int(r["n"]), str(r["cell"]), int(r["seed"])

    have = {key(r) for r in old_runs}
    again = sorted(key(r) for r in new_runs if key(r) in have)
    if again:
        raise ValueError(f"runs already in cells.csv (n, cell, seed): {again}")
    runs = sorted([*old_runs, *new_runs], key=key)
    late: dict[tuple[int, str, int], dict[str, Any]] = {}
    for r in [*old_late, *new_late]:
        k = (int(r["n"]), str(r["cell"]), int(r["round"]))
        prev = late.get(k)
        if prev is None:
            late[k] = dict(r)
            continue
        a, b = int(prev["count"]), int(r["count"])
        merged: dict[str, Any] = {"n": k[0], "cell": k[1], "round": k[2], "count": a + b}
        for m in MEANS:
            merged[m] = (a * float(prev[m]) + b * float(r[m])) / (a + b)
        late[k] = merged
    return runs, [late[k] for k in sorted(late)]


def write_tables(runs: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]]) -> None:
    """This folder's cells.csv and rounds.csv (floats to 6 significant digits)."""
    for name, fields, table in (("cells.csv", RUN_FIELDS, runs), ("rounds.csv", LATE_FIELDS, rows)):
        with open(HERE / name, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
            w.writeheader()
            for row in table:
                w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})


def cmd_tables(dirs: Sequence[Path], merge: bool = False) -> None:
    """Reduce the raw logs of ``run`` to cells.csv and rounds.csv in this folder (``merge``:
    add them to the runs those two files already hold)."""
    runs, rows = reduce_dirs(dirs)
    if merge:
        runs, rows = merge_tables(_read(HERE / "cells.csv"), _read(HERE / "rounds.csv"), runs, rows)
    write_tables(runs, rows)


T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


def ci(values: Sequence[float]) -> str:
    """mean ± the 95 % Student-t half-width (no ± with one value)."""
    m = statistics.fmean(values)
    mean = f"{m:.0f}" if abs(m) >= 1000 else f"{m:.3g}"
    if len(values) < 2:
        return mean
    h = T95.get(len(values) - 1, 2.0) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean} ± {h:.0f}" if abs(m) >= 1000 else f"{mean} ± {h:.2g}"


LABELS = {
    "none": "uncontrolled (1 round)",
    "theta": "¼ · max Θ (estimator)",
    "xi": "¼ · max Ξ (exact)",
    "sketch": "¼ · max Ξ̂ (sketch)",
}


def cmd_report() -> None:
    runs = _read(HERE / "cells.csv")
    late = _read(HERE / "rounds.csv")
    by: dict[tuple[int, str], dict[int, dict[str, str]]] = defaultdict(dict)
    for r in runs:
        by[(int(r["n"]), r["cell"])][int(r["seed"])] = r
    ns = sorted({int(r["n"]) for r in runs})
    out = [
        "# Θ against Ξ: why a target on Θ stops at two rounds, and a statistic that tracks Ξ",
        "",
        "Phase 1 of the consensus-control preset's `dec-phase-1` cells (vectorized engine, ring, "
        "MNIST-1D, `cnn1d`, the preset's recipe with the baseline fix, 60 epochs; only the gossip "
        "phase is run — the exact averaging of phases 2–3 does not touch what is measured here). "
        "After every gossip round the estimator Θ = sqrt(mean_i θ_i), the exact consensus "
        "distance Ξ and the sketch estimate Ξ̂ (control statistic `sketch`, "
        "[algorithms.md](../../algorithms.md#consensus-control)) are logged, whatever the "
        "controller is fed. The uncontrolled run is also the calibration pass: each constant "
        "target is ¼ × the max of its statistic over phase 1 of the same seed's uncontrolled run "
        "(the preset's calibration). *Late*: the second half of phase 1.",
        "",
        "Every number below comes from [`cells.csv`](cells.csv) (one row per run) and "
        "[`rounds.csv`](rounds.csv) (late-phase means per round index within a step), written by "
        "(in this order; `tables --merge` adds runs to the two CSVs, weighting the late-phase "
        "means by their counts), and the accuracies from the consensus-control report's "
        "[`runs.csv`](../consensus-control/runs.csv):",
        "",
        "```bash",
    ]
    seeds_by_n = {n: sorted({int(r["seed"]) for r in runs if int(r["n"]) == n}) for n in ns}
    out += list(COMMANDS)
    out += [
        "```",
        "",
        "This is not a preset study: `concord report verify` does not re-run its cells (it reads "
        "preset manifests); the commands above do.",
        "",
    ]
    for n in ns:
        out += [f"## n = {n} (seeds {', '.join(map(str, seeds_by_n[n]))})", ""]
        out += [
            "| cell | seeds | rounds in phase 1 | × uncontrolled | rounds / step, late | "
            "Ξ, late | Ξ late / that of ¼ · max Ξ (paired) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        base = by.get((n, "none"), {})
        ref = by.get((n, "xi"), {})
        for cell in CELLS:
            cur = by.get((n, cell), {})
            if not cur:
                continue
            ss = sorted(cur)
            times = [int(cur[s]["rounds"]) / int(base[s]["rounds"]) for s in ss if s in base]
            rel = [float(cur[s]["late_xi"]) / float(ref[s]["late_xi"]) for s in ss if s in ref]
            out.append(
                f"| {LABELS[cell]} | {len(ss)} | {ci([float(cur[s]['rounds']) for s in ss])} | "
                f"{ci(times) if times else ''} | "
                f"{ci([float(cur[s]['late_rounds_per_step']) for s in ss])} | "
                f"{ci([float(cur[s]['late_xi']) for s in ss])} | {ci(rel) if rel else ''} |"
            )
        out.append("")
        cells = {r["cell"] for r in late if int(r["n"]) == n}
        out += [
            "Within a step, late in phase 1 (means over the seeds' late rounds; round r of a "
            "step, so round 1 follows the local update):",
            "",
            "| cell | round | rounds seen | Θ | Ξ | Θ / Ξ | Ξ̂ / Ξ |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for cell in (c for c in CELLS if c in cells):
            for r in late:
                if int(r["n"]) == n and r["cell"] == cell and int(r["round"]) <= 8:
                    out.append(
                        f"| {LABELS[cell]} | {r['round']} | {r['count']} | "
                        f"{float(r['theta']):.3g} | {float(r['xi']):.3g} | "
                        f"{float(r['theta_over_xi']):.3g} | {float(r['sketch_over_xi']):.3f} |"
                    )
        out.append("")
        if base:
            ss = sorted(base)
            out += [
                "Calibration (the uncontrolled run): the max of each statistic over phase 1 and "
                "the step it falls on (phase 1 has "
                f"{base[ss[0]]['steps']} steps):",
                "",
                "| seed | max Θ | at step | max Ξ | at step | max Ξ̂ | max Ξ̂ / max Ξ |",
                "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            ]
            for s in ss:
                r = base[s]
                out.append(
                    f"| {s} | {float(r['max_theta']):.3g} | {r['max_theta_step']} | "
                    f"{float(r['max_xi']):.3g} | {r['max_xi_step']} | "
                    f"{float(r['max_sketch']):.3g} | "
                    f"{float(r['max_sketch']) / float(r['max_xi']):.3f} |"
                )
            out.append("")
        allr = [r for (nn, _), d in by.items() if nn == n for r in d.values()]
        out += [
            "Accuracy of Ξ̂ over every round of every run at this n (per run: mean, standard "
            "deviation, 1st and 99th percentile of Ξ̂ / Ξ): mean of the means "
            f"{statistics.fmean(float(r['sketch_over_xi_mean']) for r in allr):.4f}, mean sd "
            f"{statistics.fmean(float(r['sketch_over_xi_sd']) for r in allr):.4f}, lowest 1st "
            f"percentile {min(float(r['sketch_over_xi_p01']) for r in allr):.3f}, highest 99th "
            f"{max(float(r['sketch_over_xi_p99']) for r in allr):.3f}.",
            "",
        ]
    consensus = _consensus_rows()
    acc_lines, same = _accuracy(ns, by, consensus)
    out += acc_lines
    out += _claims(ns, by, late)
    out += _reading(ns, by, late, consensus, same)
    (HERE / "report.md").write_text("\n".join(out), encoding="utf-8")


def _claims(
    ns: Sequence[int],
    by: dict[tuple[int, str], dict[int, dict[str, str]]],
    late: Sequence[dict[str, str]],
) -> list[str]:
    """The issue's checks, computed from the tables."""
    out = ["## Checks (computed from the tables)", ""]
    for n in ns:
        ref, sk, th = by.get((n, "xi"), {}), by.get((n, "sketch"), {}), by.get((n, "theta"), {})
        seeds = sorted(set(ref) & set(sk))
        if seeds:
            rel = [float(sk[s]["late_xi"]) / float(ref[s]["late_xi"]) for s in seeds]
            cost = [int(sk[s]["rounds"]) / int(ref[s]["rounds"]) for s in seeds]
            worst = max(abs(r - 1) for r in rel)
            verdict = "holds" if worst <= 0.25 else "**does not hold**"
            out.append(
                f"- n = {n}: ¼ · max Ξ̂ reaches the late Ξ of ¼ · max Ξ within 25 % on every "
                f"seed ({len(seeds)}): {verdict} (ratio {ci(rel)}, worst seed off by "
                f"{100 * worst:.1f} %), at {ci(cost)} × its rounds"
            )
        seeds = sorted(set(ref) & set(th))
        if seeds:
            rel = [float(th[s]["late_xi"]) / float(ref[s]["late_xi"]) for s in seeds]
            out.append(f"- n = {n}: ¼ · max Θ leaves the late Ξ at {ci(rel)} × that of ¼ · max Ξ")
        rows = {int(r["round"]): r for r in late if int(r["n"]) == n and r["cell"] == "theta"}
        if 1 in rows and 2 in rows:
            t = float(rows[1]["theta"]) / float(rows[2]["theta"])
            x = float(rows[1]["xi"]) / float(rows[2]["xi"])
            out.append(
                f"- n = {n}, ¼ · max Θ, late: the second round of a step divides Θ by {t:.2f} "
                f"and Ξ by {x:.3f}"
            )
        rows = {int(r["round"]): r for r in late if int(r["n"]) == n and r["cell"] == "xi"}
        if len(rows) >= 2:
            last = max(k for k, r in rows.items() if int(r["count"]) >= int(rows[1]["count"]) // 2)
            first = float(rows[1]["theta_over_xi"])
            out.append(
                f"- n = {n}, ¼ · max Ξ, late: Θ / Ξ falls from {first:.3g}"
                f" after round 1 to {float(rows[last]['theta_over_xi']):.3g} after round {last} "
                f"of the same step, while Ξ falls by "
                f"{100 * (1 - float(rows[last]['xi']) / float(rows[1]['xi'])):.1f} %"
            )
    out.append("")
    return out


PRESET_CELLS = {"none": ("none", ""), "theta": ("1/4", "theta"), "xi": ("1/4", "xi"),
                "sketch": ("1/4", "sketch")}  # fmt: skip
"""This study's cells → (target, statistic) of the consensus-control preset's phase-1 rows."""


def _consensus_rows() -> list[dict[str, Any]]:
    return read_runs_csv(CONSENSUS) if CONSENSUS.is_file() else []


def _accuracy(
    ns: Sequence[int],
    by: dict[tuple[int, str], dict[int, dict[str, str]]],
    rows: Sequence[dict[str, Any]],
) -> tuple[list[str], dict[tuple[int, str], tuple[int, int]]]:
    """The accuracy section (from the consensus-control runs of the same cells) and, per
    (n, cell), (seeds whose phase-1 rounds there equal this study's, seeds compared)."""
    same: dict[tuple[int, str], tuple[int, int]] = {}
    body = []
    for n in ns:
        acc_all = {r["seed"]: 100 * r["accuracy_avg_model"] for r in rows
                   if r["n"] == n and r["phase"] == "all" and r["status"] == "ok"}  # fmt: skip
        for cell in CELLS:
            target, stat = PRESET_CELLS[cell]
            mine = {
                r["seed"]: r
                for r in rows
                if (r["n"], r["phase"], r["target"], r["statistic"]) == (n, "1", target, stat)
                and r["status"] == "ok"
            }
            if not mine:
                continue
            ss = sorted(mine)
            study = by.get((n, cell), {})
            seen = [s for s in ss if s in study]
            equal = sum(
                int(study[s]["rounds"]) == mine[s]["gossip_rounds"]
                and mine[s]["late_xi"] is not None
                and math.isclose(float(study[s]["late_xi"]), mine[s]["late_xi"], rel_tol=1e-4)
                for s in seen
            )
            same[(n, cell)] = (equal, len(seen))
            acc = [100 * mine[s]["accuracy_avg_model"] for s in ss]
            d_all = [100 * mine[s]["accuracy_avg_model"] - acc_all[s] for s in ss if s in acc_all]
            if cell == "xi":
                vs_xi = ""
            else:
                k, mean, half = paired_accuracy(rows, n, (target, stat), ("1/4", "xi"))
                sep = separated(mean, half)
                vs_xi = f"{mean:+.2f} ± {half:.2f} ({'separated' if sep else 'not separated'})"
                vs_xi = vs_xi if len(k) >= 2 else ""
            body.append(
                f"| {n} | {LABELS[cell]} | {len(ss)} | {_pm2(acc)} | "
                f"{_pm2(d_all) if d_all else ''} | {vs_xi} | {equal} of {len(seen)} |"
            )
    if not body:
        return [], same
    return [
        "## Accuracy (the consensus-control runs of the same cells)",
        "",
        "The same seeds and recipe trained to the end (phases 2–3 at exact averaging) by the "
        "consensus-control preset (its rows `p1-none`, `p1-1over4-theta`, `p1-1over4-xi`, "
        "`p1-1over4-sketch`): test accuracy of the averaged model, mean ± 95 % CI; Δ paired on "
        "the seed, *separated* when the interval excludes 0. The last column counts the seeds "
        "whose phase-1 gossip rounds and late Ξ there equal this study's (Ξ to the 6 digits "
        "cells.csv keeps): the same trajectory.",
        "",
        "| n | cell | seeds | accuracy (%) | Δ vs all-reduce (pp) | Δ vs ¼ · max Ξ (pp) | "
        "same phase 1 |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
        *body,
        "",
    ], same


def _pm2(values: Sequence[float]) -> str:
    """mean ± the 95 % Student-t half-width, two decimals (`CellStats.ci95`, the consensus-control
    report's interval)."""
    stats = CellStats(tuple(values), len(values))
    return f"{stats.mean:.2f}" if len(values) < 2 else f"{stats.mean:.2f} ± {stats.ci95:.2f}"


def _late(late: Sequence[dict[str, str]], n: int, cell: str) -> dict[int, dict[str, str]]:
    return {int(r["round"]): r for r in late if int(r["n"]) == n and r["cell"] == cell}


def _span(values: Sequence[float], fmt: str, sep: str = "–") -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}{sep}{hi:{fmt}}"


def _cell_name(c: dict[str, Any]) -> str:
    return f"{'¼' if c['target'] == '1/4' else '⅛'} · max Θ at n = {c['n']}"


def _two_rounds(
    at_two: Sequence[dict[str, Any]], beyond: Sequence[dict[str, Any]], ratios: Sequence[float]
) -> str:
    """Where the Θ cells of the consensus-control report stop after round 2, from their late
    rounds per step: the cells that do, and those that go on (named, with their rounds)."""
    if not at_two and not beyond:
        return " on most steps"
    text = ""
    if at_two:
        text += (
            f" on essentially every step in {', '.join(map(_cell_name, at_two))} (late rounds "
            f"per step {_span([c['late_rounds'] for c in at_two], '.2f')})"
        )
    if beyond:
        text += (", but not in " if at_two else " rarely: not in ") + ", ".join(
            f"{_cell_name(c)} ({c['late_rounds']:.1f} rounds per step late)" for c in beyond
        )
    if ratios:
        text += (
            f" — {_span(ratios, '.2f')}× the uncontrolled rounds over the consensus-control "
            "report's ¼ and ⅛ · max Θ cells"
        )
    return text


def _reading(
    ns: Sequence[int],
    by: dict[tuple[int, str], dict[int, dict[str, str]]],
    late: Sequence[dict[str, str]],
    rows: Sequence[dict[str, Any]],
    same: dict[tuple[int, str], tuple[int, int]],
) -> list[str]:
    """The reading; every number computed from the tables (and the consensus-control runs)."""
    drop_t, drop_x, fall = [], [], []
    for n in ns:
        th = _late(late, n, "theta")
        if 1 in th and 2 in th:
            drop_t.append(float(th[1]["theta"]) / float(th[2]["theta"]))
            drop_x.append(100 * (1 - float(th[2]["xi"]) / float(th[1]["xi"])))
        xi = _late(late, n, "xi")
        if len(xi) >= 2:
            last = max(k for k, r in xi.items() if int(r["count"]) >= int(xi[1]["count"]) // 2)
            fall.append(f"{float(xi[1]['theta_over_xi']) / float(xi[last]['theta_over_xi']):.0f}× "
                        f"at n = {n}")  # fmt: skip
    cells = {(c["n"], c["target"], c["statistic"]): c for c in summarize(rows) if c["phase"] == "1"}
    theta_cells = [c for (n, t, st), c in cells.items()
                   if n in ns and st == "theta" and t in ("1/4", "1/8")]  # fmt: skip
    theta_ratios = [c["rounds_ratio"] for c in theta_cells]
    # a cell "stops after round 2" when its late rounds per step are within 0.15 of 2
    at_two = [c for c in theta_cells if abs(c["late_rounds"] - 2.0) <= 0.15]
    beyond = [c for c in theta_cells if c not in at_two and not math.isnan(c["late_rounds"])]
    gaps = "".join(f", {1 - 2 * math.cos(2 * math.pi / n) / 3 - 1 / 3:.2g} at n = {n}" for n in ns)
    p1 = (
        "**Why a target on Θ stops at two rounds.** A step's local updates inject a disagreement "
        "that is nearly independent across peers — spread over all modes of W, so mostly over "
        "the many fast ones, which Θ weighs by (1 − λ)². Round 1 of the step sees it whole: Θ "
        "after round 1 is about the same whether Ξ is large or small (compare round 1 of the "
        "uncontrolled and the ¼ · max Ξ runs in the tables). One round of the ring removes the "
        f"fast part, and Θ after round 2 drops {_span(drop_t, '.2f')}× while Ξ drops "
        f"{_span(drop_x, '.1f')} % (the ¼ · max Θ rows, late): what is left sits in the ring's "
        f"slow modes (λ₂ = ⅓ + ⅔ cos(2π/n), so 1 − λ₂ ≈ {gaps[2:]}), which carry nearly all of "
        "Ξ and almost none of Θ. The calibration takes max Θ from round 1 of uncontrolled steps, "
        "early in the phase (the table of maxima: max Θ falls on an early step, at the highest "
        "learning rate; max Ξ on a late one), so ¼ · max Θ and ⅛ · max Θ both lie between Θ "
        "after round 2 and Θ after round 1: the stop rule fires after round 2"
        + _two_rounds(at_two, beyond, theta_ratios)
        + ". Both hypotheses hold, and they compound: Θ/Ξ shrinks within a step as the "
        "disagreement concentrates in slow modes (over the rounds of a late ¼ · max Ξ step it "
        f"falls {', '.join(fall)}), and the calibrated target is one Θ meets after one repeat."
    )
    rel, cost, cal, sd = {}, {}, [], []
    within: dict[int, bool] = {}
    for n in ns:
        ref, sk = by.get((n, "xi"), {}), by.get((n, "sketch"), {})
        seeds = sorted(set(ref) & set(sk))
        if seeds:
            within[n] = all(
                abs(float(sk[s]["late_xi"]) / float(ref[s]["late_xi"]) - 1) <= 0.25 for s in seeds
            )
            rel[n] = statistics.fmean(float(sk[s]["late_xi"]) / float(ref[s]["late_xi"])
                                      for s in seeds)  # fmt: skip
            cost[n] = statistics.fmean(int(sk[s]["rounds"]) / int(ref[s]["rounds"]) for s in seeds)
        cal += [
            float(r["max_sketch"]) / float(r["max_xi"]) for r in by.get((n, "none"), {}).values()
        ]
        sd += [float(r["sketch_over_xi_sd"]) for (nn, _), d in by.items() if nn == n
               for r in d.values()]  # fmt: skip
    means = [float(r["sketch_over_xi_mean"]) for d in by.values() for r in d.values()]
    p2 = (
        "**What tracks Ξ.** No rescaling of Θ by a constant helps (a calibrated target is "
        "relative, so a constant cancels), and a spectral correction would have to know how the "
        "disagreement spreads over the modes, which changes within a step. The sketch statistic "
        f"measures Ξ itself: Ξ̂/Ξ stays near 1 (per-run means {_span(means, '.3f')}) with a "
        f"per-round standard deviation of {_span([100 * v for v in sd], '.0f')} % (the accuracy "
        "lines above), whatever the round of the step. Its target "
        + (
            "lands within the 25 % asked for of the exact-Ξ target's Ξ on every seed"
            if within and all(within.values())
            else "does not land within the 25 % asked for of the exact-Ξ target's Ξ on every seed "
            "at " + ", ".join(f"n = {n}" for n, ok in within.items() if not ok)
        )
        + " (the checks above); the remaining offset (Ξ on average "
        + ", ".join(
            f"{100 * (v - 1):.0f} % above the exact target's at n = {n}" for n, v in rel.items()
        )
        + ") comes from the calibration's max, which picks the upward noise of Ξ̂ among the "
        "phase's steps (max Ξ̂ / max Ξ in the calibration tables: "
        f"{_span(cal, '.2f') if cal else '—'}), so the target itself sits that much higher — and "
        "the rounds follow: "
        + ", ".join(f"{v:.2f} × the exact target's at n = {n}" for n, v in cost.items())
        + ", far more than Θ's two per step. A larger sketch (k) or a calibration that smooths "
        "Ξ̂ over steps before taking the max would shrink that offset."
    )
    agree = [f"n = {n}, {LABELS[c]}: {e} of {k}" for (n, c), (e, k) in sorted(same.items())]
    p3 = (
        "**Same runs as the consensus-control report.** Seeds whose phase-1 gossip rounds and "
        "late Ξ in that report's runs equal this study's (the last column of the accuracy "
        "table; logging the other statistics does not change the trajectory): "
        + ("; ".join(agree) if agree else "none compared")
        + "."
    )
    p4 = (
        "**Not measured here.** The processes engine at this scale (the engines' agreement is "
        "tested on a small run: tests/integration/test_orchestrated_sketch.py) and the other "
        "phases" + ("" if same else "; accuracy (the runs stop at the end of phase 1)") + "."
    )
    return ["## Reading", "", p1, "", p2, "", p3, "", p4, ""]


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--peers", type=int, default=64)
    r.add_argument("--seeds", default="0,1,2,3,4")
    r.add_argument("--cells", default="theta,xi,sketch")
    r.add_argument("--epochs", type=int, default=None, help="default: the preset's 60")
    r.add_argument("--out", required=True)
    t = sub.add_parser("tables")
    t.add_argument("dirs", nargs="+")
    t.add_argument("--merge", action="store_true", help="add to this folder's cells/rounds.csv")
    sub.add_parser("report")
    args = p.parse_args(argv)
    if args.cmd == "run":
        cmd_run(args)
    elif args.cmd == "tables":
        cmd_tables([Path(d) for d in args.dirs], merge=args.merge)
    else:
        cmd_report()


if __name__ == "__main__":
    main()
