"""The asynchronous algorithms' wire (`concord.peer.async_wire`): messages round-trip, every bad
message is refused with a reason (never reaching a handler), and over a real gRPC server a bad
message ends its stream with a clear status and is counted, while good ones are answered."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import grpc
import pytest
import torch

from concord.errors import RejectedError
from concord.peer.async_wire import (
    ACK,
    HEADER,
    LAST,
    MAGIC,
    METHOD,
    REPLY,
    REQUEST,
    SHARE,
    AsyncServicer,
    Message,
    WireView,
    decode,
    encode,
    merge_progress,
    run_key,
)
from concord.peer.mailbox import Counters

KEY = run_key("run", "fingerprint")
VIEW = WireView(peer_id=0, world_size=4, dim=1000, key=KEY, chunk_bytes=1024)
# one-chunk tests; progress entries at most n·T = 4 · 25
WIDE = WireView(peer_id=0, world_size=4, dim=1000, key=KEY, chunk_bytes=8192, max_step=100)
SENDER = WireView(peer_id=1, world_size=4, dim=1000, key=KEY, chunk_bytes=1024)  # peer 1's view


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def _decode(chunks: list[bytes], view: WireView = VIEW) -> Message:
    return asyncio.run(decode(_chunks(chunks), view))


PROGRESS = (5, 17, 2**40, 0)


def test_messages_round_trip_in_chunks() -> None:
    values = torch.randn(1000)
    msg = Message(SHARE, 2, 17, 0.25, values, progress=PROGRESS, last=True)
    chunks = list(encode(msg, KEY, VIEW.chunk_bytes))
    assert len(chunks) == 4  # 38 + 32 header bytes + 4000 body bytes in 1024-byte chunks
    got = _decode(chunks)
    assert (got.kind, got.sender, got.step, got.weight) == (SHARE, 2, 17, 0.25)
    assert (got.progress, got.last) == (PROGRESS, True)
    assert got.values is not None
    assert torch.equal(got.values, values)
    empty = _decode(list(encode(Message(SHARE, 1, 17, progress=PROGRESS), KEY, 1024)))
    assert (empty.kind, empty.weight, empty.values, empty.last) == (SHARE, 0.0, None, False)
    ack = _decode(list(encode(Message(ACK, 3, 17, progress=PROGRESS), KEY, 1024)))
    assert ack.kind == ACK
    assert ack.values is None
    assert ack.progress == PROGRESS


def test_progress_vectors_merge_by_elementwise_max() -> None:
    ours = [3, 9, 0, 4]
    merge_progress(ours, (5, 2, 0, 4))
    assert ours == [5, 9, 0, 4]


def _header(**change: object) -> bytes:
    fields = {"magic": MAGIC, "kind": SHARE, "flags": 0, "sender": 1, "step": 3}
    fields |= {"weight": 0.5, "dim": 1000, "key": KEY, "peers": 4}
    progress = change.pop("progress", (1, 5, 3, 4))
    fields |= change
    assert isinstance(progress, tuple)
    return HEADER.pack(*fields.values()) + struct.pack(f"<{len(progress)}q", *progress)


BODY = torch.zeros(1000).numpy().tobytes()


@pytest.mark.parametrize(
    ("chunks", "reason", "words"),
    [
        ([], "invalid", "empty"),
        ([b"short"], "invalid", "no header"),
        ([_header(magic=b"XXXX") + BODY], "precondition", "version 2"),
        ([_header(magic=b"CAS1") + BODY], "precondition", "version 2"),
        ([_header(flags=2) + BODY], "invalid", "flags 0x02"),
        ([_header(peers=3, progress=(1, 2, 3)) + BODY], "invalid", "progress vector of 3"),
        ([_header(progress=(1, -2, 3, 4)) + BODY], "invalid", "negative"),
        # a forged vector: g ≈ 3.5e18 ≥ T would stop every peer it reaches
        ([_header(progress=(0, 2**63 - 1, 5, 2**62)) + BODY], "invalid", "progress[1] = 9223"),
        ([_header(progress=(0, 5, 101, 0)) + BODY], "invalid", "progress[2] = 101 from peer 1"),
        # kind 6: PROGRESS (body-less)
        ([_header(kind=6, dim=0, progress=(0, 0, 0, 101))], "invalid", "above n·T = 100"),
        # a data message of a step its sender has not reached (it counts its own steps)
        ([_header(step=3, progress=(9, 2, 9, 9)) + BODY], "invalid", "progress[1] = 2"),
        ([_header(kind=REQUEST, step=7, progress=(0, 6, 0, 0)) + BODY], "invalid", "step 7"),
        ([_header()[:60]], "invalid", "whole progress vector"),
        ([_header(key=b"\0" * 8) + BODY], "permission", "run key"),
        ([_header(kind=9) + BODY], "invalid", "kind 9"),
        ([_header(sender=0) + BODY], "invalid", "sender 0"),
        ([_header(sender=4) + BODY], "invalid", "sender 4"),
        ([_header(step=-1) + BODY], "invalid", "step -1"),
        ([_header(weight=float("nan")) + BODY], "invalid", "weight"),
        ([_header(dim=999) + BODY], "invalid", "999 values"),
        ([_header(dim=0)], "invalid", "0 values"),  # an empty share must weigh 0
        ([_header() + BODY[:-4]], "invalid", "3996 bytes"),
        ([_header() + BODY + b"\0\0\0\0"], "too-big", "longer"),
        ([_header() + torch.full((1000,), float("inf")).numpy().tobytes()], "invalid", "finite"),
    ],
)
def test_bad_messages_are_refused_with_a_reason(
    chunks: list[bytes], reason: str, words: str
) -> None:
    with pytest.raises(RejectedError) as exc:
        _decode(chunks, WIDE)
    assert exc.value.reason == reason
    assert words in str(exc.value)


def test_values_above_the_bound_are_refused() -> None:
    view = WireView(peer_id=0, world_size=4, dim=1000, key=KEY, chunk_bytes=1024, max_abs_value=1)
    big = Message(REQUEST, 1, 0, values=torch.full((1000,), 2.0), progress=PROGRESS)
    with pytest.raises(RejectedError, match="bound"):
        _decode(list(encode(big, KEY, 1024)), view)


def test_a_grpc_server_answers_good_messages_and_counts_bad_ones() -> None:
    async def main() -> None:
        counters = Counters()
        seen: list[Message] = []

        async def handler(msg: Message) -> Message:
            seen.append(msg)
            return Message(REPLY, 0, 5, values=torch.ones(1000), progress=PROGRESS)

        servicer = AsyncServicer(VIEW, counters, handler)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((servicer.generic_handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.stream_stream(METHOD)
                req = Message(REQUEST, 1, 4, values=torch.zeros(1000), progress=PROGRESS)
                good = encode(req, KEY, 1024)
                answer = await decode(call(_chunks(list(good))).__aiter__(), SENDER)
                assert answer.kind == REPLY
                assert answer.values is not None
                assert float(answer.values.sum()) == 1000.0
                assert answer.progress == PROGRESS
                bad = _header(sender=7) + BODY
                with pytest.raises(grpc.aio.AioRpcError) as exc:
                    async for _ in call(_chunks([bad[:1024], bad[1024:]])):
                        pass
                assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "sender 7" in str(exc.value.details())
        finally:
            await server.stop(None)
        assert [m.sender for m in seen] == [1]  # the bad one never reached the handler
        assert counters.rejected == {"async-invalid": 1}

    asyncio.run(main())


def test_header_layout_is_fixed() -> None:
    # the documented layout (docs/protocol.md): 4 + 1 + 1 + 2 + 8 + 8 + 4 + 8 + 2 bytes, then
    # n × 8 bytes of progress vector
    assert HEADER.size == 38
    assert struct.calcsize("<4sBBHqdI8sH") == HEADER.size
    assert MAGIC == b"CAS2"
    assert LAST == 1
