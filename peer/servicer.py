"""The gRPC servicer of the data plane: receives tensor frames, assembles, validates, files them.

Two methods, one receiving loop (`GossipServicer._serve`): ``Exchange`` (protobuf TensorFrames)
and ``ExchangeRaw`` (varint + FrameHeader + raw body, identity serializers; the framing is in
protos/data_plane.proto). Thin: decode with `concord.peer.serde`, check with the pure functions of
`concord.peer.validate` (the finiteness of each chunk as it lands,
`concord.peer.validate.FiniteScan`), copy each
body once into the tensor's buffer, file into the `concord.peer.mailbox.Mailbox`, encode an Ack.
`STATUS_OF` is the one place where a domain rejection becomes a gRPC status code; a rejected
frame (or a message that is no frame at all) ends its stream with that code and the reason, is
logged with sender and reason, counted, and — when it belongs to a round this peer is in or about
to enter — recorded in that round's outcome as *rejected*. Everyone else keeps being served.

Identity and bounds: a stream is served only for a peer id that greeted (``Hello``) on the same
connection (`Greetings`, keyed by ``context.peer()``), and under mTLS only for the id its client
certificate names (`concord.peer.tls.peer_id_of`; a Hello claiming another id is refused too).
Chunk 0 reserves the tensor's bytes against its sender's in-flight budget
(`concord.peer.mailbox.Mailbox.reserve`; over it: ``RESOURCE_EXHAUSTED``), a stream silent for
``idle_timeout`` seconds is ended (``DEADLINE_EXCEEDED``), and a half-received tensor's
reservation is released whenever its stream ends.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc
import numpy as np
import structlog
from google.protobuf.message import DecodeError

from concord.peer import serde
from concord.peer.mailbox import Arrival, Counters, Mailbox
from concord.peer.tls import peer_id_of
from concord.peer.validate import FiniteScan, ReceiverView, RejectedError, check_frame, check_hello
from concord.protos import data_plane_pb2 as pb
from concord.protos import data_plane_pb2_grpc as pb_grpc
from concord.protos.revocation import Revocations, fingerprint_pem


class Greetings:
    """Which peer ids greeted on which connection (``context.peer()``: the client's address and
    port, one HTTP/2 connection): a stream is served only for an id that said Hello on its own
    connection. Bounded: the oldest connections are forgotten beyond ``capacity``."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, set[int]] = OrderedDict()

    def add(self, connection: str, peer_id: int) -> None:
        ids = self._ids.pop(connection, set())
        ids.add(peer_id)
        self._ids[connection] = ids
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def greeted(self, connection: str, peer_id: int) -> bool:
        return peer_id in self._ids.get(connection, ())

    def ids(self, connection: str) -> frozenset[int]:
        return frozenset(self._ids.get(connection, ()))

    def __contains__(self, peer_id: object) -> bool:
        """``peer_id`` greeted on some connection."""
        return any(peer_id in ids for ids in self._ids.values())


class ServedPeer(Protocol):
    """What the servicers need of the peer they serve (`concord.peer.transport.Transport`)."""

    step_window: int
    mailbox: Mailbox
    counters: Counters
    greeted: Greetings
    rejections: dict[int, tuple[int, str]]
    budget: int  # bytes in flight per sender (`Mailbox.reserve`)

    # who may Fetch (`concord.peer.coordination.FetchPeers`: the run's graph); None: any peer
    may_fetch: Callable[[int], bool] | None

    @property
    def peer_id(self) -> int: ...

    @property
    def require_identity(self) -> bool:
        """mTLS: the client certificate must name the claimed peer id."""

    @property
    def idle_timeout(self) -> float:
        """Seconds a stream may stay silent."""

    @property
    def revocations(self) -> Revocations | None:
        """mTLS: `concord certs revoke`'s list."""

    def view(self) -> ReceiverView: ...


FETCH_BURST = 4  # Fetches a peer id may make at once …
FETCH_REFILL = 2.0  # … and one more every this many seconds


