"""D² (Tang, Lian, Yan, Zhang & Liu, "D²: Decentralized Training over Decentralized Data", ICML
2018). docs/algorithms.md#d2-and-exact-diffusion.

The recursion, for a fixed mixing matrix W (x^{−1} := x⁰, g^{−1} := 0):

    x^{t+1} = W (2 x^t − x^{t−1} − η g^t + η g^{t−1})

Implemented in the *correction* form of the RelaySGD code (``algorithms.py::d2`` of
epfml/relaysgd), which composes with any local optimizer (momentum, weight decay): with the
correction c_i (c⁰ = 0) and u_i the local optimizer's update (x_i after its step − x_i before),

    x_i ← Σ_j w_ij (x_j + u_j + c_j)                     one gossip round
    c_i ← x_i^{new} − x_i^{old} − u_i

Substituting c^t = x^t − x^{t−1} − u^{t−1} recovers the recursion above (with plain SGD, u = −ηg;
tested to float64 round-off). One d-vector per directed edge per step, like D-SGD.

Condition: D² needs λ_min(W) > −1/3 (Tang et al. 2018, Assumption 1); at λ_min = −1/3 the
mode z = −1 of z² − 2λz + λ = 0 no longer decays. It is checked for every distinct matrix the
algorithm gossips with (cheaply by Gershgorin when every w_ii > 1/3, else by an eigen-
decomposition, once per matrix) and violated with a ValueError naming λ_min. Note: the ring with
weights 1/3 and an even n has λ_min = −1/3 exactly, so it is rejected; a lazy matrix
(``kappa`` < 1), an odd ring, or `exact-diffusion` (the same recursion on (W + I)/2, whose
λ_min ≥ 0 always) work.

Shapes: ``x``, ``grad`` and the correction c are [k, d] (rows = local replicas).
Invariants: W symmetric and doubly stochastic ⇒ Σ_i c_i = 0 at all times (up to round-off), and
the mean model moves by the mean local update, x̄ ← x̄ + ū, as all-reduce SGD would. At a
consensual fixed point c_i = ū − u_i, so heterogeneous data leave no error floor.

Phases and control:

* exact phase: the same recursion with W = 11ᵀ/n (λ_min = 0): x ← mean(x + u + c) — the
  all-reduce step, since Σ c = 0 — and c ← x^{new} − x^{old} − u as usual, so the correction is
  D²'s own at the switch back to gossip (no reset needed);
* consensus control does not repeat rounds: D² is a second-order recursion whose correction c
  assumes the same W at every step; a varying number of rounds (W^R) is outside its analysis.
  Like CHOCO, exactly one round runs per step; its statistic θ_i = ‖x_i(after) − x_i(before)‖² is
  reported to the controller once (so its bookkeeping and metrics stay consistent) and a
  "repeat" answer is ignored.

The model may travel as the run's fp16/bf16 cast (the own remainder is kept, `base`).
Hyperparameters: none of its own; the local optimizer's (lr η > 0, momentum μ ∈ [0, 1), weight
decay ≥ 0).
"""

from __future__ import annotations

import numpy as np
import torch

from concord.core.algorithms.base import Algorithm, StepContext, StepReport, register_algorithm
from concord.core.algorithms.buffers import buffers_state, restored
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.correction import check_state, gossip_once, local_update
from concord.core.algorithms.optim import LocalSGD
from concord.core.comm import Comm, MixOutcome
from concord.core.control.consensus import local_theta

LAMBDA_MIN_BOUND = -1.0 / 3.0
LAMBDA_MIN_MARGIN = 1e-9
"""λ_min must exceed −1/3 by this much: eigvalsh is exact to ~n·1e-16, so a matrix at the
boundary (ring, weights 1/3, even n: λ_min = −1/3 exactly) cannot pass by round-off."""

_CHECKED = 64  # matrices remembered as checked (periodic schedules reuse the same objects)


def lambda_min(W: np.ndarray) -> float:
    """Smallest eigenvalue of the symmetric matrix W."""
    return float(np.linalg.eigvalsh((W + W.T) / 2.0)[0])


@register_algorithm
class D2(Algorithm):
    spec = CATALOG["d2"]

    def __init__(self, optimizer: LocalSGD) -> None:
        self.optimizer = optimizer
        self.correction: torch.Tensor | None = None  # c [k, d]
        self._checked: dict[int, np.ndarray] = {}  # id → matrix (kept alive: ids stay unique)

    def setup(self, x: torch.Tensor, comm: Comm) -> None:
        """c⁰ = 0."""
        self.correction = torch.zeros_like(x)

    def check_matrix(self, W: np.ndarray) -> None:
        """Raise ValueError unless λ_min(W) > −1/3 (module docstring)."""
        if self._checked.get(id(W)) is W:
            return
        diagonal = float(np.min(np.diag(W)))
        if 2.0 * diagonal - 1.0 <= LAMBDA_MIN_BOUND + LAMBDA_MIN_MARGIN:  # Gershgorin inconclusive
            lam = lambda_min(W)
            if lam <= LAMBDA_MIN_BOUND + LAMBDA_MIN_MARGIN:
                raise ValueError(
                    f"{self.name}: the topology's mixing matrix has λ_min(W) = {lam:.6g}; D² "
                    "needs λ_min > −1/3 (Tang et al. 2018). Use a lazy matrix (kappa < 1, e.g. "
                    "0.9), other weights or topology, or algorithm 'exact-diffusion'"
                )
        if len(self._checked) >= _CHECKED:
            self._checked.clear()
        self._checked[id(W)] = W

    def mixing(self, x: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, MixOutcome]:
        """One round of the algorithm's gossip matrix: W for D²."""
        W = ctx.matrix(ctx.round_offset)
        self.check_matrix(W)
        return gossip_once(x, W, ctx)

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        c = self.correction = check_state(self.name, self.correction, x)
        u = local_update(self.optimizer, x, grad, ctx.lr)
        old = x.clone()
        x.add_(u).add_(c)
        if ctx.phase.mode == "exact":
            x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
            torch.sub(x, old, out=c).sub_(u)
            return StepReport(exact_average=True)
        mixed, outcome = self.mixing(x, ctx)
        theta_local = local_theta(x, mixed)
        x.copy_(mixed)
        torch.sub(x, old, out=c).sub_(u)
        ctx.control.after_round(1, x, theta_local)  # reported once; no extra rounds (docstring)
        return StepReport(
            rounds=1, theta_local=theta_local, statistics=[theta_local], outcomes=[outcome]
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        return buffers_state(self.optimizer.state_dict(), correction=self.correction)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
        self.correction = restored(state, "correction")
