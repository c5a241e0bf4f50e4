"""`PeerComm.mix` from the training thread: Σ_j W[i,j] x_j over the neighbours whose tensor
arrived, renormalised over what arrived (self always present); the outcome is passed through."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from concord.core.comm import MixOutcome
from concord.peer.comm import SWITCH_INTERVAL, PeerComm
from concord.peer.mailbox import Arrival
from concord.peer.serde import PartSpec

D = 5


class FakeTransport:
    """Stands in for `concord.peer.transport.Transport`: neighbours in ``values`` answer, others
    not."""

    deadline = 1.0

    def __init__(
        self,
        values: dict[int, torch.Tensor],
        rejected: Sequence[int] = (),
        push: dict[int, float] | None = None,
    ) -> None:
        self.values = values
        self.rejected = list(rejected)
        self.push = push or {}  # the push-sum weight in each neighbour's frame header
        self.sent_to: list[int] = []
        self.sent_push: float | None = None

    def frames(self, **kw: Any) -> list[object]:
        self.sent_push = kw.get("push_weight")
        return []

    async def round_(
        self, *, receive_from: Sequence[int], send_to: Sequence[int], **_: Any
    ) -> tuple[dict[int, Arrival], MixOutcome]:
        self.sent_to = list(send_to)
        arrived = {
            j: Arrival(
                j,
                0,
                0,
                0,
                "none",
                (PartSpec("values", torch.float32, D, 0),),
                bytearray(self.values[j].numpy().tobytes()),
                self.push.get(j),
            )
            for j in receive_from
            if j in self.values
        }
        bad = [(j, "INVALID_ARGUMENT: nan") for j in receive_from if j in self.rejected]
        missing = [j for j in receive_from if j not in arrived and j not in self.rejected]
        return arrived, MixOutcome([sorted(arrived)], [missing], [bad])


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def _ring4() -> np.ndarray:
    W = np.zeros((4, 4))
    for i in range(4):
        W[i, i] = 0.5
        W[i, (i + 1) % 4] = W[i, (i - 1) % 4] = 0.25
    return W


def test_mix_with_every_neighbour_is_the_weighted_sum(loop: asyncio.AbstractEventLoop) -> None:
    x = {j: torch.full((D,), float(j + 1)) for j in range(4)}
    t = FakeTransport({1: x[1], 3: x[3]})
    comm = PeerComm(0, 4, t, loop)  # type: ignore[arg-type]
    res = comm.mix(x[0].unsqueeze(0), _ring4(), step=0, round=0)
    torch.testing.assert_close(res.x[0], 0.5 * x[0] + 0.25 * x[1] + 0.25 * x[3])
    assert sorted(t.sent_to) == [1, 3]
    assert res.outcome.complete


def test_mix_renormalises_over_what_arrived(loop: asyncio.AbstractEventLoop) -> None:
    x = {j: torch.full((D,), float(j + 1)) for j in range(4)}
    t = FakeTransport({1: x[1]}, rejected=[3])  # 3's tensor was refused
    comm = PeerComm(0, 4, t, loop)  # type: ignore[arg-type]
    res = comm.mix(x[0].unsqueeze(0), _ring4(), step=0, round=0)
    # weights 0.5 (self) and 0.25 (peer 1) renormalised by their sum 0.75
    torch.testing.assert_close(res.x[0], (0.5 * x[0] + 0.25 * x[1]) / 0.75)
    assert res.outcome.answered == [[1]]
    assert res.outcome.rejected == [[(3, "INVALID_ARGUMENT: nan")]]
    alone = PeerComm(0, 4, FakeTransport({}), loop)  # type: ignore[arg-type]
    res = alone.mix(x[0].unsqueeze(0), _ring4(), step=0, round=0)
    torch.testing.assert_close(res.x[0], x[0])  # nobody answered: the row is kept
    assert res.outcome.missing == [[1, 3]]


def test_allreduce_mean_averages_over_the_peers_that_answered(
    loop: asyncio.AbstractEventLoop,
) -> None:
    x = {j: torch.full((D,), float(j + 1)) for j in range(4)}
    comm = PeerComm(2, 4, FakeTransport({0: x[0], 1: x[1]}), loop)  # type: ignore[arg-type]
    got = comm.allreduce_mean(x[2].unsqueeze(0), step=0)
    torch.testing.assert_close(got[0], (x[0] + x[1] + x[2]) / 3)


def _column_stochastic() -> np.ndarray:
    """Peer 0 receives from 1 and 2 (in-degree 2), 1 from nobody, 2 from 0: columns sum to 1,
    rows do not."""
    return np.array([[0.5, 0.5, 0.5], [0.0, 0.5, 0.0], [0.5, 0.0, 0.5]])


def test_a_push_sum_round_carries_the_weights_and_is_not_renormalised(
    loop: asyncio.AbstractEventLoop,
) -> None:
    W = _column_stochastic()
    x = {j: torch.full((D,), float(j + 1)) for j in range(3)}
    w = {0: 0.75, 1: 1.5, 2: 0.75}
    t = FakeTransport({1: x[1], 2: x[2]}, push=w)
    comm = PeerComm(0, 3, t, loop)  # type: ignore[arg-type]
    res = comm.mix(x[0].unsqueeze(0), W, push=torch.tensor([w[0]], dtype=torch.float64))
    assert t.sent_push == 0.75  # our weight rides with our numerators
    assert t.sent_to == [2]  # we push to whoever has us in its column: W[2, 0] > 0
    # row sum 1.5: not renormalised (exact: halves of small integers)
    torch.testing.assert_close(
        res.x[0], torch.full((D,), 0.5 * 1 + 0.5 * 2 + 0.5 * 3), rtol=0, atol=0
    )
    assert res.push is not None
    assert res.push.tolist() == [0.5 * 0.75 + 0.5 * 1.5 + 0.5 * 0.75]


def test_a_lost_push_sum_message_takes_its_weight_along(loop: asyncio.AbstractEventLoop) -> None:
    W = _column_stochastic()
    x = {j: torch.full((D,), float(j + 1)) for j in range(3)}
    t = FakeTransport({2: x[2]}, push={2: 0.75})  # peer 1's message is lost
    comm = PeerComm(0, 3, t, loop)  # type: ignore[arg-type]
    res = comm.mix(x[0].unsqueeze(0), W, push=torch.tensor([0.75], dtype=torch.float64))
    assert res.outcome.missing == [[1]]
    numerator = 0.5 * 1 + 0.5 * 3  # own and peer 2 only, not renormalised by their 1.0
    torch.testing.assert_close(res.x[0], torch.full((D,), numerator), rtol=0, atol=0)
    assert res.push is not None
    assert res.push.tolist() == [0.5 * 0.75 + 0.5 * 0.75]


def test_a_push_sum_frame_without_a_weight_is_rejected(loop: asyncio.AbstractEventLoop) -> None:
    W = _column_stochastic()
    x = {j: torch.full((D,), float(j + 1)) for j in range(3)}
    t = FakeTransport({1: x[1], 2: x[2]}, push={2: 0.75})  # peer 1 sent no weight
    comm = PeerComm(0, 3, t, loop)  # type: ignore[arg-type]
    res = comm.mix(x[0].unsqueeze(0), W, push=torch.tensor([0.75], dtype=torch.float64))
    assert res.outcome.rejected[0] == [(1, "push-sum round without the sender's weight")]
    torch.testing.assert_close(res.x[0], torch.full((D,), 0.5 * 1 + 0.5 * 3), rtol=0, atol=0)
    assert res.push is not None
    assert res.push.tolist() == [0.75]


class StuckTransport(FakeTransport):
    """A round that never ends (a transport bug, or a loop blocked past every deadline)."""

    deadline = 0.2

    async def round_(self, **_: Any) -> tuple[dict[int, Arrival], MixOutcome]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_a_round_stuck_past_its_deadline_is_missing_neighbours_not_an_exception(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    import concord.peer.comm as comm_module

    monkeypatch.setattr(comm_module, "_SLACK", 0.3)
    comm = PeerComm(0, 4, StuckTransport({}), loop)  # type: ignore[arg-type]
    x = torch.ones(1, D)
    W = np.full((4, 4), 0.25)
    result = comm.mix(x, W, step=0, round=1)  # gives up after 2 × 0.2 + 0.3 s
    assert result.outcome.missing == [[1, 2, 3]]
    assert result.outcome.answered == [[]]
    assert torch.allclose(result.x, x)  # renormalised over itself alone


class SlowTransport(FakeTransport):
    async def round_(self, **kw: Any) -> tuple[dict[int, Arrival], MixOutcome]:
        await asyncio.sleep(0.05)
        return await super().round_(**kw)


def test_the_breakdown_puts_the_wait_for_neighbours_in_wait_ms_and_starts_over_each_step(
    loop: asyncio.AbstractEventLoop,
) -> None:
    x = {j: torch.full((D,), float(j + 1)) for j in range(4)}
    comm = PeerComm(0, 4, SlowTransport({1: x[1], 3: x[3]}), loop)  # type: ignore[arg-type]
    comm.mix(x[0].unsqueeze(0), _ring4(), step=0, round=0)
    comm.mix(x[0].unsqueeze(0), _ring4(), step=0, round=1)
    got = comm.take_breakdown()
    assert set(got) == {"encode_ms", "wait_ms", "mix_ms", "overlap_ms"}
    assert got["wait_ms"] >= 2 * 50 * 0.9  # two rounds of a 50 ms neighbour (timer slack)
    assert 0 <= got["encode_ms"] < got["wait_ms"]
    assert 0 < got["mix_ms"] < got["wait_ms"]
    assert got["overlap_ms"] == 0.0  # a blocking mix waits from its start: nothing overlapped
    zero = {"encode_ms": 0.0, "wait_ms": 0.0, "mix_ms": 0.0, "overlap_ms": 0.0}
    assert comm.take_breakdown() == zero
    # a started round: the time until `wait` is overlap, the rest waiting
    handle = comm.start_mix(x[0].unsqueeze(0), _ring4(), step=0, round=2)
    time.sleep(0.1)  # the training thread computes; the 50 ms round ends meanwhile
    handle.wait()
    got = comm.take_breakdown()
    assert got["overlap_ms"] >= 100 * 0.9
    assert got["wait_ms"] < got["overlap_ms"]


def test_a_peer_comm_shortens_the_gil_switch_interval() -> None:
    """The training thread gets the GIL back from the event loop within `SWITCH_INTERVAL`
    (Python's default is 5 ms); a shorter interval already set is kept."""
    before = sys.getswitchinterval()
    loop = asyncio.new_event_loop()
    transport: Any = None  # the constructor only keeps it
    try:
        sys.setswitchinterval(0.005)
        PeerComm(0, 2, transport, loop)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
        sys.setswitchinterval(SWITCH_INTERVAL / 2)
        PeerComm(0, 2, transport, loop)
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL / 2)
    finally:
        sys.setswitchinterval(before)
        loop.close()
