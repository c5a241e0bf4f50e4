"""Identities and bounds of the data plane, over real gRPC on loopback: a stream is served only
after a Hello on its own connection and (mTLS) only for the id its certificate names; unexpected
tensor ids and values above ``max_abs_value`` are refused; a stalled tensor costs one deadline
(a missing neighbour), is closed as idle and gives its bytes back; 40 stalled streams stay
within the per-neighbour budget (RSS of a separate receiving process); a flood is capped."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
import torch

from concord.peer import serde
from concord.peer.certs import init_ca, issue_peer
from concord.peer.links import Fanout, Link
from concord.peer.tls import load_credentials
from concord.peer.transport import Transport, TransportOptions
from concord.protos import data_plane_pb2 as pb

DIM = 300_000  # 1.2 MB of float32: two chunks of 1 MiB
RAW = "/concord.v1.Gossip/ExchangeRaw"
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]  # never share a connection


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


def _transport(peer_id: int, addresses: list[str], **kw: Any) -> Transport:
    args: dict[str, Any] = {
        "run_id": "t",
        "peer_id": peer_id,
        "world_size": len(addresses),
        "fingerprint": "f" * 64,
        "dim": DIM,
        "codec": "none",
        "chunk_bytes": 1 << 20,
        "max_tensor_bytes": 1 << 26,
        "deadline": 5.0,
    }
    args.update(kw)
    return Transport(TransportOptions(**args), addresses, lambda *a: True)


def _messages(
    sender: int = 0,
    *,
    step: int = 0,
    round: int = 0,
    tensor_id: int = 0,
    values: torch.Tensor | None = None,
    dim: int = DIM,
) -> list[bytes]:
    out = serde.Outgoing(
        run_id="t",
        sender=sender,
        step=step,
        round=round,
        tensor_id=tensor_id,
        codec="none",
        dim=dim,
        parts={"values": torch.zeros(dim) if values is None else values},
        chunk_bytes=1 << 20,
    )
    return [out.raw(i) for i in range(out.count)]


async def _hello(channel: grpc.aio.Channel, peer_id: int) -> pb.HelloReply:
    hello = channel.unary_unary(
        "/concord.v1.Gossip/Hello",
        request_serializer=pb.HelloRequest.SerializeToString,
        response_deserializer=pb.HelloReply.FromString,
    )
    reply: pb.HelloReply = await hello(serde.hello_request("t", peer_id, "f" * 64, "none"))
    return reply


async def _send(channel: grpc.aio.Channel, messages: list[bytes]) -> list[pb.Ack] | grpc.RpcError:
    """Write ``messages`` one by one, then read the acks; the RPC's own status on refusal.

    Explicit writes, not a request iterator: when the server refuses the first frame while the
    iterator still writes the next, gRPC reports its *local* write failure (INTERNAL) instead of
    the server's status — a race the production sender handles the same way (`Link.send`)."""
    call = channel.stream_stream(RAW, response_deserializer=pb.Ack.FromString)(timeout=20)
    try:
        for m in messages:
            await call.write(m)
        await call.done_writing()
        return [ack async for ack in call]
    except (asyncio.InvalidStateError, grpc.aio.UsageError):
        code = await call.code()
        details = await call.details()
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)
    except grpc.aio.AioRpcError as exc:
        return exc


def _refused_with(exc: grpc.aio.AioRpcError, code: grpc.StatusCode, words: str = "") -> bool:
    """The refusal carries ``code`` and ``words``, or gRPC lost it to its own client-side write
    race: the server refused a tensor's first chunk while the client was writing the next, and
    the call ended locally with INTERNAL "Failed execute_batch" (rare; grpcio's client, not
    ours). The tests also check the server's counters, which name the reason either way."""
    if exc.code() == code:
        return words in (exc.details() or "")
    return exc.code() == grpc.StatusCode.INTERNAL and "execute_batch" in (
        exc.debug_error_string() or ""
    )


def test_frames_need_a_hello_on_their_own_connection() -> None:
    """Peer 0 greeted on connection A; the same claim on connection B, without its own Hello,
    is refused (before: any connection could send once id 0 had greeted anywhere)."""

    async def body() -> None:
        addresses = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
        t1 = _transport(1, addresses)
        await t1.start(addresses[1])
        a = grpc.aio.insecure_channel(addresses[1], options=OWN_CONNECTION)
        b = grpc.aio.insecure_channel(addresses[1], options=OWN_CONNECTION)
        try:
            assert (await _hello(a, 0)).accepted
            got = await _send(b, _messages(0, step=0, round=1))
            assert isinstance(got, grpc.aio.AioRpcError)
            assert _refused_with(
                got, grpc.StatusCode.PERMISSION_DENIED, "before Hello on this connection"
            ), got
            assert t1.counters.rejected == {"permission": 1}
            acks = await _send(a, _messages(0, step=0, round=1))  # A greeted: served
            assert isinstance(acks, list)
            assert [x.status for x in acks] == [pb.ACK_OK]
        finally:
            await asyncio.gather(a.close(), b.close())
            await t1.stop(1.0)

    _run(body)


