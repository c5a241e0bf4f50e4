"""Paired tests between the consensus-control report's cells: which controlled phase-1 cells
are separated at 95 % from the uncontrolled run and from each other (paired differences of the
test accuracy over the seeds both cells ran, Student's t; `separation`, a bullet of the reading
of `concord.lab.presets.consensus`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from concord.lab.report import CellStats


def _ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % Student-t interval (`CellStats.ci95`)."""
    stats = CellStats(tuple(values), len(values))
    return stats.mean, stats.ci95


VARIANTS = (
    (("1/4", "xi"), "¼ · max Ξ"),
    (("1/4", "sketch"), "¼ · max Ξ̂"),
    (("1/2", "xi"), "½ · max Ξ"),
    (("1/2", "theta"), "½ · max Θ"),
    (("1/4", "theta"), "¼ · max Θ"),
    (("1/8", "theta"), "⅛ · max Θ"),
    (("adaptive", "theta"), "adaptive"),
)
"""The controlled phase-1 cells `separation` compares, in the order it lists them."""


def paired_accuracy(
    rows: Sequence[Mapping[str, Any]], n: int, a: tuple[str, str], b: tuple[str, str]
) -> tuple[list[int], float, float]:
    """Accuracy of phase-1 cell ``a`` minus cell ``b`` at ``n`` (pp), paired on the seeds both
    ran: (seeds, mean, half-width of the 95 % Student-t interval; NaN below two seeds)."""
    acc: dict[tuple[str, str], dict[int, float]] = {a: {}, b: {}}
    for r in rows:
        key = (r["target"], r["statistic"])
        if r["n"] == n and r["phase"] == "1" and key in acc and r["status"] == "ok":
            acc[key][r["seed"]] = 100 * float(r["accuracy_avg_model"])
    seeds = sorted(set(acc[a]) & set(acc[b]))
    if not seeds:
        return [], math.nan, math.nan
    mean, half = _ci([acc[a][s] - acc[b][s] for s in seeds])
    return seeds, mean, half


def separated(mean: float, half: float) -> bool | None:
    """Whether a paired difference is separated from 0 at 95 % (None: no interval)."""
    return None if math.isnan(half) else abs(mean) > half


def separation(rows: Sequence[Mapping[str, Any]], n: int) -> list[str]:
    """Which controlled phase-1 cells at ``n`` are separated at 95 % from the uncontrolled run
    and from each other (paired differences of accuracy over the seeds, Student's t): one
    bullet of the reading, empty with fewer than one controlled cell of two or more seeds."""
    present = [(key, name) for key, name in VARIANTS
               if len(paired_accuracy(rows, n, key, ("none", ""))[0]) >= 2]  # fmt: skip
    if not present:
        return []
    verdict = {True: "separated", False: "not separated", None: "no interval"}

    def diff(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, bool | None, int]:
        seeds, mean, half = paired_accuracy(rows, n, a, b)
        sep = separated(mean, half)
        return f"{mean:+.2f} ± {half:.2f} pp ({verdict[sep]})", sep, len(seeds)

    against = [(name, *diff(key, ("none", ""))) for key, name in present]
    pairs = [(f"{na} − {nb}", *diff(ka, kb))
             for i, (ka, na) in enumerate(present) for kb, nb in present[i + 1 :]]  # fmt: skip
    counts = sorted({k for *_, k in against + pairs})
    seeds_text = " or ".join(str(k) for k in counts)
    yes = [name for name, _, sep, _ in against if sep]
    no = [name for name, _, sep, _ in against if not sep]
    pair_yes = [name for name, _, sep, _ in pairs if sep]
    summary = (
        f"Separated from uncontrolled: {', '.join(yes) if yes else 'none'}"
        + (f"; not separated: {', '.join(no)}" if no else "")
        + ". Separated from each other: "
        + (", ".join(pair_yes) if pair_yes else "no pair")
        + "."
    )
    tests = len(against) + len(pairs)
    return [
        f"- **n = {n}, phase 1: which variants are separated at 95 %** (test accuracy, paired "
        f"differences over the {seeds_text} seeds both cells ran, mean ± the half-width of the "
        "95 % Student-t interval; *separated*: the interval excludes 0; "
        f"{tests} comparisons, not corrected for their number: about {tests / 20:.1f} of them "
        "would come out separated by chance alone if no cell differed). "
        + summary
        + " Against uncontrolled: "
        + "; ".join(f"{name} {text}" for name, text, _, _ in against)
        + "."
        + (
            " Between variants: " + "; ".join(f"{name}: {text}" for name, text, _, _ in pairs) + "."
            if pairs
            else ""
        )
    ]
