"""The gRPC data plane of one peer: an aio server (`concord.peer.servicer`) receiving tensors into a
mailbox (`concord.peer.mailbox`), the standard grpc.health.v1 service, and one channel with one
long-lived bidirectional stream per neighbour (`Link`) for sending: ``ExchangeRaw`` (raw chunks
behind identity serializers, the default) or the protobuf ``Exchange`` (``wire="protobuf"``).

Everything here runs on the peer's event loop and only moves bytes: the training thread packs its
tensor (`Transport.frames`: zero-copy for a single part), the loop cuts it into chunks as it
writes them (one ≤ 1 MiB copy each, shared by all neighbours receiving the tensor, so the first
chunk is on the wire before the last is built), copies incoming chunks into one buffer per tensor
and files it; all tensor arithmetic happens in the training thread (`concord.peer.comm.PeerComm`).
Failure is data: `Transport.round_` returns who answered, who is missing and who was rejected
(with the reason). A neighbour whose connection failed (refused, reset, timed out) is marked down
and not waited for; the next send to it reconnects, at most once per backoff interval (0.2 s
doubling to 5 s). A neighbour that merely refused one of our tensors is still alive and still
waited for. Deadlines are per tensor: writing a whole tensor, like waiting for one, ends at the
round's deadline; a miss is a missing neighbour in the outcome, never an exception.

Receive bounds (`server_options`, `concord.peer.servicer`, `concord.peer.mailbox`): gRPC refuses
messages above twice the chunk size and more than `MAX_STREAMS` concurrent streams per
connection; each sender may have `BUDGET_TENSORS` tensors' bytes in flight (received but not yet
collected by a round); each stream is closed after ``stream_idle_timeout`` seconds of silence;
the mailbox holds at most `PER_SENDER` early entries per sender and `PER_STEP` per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import grpc
import structlog
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from concord.core.comm import MixOutcome
from concord.peer import serde
from concord.peer.mailbox import Arrival, Counters, Mailbox, Rejection
from concord.peer.servicer import REJECTION_CODES, GossipServicer, Greetings
from concord.peer.validate import STEP_WINDOW, TENSOR_IDS, ReceiverView, tensor_bytes
from concord.protos import data_plane_pb2 as pb
from concord.protos import data_plane_pb2_grpc as pb_grpc

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
MAX_STREAMS = 8  # per connection: a neighbour needs its Hello and one Exchange stream
BUDGET_TENSORS = 2  # tensors' bytes in flight per sender
PER_SENDER = 16  # early mailbox entries per sender (tensors, rejections no round awaits yet)
PER_STEP = 256  # … and per step


def server_options(chunk_bytes: int, idle_timeout: float) -> list[tuple[str, int]]:
    """The server's gRPC options: `SERVER_OPTIONS` with the receive limit at twice the chunk size
    (a chunk somewhat over ``chunk_bytes`` still reaches the servicer, which refuses it with its
    reason and counts it; anything larger gRPC refuses itself), `MAX_STREAMS` concurrent streams
    per connection, and connections without any call closed after the idle timeout."""
    limit = min(MAX_MESSAGE, 2 * chunk_bytes + (64 << 10))  # + room for the header
    options = [(k, v) for k, v in SERVER_OPTIONS if k != "grpc.max_receive_message_length"]
    return [
        *options,
        ("grpc.max_receive_message_length", limit),
        ("grpc.max_concurrent_streams", MAX_STREAMS),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.max_connection_idle_ms", max(1000, int(idle_timeout * 1000))),
    ]


RAW_METHOD = "/concord.v1.Gossip/ExchangeRaw"
Wire = Literal["raw", "protobuf"]
log = structlog.get_logger("concord.peer.transport")
_STOP_LIMIT = 10.0  # seconds `Transport.stop` may take beyond its grace


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


class Link:
    """Our sending side towards one neighbour: channel, handshake, one ExchangeRaw (or Exchange)
    stream."""

    def __init__(self, transport: Transport, peer_id: int, address: str) -> None:
        self.t = transport
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
            if self.t.wire == "raw":
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
                peer=self.t.peer_id,
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
                peer=self.t.peer_id,
                neighbour=self.peer_id,
                error=repr(exc) if exc else "stream ended",
            )
        self.up = False
        if code is None and isinstance(exc, grpc.aio.AioRpcError):
            code = exc.code()
        self.alive = not isinstance(exc, TimeoutError) and (
            code in REJECTION_CODES or self._connected()
        )
        self.next_try = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, 5.0)

    async def send(self, fan: Fanout, key: tuple[int, int, int], timeout: float) -> bool:
        """Write every chunk of ``fan``, the whole tensor (a reconnect included) within
        ``timeout`` seconds; False when the link is refused, down, or fails now (then marked
        down)."""
        if self.refused is not None:
            return False
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        if not self.up and (
            time.monotonic() < self.next_try or not await self.connect(min(timeout, 2.0))
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
            self.t.counters.send_failures += 1
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
        levels: int = 16,
        chunk_bytes: int,
        max_tensor_bytes: int,
        deadline: float,
        is_neighbour: Callable[[int, int, int, int], bool],
        server_credentials: grpc.ServerCredentials | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
        wire: Wire = "raw",
        max_abs_value: float | None = None,
        stream_idle_timeout: float = 60.0,
        tensor_ids: frozenset[int] = TENSOR_IDS,
    ) -> None:
        """``wire``: how this peer sends ("raw": ExchangeRaw; "protobuf": Exchange); it receives
        both. ``max_abs_value`` / ``stream_idle_timeout``: ``network.*``; ``tensor_ids``: the
        tensor ids the run's algorithm sends (others are refused). With ``server_credentials``
        (mTLS) a client certificate must name the peer id its Hello and frames claim."""
        self.run_id, self.peer_id, self.world_size = run_id, peer_id, world_size
        self.addresses = list(addresses)
        self.fingerprint, self.dim, self.codec, self.ratio = fingerprint, dim, codec, ratio
        self.levels = levels  # qsgd's s: the dtype of its incoming level parts
        self.chunk_bytes, self.max_tensor_bytes = chunk_bytes, max_tensor_bytes
        self.deadline = deadline
        self.step_window = STEP_WINDOW  # how far ahead a neighbour's frame may be (steps)
        self.is_neighbour = is_neighbour
        self.server_credentials = server_credentials
        self.channel_credentials = channel_credentials
        self.wire: Wire = wire
        self.max_abs_value = max_abs_value
        self.idle_timeout = stream_idle_timeout
        self.tensor_ids = frozenset(tensor_ids)
        self.require_identity = server_credentials is not None
        codecs = frozenset({"none", codec})
        self.budget = BUDGET_TENSORS * max(1, tensor_bytes(dim, codecs, ratio, levels))
        self.mailbox = Mailbox(per_sender=PER_SENDER, per_step=max(PER_STEP, 4 * world_size))
        self.counters = Counters()
        self.greeted = Greetings(capacity=max(1024, 8 * world_size))
        self.rejections: dict[int, tuple[int, str]] = {}  # sender → (step, reason), latest
        self.hello = serde.hello_request(run_id, peer_id, fingerprint, codec)
        self.links: dict[int, Link] = {}
        self.set_addresses(dict(enumerate(self.addresses)))
        self._closing: set[asyncio.Future[None]] = set()
        self._stopping = ""  # the stage `stop` is in (drain, close links, server stop)
        self.server: grpc.aio.Server | None = None
        self.health: health.aio.HealthServicer | None = None
        self.port = 0

    def set_addresses(self, addresses: dict[int, str]) -> None:
        """Where to reach each peer (static config, or the orchestrator's schedule). A peer whose
        address changed gets a fresh link; an empty address means "not known (yet)"."""
        for j, address in addresses.items():
            if j == self.peer_id or not address:
                continue
            link = self.links.get(j)
            if link is None or link.address != address:
                if link is not None:
                    self._closing.add(asyncio.ensure_future(link.close()))
                self.links[j] = Link(self, j, address)

    def view(self) -> ReceiverView:
        return ReceiverView(
            run_id=self.run_id,
            peer_id=self.peer_id,
            fingerprint=self.fingerprint,
            dim=self.dim,
            codecs=frozenset({"none", self.codec}),
            ratio=self.ratio,
            levels=self.levels,
            chunk_bytes=self.chunk_bytes,
            max_tensor_bytes=self.max_tensor_bytes,
            current_step=self.mailbox.step,
            is_neighbour=self.is_neighbour,
            world_size=self.world_size,
            step_window=self.step_window,
            tensor_ids=self.tensor_ids,
            max_abs_value=self.max_abs_value,
        )

    async def start(self, listen: str) -> int:
        self.server = grpc.aio.server(options=server_options(self.chunk_bytes, self.idle_timeout))
        GossipServicer(self).add_to_server(self.server)
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
        unknown = [j for j in peers if j not in self.links]
        if unknown:
            raise ValueError(f"no address known for peer(s) {unknown}")
        ok = await asyncio.gather(
            *(self.links[j].connect(timeout, wait_for_ready=True) for j in peers)
        )
        return [j for j, good in zip(peers, ok, strict=True) if not good]

    def frames(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        codec: str,
        parts: dict[str, torch.Tensor],
        push_weight: float | None = None,
    ) -> serde.Outgoing:
        """Our tensor, ready to be chunked by `round_`. Call it from the training thread: packing
        several parts is a full copy, which must not run on the event loop. A single part is not
        copied: leave it unchanged until `round_` has returned."""
        return serde.Outgoing(
            run_id=self.run_id,
            sender=self.peer_id,
            step=step,
            round=round,
            tensor_id=tensor_id,
            codec=codec,
            dim=self.dim,
            parts=parts,
            chunk_bytes=self.chunk_bytes,
            push_weight=push_weight,
        )

    async def round_(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        frames: serde.Outgoing | None,
        send_to: Sequence[int],
        receive_from: Sequence[int],
    ) -> tuple[dict[int, Arrival], MixOutcome]:
        """Send ``frames`` (from `frames`; None when ``send_to`` is empty) to ``send_to``, all
        neighbours concurrently, and collect the tensors of
        ``receive_from`` within ``deadline`` seconds. Never raises for a slow, dead or bad
        neighbour: the outcome lists who answered, who is missing (timed out, or its link is
        down so it is not waited for) and who was rejected with what reason."""
        self.mailbox.advance(step)
        key = (step, round, tensor_id)
        targets = [self.links[j] for j in send_to if j in self.links]
        if targets and frames is None:
            raise ValueError("round_ needs frames to send to " + str(list(send_to)))
        sends = []
        if frames is not None and targets:
            fan = Fanout(frames, len(targets), self.wire)
            sends = [
                asyncio.create_task(link.send(fan, key, self.deadline), name=f"send-{link.peer_id}")
                for link in targets
            ]
        slots = {j: self.mailbox.slot((j, step, round, tensor_id)) for j in receive_from}
        loop = asyncio.get_running_loop()
        end = loop.time() + self.deadline
        await asyncio.gather(*sends)
        arrived: dict[int, Arrival] = {}
        missing: list[int] = []
        rejected: list[tuple[int, str]] = []
        for j, slot in slots.items():
            link = self.links.get(j)
            got: Arrival | Rejection | None = None
            if slot.done() and not slot.cancelled():
                got = slot.result()  # here already, even from a neighbour whose link is down
            elif link is not None and link.alive:
                # a live neighbour is waited for until the round's deadline, every round: not
                # waiting for a merely slow one would let this peer run ahead of it (and past
                # its STEP_WINDOW), desynchronising the gossip for good
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    got = await asyncio.wait_for(asyncio.shield(slot), max(0.0, end - loop.time()))
                if got is None:
                    self.counters.missed_deadlines += 1
            # collected (or given up): the slot's bytes are released, a later copy is late
            self.mailbox.take((j, step, round, tensor_id))
            if isinstance(got, Arrival):
                arrived[j] = got
            elif isinstance(got, Rejection):
                rejected.append((j, got.reason))
            else:
                missing.append(j)
        outcome = MixOutcome(answered=[sorted(arrived)], missing=[missing], rejected=[rejected])
        return arrived, outcome

    async def stop(self, grace: float, *, limit: float = _STOP_LIMIT) -> None:
        """Drain the outgoing links (``grace`` seconds), close them, stop the server. Bounded:
        a finished peer must exit even if a close never completes (seen once, not reproduced:
        a peer stuck here for minutes after its neighbours exited) — after ``grace + limit``
        seconds it logs what it gave up on and returns."""
        try:
            await asyncio.wait_for(self._stop(grace), grace + limit)
        except TimeoutError:
            log.warning(
                "transport.stop_timeout",
                waited=grace + limit,
                stuck_in=self._stopping,
                links=sorted(self.links),
            )

    async def _stop(self, grace: float) -> None:
        self._stopping = "health"  # named in the timeout's log line
        if self.health is not None:
            await self.health.enter_graceful_shutdown()
        self._stopping = "drain"
        await asyncio.gather(*(link.drain(grace) for link in self.links.values()))
        self._stopping = "close links"
        await asyncio.gather(*(link.close() for link in self.links.values()), *self._closing)
        self._stopping = "server stop"
        if self.server is not None:
            await self.server.stop(grace)
