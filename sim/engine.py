"""The vectorized engine: n replicas trained in one process, batched, with exact Ξ every step.

`run` is the entry point used by ``concord sim --engine vectorized`` and by sweeps. It builds the
task (data, partition, replica-batched model), the topology schedules of the phase plan, the
algorithm and the consensus controller, trains, evaluates the averaged model and every replica,
and leaves a run directory behind (see `concord.runtime.rundir`).

With ``control.mode = "constant"`` the target is factor × (max statistic of an *uncontrolled*
pass over the same phases). That calibration pass is run automatically (and cached by the
config's hash) — the user never supplies Ξ_max by hand. ``control.mode = "fixed"`` (every
controlled step runs exactly ``control.rounds`` gossip rounds) has no target and no calibration.

Checkpoints and resume: after every evaluation the run writes ``checkpoint.pt`` (atomically;
`concord.runtime.rundir.RunWriter.save_checkpoint`) with the parameters, buffers, algorithm and
RNG state and the run's state (`Trainer.run_state`: next step, gossip rounds, byte counters,
controller, ada-feedback). ``run(cfg, run_dir, resume=True)`` (``concord sim --resume RUN_DIR``)
continues an interrupted run from it: metrics lines after the checkpoint's step are dropped, the
run goes on from the next step and ends with the parameters an uninterrupted run ends with.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from concord.core.algorithms import Algorithm, RoundControl, StepReport
from concord.core.config import RunConfig, apply_overrides
from concord.core.control.calibration import read_calibration
from concord.core.control.consensus import consensus_distance, round_statistic, sketch_xi
from concord.core.control.controller import Calibration, CalibrationRecorder, ConsensusController
from concord.core.control.plan import Phase
from concord.core.control.runplan import Schedules, control_config, make_lr_schedule, make_plan
from concord.core.data import partition_digest
from concord.core.graphs.adagraph import (
    GraphFeedback,
    feedback_config,
    initial_topologies,
)
from concord.core.graphs.topology import exponential_name
from concord.core.loop import StepRunner
from concord.core.models import cache_blocks
from concord.core.records import (
    JSON,
    CheckpointRunState,
    EvalRecord,
    RunSummary,
    StepRecord,
)
from concord.core.task import ClassificationTask
from concord.peer.memory import M_MMAP_THRESHOLD, tune_malloc
from concord.runtime.driver import RunHooks, drive
from concord.runtime.progress import ProgressBar
from concord.runtime.records import read_evals, read_summary
from concord.runtime.rundir import (
    CheckpointTable,
    RunWriter,
    counters_state,
    load_checkpoint,
    load_counters,
    restore_checkpoint,
    run_state_of,
)
from concord.sim.asynchronous import AsyncSimulation, make_simulation
from concord.sim.vectorized import VectorizedComm

ProgressFn = Callable[[StepRecord], None]
"""Called with every step's record."""


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {spec!r} requested but CUDA is not available on this machine")
    return torch.device(spec)


def tune_engine_malloc(state_bytes: int) -> None:
    """glibc settings for a vectorized run of ``state_bytes`` of [n, d] parameters: the peers'
    (`concord.peer.memory.tune_malloc`: one arena, up to 1 GiB of freed heap kept), and blocks
    up to that size served from the heap, not by mmap. glibc hands an mmapped block back to the
    kernel on free, and the next step faults it in again page by page; a step's big temporaries
    are parameter-shaped — autograd's [n, 256, 256] weight gradient of the mlp is 256 MiB at
    n = 1024, over the peers' 256 MiB threshold. Larger blocks stay mmapped: evaluation's
    [n, 1000, 256] activations fragment the heap (measured: 6.6 GB resident after one
    evaluation that peaks at 2.6 GB when they are mmapped). A no-op off glibc."""
    tune_malloc()
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    threshold = min(max(state_bytes + (1 << 20), 256 << 20), (1 << 31) - 1)  # an int
    libc.mallopt(M_MMAP_THRESHOLD, threshold)


