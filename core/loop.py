"""The per-step driver shared by both engines ("one algorithm, two engines").

`StepRunner` owns what every engine does identically for the replicas its process holds: the LR
schedule and phase plan, the topology schedule of each gossip phase, the algorithm, the global
gossip-round counter that indexes time-varying graphs, and the metrics record of a step. What
differs between engines comes in from outside:

* the `Comm` (in-memory in the vectorized engine, gRPC in a peer);
* the `ControlHook`, which turns a controlled step into a `RoundControl`: the vectorized engine
  decides from the global statistic at once; a peer asks the orchestrator;
* the `GraphHook` of the adaptive-graph algorithms (`concord.core.graphs.adagraph`), which sees
  every gossip step's θ_i and ‖g_i‖: the vectorized engine feeds its graph controller, a peer
  publishes them to the orchestrator. The topology overrides themselves are applied by the engine
  (`concord.core.control.runplan.Schedules.set_topologies`) before a step; the record names the
  graph used.

With ``overlap = true`` (docs/algorithms.md#overlap) a step starts its exchange before computing
the gradient: `Algorithm.start` hands x^t to the `Comm` (a peer's round then runs on its event loop
while this thread computes forward and backward), and `Algorithm.step` finishes it.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import torch

from concord.core.algorithms import (
    Algorithm,
    LocalSGD,
    RoundControl,
    SGDConfig,
    StepContext,
    StepReport,
    make_algorithm,
)
from concord.core.algorithms.catalog import CAST_CODECS, ERROR_FEEDBACK_KEYWORDS
from concord.core.comm import Comm
from concord.core.compress import Codec, make_codec
from concord.core.config import RunConfig
from concord.core.control.consensus import theta
from concord.core.control.plan import Phase
from concord.core.control.runplan import Schedules, make_lr_schedule, make_plan
from concord.core.graphs.topology import exponential_k
from concord.core.records import StepRecord
from concord.core.task import ClassificationTask, StepLoss


class DivergedError(RuntimeError):
    """Training produced a non-finite loss or consensus statistic: the run cannot go on. The
    message names the step, the phase, the learning rate and the replicas concerned."""

    def __init__(
        self,
        step: int,
        phase: int,
        lr: float,
        losses: torch.Tensor,
        thetas: torch.Tensor | None,
        replicas: list[int],
    ) -> None:
        bad_loss = [replicas[i] for i in (~losses.isfinite()).nonzero().flatten().tolist()]
        bad_theta = (
            []
            if thetas is None
            else [replicas[i] for i in (~thetas.isfinite()).nonzero().flatten().tolist()]
        )
        what = []
        if bad_loss:
            what.append(f"the loss of replica(s) {_ids(bad_loss)}")
        if bad_theta:
            what.append(f"the consensus statistic θ_i of replica(s) {_ids(bad_theta)}")
        super().__init__(
            f"training diverged at step {step} (phase {phase}, lr {lr:g}): "
            + " and ".join(what)
            + " is not finite; lower optim.lr, clip gradients (optim.clip_norm) or, with a lossy "
            "codec, lower compression.gamma"
        )
        self.step = step


def _ids(ids: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, ids[:most]))
    return shown + (f" … ({len(ids)} in all)" if len(ids) > most else "")


class ControlHook(Protocol):
    def begin(self, step: int, phase: Phase, grad_norms: torch.Tensor) -> RoundControl:
        """Start a controlled step; ``grad_norms`` are the local replicas' ‖g_i‖ ([k])."""
        ...

    def end(self, step: int) -> float | None:
        """Finish the step; returns the target that applied to it (for metrics)."""
        ...


class FixedRounds:
    """The `ControlHook` of ``control.mode = "fixed"`` where no controller runs (static peers):
    every controlled step gossips exactly ``rounds`` rounds, known from the config."""

    def __init__(self, rounds: int) -> None:
        if rounds < 1:
            raise ValueError(f"rounds = {rounds!r}; must be ≥ 1")
        self.rounds = rounds

    def begin(self, step: int, phase: Phase, grad_norms: torch.Tensor) -> RoundControl:
        return self

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        return round_index < self.rounds

    def end(self, step: int) -> float | None:
        return None  # no target


