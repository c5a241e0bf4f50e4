"""The gRPC servicer of the data plane: receives tensor frames, assembles, validates, files them.

Thin: decode with `peer.serde`, check with the pure functions of `peer.validate`, file into the
`peer.mailbox.Mailbox`, encode an Ack. `STATUS_OF` is the one place where a domain rejection
becomes a gRPC status code; a rejected frame ends its stream with that code and the reason, is
logged with sender and reason, counted, and — when it belongs to a round this peer is in or about
to enter — recorded in that round's outcome as *rejected*. Everyone else keeps being served.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
import structlog
from google.protobuf.message import DecodeError

from peer import serde
from peer.mailbox import Arrival
from peer.validate import STEP_WINDOW, RejectedError, check_frame, check_hello, check_values
from protos import data_plane_pb2 as pb
from protos import data_plane_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from peer.transport import Transport

STATUS_OF: dict[str, grpc.StatusCode] = {  # the one place domain rejections become gRPC codes
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "permission": grpc.StatusCode.PERMISSION_DENIED,
    "too-big": grpc.StatusCode.RESOURCE_EXHAUSTED,
}
REJECTION_CODES = frozenset(STATUS_OF.values())

log = structlog.get_logger("peer.servicer")


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

    async def Hello(  # noqa: N802 - the RPC name of the .proto
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

    async def Exchange(  # noqa: N802 - the RPC name of the .proto
        self, request_iterator: AsyncIterator[pb.TensorFrame], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Ack]:
        sender: int | None = None
        asm: _Assembly | None = None
        incoming = aiter(request_iterator)
        while True:
            try:
                frame = await anext(incoming)
            except StopAsyncIteration:
                return
            except DecodeError as exc:  # bytes that are not a TensorFrame at all
                self.t.counters.reject("invalid")
                detail = f"malformed frame (not a concord.v1.TensorFrame): {exc}"
                log.warning(
                    "frame.rejected",
                    peer=self.t.peer_id,
                    sender=sender,  # None when no frame of this stream decoded yet
                    remote=context.peer(),
                    code=STATUS_OF["invalid"].name,
                    reason=detail,
                )
                await context.abort(STATUS_OF["invalid"], detail)
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
                if sender is not None and info.sender == sender:
                    # the round waiting for this tensor records it as rejected, not missing
                    self.t.mailbox.reject(
                        (sender, info.step, info.round, info.tensor_id),
                        f"{STATUS_OF[r.reason].name}: {r.detail}",
                        horizon=self.t.mailbox.step + STEP_WINDOW,
                    )
                await context.abort(STATUS_OF[r.reason], r.detail)
