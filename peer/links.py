"""Our sending side towards each neighbour (`Link`): channel, handshake, one long-lived
``ExchangeRaw`` (or protobuf ``Exchange``) stream, reconnects with backoff, sends behind the rounds
to a suspect neighbour, bounded closes — and the chunks one outgoing tensor is cut into (`Fanout`,
shared by the links sending it; `Prebuilt`, for a send that outlives its round). The policy of
who is waited for, skipped and taken back is the transport's (`concord.peer.transport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, Literal

import grpc
import structlog

from concord.peer import serde
from concord.peer.mailbox import Counters
from concord.peer.servicer import REJECTION_CODES
from concord.protos import data_plane_pb2 as pb
from concord.protos import data_plane_pb2_grpc as pb_grpc

__all__ = [
    "CHANNEL_OPTIONS",
    "MAX_MESSAGE",
    "Dialer",
    "Fanout",
    "Link",
    "Prebuilt",
    "Wire",
    "bounded",
]

MAX_MESSAGE = 16 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # each channel its own subchannel: a fresh channel to a neighbour that came back must not
    # inherit the refused connection's reconnect backoff from gRPC's global subchannel pool
    ("grpc.use_local_subchannel_pool", 1),
]

RAW_METHOD = "/concord.v1.Gossip/ExchangeRaw"
Wire = Literal["raw", "protobuf"]
log = structlog.get_logger(__name__)
_REAP_LIMIT = 2.0  # seconds a cancelled link task (ack reader, send behind) gets to end


async def bounded(
    aw: asyncio.Future[Any] | Any, what: str, limit: float = _REAP_LIMIT, *, cancel: bool = False
) -> bool:
    """Wait at most ``limit`` seconds for ``aw`` (cancelled first with ``cancel``); True when it
    ended. Never awaits it directly: awaiting a task waits for as long as it ignores a
    cancellation (a gRPC call can), and `asyncio.wait_for` waits for the cancelled inner task
    too; `asyncio.wait` does neither — our own cancellation still raises here at once, and a
    task that will not end is logged and left behind."""
    task = asyncio.ensure_future(aw)
    if cancel:
        task.cancel()
    done, _ = await asyncio.wait({task}, timeout=limit)
    if not done:
        task.cancel()
        log.warning("transport.task_left", task=what, waited=limit)
        return False
    if not task.cancelled():
        task.exception()  # retrieved: asyncio does not log it at exit, and it is not ours
    return True


class Fanout:
    """The chunks of one outgoing tensor for ``readers`` links: chunk k is built (one copy) by the
    first link to reach it, shared with the others, and dropped once every link has taken it."""

    def __init__(self, out: serde.Outgoing, readers: int, wire: Wire) -> None:
        self.out = out
        self.count = out.count
        self.readers = readers
        self.raw = wire == "raw"
        self._built: dict[int, tuple[bytes | pb.TensorFrame, int]] = {}

    def message(self, index: int) -> bytes | pb.TensorFrame:
        got = self._built.pop(index, None)
        if got is None:
            msg = self.out.raw(index) if self.raw else self.out.frame(index)
            left = self.readers - 1
        else:
            msg, left = got[0], got[1] - 1
        if left > 0:
            self._built[index] = (msg, left)
        return msg


@dataclasses.dataclass(frozen=True)
class Dialer:
    """What all links of one peer share: its id, its Hello, how it sends (``wire``), its client
    credentials (mTLS) and the transport's counters (send failures)."""

    peer_id: int
    hello: pb.HelloRequest
    wire: Wire
    credentials: grpc.ChannelCredentials | None
    counters: Counters


class Prebuilt:
    """Every chunk of one outgoing tensor, built (copied) now: for a send that may outlive its
    round (`Link.send_behind`), when the training thread is free to change the tensor again."""

    def __init__(self, out: serde.Outgoing, wire: Wire) -> None:
        build = out.raw if wire == "raw" else out.frame
        self._messages: list[bytes | pb.TensorFrame] = [build(k) for k in range(out.count)]
        self.count = out.count

    def message(self, index: int) -> bytes | pb.TensorFrame:
        return self._messages[index]