def test_unexpected_tensor_ids_are_refused() -> None:
    async def body() -> None:
        addresses = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
        # an algorithm without per-edge messages: it takes gossip (0) and all-reduce (1) only
        t1 = _transport(1, addresses, tensor_ids=frozenset({0, 1}))
        await t1.start(addresses[1])
        ch = grpc.aio.insecure_channel(addresses[1], options=OWN_CONNECTION)
        try:
            assert (await _hello(ch, 0)).accepted
            for tensor_id, round, text in [
                (7, 1, "tensor id 7 is not expected"),  # outside the protocol's set
                (2, 1, "tensor id 2 is not expected"),  # per-edge: not this algorithm's
                (1, 3, "all-reduce tensor in round 3"),  # all-reduce runs in round 0 only
            ]:
                got = await _send(ch, _messages(0, round=round, tensor_id=tensor_id))
                assert isinstance(got, grpc.aio.AioRpcError), text
                assert _refused_with(got, grpc.StatusCode.PERMISSION_DENIED, text), got
            assert t1.counters.rejected == {"permission": 3}
            acks = await _send(ch, _messages(0, round=0, tensor_id=1))
            assert isinstance(acks, list)
            assert len(acks) == 1
        finally:
            await ch.close()
            await t1.stop(1.0)

    _run(body)


@pytest.mark.parametrize("bound", [None, 1e6])
def test_values_above_max_abs_value_are_refused(bound: float | None) -> None:
    """3e38 is finite (it passed before); with ``max_abs_value`` = 1e6 it is refused, 1e5 is
    not. Without a bound it still passes (the bound is optional)."""

    async def body() -> None:
        addresses = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
        t1 = _transport(1, addresses, max_abs_value=bound)
        await t1.start(addresses[1])
        ch = grpc.aio.insecure_channel(addresses[1], options=OWN_CONNECTION)
        try:
            assert (await _hello(ch, 0)).accepted
            huge = torch.zeros(DIM)
            huge[DIM - 5] = -3e38  # in the second chunk
            got = await _send(ch, _messages(0, round=1, values=huge))
            if bound is None:
                assert isinstance(got, list)
                assert len(got) == 1
                return
            assert isinstance(got, grpc.aio.AioRpcError)
            assert _refused_with(got, grpc.StatusCode.INVALID_ARGUMENT, "max_abs_value"), got
            assert t1.counters.rejected == {"invalid": 1}
            fine = torch.full((DIM,), 1e5)
            acks = await _send(ch, _messages(0, round=2, values=fine))
            assert isinstance(acks, list)
            assert len(acks) == 1
            assert t1.mailbox.held(0) == DIM * 4  # the filed tensor, until a round takes it
        finally:
            await ch.close()
            await t1.stop(1.0)

    _run(body)


def test_a_certificate_of_another_peer_cannot_claim_an_id(tmp_path: Path) -> None:
    """Under mTLS a client holding peer 2's valid certificate cannot greet or send as peer 0."""

    async def body() -> None:
        certs = tmp_path / "certs"
        init_ca(certs, run_id="t")
        for i in range(3):
            issue_peer(certs, i)
        template = [
            str(certs / "ca.crt"),
            str(certs / "peer-{id}.crt"),
            str(certs / "peer-{id}.key"),
        ]
        server, _ = load_credentials(*template, 1)
        _, as_two = load_credentials(*template, 2)
        _, as_zero = load_credentials(*template, 0)
        addresses = [f"127.0.0.1:{_free_port()}" for _ in range(3)]
        t1 = _transport(1, addresses, server_credentials=server)
        await t1.start(addresses[1])
        evil = grpc.aio.secure_channel(addresses[1], as_two, options=OWN_CONNECTION)
        good = grpc.aio.secure_channel(addresses[1], as_zero, options=OWN_CONNECTION)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _hello(evil, 0)  # peer 2's certificate, claiming peer 0
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "certificate names peer 2" in (info.value.details() or "")
            assert (await _hello(evil, 2)).accepted  # its own id is fine
            got = await _send(evil, _messages(0, round=1))  # frames claiming peer 0
            assert isinstance(got, grpc.aio.AioRpcError)
            assert _refused_with(
                got, grpc.StatusCode.PERMISSION_DENIED, "certificate names peer 2"
            ), got
            assert t1.counters.rejected == {"identity": 2}
            assert (await _hello(good, 0)).accepted  # the real peer 0 is served
            acks = await _send(good, _messages(0, round=1))
            assert isinstance(acks, list)
            assert len(acks) == 1
        finally:
            await asyncio.gather(evil.close(), good.close())
            await t1.stop(1.0)

    _run(body)


