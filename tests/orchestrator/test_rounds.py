"""The orchestrator's decision logic (`concord.orchestrator.rounds`), sans-io: statistics in,
decisions out.

Every decision of a `RoundBook` is checked against a `ConsensusController` fed directly with the
same Θ (`concord.core.control.consensus.theta`) and mean gradient norm: the book must add nothing
but the bookkeeping (who reported, timeouts, duplicates, lost rounds)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import pytest

from concord.core.config import RunConfig, load_config
from concord.core.control.consensus import theta
from concord.core.control.controller import (
    Calibration,
    CalibrationRecorder,
    ConsensusController,
    lagged_rounds,
)
from concord.core.control.plan import LRSchedule, PhasePlan, build_plan
from concord.core.control.runplan import control_config, make_lr_schedule, make_plan
from concord.orchestrator.rounds import RoundBook, RoundRecord, estimator, mean
from concord.protos.control_plane import Decision, Stats

PEERS = {0, 1, 2}
STEPS_PER_EPOCH = 10  # with epochs=2: 20 steps, phases [0, 10) [10, 15) [15, 20)
W = (0.5, 1.0, 1.5)  # per-peer θ_i = scale · W[i]: mean(W) = 1, so Θ = sqrt(scale) exactly-ish
G = (0.5, 1.0, 1.5)  # per-peer ‖g_i‖ = g · G[i]
CALIBRATION = Calibration({1: 1.0, 2: 0.5}, "theta")


def config(mode: str = "constant", *, lagged: bool = False, max_rounds: int = 4) -> RunConfig:
    return load_config(
        None,
        [
            "epochs=2",
            "optim.warmup=0.0",
            "optim.milestones=[0.5, 0.75]",
            f"control.mode={mode}",
            "control.factor=1.0",
            f"control.max_rounds={max_rounds}",
            f"control.lagged={str(lagged).lower()}",
            "control.phases=[1, 2]",
        ],
        environ={},
    )


def plan_of(cfg: RunConfig) -> PhasePlan:
    return make_plan(cfg, make_lr_schedule(cfg, STEPS_PER_EPOCH))


def controller(cfg: RunConfig) -> ConsensusController:
    return ConsensusController(control_config(cfg), plan_of(cfg), CALIBRATION)


def train_book(cfg: RunConfig, timeout: float = 10.0) -> RoundBook:
    return RoundBook("train", plan_of(cfg), controller=controller(cfg), timeout=timeout)


def stats(
    peer: int,
    step: int,
    rnd: int,
    th: float,
    grad: float = 1.0,
    stage: str = "train",
) -> Stats:
    return Stats(peer=peer, step=step, round=rnd, theta=th, grad_norm=grad, stage=stage)


def round_stats(
    step: int, rnd: int, scale: float, g: float = 1.0, stage: str = "train"
) -> list[Stats]:
    """One round's statistics of PEERS, in a scrambled arrival order (2, 0, 1)."""
    return [stats(i, step, rnd, scale * W[i], g * G[i], stage) for i in (2, 0, 1)]


def feed_round(
    book: RoundBook, batch: Iterable[Stats], expected: set[int] = PEERS, now: float = 0.0
) -> list[Decision]:
    """Add every statistic of ``batch``; only the last one may produce decisions."""
    items = list(batch)
    for s in items[:-1]:
        assert book.add(s, expected, now) == []  # round incomplete: nothing decided yet
        assert (s.step, s.round) in book.pending
    return book.add(items[-1], expected, now)


# -- estimator and mean --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [0.25, 1.5, 3.0],
        [1e16, 1.0, 1.0, 1.0, 1.0],  # naive left-to-right summation loses the 1.0s here
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
        [0.0],
        [7.0e-300, 3.0e-300],
        [float(i) / 3.0 for i in range(1, 65)],
    ],
)
def test_estimator_is_bitwise_core_theta(values: list[float]) -> None:
    got = estimator(values)
    want = theta(values)
    assert got.hex() == want.hex()
    assert estimator(reversed(values)).hex() == want.hex()  # fsum: order does not matter
    assert mean(values) == math.fsum(values) / len(values)


