"""Algorithm interface shared by the vectorized engine and the peer process.

An algorithm sees the parameters of the replicas its process holds as one tensor ``x`` of shape
[k, d] (k = n in the vectorized engine, k = 1 in a peer), their stochastic gradients ``grad`` of
the same shape, and a `StepContext` carrying the communication interface (`core.comm.Comm`), the
current phase, the mixing-matrix schedule and the round controller. It updates ``x`` in place.

Gossip rounds under consensus control are run by `gossip_rounds`: one round, the local statistic
θ_i = ‖x_i(after) − x_i(before)‖² (Kong et al. 2021, App. A), then the `RoundControl` answers
repeat or stop — in the vectorized engine directly, in a peer after the orchestrator's decision.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
import torch

from core.comm import Comm, MixOutcome
from core.compress import Codec
from core.consensus import local_theta
from core.plan import Phase
from core.registry import Registry


class RoundControl(Protocol):
    """Decides, after each gossip round of a step, whether to gossip again."""

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        """``round_index`` is 1-based; ``theta_local`` is θ_i for the local rows ([k]).

        Returns True to run another round (the caller stops anyway at the controller's bound).
        """
        ...


class SingleRound:
    """No control: exactly one gossip round per step."""

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        return False


@dataclass
class StepContext:
    step: int
    lr: float
    phase: Phase
    comm: Comm
    matrix: Callable[[int], np.ndarray]  # mixing matrix of the phase's topology for round index
    control: RoundControl = field(default_factory=SingleRound)
    round_offset: int = 0  # gossip rounds already run in this run (indexes time-varying graphs)
    codec: Codec | None = None  # what gossip tensors travel as (None: raw float32)


@dataclass
class StepReport:
    rounds: int = 0  # gossip rounds run in this step (0 for exact averaging)
    exact_average: bool = False
    theta_local: torch.Tensor | None = None  # θ_i of the last round, [k]
    statistics: list[torch.Tensor] = field(default_factory=list)  # θ_i after each round
    outcomes: list[MixOutcome] = field(default_factory=list)


def gossip_rounds(
    x: torch.Tensor, ctx: StepContext, report: StepReport | None = None
) -> StepReport:
    """Gossip ``x`` in place until ``ctx.control`` says stop; returns what happened."""
    report = report or StepReport()
    while True:
        index = ctx.round_offset + report.rounds
        result = ctx.comm.mix(x, ctx.matrix(index), codec=ctx.codec, step=ctx.step, round=index)
        theta_local = local_theta(x, result.x)
        x.copy_(result.x)
        report.rounds += 1
        report.theta_local = theta_local
        report.statistics.append(theta_local)
        report.outcomes.append(result.outcome)
        if not ctx.control.after_round(report.rounds, x, theta_local):
            return report


def communicate(x: torch.Tensor, ctx: StepContext) -> StepReport:
    """The phase's communication: exact averaging, or (controlled) gossip."""
    if ctx.phase.mode == "exact":
        x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
        return StepReport(exact_average=True)
    return gossip_rounds(x, ctx)


class Algorithm(ABC):
    """One decentralized training algorithm, written once for both engines."""

    name: ClassVar[str]
    uses_gossip: ClassVar[bool] = True  # False: phases/topologies/control do not apply

    def setup(self, x: torch.Tensor, comm: Comm) -> None:  # noqa: B027 - optional hook
        """Allocate per-replica state; ``x`` [k, d] is the common initial model x⁰."""

    @abstractmethod
    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        """One training step: update ``x`` ([k, d]) in place from ``grad`` ([k, d])."""

    def grad_point(self, x: torch.Tensor) -> torch.Tensor:
        """Parameters at which the next stochastic gradient is taken (default: ``x``)."""
        return x

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027
        """Restore from `state_dict` (checkpoints)."""


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
