"""A shared random sketch of the models, from which the orchestrator estimates the exact
consensus distance Ξ without moving a model (control statistic ``sketch``).

Why: the estimator Θ of `concord.core.control.consensus` sees a disagreement mode of the gossip
matrix W with eigenvalue λ weighted by (1 − λ); on a ring the slow modes (λ near 1), which carry
most of Ξ, are almost invisible to it (docs/algorithms.md#consensus-control). A sketch does not
look through W at all: every peer maps its model x_i ∈ R^d to s_i = S_t x_i ∈ R^k with the same
random S_t, and since S_t is linear, s_i − s̄ = S_t (x_i − x̄), so

    Ξ̂² = (1/n) Σ_i ‖s_i − s̄‖²  estimates  Ξ² = (1/n) Σ_i ‖x_i − x̄‖²

without bias over the draw of S_t (`concord.core.control.statistic.xi_from_sketches`).

S_t (one per training step ``step``, the same on every peer, re-drawn each step so that its
error is noise across steps rather than a bias that persists): a random permutation π of the d
coordinates cut into k contiguous buckets of m = ⌈d/k⌉ positions, and random signs σ ∈ {±1}^d;
s_b = Σ_{j in bucket b} σ_j x_{π(j)} (a count sketch with equal buckets). E[s_b²] over the signs
is the energy of bucket b, so E‖S u‖² = ‖u‖²; its relative standard deviation is at most
sqrt(2/k) for a single vector u and shrinks with the number of independent directions the
disagreement spreads over. Drawing S_t costs one permutation of d per step; applying it, a
gather and a sum over d per model and round. On the wire: k floats per peer and round, next to θ_i.

Bits: every row is sketched alone, on a [1, d] view in float64 (`sketch_rows`), so the n rows of
the vectorized engine and a peer's own row give the same bits; the reduction to Ξ̂ is
``math.fsum`` (torch-free, shared with the orchestrator).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from concord.core.control.statistic import SKETCH_SIZE

__all__ = ["SKETCH_SEED", "SKETCH_SIZE", "sketch_map", "sketch_rows"]

SKETCH_SEED = 0x5E7C_0000
"""S_t is drawn from ``torch.Generator().manual_seed(SKETCH_SEED + step)``: known to every peer
without a message, independent of the run's seed (the sketch is not part of the experiment)."""

_cache: dict[tuple[int, int, int], tuple[Tensor, Tensor]] = {}


def sketch_map(d: int, step: int, k: int = SKETCH_SIZE) -> tuple[Tensor, Tensor]:
    """S_t as (π, σ): a permutation of range(d) (int64) and signs ±1 (float64), both [d], on
    the CPU. Cached for the last (d, step, k) asked (a step's rounds reuse it)."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"sketch of d = {d!r} coordinates; d must be an integer ≥ 1")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"sketch step = {step!r}; must be an integer ≥ 0")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"sketch size k = {k!r}; must be an integer ≥ 1")
    key = (d, step, k)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    gen = torch.Generator().manual_seed(SKETCH_SEED + step)
    perm = torch.randperm(d, generator=gen)
    signs = torch.randint(0, 2, (d,), generator=gen).to(torch.float64).mul_(2.0).sub_(1.0)
    _cache.clear()
    _cache[key] = (perm, signs)
    return perm, signs


def sketch_rows(x: Tensor, step: int, k: int = SKETCH_SIZE) -> Tensor:
    """The sketch s_i = S_t x_i of every row of ``x`` ([rows, d], any floating dtype): a
    [rows, k] float64 tensor on the CPU. Row by row on a [1, d] view, so a row's bits do not
    depend on the rows around it (a peer sketches its own row, the vectorized engine all n)."""
    if not isinstance(x, Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(
            "sketch_rows needs a floating [rows, d] tensor, got "
            f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}"
        )
    rows, d = x.shape
    perm, signs = sketch_map(d, step, k)
    m = math.ceil(d / k)
    buf = torch.zeros(k * m, dtype=torch.float64)
    out = torch.empty(rows, k, dtype=torch.float64)
    host = x.detach().cpu()
    for i in range(rows):
        torch.mul(host[i : i + 1, perm].to(torch.float64)[0], signs, out=buf[:d])
        torch.sum(buf.view(1, k, m), dim=2, out=out[i : i + 1])
    return out