def test_estimator_uses_exact_summation() -> None:
    values = [1e16, 1.0, 1.0, 1.0, 1.0]
    naive = math.sqrt(sum(values) / len(values))
    assert estimator(values) != naive  # sum() drops the 1.0s; fsum does not
    assert estimator(values) == math.sqrt((1e16 + 4.0) / 5)


# -- construction --------------------------------------------------------------------------------


def test_a_stage_needs_its_collaborator() -> None:
    plan = plan_of(config())
    with pytest.raises(ValueError, match="ConsensusController"):
        RoundBook("train", plan)
    with pytest.raises(ValueError, match="CalibrationRecorder"):
        RoundBook("calibrate", plan)
    with pytest.raises(ValueError, match="not a calibration stage"):
        train_book(config()).calibration()


# -- barrier mode --------------------------------------------------------------------------------

# step → Θ² of each round (θ_i = Θ² · W[i]); the controller decides how many are used
SCRIPT: dict[int, list[float]] = {
    0: [16.0, 4.0, 0.25, 9.0],  # above, above, at target → 3 rounds
    1: [0.09],  # at target at once
    2: [50.0, 40.0, 30.0, 20.0, 10.0],  # never reaches the target → max_rounds (4)
    3: [2.25, 0.81],
    9: [1.44, 1.21, 0.04],
    10: [3.0, 0.2, 0.1],  # phase 2: its own target
    11: [0.01],
    15: [5.0],  # phase 3 is uncontrolled: one round
}
GRADS = {0: 1.0, 1: 1.3, 2: 0.7, 3: 1.1, 9: 0.9, 10: 2.0, 11: 0.4, 15: 1.0}


@pytest.mark.parametrize("mode", ["constant", "adaptive"])
def test_barrier_decisions_equal_a_directly_fed_controller(mode: str) -> None:
    cfg = config(mode)
    book = train_book(cfg)
    ref = controller(cfg)
    reasons = []
    for step, scales in SCRIPT.items():
        g = GRADS[step]
        ref.begin_step(step, math.fsum(g * x for x in G) / len(G))
        seen: list[float] = []
        for rnd, scale in enumerate(scales, start=1):
            batch = round_stats(step, rnd, scale, g)
            got = feed_round(book, batch)
            big_theta = theta([s.theta for s in batch])
            seen.append(big_theta)
            d = ref.after_round(step, rnd, big_theta)
            assert got == [
                Decision(
                    step=step,
                    round=rnd,
                    repeat=d.repeat,
                    target=d.target,
                    statistic=big_theta,
                    rounds_next=d.rounds_next,
                    reason=d.reason,
                )
            ]
            reasons.append(d.reason)
            if not d.repeat:
                ref.end_step(step, seen)
                break
        else:
            pytest.fail(f"step {step}: script too short, the controller still repeats")
    assert book.pending == {}
    assert book.ignored == 0
    # the script exercises every branch of the barrier controller
    assert {"above-target", "at-target", "max-rounds", "uncontrolled"} <= set(reasons)
    max_rounds_steps = [r for r in book.records if r.reason == "max-rounds"]
    assert [(r.step, r.round) for r in max_rounds_steps] == [(2, 4)]


def test_constant_targets_are_per_phase() -> None:
    book = train_book(config("constant"))
    (d1,) = feed_round(book, round_stats(0, 1, 0.25))
    (d2,) = feed_round(book, round_stats(10, 1, 0.16))
    (d3,) = feed_round(book, round_stats(15, 1, 0.16))
    assert (d1.target, d1.reason) == (1.0, "at-target")
    assert (d2.target, d2.reason) == (0.5, "at-target")  # 0.4 ≤ 0.5 (calibration of phase 2)
    assert (d3.target, d3.repeat, d3.reason) == (None, False, "uncontrolled")