def test_a_stalled_tensor_is_a_missed_neighbour_then_closed_as_idle() -> None:
    """Peer 0 sends chunk 0 of 2 and stalls: peer 1's round ends at its deadline with peer 0
    missing (no exception); the idle timeout then ends the stream and frees its bytes."""

    async def body() -> None:
        addresses = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
        t0 = _transport(0, addresses)
        t1 = _transport(1, addresses, deadline=0.5, stream_idle_timeout=1.0)
        for t in (t0, t1):
            await t.start(t.addresses[t.peer_id])
        assert await t1.connect([0], timeout=10) == []  # peer 0 is alive: it is waited for
        ch = grpc.aio.insecure_channel(addresses[1], options=OWN_CONNECTION)
        try:
            assert (await _hello(ch, 0)).accepted
            call = ch.stream_stream(RAW, response_deserializer=pb.Ack.FromString)()
            await call.write(_messages(0, step=0, round=1)[0])  # chunk 0 of 2, then silence
            start = time.monotonic()
            arrived, outcome = await t1.round_(
                step=0, round=1, tensor_id=0, frames=None, send_to=[], receive_from=[0]
            )
            took = time.monotonic() - start
            assert arrived == {}
            assert outcome.missing == [[0]]
            assert 0.45 <= took < 2.0  # one deadline (0.5 s), not a chunk timeout per chunk
            assert t1.counters.missed_deadlines == 1
            assert t1.mailbox.held(0) == DIM * 4  # the half tensor still holds its bytes
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()  # no Ack ever comes: the stream ends as idle
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "idle" in (info.value.details() or "")
            assert t1.counters.rejected == {"idle": 1}
            assert t1.mailbox.held(0) == 0  # released with the stream
        finally:
            await ch.close()
            await asyncio.gather(t0.stop(1.0), t1.stop(1.0))

    _run(body)


def test_the_whole_tensor_shares_one_deadline() -> None:
    """A link whose writes take 0.3 s each sends a 10-chunk tensor: it gives up at the 1 s
    deadline (before: each chunk had its own 1 s, so the tensor took 3 s and "succeeded")."""

    class SlowCall:
        def __init__(self) -> None:
            self.written = 0

        async def write(self, message: object) -> None:
            await asyncio.sleep(0.3)
            self.written += 1

        async def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.OK

    async def body() -> None:
        t = _transport(0, ["127.0.0.1:1", "127.0.0.1:2"], deadline=1.0, chunk_bytes=1024)
        link = Link(t.dialer, 1, "127.0.0.1:2")
        link.call, link.up, link.alive = SlowCall(), True, True
        out = t.frames(step=0, round=0, tensor_id=0, codec="none", parts={"x": torch.zeros(2560)})
        assert out.count == 10
        start = time.monotonic()
        ok = await link.send(Fanout(out, 1, "raw"), (0, 0, 0), 1.0)
        assert not ok
        assert time.monotonic() - start < 1.5
        assert link.call is not None
        assert link.call.written <= 4
        assert t.counters.send_failures == 1

    _run(body)


