"""The orchestrator's checkpoint (`concord.orchestrator.checkpoint`): the controller's state is
recorded for exactly the peers' checkpoint steps, from the last controlled step that ended at or
before each, and a resume names what is wrong with a checkpoint it cannot use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from concord.core.config import load_config
from concord.core.control.calibration import Calibration
from concord.core.control.controller import ConsensusController
from concord.core.control.runplan import control_config, make_lr_schedule, make_plan
from concord.errors import OrchestratorError
from concord.orchestrator import checkpoint

SPE = 10  # steps per epoch: 4 epochs = 40 steps, evaluations every 5 steps
CALIBRATION = Calibration({1: 1.0}, "theta")


def _setup(tmp_path: Path) -> tuple[checkpoint.ControlCheckpoint, ConsensusController]:
    cfg = load_config(
        None,
        [
            "epochs=4",
            "eval.every=0.5",
            "optim.warmup=0.0",
            "optim.milestones=[0.5]",  # phase 1: steps 0-19 (controlled), phase 2: 20-39
            "control.mode=adaptive",  # its EMA moves: states differ
            "control.phases=[1]",
        ],
        environ={},
    )
    plan = make_plan(cfg, make_lr_schedule(cfg, SPE))
    ctl = ConsensusController(control_config(cfg), plan)
    saver = checkpoint.ControlCheckpoint(
        tmp_path, cfg, plan, SPE, step_base=7, calibration=CALIBRATION, controller=ctl
    )
    return saver, ctl


def _run_step(ctl: ConsensusController, step: int, stats: list[float]) -> None:
    ctl.begin_step(step, 1.0 + step)
    for r, s in enumerate(stats, 1):
        ctl.after_round(step, r, s)
    ctl.end_step(step, stats)


def test_states_are_recorded_for_checkpoint_steps_only(tmp_path: Path) -> None:
    saver, ctl = _setup(tmp_path)
    assert saver.snapshots == {}  # step 0 is controlled: nothing before it to record
    for step in range(5):
        _run_step(ctl, step, [2.0, 0.1])
        saver.ended(step)
    assert sorted(saver.snapshots) == [4]  # (4 + 1) % 5 == 0
    # the last controlled step (19) covers every checkpoint step of the uncontrolled phase 2
    for step in range(5, 20):
        _run_step(ctl, step, [0.1])
        saver.ended(step)
    # KEEP = 3 behind step 19 (4, 9, 14) and all from it on: peers reach those with this state
    assert sorted(saver.snapshots) == [4, 9, 14, 19, 24, 29, 34, 39]
    assert saver.snapshots[24] == saver.snapshots[39] == ctl.state_dict()
    assert saver.snapshots[4] != saver.snapshots[39]
    body = json.loads((tmp_path / checkpoint.CHECKPOINT_FILE).read_text())
    assert body["step_base"] == 7
    assert sorted(int(k) for k in body["controller"]) == sorted(saver.snapshots)


def test_load_returns_the_step_state_and_refuses_what_does_not_fit(tmp_path: Path) -> None:
    saver, ctl = _setup(tmp_path)
    for step in range(5):
        _run_step(ctl, step, [2.0, 0.1])
        saver.ended(step)
    cfg = load_config(
        None,
        [
            "epochs=4",
            "eval.every=0.5",
            "optim.warmup=0.0",
            "optim.milestones=[0.5]",
            "control.mode=adaptive",  # its EMA moves: states differ
            "control.phases=[1]",
            "orchestrator.broker=mqtt://elsewhere:1883",  # where the broker is does not matter
        ],
        environ={},
    )
    got = checkpoint.load(tmp_path, 4, cfg)
    assert got.checkpoint.step_base == 7
    assert got.checkpoint.steps == {4}
    assert got.calibration is not None
    assert got.calibration.max_statistic == {1: 1.0}
    fresh = ConsensusController(control_config(cfg), saver.plan)
    fresh.load_state_dict(got.state)
    assert fresh.state_dict() == ctl.state_dict()
    with pytest.raises(OrchestratorError, match=r"after step 9: .* holds steps \[4\]"):
        checkpoint.load(tmp_path, 9, cfg)
    other = load_config(None, ["epochs=5"], environ={})
    with pytest.raises(OrchestratorError, match="another config"):
        checkpoint.load(tmp_path, 4, other)
    (tmp_path / checkpoint.CHECKPOINT_FILE).write_text("{torn")
    with pytest.raises(OrchestratorError, match="is not JSON"):
        checkpoint.load(tmp_path, 4, cfg)
    assert checkpoint.checkpoint_steps(tmp_path) == set()
