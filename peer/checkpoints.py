"""A peer's checkpoints: written after every evaluation and at a stop (`Checkpoints`), and read
back in the ``resuming`` state (`concord.peer.lifecycle`) by a peer started again on its run
directory (`resumable`, `restore`). A checkpoint holds the replica's parameters, the algorithm's
and the sampler's state, and the run state beyond tensors (`run_state`: the next step, the
gossip-round counter, the byte counters, the config's identity)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from concord.core.config import RunConfig, run_identity
from concord.core.loop import StepRunner
from concord.core.records import CheckpointRunState, EvalRecord
from concord.core.task import ClassificationTask
from concord.errors import PeerConfigError
from concord.peer.comm import RoundComm
from concord.runtime.driver import RunHooks
from concord.runtime.records import read_peer_summary
from concord.runtime.rundir import (
    CheckpointTable,
    RunWriter,
    checkpoint_steps,
    counters_state,
    load_checkpoint,
    load_counters,
    restore_checkpoint,
    run_state_of,
)

__all__ = ["Checkpoint", "Checkpoints", "restore", "resumable", "run_state"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint a peer continues from: the tensors' state (`load_checkpoint`'s table, read
    by `restore_checkpoint` only) and its run state."""

    state: CheckpointTable
    run: CheckpointRunState


def resumable(
    out: Path, cfg: RunConfig, peer_id: int, *, step: int | None = None
) -> Checkpoint | None:
    """The checkpoint a static peer restarted on ``out`` continues from: one with run state of
    this peer and config, of a run that did not complete (None: start afresh). ``step``: the
    one of that step (``checkpoint.pt`` or ``checkpoint.prev.pt``), for a resumed run."""
    path = out / "checkpoint.pt" if step is None else checkpoint_steps(out).get(step)
    if path is None or not path.is_file():
        return None
    summary = read_peer_summary(out)
    if summary is not None and summary.completed:
        return None
    state = load_checkpoint(path)
    run = run_state_of(state, path)
    if run is None or run.engine != "peer" or run.peer != peer_id:
        return None
    if run.config != run_identity(cfg):
        raise PeerConfigError(
            f"{out} holds a checkpoint of another config; use the same --config to resume, or "
            "--force to start over"
        )
    return Checkpoint(state, run)


def run_state(cfg: RunConfig, peer_id: int, runner: StepRunner, step: int) -> CheckpointRunState:
    """The peer's state beyond tensors after ``step`` (a checkpoint's ``run``)."""
    return CheckpointRunState(
        engine="peer",
        peer=peer_id,
        next_step=step + 1,
        step_base=runner.comm.step_base if isinstance(runner.comm, RoundComm) else 0,
        total_steps=runner.total_steps,
        rounds_total=runner.rounds_total,
        counters=counters_state(runner.comm.counters),
        config=run_identity(cfg),
    )


def restore(checkpoint: Checkpoint, runner: StepRunner, task: ClassificationTask, out: Path) -> int:
    """Load ``checkpoint`` (of run directory ``out``) into the task, algorithm and counters;
    the step to continue from."""
    run = checkpoint.run
    if run.total_steps != runner.total_steps:
        raise PeerConfigError(
            f"the checkpoint in {out} is of a {run.total_steps}-step run; this run "
            f"has {runner.total_steps} steps (pass --force to start over)"
        )
    restore_checkpoint(checkpoint.state, task, runner.algorithm)
    runner.rounds_total = run.rounds_total
    load_counters(runner.comm.counters, run.counters)
    log.info("peer.resume", step=run.next_step)
    return run.next_step


class Checkpoints(RunHooks):
    """``checkpoint.pt`` after every evaluation, and of the last complete step on a stop."""

    def __init__(
        self,
        writer: RunWriter,
        cfg: RunConfig,
        peer_id: int,
        runner: StepRunner,
        task: ClassificationTask,
    ) -> None:
        self.writer, self.cfg, self.peer_id = writer, cfg, peer_id
        self.runner, self.task = runner, task

    def _save(self, step: int) -> None:
        state = run_state(self.cfg, self.peer_id, self.runner, step)
        self.writer.save_checkpoint(
            self.task, self.runner.algorithm, step, run_state=state, keep_previous=True
        )

    def evaluated(self, step: int, record: EvalRecord) -> None:
        self._save(step)

    def stopping(self, step: int) -> None:
        log.info("peer.stopping", step=step)
        if step > 0:  # keep the last completed step for a restart
            self._save(step - 1)
