"""D-SGD (D-PSGD, Lian et al. 2017) in the "local step, then gossip" form used by Consensus Control
(Kong et al., ICML 2021) and RelaySGD:

    x_i^{t+½} = x_i^t − η · d_i^t        (local SGD step; local Nesterov momentum, weight decay)
    x_i^{t+1} = Σ_j w_ij x_j^{t+½}       (one or more gossip rounds with the phase's W)

With ``overlap = true`` the step takes Lian et al.'s own "gossip, then local step" form instead,
x_i^{t+1} = Σ_j w_ij x_j^t − η · d_i^t with d_i^t from the gradient at x_i^t, so the gossip of x^t
runs while the gradient is computed (`concord.core.algorithms.overlap`,
docs/algorithms.md#overlap).

Each replica keeps its own momentum buffer; it is not gossiped. In an "exact" phase of the plan
the gossip is replaced by exact averaging (dec-phase-k experiments), and in a controlled phase the
gossip is repeated until the consensus statistic meets its target
(`concord.core.control.controller`).

Hyperparameters: lr η > 0 (from the schedule), momentum μ ∈ [0, 1), weight decay ≥ 0.
Invariants: W symmetric and doubly stochastic, so gossip preserves the mean x̄ exactly.
"""

from __future__ import annotations

import torch

from concord.core.algorithms.base import (
    Algorithm,
    StepContext,
    StepReport,
    communicate,
    register_algorithm,
)
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.optim import LocalSGD
from concord.core.algorithms.overlap import direction_buffer, finish_exchange, start_exchange


@register_algorithm
class DSGD(Algorithm):
    spec = CATALOG["dsgd"]
    portable_state = frozenset({"momentum"})

    def __init__(self, optimizer: LocalSGD) -> None:
        self.optimizer = optimizer
        self._direction: torch.Tensor | None = None  # overlap: d^t, kept across steps

    def start(self, x: torch.Tensor, ctx: StepContext) -> None:
        start_exchange(x, ctx, exact=ctx.phase.mode == "exact")

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        if ctx.inflight is not None:  # overlap: x is still x^t, its exchange in flight
            self._direction = direction_buffer(self._direction, x)
            direction = self.optimizer.direction(x, grad, out=self._direction)
            return finish_exchange(x, direction, ctx)
        self.optimizer.step(x, grad, ctx.lr)
        return communicate(x, ctx)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
