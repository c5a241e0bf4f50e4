"""Two real `Transport`s over loopback gRPC in one event loop: a round's outcome says who
answered, who is missing (without waiting for a dead link) and who was rejected and why."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

import pytest
import structlog
import torch

from concord.core.comm import MixOutcome
from concord.peer import serde
from concord.peer.mailbox import Arrival
from concord.peer.transport import Fanout, Transport, Wire

DIM = 300_000  # 1.2 MB of float32: two chunks of ≤ 1 MiB


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pair(
    deadline: float,
    *,
    neighbours_of_1: Callable[[int], bool] = lambda s: True,
    wire: Wire = "raw",
) -> tuple[Transport, Transport]:
    addresses = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
    common = {
        "run_id": "t",
        "world_size": 2,
        "addresses": addresses,
        "fingerprint": "f" * 64,
        "dim": DIM,
        "codec": "none",
        "chunk_bytes": 1 << 20,
        "max_tensor_bytes": 1 << 26,
        "deadline": deadline,
        "wire": wire,
    }
    t0 = Transport(peer_id=0, is_neighbour=lambda *a: True, **common)  # type: ignore[arg-type]
    t1 = Transport(
        peer_id=1,
        is_neighbour=lambda s, *a: neighbours_of_1(s),
        **common,  # type: ignore[arg-type]
    )
    return t0, t1


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


async def _round(
    t: Transport, step: int, value: float, others: list[int]
) -> tuple[dict[int, Arrival], MixOutcome]:
    frames = t.frames(
        step=step,
        round=step,
        tensor_id=0,
        codec="none",
        parts={"values": torch.full((DIM,), value)},
    )
    return await t.round_(
        step=step, round=step, tensor_id=0, frames=frames, send_to=others, receive_from=others
    )


@pytest.mark.parametrize("wire", ["raw", "protobuf"])
def test_two_transports_exchange_and_early_tensors_wait(wire: Wire) -> None:
    async def body() -> None:
        t0, t1 = _pair(deadline=10.0, wire=wire)
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        try:
            assert await t0.connect([1], timeout=10) == []
            assert await t1.connect([0], timeout=10) == []
            (a0, o0), (a1, o1) = await asyncio.gather(
                _round(t0, 0, 1.0, [1]), _round(t1, 0, 2.0, [0])
            )
            assert o0.answered == [[1]]
            assert o1.answered == [[0]]
            assert o0.missing == [[]]
            assert o0.rejected == [[]]
            assert torch.equal(a0[1].tensors()["values"], torch.full((DIM,), 2.0))
            assert torch.equal(a1[0].tensors()["values"], torch.full((DIM,), 1.0))
            # peer 0 runs ahead: its step-1 tensor waits in peer 1's mailbox until peer 1 gets there
            send0 = asyncio.create_task(_round(t0, 1, 3.0, [1]))
            for _ in range(200):
                if t1.counters.received == 2:
                    break
                await asyncio.sleep(0.02)
            assert t1.counters.received == 2  # arrived while peer 1 was still in step 0
            a1, o1 = await _round(t1, 1, 4.0, [0])
            await send0
            assert o1.answered == [[0]]
            assert float(a1[0].tensors()["values"][0]) == 3.0
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_dead_neighbour_is_not_waited_for() -> None:
    async def body() -> None:
        t0, _t1 = _pair(deadline=5.0)
        await t0.start(t0.addresses[0])  # peer 1 never starts
        try:
            assert await t0.connect([1], timeout=0.5) == [1]
            start = time.monotonic()
            arrived, outcome = await _round(t0, 0, 1.0, [1])
            # the link is down (connection refused), so the round does not wait 5 s for it
            assert time.monotonic() - start < 2.5
            assert arrived == {}
            assert outcome.missing == [[1]]
            assert outcome.answered == [[]]
        finally:
            await t0.stop(1.0)

    _run(body)


def test_rejected_tensor_is_recorded_with_its_reason_without_waiting() -> None:
    async def body() -> None:
        # peer 1 does not count peer 0 as a neighbour (e.g. a stale schedule on peer 0)
        t0, t1 = _pair(deadline=8.0, neighbours_of_1=lambda s: False)
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        try:
            assert await t0.connect([1], timeout=10) == []
            assert await t1.connect([0], timeout=10) == []
            start = time.monotonic()
            (_, o0), (a1, o1) = await asyncio.gather(
                _round(t0, 0, 1.0, [1]), _round(t1, 0, 2.0, [0])
            )
            assert a1 == {}
            assert o1.missing == [[]]
            [(who, reason)] = o1.rejected[0]
            assert who == 0
            assert reason.startswith("PERMISSION_DENIED")
            assert "not a neighbour" in reason
            assert t1.counters.rejected == {"permission": 1}
            assert time.monotonic() - start < 6.0  # resolved by the rejection, not the deadline
            assert o0.answered == [[1]]  # peer 1's tensor still reached peer 0
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_a_silent_live_neighbour_costs_one_deadline_and_counts_as_missing() -> None:
    async def body() -> None:
        t0, t1 = _pair(deadline=0.5)
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        try:
            assert await t0.connect([1], timeout=10) == []
            assert await t1.connect([0], timeout=10) == []
            # peer 1 is alive but silent: the round waits the deadline, not longer
            start = time.monotonic()
            _, outcome = await _round(t0, 0, 1.0, [1])
            assert outcome.missing == [[1]]
            assert 0.45 <= time.monotonic() - start < 2.0
            # its tensor for the next round, sent before peer 0 gets there, is used
            frames = t1.frames(
                step=1, round=1, tensor_id=0, codec="none", parts={"values": torch.zeros(DIM)}
            )
            await t1.round_(
                step=1, round=1, tensor_id=0, frames=frames, send_to=[0], receive_from=[]
            )
            _, outcome = await _round(t0, 1, 1.0, [1])
            assert outcome.answered == [[1]]
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_a_fanout_builds_each_chunk_once_for_all_its_links() -> None:
    out = serde.Outgoing(
        run_id="r",
        sender=0,
        step=1,
        round=1,
        tensor_id=0,
        codec="none",
        dim=10,
        parts={"values": torch.arange(10, dtype=torch.float32)},
        chunk_bytes=16,
    )
    fan = Fanout(out, readers=2, wire="raw")
    first = [fan.message(k) for k in range(fan.count)]
    second = [fan.message(k) for k in range(fan.count)]
    assert all(a is b for a, b in zip(first, second, strict=True))  # shared, not rebuilt
    assert first == [out.raw(k) for k in range(out.count)]
    assert fan.message(0) is not first[0]  # dropped once both links took it
    frames = Fanout(out, readers=1, wire="protobuf")
    assert frames.message(1) == out.frame(1)


def test_stop_is_bounded_when_a_link_never_closes() -> None:
    """A finished peer must exit: a link whose close never returns costs grace + limit, then
    `stop` logs what it gave up on and returns."""

    async def body() -> None:
        t0, _t1 = _pair(deadline=1.0)
        await t0.start(t0.addresses[0])
        await t0.connect([1], timeout=0.2)
        never = asyncio.Event()

        async def stuck() -> None:
            await never.wait()

        link = t0.links[1]
        link.close = stuck  # type: ignore[method-assign]
        start = time.monotonic()
        with structlog.testing.capture_logs() as logs:
            await t0.stop(0.1, limit=0.5)
        assert 0.5 <= time.monotonic() - start < 5.0
        (line,) = [e for e in logs if e["event"] == "transport.stop_timeout"]
        assert line["stuck_in"] == "close links"
        never.set()
        if t0.server is not None:
            await t0.server.stop(None)

    _run(body)