def test_a_flood_from_one_neighbour_is_capped() -> None:
    """Peer 0 sends 12 tensors for rounds nobody collects yet: two fit its in-flight budget, the
    rest are refused with RESOURCE_EXHAUSTED and counted; once a round collects them, there is
    room again."""

    async def body() -> None:
        addresses = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
        t1 = _transport(1, addresses)
        await t1.start(addresses[1])
        ch = grpc.aio.insecure_channel(addresses[1], options=OWN_CONNECTION)
        try:
            assert (await _hello(ch, 0)).accepted
            results = [await _send(ch, _messages(0, round=r)) for r in range(1, 13)]
            accepted = [r for r in results if isinstance(r, list)]
            refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
            assert len(accepted) == 2
            assert len(refused) == 10
            # the server's counters are the record of why; a client may see its own write
            # race instead of the status (see `_send`), never a different refusal
            assert all(_refused_with(e, grpc.StatusCode.RESOURCE_EXHAUSTED) for e in refused)
            assert any("budget" in (e.details() or "") for e in refused)
            assert t1.counters.rejected == {"overload": 10}
            assert t1.mailbox.held(0) == 2 * DIM * 4
            assert len(t1.mailbox) == 2 + 10  # two tensors, ten rejections (bounded: caps)
            arrived, _ = await t1.round_(
                step=0, round=1, tensor_id=0, frames=None, send_to=[], receive_from=[0]
            )
            assert 0 in arrived
            assert t1.mailbox.held(0) == DIM * 4  # the collected tensor gave its bytes back
            again = await _send(ch, _messages(0, round=1))  # its round is over: late
            assert isinstance(again, list)
            assert again[0].status == pb.ACK_LATE
            fits = await _send(ch, _messages(0, step=1, round=1))
            assert isinstance(fits, list)
            assert fits[0].status == pb.ACK_OK
        finally:
            await ch.close()
            await t1.stop(1.0)

    _run(body)


# ------------------------------------------------------------------ RSS of a receiving process

RECEIVER = textwrap.dedent(
    """
    import asyncio, sys
    from concord.peer.memory import tune_malloc
    from concord.peer.transport import Transport, TransportOptions

    async def main():
        port, dim, budget = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
        addresses = ["127.0.0.1:1", f"127.0.0.1:{port}"]
        options = TransportOptions(run_id="t", peer_id=1, world_size=2, fingerprint="f" * 64,
                                   dim=dim, codec="none", chunk_bytes=1 << 20,
                                   max_tensor_bytes=1 << 30, deadline=5.0,
                                   stream_idle_timeout=60.0)
        t = Transport(options, addresses, lambda *a: True)
        if budget != "default":
            t.budget = int(budget)  # "unbounded": what the receiver did before the budget
        await t.start(addresses[1])
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        print(dict(t.counters.rejected), flush=True)
        await t.stop(0.5)

    tune_malloc()
    asyncio.run(main())
    """
)
RSS_DIM = 4 << 20  # 16 MiB float32 tensors, 16 chunks
STREAMS = 40


def _stall(budget: str) -> tuple[int, str]:
    """RSS growth (bytes) of a receiving process while 40 streams, each on its own connection
    after its own Hello as peer 0, send 8 of their tensor's 16 chunks and stall."""
    port = _free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, str(port), str(RSS_DIM), budget],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline().strip() == b"ready"
        rss = psutil.Process(proc.pid)
        before = rss.memory_info().rss
        messages = _messages(0, step=0, round=1, dim=RSS_DIM)[:8]

        async def stalled(channel: grpc.aio.Channel) -> None:
            assert (await _hello(channel, 0)).accepted
            call = channel.stream_stream(RAW, response_deserializer=pb.Ack.FromString)()
            try:
                for m in messages:
                    await asyncio.wait_for(call.write(m), 10)
                await asyncio.sleep(4)  # stalled, stream still open
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                pass  # refused
            except TimeoutError:
                pass

        async def main() -> int:
            channels = [
                grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OWN_CONNECTION)
                for _ in range(STREAMS)
            ]
            task = asyncio.gather(*(stalled(c) for c in channels))
            await asyncio.sleep(3)  # everything that will arrive has arrived
            peak = rss.memory_info().rss
            await task
            await asyncio.gather(*(c.close() for c in channels))
            return peak

        peak = asyncio.run(main())
        proc.stdin.close()
        out = proc.stdout.read().decode()  # log lines, then the rejection counts
        counts = next((line for line in out.splitlines() if line.startswith("{")), out)
        proc.wait(30)
        return peak - before, counts
    finally:
        proc.kill()


def test_forty_stalled_streams_stay_within_the_budget() -> None:
    """Bound: two tensors per neighbour (the budget; one neighbour here) + 50 MiB for gRPC's
    own per-connection buffers (each of the 40 connections receives up to a flow-control window
    before a refusal reaches its client) and allocator noise; measured ~40–62 MiB. With the
    budget lifted (as before) the same receiver grew by ~500 MiB, which this bound catches.
    Refusals: 37 streams beyond `STREAMS_PER_PEER` before any message is read, 1 stream whose
    tensor exceeds the byte budget; 2 tensors are being assembled (8 of 16 MiB each)."""
    growth, counts = _stall("default")
    tensor = RSS_DIM * 4
    assert growth < 2 * tensor + (50 << 20), (growth >> 20, counts)
    assert counts.strip() == "{'overload': 38}", counts