class ConsensusMeter:
    """`consensus_distance` of [n, d] parameters, the same bits with less memory traffic.

    ``consensus_distance`` makes three [n, d] float64 tensors per call (X, X − X̄, its square;
    GBs at large n, fresh pages every step) and passes over them five times. Here the column
    means come from column blocks (a column's mean is a reduction within that column: same
    bits), (x_i − x̄)² is formed block by block of rows in cache and written once into a
    float64 buffer kept across calls, and that buffer is summed as one tensor, as
    ``consensus_distance`` sums it (its summation order depends on the tensor's size)."""

    def __init__(self) -> None:
        self._work: torch.Tensor | None = None  # [n, d] float64: (x_i − x̄)²
        self._mean: torch.Tensor | None = None  # [1, d] float64
        self._block: torch.Tensor | None = None  # [n, columns] float64

    def __call__(self, x: torch.Tensor) -> float:
        if x.dim() != 2 or not x.is_floating_point() or x.shape[0] < 1 or x.device.type != "cpu":
            return consensus_distance(x)  # and its error messages (a GPU caches its memory)
        n, d = x.shape
        columns = cache_blocks(d, n * 8)
        width = max(e - s for s, e in columns)
        work, mean, block = self._work, self._mean, self._block
        if work is None or mean is None or block is None or work.shape != x.shape:
            work = self._work = torch.empty(n, d, dtype=torch.float64)
            mean = self._mean = torch.empty(1, d, dtype=torch.float64)
            block = self._block = torch.empty(n, width, dtype=torch.float64)
        for s, e in columns:
            part = block[:, : e - s]
            part.copy_(x[:, s:e])
            torch.mean(part, dim=0, keepdim=True, out=mean[:, s:e])
        for s, e in cache_blocks(n, d * 8):
            work[s:e].copy_(x[s:e]).sub_(mean).square_()
        return math.sqrt(float(work.sum()) / n)


class _Progress(RunHooks):
    """``on_progress(record)`` after every step (tests follow their runs with it)."""

    def __init__(self, fn: ProgressFn) -> None:
        self.fn = fn

    def stepped(self, step: int, record: StepRecord) -> None:
        self.fn(record)


class VectorizedControl:
    """`ControlHook` + `RoundControl` of the vectorized engine: every replica is local, so the
    controller sees the global statistic (Θ over all n, or the exact Ξ) at once."""

    def __init__(
        self,
        controller: ConsensusController,
        statistic: str,
        lagged: bool,
        meter: ConsensusMeter | None = None,
    ) -> None:
        self.controller = controller
        self.statistic = statistic
        self.lagged = lagged
        self.meter = meter or ConsensusMeter()
        self.step = 0
        self.planned: int | None = None  # lagged mode: rounds fixed at the start of the step
        self.values: list[float] = []
        self.target: float | None = None

    def begin(self, step: int, phase: Phase, grad_norms: torch.Tensor) -> RoundControl:
        self.step = step
        planned = self.controller.begin_step(step, float(grad_norms.mean()))
        self.planned = planned if self.lagged else None
        self.values = []
        self.target = self.controller.target(step)
        return self

    def end(self, step: int) -> float | None:
        self.controller.end_step(step, self.values)
        return self.target

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        if self.statistic == "xi":
            value = self.meter(x)
        else:
            value = round_statistic(self.statistic, self.step, x, theta_local)
        self.values.append(value)
        if self.planned is not None:
            return round_index < self.planned
        return self.controller.after_round(self.step, round_index, value).repeat


