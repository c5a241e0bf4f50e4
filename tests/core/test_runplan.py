"""`concord.core.control.runplan`: schedules over the live members, the plan and LR schedule from a
config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from concord.core.config import RunConfig, load_config
from concord.core.control.controller import ControlConfig
from concord.core.control.plan import LRSchedule, Phase, build_plan
from concord.core.control.runplan import (
    MemberSchedule,
    Schedules,
    calibration_steps,
    control_config,
    make_lr_schedule,
    make_plan,
)
from concord.core.graphs.topology import TopologyError, TopologySchedule, make_schedule

ROOT = Path(__file__).resolve().parents[2]
N = 8
# Doubly-stochastic checks sum n ≤ 8 weights like 1/3: a few ulps of rounding, far below 1e-12.
ATOL = 1e-12


def config(*overrides: str) -> RunConfig:
    return load_config(None, [f"peers={N}", "epochs=2", "seed=3", *overrides], environ={})


def first_phase(cfg: RunConfig) -> Phase:
    return make_plan(cfg, make_lr_schedule(cfg, 10)).phases[0]


def reference(cfg: RunConfig, name: str, n: int) -> TopologySchedule:
    return make_schedule(name, n, weights=cfg.weights, kappa=cfg.kappa, seed=cfg.seed)


def rounds(period: int | None) -> range:
    return range(2 * (period or 3) + 1)  # two periods and one more (random: a few draws)


# -- every peer a member: the plain schedule -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("ring", ()),
        ("complete", ()),
        ("exponential-one-peer", ()),
        ("bipartite-exponential", ()),
        ("random-matching", ()),
        ("ring", ("kappa=0.5",)),
    ],
)
def test_all_members_is_the_plain_schedule_bit_for_bit(name: str, extra: tuple[str, ...]) -> None:
    cfg = config(f"topology={name}", *extra)
    sched = Schedules(cfg).get(first_phase(cfg))
    ref = reference(cfg, name, N)
    assert sched.full
    assert sched.period == ref.period
    assert sched.time_varying == ref.time_varying
    for k in rounds(ref.period):
        W = sched.matrix(k)
        assert W.shape == (N, N)
        assert W.dtype == ref.matrix(k).dtype
        assert np.array_equal(W, ref.matrix(k)), f"round {k}"
    assert sched.spectral() == ref.spectral()


# -- a subset of the peers -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ring", "exponential-one-peer", "random-matching", "complete"])
def test_subset_embeds_the_members_schedule(name: str) -> None:
    cfg = config(f"topology={name}")
    schedules = Schedules(cfg)
    members = [0, 1, 2, 4, 5, 6, 7]  # ring of 8 minus peer 3
    schedules.set_members(members)
    sched = schedules.get(first_phase(cfg))
    ref = reference(cfg, name, len(members))
    assert not sched.full
    assert sched.period == ref.period
    assert sched.time_varying == ref.time_varying
    e3 = np.eye(N)[3]
    idx = np.ix_(members, members)
    for k in rounds(ref.period):
        W = sched.matrix(k)
        assert W.shape == (N, N)
        assert np.array_equal(W, W.T), f"round {k}: not symmetric"
        np.testing.assert_allclose(W.sum(axis=0), 1.0, rtol=0, atol=ATOL)
        np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=0, atol=ATOL)
        assert (W >= 0).all()
        assert np.array_equal(W[3], e3)  # the absent peer: identity row and column
        assert np.array_equal(W[:, 3], e3)
        assert np.array_equal(W[idx], ref.matrix(k)), f"round {k}: member block"
    # the plain schedule of 8 is different: the repair really changed the mixing
    assert not np.array_equal(sched.matrix(0), reference(cfg, name, N).matrix(0))


def test_subset_of_the_time_varying_one_peer_graph_changes_its_period() -> None:
    """n = 8 is a hypercube (period 3, pairwise ½); its 7 survivors use the circulant fallback
    (period ⌊log2 6⌋ + 1 = 3, Metropolis weights 1/3), i.e. make_schedule(…, 7)."""
    cfg = config("topology=exponential-one-peer")
    schedules = Schedules(cfg, members=[0, 1, 2, 4, 5, 6, 7])
    sched = schedules.get(first_phase(cfg))
    assert sched.time_varying
    assert sched.inner is not None
    assert sched.inner.n == 7
    assert not np.array_equal(sched.matrix(0), sched.matrix(1))  # time-varying over members
    assert np.isclose(sched.matrix(0)[0, 1], 1 / 3, rtol=0, atol=ATOL)  # Metropolis on degree 2


def test_a_topology_that_refuses_the_survivor_count_says_why() -> None:
    cfg = config("topology=bipartite-exponential")
    schedules = Schedules(cfg)
    schedules.set_members([0, 1, 2, 4, 5, 6, 7])
    with pytest.raises(TopologyError, match=r"bipartite-exponential.*even n.*n=7"):
        schedules.get(first_phase(cfg))
    # an even survivor count works
    sched = schedules.get(first_phase(cfg), members=[0, 1, 2, 4, 5, 6])
    assert np.array_equal(sched.matrix(0)[np.ix_([3, 7], [3, 7])], np.eye(2))


def test_a_lone_member_keeps_its_own_model() -> None:
    cfg = config("topology=ring")
    sched = Schedules(cfg).get(first_phase(cfg), members=[5])
    assert sched.inner is None
    for k in range(3):
        assert np.array_equal(sched.matrix(k), np.eye(N))
    assert sched.period == 1
    assert not sched.time_varying
    assert sched.spectral() is None


def test_get_caches_per_name_and_members_and_does_not_change_the_current_members() -> None:
    cfg = config("topology=ring", 'phase_topologies=["complete", "chain", "chain"]')
    plan = make_plan(cfg, make_lr_schedule(cfg, 10))
    schedules = Schedules(cfg)
    p1, p2 = plan.phases[0], plan.phases[1]
    assert schedules.topology_name(p1) == "complete"
    assert schedules.topology_name(p2) == "chain"
    star = config("topology=star")
    assert first_phase(star).topology is None
    assert Schedules(star).topology_name(first_phase(star)) == "star"  # the run's topology
    a = schedules.get(p1)
    assert schedules.get(p1) is a
    sub = schedules.get(p1, members=[7, 1, 2, 1])
    assert list(sub.members) == [1, 2, 7]  # sorted, deduplicated
    assert schedules.get(p1, members=[1, 2, 7]) is sub
    assert schedules.members == tuple(range(N))
    inner = schedules.get(p2).inner
    assert inner is not None
    assert inner.name == "chain"
    assert set(schedules.spectral()) == {"complete", "chain"}  # current members only


# -- set_members -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [[], [8], [-1], [0, 1, 99]])
def test_set_members_rejects_out_of_range_or_empty(bad: list[int]) -> None:
    schedules = Schedules(config())
    with pytest.raises(ValueError, match=r"non-empty subset of 0\.\.n-1") as info:
        schedules.set_members(bad)
    assert str(bad) in str(info.value)
    assert schedules.members == tuple(range(N))  # unchanged


def test_set_members_sorts_and_deduplicates() -> None:
    schedules = Schedules(config())
    schedules.set_members([6, 2, 2, 0])
    assert schedules.members == (0, 2, 6)


def test_member_schedule_without_inner_is_identity() -> None:
    ms = MemberSchedule(None, [2], 4)
    assert np.array_equal(ms.matrix(0), np.eye(4))


# -- plan, LR schedule, control config ----------------------------------------------------------


def test_make_plan_and_lr_schedule_from_config() -> None:
    cfg = config("optim.warmup=0.1", "optim.milestones=[0.5, 0.75]", "control.phases=[1, 2]")
    sched = make_lr_schedule(cfg, 10)
    assert sched == LRSchedule.from_fractions(
        cfg.optim.lr, 20, warmup=0.1, milestones=(0.5, 0.75), gamma=cfg.optim.gamma
    )
    assert (sched.total_steps, sched.warmup_steps, sched.milestones) == (20, 2, (10, 15))
    plan = make_plan(cfg, sched)
    assert plan == build_plan(
        sched, controlled_phases=(1, 2), control_mode=cfg.control.mode, modes="gossip"
    )
    assert plan.controlled_indices == (1, 2)


def test_make_plan_exact_phases_and_no_control() -> None:
    cfg = config("plan=dec-phase-2", "control.mode=none")
    plan = make_plan(cfg, make_lr_schedule(cfg, 10))
    assert [p.mode for p in plan.phases] == ["exact", "gossip", "exact"]
    assert plan.controlled_indices == ()
    # the default control (adaptive, phase 1) is inert when phase 1 is exact
    cfg2 = config("plan=dec-phase-2")
    assert make_plan(cfg2, make_lr_schedule(cfg2, 10)).controlled_indices == ()


def test_control_config_copies_the_section() -> None:
    cfg = config(
        "control.mode=constant",
        "control.factor=0.5",
        "control.max_rounds=7",
        "control.lagged=true",
        "control.ema=0.5",
    )
    assert control_config(cfg) == ControlConfig(
        mode="constant", factor=0.5, max_rounds=7, lagged=True, ema=0.5, statistic="theta"
    )


@pytest.mark.parametrize(
    ("controlled", "want"),
    [((), 0), ((1,), 10), ((2,), 15), ((1, 2), 15), ((1, 3), 20)],
)
def test_calibration_steps_run_to_the_end_of_the_last_controlled_phase(
    controlled: tuple[int, ...], want: int
) -> None:
    sched = LRSchedule.from_fractions(0.1, 20, warmup=0.0, milestones=(0.5, 0.75))
    mode = "constant" if controlled else "none"
    plan = build_plan(sched, controlled_phases=controlled, control_mode=mode)
    assert calibration_steps(plan) == want


def test_runplan_does_not_import_torch() -> None:
    """The orchestrator builds plans with this module and must never import torch."""
    code = (
        "import sys\nfrom concord.core.control import runplan\n"
        "from concord.core.config import load_config\n"
        "cfg = load_config(None, ['epochs=2'], environ={})\n"
        "runplan.make_plan(cfg, runplan.make_lr_schedule(cfg, 10))\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# -- per-phase topology overrides (adaptive graphs) ---------------------------------------------


def test_topology_overrides_replace_the_phase_topology() -> None:
    cfg = config("topology=ring", "optim.milestones=[0.5]")
    plan = make_plan(cfg, make_lr_schedule(cfg, 10))
    one, two = plan.phases
    schedules = Schedules(cfg)
    assert schedules.topology_name(one) == "ring"
    schedules.set_topologies({1: "exponential:3", 2: "complete"})
    assert (schedules.topology_name(one), schedules.topology_name(two)) == (
        "exponential:3",
        "complete",
    )
    W = schedules.get(one).matrix(0)
    assert np.array_equal(W, reference(cfg, "exponential:3", N).matrix(0))
    # an explicit topology wins over the override (a peer checking a frame of a later step)
    assert np.array_equal(
        schedules.get(one, topology="ring").matrix(0), reference(cfg, "ring", N).matrix(0)
    )
    schedules.set_topologies({1: None})  # drops the override: the plan's topology again
    assert schedules.topology_name(one) == "ring"
    assert schedules.topology_name(two) == "complete"


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [({0: "ring"}, "phase index 0"), ({True: "ring"}, "phase index True"), ({1: ""}, "non-empty")],
)
def test_topology_overrides_are_checked(overrides: dict[int, str], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        Schedules(config()).set_topologies(overrides)