class GraphHook(Protocol):
    def observe(
        self, step: int, phase: Phase, grad_norms: torch.Tensor, report: StepReport
    ) -> None:
        """After a gossip step: the local replicas' ‖g_i‖ ([k]) and the step's report
        (``report.theta_local``: θ_i of its last round, [k])."""
        ...


def make_run_codec(cfg: RunConfig) -> Codec | None:
    """The codec of ``compression`` (None for raw float32), seeded by the run seed."""
    c = cfg.compression
    if c.codec == "none":
        return None
    return make_codec(c.codec, ratio=c.ratio, seed=cfg.seed, levels=c.levels, unbiased=c.unbiased)


def algorithm_hyperparameters(cfg: RunConfig, codec: Codec | None) -> dict[str, Any]:
    """Constructor keywords of ``cfg.algorithm`` beyond the local optimizer: the ``[hyper]``
    table (checked against the constructor by `make_algorithm`, with the accepted names in the
    error), and for an error-feedback algorithm (CHOCO) the codec and γ from ``[compression]``."""
    hyper = dict(cfg.hyper)
    if cfg.spec.codecs == "error-feedback":
        hyper.update(zip(ERROR_FEEDBACK_KEYWORDS, (codec, cfg.compression.gamma), strict=True))
    return hyper


def check_algorithm(cfg: RunConfig) -> None:
    """Build ``cfg.algorithm`` once with its hyperparameters: a ValueError names what is wrong
    (before any process is started)."""
    make_algorithm(
        cfg.algorithm,
        make_local_optimizer(cfg, torch.ones(1)),
        **algorithm_hyperparameters(cfg, make_run_codec(cfg)),
    )


def gossip_codec(cfg: RunConfig, codec: Codec | None) -> Codec | None:
    """What plain gossip travels as (`StepContext.codec`): the casts fp16/bf16 for gossip
    algorithms admitting them (an error-feedback algorithm, CHOCO, applies its codec itself)."""
    if cfg.spec.codecs != "casts" or cfg.compression.codec not in CAST_CODECS:
        return None
    return codec


def _no_matrix(k: int) -> np.ndarray:
    raise RuntimeError("an exact-averaging phase asked for a gossip matrix")


def make_local_optimizer(cfg: RunConfig, decay_mask: torch.Tensor) -> LocalSGD:
    o = cfg.optim
    sgd = SGDConfig(
        momentum=o.momentum, nesterov=o.nesterov and o.momentum > 0, weight_decay=o.weight_decay
    )
    return LocalSGD(sgd, decay_mask)


