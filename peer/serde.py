"""The only module that converts between data-plane wire messages and domain types.

Wire messages are the generated `concord.protos.data_plane_pb2` classes, and for the raw method
(``ExchangeRaw``, framing in protos/data_plane.proto) ``varint + FrameHeader + body`` bytes; domain
types are the plain dataclasses below and torch tensors. Outgoing chunks are built one at a time
(`Outgoing`), each body copied once into the ``bytes`` gRPC takes; incoming raw bodies are
zero-copy views of the received message, protobuf bodies are read from a message exactly once
(upb copies on every ``.body`` access, docs/transport.md#memory).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from google.protobuf.message import DecodeError

from concord.core.plugins import is_spec
from concord.errors import MalformedFrameError as MalformedFrameError
from concord.protos import data_plane_pb2 as pb

PROTOCOL_VERSION = 3  # 2: FrameHeader.push_weight (SGP), CODEC_QSGD, DTYPE_INT16; 3: Fetch
TENSOR_MIX = 0  # tensor ids within a round (see FrameHeader.tensor_id)
TENSOR_ALLREDUCE = 1
TENSOR_EDGE = 2
TENSOR_FETCH = 3  # a peer's parameters answering a Fetch (never on an Exchange stream)

CODEC_TO_WIRE: dict[str, int] = {
    "none": pb.CODEC_NONE,
    "fp16": pb.CODEC_FP16,
    "bf16": pb.CODEC_BF16,
    "int8": pb.CODEC_INT8,
    "topk": pb.CODEC_TOPK,
    "randomk": pb.CODEC_RANDOMK,
    "sign": pb.CODEC_SIGN,
    "qsgd": pb.CODEC_QSGD,
}
WIRE_TO_CODEC = {v: k for k, v in CODEC_TO_WIRE.items()}
# A plug-in codec ("module:Class", concord.core.plugins) travels as CODEC_PLUGIN: a process runs
# one configuration, so the plug-in it announces (`hello_request`) is the one CODEC_PLUGIN means
# on every frame it sends and receives (a peer runs the configuration its senders run).
_plugin_codec: list[str] = []


def codec_to_wire(codec: str) -> int:
    """The wire value of ``codec``: a built-in's, or CODEC_PLUGIN for a ``module:Class`` (which
    this process then takes as the meaning of CODEC_PLUGIN, `codec_from_wire`)."""
    if codec in CODEC_TO_WIRE:
        return CODEC_TO_WIRE[codec]
    if not is_spec(codec):
        raise KeyError(codec)
    if _plugin_codec and _plugin_codec[0] != codec:
        raise ValueError(
            f"codec {codec!r}: this process already runs plug-in codec {_plugin_codec[0]!r}"
        )
    _plugin_codec[:] = [codec]
    return int(pb.CODEC_PLUGIN)


def codec_from_wire(value: int) -> str | None:
    """The codec a wire value names (None: unknown, or CODEC_PLUGIN without a plug-in here)."""
    if value == pb.CODEC_PLUGIN:
        return _plugin_codec[0] if _plugin_codec else None
    return WIRE_TO_CODEC.get(value)


DTYPE_TO_WIRE: dict[torch.dtype, int] = {
    torch.float32: pb.DTYPE_FLOAT32,
    torch.float16: pb.DTYPE_FLOAT16,
    torch.bfloat16: pb.DTYPE_BFLOAT16,
    torch.int8: pb.DTYPE_INT8,
    torch.int32: pb.DTYPE_INT32,
    torch.uint8: pb.DTYPE_UINT8,
    torch.int16: pb.DTYPE_INT16,
}
WIRE_TO_DTYPE = {v: k for k, v in DTYPE_TO_WIRE.items()}


@dataclass(frozen=True)
class PartSpec:
    name: str
    dtype: torch.dtype
    numel: int
    offset: int

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty(0, dtype=self.dtype).element_size()


@dataclass(frozen=True)
class FrameInfo:
    """The header of one incoming chunk, as domain values (codec None = unknown on the wire)."""

    run_id: str
    sender: int
    step: int
    round: int
    tensor_id: int
    codec: str | None
    chunk_index: int
    chunk_count: int
    byte_length: int
    chunk_offset: int
    dim: int
    parts: tuple[PartSpec, ...] | None  # chunk 0 only; None when a dtype is unknown
    raw_parts: int  # number of parts on the wire (to tell "none sent" from "unknown dtype")
    push_weight: float | None = None  # chunk 0 only: the sender's push-sum weight (SGP)


@dataclass(frozen=True)
class Hello:
    run_id: str
    peer_id: int
    protocol_version: int
    model_fingerprint: str
    codec: str | None


def hello_request(run_id: str, peer_id: int, fingerprint: str, codec: str) -> pb.HelloRequest:
    return pb.HelloRequest(
        run_id=run_id,
        peer_id=peer_id,
        protocol_version=PROTOCOL_VERSION,
        model_fingerprint=fingerprint,
        codec=codec_to_wire(codec),  # type: ignore[arg-type]
    )


def hello_from_wire(msg: pb.HelloRequest) -> Hello:
    return Hello(
        run_id=msg.run_id,
        peer_id=msg.peer_id,
        protocol_version=msg.protocol_version,
        model_fingerprint=msg.model_fingerprint,
        codec=codec_from_wire(msg.codec),
    )


def hello_reply(accepted: bool, reason: str, peer_id: int) -> pb.HelloReply:
    return pb.HelloReply(accepted=accepted, reason=reason, peer_id=peer_id)


def layout(parts: dict[str, torch.Tensor]) -> tuple[list[PartSpec], int]:
    """Byte layout of named flat tensors packed back to back."""
    specs, offset = [], 0
    for name, t in parts.items():
        spec = PartSpec(name, t.dtype, t.numel(), offset)
        specs.append(spec)
        offset += spec.nbytes
    return specs, offset


class Outgoing:
    """One tensor to send, cut into ``count`` chunks of at most ``chunk_bytes`` on demand.

    The named parts are packed back to back: a single part is a zero-copy view of the tensor's
    memory (the tensor must stay unchanged until every chunk has been built), several parts are
    packed into one new buffer here. Each chunk is built only when it is written — as a protobuf
    `pb.TensorFrame` (`frame`) or as a raw message (`raw`, see `raw_message`) — at the cost of one
    copy of its body (the unavoidable ``bytes`` object gRPC takes)."""

    def __init__(
        self,
        *,
        run_id: str,
        sender: int,
        step: int,
        round: int,
        tensor_id: int,
        codec: str,
        dim: int,
        parts: dict[str, torch.Tensor],
        chunk_bytes: int,
        push_weight: float | None = None,
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be ≥ 1; got {chunk_bytes}")
        self.specs, self.nbytes = layout(parts)
        raw = [t.detach().contiguous().cpu().view(-1).view(torch.uint8) for t in parts.values()]
        if len(raw) == 1:
            self._mv = raw[0].numpy().data  # zero-copy view of the tensor's bytes
        else:
            payload = np.empty(self.nbytes, dtype=np.uint8)  # every byte is written below
            packed = torch.from_numpy(payload)
            for spec, r in zip(self.specs, raw, strict=True):
                packed[spec.offset : spec.offset + spec.nbytes].copy_(r)
            self._mv = payload.data
        self.run_id, self.sender, self.step, self.round = run_id, sender, step, round
        self.tensor_id, self.codec, self.dim = tensor_id, codec, dim
        self.chunk_bytes = chunk_bytes
        self.push_weight = push_weight
        self.count = max(1, -(-self.nbytes // chunk_bytes))

    def header(self, index: int) -> pb.FrameHeader:
        """Header of chunk ``index`` (0 ≤ index < count); chunk 0 carries the part table."""
        header = pb.FrameHeader(
            run_id=self.run_id,
            sender=self.sender,
            step=self.step,
            round=self.round,
            tensor_id=self.tensor_id,
            codec=codec_to_wire(self.codec),  # type: ignore[arg-type]
            chunk_index=index,
            chunk_count=self.count,
            byte_length=self.nbytes,
            chunk_offset=index * self.chunk_bytes,
            dim=self.dim,
        )
        if index == 0:
            if self.push_weight is not None:
                header.push_weight = self.push_weight
            header.parts.extend(
                pb.Part(
                    name=s.name,
                    dtype=DTYPE_TO_WIRE[s.dtype],  # type: ignore[arg-type]
                    numel=s.numel,
                    offset=s.offset,
                )
                for s in self.specs
            )
        return header

    def body(self, index: int) -> memoryview:
        """Zero-copy view of chunk ``index``'s bytes."""
        start = index * self.chunk_bytes
        return self._mv[start : start + self.chunk_bytes]

    def frame(self, index: int) -> pb.TensorFrame:
        """Chunk ``index`` as a protobuf frame (method ``Exchange``)."""
        return pb.TensorFrame(header=self.header(index), body=bytes(self.body(index)))

    def raw(self, index: int) -> bytes:
        """Chunk ``index`` as a raw message (method ``ExchangeRaw``)."""
        return raw_message(self.header(index), self.body(index))


