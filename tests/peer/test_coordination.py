"""`concord.peer.coordination.Membership`: which schedule, members and graph are in force at a step
— adaptive graphs (ada-feedback) taken from the orchestrator's published schedule, the wait for a
decision's schedule at its effective step, and the neighbour check of incoming frames."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from concord.core.config import RunConfig, load_config
from concord.core.control.runplan import Schedules, make_lr_schedule, make_plan
from concord.core.graphs.adagraph import feedback_config
from concord.peer.coordination import Membership, phase_topologies
from concord.peer.serde import TENSOR_ALLREDUCE
from concord.protos.control_plane import Schedule

N = 8  # ring: 0's neighbours are {1, 7}; exponential:3 adds {2, 4, 6}
TENSOR = 0


def config() -> RunConfig:
    return load_config(
        None,
        [
            f"peers={N}",
            "epochs=2",
            "algorithm=ada-feedback",
            "hyper.every=4",
            "hyper.lag=2",
            "hyper.k0=1",
        ],
        environ={},
    )


def schedule(version: int, k: int, *, effective: int = 0, decided: int | None = None) -> Schedule:
    return Schedule(
        version=version,
        peers=list(range(N)),
        topology="ring",
        weights=None,
        kappa=1.0,
        seed=0,
        phases=[{"index": i, "topology": f"exponential:{k}"} for i in (1, 2, 3)],
        effective_step=effective,
        decided_at=decided,
    )


def membership(cfg: RunConfig) -> tuple[Membership, Any]:
    plan = make_plan(cfg, make_lr_schedule(cfg, 20))
    runner = SimpleNamespace(
        schedules=Schedules(cfg), plan=plan, total_steps=plan.total_steps, cfg=cfg
    )
    client = SimpleNamespace(schedule=schedule(1, 1))
    m = Membership(0, feedback_config(cfg.hyper), N)
    m.client, m.runner = client, runner  # type: ignore[assignment]
    m.apply(client.schedule)
    return m, client


def test_the_published_topologies_are_applied_at_their_effective_step() -> None:
    m, client = membership(config())
    phase = m.runner.plan.phases[0]  # type: ignore[union-attr]
    assert m.runner.schedules.topology_name(phase) == "exponential:1"  # type: ignore[union-attr]
    client.schedule = schedule(2, 3, effective=5, decided=3)
    assert m.before_step(4) is None
    assert m.applied == 1
    assert m.before_step(5) is client.schedule
    assert m.applied == 2
    assert m.runner.schedules.topology_name(phase) == "exponential:3"  # type: ignore[union-attr]
    assert phase_topologies(client.schedule) == dict.fromkeys((1, 2, 3), "exponential:3")


def test_a_peer_waits_for_the_decision_taking_effect_at_a_step() -> None:
    m, client = membership(config())  # every 4, lag 2: decisions at 3, 7, …; effective 5, 9, …
    assert [m.awaited(t) for t in range(10)] == [None] * 5 + [3, None, None, None, 7]
    client.schedule = schedule(2, 1, effective=5, decided=3)  # K unchanged, but decided
    assert m.holds(3)
    assert not m.holds(7)
    assert m.awaited(5) is None
    assert m.awaited(9) == 7
    static = Membership(0)  # no adaptive graphs: never waits
    assert static.awaited(5) is None


def test_frames_are_checked_against_the_graph_in_force_at_their_step() -> None:
    m, client = membership(config())

    def ok(sender: int, step: int) -> bool:
        return m.is_neighbour(sender, step, 0, TENSOR)

    assert ok(1, 0)
    assert ok(7, 0)
    assert not ok(2, 0)
    # step 5 is the effective step of decision 3, which this peer does not hold yet: a faster
    # neighbour may already gossip on any exponential:K, so the densest graph is accepted
    assert ok(2, 5)
    assert ok(4, 5)
    assert not ok(3, 5)
    client.schedule = schedule(2, 2, effective=5, decided=3)  # the decision: exponential:2
    assert ok(2, 5)
    assert ok(6, 5)
    assert not ok(4, 5)
    assert not ok(2, 4)  # before the effective step: the applied ring
    client.schedule = schedule(3, 1, effective=5, decided=3)  # re-published, unchanged K
    assert not ok(2, 5)
    assert m.is_neighbour(3, 0, 0, TENSOR_ALLREDUCE)  # all-reduce: everyone but ourselves


def test_a_later_schedule_may_add_back_a_dropped_peer_at_a_new_address_only() -> None:
    from concord.peer.coordination import ScheduleCheck

    cfg = load_config(None, ["peers=4"], environ={})
    check = ScheduleCheck(cfg, 0)
    check.advertise = "h:1000"

    def sched(version: int, peers: list[int], addresses: dict[int, str]) -> Schedule:
        return Schedule(
            version=version,
            peers=peers,
            topology=cfg.topology,
            weights=cfg.weights,
            kappa=cfg.kappa,
            seed=cfg.seed,
            phases=[{"index": 1, "topology": None}],
            addresses=[addresses.get(p, f"h:{1000 + p}") for p in peers],
            effective_step=5 if version > 1 else 0,
        )

    v1 = sched(1, [0, 1, 2, 3], {})
    assert check(v1, None) is None
    v2 = sched(2, [0, 1, 2], {})
    assert check(v2, v1) is None  # peer 3 dropped
    assert check(sched(3, [0, 1, 2, 3], {3: "h:9003"}), v2) is None  # back, moved
    why = check(sched(3, [0, 1, 2, 3], {1: "h:9001", 3: "h:9003"}), v2)
    assert why == "it changes the addresses of peers [1]"  # a peer that stayed keeps its own
    assert "not newer" in (check(sched(2, [0, 1, 2, 3], {}), v2) or "")
    assert "not peers of this run" in (check(sched(3, [0, 1, 2, 4], {}), v2) or "")
