"""The vectorized engine: n replicas trained in one process, batched, with exact Ξ every step.

`run` is the entry point used by ``concord sim --engine vectorized`` and by sweeps. It builds the
task (data, partition, replica-batched model), the topology schedules of the phase plan, the
algorithm and the consensus controller, trains, evaluates the averaged model and every replica,
and leaves a run directory behind (see `sim.rundir`).

With ``control.mode = "constant"`` the target is factor × (max statistic of an *uncontrolled*
pass over the same phases). That calibration pass is run automatically (and cached by the
config's hash) — the user never supplies Ξ_max by hand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.algorithms import (
    Algorithm,
    LocalSGD,
    SGDConfig,
    SingleRound,
    StepContext,
    StepReport,
    make_algorithm,
)
from core.config import RunConfig, apply_overrides
from core.consensus import consensus_distance, theta
from core.control import Calibration, CalibrationRecorder, ConsensusController, ControlConfig
from core.plan import LRSchedule, Phase, PhasePlan, build_plan
from core.task import ClassificationTask
from core.topology import TopologySchedule, make_schedule
from sim.rundir import RunWriter
from sim.vectorized import VectorizedComm

ProgressFn = Callable[[dict[str, Any]], None]


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available on this machine")
    return torch.device(spec)


def make_lr_schedule(cfg: RunConfig, steps_per_epoch: int) -> LRSchedule:
    total = max(1, round(cfg.epochs * steps_per_epoch))
    o = cfg.optim
    return LRSchedule.from_fractions(
        o.lr,
        total,
        warmup=o.warmup,
        milestones=tuple(o.milestones),
        gamma=o.gamma,
        warmup_from=o.warmup_from,
    )


def make_plan(cfg: RunConfig, schedule: LRSchedule) -> PhasePlan:
    controlled = cfg.controlled_phases()
    return build_plan(
        schedule,
        modes=cfg.phase_modes(),
        topologies=cfg.phase_topologies,
        controlled_phases=tuple(controlled),
        control_mode=cfg.control.mode if controlled else "none",
    )


def control_config(cfg: RunConfig) -> ControlConfig:
    c = cfg.control
    return ControlConfig(
        mode=c.mode,
        factor=c.factor,
        max_rounds=c.max_rounds,
        lagged=c.lagged,
        ema=c.ema,
        statistic=c.statistic,
    )


class Schedules:
    """Topology schedules of the phase plan, built once per topology name."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self._by_name: dict[str, TopologySchedule] = {}

    def get(self, phase: Phase) -> TopologySchedule:
        name = phase.topology or self.cfg.topology
        if name not in self._by_name:
            self._by_name[name] = make_schedule(
                name,
                self.cfg.peers,
                weights=self.cfg.weights,
                kappa=self.cfg.kappa,
                seed=self.cfg.seed,
            )
        return self._by_name[name]

    def spectral(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(s.spectral()) for name, s in self._by_name.items()}


class VectorizedControl:
    """`RoundControl` of the vectorized engine: the controller sees the global statistic at once."""

    def __init__(self, controller: ConsensusController, statistic: str, comm: VectorizedComm):
        self.controller = controller
        self.statistic = statistic
        self.comm = comm
        self.step = 0
        self.planned: int | None = None  # lagged mode: rounds fixed at the start of the step
        self.values: list[float] = []
        self.target: float | None = None

    def begin(self, step: int, mean_grad_norm: float, lagged: bool) -> None:
        self.step = step
        planned = self.controller.begin_step(step, mean_grad_norm)
        self.planned = planned if lagged else None
        self.values = []
        self.target = self.controller.target(step)

    def measure(self, x: torch.Tensor, theta_local: torch.Tensor) -> float:
        if self.statistic == "xi":
            return consensus_distance(x)
        return theta(theta_local)

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        value = self.measure(x, theta_local)
        self.values.append(value)
        if self.planned is not None:
            return round_index < self.planned
        decision = self.controller.after_round(self.step, round_index, value)
        return decision.repeat


