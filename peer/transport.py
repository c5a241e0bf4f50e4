"""The gRPC data plane of one peer: an aio server receiving tensors into a mailbox, and one
long-lived bidirectional Exchange stream per neighbour for sending.

Everything here runs on the peer's event loop and only moves bytes: chunks are copied into one
buffer per tensor, validated, and handed to the training thread (`peer.comm.PeerComm`), which does
all tensor arithmetic. Failure is data: `round_` returns what arrived and who was missing or
rejected; a dead neighbour is marked down (and retried with backoff) instead of being waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from core.comm import MixOutcome
from peer import serde
from peer.validate import ReceiverView, RejectedError, check_frame, check_hello, check_values
from protos import data_plane_pb2 as pb
from protos import data_plane_pb2_grpc as pb_grpc

STATUS_OF: dict[str, grpc.StatusCode] = {  # the one place domain rejections become gRPC codes
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "permission": grpc.StatusCode.PERMISSION_DENIED,
    "too-big": grpc.StatusCode.RESOURCE_EXHAUSTED,
}
MAX_MESSAGE = 16 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_ping_strikes", 0),
]
log = structlog.get_logger("peer.transport")

Key = tuple[int, int, int, int]  # (sender, step, round, tensor id)


@dataclass
class Arrival:
    sender: int
    step: int
    round: int
    tensor_id: int
    codec: str
    parts: tuple[serde.PartSpec, ...]
    payload: bytearray

    def tensors(self) -> dict[str, torch.Tensor]:
        return serde.tensors_from_payload(self.payload, self.parts)


@dataclass
class Counters:
    received: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    late: int = 0
    send_failures: int = 0

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Mailbox:
    """Complete tensors waiting for the training thread, keyed by (sender, step, round, id)."""

    def __init__(self) -> None:
        self._futures: dict[Key, asyncio.Future[Arrival]] = {}
        self.step = 0

    def _future(self, key: Key) -> asyncio.Future[Arrival]:
        fut = self._futures.get(key)
        if fut is None:
            fut = self._futures[key] = asyncio.get_running_loop().create_future()
        return fut

    def deliver(self, arrival: Arrival) -> bool:
        """False when the tensor is late (its step is over here)."""
        if arrival.step < self.step:
            return False
        key = (arrival.sender, arrival.step, arrival.round, arrival.tensor_id)
        fut = self._future(key)
        if not fut.done():
            fut.set_result(arrival)
        return True

    def future(self, key: Key) -> asyncio.Future[Arrival]:
        return self._future(key)

    def advance(self, step: int) -> None:
        """Enter ``step``: tensors of earlier steps are dropped."""
        self.step = max(self.step, step)
        for key in [k for k in self._futures if k[1] < self.step]:
            fut = self._futures.pop(key)
            if not fut.done():
                fut.cancel()


@dataclass
class _Assembly:
    """One tensor being received on a stream (chunks of one stream arrive in order)."""

    head: serde.FrameInfo
    buf: bytearray
    next_index: int = 0
    received: int = 0

    def continues(self, f: serde.FrameInfo) -> bool:
        h = self.head
        return (f.step, f.round, f.tensor_id, f.chunk_count, f.byte_length) == (
            h.step,
            h.round,
            h.tensor_id,
            h.chunk_count,
            h.byte_length,
        ) and f.chunk_index == self.next_index


class GossipServicer(pb_grpc.GossipServicer):
    """Thin: decode, call the transport's checks, encode; rejections abort the stream."""

    def __init__(self, transport: Transport) -> None:
        self.t = transport

    async def Hello(
        self, request: pb.HelloRequest, context: grpc.aio.ServicerContext
    ) -> pb.HelloReply:
        hello = serde.hello_from_wire(request)
        try:
            check_hello(hello, self.t.view())
        except RejectedError as r:
            self.t.counters.reject(r.reason)
            log.warning(
                "hello.rejected", peer=self.t.peer_id, sender=hello.peer_id, reason=r.detail
            )
            return serde.hello_reply(False, r.detail, self.t.peer_id)
        self.t.greeted.add(hello.peer_id)
        return serde.hello_reply(True, "", self.t.peer_id)

    async def Exchange(
        self, request_iterator: AsyncIterator[pb.TensorFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Ack]:
        sender: int | None = None
        asm: _Assembly | None = None
        async for frame in request_iterator:
            info, body = serde.frame_from_wire(frame)
            try:
                if sender is None:
                    if info.sender not in self.t.greeted:
                        raise RejectedError(
                            "permission", f"peer {info.sender} sent frames before Hello"
                        )
                    sender = info.sender
                check_frame(info, len(body), self.t.view(), expected_sender=sender)
                if info.chunk_index == 0:
                    asm = _Assembly(info, bytearray(info.byte_length))
                elif asm is None or not asm.continues(info):
                    raise RejectedError("invalid", f"chunk {info.chunk_index} out of order")
                if info.chunk_offset != asm.received:
                    raise RejectedError(
                        "invalid",
                        f"chunk {info.chunk_index} at offset "
                        f"{info.chunk_offset}, expected {asm.received}",
                    )
                asm.buf[asm.received : asm.received + len(body)] = body
                asm.received += len(body)
                asm.next_index += 1
                head = asm.head
                if asm.next_index < head.chunk_count:
                    continue
                if asm.received != head.byte_length:
                    raise RejectedError("invalid", "chunks do not add up to the tensor's length")
                buf = asm.buf
                parts = head.parts or ()
                arrival = Arrival(
                    head.sender,
                    head.step,
                    head.round,
                    head.tensor_id,
                    head.codec or "none",
                    parts,
                    buf,
                )
                check_values(arrival.tensors(), parts)
                asm = None
                self.t.counters.received += 1
                late = not self.t.mailbox.deliver(arrival)
                if late:
                    self.t.counters.late += 1
                yield serde.ack(
                    self.t.peer_id,
                    head.step,
                    head.round,
                    head.tensor_id,
                    late=late,
                    reason="step already over" if late else "",
                )
            except RejectedError as r:
                self.t.counters.reject(r.reason)
                log.warning(
                    "frame.rejected",
                    peer=self.t.peer_id,
                    sender=info.sender,
                    step=info.step,
                    round=info.round,
                    code=STATUS_OF[r.reason].name,
                    reason=r.detail,
                )
                await context.abort(STATUS_OF[r.reason], r.detail)


class Link:
    """Our sending side towards one neighbour: channel, handshake, one Exchange stream."""

    def __init__(self, transport: Transport, peer_id: int, address: str) -> None:
        self.t = transport
        self.peer_id = peer_id
        self.address = address
        self.channel: grpc.aio.Channel | None = None
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.up = False
        self.next_try = 0.0
        self.backoff = 0.2
        self.refused: str | None = None  # the neighbour rejected our Hello (permanent)
        self.acks: dict[tuple[int, int, int], asyncio.Future[None]] = {}

    async def connect(self, timeout: float, *, wait_for_ready: bool = False) -> bool:
        """Handshake; ``wait_for_ready`` keeps trying until ``timeout`` (start-up barrier),
        otherwise a refused connection fails at once (reconnects of a dead neighbour)."""
        if self.up:
            return True
        await self.close()
        try:
            if self.t.channel_credentials is not None:
                self.channel = grpc.aio.secure_channel(
                    self.address, self.t.channel_credentials, options=CHANNEL_OPTIONS
                )
            else:
                self.channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            stub = pb_grpc.GossipStub(self.channel)
            reply = await stub.Hello(self.t.hello, timeout=timeout, wait_for_ready=wait_for_ready)
            if not reply.accepted:
                self.refused = reply.reason
                log.error(
                    "hello.refused",
                    peer=self.t.peer_id,
                    neighbour=self.peer_id,
                    reason=reply.reason,
                )
                return False
            self.call = stub.Exchange()
            self.reader = asyncio.create_task(self._read_acks(), name=f"acks-{self.peer_id}")
            self.up, self.backoff = True, 0.2
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
                peer=self.t.peer_id,
                neighbour=self.peer_id,
                code=exc.code().name,
                detail=exc.details(),
            )
        finally:
            self.up = False

    def _mark_down(self, exc: BaseException | None) -> None:
        if self.up or exc is not None:
            log.warning(
                "link.down",
                peer=self.t.peer_id,
                neighbour=self.peer_id,
                error=repr(exc) if exc else "stream ended",
            )
        self.up = False
        self.next_try = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, 5.0)

    async def send(
        self, frames: Sequence[pb.TensorFrame], key: tuple[int, int, int], timeout: float
    ) -> bool:
        if self.refused is not None:
            return False
        if not self.up and (
            time.monotonic() < self.next_try or not await self.connect(min(timeout, 2.0))
        ):
            return False
        for done in [k for k, f in self.acks.items() if f.done()]:
            del self.acks[done]
        self.acks[key] = asyncio.get_running_loop().create_future()
        try:
            for frame in frames:
                await asyncio.wait_for(self.call.write(frame), timeout)
            return True
        except (
            TimeoutError,
            grpc.aio.AioRpcError,
            asyncio.InvalidStateError,
            grpc.aio.UsageError,
        ) as exc:
            self.t.counters.send_failures += 1
            self._mark_down(exc)
            return False

    async def drain(self, timeout: float) -> None:
        pending = [f for f in self.acks.values() if not f.done()]
        if pending and self.up:
            await asyncio.wait(pending, timeout=timeout)

    async def close(self) -> None:
        if self.call is not None:
            with contextlib.suppress(Exception):
                await self.call.done_writing()
            self.call = None
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(BaseException):
                await self.reader
            self.reader = None
        if self.channel is not None:
            await self.channel.close()
            self.channel = None
        self.up = False


