"""`PeerComm`'s non-blocking exchange (start → handle → wait) between two real `Transport`s over
loopback gRPC, each peer's `Comm` driven from its own "training thread" as in a peer process: a
started round runs on the event loop while the training thread computes, and ends there without
the training thread's help; ``wait`` then mixes what arrived."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest
import torch

from concord.core.comm import MixResult
from concord.peer.comm import PeerComm, RoundHandle
from tests.peer.transports import transports

DIM = 300_000  # 1.2 MB of float32: two chunks of ≤ 1 MiB
T = TypeVar("T")


class Pair:
    """Two connected transports served by one event loop in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="loop", daemon=True)
        self.thread.start()
        self.transports = transports(2, 2, dim=DIM, deadline=20.0)
        for t in self.transports:
            self.run(t.start(t.addresses[t.peer_id]))
        for t in self.transports:
            assert self.run(t.connect([1 - t.peer_id], timeout=10)) == []
        self.comms = [PeerComm(i, 2, t, self.loop) for i, t in enumerate(self.transports)]

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        async def stop() -> None:
            await asyncio.gather(*(t.stop(1.0) for t in self.transports))

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


W = np.full((2, 2), 0.5)


def test_a_started_mix_ends_on_the_loop_while_the_training_thread_computes(pair: Pair) -> None:
    comm0, comm1 = pair.comms
    x0, x1 = torch.full((1, DIM), 1.0), torch.full((1, DIM), 3.0)
    handle = comm0.start_mix(x0, W, step=0, round=0)
    assert isinstance(handle, RoundHandle)
    assert not handle.done()  # peer 1 has sent nothing yet: the round is in flight
    got: list[MixResult] = []
    neighbour = threading.Thread(target=lambda: got.append(comm1.mix(x1, W, step=0, round=0)))
    neighbour.start()
    # this thread computes and never calls into the comm: the round must end on the loop alone
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    work = 0
    end = time.monotonic() + 30
    while not handle.done() and time.monotonic() < end:
        a = torch.tanh(a @ a / 16)
        work += 1
    assert handle.done(), "the round did not end while the training thread computed"
    assert work > 0  # the training thread did compute while the round was in flight
    result = handle.wait()
    torch.testing.assert_close(result.x, torch.full((1, DIM), 2.0), rtol=0, atol=0)  # exact
    assert result.outcome.answered == [[1]]
    assert handle.wait() is result  # a second wait: the same result, accounted once
    assert comm0.counters.rounds == 1
    assert comm0.counters.bytes_wire == DIM * 4
    neighbour.join(timeout=30)
    torch.testing.assert_close(got[0].x, torch.full((1, DIM), 2.0), rtol=0, atol=0)
    # the time in flight is overlap, not waiting; a blocking mix has none
    assert comm0.breakdown.overlap_ms > comm0.breakdown.wait_ms
    assert comm1.breakdown.overlap_ms == 0.0
    assert comm1.breakdown.wait_ms > 0.0


def test_a_started_average_is_the_mean_of_both_peers(pair: Pair) -> None:
    comm0, comm1 = pair.comms
    x0, x1 = torch.full((1, DIM), 1.0), torch.full((1, DIM), 4.0)
    h0 = comm0.start_allreduce_mean(x0, step=0)
    h1 = comm1.start_allreduce_mean(x1, step=0)
    for h in (h0, h1):
        torch.testing.assert_close(h.wait(), torch.full((1, DIM), 2.5), rtol=0, atol=0)
    assert comm0.last_outcome is not None
    assert comm0.last_outcome.complete
