"""``control.mode = "fixed"`` in the controller: exactly ``rounds`` gossip rounds per step of a
controlled phase, whatever the statistic, in both protocols, with no target and no calibration."""

from __future__ import annotations

import pytest

from concord.core.control.controller import ConsensusController, ControlConfig, Decision
from concord.core.control.plan import LRSchedule, PhasePlan, build_plan

# statistics far above and far below any target: mode fixed must not look at them
EXTREMES = (1e9, 0.0, 3.5, 1e-12)


def plan_3(controlled: tuple[int, ...] = (1,)) -> PhasePlan:
    """Steps [0, 10) [10, 15) [15, 20), all gossip."""
    return build_plan(
        LRSchedule(0.1, 20, 0, (10, 15)), controlled_phases=controlled, control_mode="fixed"
    )


def fixed(rounds: int, **kw: object) -> ConsensusController:
    cfg = ControlConfig(mode="fixed", rounds=rounds, max_rounds=5, **kw)  # type: ignore[arg-type]
    return ConsensusController(cfg, plan_3())  # no Calibration: mode fixed has no target


def run_step(ctrl: ConsensusController, step: int, stats: tuple[float, ...]) -> list[Decision]:
    """Feed rounds until the controller says stop (at most len(stats) rounds)."""
    ctrl.begin_step(step, 1.0)
    out: list[Decision] = []
    for r, s in enumerate(stats, start=1):
        out.append(ctrl.after_round(step, r, s))
        if not out[-1].repeat:
            break
    ctrl.end_step(step, [stats[i] for i in range(len(out))])
    return out


@pytest.mark.parametrize("rounds", [1, 2, 3, 5])
def test_barrier_repeats_while_the_round_is_below_rounds(rounds: int) -> None:
    ctrl = fixed(rounds)
    for step, stats in enumerate([(*EXTREMES, 7.0), (0.0,) * 5, (1e9,) * 5]):
        assert ctrl.begin_step(step, 1.0) == rounds  # known in advance, also in barrier mode
        assert ctrl.target(step) is None
        decisions = [ctrl.after_round(step, r, stats[r - 1]) for r in range(1, rounds + 1)]
        assert [d.repeat for d in decisions] == [True] * (rounds - 1) + [False]
        assert all(d.target is None and d.reason == "fixed-rounds" for d in decisions)
        assert all(d.rounds_next is None for d in decisions)  # barrier: nothing planned ahead
        with pytest.raises(ValueError, match="already told to stop"):
            ctrl.after_round(step, rounds + 1, 0.0)
        ctrl.end_step(step, stats[:rounds])


def test_uncontrolled_phases_run_one_round() -> None:
    ctrl = fixed(3)
    assert len(run_step(ctrl, 9, (1e9,) * 5)) == 3  # the last step of phase 1
    assert ctrl.begin_step(10, 1.0) == 1  # phase 2 is not in control.phases
    assert ctrl.after_round(10, 1, 1e9) == Decision(False, None, reason="uncontrolled")
    ctrl.end_step(10, [1e9])
    every = ConsensusController(  # an empty controlled_phases with mode fixed: every phase
        ControlConfig(mode="fixed", rounds=2),
        build_plan(LRSchedule(0.1, 20, 0, (10, 15)), control_mode="fixed"),
    )
    for step in (0, 12, 19):
        assert [d.repeat for d in run_step(every, step, (5.0, 5.0, 5.0))] == [True, False]


@pytest.mark.parametrize("lag", [1, 2])
def test_lagged_plans_rounds_for_every_step_from_the_first(lag: int) -> None:
    """Consensus control's lagged mode starts each phase with 1 round; fixed rounds need no
    feedback, so the first ``lag`` steps of a phase run ``rounds`` too."""
    ctrl = fixed(3, lagged=True, lag=lag)
    for step in range(10):
        assert ctrl.begin_step(step, 1.0) == 3
        decisions = [ctrl.after_round(step, r, EXTREMES[r]) for r in (1, 2, 3)]
        assert [d.repeat for d in decisions] == [True, True, False]
        assert [d.rounds_next for d in decisions] == [None, None, 3]
        assert {d.reason for d in decisions} == {"fixed-rounds"}
        ctrl.end_step(step, [EXTREMES[r] for r in (1, 2, 3)])
        assert ctrl.planned(step + lag) is None  # nothing to learn, no lagged plan is kept
    assert ctrl.begin_step(10, 1.0) == 1  # phase 2: uncontrolled


def test_state_dict_round_trip_mid_step() -> None:
    ctrl = fixed(4, lagged=True)
    run_step(ctrl, 0, (1.0,) * 4)
    ctrl.begin_step(1, 1.0)
    ctrl.after_round(1, 1, 2.0)
    state = ctrl.state_dict()
    again = fixed(4, lagged=True)
    again.load_state_dict(state)
    assert [again.after_round(1, r, 2.0).repeat for r in (2, 3, 4)] == [True, True, False]
    with pytest.raises(ValueError, match="mode='fixed'"):
        ConsensusController(ControlConfig(mode="adaptive"), plan_3()).load_state_dict(state)


def test_config_errors() -> None:
    with pytest.raises(ValueError, match="rounds = 2 only applies to control mode 'fixed'"):
        ControlConfig(mode="constant", rounds=2)
    with pytest.raises(ValueError, match=r"rounds = 6; must be an integer in \[1, max_rounds = 5"):
        ControlConfig(mode="fixed", rounds=6, max_rounds=5)
    with pytest.raises(ValueError, match="rounds = True"):
        ControlConfig(mode="fixed", rounds=True)
    with pytest.raises(ValueError, match=r"control mode is 'none'; use .* or 'fixed'"):
        ConsensusController(ControlConfig(), plan_3())
    with pytest.raises(ValueError, match=r"needs control_mode 'constant' or 'adaptive'.* 'fixed'"):
        build_plan(LRSchedule(0.1, 20, 0, (10,)), controlled_phases=(1,), control_mode="none")
