"""The only module that converts between data-plane wire messages and domain types.

Wire messages are the generated `protos.data_plane_pb2` classes; domain types are the plain
dataclasses below and torch tensors. Bodies are read from a message exactly once (upb copies on
every ``.body`` access, TRANSPORT.md §4.1), and payload slices become ``bytes`` once per chunk
(protobuf refuses memoryviews).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from protos import data_plane_pb2 as pb

PROTOCOL_VERSION = 1
TENSOR_MIX = 0  # tensor ids within a round (see FrameHeader.tensor_id)
TENSOR_ALLREDUCE = 1
TENSOR_EDGE = 2

CODEC_TO_WIRE: dict[str, int] = {
    "none": pb.CODEC_NONE,
    "fp16": pb.CODEC_FP16,
    "bf16": pb.CODEC_BF16,
    "int8": pb.CODEC_INT8,
    "topk": pb.CODEC_TOPK,
    "randomk": pb.CODEC_RANDOMK,
    "sign": pb.CODEC_SIGN,
}
WIRE_TO_CODEC = {v: k for k, v in CODEC_TO_WIRE.items()}

DTYPE_TO_WIRE: dict[torch.dtype, int] = {
    torch.float32: pb.DTYPE_FLOAT32,
    torch.float16: pb.DTYPE_FLOAT16,
    torch.bfloat16: pb.DTYPE_BFLOAT16,
    torch.int8: pb.DTYPE_INT8,
    torch.int32: pb.DTYPE_INT32,
    torch.uint8: pb.DTYPE_UINT8,
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
        codec=CODEC_TO_WIRE[codec],  # type: ignore[arg-type]
    )


def hello_from_wire(msg: pb.HelloRequest) -> Hello:
    return Hello(
        run_id=msg.run_id,
        peer_id=msg.peer_id,
        protocol_version=msg.protocol_version,
        model_fingerprint=msg.model_fingerprint,
        codec=WIRE_TO_CODEC.get(msg.codec),
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


def frames(
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
) -> Iterator[pb.TensorFrame]:
    """Chunked frames of one tensor (its named parts packed back to back).

    A single part is sliced straight out of the tensor's memory (one copy per chunk, the
    unavoidable ``bytes`` for protobuf); several parts are packed into one buffer first."""
    specs, total = layout(parts)
    raw = [t.detach().contiguous().cpu().view(-1).view(torch.uint8) for t in parts.values()]
    mv: memoryview
    if len(raw) == 1:
        mv = raw[0].numpy().data  # zero-copy view of the tensor's bytes
    else:
        payload = bytearray(total)
        for spec, r in zip(specs, raw, strict=True):
            view = memoryview(payload)[spec.offset : spec.offset + spec.nbytes]
            torch.frombuffer(view, dtype=torch.uint8).copy_(r)
        mv = memoryview(payload)
    count = max(1, -(-total // chunk_bytes))
    for index in range(count):
        start = index * chunk_bytes
        header = pb.FrameHeader(
            run_id=run_id,
            sender=sender,
            step=step,
            round=round,
            tensor_id=tensor_id,
            codec=CODEC_TO_WIRE[codec],  # type: ignore[arg-type]
            chunk_index=index,
            chunk_count=count,
            byte_length=total,
            chunk_offset=start,
            dim=dim,
        )
        if index == 0:
            header.parts.extend(
                pb.Part(
                    name=s.name,
                    dtype=DTYPE_TO_WIRE[s.dtype],  # type: ignore[arg-type]
                    numel=s.numel,
                    offset=s.offset,
                )
                for s in specs
            )
        yield pb.TensorFrame(header=header, body=bytes(mv[start : start + chunk_bytes]))


def frame_from_wire(frame: pb.TensorFrame) -> tuple[FrameInfo, bytes]:
    """Header as domain values and the body (read once)."""
    h = frame.header
    parts: tuple[PartSpec, ...] | None = None
    if h.chunk_index == 0:
        dtypes = [WIRE_TO_DTYPE.get(p.dtype) for p in h.parts]
        if all(d is not None for d in dtypes):
            parts = tuple(
                PartSpec(p.name, d, p.numel, p.offset)
                for p, d in zip(h.parts, dtypes, strict=True)
                if d is not None
            )
    info = FrameInfo(
        run_id=h.run_id,
        sender=h.sender,
        step=h.step,
        round=h.round,
        tensor_id=h.tensor_id,
        codec=WIRE_TO_CODEC.get(h.codec),
        chunk_index=h.chunk_index,
        chunk_count=h.chunk_count,
        byte_length=h.byte_length,
        chunk_offset=h.chunk_offset,
        dim=h.dim,
        parts=parts,
        raw_parts=len(h.parts),
    )
    return info, frame.body


def tensors_from_payload(
    payload: bytearray, parts: tuple[PartSpec, ...]
) -> dict[str, torch.Tensor]:
    """Zero-copy views of the named parts of an assembled payload."""
    return {
        p.name: torch.frombuffer(payload, dtype=p.dtype, count=p.numel, offset=p.offset)
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
