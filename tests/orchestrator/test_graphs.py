"""`concord.orchestrator.graphs.GraphBook`: the orchestrator's ada-feedback bookkeeping — steps
complete when every expected peer reported (or on a timeout), feed the graph controller in step
order, and every decision point yields a decision (the same numbers as the controller fed
directly)."""

from __future__ import annotations

import math

from concord.core.control.plan import LRSchedule, PhasePlan, build_plan
from concord.core.graphs.adagraph import FeedbackConfig, GraphFeedback
from concord.orchestrator.graphs import GraphBook
from concord.protos.control_plane import Stats

PEERS = {0, 1, 2, 3}


def plan(total: int = 40) -> PhasePlan:
    return build_plan(LRSchedule.from_fractions(0.1, total, warmup=0.0, milestones=(0.5,)))


def book(timeout: float = 10.0, **kw: object) -> GraphBook:
    base: dict[str, object] = {"every": 2, "factor": 1.0, "ema": 0.0, "lag": 1, "k0": 1}
    base.update(kw)
    return GraphBook(plan(), GraphFeedback(FeedbackConfig(**base), n=4), timeout=timeout)  # type: ignore[arg-type]


def stats(peer: int, step: int, theta: float = 4.0, grad: float = 1.0) -> Stats:
    return Stats(peer=peer, step=step, round=1, theta=theta, grad_norm=grad)


def test_a_step_completes_when_every_expected_peer_reported() -> None:
    b = book()
    for p in (0, 1, 2, 3):
        assert b.add(stats(p, 0), PEERS, 0.0) == []
    assert b.fed == 0
    for p in (0, 1, 2):
        assert b.add(stats(p, 1), PEERS, 0.0) == []
    (d,) = b.add(stats(3, 1), PEERS, 0.0)  # Θ = 2 > target 1 → denser
    assert (d.step, d.effective, d.k_from, d.k_to) == (1, 2, 1, 2)
    assert b.partial == 0
    assert b.ignored == 0


def test_same_decisions_as_the_controller_fed_directly() -> None:
    thetas = {s: [0.01 * (s + 1) * (p + 1) for p in range(4)] for s in range(12)}
    grads = {s: [0.1 * ((s + p) % 3 + 1) for p in range(4)] for s in range(12)}
    direct = GraphFeedback(FeedbackConfig(every=3, factor=0.2, ema=0.5, lag=2, k0=1), n=4)
    want = [d for s in range(12) for d in direct.observe(s, 1, thetas[s], grads[s])]
    b = book(every=3, factor=0.2, ema=0.5, lag=2)
    got = []
    for s in range(12):
        for p in (3, 1, 0, 2):  # arrival order does not matter
            got += b.add(stats(p, s, thetas[s][p], grads[s][p]), PEERS, 0.0)
    assert got == want
    assert len(got) == 4


def test_a_peer_that_left_is_not_waited_for_and_a_timeout_decides_partially() -> None:
    b = book(timeout=5.0)
    b.add(stats(0, 0), PEERS, 0.0)
    b.add(stats(1, 0), PEERS, 0.0)
    assert b.expire({0, 1, 2}, 1.0) == []
    assert 0 in b.pending
    assert b.expire({0, 1}, 1.0) == []
    assert b.fed == 0
    b.add(stats(0, 1), {0, 1}, 2.0)
    assert b.expire({0, 1}, 6.9) == []
    assert b.fed == 0
    (d,) = b.expire({0, 1}, 7.0)  # step 1 decided on peer 0 alone
    assert d.step == 1
    assert b.partial == 1


def test_steps_feed_in_order_and_stale_or_duplicate_statistics_are_ignored() -> None:
    b = book(timeout=5.0)
    for p in PEERS:
        b.add(stats(p, 1), PEERS, 0.0)  # step 1 complete, but step 0 was never reported
    assert b.fed == 1  # nothing waits for a step nobody reported
    assert b.add(stats(0, 0), PEERS, 0.1) == []
    assert b.ignored == 1
    b.add(stats(0, 2), PEERS, 1.0)
    b.add(stats(0, 2), PEERS, 1.0)  # a duplicate
    assert b.ignored == 2
    for p in PEERS:
        b.add(stats(p, 3), PEERS, 1.0)  # complete, but step 2 still pending: wait for it
    assert b.fed == 1
    assert set(b.pending) == {2, 3}
    decisions = b.expire(PEERS, 6.0)  # step 2 times out, then 3 feeds
    assert b.fed == 3
    assert [d.step for d in decisions] == [3]
    assert b.add(stats(1, 40), PEERS, 7.0) == []
    assert b.ignored == 3


def test_a_decision_point_lost_entirely_is_still_decided() -> None:
    b = book()
    for p in PEERS:
        b.add(stats(p, 0, theta=0.25), PEERS, 0.0)  # Θ = 0.5: in the band [0.5, 1]
    decisions = []
    for p in PEERS:  # step 1 (a decision point) never arrives; step 2 does
        decisions += b.add(stats(p, 2), PEERS, 0.0)
    (d,) = decisions
    assert (d.step, d.steps, d.reason, d.theta) == (1, 1, "in-band", math.sqrt(0.25))
