"""SGP — Stochastic Gradient Push (Assran, Loizou, Ballas & Rabbat, "Stochastic Gradient Push for
Distributed Deep Learning", ICML 2019): push-sum gossip (Kempe et al. 2003) with column-stochastic,
possibly directed and time-varying mixing matrices P^k. docs/algorithms.md#sgp.

State per replica i: the push-sum numerator x_i and weight w_i (w⁰ = 1); the model is the
de-biased z_i = x_i / w_i. Per step, with d_i the local optimizer's direction at z_i:

    x_i ← w_i z_i − η d_i                    gradient (momentum, weight decay) taken at z_i
    x_i ← Σ_j p_ij^k x_j;  w_i ← Σ_j p_ij^k w_j;  z_i = x_i / w_i     (one or more rounds k)

Column stochasticity (Σ_i p_ij = 1) preserves Σ_i x_i and Σ_i w_i = n, so z_i → Σ_j x_j / n
even when P is not doubly stochastic (rows need not sum to 1).

Engine tensor. The engines' parameter tensor holds the *models* z ([k, d]), so evaluation, the
consensus distance Ξ and checkpoints see the de-biased models; the numerators x = w·z are formed
inside the step, and the gradient point is z (the default `Algorithm.grad_point`).

Weights. Each replica keeps its own weight w_i (float64) and the weights travel with the
numerators: `Comm.mix(..., push=w)` sends w_j in the header of the frame that carries x_j
(``FrameHeader.push_weight``; receive from j with P[i, j] > 0, send to j with P[j, i] > 0: a
directed P works in both engines) and returns Σ_j p_ij w_j over exactly the messages that made
up the mixed numerators. A lost message thus drops its numerator *and* its weight and z = x / w
stays a convex combination (push-sum's own bookkeeping; push-sum rounds are not renormalised,
so any column-stochastic P works on real peers too); a frame of a push-sum round without a
weight is rejected. The vectorized engine, where every message arrives, computes P·w in float64.

Graph: the run's topology; SGP's default is ``exponential-one-peer-directed`` (i pushes ½ to
i + 2^(k mod T), keeps ½). The shift is a bijection for every n, so that P^k is doubly
stochastic, w stays 1 exactly and SGP coincides with D-SGD on the same matrices (for n a power
of 2 the period multiplies to 11ᵀ/n exactly). Push-sum weights vary only on graphs with unequal
in-degrees (tests/core/test_sgp.py builds such schedules). Any symmetric doubly stochastic
topology also works (w stays 1).

Hyperparameters: those of the local optimizer (η from the schedule, momentum, weight decay).
Consensus control: rounds repeat with the next matrices of the schedule; θ_i = ‖z_i(after) −
z_i(before)‖². Exact-averaging phases set every z to Σ_j x_j / n and w to 1.
Invariants: Σ_i w_i = n while every message arrives (float64 round-off), w_i > 0 (P_ii > 0);
z is what is evaluated.
"""

from __future__ import annotations

import numpy as np
import torch

from concord.core.algorithms.base import Algorithm, StepContext, StepReport, register_algorithm
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.optim import LocalSGD
from concord.core.comm import Comm
from concord.core.control.consensus import local_theta


@register_algorithm
class SGP(Algorithm):
    spec = CATALOG["sgp"]

    def __init__(self, optimizer: LocalSGD) -> None:
        self.optimizer = optimizer
        self.weights: np.ndarray | None = None  # w of the k local replicas, float64 [k]

    def setup(self, x: torch.Tensor, comm: Comm) -> None:
        """w = 1 for every replica (the replicas may start from different models)."""
        self.weights = np.ones(x.shape[0], dtype=np.float64)

    def _weights(self) -> np.ndarray:
        if self.weights is None:
            raise RuntimeError("sgp: call setup(x, comm) (or load_state_dict) before step")
        return self.weights

    def _local_weights(self, x: torch.Tensor) -> torch.Tensor:
        """w_i of the local rows as a [k, 1] column in x's dtype."""
        w = torch.from_numpy(self._weights()).to(device=x.device, dtype=x.dtype)
        return w.unsqueeze(1)

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        if self._weights().shape != (x.shape[0],):
            raise ValueError(
                f"sgp: {self._weights().shape[0]} push-sum weights for {x.shape[0]} local rows "
                "(a checkpoint of another layout?)"
            )
        numerators = x * self._local_weights(x)
        numerators.sub_(self.optimizer.direction(x, grad), alpha=ctx.lr)
        if ctx.phase.mode == "exact":
            x.copy_(ctx.comm.allreduce_mean(numerators, step=ctx.step))
            self._weights()[:] = 1.0
            return StepReport(exact_average=True)
        report = StepReport()
        while True:
            index = ctx.round_offset + report.rounds
            W = ctx.matrix(index)
            push = torch.from_numpy(self._weights())
            result = ctx.comm.mix(numerators, W, step=ctx.step, round=index, push=push)
            if result.push is None:
                raise RuntimeError(f"{type(ctx.comm).__name__}.mix does not carry push-sum weights")
            self.weights = result.push.detach().cpu().to(torch.float64).numpy().copy()
            numerators = result.x
            z = numerators / self._local_weights(x)
            theta_local = local_theta(x, z)
            x.copy_(z)
            report.add_round(theta_local, result.outcome)
            if not ctx.control.after_round(report.rounds, x, theta_local):
                return report

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = dict(self.optimizer.state_dict())
        if self.weights is not None:
            state["push_weights"] = torch.from_numpy(self.weights.copy())
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
        w = state.get("push_weights")
        self.weights = None if w is None else w.detach().cpu().to(torch.float64).numpy().copy()
