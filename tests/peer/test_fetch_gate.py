"""Fetch only from the graph: a peer answers Fetch only to peers that are, were or will be its
neighbours in the run's schedule, at most a burst and then one per `FETCH_REFILL` seconds per
peer id; refusals are counted under their own names. Real gRPC transports on loopback."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from concord.core.config import load_config
from concord.core.control.plan import Phase
from concord.core.control.runplan import Schedules
from concord.peer.coordination import FetchPeers, graph_neighbours
from concord.peer.servicer import FETCH_BURST, FetchGate
from concord.peer.validate import RejectedError
from tests.peer.transports import transports

DIM = 64


def _runner(topology: str, peers: int) -> Any:
    cfg = load_config(None, [f"peers={peers}", f"topology={topology}"], environ={})
    phase = Phase(1, 0, 100, "gossip", None, True)
    return SimpleNamespace(plan=SimpleNamespace(phases=[phase]), schedules=Schedules(cfg))


def test_the_graph_names_the_neighbours_of_every_round() -> None:
    assert graph_neighbours(_runner("ring", 8), 0) == {1, 7}
    # one-peer exponential: a different neighbour each round, all of them over a period
    assert graph_neighbours(_runner("exponential-one-peer", 8), 0) == {1, 2, 4}
    # over the members a repaired schedule lists (peer 7 left): the ring closes over 6
    assert graph_neighbours(_runner("ring", 8), 0, members=list(range(7))) == {1, 6}
    runner = _runner("ring", 8)
    may = FetchPeers(0, lambda: [(None, None)])
    assert may(5)  # not training yet: the Fetch is refused as "not training" instead
    may.runner = runner
    assert may(1)
    assert may(7)
    assert not may(4)
    assert not may(0)
    # a later schedule without peer 7: it stays allowed (it was a neighbour), 6 is now one
    graphs = [(None, None), (list(range(7)), None)]
    may.graphs = lambda: graphs
    assert may(6)
    assert may(7)
    assert not may(3)


def test_the_gate_limits_each_peer_id_to_a_burst_then_a_steady_rate() -> None:
    gate = FetchGate(burst=3, refill=2.0)
    for _ in range(3):
        gate.check(1, None, 100.0)
    with pytest.raises(RejectedError) as err:
        gate.check(1, None, 100.5)
    assert err.value.reason == "overload"
    gate.check(2, None, 100.5)  # per peer id
    gate.check(1, None, 102.6)  # one more after 2 s
    with pytest.raises(RejectedError):
        gate.check(1, None, 102.7)
    with pytest.raises(RejectedError) as err:
        gate.check(3, lambda j: j in {1, 2}, 103.0)
    assert err.value.reason == "permission"
    assert "not a neighbour" in err.value.detail
    assert gate.refused == {"rate": 2, "not-neighbour": 1}


def test_a_non_neighbour_is_refused_and_a_flood_is_capped_over_grpc() -> None:
    """A ring of 4: peer 2 is not a neighbour of peer 0 — its Fetch is refused before the
    training thread is asked; neighbour 1 is answered; 20 Fetches of peer 1 in a row get
    `FETCH_BURST` answers at most, the rest refused at once as a flood."""

    async def body() -> None:
        t0, t1, t2 = transports(3, 4, dim=DIM, deadline=1.0)
        may = FetchPeers(0, lambda: [(None, None)])
        may.runner = _runner("ring", 4)
        t0.may_fetch = may
        for t in (t0, t1, t2):
            await t.start(t.addresses[t.peer_id])
        t0.training = True
        try:
            assert await t2.fetch(0, timeout=5.0) is None
            assert t0.counters.rejected == {"fetch-not-neighbour": 1}
            assert not t0.wanted
            fetch = asyncio.create_task(t1.fetch(0, timeout=10.0))
            for _ in range(200):
                if t0.wanted:
                    break
                await asyncio.sleep(0.01)
            await asyncio.to_thread(t0.fulfil, torch.ones(DIM), 5, 5)
            got = await fetch
            assert got is not None
            assert torch.equal(got.x, torch.ones(DIM))
            t0.training = False  # answered at once from now on ("not training")
            start = time.monotonic()
            for _ in range(20):
                assert await t1.fetch(0, timeout=5.0) is None
            assert time.monotonic() - start < 10.0
            assert t0.counters.rejected["fetch-rate"] >= 20 - FETCH_BURST
        finally:
            await asyncio.gather(*(t.stop(1.0) for t in (t0, t1, t2)))

    asyncio.run(asyncio.wait_for(body(), 60))
