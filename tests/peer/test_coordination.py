"""`concord.peer.schedules.Membership`: which schedule, members and graph are in force at a step
— adaptive graphs (ada-feedback) taken from the orchestrator's published schedule, the wait for a
decision's schedule at its effective step, and the neighbour check of incoming frames."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import structlog
import torch

from concord.core.config import RunConfig, load_config
from concord.core.control.runplan import Schedules, make_lr_schedule, make_plan
from concord.core.graphs.adagraph import feedback_config
from concord.peer.coordination import OrchestratedCoordination, OrchestratorHooks, Stage
from concord.peer.schedules import Membership, ScheduleCheck, phase_topologies
from concord.peer.serde import TENSOR_ALLREDUCE
from concord.peer.transport import Transport
from concord.protos.control_plane import Schedule
from tests.peer.transports import transports

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


def _transports(n: int) -> list[Transport]:
    return transports(n, n, dim=8, deadline=1.0)


async def _wanted(t: Transport) -> None:
    """Until a Fetch waits for ``t``'s training thread."""
    for _ in range(500):
        if t.wanted:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no Fetch arrived")


def _coordination(cfg: RunConfig, peer: int) -> OrchestratedCoordination:
    """Not entered: no broker session (the schedules held are set by the test)."""
    stop = threading.Event()
    return OrchestratedCoordination(
        cfg, peer, broker="mqtt://127.0.0.1:1", run_id="t", stop=stop, step=lambda: 0
    )


def _schedule(cfg: RunConfig, version: int, peers: list[int], effective: int) -> Schedule:
    return Schedule(
        version=version,
        peers=peers,
        topology=cfg.topology,
        weights=cfg.weights,
        kappa=cfg.kappa,
        seed=cfg.seed,
        phases=[{"index": 1, "topology": None}],
        addresses=[f"127.0.0.1:{1000 + p}" for p in peers],
        effective_step=effective,
    )


def test_a_neighbour_answers_a_readmitted_peers_fetch_at_the_boundary_of_its_joining_step() -> None:
    """Answered earlier, the joining peer would start at its joining step with a round counter
    guessed for the steps in between (a controlled step runs several rounds)."""
    cfg = load_config(None, ["peers=4", "epochs=2", "control.mode=none"], environ={})

    async def body() -> None:
        t0, _, _, t3 = transports = _transports(4)
        await asyncio.gather(t0.start(t0.addresses[0]), t3.start(t3.addresses[3]))
        coord = _coordination(cfg, 0)
        coord._transport, coord._loop = t0, asyncio.get_running_loop()
        m = coord.membership
        m.step_base = 100  # wire steps of the train stage (after a calibrate stage)
        m.apply(_schedule(cfg, 2, [0, 1, 2], 5))  # peer 3 was dropped
        hooks = OrchestratorHooks(
            SimpleNamespace(),  # type: ignore[arg-type]  # not used before a step
            m,
            structlog.get_logger(),
            train=True,
            addresses=coord._addresses,
        )
        t0.training = True
        try:
            coord.client.schedule = _schedule(cfg, 3, [0, 1, 2, 3], 8)  # back at step 8
            await asyncio.to_thread(hooks.before, 6)  # seen at a boundary before step 8
            fetch = asyncio.create_task(t3.fetch(0, timeout=10.0))
            await _wanted(t0)
            x = torch.arange(8, dtype=torch.float32)
            await asyncio.to_thread(t0.fulfil, x, 107, 40)  # before step 7: not yet
            await asyncio.sleep(0.2)
            assert not fetch.done()
            await asyncio.to_thread(t0.fulfil, x, 108, 43)  # the boundary of its step
            got = await fetch
            assert got is not None
            assert (got.step, got.round) == (108, 43)
            # a newer schedule that adds nobody back holds nothing: the next boundary answers
            m.apply(coord.client.schedule)
            coord.client.schedule = _schedule(cfg, 4, [0, 1, 3], 12)  # peer 2 left
            await asyncio.to_thread(hooks.before, 10)
            fetch = asyncio.create_task(t3.fetch(0, timeout=10.0))
            await _wanted(t0)
            await asyncio.to_thread(t0.fulfil, x, 110, 45)
            got = await fetch
            assert got is not None
            assert got.step == 110
        finally:
            await asyncio.gather(*(t.stop(1.0) for t in transports))

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_readmitted_peer_takes_frames_of_its_joining_step_before_its_first_round() -> None:
    """Its neighbours send it their tensors of that step as soon as they answered its Fetch,
    before its own first round moves its mailbox on: they would be refused as too far ahead."""
    cfg = load_config(None, ["peers=4", "epochs=2", "control.mode=none"], environ={})

    async def body() -> None:
        (t3,) = _transports(1)
        coord = _coordination(cfg, 3)
        coord._transport = t3
        coord.client.schedule = _schedule(cfg, 3, [0, 1, 2, 3], 8)
        train = Stage("train", None, 100)
        assert coord.rejoin_at(train) is None  # a peer that started with everyone
        assert t3.mailbox.step == 0
        coord.joined_version = 3
        assert coord.rejoin_at(Stage("calibrate", 5, 0)) is None
        assert coord.rejoin_at(train) == 8
        assert t3.mailbox.step == 108

    asyncio.run(body())