class Link:
    """Our sending side towards one neighbour: channel, handshake, one ExchangeRaw (or Exchange)
    stream."""

    def __init__(self, dialer: Dialer, peer_id: int, address: str) -> None:
        self.d = dialer
        self.peer_id = peer_id
        self.address = address
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.up = False  # our Exchange stream to the neighbour is open
        # the neighbour answers at all: False after a connection failure (refused, reset, a
        # write timed out), still True when it merely refused one of our tensors (its stream
        # ended with a rejection status, or the HTTP/2 connection is still READY — a write racing
        # the abort can surface as INTERNAL). Rounds wait for its tensor only while this holds.
        self.alive = False
        self.next_try = 0.0
        self.backoff = 0.2
        self.refused: str | None = None  # the neighbour rejected our Hello (permanent)
        self.acks: dict[tuple[int, int, int], asyncio.Future[None]] = {}
        self.lock = asyncio.Lock()  # one tensor at a time on the stream (a send behind a round)
        self.behind: asyncio.Task[bool] | None = None  # the send to a suspect still in flight

    async def connect(self, timeout: float, *, wait_for_ready: bool = False) -> bool:
        """Handshake; ``wait_for_ready`` keeps trying until ``timeout`` (start-up barrier),
        otherwise a refused connection fails at once (reconnects of a dead neighbour)."""
        if self.up:
            return True
        await self.close()
        try:
            if self.d.credentials is not None:
                self.channel = grpc.aio.secure_channel(
                    self.address, self.d.credentials, options=CHANNEL_OPTIONS
                )
            else:
                self.channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            stub = pb_grpc.GossipStub(self.channel)
            reply = await stub.Hello(self.d.hello, timeout=timeout, wait_for_ready=wait_for_ready)
            if not reply.accepted:
                self.refused = reply.reason
                log.error(
                    "hello.refused",
                    peer=self.d.peer_id,
                    neighbour=self.peer_id,
                    reason=reply.reason,
                )
                return False
            if self.d.wire == "raw":
                self.call = self.channel.stream_stream(
                    RAW_METHOD, request_serializer=None, response_deserializer=pb.Ack.FromString
                )()
            else:
                self.call = stub.Exchange()
            self.reader = asyncio.create_task(self._read_acks(), name=f"acks-{self.peer_id}")
            self.up, self.alive, self.backoff = True, True, 0.2
            return True
        except (TimeoutError, grpc.aio.AioRpcError, OSError) as exc:
            self._mark_down(exc)
            return False

    async def _read_acks(self) -> None:
        try:
            async for ack in self.call:
                fut = self.acks.get((ack.step, ack.round, ack.tensor_id))
                if fut is not None and not fut.done():
                    fut.set_result(None)
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "link.closed",
                peer=self.d.peer_id,
                neighbour=self.peer_id,
                code=exc.code().name,
                detail=exc.details(),
            )
            self.alive = exc.code() in REJECTION_CODES or self._connected()
        finally:
            self.up = False

    def _connected(self) -> bool:
        """The channel's connection to the neighbour is up (whatever happened to one stream)."""
        return (
            self.channel is not None
            and self.channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY
        )

    def _mark_down(self, exc: BaseException | None, code: grpc.StatusCode | None = None) -> None:
        """Our stream is gone; ``code`` (or ``exc``'s) tells whether the neighbour is alive."""
        if self.up or exc is not None:
            log.warning(
                "link.down",
                peer=self.d.peer_id,
                neighbour=self.peer_id,
                error=repr(exc) if exc else "stream ended",
            )
        self.up = False
        if code is None and isinstance(exc, grpc.aio.AioRpcError):
            code = exc.code()
        self.alive = not isinstance(exc, TimeoutError) and (
            code in REJECTION_CODES or self._connected()
        )
        if self.alive:  # it refused one tensor: the next one may do (it fell behind, say)
            self.next_try = time.monotonic()
            return
        self.next_try = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, 5.0)

    def send_behind(self, chunks: Prebuilt, key: tuple[int, int, int], timeout: float) -> bool:
        """Send to a suspect neighbour without the round waiting for it; False (not sent) while
        the previous such send is still in flight — a stalled neighbour holds one tensor here,
        not one per round."""
        if self.behind is not None and not self.behind.done():
            return False
        self.behind = asyncio.create_task(
            self.send(chunks, key, timeout), name=f"send-behind-{self.peer_id}"
        )
        return True

    async def send(self, fan: Fanout | Prebuilt, key: tuple[int, int, int], timeout: float) -> bool:
        """Write every chunk of ``fan``, the whole tensor (a reconnect included) within
        ``timeout`` seconds; False when the link is refused, down, or fails now (then marked
        down), or a send behind an earlier round holds the stream until then."""
        if self.refused is not None:
            return False
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        try:
            async with asyncio.timeout_at(end):
                await self.lock.acquire()
        except TimeoutError:
            return False
        try:
            return await self._send(fan, key, end)
        finally:
            self.lock.release()

    async def _send(self, fan: Fanout | Prebuilt, key: tuple[int, int, int], end: float) -> bool:
        loop = asyncio.get_running_loop()
        if not self.up and (
            time.monotonic() < self.next_try
            or not await self.connect(min(max(0.0, end - loop.time()), 2.0))
        ):
            return False
        for done in [k for k, f in self.acks.items() if f.done()]:
            del self.acks[done]
        self.acks[key] = loop.create_future()
        try:
            async with asyncio.timeout_at(end):  # per tensor, not per chunk
                for index in range(fan.count):
                    await self.call.write(fan.message(index))
            return True
        except (
            TimeoutError,
            grpc.aio.AioRpcError,
            asyncio.InvalidStateError,
            grpc.aio.UsageError,
        ) as exc:
            self.d.counters.send_failures += 1
            code = None
            if isinstance(exc, asyncio.InvalidStateError | grpc.aio.UsageError):
                # the RPC already ended (e.g. the neighbour rejected a frame): its status says
                # whether the neighbour is alive
                with contextlib.suppress(Exception):
                    code = await asyncio.wait_for(self.call.code(), 1.0)
            self._mark_down(exc, code)
            return False

    async def drain(self, timeout: float) -> None:
        pending = [f for f in self.acks.values() if not f.done()]
        if pending and self.up:
            await asyncio.wait(pending, timeout=timeout)

    async def shutdown(self) -> None:
        """`close`, after ending a send still in flight behind the rounds."""
        if self.behind is not None:
            behind, self.behind = self.behind, None
            await bounded(behind, f"send-behind-{self.peer_id}", cancel=True)
        await self.close()

    async def close(self) -> None:
        # each wait is bounded (`_bounded`); `up` stays as it was until the end, as a concurrent
        # send must not reconnect on a link half closed
        if self.call is not None:
            await bounded(self.call.done_writing(), f"done-writing-{self.peer_id}")
            self.call = None
        if self.reader is not None:
            await bounded(self.reader, f"acks-{self.peer_id}", cancel=True)
            self.reader = None
        if self.channel is not None:
            await bounded(self.channel.close(), f"channel-{self.peer_id}")
            self.channel = None
        self.up = False