class FetchGate:
    """Who may Fetch, how often: a peer that is, was or will be a neighbour in the run's graph
    (``may_fetch``), at most `FETCH_BURST` at once and one per `FETCH_REFILL` seconds after that
    (a token bucket per peer id; a rejoining peer fetches once per neighbour). Refusals are
    counted in ``refused`` ("not-neighbour", "rate") and in the peer's rejection counters."""

    def __init__(self, *, burst: int = FETCH_BURST, refill: float = FETCH_REFILL) -> None:
        self.burst, self.refill = burst, refill
        self.tokens: dict[int, tuple[float, float]] = {}  # peer → (tokens, monotonic time)
        self.refused: dict[str, int] = {}

    def check(self, peer: int, may_fetch: Callable[[int], bool] | None, now: float) -> None:
        """`RejectedError` when ``peer`` may not Fetch now."""
        if may_fetch is not None and not may_fetch(peer):
            self.refused["not-neighbour"] = self.refused.get("not-neighbour", 0) + 1
            raise RejectedError(
                "permission", f"peer {peer} is not a neighbour of this peer in the run's graph"
            )
        tokens, then = self.tokens.get(peer, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) / self.refill)
        if tokens < 1.0:
            self.tokens[peer] = (tokens, now)
            self.refused["rate"] = self.refused.get("rate", 0) + 1
            raise RejectedError(
                "overload",
                f"peer {peer} fetches too often (at most {self.burst} at once, then one per "
                f"{self.refill:g} s)",
            )
        if len(self.tokens) > 4096:  # bounded: peer ids are checked against the run first
            self.tokens.clear()
        self.tokens[peer] = (tokens - 1.0, now)


STATUS_OF: dict[str, grpc.StatusCode] = {  # the one place domain rejections become gRPC codes
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "permission": grpc.StatusCode.PERMISSION_DENIED,
    "too-big": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "identity": grpc.StatusCode.PERMISSION_DENIED,
    "overload": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "idle": grpc.StatusCode.DEADLINE_EXCEEDED,
}
# codes of a receiver that is alive and refused something (DEADLINE_EXCEEDED is left out: a
# client sees it for its own timeouts too; a stream closed as idle rides on a READY connection)
REJECTION_CODES = frozenset(STATUS_OF.values()) - {grpc.StatusCode.DEADLINE_EXCEEDED}
# open Exchange streams per greeted peer id (a neighbour keeps one; a reconnect may overlap its
# old stream briefly): more are refused before their first message is read, so a flood of
# streams costs no message buffers
STREAMS_PER_PEER = 3
SERVICE = "concord.v1.Gossip"
_M = TypeVar("_M", pb.TensorFrame, bytes)
PROTOBUF_FRAME = "a concord.v1.TensorFrame"
RAW_FRAME = "a raw frame: varint header length, concord.v1.FrameHeader, body"

log = structlog.get_logger("concord.peer.servicer")


@dataclass
class _Assembly:
    """One tensor being received on a stream (chunks of one stream arrive in order)."""

    head: serde.FrameInfo
    buf: np.ndarray  # uninitialised; every byte is written before the tensor is filed
    view: memoryview
    scan: FiniteScan  # finiteness of the floating parts, checked chunk by chunk
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