class VectorizedGraphs:
    """`GraphHook` of ``ada-feedback`` in the vectorized engine: every replica is local, so the
    graph controller is fed the θ_i and ‖g_i‖ of all n at once (as Python floats: the same
    math.fsum means the orchestrator computes from the peers' scalars)."""

    def __init__(self, feedback: GraphFeedback) -> None:
        self.feedback = feedback

    def observe(
        self, step: int, phase: Phase, grad_norms: torch.Tensor, report: StepReport
    ) -> None:
        assert report.theta_local is not None  # StepRunner only calls this after gossip
        thetas = [float(v) for v in report.theta_local.cpu()]
        self.feedback.observe(step, phase.index, thetas, [float(g) for g in grad_norms.cpu()])


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
        tune_engine_malloc(self.task.x.numel() * self.task.x.element_size())
        self.comm = VectorizedComm(cfg.peers, device=self.device)
        self.schedule = make_lr_schedule(cfg, self.task.steps_per_epoch)
        self.plan = make_plan(cfg, self.schedule)
        self.controller = ConsensusController(control_config(cfg), self.plan, calibration)
        self.xi = ConsensusMeter()  # Ξ of every step (and the controller's, for statistic xi)
        self.control = VectorizedControl(
            self.controller, cfg.control.statistic, cfg.control.lagged, self.xi
        )
        # adaptive graphs (concord.core.graphs.adagraph): ada-schedule's per-phase graphs from the
        # config, ada-feedback's exponential:K from its controller (a peer takes both from the
        # orchestrator's published schedule instead)
        self.feedback: GraphFeedback | None = None
        graphs = None
        if cfg.spec.adaptive_graph == "feedback":
            self.feedback = GraphFeedback(feedback_config(cfg.hyper), cfg.peers)
            graphs = VectorizedGraphs(self.feedback)
        self.runner = StepRunner(cfg, self.task, self.comm, control=self.control, graphs=graphs)
        phases = len(self.plan.phases)
        self.runner.schedules.set_topologies(
            initial_topologies(cfg.algorithm, cfg.hyper, cfg.peers, phases)
        )
        if self.feedback is not None:  # every graph it may move to (and the manifest's spectra)
            for k in range(1, self.feedback.k_max + 1):
                self.runner.schedules.get(self.plan.phases[0], topology=exponential_name(k))
        # asynchronous algorithms: wait-free steps on a virtual clock (concord.sim.asynchronous)
        self.asynchronous: AsyncSimulation | None = None
        if cfg.spec.asynchronous:
            self.asynchronous = make_simulation(cfg, self.runner, self.comm)

    @property
    def total_steps(self) -> int:
        return self.runner.total_steps

    @property
    def rounds_total(self) -> int:
        return self.runner.rounds_total

    @property
    def algorithm(self) -> Algorithm:
        return self.runner.algorithm

    @property
    def schedules(self) -> Schedules:
        return self.runner.schedules

    def eval_interval(self) -> int:
        return self.runner.eval_interval()

    def run_state(self, step: int, wall_seconds: float | None = None) -> CheckpointRunState:
        """What the run needs beyond tensors to continue after ``step`` (for
        `RunWriter.save_checkpoint`): the next step, the global gossip-round counter (indexes
        time-varying graphs and codec keys), the byte counters, the controller and the
        ``ada-feedback`` controller."""
        return CheckpointRunState(
            engine="vectorized",
            next_step=step + 1,
            total_steps=self.total_steps,
            rounds_total=self.runner.rounds_total,
            counters=counters_state(self.comm.counters),
            controller=self.controller.state_dict(),
            feedback=self.feedback.state_dict() if self.feedback is not None else None,
            wall_seconds=wall_seconds,
        )

    def load_run_state(self, state: CheckpointRunState) -> int:
        """Restore `run_state`; returns the step to continue from."""
        if self.asynchronous is not None:
            raise ValueError(
                f"algorithm {self.cfg.algorithm!r}: resuming an asynchronous simulation is not "
                "supported (its event queue and messages in flight are not checkpointed)"
            )
        if state.engine != "vectorized" or state.total_steps != self.total_steps:
            raise ValueError(
                f"the checkpoint is of a {state.engine!r} run of {state.total_steps} steps; "
                f"this is a vectorized run of {self.total_steps} steps"
            )
        self.runner.rounds_total = state.rounds_total
        load_counters(self.comm.counters, state.counters)
        self.controller.load_state_dict(state.controller or {})
        if self.feedback is not None and state.feedback is not None:
            self.feedback.load_state_dict(state.feedback)
        return state.next_step

    def train_step(self, step: int) -> StepRecord:
        """One step of every replica; returns its metrics record (with the exact Ξ)."""
        if self.feedback is not None:  # the K decided at s is in force from s + lag on
            name = self.feedback.topology(step)
            self.runner.schedules.set_topologies({p.index: name for p in self.plan.phases})
        if self.asynchronous is not None:
            record = self.asynchronous.step(step)
        else:
            record, _ = self.runner.run_step(step)
        return replace(record, xi=self.xi(self.task.x))


