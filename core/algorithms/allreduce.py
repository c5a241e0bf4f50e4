"""All-reduce (centralized) baseline.

Every replica takes its local optimizer step, then parameters are averaged exactly over all n
replicas: x_i ← (1/n) Σ_j x_j. With plain SGD this is mini-batch SGD on the union of the local
batches. Reference: ``algorithms.py::allreduce`` of epfml/relaysgd (docs/algorithms.md#all-reduce).

Hyperparameters: those of the local optimizer (`concord.core.algorithms.optim.SGDConfig`).
Invariant: after every step all rows of ``x`` are equal.
"""

from __future__ import annotations

import torch

from concord.core.algorithms.base import Algorithm, StepContext, StepReport, register_algorithm
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.optim import LocalSGD


@register_algorithm
class AllReduce(Algorithm):
    spec = CATALOG["allreduce"]
    portable_state = frozenset({"momentum"})

    def __init__(self, optimizer: LocalSGD) -> None:
        self.optimizer = optimizer

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        self.optimizer.step(x, grad, ctx.lr)
        x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
        return StepReport(exact_average=True)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