class StepRunner:
    """Runs training steps of the local replicas of ``task`` over ``comm``."""

    def __init__(
        self,
        cfg: RunConfig,
        task: ClassificationTask,
        comm: Comm,
        *,
        control: ControlHook | None = None,
        graphs: GraphHook | None = None,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.comm = comm
        self.control = control
        self.graphs = graphs
        self.schedule = make_lr_schedule(cfg, task.steps_per_epoch)
        self.plan = make_plan(cfg, self.schedule)
        self.schedules = Schedules(cfg)
        self.clip_norm = cfg.optim.clip_norm
        for phase in self.plan.phases:
            if phase.mode == "gossip":
                self.schedules.get(phase)
        self.codec = make_run_codec(cfg)
        self.gossip_codec = gossip_codec(cfg, self.codec)
        self.algorithm: Algorithm = make_algorithm(
            cfg.algorithm,
            make_local_optimizer(cfg, task.flat.decay_mask.to(task.x.device)),
            **algorithm_hyperparameters(cfg, self.codec),
        )
        self.algorithm.setup(task.x, comm)
        if cfg.overlap and not cfg.spec.overlap:  # validation refuses it; unvalidated configs
            raise ValueError(f"algorithm {cfg.algorithm!r} does not admit overlap")
        self.overlap = cfg.overlap
        self.rounds_total = 0

    @property
    def total_steps(self) -> int:
        return self.schedule.total_steps

    def eval_interval(self) -> int:
        return max(1, round(self.cfg.eval.every * self.task.steps_per_epoch))

    def step_record(
        self,
        step: int,
        phase: Phase,
        lr: float,
        out: StepLoss,
        grad_norms: torch.Tensor,
        rounds: int,
        *,
        epoch: float | None = None,
        theta: float | None = None,
        target: float | None = None,
        **fields: Any,
    ) -> StepRecord:
        """The record of a step, with the fields every step runner fills alike: the mean loss,
        training accuracy and gradient norm of the local replicas (``out``, ``grad_norms``),
        the byte and round counters after it, and ``epoch`` (default: (step + 1) / steps per
        epoch); ``fields``: the other `StepRecord` fields."""
        task = self.task
        return StepRecord(
            step=step,
            epoch=(step + 1) / task.steps_per_epoch if epoch is None else epoch,
            phase=phase.index,
            lr=lr,
            loss=float(out.loss.mean()),
            train_acc=float(out.correct.sum()) / (out.correct.numel() * task.batch_size),
            rounds=rounds,
            theta=theta,
            target=target,
            grad_norm=float(grad_norms.mean()),
            bytes_sent=self.comm.counters.bytes_wire,
            rounds_total=self.rounds_total,
            **fields,
        )

    def run_step(self, step: int) -> tuple[StepRecord, StepReport]:
        """One training step of every local replica; returns its metrics record and report.

        Record values are over the local replicas (all n in the vectorized engine)."""
        task, x = self.task, self.task.x
        self.comm.begin_step(step)
        lr = self.schedule.lr(step)
        phase = self.plan.phase_at(step)
        sched = self.schedules.get(phase) if phase.mode == "gossip" else None
        ctx = StepContext(
            step=step,
            lr=lr,
            phase=phase,
            comm=self.comm,
            matrix=sched.matrix if sched is not None else _no_matrix,
            round_offset=self.rounds_total,
            codec=self.gossip_codec,
        )
        if self.overlap:  # the exchange of x^t runs while its gradient is computed
            self.algorithm.start(x, ctx)
        out = task.loss_and_grad(step, self.algorithm.grad_point(x))
        grad_norms = out.grad.norm(dim=1)
        if self.clip_norm is not None:  # per replica, like torch.nn.utils.clip_grad_norm_
            out.grad.mul_((self.clip_norm / (grad_norms + 1e-6)).clamp_(max=1.0).unsqueeze(1))
        hook = self.control if phase.controlled and phase.mode == "gossip" else None
        if hook is not None:
            ctx.control = hook.begin(step, phase, grad_norms)
        report = self.algorithm.step(x, out.grad, ctx)
        self.rounds_total += report.rounds
        target = hook.end(step) if hook is not None else None
        loss = float(out.loss.mean())
        stats = report.theta_local
        if not math.isfinite(loss) or (stats is not None and not bool(stats.isfinite().all())):
            raise DivergedError(step, phase.index, lr, out.loss, stats, task.ranks)
        graph = None
        if self.cfg.spec.adaptive_graph is not None and phase.mode == "gossip":
            graph = self.schedules.topology_name(phase)
        record = self.step_record(
            step,
            phase,
            lr,
            out,
            grad_norms,
            report.rounds,
            theta=theta(report.theta_local) if report.theta_local is not None else None,
            target=target,
            graph=graph,
            graph_k=None if graph is None else exponential_k(graph, self.cfg.peers),
        )
        if self.graphs is not None and report.theta_local is not None:
            self.graphs.observe(step, phase, grad_norms, report)
        return record, report
