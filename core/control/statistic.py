"""The scalar arithmetic of consensus control, torch-free: Θ from the peers' θ_i, and the means
the controller is fed (the adaptive target's mean gradient norm).

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
from collections.abc import Iterable

__all__ = ["mean_of", "theta_from_locals"]


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
