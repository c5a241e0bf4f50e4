"""Gradient tracking, GT-DSGD / DSGT (Pu & Nedić, "Distributed stochastic gradient tracking
methods", Math. Programming 2021; Zhang & You, "Decentralized stochastic gradient tracking for
non-convex empirical risk minimization", 2019). docs/algorithms.md#gradient-tracking.

Classical form, with y_i tracking the average gradient:

    x_i^{t+1} = Σ_j w_ij (x_j^t − η y_j^t)
    y_i^{t+1} = Σ_j w_ij y_j^t + g_i^{t+1} − g_i^t,       y_i^0 = g_i^0

Implemented in the *correction* form of the RelaySGD code (``algorithms.py::gradient_tracking``
of epfml/relaysgd), which composes with any local optimizer (momentum, weight decay): with the
tracker c_i (c⁰ = 0) and u_i the local optimizer's update (x_i after its step − x_i before),

    x_i ← Σ_j w_ij (x_j + u_j + c_j)                     gossip of the corrected model
    c_i ← Σ_j w_ij (c_j + u_j) − u_i                     gossip of the tracker message

With plain SGD (u = −η g) and y = g − c/η this is the classical recursion exactly (tested to
float64 round-off). Each gossip round therefore moves **two d-vectors per directed edge (2× the
bytes of D-SGD)**: the corrected model through `Comm.mix` and the tracker message c + u through
`Comm.exchange` at the same (step, round), with the same W. (One concatenated [x, c + u] message
of 2d values would be a single mix, but a peer's transport accepts only tensors of the model's
dimension d, so the tracker travels as per-edge messages of d values; the bytes are the same.)
The model may travel as the run's fp16/bf16 cast (the own remainder is kept, `base`); the
tracker travels raw float32.

Shapes: ``x``, ``grad`` and the tracker c are [k, d] (rows = local replicas).
Invariants: W symmetric and doubly stochastic ⇒ Σ_i c_i = 0 at all times (up to float round-off)
and the mean model moves by the mean local update, x̄ ← x̄ + ū, exactly as all-reduce SGD would.
At a consensual fixed point c_i = ū − u_i: each replica's step is corrected to the average one,
so heterogeneous data leave no error floor (unlike D-SGD, docs/algorithms.md#reproduction-targets).

Phases and control:

* gossip phase, consensus control: the tracker is mixed once per step, with the matrix of the
  step's first round; control's extra rounds re-mix the model only (`gossip_rounds`: the θ
  statistic, the controller and the rounds count as for D-SGD). The fixed point is unchanged
  (c_i + u_i = ū is consensual there, so re-mixing the model does not move it), and the tracker
  update keeps Σ_i c_i = 0 for any number of model rounds.
* exact phase: x ← mean(x + u + c) (= x̄ + ū, the all-reduce step) and the tracker is reset to
  0 on every replica — consistent everywhere and mean-preserving; the next gossip step starts
  tracking afresh, as at t = 0.

Hyperparameters: none of its own; the local optimizer's (lr η > 0, momentum μ ∈ [0, 1), weight
decay ≥ 0). Message loss: a missing tracker message is left out and the weights renormalised,
like a missing model (the invariant Σ c = 0 then holds only approximately).
"""

from __future__ import annotations

import torch

from concord.core.algorithms.base import (
    Algorithm,
    StepContext,
    StepReport,
    gossip_rounds,
    register_algorithm,
)
from concord.core.algorithms.buffers import buffers_state, restored
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.correction import check_state, exchange_mix, local_update
from concord.core.algorithms.optim import LocalSGD
from concord.core.comm import Comm


@register_algorithm
class GradientTracking(Algorithm):
    spec = CATALOG["gradient-tracking"]

    def __init__(self, optimizer: LocalSGD) -> None:
        self.optimizer = optimizer
        self.tracker: torch.Tensor | None = None  # c [k, d]

    def setup(self, x: torch.Tensor, comm: Comm) -> None:
        """c⁰ = 0."""
        self.tracker = torch.zeros_like(x)

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        c = self.tracker = check_state("gradient-tracking", self.tracker, x)
        u = local_update(self.optimizer, x, grad, ctx.lr)
        x.add_(u).add_(c)
        if ctx.phase.mode == "exact":
            x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
            c.zero_()
            return StepReport(exact_average=True)
        index = ctx.round_offset
        message = c.add_(u)  # c + u, in place: the old tracker is not needed any more
        mixed = exchange_mix(message, ctx.matrix(index), ctx.comm, step=ctx.step, round=index)
        c.copy_(mixed.sub_(u))
        return gossip_rounds(x, ctx)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return buffers_state(self.optimizer.state_dict(), tracker=self.tracker)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
        self.tracker = restored(state, "tracker")