def frames(**fields: Any) -> Iterator[pb.TensorFrame]:
    """Chunked protobuf frames of one tensor: `Outgoing`'s keyword arguments, every chunk."""
    out = Outgoing(**fields)
    for index in range(out.count):
        yield out.frame(index)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def raw_message(header: pb.FrameHeader, body: bytes | memoryview) -> bytes:
    """One message of ``ExchangeRaw``: varint length of the serialized header, the header, the
    body (one copy of the body; gRPC takes only ``bytes``)."""
    h = header.SerializeToString()
    return b"".join((_varint(len(h)), h, body))


def raw_frame_from_wire(message: bytes) -> tuple[FrameInfo, memoryview]:
    """Header as domain values and a zero-copy view of the body of one ``ExchangeRaw`` message;
    `MalformedFrameError` when the framing is broken or the header does not parse."""
    mv = memoryview(message)
    length = 0
    for used in range(min(len(mv), 10)):
        byte = mv[used]
        length |= (byte & 0x7F) << (7 * used)
        if byte < 0x80:
            break
    else:
        raise MalformedFrameError(f"no varint header length at the start of {len(mv)} bytes")
    used += 1
    end = used + length
    if end > len(mv):
        raise MalformedFrameError(
            f"header of {length} bytes does not fit in a message of {len(mv)} bytes"
        )
    try:
        header = pb.FrameHeader.FromString(mv[used:end])
    except DecodeError as exc:
        raise MalformedFrameError(f"header is not a concord.v1.FrameHeader: {exc}") from exc
    return _info(header), mv[end:]


