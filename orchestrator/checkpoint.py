"""The orchestrator's checkpoint: what a resumed run needs from the control plane.

Peers checkpoint after every evaluation (steps ``c`` with ``(c + 1) % interval == 0``, and the
last step), each its own replica, keeping the previous one too (``checkpoint.prev.pt``). The
orchestrator's share of the run's state at such a step — the consensus controller (targets,
adaptive-target EMA, lagged plans), the calibration, the train stage's step base — is written
here, ``orchestrator-checkpoint.json`` (a `concord.core.records.ControlCheckpointState`),
atomically, for the most recent `KEEP` checkpoint steps.

The controller's state "after step c" is its state after the last *controlled* step ≤ c ended
(`RoundBook.on_end`): uncontrolled steps do not touch it, and the next controlled step is
begun only after that one ended. So when a controlled step ``s`` ends, the state is recorded for
every checkpoint step from ``s`` up to the next controlled step; checkpoint steps before the
first controlled step get the controller's initial state.

``concord sim --resume RUN_DIR`` (processes engine, `concord.sim.processes`) picks the newest step
that every peer and this file hold, and starts the orchestrator and the peers with
``--resume-step`` that step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from concord.core.config import RunConfig, run_identity
from concord.core.control.calibration import Calibration
from concord.core.control.controller import ConsensusController
from concord.core.control.plan import PhasePlan
from concord.core.records import JSON, ControlCheckpointState, RecordError
from concord.errors import OrchestratorError

CHECKPOINT_FILE = "orchestrator-checkpoint.json"
KEEP = 3  # checkpoint steps kept behind the controller: peers are one or two apart


def eval_interval(cfg: RunConfig, steps_per_epoch: int) -> int:
    """The peers' evaluation (and checkpoint) interval (`concord.core.loop.StepRunner`)."""
    return max(1, round(cfg.eval.every * steps_per_epoch))


@dataclass(frozen=True)
class Resume:
    """What a resumed run takes from the checkpoint (`load`): the checkpoint itself, its
    calibration, and the controller's ``state`` after the step resumed from."""

    checkpoint: ControlCheckpointState
    calibration: Calibration | None
    state: dict[str, JSON]


class ControlCheckpoint:
    """Records the controller's state at the peers' checkpoint steps; writes the file."""

    def __init__(
        self,
        out: Path,
        cfg: RunConfig,
        plan: PhasePlan,
        steps_per_epoch: int,
        *,
        step_base: int,
        calibration: Calibration | None,
        controller: ConsensusController,
        resumed: ControlCheckpointState | None = None,
    ) -> None:
        self.path = out / CHECKPOINT_FILE
        self.plan = plan
        self.interval = eval_interval(cfg, steps_per_epoch)
        self.last_step = plan.total_steps - 1
        self.controller = controller
        self.identity = run_identity(cfg)
        self.steps_per_epoch = steps_per_epoch
        self.step_base = step_base
        self.calibration = None if calibration is None else calibration.to_json()
        self.snapshots: dict[int, dict[str, JSON]] = {}
        if resumed is not None:  # a resumed run keeps what it resumed from
            self.snapshots = {int(k): v for k, v in resumed.controller.items()}
        else:
            self._record(-1)

    def ended(self, step: int) -> None:
        """`RoundBook.on_end`: the controller ended controlled step ``step``."""
        self._record(step)

    def _record(self, step: int) -> None:
        upto = self._next_controlled(step)
        checkpoints = self._checkpoint_steps(max(step, 0), upto)
        if not checkpoints:
            return
        state = self.controller.state_dict()
        for c in checkpoints:
            self.snapshots[c] = state
        # the steps ahead (peers reach them with this state) and the newest behind
        for old in sorted(c for c in self.snapshots if c < step)[:-KEEP]:
            del self.snapshots[old]
        self._write()

    def _next_controlled(self, step: int) -> int:
        """The first controlled step after ``step`` (the plan's end if none)."""
        starts = [
            max(p.start, step + 1) for p in self.plan.phases if p.controlled and p.end > step + 1
        ]
        return min(starts, default=self.plan.total_steps)

    def _checkpoint_steps(self, lo: int, hi: int) -> list[int]:
        """Checkpoint steps c with lo ≤ c < hi."""
        first = lo + (-(lo + 1)) % self.interval
        found = list(range(first, hi, self.interval))
        if lo <= self.last_step < hi and self.last_step not in found:
            found.append(self.last_step)
        return found

    def state(self) -> ControlCheckpointState:
        """The checkpoint as it stands."""
        return ControlCheckpointState(
            config=self.identity,
            steps_per_epoch=self.steps_per_epoch,
            step_base=self.step_base,
            calibration=self.calibration,
            controller={str(c): s for c, s in sorted(self.snapshots.items())},
        )

    def _write(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.state().to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.path)


def read(out: Path) -> ControlCheckpointState:
    """``out``'s ``orchestrator-checkpoint.json``. Raises OSError when it cannot be read,
    ValueError when it is not JSON, `concord.core.records.RecordError` (a ValueError) naming the
    field that does not match, `concord.core.records.RecordVersionError` for a newer version."""
    path = out / CHECKPOINT_FILE
    text = path.read_text(encoding="utf-8")
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    return ControlCheckpointState.from_json(body, where=str(path))


def checkpoint_steps(out: Path) -> set[int]:
    """The steps ``orchestrator-checkpoint.json`` in ``out`` holds (empty: none, or unreadable)."""
    try:
        return read(out).steps
    except (OSError, ValueError):
        return set()


def load(out: Path, step: int, cfg: RunConfig) -> Resume:
    """The checkpoint to resume after ``step``, checked against this run's ``cfg``. Raises
    `OrchestratorError` naming what is wrong."""
    path = out / CHECKPOINT_FILE
    try:
        saved = read(out)
    except OSError as exc:
        raise OrchestratorError(f"cannot resume: {path} cannot be read ({exc})") from None
    except RecordError as exc:
        raise OrchestratorError(f"cannot resume: {exc}") from None
    except ValueError as exc:
        raise OrchestratorError(f"cannot resume: {path} is not JSON ({exc})") from None
    if saved.config != run_identity(cfg):
        raise OrchestratorError(f"cannot resume: {path} is of another config than this run's")
    if str(step) not in saved.controller:
        held = sorted(saved.steps)
        raise OrchestratorError(f"cannot resume after step {step}: {path} holds steps {held}")
    try:
        calibration = (
            None
            if saved.calibration is None
            else Calibration.from_json(saved.calibration, where=f"{path} calibration")
        )
    except RecordError as exc:
        raise OrchestratorError(f"cannot resume: {exc}") from None
    return Resume(saved, calibration, saved.controller[str(step)])
