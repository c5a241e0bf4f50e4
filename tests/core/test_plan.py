"""LR schedules and phase plans: warm-up, decays, phases split at decays, presets, validation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from concord.core.control.plan import LRSchedule, Phase, PhasePlan, build_plan

# lr values are products of a few decimal constants: equal up to float64 round-off (~1e-16)
LR_REL = 1e-12


@pytest.fixture
def sched() -> LRSchedule:
    return LRSchedule.from_fractions(0.1, 100)  # warm-up 5 %, decays ×0.1 at 50 % and 75 %


def test_from_fractions_steps(sched: LRSchedule) -> None:
    assert sched.warmup_steps == 5
    assert sched.milestones == (50, 75)
    assert sched.gamma == 0.1
    # round half up (Python's round() would give 0 for 0.5)
    assert LRSchedule.from_fractions(1.0, 10, warmup=0.05, milestones=(0.25,)).warmup_steps == 1
    assert LRSchedule.from_fractions(1.0, 10, warmup=0.05, milestones=(0.25,)).milestones == (3,)


def test_lr_warmup_linear_then_decays(sched: LRSchedule) -> None:
    expected = {
        0: 0.0,
        1: 0.02,
        4: 0.08,
        5: 0.1,
        49: 0.1,
        50: 0.01,
        74: 0.01,
        75: 0.001,
        99: 0.001,
    }
    for step, lr in expected.items():
        assert sched.lr(step) == pytest.approx(lr, rel=LR_REL, abs=1e-15), step
    # warm-up is linear: constant increments
    incs = [sched.lr(t + 1) - sched.lr(t) for t in range(sched.warmup_steps)]
    assert incs == pytest.approx([0.02] * 5, rel=LR_REL)
    warm = LRSchedule.from_fractions(0.1, 100, warmup_from=0.1)
    assert warm.lr(0) == pytest.approx(0.01, rel=LR_REL)
    assert warm.lr(5) == pytest.approx(0.1, rel=LR_REL)
    flat = LRSchedule(0.5, 10, 0, ())
    assert [flat.lr(t) for t in range(10)] == [0.5] * 10


def test_lr_step_out_of_range(sched: LRSchedule) -> None:
    with pytest.raises(ValueError, match=r"step = 100; must be an integer in \[0, 100\)"):
        sched.lr(100)
    with pytest.raises(ValueError, match="step = -1"):
        sched.lr(-1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"milestones": (0.75, 0.5)}, "strictly increasing"),
        ({"milestones": (0.5, 0.5)}, "strictly increasing"),
        ({"milestones": (0.5, 1.0)}, r"each in \(0, 1\)"),
        ({"warmup": 1.0}, r"warmup = 1.0; the warm-up fraction must be in \[0, 1\)"),
        ({"warmup": -0.1}, "warmup = -0.1"),
        ({"warmup": 0.6}, "must end before the first milestone"),
        ({"gamma": 0.0}, r"gamma = 0.0; the decay factor must be in \(0, 1\]"),
        ({"gamma": 1.5}, "gamma = 1.5"),
        ({"warmup_from": 2.0}, "warmup_from = 2.0"),
    ],
)
def test_schedule_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LRSchedule.from_fractions(0.1, 100, **kwargs)  # type: ignore[arg-type]


def test_schedule_validation_direct() -> None:
    with pytest.raises(ValueError, match=r"milestones = \(75, 50\)"):
        LRSchedule(0.1, 100, 5, (75, 50))
    with pytest.raises(ValueError, match="warmup_steps = 5 < m"):
        LRSchedule(0.1, 100, 5, (3, 50))  # a decay during warm-up
    with pytest.raises(ValueError, match=r"base_lr = -0\.1"):
        LRSchedule(-0.1, 100, 5, ())
    with pytest.raises(ValueError, match="total_steps = 0"):
        LRSchedule(0.1, 0, 0, ())
    with pytest.raises(ValueError, match="too small to separate"):
        LRSchedule.from_fractions(0.1, 3)  # 0.5 and 0.75 of 3 steps both round to step 2


def test_phases_split_at_milestones(sched: LRSchedule) -> None:
    plan = build_plan(sched)
    assert [(p.index, p.start, p.end) for p in plan.phases] == [
        (1, 0, 50),
        (2, 50, 75),
        (3, 75, 100),
    ]
    assert all(p.mode == "gossip" and p.topology is None and not p.controlled for p in plan.phases)
    # the warm-up is part of phase 1, not a phase of its own (Kong et al. footnote 1)
    assert plan.phase_at(0).index == 1
    assert plan.phase_at(sched.warmup_steps).index == 1
    assert plan.phase_at(49).index == 1
    assert plan.phase_at(50).index == 2
    assert plan.phase_at(74).index == 2
    assert plan.phase_at(75).index == 3
    assert plan.phase_at(99).index == 3
    assert plan.total_steps == 100
    with pytest.raises(ValueError, match=r"step = 100"):
        plan.phase_at(100)
    # the LR is constant inside every phase after warm-up
    for p in plan.phases:
        lrs = {sched.lr(t) for t in range(max(p.start, sched.warmup_steps), p.end)}
        assert len(lrs) == 1


def test_dec_phase_2_plan(sched: LRSchedule) -> None:
    plan = build_plan(sched, modes="dec-phase-2", topologies=[None, "torus", None])
    assert [p.mode for p in plan.phases] == ["exact", "gossip", "exact"]
    assert [p.topology for p in plan.phases] == [None, "torus", None]
    assert plan.controlled_indices == ()
    assert [p.mode for p in build_plan(sched, modes="exact").phases] == ["exact"] * 3
    assert [p.mode for p in build_plan(sched, modes="gossip").phases] == ["gossip"] * 3


def test_control_phase_1_only(sched: LRSchedule) -> None:
    plan = build_plan(sched, controlled_phases=(1,), control_mode="constant")
    assert [p.mode for p in plan.phases] == ["gossip"] * 3
    assert [p.controlled for p in plan.phases] == [True, False, False]
    # control with no explicit phases controls every gossip phase
    dec1 = build_plan(sched, modes="dec-phase-1", control_mode="adaptive")
    assert dec1.controlled_indices == (1,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"controlled_phases": (4,), "control_mode": "constant"}, "out of range.*phases 1 … 3"),
        ({"controlled_phases": (0,), "control_mode": "constant"}, "out of range"),
        (
            {"modes": "dec-phase-2", "controlled_phases": (1,), "control_mode": "constant"},
            "phase 1, which is 'exact'.*meaningless",
        ),
        ({"modes": "dec-phase-4"}, "names phase 4, but the schedule has 3"),
        ({"modes": "ring"}, "preset 'ring' is unknown; valid presets"),
        ({"modes": ["gossip", "exact"]}, "modes has 2 entries but the schedule has 3"),
        ({"modes": ["gossip", "allreduce", "exact"]}, r"modes\[1\] \(phase 2\) = 'allreduce'"),
        ({"controlled_phases": (1,)}, "needs control_mode 'constant' or 'adaptive'"),
        ({"control_mode": "always"}, "control_mode = 'always'"),
        ({"modes": "exact", "control_mode": "constant"}, "nothing to control"),
        ({"modes": "dec-phase-2", "topologies": ["ring"] * 3}, "phase 1 is 'exact'.*no topology"),
        ({"topologies": ["ring"]}, "topologies has 1 entries"),
        (
            {"controlled_phases": (1, 1), "control_mode": "constant"},
            "lists a phase twice",
        ),
    ],
)
def test_build_plan_errors(sched: LRSchedule, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_plan(sched, **kwargs)  # type: ignore[arg-type]


def test_plan_dict_round_trip(sched: LRSchedule) -> None:
    plan = build_plan(
        sched, topologies=["ring", None, "torus"], controlled_phases=(1,), control_mode="adaptive"
    )
    d = json.loads(json.dumps(plan.to_dict()))
    assert d["version"] == 1
    assert PhasePlan.from_dict(d) == plan


def test_plan_from_dict_errors(sched: LRSchedule) -> None:
    good = build_plan(sched).to_dict()
    with pytest.raises(ValueError, match="version = 2"):
        PhasePlan.from_dict({**good, "version": 2})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['extra'\]"):
        PhasePlan.from_dict({**good, "extra": 1})
    bad = json.loads(json.dumps(good))
    del bad["phases"][1]["mode"]
    with pytest.raises(ValueError, match=r"phases\[1\]: missing key\(s\) \['mode'\]"):
        PhasePlan.from_dict(bad)
    gap = json.loads(json.dumps(good))
    gap["phases"][1]["start"] = 51
    with pytest.raises(ValueError, match="phase 2 starts at step 51 but must start at 50"):
        PhasePlan.from_dict(gap)
    ctrl_exact = json.loads(json.dumps(good))
    ctrl_exact["phases"][0].update(mode="exact", controlled=True)
    with pytest.raises(ValueError, match=r"phase 1 is 'exact'.*meaningless"):
        PhasePlan.from_dict(ctrl_exact)
    with pytest.raises(ValueError, match="mode = 'fast'"):
        Phase(1, 0, 10, "fast", None, False)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        PhasePlan(())


def test_plan_and_control_do_not_import_torch() -> None:
    code = (
        "import sys, concord.core.control.plan, concord.core.control.controller; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
