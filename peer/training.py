"""The ``training`` state of a peer (`concord.peer.lifecycle`): what runs around each step of a
stage in the training thread — the step's clock (`StepClock`), Fetch answers at step boundaries
(`Serve`), the step and evaluation records (`StageSteps`) and the stage's summary
(`stage_summary`). The loop itself is `concord.runtime.driver.drive`; the peer's driver
(`concord.peer.app.PeerProcess.train`) assembles these and moves the lifecycle."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog

from concord.core.data import partition_digest
from concord.core.loop import StepRunner
from concord.core.records import JSON, EvalRecord, PeerSummary, StepRecord
from concord.core.task import ClassificationTask
from concord.peer.comm import PeerComm, RoundComm
from concord.peer.rejoin import Jumps
from concord.runtime.driver import DriveResult, RunHooks

__all__ = ["Serve", "StageSteps", "StepClock", "stage_summary"]

log = structlog.get_logger(__name__)


class StepClock(RunHooks):
    """Binds the step to this thread's log lines, tells ``on_step`` and starts the step's clock,
    first of all hooks (a step's ``step_ms`` includes the waits of the hooks before it)."""

    def __init__(self, on_step: Callable[[int], None]) -> None:
        self.on_step = on_step
        self.started = time.perf_counter()

    def before(self, step: int) -> None:
        self.on_step(step)
        structlog.contextvars.bind_contextvars(step=step)
        self.started = time.perf_counter()


class Serve(RunHooks):
    """Fetch answers (`concord.peer.transport.Transport.snapshot`): at each step boundary, a copy
    of the parameters for the neighbours waiting — never a torn read of a step in progress."""

    def __init__(self, runner: StepRunner, task: ClassificationTask, comm: PeerComm | None) -> None:
        self.runner, self.task, self.comm = runner, task, comm
        if comm is not None:
            comm.transport.training = True

    def before(self, step: int) -> None:
        comm = self.comm
        if comm is not None and comm.transport.wanted:
            algorithm = self.runner.algorithm
            state = {
                k: v[0]
                for k, v in algorithm.state_dict().items()
                if k in algorithm.portable_state and v.dim() == 2
            }
            comm.transport.fulfil(
                self.task.x[0], comm.step_base + step, self.runner.rounds_total, state
            )

    def close(self) -> None:
        if self.comm is not None:
            self.comm.loop.call_soon_threadsafe(self.comm.transport.stop_serving)


class StageSteps:
    """One stage's step and evaluation records of peer ``peer``: the runner's record plus the
    step's wall time, where its communication went, the jump that landed on it, and which
    neighbours were missing, rejected or skipped."""

    def __init__(
        self,
        peer: int,
        runner: StepRunner,
        task: ClassificationTask,
        clock: StepClock,
        jumps: Jumps | None,
    ) -> None:
        self.peer, self.runner, self.task, self.clock, self.jumps = peer, runner, task, clock, jumps
        self.comm = runner.comm if isinstance(runner.comm, PeerComm) else None

    def step(self, step: int) -> StepRecord:
        """Run ``step``; its `StepRecord`, with this peer's keys in ``extra`` (the hooks after
        it add theirs: `concord.runtime.driver.StepHooks.after`)."""
        runner = self.runner
        record, report = runner.run_step(step)
        extra: dict[str, JSON] = {
            "step_ms": (time.perf_counter() - self.clock.started) * 1e3  # incl. control waits
        }
        if isinstance(runner.comm, RoundComm):  # where communication went (`Breakdown`)
            extra.update(runner.comm.take_breakdown())
        jumped_from = self.jumps.landed(step) if self.jumps is not None else None
        if jumped_from is not None:
            extra["jumped_from"] = jumped_from
        missing = sorted({j for o in report.outcomes for m in o.missing for j in m})
        extra["missing"] = list(missing)
        rejected = sorted({j for o in report.outcomes for r in o.rejected for j, _ in r})
        extra["rejected"] = list(rejected)
        if self.comm is not None:  # neighbours not waited for after this step
            extra["skipped"] = list(self.comm.transport.suspected)
        if missing:
            log.warning("round.missing", step=step, round=record.rounds_total, neighbours=missing)
        return replace(record, peer=self.peer, extra={**record.extra, **extra})

    def evaluate(self, step: int, record: StepRecord, final: bool) -> EvalRecord:
        """The peer's evaluation record: its replica's test accuracy and loss."""
        ev = self.task.eval_record(step, record.epoch, peers=True)
        return EvalRecord(
            step=step,
            epoch=ev.epoch,
            peer=self.peer,
            accuracy_mean_peer=ev.accuracy_mean_peer,
            loss_mean_peer=ev.loss_mean_peer,
        )


def stage_summary(
    peer: int,
    runner: StepRunner,
    task: ClassificationTask,
    result: DriveResult[EvalRecord],
    *,
    start: int,
    rejoined: dict[str, int],
    jumps: Jumps | None,
    seconds: float,
    run_dir: Path,
) -> PeerSummary:
    """What a stage leaves for the peer's summary; ``start``: the step it began at (> 0: resumed
    or rejoined), ``seconds``: the training loop's time (evaluations included). ``extra``: the
    rejoin (``rejoined``), the jumps, ``train_seconds`` and this process's ``cpu_seconds``."""
    extra: dict[str, JSON] = {"rejoined": dict(rejoined)} if rejoined else {}
    extra.update(jumps.summary() if jumps is not None else {"jumps": 0, "steps_jumped": 0})
    extra.update(train_seconds=seconds, cpu_seconds=time.process_time())  # every thread so far
    counters = runner.comm.counters
    last = result.last_eval
    return PeerSummary(
        completed=result.steps == runner.total_steps or result.spent,
        peer=peer,
        steps=result.steps,
        accuracy_mean_peer=None if last is None else last.accuracy_mean_peer,
        gossip_rounds_total=runner.rounds_total,
        bytes_sent_total=counters.bytes_wire,
        bytes_raw_total=counters.bytes_raw,
        bytes_per_edge=counters.edge_table(),
        partition_sha256=partition_digest(task.parts),
        resumed_from_step=start if start else None,
        run_dir=str(run_dir),
        extra=extra,
    )
