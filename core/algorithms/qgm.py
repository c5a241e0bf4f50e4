"""D-SGD with quasi-global momentum, QGM (Lin, Karimireddy, Stich & Jaggi, "Quasi-Global Momentum:
Accelerating Decentralized Deep Learning on Heterogeneous Data", ICML 2021). docs/algorithms.md#qgm;
the form of the RelaySGD code (``algorithms.py::quasi_global_momentum`` of epfml/relaysgd).

Local momentum on heterogeneous data points every replica towards its own optimum; QGM builds
the buffer from the *net model change* instead — local step and gossip together — which is
close to a global direction. Per step, with d_i = g_i + λ x_i (gradient plus weight decay) and the
quasi-global buffer m̂_i (m̂⁰ = 0):

    m_i = β m̂_i + d_i                                 (temporary; m̂_i is not updated by d_i)
    x_i ← x_i − η (d_i + β m_i)   (Nesterov)   or   x_i ← x_i − η m_i   (heavy ball)
    x_i ← Σ_j w_ij x_j                                (gossip rounds, as D-SGD)
    m̂_i ← β m̂_i + (1 − β) (x_i^{before step} − x_i^{after gossip}) / η

β = 0 is D-SGD exactly. At η = 0 (the first step of a warm-up from 0) the net change is pure
gossip and not a descent direction; the buffer is then left unchanged.

Hyperparameters: ``hyper.beta`` β ∈ [0, 1), default 0.9. QGM *replaces* the local optimizer's
momentum: β is the one momentum coefficient, so ``optim.momentum`` must equal ``hyper.beta``
(as in the RelaySGD code, where the optimizer's momentum is QGM's β; the defaults, 0.9 and 0.9,
agree) — any other value is rejected when the algorithm is built, naming both keys.
``optim.nesterov`` chooses the Nesterov or heavy-ball step; ``optim.weight_decay`` ≥ 0 is
added to the gradient as usual. The local optimizer's own momentum buffer is never used.

Shapes: ``x``, ``grad`` and m̂ are [k, d] (rows = local replicas); m̂ is never communicated (one
d-vector per directed edge per round, like D-SGD).
Invariants: W symmetric and doubly stochastic ⇒ the gossip preserves the mean x̄.
Phases and control: exactly D-SGD's communication (`communicate`): an exact phase averages
exactly, a controlled phase repeats gossip rounds of the model until the statistic meets its
target; the buffer update then sees the net change of the whole step (all its rounds), so it
needs no reset at phase switches.
Overlap (``overlap = true``, `concord.core.algorithms.overlap`): as D-SGD's, the step becomes
x_i ← Σ_j w_ij x_j − η (d_i + β m_i) with d_i, m_i from the gradient at x_i before the mix, the
gossip of x running while that gradient is computed; m̂ is built from the same net change.
"""

from __future__ import annotations

import math

import torch

from concord.core.algorithms.base import (
    Algorithm,
    StepContext,
    StepReport,
    communicate,
    register_algorithm,
)
from concord.core.algorithms.buffers import restored
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.correction import check_state
from concord.core.algorithms.optim import LocalSGD
from concord.core.algorithms.overlap import finish_exchange, start_exchange
from concord.core.comm import Comm

MOMENTUM_ATOL = 1e-12  # optim.momentum and hyper.beta are "equal" up to float parsing


@register_algorithm
class QGM(Algorithm):
    spec = CATALOG["qgm"]
    portable_state = frozenset({"qgm_buffer"})

    def __init__(self, optimizer: LocalSGD, *, beta: float = 0.9) -> None:
        if isinstance(beta, bool) or not isinstance(beta, int | float):
            raise ValueError(f"qgm: hyper.beta must be a number in [0, 1); got {beta!r}")
        if not (math.isfinite(beta) and 0 <= beta < 1):
            raise ValueError(f"qgm: hyper.beta must be in [0, 1); got {beta}")
        mu = optimizer.config.momentum
        if abs(mu - beta) > MOMENTUM_ATOL:
            raise ValueError(
                f"qgm: quasi-global momentum replaces the local momentum, so optim.momentum "
                f"({mu}) must equal hyper.beta ({beta}); set optim.momentum = {beta} "
                f"(or hyper.beta = {mu})"
            )
        self.optimizer = optimizer
        self.beta = float(beta)
        self.nesterov = optimizer.config.nesterov
        self.buffer: torch.Tensor | None = None  # m̂ [k, d]

    def setup(self, x: torch.Tensor, comm: Comm) -> None:
        """m̂⁰ = 0."""
        self.buffer = torch.zeros_like(x)

    def start(self, x: torch.Tensor, ctx: StepContext) -> None:
        start_exchange(x, ctx, exact=ctx.phase.mode == "exact")

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        m_hat = self.buffer = check_state("qgm", self.buffer, x)
        beta = self.beta
        d = self.optimizer.effective_grad(x, grad)
        m = torch.add(d, m_hat, alpha=beta)
        direction = d.add_(m, alpha=beta) if self.nesterov else m
        before = x.clone()
        if ctx.inflight is not None:  # overlap: x^t is in flight; mix it, then step
            report = finish_exchange(x, direction, ctx)
        else:
            x.sub_(direction, alpha=ctx.lr)
            report = communicate(x, ctx)
        if ctx.lr > 0:
            m_hat.mul_(beta).add_(before.sub_(x), alpha=(1.0 - beta) / ctx.lr)
        return report

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {} if self.buffer is None else {"qgm_buffer": self.buffer}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.buffer = restored(state, "qgm_buffer")
