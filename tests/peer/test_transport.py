"""Two real `Transport`s over loopback gRPC in one event loop: a round's outcome says who
answered, who is missing (without waiting for a dead link) and who was rejected and why."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import structlog
import torch

from concord.core.comm import MixOutcome
from concord.peer import serde
from concord.peer.links import Fanout, Wire
from concord.peer.mailbox import Arrival
from concord.peer.transport import (
    WINDOW,
    WINDOW_SLACK,
    Fetched,
    Transport,
    TransportOptions,
    server_options,
)
from tests.peer.transports import free_port
from tests.peer.transports import options as transport_options

DIM = 300_000  # 1.2 MB of float32: two chunks of ≤ 1 MiB


def _pair(
    deadline: float,
    *,
    neighbours_of_1: Callable[[int], bool] = lambda s: True,
    wire: Wire = "raw",
    skip_after: int = 3,
) -> tuple[Transport, Transport]:
    addresses = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]

    def options(peer_id: int) -> TransportOptions:
        return transport_options(
            peer_id, 2, dim=DIM, deadline=deadline, wire=wire, skip_after=skip_after
        )

    t0 = Transport(options(0), addresses, lambda *a: True)
    t1 = Transport(options(1), addresses, lambda s, *a: neighbours_of_1(s))
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


def test_server_streams_get_a_receive_window_beyond_grpcs_default() -> None:
    """A chunk must not wait for a WINDOW_UPDATE every 64 KiB (gRPC's default with BDP probing
    off): each stream's window is `WINDOW` (a smaller chunk: the chunk) and room for a header
    (`WINDOW_SLACK`), never more — every connection may make a receiver buffer a window."""
    for chunk, window in ((16 << 10, 16 << 10), (1 << 20, WINDOW), (4 << 20, WINDOW)):
        options = dict(server_options(chunk, 60.0))
        assert options["grpc.http2.bdp_probe"] == 0
        assert options["grpc.http2.lookahead_bytes"] == window + WINDOW_SLACK
    assert WINDOW >= 4 * (64 << 10)  # 4× fewer WINDOW_UPDATEs than the default at least
    assert WINDOW_SLACK >= 1 << 10  # a chunk's header fits


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


async def _send_only(t: Transport, step: int, value: float, to: list[int]) -> None:
    frames = t.frames(
        step=step,
        round=step,
        tensor_id=0,
        codec="none",
        parts={"values": torch.full((DIM,), value)},
    )
    await t.round_(step=step, round=step, tensor_id=0, frames=frames, send_to=to, receive_from=[])


def test_a_neighbour_missing_skip_after_rounds_is_skipped_until_its_tensor_is_in_time() -> None:
    async def body() -> None:
        t0, t1 = _pair(deadline=0.5, skip_after=2)
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        try:
            assert await t0.connect([1], timeout=10) == []
            assert await t1.connect([0], timeout=10) == []
            with structlog.testing.capture_logs() as logs:
                for step in (0, 1):  # peer 1 is alive but silent: each round waits the deadline
                    start = time.monotonic()
                    _, outcome = await _round(t0, step, 1.0, [1])
                    assert outcome.missing == [[1]]
                    assert time.monotonic() - start >= 0.45
                assert t0.suspects == {1}
                assert t0.suspected == (1,)
                assert t0.counters.skipped == 1
                assert t0.counters.missed_deadlines == 2
                (skipped,) = [e for e in logs if e["event"] == "neighbour.skipped"]
                assert (skipped["neighbour"], skipped["missed"], skipped["step"]) == (1, 2, 1)
                # skipped: the round costs the grace, not the deadline; what peer 0 sends goes
                # out behind the round and still reaches peer 1
                start = time.monotonic()
                _, outcome = await _round(t0, 2, 5.0, [1])
                assert time.monotonic() - start < 0.3
                assert outcome.missing == [[1]]
                assert t0.counters.not_waited == 1
                assert t0.counters.missed_deadlines == 2

                def reached() -> int:  # peer 1 collects nothing: its budget refuses the 3rd
                    return t1.counters.received + sum(t1.counters.rejected.values())

                for _ in range(200):
                    if reached() == 3:
                        break
                    await asyncio.sleep(0.02)
                assert reached() == 3
                # a reconnect of a neighbour we still reach does not take it back
                await t1.links[0].close()
                assert await t1.connect([0], timeout=10) == []
                assert t0.suspects == {1}
                # its tensor for the round in progress is here in time: waited for again
                await _send_only(t1, 3, 7.0, [0])
                for _ in range(200):  # written is not yet filed: wait until it is here
                    if t0.counters.received == 1:
                        break
                    await asyncio.sleep(0.02)
                arrived, outcome = await _round(t0, 3, 1.0, [1])
                assert outcome.answered == [[1]]
                assert float(arrived[1].tensors()["values"][0]) == 7.0
                assert t0.suspects == set()
                assert t0.suspected == ()
                assert t0.counters.back == 1
                (back,) = [e for e in logs if e["event"] == "neighbour.back"]
                assert (back["neighbour"], back["why"], back["step"]) == (1, "tensor in time", 3)
            start = time.monotonic()
            _, outcome = await _round(t0, 4, 1.0, [1])  # silent again: the full deadline
            assert outcome.missing == [[1]]
            assert time.monotonic() - start >= 0.45
            assert t0.counters.missed_deadlines == 3
            assert t0.suspects == set()  # one miss of skip_after = 2
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_a_skipped_neighbour_that_comes_back_says_hello_and_is_taken_back_on_probation() -> None:
    async def body() -> None:
        t0, t1 = _pair(deadline=0.5, skip_after=2)
        await t0.start(t0.addresses[0])  # peer 1 is not there (killed)
        try:
            assert await t0.connect([1], timeout=0.5) == [1]
            for step in (0, 1):  # a dead link is not waited for, but its misses count
                _, outcome = await _round(t0, step, 1.0, [1])
                assert outcome.missing == [[1]]
            assert t0.suspects == {1}
            assert t0.counters.missed_deadlines == 0
            await t1.start(t1.addresses[1])  # peer 1 (re)starts and greets its neighbour
            with structlog.testing.capture_logs() as logs:
                assert await t1.connect([0], timeout=10) == []
            assert t0.suspects == set()
            assert t0.misses[1] == 1  # on probation: one more miss makes it suspect again
            (back,) = [e for e in logs if e["event"] == "neighbour.back"]
            assert (back["neighbour"], back["why"]) == (1, "hello")
            (_, o0), (_, o1) = await asyncio.gather(
                _round(t0, 2, 1.0, [1]), _round(t1, 2, 2.0, [0])
            )
            assert o0.answered == [[1]]  # in step again
            assert o1.answered == [[0]]
            assert t0.misses[1] == 0
            _, outcome = await _round(t0, 3, 1.0, [1])  # silent once: the deadline, not skipped
            assert outcome.missing == [[1]]
            assert t0.suspects == set()
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_skip_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="skip_after = 0"):
        _pair(deadline=1.0, skip_after=0)


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


async def _stubborn(released: asyncio.Event) -> None:
    """A task that ignores every cancellation until ``released`` (as a gRPC read can)."""
    while not released.is_set():
        try:
            await released.wait()
        except asyncio.CancelledError:
            continue


def test_stop_is_bounded_when_a_link_task_ignores_cancellation() -> None:
    """The hang seen in CI: a link's ack reader that swallows its cancellation (a gRPC read can).
    Awaiting it directly waited forever and swallowed `stop`'s own timeout; now the close gives
    it `_REAP_LIMIT` seconds, `stop` returns within grace + limit, and `stop_timed_out` tells the
    process to exit without waiting for the task left behind."""

    async def body() -> None:
        t0, _t1 = _pair(deadline=1.0)
        await t0.start(t0.addresses[0])
        await t0.connect([1], timeout=0.2)
        released = asyncio.Event()
        link = t0.links[1]
        link.reader = asyncio.create_task(_stubborn(released))
        await asyncio.sleep(0)
        start = time.monotonic()
        try:
            with structlog.testing.capture_logs() as logs:
                await t0.stop(0.1, limit=0.5)
        finally:
            released.set()  # whatever happens, the loop must be able to end
        assert 0.5 <= time.monotonic() - start < 3.0  # 0.6 s budget; was: never returned
        assert t0.stop_timed_out
        assert [e["stuck_in"] for e in logs if e["event"] == "transport.stop_timeout"] == [
            "close links"
        ]
        if t0.server is not None:
            await t0.server.stop(None)

    _run(body)


def test_a_link_close_leaves_a_task_that_ignores_cancellation_after_a_bounded_wait() -> None:
    async def body() -> None:
        t0, _t1 = _pair(deadline=1.0)
        link = t0.links[1]
        released = asyncio.Event()
        link.reader = task = asyncio.create_task(_stubborn(released))
        await asyncio.sleep(0)
        start = time.monotonic()
        try:
            with structlog.testing.capture_logs() as logs:
                await link.close()
        finally:
            released.set()
        assert time.monotonic() - start < 4.0  # _REAP_LIMIT (2 s) and no more
        assert link.reader is None
        assert not link.up
        assert [e["task"] for e in logs if e["event"] == "transport.task_left"] == ["acks-1"]
        await task

    _run(body)


def test_fetch_answers_at_the_next_step_boundary_with_a_copy_of_the_parameters() -> None:
    async def body() -> None:
        t0, t1 = _pair(deadline=1.0)
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        try:
            # not training: refused at once (a fresh run's neighbours start from scratch)
            start = time.monotonic()
            assert await t1.fetch(0, timeout=5.0) is None
            assert time.monotonic() - start < 2.0
            t0.training = True
            x = torch.arange(DIM, dtype=torch.float32)
            fetch = asyncio.create_task(t1.fetch(0, timeout=10.0))
            for _ in range(200):  # the Fetch waits for peer 0's next step boundary
                if t0.wanted:
                    break
                await asyncio.sleep(0.01)
            assert t0.wanted
            assert not fetch.done()
            await asyncio.to_thread(t0.fulfil, x, 41, 40)  # the training thread, between steps
            x.add_(1.0)  # training goes on: the answer is a copy
            got = await fetch
            assert got is not None
            assert (got.sender, got.step, got.round) == (0, 41, 40)
            assert torch.equal(got.x, torch.arange(DIM, dtype=torch.float32))
            assert not t0.wanted
            assert await t1.fetch_any([0], timeout=0.5) is None  # no boundary in time
            t0.stop_serving()
            assert await t1.fetch(0, timeout=5.0) is None
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_a_fetch_answer_carries_the_portable_state_and_only_what_the_caller_takes() -> None:
    async def body() -> None:
        t0, t1 = _pair(deadline=1.0)
        t1.fetch_state = frozenset({"momentum"})
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        t0.training = True

        async def ask(state: dict[str, torch.Tensor]) -> Fetched | None:
            fetch = asyncio.create_task(t1.fetch(0, timeout=10.0))
            for _ in range(200):
                if t0.wanted:
                    break
                await asyncio.sleep(0.01)
            await asyncio.to_thread(t0.fulfil, x, 7, 9, state)
            m.add_(1.0)  # training goes on: the answer holds a copy of the state too
            return await fetch

        try:
            x = torch.arange(DIM, dtype=torch.float32)
            m = torch.full((DIM,), 0.5)
            got = await ask({"momentum": m, "short": torch.zeros(3)})  # not [dim]: not sent
            assert got is not None
            assert torch.equal(got.x, x)
            assert list(got.state) == ["momentum"]
            assert torch.equal(got.state["momentum"], torch.full((DIM,), 0.5))
            assert await ask({}) is not None  # no state yet (before the first step): values
            # a part the caller's algorithm does not declare portable: the answer is refused
            with structlog.testing.capture_logs() as logs:
                got = await ask({"momentum": m, "tracker": torch.ones(DIM)})
            assert got is None
            (why,) = [e["why"] for e in logs if e["event"] == "fetch.none"]
            assert "'values' then some of ['momentum']" in why
            assert "tracker" in why
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_fetch_without_hello_on_the_connection_is_refused() -> None:
    async def body() -> None:
        import grpc

        from concord.protos import data_plane_pb2 as pb
        from concord.protos import data_plane_pb2_grpc as pb_grpc

        t0, _ = _pair(deadline=1.0)
        await t0.start(t0.addresses[0])
        t0.training = True
        try:
            async with grpc.aio.insecure_channel(t0.addresses[0]) as channel:
                call = pb_grpc.GossipStub(channel).Fetch(pb.FetchRequest(run_id="t", peer_id=1))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    async for _ in call:
                        pass
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "before Hello" in (err.value.details() or "")
            assert t0.counters.rejected == {"permission": 1}
            assert not t0.wanted  # refused before asking the training thread
        finally:
            await t0.stop(1.0)

    _run(body)


def test_a_second_round_of_the_same_step_ends_when_its_tensor_arrives() -> None:
    """Consensus control repeats rounds within a step: each round's wait ends with its tensor,
    not at the deadline (the wait also watches for tensors of later steps)."""

    async def body() -> None:
        t0, t1 = _pair(deadline=5.0)
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        try:
            assert await t0.connect([1], timeout=10) == []
            assert await t1.connect([0], timeout=10) == []

            async def rnd(t: Transport, r: int, others: list[int]) -> MixOutcome:
                frames = t.frames(
                    step=3, round=r, tensor_id=0, codec="none", parts={"values": torch.ones(DIM)}
                )
                _, outcome = await t.round_(
                    step=3, round=r, tensor_id=0, frames=frames, send_to=others,
                    receive_from=others,
                )  # fmt: skip
                return outcome

            for r in (7, 8, 9):
                start = time.monotonic()
                o0, o1 = await asyncio.gather(rnd(t0, r, [1]), rnd(t1, r, [0]))
                assert o0.answered == [[1]]
                assert o1.answered == [[0]]
                assert time.monotonic() - start < 2.5, r
        finally:
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)
