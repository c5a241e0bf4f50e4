"""Consensus control: repeat/stop decisions, lagged rule, targets, calibration, checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from concord.core.control.calibration import read_calibration
from concord.core.control.consensus import consensus_distance, local_theta, theta
from concord.core.control.controller import (
    CONTROL_MODES,
    TARGET_POLICIES,
    Calibration,
    CalibrationRecorder,
    ConsensusController,
    ControlConfig,
    Decision,
    lagged_rounds,
)
from concord.core.control.plan import LRSchedule, PhasePlan, build_plan
from concord.core.records import JSON, CalibrationRecord, RecordError

torch.set_num_threads(1)

N = 16


def ring_w(n: int) -> np.ndarray:
    eye = np.eye(n)
    return (eye + np.roll(eye, 1, axis=1) + np.roll(eye, -1, axis=1)) / 3.0


def plan_3(controlled: tuple[int, ...] = (1,), mode: str = "constant") -> PhasePlan:
    """Steps [0, 10) [10, 15) [15, 20), all gossip."""
    sched = LRSchedule(0.1, 20, 0, (10, 15))
    return build_plan(sched, controlled_phases=controlled, control_mode=mode)


def const_ctrl(target: float = 1.0, **kw: object) -> ConsensusController:
    cfg = ControlConfig(mode="constant", factor=1.0, **kw)  # type: ignore[arg-type]
    return ConsensusController(cfg, plan_3(), Calibration({1: target}, "theta"))


def gossip_thetas(W: np.ndarray, X: np.ndarray, rounds: int) -> list[float]:
    """Θ after each of ``rounds`` repeated rounds X ← W X (independent reference sequence)."""
    out = []
    for _ in range(rounds):
        Y = W @ X
        out.append(theta(local_theta(torch.from_numpy(X), torch.from_numpy(Y))))
        X = Y
    return out


@pytest.mark.parametrize("factor", [0.5, 0.25, 1e-3])
def test_controlled_gossip_stops_at_target_or_max_rounds(factor: float) -> None:
    W = ring_w(N)
    rng = np.random.default_rng(0)
    X0 = rng.normal(size=(N, 40))
    max_rounds = 12
    # calibration: Θ of the first (uncontrolled) round, so factor < 1 needs extra rounds
    rec = CalibrationRecorder("theta")
    rec.observe(0, 1, gossip_thetas(W, X0, 1)[0])
    cfg = ControlConfig(mode="constant", factor=factor, max_rounds=max_rounds)
    ctrl = ConsensusController(cfg, plan_3(), rec.result())
    assert ctrl.begin_step(0, 0.0) == 1
    ctrl_target = ctrl.target(0)
    X, rounds, decision = X0.copy(), 0, Decision(True, None)
    while decision.repeat:
        Y = W @ X
        stat = theta(local_theta(torch.from_numpy(X), torch.from_numpy(Y)))
        X, rounds = Y, rounds + 1
        decision = ctrl.after_round(0, rounds, stat)
        assert rounds <= max_rounds
    ref = gossip_thetas(W, X0, max_rounds)
    target = factor * ref[0]
    assert ctrl_target == pytest.approx(target, rel=1e-15)  # same product, same operands
    below = [r for r, s in enumerate(ref, start=1) if s <= target]
    expected = below[0] if below else max_rounds
    assert rounds == expected
    assert decision.reason == ("at-target" if below else "max-rounds")
    assert decision.target == ctrl_target
    if factor == 1e-3:
        assert decision.reason == "max-rounds"  # unreachable in 12 rounds on a 16-ring
    else:
        assert rounds > 1  # the tighter target really forced repeated gossip
    # repeated gossip really shrinks the consensus distance
    assert consensus_distance(torch.from_numpy(X)) < consensus_distance(torch.from_numpy(X0))


def test_never_repeats_after_max_rounds() -> None:
    ctrl = const_ctrl(target=1.0, max_rounds=3)
    ctrl.begin_step(0, 0.0)
    decisions = [ctrl.after_round(0, r, 5.0) for r in (1, 2, 3)]
    assert [d.repeat for d in decisions] == [True, True, False]
    assert [d.reason for d in decisions] == ["above-target", "above-target", "max-rounds"]
    with pytest.raises(ValueError, match="already told to stop"):
        ctrl.after_round(0, 4, 5.0)
    # max_rounds = 1 ⇒ never repeat, whatever the statistic
    one = const_ctrl(target=1.0, max_rounds=1)
    for step in range(5):
        one.begin_step(step, 0.0)
        assert not one.after_round(step, 1, 1e9).repeat


def test_uncontrolled_phase_and_mode_none() -> None:
    ctrl = const_ctrl()
    ctrl.begin_step(12, 0.0)  # phase 2, not controlled
    assert ctrl.target(12) is None
    assert ctrl.after_round(12, 1, 1e9) == Decision(False, None, reason="uncontrolled")
    none = ConsensusController(ControlConfig(), build_plan(LRSchedule(0.1, 20, 0, (10,))))
    assert none.begin_step(0, 0.0) == 1
    assert none.after_round(0, 1, 3.0).reason == "uncontrolled"


def test_lagged_rule_pure() -> None:
    assert lagged_rounds([2.0], 1.0, 5) == 2  # above after the last round → one more
    assert lagged_rounds([2.0, 0.5], 1.0, 5) == 2  # needed both rounds → keep
    assert lagged_rounds([0.9, 0.5], 1.0, 5) == 1  # one round fewer would have sufficed
    assert lagged_rounds([0.5], 1.0, 5) == 1  # never below 1
    assert lagged_rounds([3.0, 2.0], 1.0, 2) == 2  # never above max_rounds
    assert lagged_rounds([1.0], 1.0, 5) == 1  # ≤ target counts as reached
    with pytest.raises(ValueError, match="empty"):
        lagged_rounds([], 1.0, 5)


def test_lagged_controller_scripted_sequence() -> None:
    ctrl = ConsensusController(
        ControlConfig(mode="constant", max_rounds=3, lagged=True),
        plan_3(controlled=(1, 3)),
        Calibration({1: 1.0, 3: 1.0}, "theta"),
    )
    script = [  # (step, stats after each round, rounds the controller should plan)
        (0, [2.0], 1),
        (1, [1.5, 1.2], 2),
        (2, [1.4, 1.1, 1.05], 3),
        (3, [1.3, 1.2, 1.1], 3),  # max_rounds = 3 caps the plan
        (4, [1.2, 0.9, 0.8], 3),
        (5, [0.9, 0.7], 2),
        (6, [0.9], 1),
        (7, [0.5], 1),
    ]
    for step, stats, planned in script:
        assert ctrl.begin_step(step, 0.0) == planned, step
        assert len(stats) == planned
        ctrl.end_step(step, stats)
    # with per-round reports the plan is followed, and the last round previews the next plan
    assert ctrl.begin_step(8, 0.0) == 1
    d = ctrl.after_round(8, 1, 4.0)
    assert d == Decision(False, 1.0, rounds_next=2, reason="lagged-plan")
    ctrl.end_step(8, [4.0])
    assert ctrl.begin_step(9, 0.0) == 2
    assert ctrl.after_round(9, 1, 4.0).repeat
    assert ctrl.after_round(9, 2, 4.0).rounds_next == 3
    ctrl.end_step(9, [4.0, 4.0])
    # uncontrolled phase 2: one round; phase 3 starts again from R = 1
    assert ctrl.begin_step(10, 0.0) == 1
    ctrl.end_step(10, [9.0])
    assert ctrl.begin_step(15, 0.0) == 1
    ctrl.after_round(15, 1, 2.0)
    with pytest.raises(ValueError, match="differ from those reported"):
        ctrl.end_step(15, [3.0])


def test_lag_two_plans_each_step_from_the_one_two_back() -> None:
    ctrl = ConsensusController(
        ControlConfig(mode="constant", max_rounds=4, lagged=True, lag=2),
        plan_3(controlled=(1, 3)),
        Calibration({1: 1.0, 3: 1.0}, "theta"),
    )
    script = [  # (step, stats after each round, rounds planned): even and odd steps interleave
        (0, [2.0], 1),  # the first `lag` steps of the phase: one round
        (1, [0.5], 1),
        (2, [2.0, 1.5], 2),  # from step 0: above target → 2
        (3, [0.5], 1),  # from step 1: at target with one round → stays 1
        (4, [2.0, 0.9, 0.8], 3),  # from step 2
        (5, [0.5], 1),
        (6, [0.8, 0.5], 2),  # from step 4: two rounds would have sufficed
        (7, [0.5], 1),
        (8, [0.5], 1),  # from step 6: one round would have sufficed there too
    ]
    for step, stats, planned in script:
        assert ctrl.begin_step(step, 0.0) == planned, step
        assert len(stats) == planned
        if step == 6:  # per-round reports: the last round announces the plan for step 8
            assert ctrl.after_round(6, 1, 0.8).repeat
            assert ctrl.after_round(6, 2, 0.5).rounds_next == 1
        assert ctrl.planned(step + 2) is None  # not decided before the step closes
        ctrl.end_step(step, stats)
        assert ctrl.planned(step + 2) == lagged_rounds(stats, 1.0, 4)
    # phase 3 (steps 15…) starts from one round for two steps, whatever phase 1 ended with
    ctrl.begin_step(9, 0.0)
    ctrl.end_step(9, [5.0])
    assert ctrl.begin_step(15, 0.0) == 1
    ctrl.end_step(15, [5.0])
    assert ctrl.begin_step(16, 0.0) == 1
    ctrl.end_step(16, [5.0])
    assert ctrl.begin_step(17, 0.0) == 2


def test_lag_is_validated() -> None:
    with pytest.raises(ValueError, match="lag = 0"):
        ControlConfig(mode="constant", lagged=True, lag=0)
    with pytest.raises(ValueError, match="only applies to lagged control"):
        ControlConfig(mode="constant", lag=2)
    with pytest.raises(ValueError, match="lag = True"):
        ControlConfig(mode="constant", lagged=True, lag=True)  # type: ignore[arg-type]


def test_adaptive_ema_resets_at_phase_start() -> None:
    cfg = ControlConfig(mode="adaptive", factor=2.0, ema=0.5)
    ctrl = ConsensusController(cfg, plan_3(controlled=(1, 2), mode="adaptive"))
    # EMA: 1 → 0.5·1 + 0.5·3 = 2 → 0.5·2 + 0.5·5 = 3.5; all exact in binary floating point
    for step, g, tgt in [(7, 1.0, 2.0), (8, 3.0, 4.0), (9, 5.0, 7.0)]:
        ctrl.begin_step(step, g)
        assert ctrl.target(step) == tgt
    ctrl.begin_step(10, 10.0)  # phase 2 starts: the EMA restarts from this value
    assert ctrl.target(10) == 20.0
    ctrl.begin_step(11, 0.0)
    assert ctrl.target(11) == 10.0
    d = ctrl.after_round(11, 1, 10.5)
    assert (d.repeat, d.target, d.reason) == (True, 10.0, "above-target")
    assert ctrl.after_round(11, 2, 10.0).reason == "at-target"  # ≤ target stops
    fresh = ConsensusController(cfg, plan_3(controlled=(1,), mode="adaptive"))
    with pytest.raises(ValueError, match="before begin_step"):
        fresh.target(0)


@pytest.mark.parametrize("lag", [1, 2])
def test_state_dict_round_trip(lag: int) -> None:
    def make() -> ConsensusController:
        cfg = ControlConfig(
            mode="adaptive", factor=0.5, ema=0.9, lagged=True, max_rounds=6, lag=lag
        )
        return ConsensusController(cfg, plan_3(controlled=(1, 3), mode="adaptive"))

    rng = np.random.default_rng(5)
    a = make()
    for step in range(4):
        a.begin_step(step, float(rng.uniform(1, 2)))
        a.end_step(step, list(rng.uniform(1.5, 2.0, size=2)))  # above any target (≤ 1)
    assert a.begin_step(4, 1.5) == 3
    a.after_round(4, 1, 2.0)  # mid-step checkpoint
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    # both continue identically (same plans, targets and decisions)
    assert a.after_round(4, 2, 0.1) == b.after_round(4, 2, 0.1)
    stats = [2.0, 0.1]  # what was reported in step 4
    for step in range(5, 9):
        g = float(rng.uniform(1, 2))
        outs = []
        for ctrl in (a, b):
            ctrl.end_step(step - 1, stats)
            outs.append((ctrl.begin_step(step, g), ctrl.target(step)))
        assert outs[0] == outs[1]
        stats = list(rng.uniform(0.5, 2.0, size=outs[0][0]))
    other = ConsensusController(ControlConfig(mode="adaptive"), plan_3(mode="adaptive"))
    with pytest.raises(ValueError, match="lagged=True"):
        other.load_state_dict(a.state_dict())
    lag_other = ControlConfig(mode="adaptive", lagged=True, max_rounds=6, lag=lag + 1)
    with pytest.raises(ValueError, match=f"lag={lag + 1}"):
        ConsensusController(lag_other, plan_3(mode="adaptive")).load_state_dict(a.state_dict())
    bad = {**a.state_dict(), "next": [[9, 7, 1]]}  # 7 rounds > max_rounds = 6
    with pytest.raises(ValueError, match="'next' entry"):
        make().load_state_dict(bad)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"policy": [1.0]}, "'policy' = \\[1.0\\]; must be a table"),
        ({"stats": 2.0}, "'stats' = 2.0; must be a list"),
        ({"next": [[1, 1]]}, "'next' entry \\[1, 1\\]"),
        ({"next": [[1, True, 1]]}, "'next' entry \\[1, True, 1\\]"),
        ({"policy": {"value": 1.0, "phase": 0}}, "'phase' = 0; must be ≥ 1"),
    ],
)
def test_bad_controller_state_names_its_field(change: dict[str, JSON], problem: str) -> None:
    a = ConsensusController(ControlConfig(mode="adaptive"), plan_3(mode="adaptive"))
    a.begin_step(0, 1.0)
    with pytest.raises(ValueError, match=problem):
        ConsensusController(
            ControlConfig(mode="adaptive"), plan_3(mode="adaptive")
        ).load_state_dict({**a.state_dict(), **change})


def test_calibration_recorder_and_json() -> None:
    rec = CalibrationRecorder("xi")
    for step, phase, s in [(0, 1, 0.5), (1, 1, 2.5), (2, 1, 1.0), (10, 2, 0.25)]:
        rec.observe(step, phase, s)
    cal = rec.result()
    assert cal.max_statistic == {1: 2.5, 2: 0.25}
    assert cal.statistic == "xi"
    assert Calibration.from_json(json.loads(json.dumps(cal.to_json())), where="t") == cal
    with pytest.raises(ValueError, match="statistic at step 3 = nan"):
        rec.observe(3, 1, float("nan"))
    with pytest.raises(ValueError, match="statistic = 'grad'"):
        CalibrationRecorder("grad")


def test_calibration_file_reads_through_its_record(tmp_path: Path) -> None:
    cal = Calibration({1: 2.5, 3: 0.25}, "theta")
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(cal.record().to_json(), indent=2))
    assert json.loads(path.read_text())["version"] == CalibrationRecord.VERSION
    assert read_calibration(path) == cal
    # written before records were typed: no version, the same keys
    path.write_text(json.dumps({"statistic": "theta", "max_statistic": {"1": 2.5, "3": 0.25}}))
    assert read_calibration(path) == cal


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"version": 1, "statistic": "theta", "max_statistic": {"0": 1.0}}, "max_statistic.0"),
        ({"version": 1, "statistic": "theta", "max_statistic": {"x": 1.0}}, "max_statistic.x"),
        ({"version": 1, "statistic": "theta", "max_statistic": {"1": -1.0}}, "max_statistic.1"),
        ({"version": 1, "statistic": "grad", "max_statistic": {"1": 1.0}}, "statistic"),
        ({"version": 1, "statistic": "xi", "max_statistic": {"1": "1"}}, "max_statistic.1"),
        ({"version": 2, "statistic": "xi", "max_statistic": {}}, "version"),
    ],
)
def test_bad_calibration_names_file_and_field(
    tmp_path: Path, body: dict[str, object], field: str
) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(body))
    with pytest.raises(RecordError, match=f"calibration.json: field '{field}'") as info:
        read_calibration(path)
    assert info.value.field == field


def test_calibration_file_that_is_not_json_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    path.write_text('{\n  "statistic": "xi",\n  oops\n}')
    with pytest.raises(RecordError, match=r"calibration\.json:3: not JSON"):
        read_calibration(path)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"factor": -1.0}, "control factor = -1.0; must be a finite number > 0"),
        ({"factor": 0.0}, "control factor = 0.0"),
        ({"ema": 1.0}, r"ema = 1.0; the EMA coefficient must be in \[0, 1\)"),
        ({"ema": -0.1}, "ema = -0.1"),
        ({"max_rounds": 0}, "max_rounds = 0; must be an integer ≥ 1"),
        (
            {"mode": "sometimes"},
            "control mode = 'sometimes'; valid: none, constant, adaptive, fixed",
        ),
        (
            {"mode": "fixed", "rounds": 0},
            r"rounds = 0; must be an integer in \[1, max_rounds = 20\]",
        ),
        ({"mode": "fixed", "rounds": 4, "max_rounds": 3}, r"rounds = 4; .*max_rounds = 3\]"),
        ({"mode": "adaptive", "rounds": 2}, "rounds = 2 only applies to control mode 'fixed'"),
        ({"statistic": "grad"}, "statistic = 'grad'"),
    ],
)
def test_bad_config_raises(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ControlConfig(**kwargs)  # type: ignore[arg-type]


def test_controller_construction_errors() -> None:
    with pytest.raises(ValueError, match="needs a Calibration"):
        ConsensusController(ControlConfig(mode="constant"), plan_3())
    with pytest.raises(ValueError, match=r"no max statistic for controlled phase\(s\) \[1\]"):
        ConsensusController(
            ControlConfig(mode="constant"), plan_3(), Calibration({2: 1.0}, "theta")
        )
    with pytest.raises(ValueError, match="calibrate on the statistic you control"):
        ConsensusController(ControlConfig(mode="constant"), plan_3(), Calibration({1: 1.0}, "xi"))
    with pytest.raises(ValueError, match="control mode is 'none'"):
        ConsensusController(ControlConfig(), plan_3())
    ctrl = const_ctrl()
    with pytest.raises(ValueError, match="call begin_step"):
        ctrl.after_round(0, 1, 1.0)
    ctrl.begin_step(0, 0.0)
    with pytest.raises(ValueError, match="round_index = 2; expected 1"):
        ctrl.after_round(0, 2, 1.0)
    with pytest.raises(ValueError, match=r"mean_grad_norm = -1\.0"):
        ctrl.begin_step(1, -1.0)


def test_every_control_mode_has_an_implementation() -> None:
    # "none" and "fixed" have no target: the controller itself implements them
    assert set(CONTROL_MODES) == {"none", "fixed", *TARGET_POLICIES.names()}


def test_control_does_not_import_torch() -> None:
    code = "import sys, concord.core.control.controller; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
