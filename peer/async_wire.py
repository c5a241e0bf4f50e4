"""The wire of the asynchronous algorithms (``ad-psgd``, ``async-sgp``) between peer processes:
one extra RPC on the peer's gRPC server, ``/concord.v1.AsyncGossip/Push`` (docs/protocol.md
"Asynchronous messages").

``Push`` is a bidirectional stream of raw byte messages (identity serializers, no protobuf): the
sender writes one *message* — a fixed header followed by the model-sized float32 body, cut into
chunks of at most ``network.chunk_bytes`` — and half-closes; the receiver answers with one
message: an AD-PSGD *reply* (the passive peer's model, same layout) or a body-less *ack*
(``kind = ACK``; ``kind = CLOSED``: this peer does not average, its training has ended or not
begun). A body-less ``PROGRESS`` message carries only the progress vector (the start-up barrier
of ``async.budget = "global"``), answered by an ack once the receiver's training has begun; its
step field, and its ack's, hold the sender's barrier level (`AsyncPeer.barrier_level`).

Header, version 2 (little endian, `HEADER`): magic ``b"CAS2"``, kind (u8), flags (u8: bit 0
`LAST`, a share of the sender's last round; the other bits 0), sender (u16), step (i64: the
sender's local step the message belongs to), weight (f64: a push-sum w-share, 0 otherwise), dim
(u32: float32 values in the body), run key (8 bytes: the first bytes of sha256(run id, model
fingerprint) — a message of another run or model is refused), peers (u16: n), then the sender's
*progress vector*: n × i64, the latest local step count it knows of each peer (its own
included), merged by element-wise max (`merge_progress`; ``async.budget = "global"`` stops at
Σ / n ≥ T). Every message carries it, answers too. Version 1 (``b"CAS1"``: no flags, no
vector) is refused with FAILED_PRECONDITION.

Every message is checked before it is used (`check`): magic, kind, flags, run key, sender (a
peer of the run, not this one; with mTLS the one its client certificate names), the progress
vector (n entries, each in [0, n·T] — `WireView.max_step` —, and for a data message the
sender's own entry at least the message's step), dim (the model's), length (exactly dim
float32 values), finite values and weight. A bad message ends its stream with INVALID_ARGUMENT
(PERMISSION_DENIED for identity), is counted by reason (`Counters.rejected`, the peer summary's
``frames_rejected``) and never reaches the training thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import grpc
import torch

from concord.errors import RejectedError
from concord.peer.links import CHANNEL_OPTIONS
from concord.peer.mailbox import Counters
from concord.peer.tls import peer_id_of
from concord.protos.revocation import Revocations, fingerprint_pem

SERVICE = "concord.v1.AsyncGossip"
METHOD = f"/{SERVICE}/Push"
MAGIC = b"CAS2"
VERSION = 2
HEADER = struct.Struct("<4sBBHqdI8sH")  # then `HEADER.peers` × i64: the progress vector
LAST = 0x01  # flags: a share of the sender's last round (it sends no later one)
FLAGS = LAST

REQUEST = 1  # AD-PSGD: the active peer's model, answered by a REPLY
REPLY = 2  # AD-PSGD: the passive peer's model before it averaged
SHARE = 3  # async-sgp: a push-sum share (p_ji x_i, p_ji w_i), answered by an ACK; empty (no
# values, weight 0) from a peer holding its mass: the round is complete, nothing to mix
ACK = 4  # filed
CLOSED = 5  # not averaging any more (the receiver's training has ended, or not begun)
PROGRESS = 6  # only the progress vector (the global budget's start-up barrier), answered by ACK
KINDS = frozenset({REQUEST, REPLY, SHARE, ACK, CLOSED, PROGRESS})
BODYLESS = frozenset({ACK, CLOSED, PROGRESS})
DATA = frozenset({REQUEST, REPLY, SHARE})  # the sender's step: at most its own progress entry


def run_key(run_id: str, fingerprint: str) -> bytes:
    """The 8 bytes that tie a message to one run and model."""
    return hashlib.sha256(f"{run_id}\0{fingerprint}".encode()).digest()[:8]


@dataclass
class Message:
    """One decoded asynchronous message; ``values``: the float32 body ([dim], None when
    body-less)."""

    kind: int
    sender: int
    step: int
    weight: float = 0.0
    values: torch.Tensor | None = None
    progress: tuple[int, ...] = ()  # the sender's progress vector (n local step counts)
    last: bool = False  # a share of the sender's last round


def merge_progress(ours: list[int], theirs: tuple[int, ...]) -> None:
    """``ours`` ← element-wise max(``ours``, ``theirs``): steps only grow, so the merge is exact
    once news has crossed the graph."""
    for j, k in enumerate(theirs):
        if k > ours[j]:
            ours[j] = k


@dataclass(frozen=True)
class WireView:
    """What a receiver checks messages against."""

    peer_id: int
    world_size: int
    dim: int
    key: bytes
    chunk_bytes: int
    max_abs_value: float | None = None
    # the largest step count a progress vector may hold: n·T (`GlobalBudget.limit`: a peer's
    # own steps alone would make g ≥ T); None: unchecked
    max_step: int | None = None


def encode(msg: Message, key: bytes, chunk_bytes: int) -> Iterator[bytes]:
    """The chunks of ``msg``: the header with the first body bytes, then ≤ ``chunk_bytes`` each."""
    raw = b""
    if msg.values is not None:
        raw = msg.values.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    dim = len(raw) // 4
    flags = LAST if msg.last else 0
    head = HEADER.pack(
        MAGIC, msg.kind, flags, msg.sender, msg.step, msg.weight, dim, key, len(msg.progress)
    )
    head += struct.pack(f"<{len(msg.progress)}q", *msg.progress)
    first = max(0, chunk_bytes - len(head))
    yield head + raw[:first]
    for s in range(first, len(raw), chunk_bytes):
        yield raw[s : s + chunk_bytes]


async def decode(chunks: AsyncIterator[bytes], view: WireView) -> Message:
    """Assemble and check one message (module docstring); `RejectedError` when it is bad."""
    head: bytes | None = None
    body = bytearray()
    want = 0
    async for chunk in chunks:
        if head is None:
            if len(chunk) < HEADER.size:
                raise RejectedError("invalid", f"a message of {len(chunk)} bytes has no header")
            head, rest = chunk[: HEADER.size], chunk[HEADER.size :]
            msg, want = _header(head, view)
            msg.progress, rest = _progress(rest, view, msg)
            body += rest
        else:
            body += chunk
        if len(body) > want * 4 or len(chunk) > 2 * view.chunk_bytes:
            raise RejectedError("too-big", f"message longer than its {want} float32 values")
    if head is None:
        raise RejectedError("invalid", "an empty message stream")
    if len(body) != want * 4:
        raise RejectedError("invalid", f"message body of {len(body)} bytes; header says {want * 4}")
    if want:
        values = torch.frombuffer(body, dtype=torch.float32)
        finite = bool(values.isfinite().all())
        bound = view.max_abs_value
        if not finite or (bound is not None and float(values.abs().max()) > bound):
            raise RejectedError("invalid", "message values are not finite (or above the bound)")
        msg.values = values
    return msg


def _progress(rest: bytes, view: WireView, msg: Message) -> tuple[tuple[int, ...], bytes]:
    """The progress vector at the start of ``rest`` (the first chunk after the header) and
    what follows it: entries in [0, `WireView.max_step`], and a data message's sender at or
    past the step the message belongs to (it counts its own steps)."""
    size = 8 * view.world_size
    if len(rest) < size:
        raise RejectedError("invalid", "the first chunk does not hold the whole progress vector")
    progress = struct.unpack(f"<{view.world_size}q", rest[:size])
    who = f"from peer {msg.sender}"
    for j, k in enumerate(progress):
        if k < 0:
            raise RejectedError("invalid", f"progress[{j}] = {k} {who} is a negative step")
        if view.max_step is not None and k > view.max_step:
            raise RejectedError(
                "invalid", f"progress[{j}] = {k} {who} is above n·T = {view.max_step} steps"
            )
    if msg.kind in DATA and progress[msg.sender] < msg.step:
        raise RejectedError(
            "invalid",
            f"progress[{msg.sender}] = {progress[msg.sender]} {who} is below its message's "
            f"step {msg.step}",
        )
    return progress, rest[size:]


def _header(head: bytes, view: WireView) -> tuple[Message, int]:
    magic, kind, flags, sender, step, weight, dim, key, peers = HEADER.unpack(head)
    if magic != MAGIC:
        raise RejectedError(
            "precondition", f"not an asynchronous message of version {VERSION} ({magic!r})"
        )
    if flags & ~FLAGS:
        raise RejectedError("invalid", f"unknown flags {flags:#04x}")
    if key != view.key:
        raise RejectedError("permission", "message of another run or model (run key differs)")
    if kind not in KINDS:
        raise RejectedError("invalid", f"message kind {kind} is not one of {sorted(KINDS)}")
    if not 0 <= sender < view.world_size or sender == view.peer_id:
        raise RejectedError("invalid", f"sender {sender} is not another peer of the run")
    if step < 0 or not math.isfinite(weight) or weight < 0:
        raise RejectedError("invalid", f"step {step} / weight {weight} out of range")
    want = 0 if kind in BODYLESS or (kind == SHARE and dim == 0 and weight == 0) else view.dim
    if dim != want:
        raise RejectedError("invalid", f"message of {dim} values; kind {kind} has {want}")
    if peers != view.world_size:
        raise RejectedError(
            "invalid", f"progress vector of {peers} peers; the run has {view.world_size}"
        )
    return Message(kind, sender, step, weight, last=bool(flags & LAST)), want


_STATUS = {
    "permission": grpc.StatusCode.PERMISSION_DENIED,
    "identity": grpc.StatusCode.PERMISSION_DENIED,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "too-big": grpc.StatusCode.RESOURCE_EXHAUSTED,
}

Handler = Callable[[Message], Awaitable[Message]]


class AsyncServicer:
    """The server side of ``Push``: decode and check a message, hand it to ``handler`` (the
    algorithm's, on the event loop), send its answer back."""

    def __init__(
        self,
        view: WireView,
        counters: Counters,
        handler: Handler,
        *,
        require_identity: bool = False,
        revoked: Revocations | None = None,
    ) -> None:
        self.view, self.counters, self.handler = view, counters, handler
        self.require_identity, self.revoked = require_identity, revoked

    def generic_handler(self) -> grpc.GenericRpcHandler:
        method = grpc.stream_stream_rpc_method_handler(
            self.push, request_deserializer=None, response_serializer=None
        )
        return grpc.method_handlers_generic_handler(SERVICE, {"Push": method})

    async def push(
        self, chunks: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        try:
            msg = await decode(chunks, self.view)
            self._check_identity(msg.sender, context)
        except RejectedError as exc:
            self.counters.reject(f"async-{exc.reason}")
            await context.abort(_STATUS.get(exc.reason, grpc.StatusCode.INVALID_ARGUMENT), str(exc))
            return
        answer = await self.handler(msg)
        if not answer.progress:  # an answer before this peer knows any progress
            answer.progress = (0,) * self.view.world_size
        for chunk in encode(answer, self.view.key, self.view.chunk_bytes):
            yield chunk

    def _check_identity(self, claimed: int, context: grpc.aio.ServicerContext) -> None:
        if not self.require_identity:
            return
        auth = context.auth_context()
        if self.revoked is not None:
            for pem in auth.get("x509_pem_cert") or []:
                if fingerprint_pem(pem) in self.revoked:
                    raise RejectedError("identity", "Push from a revoked certificate")
        certified = peer_id_of(auth)
        if certified != claimed:
            raise RejectedError("identity", f"Push claims peer {claimed}; certificate: {certified}")


class Channels:
    """This peer's channels for ``Push``, one per neighbour, apart from the data plane's links
    (no Hello: the run key in every message stands in for it). A call that finds the neighbour
    unreachable (``UNAVAILABLE``) drops its channel: the next message dials afresh — not after
    the old channel's reconnect backoff (up to minutes) once a restarted neighbour is back — at
    most once per `REDIAL` seconds per neighbour. Nothing here awaits, so concurrent messages
    never close a channel under each other."""

    REDIAL = 0.2

    def __init__(self, credentials: grpc.ChannelCredentials | None) -> None:
        self.credentials = credentials
        self.open: dict[int, tuple[str, grpc.aio.Channel]] = {}
        self.dropped: dict[int, float] = {}  # neighbour → when its channel was dropped
        self.closing: set[asyncio.Task[None]] = set()

    def get(self, j: int, address: str) -> grpc.aio.Channel:
        held = self.open.get(j)
        if held is not None and held[0] == address:
            return held[1]
        if held is not None:
            self._close(held[1])
        if self.credentials is not None:
            channel = grpc.aio.secure_channel(address, self.credentials, options=CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.open[j] = (address, channel)
        return channel

    def unreachable(self, j: int, channel: grpc.aio.Channel) -> None:
        """A call on ``channel`` found ``j`` unreachable."""
        held = self.open.get(j)
        now = time.monotonic()
        if held is None or held[1] is not channel or now - self.dropped.get(j, 0.0) < self.REDIAL:
            return
        self.dropped[j] = now
        del self.open[j]
        self._close(channel)

    def _close(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.ensure_future(channel.close(grace=None))
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)

    async def close(self) -> None:
        """Close every channel (bounded: the peer is leaving)."""
        for _, channel in self.open.values():
            self._close(channel)
        self.open.clear()
        if self.closing:
            await asyncio.wait(set(self.closing), timeout=5.0)


async def push(
    channels: Channels, j: int, address: str, msg: Message, view: WireView, timeout: float
) -> Message | None:
    """Send ``msg`` to neighbour ``j`` (at ``address``) and return its answer; None when it
    could not be reached or did not answer within ``timeout`` seconds, or its answer was bad."""
    channel = channels.get(j, address)
    call = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)

    async def requests() -> AsyncIterator[bytes]:
        for chunk in encode(msg, view.key, view.chunk_bytes):
            yield chunk

    try:
        stream = call(requests(), timeout=timeout)
        return await asyncio.wait_for(decode(stream.__aiter__(), view), timeout)
    except (grpc.aio.AioRpcError, RejectedError, TimeoutError, asyncio.CancelledError) as exc:
        if isinstance(exc, asyncio.CancelledError) and _cancelling():
            raise
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE:
            channels.unreachable(j, channel)
        return None


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