class _Stream:
    """The receiving state of one Exchange stream: its connection and certified identity, its
    sender, the tensor being assembled (and the bytes it reserved)."""

    def __init__(self, transport: ServedPeer, connection: str, certified: int | None) -> None:
        self.t = transport
        self.connection = connection  # context.peer(): the HTTP/2 connection it rides on
        self.certified = certified  # the peer id of the client certificate (mTLS)
        self.sender: int | None = None  # set by the first frame that passes the checks
        self.asm: _Assembly | None = None
        self.reserved = 0  # bytes the tensor being assembled holds of the sender's budget

    def release(self) -> None:
        """The tensor being assembled is abandoned (rejected, or its stream ended)."""
        if self.reserved and self.sender is not None:
            self.t.mailbox.release(self.sender, self.reserved)
        self.reserved = 0
        self.asm = None

    def accept(self, info: serde.FrameInfo, body: bytes | memoryview) -> pb.Ack | None:
        """Check one chunk and copy its body into place; the Ack once the tensor is complete,
        validated and filed. Raises `RejectedError`."""
        t = self.t
        if self.sender is None:
            if t.require_identity and info.sender != self.certified:
                raise RejectedError(
                    "identity",
                    f"frames claim peer {info.sender}; the client certificate names "
                    f"{'no peer' if self.certified is None else f'peer {self.certified}'}",
                )
            if not t.greeted.greeted(self.connection, info.sender):
                raise RejectedError(
                    "permission",
                    f"peer {info.sender} sent frames before Hello on this connection",
                )
            self.sender = info.sender
        n = len(body)
        view = t.view()
        check_frame(info, n, view, expected_sender=self.sender)
        asm = self.asm
        if info.chunk_index == 0:
            if asm is not None:
                raise RejectedError(
                    "invalid", f"a new tensor before chunk {asm.next_index} of the last one"
                )
            if not t.mailbox.reserve(self.sender, info.byte_length, t.budget):
                raise RejectedError(
                    "overload",
                    f"peer {self.sender} already has {t.mailbox.held(self.sender)} bytes in "
                    f"flight here; a tensor of {info.byte_length} exceeds its budget of "
                    f"{t.budget}",
                )
            self.reserved = info.byte_length
            buf = np.empty(
                info.byte_length, dtype=np.uint8
            )  # no zero fill (see concord.peer.mailbox)
            parts = info.parts or ()  # check_frame rejected chunk 0 without a valid part table
            scan = FiniteScan(serde.tensors_from_payload(buf, parts), parts, view.max_abs_value)
            asm = self.asm = _Assembly(info, buf, buf.data, scan)
        elif asm is None or not asm.continues(info):
            raise RejectedError("invalid", f"chunk {info.chunk_index} out of order")
        if info.chunk_offset != asm.received:
            raise RejectedError(
                "invalid",
                f"chunk {info.chunk_index} at offset {info.chunk_offset}, expected {asm.received}",
            )
        asm.view[asm.received : asm.received + n] = body  # the one copy on this side
        asm.received += n
        asm.next_index += 1
        asm.scan.advance(asm.received)  # while the chunk is in cache (= check_values when done)
        head = asm.head
        if asm.next_index < head.chunk_count:
            return None
        if asm.received != head.byte_length:
            raise RejectedError("invalid", "chunks do not add up to the tensor's length")
        self.asm = None
        reserved, self.reserved = self.reserved, 0  # now held by the mailbox slot
        arrival = Arrival(
            head.sender,
            head.step,
            head.round,
            head.tensor_id,
            head.codec or "none",
            head.parts or (),
            asm.buf,
            head.push_weight,
        )
        t.counters.received += 1
        late = not t.mailbox.deliver(arrival, reserved)  # "overload" when the caps are reached
        if late:
            t.counters.late += 1
        return serde.ack(
            t.peer_id,
            head.step,
            head.round,
            head.tensor_id,
            late=late,
            reason="step already over" if late else "",
        )