# ---------------------------------------------------------------------------------------------
# Run state in checkpoints (plain containers: loads with torch.load(weights_only=True))


class _Checkpoints(RunHooks):
    """``checkpoint.pt`` after every evaluation but the final one (`run` writes that)."""

    def __init__(self, writer: RunWriter, trainer: Trainer, elapsed: Callable[[], float]) -> None:
        self.writer = writer
        self.trainer = trainer
        self.elapsed = elapsed

    def evaluated(self, step: int, record: EvalRecord) -> None:
        if step + 1 < self.trainer.total_steps:
            state = self.trainer.run_state(step, self.elapsed())
            self.writer.save_checkpoint(
                self.trainer.task, self.trainer.algorithm, step, run_state=state
            )


# ---------------------------------------------------------------------------------------------
# Calibration (constant targets)


def calibration_key(cfg: RunConfig) -> str:
    d = cfg.to_dict()
    for key in ("name", "eval", "engine", "threads", "device", "tensorboard"):
        d.pop(key, None)
    d["control"] = {"statistic": cfg.control.statistic, "phases": sorted(cfg.control.phases)}
    blob = json.dumps(d, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def calibrate(cfg: RunConfig, cache_dir: Path | None = None) -> Calibration:
    """Max statistic per controlled phase of an uncontrolled pass over the same plan."""
    key = calibration_key(cfg)
    path = cache_dir / f"calibration-{key}.json" if cache_dir else None
    if path is not None and path.is_file():
        return read_calibration(path)
    uncontrolled = apply_overrides(cfg, {"control.mode": "none"})
    trainer = Trainer(uncontrolled)
    controlled = [p for p in make_plan(cfg, trainer.schedule).phases if p.controlled]
    last = max(p.end for p in controlled)
    recorder = CalibrationRecorder(cfg.control.statistic)
    for step in range(last):
        rec = trainer.train_step(step)
        value = rec.xi if cfg.control.statistic == "xi" else rec.theta
        if cfg.control.statistic == "sketch" and rec.theta is not None:
            value = sketch_xi(trainer.task.x, step)  # after the step's round, as rec.theta
        if value is not None and rec.phase is not None:
            recorder.observe(step, rec.phase, value)
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
    plots: bool = True,
    resume: bool = False,
) -> dict[str, JSON]:
    """Train one run with the vectorized engine and write its run directory; returns the
    summary's JSON document (`RunSummary.to_json`; `train` returns the record).

    ``plots``: also draw the run's PNGs (`concord.runtime.plots`); preset sweeps plot in their
    report instead. ``resume``: continue the interrupted run in ``out_dir`` from its
    ``checkpoint.pt`` (``cfg`` must be the run's ``config.toml``; see `resume_run`); a finished
    run's summary is returned as it is.
    """
    summary = train(
        cfg,
        out_dir,
        progress=progress,
        calibration_cache=calibration_cache,
        on_progress=on_progress,
        plots=plots,
        resume=resume,
    )
    return summary.to_json()


def _saved_state(out_dir: Path) -> tuple[CheckpointTable, CheckpointRunState]:
    """The checkpoint of the interrupted run in ``out_dir`` (its tensors' table, read by
    `restore_checkpoint` only) and its run state."""
    path = out_dir / "checkpoint.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{out_dir} has no checkpoint.pt to resume from")
    saved = load_checkpoint(path)
    state = run_state_of(saved, path)
    if state is None:
        raise ValueError(f"{path} holds no run state (written by an older version)")
    return saved, state


