"""The orchestrator's checkpoint: what a resumed run needs from the control plane.

Peers checkpoint after every evaluation (steps ``c`` with ``(c + 1) % interval == 0``, and the
last step), each its own replica, keeping the previous one too (``checkpoint.prev.pt``). The
orchestrator's share of the run's state at such a step — the consensus controller (targets,
adaptive-target EMA, lagged plans), the calibration, the train stage's step base — is written
here, ``orchestrator-checkpoint.json``, atomically, for the most recent `KEEP` checkpoint steps.

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
from pathlib import Path
from typing import Any

from concord.core.config import RunConfig, run_identity
from concord.core.control.calibration import Calibration
from concord.core.control.controller import ConsensusController
from concord.core.control.plan import PhasePlan
from concord.errors import OrchestratorError

CHECKPOINT_FILE = "orchestrator-checkpoint.json"
VERSION = 1
KEEP = 3  # checkpoint steps kept behind the controller: peers are one or two apart


def eval_interval(cfg: RunConfig, steps_per_epoch: int) -> int:
    """The peers' evaluation (and checkpoint) interval (`concord.core.loop.StepRunner`)."""
    return max(1, round(cfg.eval.every * steps_per_epoch))


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
        resumed: dict[str, Any] | None = None,
    ) -> None:
        self.path = out / CHECKPOINT_FILE
        self.plan = plan
        self.interval = eval_interval(cfg, steps_per_epoch)
        self.last_step = plan.total_steps - 1
        self.controller = controller
        self.head = {
            "version": VERSION,
            "config": run_identity(cfg),
            "steps_per_epoch": steps_per_epoch,
            "step_base": step_base,
            "calibration": None if calibration is None else calibration.to_json(),
        }
        self.snapshots: dict[int, dict[str, Any]] = {}
        if resumed is not None:  # a resumed run keeps what it resumed from
            self.snapshots = {int(k): v for k, v in resumed["controller"].items()}
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

    def _write(self) -> None:
        body = {**self.head, "controller": {str(c): s for c, s in sorted(self.snapshots.items())}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
        tmp.replace(self.path)


def checkpoint_steps(out: Path) -> set[int]:
    """The steps ``orchestrator-checkpoint.json`` in ``out`` holds (empty: none, or unreadable)."""
    try:
        body = json.loads((out / CHECKPOINT_FILE).read_text(encoding="utf-8"))
        return {int(k) for k in body["controller"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


def load(out: Path, step: int, cfg: RunConfig) -> dict[str, Any]:
    """The checkpoint to resume after ``step``: ``steps_per_epoch``, ``step_base``,
    ``calibration`` (a `Calibration` or None), ``state`` (the controller's at ``step``) and
    ``controller`` (every snapshot, kept by the resumed run). Raises `OrchestratorError` naming
    what is wrong."""
    path = out / CHECKPOINT_FILE
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise OrchestratorError(f"cannot resume: {path} cannot be read ({exc})") from None
    except ValueError as exc:
        raise OrchestratorError(f"cannot resume: {path} is not JSON ({exc})") from None
    if not isinstance(body, dict) or body.get("version") != VERSION:
        raise OrchestratorError(f"cannot resume: {path} is not a version-{VERSION} checkpoint")
    if body.get("config") != run_identity(cfg):
        raise OrchestratorError(f"cannot resume: {path} is of another config than this run's")
    snapshots = body.get("controller")
    if not isinstance(snapshots, dict) or str(step) not in snapshots:
        held = sorted(int(k) for k in snapshots) if isinstance(snapshots, dict) else []
        raise OrchestratorError(f"cannot resume after step {step}: {path} holds steps {held}")
    raw = body.get("calibration")
    try:
        calibration = None if raw is None else Calibration.from_json(raw)
    except (ValueError, TypeError, KeyError) as exc:
        raise OrchestratorError(f"cannot resume: the calibration in {path}: {exc}") from None
    return {
        "steps_per_epoch": int(body["steps_per_epoch"]),
        "step_base": int(body["step_base"]),
        "calibration": calibration,
        "state": snapshots[str(step)],
        "controller": snapshots,
    }
