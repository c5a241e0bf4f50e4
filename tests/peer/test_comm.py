"""`PeerComm.mix` from the training thread: Σ_j W[i,j] x_j over the neighbours whose tensor
arrived, renormalised over what arrived (self always present); the outcome is passed through."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from core.comm import MixOutcome
from peer.comm import PeerComm
from peer.mailbox import Arrival
from peer.serde import PartSpec

D = 5


class FakeTransport:
    """Stands in for `peer.transport.Transport`: neighbours in ``values`` answer, others not."""

    deadline = 1.0

    def __init__(self, values: dict[int, torch.Tensor], rejected: Sequence[int] = ()) -> None:
        self.values = values
        self.rejected = list(rejected)
        self.sent_to: list[int] = []

    def frames(self, **_: Any) -> list[object]:
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