def test_adaptive_target_is_the_mean_grad_norm_of_round_one() -> None:
    book = train_book(config("adaptive"))
    (d,) = feed_round(book, round_stats(0, 1, 100.0, g=2.0))
    assert d.repeat
    assert d.target == 2.0  # factor 1 × mean(1.0, 2.0, 3.0): the EMA starts at the first value
    # round 2's grad_norm field is not used (the step's gradient is that of round 1)
    batch = [stats(i, 0, 2, 100.0 * W[i], grad=1000.0) for i in sorted(PEERS)]
    (d2,) = feed_round(book, batch)
    assert d2.target == 2.0


# -- peers leaving, timeouts ---------------------------------------------------------------------


def test_a_leaving_peer_releases_the_round_it_blocked() -> None:
    book = train_book(config())
    batch = round_stats(0, 1, 0.25)
    assert book.add(batch[1], PEERS, 0.0) == []  # peer 0
    assert book.add(batch[2], PEERS, 0.0) == []  # peer 1; peer 2 never reports
    assert book.expire(PEERS, 1.0) == []  # still waiting for peer 2, not stale
    decisions = book.expire({0, 1}, 1.0)  # peer 2 left
    assert len(decisions) == 1
    d = decisions[0]
    assert (d.step, d.round, d.repeat, d.reason) == (0, 1, False, "at-target")
    assert d.statistic == estimator([0.25 * W[0], 0.25 * W[1]])
    (rec,) = book.records
    assert (rec.peers, rec.partial) == (2, False)  # complete for the peers still expected
    assert book.pending == {}
    # peer 2's statistic arriving late is ignored, no second decision
    assert book.add(batch[0], {0, 1}, 2.0) == []
    assert book.ignored == 1
    assert len(book.records) == 1


def test_a_round_older_than_timeout_is_decided_with_what_arrived() -> None:
    book = train_book(config(), timeout=5.0)
    batch = {s.peer: s for s in round_stats(0, 1, 16.0)}
    assert book.add(batch[0], PEERS, 100.0) == []  # opens the round at t = 100
    assert book.add(batch[1], PEERS, 104.0) == []  # a later arrival does not re-open it
    assert book.expire(PEERS, 104.999) == []
    (d,) = book.expire(PEERS, 105.0)
    partial_theta = estimator([batch[0].theta, batch[1].theta])
    assert (d.step, d.round, d.statistic) == (0, 1, partial_theta)
    assert d.repeat  # 16·(0.5+1)/2 = 12 → Θ ≈ 3.46 > 1
    (rec,) = book.records
    assert rec.partial
    assert rec.peers == 2
    assert rec.theta == partial_theta
    # the straggler's statistic for the decided round changes nothing
    assert book.add(batch[2], PEERS, 106.0) == []
    assert book.ignored == 1


def test_a_stale_round_is_decided_by_the_next_add_too() -> None:
    book = train_book(config(), timeout=5.0)
    assert book.add(stats(0, 0, 1, 16.0), PEERS, 0.0) == []
    # every add re-checks the pending rounds: a statistic arriving after the timeout decides
    # the round at once, without waiting for the next expire() tick
    out = book.add(stats(1, 0, 1, 16.0), PEERS, 6.0)
    assert [(d.step, d.round) for d in out] == [(0, 1)]
    assert book.records[0].partial


# -- ignored statistics --------------------------------------------------------------------------


