"""The scalar arithmetic of consensus control, torch-free: Θ from the peers' θ_i, Ξ̂ from their
sketches (statistic ``sketch``), and the means the controller is fed (the adaptive target's mean
gradient norm).

This is the one place the estimator Θ = sqrt((1/n) Σ_i θ_i) (Kong et al., ICML 2021, App. A; see
`concord.core.control.consensus` for the definitions and bounds) is computed from Python floats.
`concord.core.control.consensus.theta` (the vectorized engine's, fed tensors) reduces its input
to floats and calls `theta_from_locals`; the orchestrator (`concord.orchestrator.rounds`), which
never imports torch, calls it directly on the θ_i the peers reported. Both therefore produce the
same bits.

Every sum is ``math.fsum`` (exactly rounded), so the result does not depend on the order the
values arrive in — the orchestrator files statistics by peer id, the engine by replica row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["SKETCH_SIZE", "mean_of", "theta_from_locals", "xi_from_sketches"]

SKETCH_SIZE = 64
"""k, the floats of a peer's sketch (`concord.core.control.sketch`): on the wire, k floats per
peer and round next to θ_i. The relative error of Ξ̂² is at most sqrt(2/k) ≈ 18 % for a
disagreement along one direction of parameter space, less when it spreads over many."""


def _floats(values: Iterable[float], what: str) -> list[float]:
    out = [float(v) for v in values]
    if not out:
        raise ValueError(f"{what} per replica, got an empty sequence")
    return out


def theta_from_locals(values: Iterable[float]) -> float:
    """Estimator Θ = sqrt(mean_i θ_i) from the local statistics of one gossip round.

    Args:
        values: the θ_i = ‖x_i(after) − x_i(before)‖² of the replicas that reported (all n in
            the vectorized engine; the live peers that reported, at the orchestrator), each a
            finite number ≥ 0.

    Returns:
        Θ ≥ 0 with Θ² = fsum(θ_i) / n.

    Raises:
        ValueError: no values, or a value that is negative or not finite.
    """
    thetas = _floats(values, "thetas must hold one θ_i")
    for i, v in enumerate(thetas):
        if not math.isfinite(v) or v < 0.0:
            raise ValueError(f"thetas[{i}] = {v!r}; each θ_i must be a finite number ≥ 0")
    return math.sqrt(math.fsum(thetas) / len(thetas))


def mean_of(values: Iterable[float]) -> float:
    """The exactly summed mean fsum(v) / n — e.g. the mean ‖g_i‖ of a step's first round, the
    input of the adaptive consensus target.

    Raises:
        ValueError: no values.
    """
    v = _floats(values, "values must hold one value")
    return math.fsum(v) / len(v)


def xi_from_sketches(sketches: Iterable[Sequence[float]]) -> float:
    """Ξ̂ = sqrt((1/n) Σ_i ‖s_i − s̄‖²), the estimate of the consensus distance Ξ from the peers'
    sketches s_i = S_t x_i of one round (control statistic ``sketch``;
    `concord.core.control.sketch`). Since S_t is linear, s_i − s̄ = S_t (x_i − x̄).

    Args:
        sketches: the k-vectors of the replicas that reported (all n in the vectorized engine;
            the live peers that reported, at the orchestrator), each of the same length k ≥ 1,
            finite.

    Returns:
        Ξ̂ ≥ 0: s̄_b = fsum_i(s_ib) / n per coordinate b, then fsum over i and b of
        (s_ib − s̄_b)², divided by n. Exactly rounded sums: the result does not depend on the
        order the peers' sketches arrive in.

    Raises:
        ValueError: no sketches, sketches of different lengths, an empty one, or a value that
            is not finite.
    """
    rows = [[float(v) for v in s] for s in sketches]
    if not rows:
        raise ValueError("sketches must hold one sketch per replica, got an empty sequence")
    k = len(rows[0])
    for i, row in enumerate(rows):
        if len(row) != k or k == 0:
            raise ValueError(
                f"sketches[{i}] has {len(row)} values; every sketch must have the same k ≥ 1 "
                f"(sketches[0] has {k})"
            )
        for b, v in enumerate(row):
            if not math.isfinite(v):
                raise ValueError(f"sketches[{i}][{b}] = {v!r}; must be finite")
    n = len(rows)
    means = [math.fsum(row[b] for row in rows) / n for b in range(k)]
    return math.sqrt(math.fsum((row[b] - means[b]) ** 2 for row in rows for b in range(k)) / n)