def train(
    cfg: RunConfig,
    out_dir: Path,
    *,
    progress: bool = True,
    calibration_cache: Path | None = None,
    on_progress: ProgressFn | None = None,
    plots: bool = True,
    resume: bool = False,
) -> RunSummary:
    """`run`, returning the summary as its record."""
    if cfg.engine != "vectorized":  # this *is* the vectorized engine; the run dir says so
        cfg = apply_overrides(cfg, {"engine": "vectorized"})
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    started = time.perf_counter()
    out_dir = Path(out_dir)
    saved: tuple[CheckpointTable, CheckpointRunState] | None = None
    if resume:
        saved = _saved_state(out_dir)
        done = read_summary(out_dir) if saved[1].finished else None
        if done is not None:
            return done
    resume_after = None if saved is None else saved[1].next_step - 1
    writer = RunWriter(out_dir, cfg, engine=cfg.engine, resume_after=resume_after)
    calibration = None
    if cfg.control.mode == "constant" and cfg.controlled_phases():
        if saved is not None and (writer.dir / "calibration.json").is_file():
            calibration = read_calibration(writer.dir / "calibration.json")
        else:
            cache = calibration_cache or writer.dir / "calibration"
            writer.log.info("calibration.start", cache=str(cache))
            calibration = calibrate(cfg, cache)
            writer.write_json("calibration.json", calibration.record())
    trainer = Trainer(cfg, calibration=calibration)
    task = trainer.task
    start = 0
    before = 0.0  # wall seconds of the run before this resumption
    if saved is not None:
        restore_checkpoint(saved[0], task, trainer.algorithm)
        start = trainer.load_run_state(saved[1])
        before = saved[1].wall_seconds or 0.0
        writer.log.info("run.resumed", step=start)
    else:
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

    def elapsed() -> float:
        return before + time.perf_counter() - started

    def evaluate(step: int, rec: StepRecord, final: bool) -> EvalRecord:
        return task.eval_record(
            step,
            rec.epoch,
            xi=rec.xi,
            peers=cfg.eval.peers or final,
            peer_samples=None if final else cfg.eval.peer_samples,
        )

    hooks: list[RunHooks] = []
    if on_progress is not None:
        hooks.append(_Progress(on_progress))
    with ProgressBar(trainer.total_steps, enabled=progress) as bar:
        result = drive(
            steps=trainer.total_steps,
            interval=trainer.eval_interval(),
            last_step=trainer.total_steps - 1,
            train=trainer.train_step,
            evaluate=evaluate,
            sink=writer,
            hooks=[bar, _Checkpoints(writer, trainer, elapsed), *hooks],
            start=start,
        )
    last = result.last_eval
    if last is None and saved is not None:  # resumed after the last step: its eval is on disk
        evals = read_evals(writer.dir)
        last = evals[-1] if evals else None
    final_state = trainer.run_state(trainer.total_steps - 1, elapsed())
    writer.save_checkpoint(task, trainer.algorithm, trainer.total_steps, run_state=final_state)
    writer.write_json("edges.json", trainer.comm.counters.edge_table())
    if trainer.feedback is not None:  # ada-feedback: every decision point, like the orchestrator
        lines = [json.dumps(d.to_json()) + "\n" for d in trainer.feedback.decisions]
        (writer.dir / "graphs.jsonl").write_text("".join(lines), encoding="utf-8")
    summary = RunSummary(
        engine="vectorized",
        **cfg.summary_fields(),
        steps=trainer.total_steps,
        accuracy_avg_model=None if last is None else last.accuracy_avg_model,
        accuracy_worst_peer=None if last is None else last.accuracy_worst_peer,
        accuracy_mean_peer=None if last is None else last.accuracy_mean_peer,
        gossip_rounds_total=trainer.rounds_total,
        bytes_sent_total=trainer.comm.counters.bytes_wire,
        bytes_raw_total=trainer.comm.counters.bytes_raw,
        final_consensus_distance=trainer.xi(task.x),
        partition_sha256=partition_digest(task.parts),
        wall_seconds=elapsed(),
        run_dir=str(writer.dir),
        resumed_from_step=start if saved is not None else None,
    )
    writer.finish(summary, plots=plots)
    return summary


def resume_run(run_dir: Path, *, progress: bool = True, plots: bool = True) -> dict[str, JSON]:
    """Continue the interrupted vectorized run in ``run_dir`` (its ``config.toml`` and
    ``checkpoint.pt``) to its end; returns the summary."""
    from concord.core.config import load_config

    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").is_file():
        raise FileNotFoundError(f"{run_dir} has no config.toml: not a run directory")
    cfg = load_config(run_dir / "config.toml", [], environ={})
    return run(cfg, run_dir, progress=progress, plots=plots, resume=True)
