"""Exact diffusion (Yuan, Ying, Zhao & Sayed, "Exact Diffusion for Distributed Optimization and
Learning — Part I: Algorithm Development", IEEE Trans. Signal Processing 67(3), 2019).
docs/algorithms.md#d2-and-exact-diffusion.

Adapt, correct, combine — ψ^{t+1} = x^t − η g^t, φ^{t+1} = ψ^{t+1} + x^t − ψ^t,
x^{t+1} = W̄ φ^{t+1} — which is D²'s recursion with W̄ = (W + I)/2 in place of W:

    x^{t+1} = W̄ (2 x^t − x^{t−1} − η g^t + η g^{t−1}),        W̄ = (W + I) / 2

Implemented exactly as `concord.core.algorithms.d2` (correction form of the RelaySGD code,
``paper-figures/algorithms.py::exact_diffusion``): u_i the local optimizer's update, c⁰ = 0,

    x_i ← [W̄ (x + u + c)]_i = ½ (x_i + u_i + c_i) + ½ Σ_j w_ij (x_j + u_j + c_j)
    c_i ← x_i^{new} − x_i^{old} − u_i

The half-step with the identity is local: one gossip round with W per step, one d-vector per
directed edge, like D-SGD. λ_min(W̄) = (1 + λ_min(W)) / 2 ≥ 0 > −1/3 for every doubly
stochastic W, so — unlike D² — any topology of the schedule works (ring with weights 1/3
included); the price is a slower mixing (spectral gap halved).

Shapes, invariants, phases and control: as `concord.core.algorithms.d2` — tensors [k, d]; Σ_i c_i =
0 and x̄ ← x̄ + ū; an exact phase uses W = 11ᵀ/n itself (exact averaging, not (11ᵀ/n + I)/2) and
keeps the correction; consensus control does not repeat rounds (one round per step, its θ_i
reported once, "repeat" ignored). Hyperparameters: none of its own; the local optimizer's.
"""

from __future__ import annotations

import torch

from concord.core.algorithms.base import StepContext, register_algorithm
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.correction import gossip_once
from concord.core.algorithms.d2 import D2
from concord.core.comm import MixOutcome


@register_algorithm
class ExactDiffusion(D2):
    spec = CATALOG["exact-diffusion"]

    def mixing(self, x: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, MixOutcome]:
        """One round of W̄ = (W + I)/2: the gossip with W, averaged with the own row."""
        mixed, outcome = gossip_once(x, ctx.matrix(ctx.round_offset), ctx)
        return (mixed + x).mul_(0.5), outcome