def test_duplicates_decided_rounds_and_other_stages_do_not_decide_twice() -> None:
    book = train_book(config())
    batch = {s.peer: s for s in round_stats(0, 1, 16.0)}
    assert book.add(batch[0], PEERS, 0.0) == []
    assert book.add(batch[0], PEERS, 0.0) == []  # duplicate (QoS 1 redelivery) while pending
    assert set(book.pending[(0, 1)].stats) == {0}  # counted once
    assert book.add(batch[1], PEERS, 0.0) == []
    decisions = book.add(batch[2], PEERS, 0.0)
    assert len(decisions) == 1
    assert book.records[-1].peers == 3

    assert book.ignored == 1  # the duplicate while pending
    for s in batch.values():  # every statistic again, after the decision
        assert book.add(s, PEERS, 1.0) == []
    assert book.ignored == 4
    # a statistic of the calibrate stage in the train stage, for a round not seen yet
    for s in round_stats(0, 2, 0.01, stage="calibrate"):
        assert book.add(s, PEERS, 1.0) == []
    assert book.ignored == 7
    assert (0, 2) not in book.pending
    assert len(book.records) == 1
    assert book.expire(set(), 100.0) == []  # nothing hidden in pending either


@pytest.mark.parametrize("stage", ["train", "calibrate"])
def test_a_statistic_outside_the_plan_is_ignored_not_raised(stage: str) -> None:
    """Bad input is rejected and counted, never a crash (docs/architecture.md#failure-handling): a
    Stats whose step lies outside the plan is valid on the wire (the schema only checks step ≥
    0)."""
    cfg = config()
    plan = plan_of(cfg)
    if stage == "train":
        book = train_book(cfg)
    else:
        book = RoundBook("calibrate", plan, recorder=CalibrationRecorder("theta"))
    bad = stats(0, plan.total_steps, 1, 1.0, stage=stage)  # step 20 of a 20-step plan
    assert book.add(bad, {0}, 0.0) == []
    assert book.ignored == 1
    # and the book still works afterwards
    book.add(stats(0, 0, 1, 0.25, stage=stage), {0}, 0.0)
    assert [(r.step, r.round) for r in book.records] == [(0, 1)]


# -- lagged mode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "adaptive"])
def test_lagged_publishes_only_the_planned_last_round(mode: str) -> None:
    cfg = config(mode, lagged=True, max_rounds=4)
    book = train_book(cfg)
    ref = controller(cfg)
    script = {
        0: [4.0, 9.0, 9.0],  # first step of phase 1: 1 round, whatever Θ is
        1: [2.25, 1.44, 1.0, 1.0],
        2: [0.64, 0.36, 0.25, 0.25],
        3: [0.25, 0.25, 0.25, 0.25],
        10: [9.0, 9.0, 9.0, 9.0],  # first step of phase 2: back to 1 round
        11: [9.0, 9.0, 9.0, 9.0],
        15: [1.0],  # uncontrolled phase
    }
    planned_seen = {}
    for step, scales in script.items():
        g = GRADS.get(step, 1.0)
        planned = ref.begin_step(step, math.fsum(g * x for x in G) / len(G))
        planned_seen[step] = planned
        stats_after: list[float] = []
        for rnd in range(1, planned + 1):
            batch = round_stats(step, rnd, scales[rnd - 1], g)
            big_theta = theta([s.theta for s in batch])
            stats_after.append(big_theta)
            got = feed_round(book, batch)
            d = ref.after_round(step, rnd, big_theta)
            if rnd < planned:
                assert d.repeat
                assert got == []  # peers follow the plan: nothing published mid-step
                continue
            assert not d.repeat
            if book.plan.phase_at(step).controlled:
                tgt = ref.target(step)
                assert tgt is not None
                assert d.rounds_next == lagged_rounds(stats_after, tgt, 4)
            assert got == [
                Decision(
                    step=step,
                    round=rnd,
                    repeat=False,
                    target=d.target,
                    statistic=big_theta,
                    rounds_next=d.rounds_next,
                    reason=d.reason,
                )
            ]
        ref.end_step(step, stats_after)
    assert planned_seen[0] == 1  # first step of a controlled phase
    assert planned_seen[10] == 1
    assert planned_seen[1] == 2  # Θ = 2 > 1 after one round → one more
    assert planned_seen[11] == 2
    assert planned_seen[15] == 1
    assert max(planned_seen.values()) >= 3  # the script really exercised multi-round plans
    # the intermediate rounds are in the records, with repeat = True and no rounds_next
    mid = [r for r in book.records if r.repeat]
    assert mid
    assert all(r.rounds_next is None and r.reason == "lagged-plan" for r in mid)
    last_uncontrolled = book.records[-1]
    assert (last_uncontrolled.step, last_uncontrolled.reason) == (15, "uncontrolled")
    assert last_uncontrolled.rounds_next is None


