"""Local SGD, a.k.a. periodic averaging / federated averaging with full participation (Stich,
"Local SGD Converges Fast and Communicates Little", ICLR 2019; Lin, Stich, Patel & Jaggi, "Don't
Use Large Mini-Batches, Use Local SGD", ICLR 2020; decentralized, gossip variant: Koloskova,
Loizou, Boreiri, Jaggi & Stich, "A Unified Theory of Decentralized SGD with Changing Topology and
Local Updates", ICML 2020).

Every replica takes H local optimizer steps, then the replicas communicate once:

    x_i ← x_i − η d_i                                   every step (local optimizer)
    x_i ← (1/n) Σ_j x_j        if (t + 1) mod H = 0     average = "exact" (the default)
    x_i ← Σ_j w_ij x_j         if (t + 1) mod H = 0     average = "gossip" (one round, W)

The step index t is the run's global step, so the communication steps are a pure function of t
(a resumed run communicates on the same steps) and the last steps of a run may be local ones
(evaluate the averaged model, or pick H dividing the number of steps). H = 1 with exact
averaging is the all-reduce baseline; H = 1 with gossip is D-SGD.

Accounting: a local-only step makes no `Comm` call at all and reports ``StepReport()`` (0
rounds, no exact average); a communication step reports ``exact_average=True`` (0 gossip rounds)
or 1 gossip round. So bytes and rounds shrink by the factor H.

Hyperparameters: ``hyper.local_steps`` H, an integer ≥ 1 (default 4); ``hyper.average``,
"exact" (default) or "gossip"; the local optimizer's (lr η > 0, momentum μ ∈ [0, 1) with a
local buffer that is never averaged, weight decay ≥ 0).

Shapes: ``x`` and ``grad`` are [k, d] (rows = local replicas); no state beyond the optimizer's.
Invariants: exact averaging leaves all rows equal; gossip (W symmetric, doubly stochastic)
preserves the mean x̄.

Overlap (``overlap = true``, `concord.core.algorithms.overlap`): a communication step t averages
(or gossips) x^t, the model its gradient is taken at, while that gradient is computed, and then
takes its local step: x_i ← (1/n) Σ_j x_j^t − η d_i (or Σ_j w_ij x_j^t − η d_i). The replicas
then differ by their own last update (not equal after an exact average); the mean is the same.

Phases and control: with average = "exact" the plan's phase modes and topologies do not apply.
With "gossip", an exact phase of the plan averages exactly on the communication steps (local
steps stay local). Consensus control does not apply to local SGD (H local steps between single
communications, nothing to repeat): the config keeps it inert, as for all-reduce, and this
algorithm never calls the round controller.
"""

from __future__ import annotations

import torch

from concord.core.algorithms.base import (
    Algorithm,
    StepContext,
    StepReport,
    assign_mixed,
    register_algorithm,
)
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.correction import gossip_once
from concord.core.algorithms.optim import LocalSGD
from concord.core.algorithms.overlap import direction_buffer, finish_exchange, start_exchange

AVERAGES = ("exact", "gossip")


@register_algorithm
class LocalSGDAlgorithm(Algorithm):
    spec = CATALOG["local-sgd"]
    portable_state = frozenset({"momentum"})

    def __init__(
        self, optimizer: LocalSGD, *, local_steps: int = 4, average: str = "exact"
    ) -> None:
        if isinstance(local_steps, bool) or not isinstance(local_steps, int):
            raise ValueError(
                f"local-sgd: hyper.local_steps must be an integer ≥ 1; got {local_steps!r}"
            )
        if local_steps < 1:
            raise ValueError(f"local-sgd: hyper.local_steps must be ≥ 1; got {local_steps}")
        if average not in AVERAGES:
            raise ValueError(
                f"local-sgd: hyper.average must be one of {', '.join(map(repr, AVERAGES))}; "
                f"got {average!r}"
            )
        self.optimizer = optimizer
        self.local_steps = local_steps
        self.average = average
        self._direction: torch.Tensor | None = None  # overlap: d^t, kept across steps

    @property
    def silent_steps(self) -> int:
        return self.local_steps - 1

    def communicates(self, step: int) -> bool:
        """Whether global step ``step`` ends with a communication."""
        return (step + 1) % self.local_steps == 0

    def exact(self, ctx: StepContext) -> bool:
        """Whether this step's communication is an exact average (else one gossip round)."""
        return self.average == "exact" or ctx.phase.mode == "exact"

    def start(self, x: torch.Tensor, ctx: StepContext) -> None:
        if self.communicates(ctx.step):
            start_exchange(x, ctx, exact=self.exact(ctx))

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        if ctx.inflight is not None:  # overlap: x^t is in flight; mix it, then step
            self._direction = direction_buffer(self._direction, x)
            direction = self.optimizer.direction(x, grad, out=self._direction)
            return finish_exchange(x, direction, ctx)
        self.optimizer.step(x, grad, ctx.lr)
        if not self.communicates(ctx.step):
            return StepReport()
        if self.exact(ctx):
            x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
            return StepReport(exact_average=True)
        mixed, outcome = gossip_once(x, ctx.matrix(ctx.round_offset), ctx)
        theta_local = assign_mixed(x, mixed)
        return StepReport(
            rounds=1, theta_local=theta_local, statistics=[theta_local], outcomes=[outcome]
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
