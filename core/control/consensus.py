"""Consensus distance Ξ and its locally computable estimator Θ (Kong et al., ICML 2021).

Definitions (Kong, Lin, Koloskova, Jaggi, Stich, "Consensus Control for Decentralized Deep
Learning", ICML 2021, §3 and Appendix A; see
docs/algorithms.md#consensus-distance-and-the-estimator):

* **Consensus distance** of n replicas stacked as rows of ``X`` ([n, d]):
  Ξ² = (1/n) Σ_i ‖x_i − x̄‖² = (1/n)‖X − X̄‖_F², i.e. the sum over coordinates of the
  *population* variance across replicas (as in ``epfml/topology-in-decentralized-learning``).
* **Local statistic** after one gossip round x_i ← Σ_j w_ij x_j: θ_i = ‖x_i(after) − x_i(before)‖²
  (the paper's ‖Σ_j w_ij x_j − x_i‖²). Every node has it locally; only the scalar needs an
  all-reduce.
* **Estimator** Θ = sqrt((1/n) Σ_i θ_i), computed from Python floats in exactly one place,
  `concord.core.control.statistic.theta_from_locals` (torch-free; `theta` below feeds it). For
  a symmetric doubly stochastic W with eigenvalues 1 = λ_1 ≥ λ_2 ≥ … ≥ λ_n > −1 (with X taken
  *before* the round): (1 − λ_2)² Ξ² ≤ Θ² ≤ (1 − λ_n)² Ξ² ≤ 4 Ξ², hence
  Ξ ≤ Θ / (1 − λ_2) ≤ (2/p) Θ with the mixing parameter p = 1 − max(|λ_2|, |λ_n|)² (the
  paper's Lemma A.1 constant).
  The lower bound is attained by low-frequency (smooth) disagreement, which is what D-SGD
  produces, so Θ can under-state Ξ by up to 1/(1 − λ_2) on sparse graphs: calibrate targets on
  the same statistic the controller is fed (see `concord.core.control.controller.Calibration`).

All reductions are done in float64 whatever the input dtype, so that float32 training does not
lose the (small) differences between replicas; results are returned as Python floats or float64
tensors on the input's device. θ_i reduces a float32 difference in float64 (`local_theta`): the
difference of two float32 models rounds once, to 2⁻²⁴ relative per coordinate, which moves θ_i
by ~1e-12 relative and saves the two float64 copies of the model a round would otherwise make.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from concord.core.control.sketch import sketch_rows
from concord.core.control.statistic import theta_from_locals, xi_from_sketches

__all__ = [
    "consensus_distance",
    "grad_norms",
    "local_theta",
    "round_statistic",
    "sketch_xi",
    "squared_row_norms",
    "theta",
]


def _matrix(X: Tensor, name: str) -> Tensor:
    """View ``X`` ([k, ...]) as [k, d] in its own dtype; reject tensors without a replica
    dimension."""
    if not isinstance(X, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [k, d], got {type(X).__name__}")
    if X.dim() < 2:
        raise ValueError(
            f"{name} must have shape [k, d] (replicas × parameters), got shape {tuple(X.shape)}"
        )
    if X.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one replica, got shape {tuple(X.shape)}")
    if not X.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {X.dtype}")
    return X.reshape(X.shape[0], -1)


def _rows(X: Tensor, name: str) -> Tensor:
    """`_matrix` as float64."""
    return _matrix(X, name).to(torch.float64)


def consensus_distance(X: Tensor) -> float:
    """Exact consensus distance Ξ of the replicas in ``X``.

    Args:
        X: [n, d] tensor, row i = flattened parameters of replica i (trailing dims beyond the
            second are flattened). Any floating dtype; computed in float64.

    Returns:
        Ξ = sqrt((1/n) ‖X − X̄‖_F²) ≥ 0; exactly 0.0 when n = 1 or all rows are equal.
    """
    Xd = _rows(X, "X")
    dev = Xd - Xd.mean(dim=0, keepdim=True)
    return math.sqrt(float(dev.square().sum()) / Xd.shape[0])


def local_theta(x_before: Tensor, x_after: Tensor) -> Tensor:
    """Per-replica statistic θ_i = ‖x_i(after round) − x_i(before round)‖².

    The difference is taken in the inputs' promoted dtype (float32 for float32 models) and its
    squared norm accumulated in float64 (`squared_row_norms`).

    Args:
        x_before: [k, d] local replicas before one gossip round.
        x_after: [k, d] the same replicas after that round (same shape).

    Returns:
        [k] float64 tensor of θ_i ≥ 0, on the inputs' device.
    """
    before = _matrix(x_before, "x_before")
    after = _matrix(x_after, "x_after")
    if before.shape != after.shape:
        raise ValueError(
            f"x_before and x_after must have the same shape, got {tuple(x_before.shape)} "
            f"and {tuple(x_after.shape)}"
        )
    return squared_row_norms(after - before)


def squared_row_norms(D: Tensor) -> Tensor:
    """‖d_i‖² of every row of ``D`` ([k, d], any floating dtype), accumulated in float64 without
    a float64 copy of ``D``: [k] float64. The one reduction behind θ_i, whether a row is
    reduced alone (a peer) or among others (`concord.core.algorithms.base.assign_mixed`)."""
    norms: Tensor = torch.linalg.vector_norm(D, dim=1, dtype=torch.float64)
    return norms.square_()


def theta(thetas: Tensor | Sequence[float]) -> float:
    """Estimator Θ = sqrt(mean_i θ_i) from the n local statistics of one round.

    The tensor front of `concord.core.control.statistic.theta_from_locals` (torch-free, the
    orchestrator's): the θ_i are read as Python floats and reduced there, so both give the same
    bits for the same values.

    Args:
        thetas: the θ_i of *all* n replicas (a [n] tensor or a sequence of floats), each ≥ 0
            and finite — in a distributed run this is the result of a scalar all-reduce.

    Returns:
        Θ ≥ 0 (Θ² = (1/n) Σ_i θ_i, summed with ``math.fsum``).
    """
    if isinstance(thetas, Tensor):
        values = [float(v) for v in thetas.detach().reshape(-1).to(torch.float64).cpu()]
    else:
        values = [float(v) for v in thetas]
    return theta_from_locals(values)


def grad_norms(G: Tensor) -> Tensor:
    """Per-replica gradient norms ‖g_i‖₂ (input of the adaptive consensus target).

    Args:
        G: [k, d] flattened local gradients, one row per replica.

    Returns:
        [k] float64 tensor of ‖g_i‖ ≥ 0. The adaptive target uses their mean over all n replicas
        (a scalar all-reduce in a distributed run).
    """
    norms: Tensor = torch.linalg.vector_norm(_matrix(G, "G"), dim=1, dtype=torch.float64)
    return norms


def round_statistic(statistic: str, step: int, x: Tensor, theta_local: Tensor) -> float:
    """The controller's statistic after a gossip round of ``step`` from all n replicas ``x``
    ([n, d], after the round) and their θ_i: Θ (``"theta"``) or the sketch estimate Ξ̂ of the
    consensus distance (``"sketch"``, `concord.core.control.sketch`). The exact Ξ (``"xi"``)
    is the engine's own meter and is refused here."""
    if statistic == "theta":
        return theta(theta_local)
    if statistic == "sketch":
        return sketch_xi(x, step)
    raise ValueError(f"round_statistic: statistic = {statistic!r}; valid here: theta, sketch")


def sketch_xi(x: Tensor, step: int) -> float:
    """Ξ̂, the estimate of the consensus distance of the n replicas ``x`` ([n, d]) from their
    sketches under step ``step``'s S_t (`concord.core.control.sketch`): the bits the
    orchestrator computes from the peers' sketches of the same models."""
    return xi_from_sketches(sketch_rows(x, step).tolist())