def test_lagged_first_controlled_step_decides_after_round_one() -> None:
    book = train_book(config("constant", lagged=True))
    (d,) = feed_round(book, round_stats(0, 1, 4.0))  # Θ = 2 > target 1
    assert (d.step, d.round, d.repeat) == (0, 1, False)
    assert d.rounds_next == lagged_rounds([2.0], 1.0, 4) == 2
    assert d.reason == "lagged-plan"


# -- calibrate stage -----------------------------------------------------------------------------


def test_calibrate_stage_records_the_per_phase_max_and_decides_nothing() -> None:
    cfg = config("constant")
    plan = plan_of(cfg)
    book = RoundBook("calibrate", plan, recorder=CalibrationRecorder("theta"))
    expected_max: dict[int, float] = {}
    for step in range(plan.total_steps):
        scale = 1.0 + ((step * 7) % 5)  # varies within every phase
        batch = round_stats(step, 1, scale, stage="calibrate")
        assert feed_round(book, batch) == []
        big_theta = theta([s.theta for s in batch])
        k = plan.phase_at(step).index
        expected_max[k] = max(expected_max.get(k, 0.0), big_theta)
    assert book.pending == {}
    assert len(book.records) == plan.total_steps
    assert all(
        r.stage == "calibrate" and r.reason == "calibration" and r.target is None and not r.repeat
        for r in book.records
    )
    cal = book.calibration()
    assert cal.statistic == "theta"
    assert cal.max_statistic == expected_max  # exact: the same estimator, max of floats
    assert set(cal.max_statistic) == {1, 2, 3}
    # train-stage statistics do not belong to a calibration book
    assert book.add(stats(0, 3, 1, 1.0), PEERS, 0.0) == []
    assert book.ignored == 1
    # the recorded calibration drives a constant-target controller
    ConsensusController(control_config(cfg), plan, cal)


# -- lost rounds ---------------------------------------------------------------------------------


def test_a_step_whose_first_round_was_lost_is_resynced() -> None:
    cfg = config("constant")
    book = train_book(cfg)
    ref = controller(cfg)
    (d0,) = feed_round(book, round_stats(0, 1, 16.0))  # Θ = 4 > 1: repeat
    assert d0.repeat
    theta0 = theta([16.0 * w for w in W])
    assert d0.statistic == theta0
    ref.begin_step(0, 1.0)
    ref.after_round(0, 1, theta0)
    # step 0's round 2 and step 1's round 1 never arrive (broker outage); step 1 round 2 does
    (resync,) = feed_round(book, round_stats(1, 2, 16.0))
    assert resync == Decision(step=1, round=2, repeat=False, reason="resync")
    assert book.records[-1].reason == "resync"
    assert book.records[-1].target is None
    ref.end_step(0, [theta0])  # what the book does with the abandoned step
    # the next step proceeds normally
    (d2,) = feed_round(book, round_stats(2, 1, 16.0))
    ref.begin_step(2, 1.0)
    want = ref.after_round(2, 1, theta([16.0 * w for w in W]))
    assert (d2.step, d2.round, d2.repeat, d2.target, d2.reason) == (
        2,
        1,
        want.repeat,
        want.target,
        want.reason,
    )
    assert d2.reason == "above-target"
    (d3,) = feed_round(book, round_stats(2, 2, 0.25))
    assert (d3.repeat, d3.reason) == (False, "at-target")