class Transport:
    def __init__(
        self,
        *,
        run_id: str,
        peer_id: int,
        world_size: int,
        addresses: Sequence[str],
        fingerprint: str,
        dim: int,
        codec: str,
        ratio: float = 0.01,
        chunk_bytes: int,
        max_tensor_bytes: int,
        deadline: float,
        is_neighbour: Callable[[int, int, int, int], bool],
        server_credentials: grpc.ServerCredentials | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self.run_id, self.peer_id, self.world_size = run_id, peer_id, world_size
        self.addresses = list(addresses)
        self.fingerprint, self.dim, self.codec, self.ratio = fingerprint, dim, codec, ratio
        self.chunk_bytes, self.max_tensor_bytes = chunk_bytes, max_tensor_bytes
        self.deadline = deadline
        self.is_neighbour = is_neighbour
        self.server_credentials = server_credentials
        self.channel_credentials = channel_credentials
        self.mailbox = Mailbox()
        self.counters = Counters()
        self.greeted: set[int] = set()
        self.hello = serde.hello_request(run_id, peer_id, fingerprint, codec)
        self.links = {j: Link(self, j, a) for j, a in enumerate(self.addresses) if j != peer_id}
        self.server: grpc.aio.Server | None = None
        self.health: health.aio.HealthServicer | None = None
        self.port = 0

    def view(self) -> ReceiverView:
        return ReceiverView(
            run_id=self.run_id,
            peer_id=self.peer_id,
            fingerprint=self.fingerprint,
            dim=self.dim,
            codecs=frozenset({"none", self.codec}),
            ratio=self.ratio,
            chunk_bytes=self.chunk_bytes,
            max_tensor_bytes=self.max_tensor_bytes,
            current_step=self.mailbox.step,
            is_neighbour=self.is_neighbour,
            world_size=self.world_size,
        )

    async def start(self, listen: str) -> int:
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_GossipServicer_to_server(GossipServicer(self), self.server)
        # the standard grpc.health.v1 service: "" and "concord.v1.Gossip" report SERVING
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for service in ("", "concord.v1.Gossip"):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.server_credentials is not None:
            self.port = self.server.add_secure_port(listen, self.server_credentials)
        else:
            self.port = self.server.add_insecure_port(listen)
        await self.server.start()
        return self.port

    async def connect(self, peers: Sequence[int], timeout: float) -> list[int]:
        """Handshake with ``peers`` (start-up barrier); returns those that did not answer."""
        ok = await asyncio.gather(
            *(self.links[j].connect(timeout, wait_for_ready=True) for j in peers)
        )
        return [j for j, good in zip(peers, ok, strict=True) if not good]

    async def round_(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        codec: str,
        parts: dict[str, torch.Tensor],
        send_to: Sequence[int],
        receive_from: Sequence[int],
    ) -> tuple[dict[int, Arrival], MixOutcome]:
        """Send our tensor to ``send_to`` and collect ``receive_from``'s, within the deadline."""
        self.mailbox.advance(step)
        frames = list(
            serde.frames(
                run_id=self.run_id,
                sender=self.peer_id,
                step=step,
                round=round,
                tensor_id=tensor_id,
                codec=codec,
                dim=self.dim,
                parts=parts,
                chunk_bytes=self.chunk_bytes,
            )
        )
        key = (step, round, tensor_id)
        sends = [
            asyncio.create_task(self.links[j].send(frames, key, self.deadline), name=f"send-{j}")
            for j in send_to
        ]
        futures = {j: self.mailbox.future((j, step, round, tensor_id)) for j in receive_from}
        loop = asyncio.get_running_loop()
        end = loop.time() + self.deadline
        await asyncio.gather(*sends)
        arrived: dict[int, Arrival] = {}
        missing: list[int] = []
        for j, fut in futures.items():
            link = self.links[j]
            # a neighbour we cannot reach is not waited for: we take its tensor if it is here
            if fut.done() and not fut.cancelled():
                arrived[j] = fut.result()
                continue
            if not link.up:
                missing.append(j)
                continue
            try:
                arrived[j] = await asyncio.wait_for(
                    asyncio.shield(fut), max(0.0, end - loop.time())
                )
            except (TimeoutError, asyncio.CancelledError):
                missing.append(j)
        outcome = MixOutcome(answered=[sorted(arrived)], missing=[missing], rejected=[[]])
        return arrived, outcome

    async def stop(self, grace: float) -> None:
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        await asyncio.gather(*(link.drain(grace) for link in self.links.values()))
        await asyncio.gather(*(link.close() for link in self.links.values()))
        if self.server is not None:
            await self.server.stop(grace)