def _info(h: pb.FrameHeader) -> FrameInfo:
    parts: tuple[PartSpec, ...] | None = None
    if h.chunk_index == 0:
        dtypes = [WIRE_TO_DTYPE.get(p.dtype) for p in h.parts]
        if all(d is not None for d in dtypes):
            parts = tuple(
                PartSpec(p.name, d, p.numel, p.offset)
                for p, d in zip(h.parts, dtypes, strict=True)
                if d is not None
            )
    return FrameInfo(
        run_id=h.run_id,
        sender=h.sender,
        step=h.step,
        round=h.round,
        tensor_id=h.tensor_id,
        codec=codec_from_wire(h.codec),
        chunk_index=h.chunk_index,
        chunk_count=h.chunk_count,
        byte_length=h.byte_length,
        chunk_offset=h.chunk_offset,
        dim=h.dim,
        parts=parts,
        raw_parts=len(h.parts),
        push_weight=h.push_weight if h.HasField("push_weight") else None,
    )


def frame_from_wire(frame: pb.TensorFrame) -> tuple[FrameInfo, bytes]:
    """Header as domain values and the body (read once: upb copies on every access)."""
    return _info(frame.header), frame.body


def tensors_from_payload(
    payload: bytearray | np.ndarray, parts: tuple[PartSpec, ...]
) -> dict[str, torch.Tensor]:
    """Zero-copy views of the named parts of an assembled payload (frombuffer refuses empty
    views: an empty part is an empty tensor)."""
    return {
        p.name: torch.frombuffer(payload, dtype=p.dtype, count=p.numel, offset=p.offset)
        if p.numel
        else torch.empty(0, dtype=p.dtype)
        for p in parts
    }


def ack(
    receiver: int, step: int, round: int, tensor_id: int, *, late: bool = False, reason: str = ""
) -> pb.Ack:
    return pb.Ack(
        receiver=receiver,
        step=step,
        round=round,
        tensor_id=tensor_id,
        status=pb.ACK_LATE if late else pb.ACK_OK,
        reason=reason,
    )