@dataclass
class TrainResult:
    steps: int
    last_eval: dict[str, float]
    final_xi: float | None
    rounds_total: int
    bytes_total: int
    calibration: Calibration | None


class Trainer:
    """One vectorized training run (also used, truncated, for the calibration pass)."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        task: ClassificationTask | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.task = task or ClassificationTask(cfg, list(range(cfg.peers)), device=self.device)
        self.schedule = make_lr_schedule(cfg, self.task.steps_per_epoch)
        self.plan = make_plan(cfg, self.schedule)
        self.schedules = Schedules(cfg)
        for phase in self.plan.phases:
            if phase.mode == "gossip":
                self.schedules.get(phase)
        self.comm = VectorizedComm(cfg.peers, device=self.device)
        o = cfg.optim
        sgd = SGDConfig(
            momentum=o.momentum, nesterov=o.nesterov and o.momentum > 0, weight_decay=o.weight_decay
        )
        self.algorithm: Algorithm = make_algorithm(
            cfg.algorithm, LocalSGD(sgd, self.task.flat.decay_mask.to(self.device))
        )
        self.algorithm.setup(self.task.x, self.comm)
        self.controller = ConsensusController(control_config(cfg), self.plan, calibration)
        self.control = VectorizedControl(self.controller, cfg.control.statistic, self.comm)
        self.rounds_total = 0

    @property
    def total_steps(self) -> int:
        return self.schedule.total_steps

    def eval_interval(self) -> int:
        return max(1, round(self.cfg.eval.every * self.task.steps_per_epoch))

    def train_step(self, step: int) -> dict[str, Any]:
        """One step of every replica; returns its metrics record."""
        task, x = self.task, self.task.x
        lr = self.schedule.lr(step)
        phase = self.plan.phase_at(step)
        out = task.loss_and_grad(step, self.algorithm.grad_point(x))
        grad_norm = float(out.grad.norm(dim=1).mean())
        controlled = phase.controlled and phase.mode == "gossip"
        control: Any = SingleRound()
        if controlled:
            self.control.begin(step, grad_norm, self.cfg.control.lagged)
            control = self.control
        sched = self.schedules.get(phase) if phase.mode == "gossip" else None
        ctx = StepContext(
            step=step,
            lr=lr,
            phase=phase,
            comm=self.comm,
            matrix=sched.matrix if sched is not None else _no_matrix,
            control=control,
            round_offset=self.rounds_total,
        )
        report: StepReport = self.algorithm.step(x, out.grad, ctx)
        self.rounds_total += report.rounds
        theta_value = theta(report.theta_local) if report.theta_local is not None else None
        target = None
        if controlled:
            self.controller.end_step(step, self.control.values)
            target = self.control.target
        return {
            "kind": "step",
            "step": step,
            "epoch": (step + 1) / task.steps_per_epoch,
            "phase": phase.index,
            "lr": lr,
            "loss": float(out.loss.mean()),
            "train_acc": float(out.correct.sum()) / out.correct.numel() / self.cfg.optim.batch_size,
            "rounds": report.rounds,
            "theta": theta_value,
            "target": target,
            "xi": consensus_distance(x),
            "grad_norm": grad_norm,
            "bytes_sent": self.comm.counters.bytes_wire,
            "rounds_total": self.rounds_total,
        }


def _no_matrix(k: int) -> np.ndarray:
    raise RuntimeError("exact-averaging phase asked for a gossip matrix")


# ---------------------------------------------------------------------------------------------
# Calibration (constant targets)


def calibration_key(cfg: RunConfig) -> str:
    d = cfg.to_dict()
    for key in ("name", "eval", "engine", "threads", "device"):
        d.pop(key, None)
    d["control"] = {"statistic": cfg.control.statistic, "phases": sorted(cfg.control.phases)}
    blob = json.dumps(d, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def calibrate(cfg: RunConfig, cache_dir: Path | None = None) -> Calibration:
    """Max statistic per controlled phase of an uncontrolled pass over the same plan."""
    key = calibration_key(cfg)
    path = cache_dir / f"calibration-{key}.json" if cache_dir else None
    if path is not None and path.is_file():
        return Calibration.from_json(json.loads(path.read_text()))
    uncontrolled = apply_overrides(cfg, {"control.mode": "none"})
    trainer = Trainer(uncontrolled)
    controlled = [p for p in make_plan(cfg, trainer.schedule).phases if p.controlled]
    last = max(p.end for p in controlled)
    recorder = CalibrationRecorder(cfg.control.statistic)
    for step in range(last):
        rec = trainer.train_step(step)
        value = rec["xi"] if cfg.control.statistic == "xi" else rec["theta"]
        if value is not None:
            recorder.observe(step, rec["phase"], value)
    result = recorder.result()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result.to_json(), indent=2))
        tmp.replace(path)
    return result


# ---------------------------------------------------------------------------------------------
# Entry point


def run(
    cfg: RunConfig,
    out_dir: Path,
    *,
    progress: bool = True,
    calibration_cache: Path | None = None,
    on_progress: ProgressFn | None = None,
) -> dict[str, Any]:
    """Train one run with the vectorized engine and write its run directory; returns the summary."""
    if cfg.engine != "vectorized":
        raise ValueError(
            f"sim.engine.run is the vectorized engine; config asks for engine {cfg.engine!r}"
        )
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    writer = RunWriter(Path(out_dir), cfg)
    calibration = None
    if cfg.control.mode == "constant" and cfg.controlled_phases():
        cache = calibration_cache or writer.dir / "calibration"
        writer.log.info("calibration.start", cache=str(cache))
        calibration = calibrate(cfg, cache)
        writer.write_json("calibration.json", calibration.to_json())
    trainer = Trainer(cfg, calibration=calibration)
    task = trainer.task
    writer.write_json("partition.json", task.partition_stats())
    writer.write_manifest(
        steps=trainer.total_steps,
        steps_per_epoch=task.steps_per_epoch,
        plan=trainer.plan.to_dict(),
        topologies=trainer.schedules.spectral(),
        fingerprint=task.flat.fingerprint(),
        parameters=int(task.x.shape[1]),
        device=str(trainer.device),
    )
    interval = trainer.eval_interval()
    last_eval: dict[str, float] = {}
    bar = writer.progress(trainer.total_steps, enabled=progress)
    with bar:
        for step in range(trainer.total_steps):
            rec = trainer.train_step(step)
            writer.metric(rec)
            final = step == trainer.total_steps - 1
            if (step + 1) % interval == 0 or final:
                ev = task.evaluate(
                    peers=cfg.eval.peers or final,
                    peer_samples=None if final else cfg.eval.peer_samples,
                )
                last_eval = ev
                writer.metric(
                    {"kind": "eval", "step": step, "epoch": rec["epoch"], "xi": rec["xi"], **ev}
                )
            bar.update(rec, last_eval)
            if on_progress is not None:
                on_progress(rec)
    writer.save_checkpoint(task, trainer.algorithm, trainer.total_steps)
    summary = {
        "engine": "vectorized",
        "algorithm": cfg.algorithm,
        "topology": cfg.topology,
        "peers": cfg.peers,
        "steps": trainer.total_steps,
        "epochs": cfg.epochs,
        "seed": cfg.seed,
        "plan": cfg.plan_label(),
        "control_mode": cfg.control.mode if cfg.controlled_phases() else "none",
        "control_factor": cfg.control.factor if cfg.controlled_phases() else None,
        "accuracy_avg_model": last_eval.get("acc_avg_model"),
        "accuracy_worst_peer": last_eval.get("acc_worst_peer"),
        "accuracy_mean_peer": last_eval.get("acc_mean_peer"),
        "gossip_rounds_total": trainer.rounds_total,
        "bytes_sent_total": trainer.comm.counters.bytes_wire,
        "final_consensus_distance": consensus_distance(task.x),
        "wall_seconds": time.perf_counter() - started,
        "run_dir": str(writer.dir),
    }
    writer.finish(summary)
    return summary
