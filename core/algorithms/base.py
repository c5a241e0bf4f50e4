"""Algorithm interface shared by the vectorized engine and the peer process.

An algorithm sees the parameters of the replicas its process holds as one tensor ``x`` of shape
[k, d] (k = n in the vectorized engine, k = 1 in a peer), their stochastic gradients ``grad`` of
the same shape, and a `StepContext` carrying the communication interface (`concord.core.comm.Comm`),
the current phase, the mixing-matrix schedule and the round controller. It updates ``x`` in place.

Gossip rounds under consensus control are run by `gossip_rounds`: one round, the local statistic
θ_i = ‖x_i(after) − x_i(before)‖² (Kong et al. 2021, App. A), then the `RoundControl` answers
repeat or stop — in the vectorized engine directly, in a peer after the orchestrator's decision.

Plain gossip may travel as a cast (``ctx.codec`` fp16/bf16, `concord.core.compress`). A replica then
mixes its neighbours' cast values but keeps its own full-precision remainder,

    x_i ← x_i + Σ_j w_ij Q(x_j) − Q(x_i)      (= Σ_j w_ij Q(x_j) + (x_i − Q(x_i))),

which preserves the mean (W doubly stochastic) and, unlike x_i ← Σ_j w_ij Q(x_j), does not
re-round every model to 16 bits each round: that loses SGD updates smaller than half a unit in
the last place (measured on a 1000-d quadratic, ring of 8, lr 1e-3, 3000 steps: error ratio
0.038 with fp32, 0.184 fp16 / 0.575 bf16 re-rounded, 0.038 for both with the remainder kept).
Lossy codecs need error feedback and are used by CHOCO-SGD (`concord.core.algorithms.choco`)
instead.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import torch

from concord.core.algorithms.catalog import AlgorithmSpec
from concord.core.comm import Comm, MixOutcome, MixResult, Pending
from concord.core.compress import Codec, codec_key
from concord.core.control.consensus import local_theta, squared_row_norms
from concord.core.control.plan import Phase
from concord.core.models import cache_blocks
from concord.core.registry import Registry


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
class InFlight:
    """Overlap: a step's first exchange of x^t, started before its gradient
    (`concord.core.algorithms.overlap`): gossip round ``round`` (``mix``) or an exact average."""

    mix: Pending[MixResult] | None = None
    average: Pending[torch.Tensor] | None = None
    round: int = 0


@dataclass
class StepContext:
    step: int
    lr: float
    phase: Phase
    comm: Comm
    matrix: Callable[[int], np.ndarray]  # mixing matrix of the phase's topology for round index
    control: RoundControl = field(default_factory=SingleRound)
    round_offset: int = 0  # gossip rounds already run in this run (indexes time-varying graphs)
    codec: Codec | None = None  # cast plain gossip travels as (None: raw); CHOCO has its own
    inflight: InFlight | None = None  # overlap: the exchange `Algorithm.start` began


def sent_rows(
    result: MixResult, x: torch.Tensor, codec: Codec | None, comm: Comm, round: int
) -> torch.Tensor:
    """Q(x_i) of the local rows as the neighbours decoded them ([k, d], x's dtype): the Comm's
    ``result.sent``, recomputed with the shared message keys if a backend leaves it out."""
    if codec is None:
        return x
    if result.sent is not None:
        return result.sent.to(x.dtype)
    keys = [codec_key(r, round) for r in comm.ranks]
    return codec.roundtrip(x, keys=keys).to(x.dtype)


@dataclass
class StepReport:
    rounds: int = 0  # gossip rounds run in this step (0 for exact averaging)
    exact_average: bool = False
    theta_local: torch.Tensor | None = None  # θ_i of the last round, [k]
    statistics: list[torch.Tensor] = field(default_factory=list)  # θ_i after each round
    outcomes: list[MixOutcome] = field(default_factory=list)

    def add_round(self, theta_local: torch.Tensor, outcome: MixOutcome) -> None:
        """Count one more gossip round, with its θ_i ([k]) and what its messages did."""
        self.rounds += 1
        self.theta_local = theta_local
        self.statistics.append(theta_local)
        self.outcomes.append(outcome)


def assign_mixed(x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
    """``x ← mixed``; returns θ_i = ‖mixed_i − x_i‖² of the rows before ([k] float64), the
    arithmetic of `local_theta`: the difference in x's dtype, its squared norm accumulated in
    float64 (`squared_row_norms`).

    Block by block of rows, in one cache-sized buffer for the difference: `local_theta` on
    [k, d] makes a [k, d] temporary (GBs at large k, fresh pages every round), and calling it
    per block would allocate and free small ones hundreds of times per round, which glibc may
    hand back to the kernel each time. The bits are those of `local_theta` — θ_i is a sum
    within row i — as long as no block is a lone row (torch splits a single row's sum between
    threads, which reorders it)."""
    if x.dim() != 2 or x.shape[0] < 2 or x.shape != mixed.shape or x.device.type != "cpu":
        theta_local = local_theta(x, mixed)
        x.copy_(mixed)
        return theta_local
    k, d = x.shape
    dtype = torch.promote_types(x.dtype, mixed.dtype)
    blocks = cache_blocks(k, d * dtype.itemsize, min_size=2)
    diff = torch.empty((max(e - s for s, e in blocks), d), dtype=dtype, device=x.device)
    theta_local = torch.empty(k, dtype=torch.float64, device=x.device)
    for s, e in blocks:
        theta_local[s:e] = squared_row_norms(torch.sub(mixed[s:e], x[s:e], out=diff[: e - s]))
        x[s:e].copy_(mixed[s:e])
    return theta_local


def gossip_rounds(
    x: torch.Tensor, ctx: StepContext, report: StepReport | None = None
) -> StepReport:
    """Gossip ``x`` in place until ``ctx.control`` says stop; returns what happened."""
    report = report or StepReport()
    while True:
        index = ctx.round_offset + report.rounds
        result = ctx.comm.mix(x, ctx.matrix(index), codec=ctx.codec, step=ctx.step, round=index)
        mixed = result.x
        if ctx.codec is not None:  # keep the own remainder x_i − Q(x_i) (module docstring)
            mixed = mixed + (x - sent_rows(result, x, ctx.codec, ctx.comm, index))
        theta_local = assign_mixed(x, mixed)
        ctx.comm.release(result)  # read no more: the backend may reuse it next round
        report.add_round(theta_local, result.outcome)
        if not ctx.control.after_round(report.rounds, x, theta_local):
            return report


def communicate(x: torch.Tensor, ctx: StepContext) -> StepReport:
    """The phase's communication: exact averaging, or (controlled) gossip."""
    if ctx.phase.mode == "exact":
        x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
        return StepReport(exact_average=True)
    return gossip_rounds(x, ctx)


class Algorithm(ABC):
    """One decentralized training algorithm, written once for both engines.

    A registered subclass declares its catalog entry, ``spec = CATALOG["<name>"]``
    (`concord.core.algorithms.catalog`); ``name`` and ``uses_gossip`` are taken from it."""

    spec: ClassVar[AlgorithmSpec]
    name: ClassVar[str]
    uses_gossip: ClassVar[bool] = True  # False: phases/topologies/control do not apply
    # `state_dict` entries ([k, d], a row per replica) that a replica joining late may take
    # over from a neighbour along with its parameters (a peer's Fetch): momentum-like state,
    # an estimate of the shared descent direction. Not trackers, error feedback or copies of
    # neighbours, whose invariants are the replica's own.
    portable_state: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            cls.name = spec.name
            cls.uses_gossip = spec.gossip

    def setup(self, x: torch.Tensor, comm: Comm) -> None:  # noqa: B027 - optional hook
        """Allocate per-replica state; ``x`` [k, d] is the common initial model x⁰."""

    @abstractmethod
    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        """One training step: update ``x`` ([k, d]) in place from ``grad`` ([k, d])."""

    def start(self, x: torch.Tensor, ctx: StepContext) -> None:
        """Overlap (``overlap = true``, admitted when ``spec.overlap``): called before the
        step's gradient is computed, start the step's exchange of ``x`` (x^t) into
        ``ctx.inflight``; `step` finishes it (`concord.core.algorithms.overlap`)."""
        raise NotImplementedError(f"algorithm {self.name!r} does not admit overlap")

    @property
    def silent_steps(self) -> int:
        """The longest run of consecutive steps without communication (local SGD: H − 1). A
        network backend lets neighbours run that much further ahead."""
        return 0

    def grad_point(self, x: torch.Tensor) -> torch.Tensor:
        """Parameters at which the next stochastic gradient is taken (default: ``x``)."""
        return x

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027
        """Restore from `state_dict` (checkpoints)."""


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")

A = TypeVar("A", bound=type[Algorithm])


def register_algorithm(cls: A) -> A:
    """Class decorator: register ``cls`` in ``ALGORITHMS`` under its catalog name, after checking
    that the catalog names this class as the implementation."""
    spec = cls.__dict__.get("spec")
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"{cls.__qualname__} declares no catalog entry (spec = CATALOG[...])")
    where = f"{cls.__module__}:{cls.__qualname__}"
    if spec.implementation != where:
        raise ValueError(
            f"catalog entry {spec.name!r} names {spec.implementation!r} as its implementation, "
            f"not {where!r}"
        )
    ALGORITHMS.add(spec.name, cls)
    return cls