class GossipServicer(pb_grpc.GossipServicer):
    """Thin: decode, call the transport's checks, encode; rejections abort the stream."""

    def __init__(self, transport: ServedPeer) -> None:
        self.t = transport
        self.open: dict[int, int] = {}  # greeted peer id → its open Exchange streams
        # called with the peer id of every accepted Hello (the transport takes a skipped
        # neighbour back when it reaches us again, `concord.peer.transport.Transport.greeted_by`)
        self.on_hello: Callable[[int], None] | None = None
        # called with (sender, step, round) of a frame refused as too far ahead (this peer fell
        # behind: `concord.peer.transport.Transport.saw_ahead`)
        self.on_ahead: Callable[[int, int, int], None] | None = None
        # this peer's parameters at its next step boundary, for a Fetch (None: not training;
        # `concord.peer.transport.Transport.snapshot`)
        self.snapshot: Callable[[], Awaitable[serde.Outgoing | None]] | None = None
        self.fetches = FetchGate()

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register Hello, Exchange (protobuf frames) and ExchangeRaw (raw frames, no protobuf
        on the bodies: request bytes go to the handler untouched)."""
        pb_grpc.add_GossipServicer_to_server(self, server)
        raw = {
            "ExchangeRaw": grpc.stream_stream_rpc_method_handler(
                self.ExchangeRaw,
                request_deserializer=None,
                response_serializer=pb.Ack.SerializeToString,
            )
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, raw),))
        server.add_registered_method_handlers(SERVICE, raw)

    def _check_certified(self, rpc: str, claimed: int, context: grpc.aio.ServicerContext) -> None:
        """With mTLS, the peer id an RPC claims must be the one its client certificate names;
        `RejectedError` ("identity") otherwise."""
        if not self.t.require_identity:
            return
        auth = context.auth_context()
        revoked = self.t.revocations
        if revoked is not None:
            for pem in auth.get("x509_pem_cert") or []:
                if fingerprint_pem(pem) in revoked:
                    raise RejectedError(
                        "identity",
                        f"{rpc} from a revoked certificate (the run's revoked.txt, "
                        "`concord certs revoke`)",
                    )
        certified = peer_id_of(auth)
        if certified != claimed:
            raise RejectedError(
                "identity",
                f"{rpc} claims peer {claimed}; the client certificate names "
                f"{'no peer' if certified is None else f'peer {certified}'}",
            )

    async def Hello(  # noqa: N802 - the RPC name of the .proto
        self, request: pb.HelloRequest, context: grpc.aio.ServicerContext
    ) -> pb.HelloReply:
        hello = serde.hello_from_wire(request)
        try:
            check_hello(hello, self.t.view())
            self._check_certified("Hello", hello.peer_id, context)
        except RejectedError as r:
            self.t.counters.reject(r.reason)
            log.warning(
                "hello.rejected",
                peer=self.t.peer_id,
                sender=hello.peer_id,
                remote=context.peer(),
                reason=r.detail,
            )
            if r.reason == "identity":  # impersonation: a status, not just a polite reply
                await context.abort(STATUS_OF[r.reason], r.detail)
            return serde.hello_reply(False, r.detail, self.t.peer_id)
        self.t.greeted.add(context.peer(), hello.peer_id)
        if self.on_hello is not None:
            self.on_hello(hello.peer_id)
        return serde.hello_reply(True, "", self.t.peer_id)

    async def Fetch(  # noqa: N802 - the RPC name of the .proto
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TensorFrame]:
        """This peer's parameters for a neighbour that (re)joins: only for a peer of this run
        that said Hello on this connection (and, with mTLS, the one its certificate names), is,
        was or will be a neighbour in the run's graph, and does not fetch too often
        (`FetchGate`); taken at the next step boundary by the training thread, never mid-step."""
        connection = context.peer()
        before = sum(self.fetches.refused.values())
        try:
            if request.run_id != self.t.view().run_id:
                raise RejectedError("permission", f"run {request.run_id!r} is not this run")
            if not self.t.greeted.greeted(connection, request.peer_id):
                raise RejectedError(
                    "permission", f"peer {request.peer_id} fetches before Hello on this connection"
                )
            self._check_certified("Fetch", request.peer_id, context)
            self.fetches.check(request.peer_id, self.t.may_fetch, time.monotonic())
        except RejectedError as r:
            # the graph's and the rate limit's refusals under their own names (frames_rejected)
            gated = sum(self.fetches.refused.values()) > before
            kind = "fetch-not-neighbour" if r.reason == "permission" else "fetch-rate"
            self.t.counters.reject(kind if gated else r.reason)
            log.warning(
                "fetch.rejected",
                peer=self.t.peer_id,
                sender=request.peer_id,
                remote=connection,
                reason=r.detail,
            )
            await context.abort(STATUS_OF[r.reason], r.detail)
            return
        out = await self.snapshot() if self.snapshot is not None else None
        if out is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not training")
            return
        log.info("fetch.served", peer=self.t.peer_id, to=request.peer_id, step=out.step)
        for index in range(out.count):
            yield out.frame(index)

    async def Exchange(  # noqa: N802 - the RPC name of the .proto
        self, request_iterator: AsyncIterator[pb.TensorFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Ack]:
        # an async generator function itself: grpc.aio picks the streaming handler by that
        async for ack in self._serve(
            request_iterator, context, serde.frame_from_wire, PROTOBUF_FRAME
        ):
            yield ack

    async def ExchangeRaw(  # noqa: N802 - the RPC name of the wire contract
        self, request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Ack]:
        async for ack in self._serve(
            request_iterator, context, serde.raw_frame_from_wire, RAW_FRAME
        ):
            yield ack

    async def _serve(
        self,
        messages: AsyncIterator[_M],
        context: grpc.aio.ServicerContext,
        decode: Callable[[_M], tuple[serde.FrameInfo, bytes | memoryview]],
        what: str,
    ) -> AsyncIterator[pb.Ack]:
        """The receiving loop of both methods; ``decode`` turns one message into header and body,
        ``what`` names the expected message in the rejection of one that does not decode."""
        connection = context.peer()
        ids = self.t.greeted.ids(connection)
        # (a stream on a connection without Hello is refused by its first frame, `_Stream`)
        if any(self.open.get(j, 0) >= STREAMS_PER_PEER for j in ids):
            # refused before a message is read: the client may see its write fail (INTERNAL)
            # before it sees this status
            detail = f"peer {min(ids)} already has {STREAMS_PER_PEER} open streams here"
            self.t.counters.reject("overload")
            log.warning(
                "frame.rejected",
                peer=self.t.peer_id,
                sender=min(ids),
                remote=connection,
                code=STATUS_OF["overload"].name,
                reason=detail,
            )
            await context.abort(STATUS_OF["overload"], detail)
            return
        for j in ids:
            self.open[j] = self.open.get(j, 0) + 1
        certified = peer_id_of(context.auth_context()) if self.t.require_identity else None
        stream = _Stream(self.t, connection, certified)
        try:
            async for ack in self._loop(stream, messages, context, decode, what):
                yield ack
        finally:
            stream.release()  # a half-received tensor gives its bytes back, however it ended
            for j in ids:
                left = self.open.get(j, 0) - 1
                if left > 0:
                    self.open[j] = left
                else:
                    self.open.pop(j, None)

    async def _loop(
        self,
        stream: _Stream,
        messages: AsyncIterator[_M],
        context: grpc.aio.ServicerContext,
        decode: Callable[[_M], tuple[serde.FrameInfo, bytes | memoryview]],
        what: str,
    ) -> AsyncIterator[pb.Ack]:
        incoming = aiter(messages)
        while True:
            try:
                async with asyncio.timeout(self.t.idle_timeout):
                    message = await anext(incoming)  # (a protobuf frame is parsed here)
                info, body = decode(message)
            except StopAsyncIteration:
                return
            except TimeoutError:
                await self._idle(stream, context)  # raises: the RPC ends
                return
            except (DecodeError, serde.MalformedFrameError) as exc:  # not a frame at all
                self.t.counters.reject("invalid")
                detail = f"malformed frame (not {what}): {exc}"
                log.warning(
                    "frame.rejected",
                    peer=self.t.peer_id,
                    sender=stream.sender,  # None when no frame of this stream decoded yet
                    remote=context.peer(),
                    code=STATUS_OF["invalid"].name,
                    reason=detail,
                )
                await context.abort(STATUS_OF["invalid"], detail)  # raises: the RPC ends
                return
            del message
            try:
                ack = stream.accept(info, body)
            except RejectedError as r:
                stream.release()
                await self._reject(r, info, stream.sender, context)  # raises: the RPC ends
                return
            del body  # a raw body is a view of its whole message: let it go before the next
            if ack is not None:
                yield ack

    async def _idle(self, stream: _Stream, context: grpc.aio.ServicerContext) -> None:
        """End a stream silent for ``idle_timeout`` seconds (a stalled tensor gives its bytes
        back); logged, counted, the sender reconnects when it has something to send."""
        detail = f"stream idle for {self.t.idle_timeout:g} s" + (
            f" in chunk {stream.asm.next_index} of a tensor" if stream.asm is not None else ""
        )
        stream.release()
        self.t.counters.reject("idle")
        log.warning(
            "frame.rejected",
            peer=self.t.peer_id,
            sender=stream.sender,
            remote=context.peer(),
            code=STATUS_OF["idle"].name,
            reason=detail,
        )
        await context.abort(STATUS_OF["idle"], detail)

    async def _reject(
        self,
        r: RejectedError,
        info: serde.FrameInfo,
        sender: int | None,
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Log, count and record a rejected frame, then end its stream with the status code
        (`context.abort` raises)."""
        self.t.counters.reject(r.reason)
        if sender is not None:
            self.t.rejections[sender] = (info.step, f"{r.reason}: {r.detail}")
        log.warning(
            "frame.rejected",
            peer=self.t.peer_id,
            sender=info.sender,
            step=info.step,
            round=info.round,
            code=STATUS_OF[r.reason].name,
            reason=r.detail,
        )
        horizon = self.t.mailbox.step + self.t.step_window
        ahead = r.reason == "precondition" and info.step > horizon  # (not some other check)
        if self.on_ahead is not None and sender is not None and ahead:
            self.on_ahead(sender, info.step, info.round)
        if sender is not None and info.sender == sender:
            # the round waiting for this tensor records it as rejected, not missing
            self.t.mailbox.reject(
                (sender, info.step, info.round, info.tensor_id),
                f"{STATUS_OF[r.reason].name}: {r.detail}",
                horizon=horizon,
            )
        await context.abort(STATUS_OF[r.reason], r.detail)