def test_a_round_lost_inside_a_step_is_resynced() -> None:
    book = train_book(config("constant"))
    (d1,) = feed_round(book, round_stats(0, 1, 16.0))
    assert d1.repeat
    (resync,) = feed_round(book, round_stats(0, 3, 16.0))  # round 2 lost
    assert resync == Decision(step=0, round=3, repeat=False, reason="resync")
    (d,) = feed_round(book, round_stats(1, 1, 0.25))
    assert (d.step, d.round, d.repeat, d.reason) == (1, 1, False, "at-target")


def test_lagged_abandoned_step_still_feeds_the_lagged_rule() -> None:
    cfg = config("constant", lagged=True)
    book = train_book(cfg)
    (d0,) = feed_round(book, round_stats(0, 1, 4.0))  # Θ = 2 → 2 rounds next
    assert d0.rounds_next == 2
    assert feed_round(book, round_stats(1, 1, 9.0)) == []  # round 1 of 2; round 2 is lost
    closed, resync = feed_round(book, round_stats(2, 2, 1.0))  # step 2's round 1 lost too
    assert resync.reason == "resync"
    # step 1 is closed without its round 2, and its plan for step 2 is published all the same
    assert (closed.step, closed.round, closed.repeat, closed.reason) == (
        1,
        1,
        False,
        "closed-incomplete",
    )
    assert (closed.rounds_next, closed.statistic, closed.target) == (2, 3.0, 1.0)
    # step 1 was closed with its one statistic Θ = 3 > 1: step 3 plans 2 rounds
    assert feed_round(book, round_stats(3, 1, 0.25)) == []
    (d,) = feed_round(book, round_stats(3, 2, 0.25))
    assert (d.step, d.round) == (3, 2)
    assert d.rounds_next == lagged_rounds([0.5, 0.5], 1.0, 4) == 1


# -- records -------------------------------------------------------------------------------------


def test_records_carry_what_was_decided() -> None:
    book = train_book(config("constant"), timeout=5.0)
    feed_round(book, round_stats(0, 1, 16.0))
    feed_round(book, round_stats(0, 2, 0.25))
    book.add(stats(1, 1, 1, 0.5), PEERS, 10.0)
    book.expire(PEERS, 20.0)  # peers 0 and 2 never report: partial
    feed_round(book, round_stats(15, 1, 4.0), now=30.0)
    got = [
        (r.stage, r.step, r.round, r.peers, r.target, r.repeat, r.rounds_next, r.reason, r.partial)
        for r in book.records
    ]
    assert got == [
        ("train", 0, 1, 3, 1.0, True, None, "above-target", False),
        ("train", 0, 2, 3, 1.0, False, None, "at-target", False),
        ("train", 1, 1, 1, 1.0, False, None, "at-target", True),
        ("train", 15, 1, 3, None, False, None, "uncontrolled", False),
    ]
    assert [r.theta for r in book.records] == [
        estimator([16.0 * w for w in W]),
        estimator([0.25 * w for w in W]),
        estimator([0.5]),
        estimator([4.0 * w for w in W]),
    ]
    js = book.records[2].to_json()
    assert js["kind"] == "round"
    assert js["partial"] is True
    assert js["theta"] == math.sqrt(0.5)
    assert isinstance(book.records[0], RoundRecord)


def test_plans_built_from_fractions_work_too() -> None:
    """The book only needs a PhasePlan: one built by hand behaves like one from a config."""
    plan = build_plan(
        LRSchedule.from_fractions(0.1, 40, warmup=0.0, milestones=(0.5,)),
        controlled_phases=(1,),
        control_mode="constant",
    )
    cfg = config("constant")
    ctl = ConsensusController(control_config(cfg), plan, Calibration({1: 2.0}, "theta"))
    book = RoundBook("train", plan, controller=ctl)
    (d,) = feed_round(book, round_stats(19, 1, 9.0))  # Θ = 3 > 2
    assert (d.repeat, d.target) == (True, 2.0)
    (d,) = feed_round(book, round_stats(20, 1, 9.0))  # phase 2: uncontrolled
    assert (d.repeat, d.target, d.reason) == (False, None, "uncontrolled")
