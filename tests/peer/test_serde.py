"""Frames ↔ tensors round trip through real protobuf bytes (single part and several parts)."""

from __future__ import annotations

import pytest
import torch

from concord.peer import serde
from concord.protos import data_plane_pb2 as pb


def _roundtrip(parts: dict[str, torch.Tensor], chunk_bytes: int) -> dict[str, torch.Tensor]:
    frames = list(
        serde.frames(
            run_id="r",
            sender=2,
            step=4,
            round=9,
            tensor_id=0,
            codec="topk",
            dim=1000,
            parts=parts,
            chunk_bytes=chunk_bytes,
        )
    )
    payload = bytearray()
    head = None
    for k, frame in enumerate(frames):
        info, body = serde.frame_from_wire(pb.TensorFrame.FromString(frame.SerializeToString()))
        assert (info.chunk_index, info.chunk_count, info.chunk_offset) == (
            k,
            len(frames),
            len(payload),
        )
        assert len(body) <= chunk_bytes
        if k == 0:
            head = info
        payload += body
    assert head is not None
    assert head.parts is not None
    assert (head.sender, head.step, head.round, head.codec, head.dim) == (2, 4, 9, "topk", 1000)
    assert head.byte_length == len(payload)
    return serde.tensors_from_payload(payload, head.parts)


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1 << 20])
def test_parts_survive_chunking(chunk_bytes: int) -> None:
    parts = {
        "values": torch.linspace(-1, 1, 50).to(torch.float16),
        "indices": torch.arange(0, 1000, 20, dtype=torch.int32),
    }
    got = _roundtrip(parts, chunk_bytes)
    assert list(got) == ["values", "indices"]
    for name, t in parts.items():
        assert torch.equal(got[name], t)


def test_a_single_part_is_sent_from_the_tensor_itself() -> None:
    values = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = _roundtrip({"values": values[::1]}, 300)
    assert torch.equal(got["values"], values)
    strided = torch.arange(2000, dtype=torch.float32)[::2]  # non-contiguous input is packed
    assert torch.equal(_roundtrip({"values": strided}, 1 << 20)["values"], strided)


def _outgoing(
    parts: dict[str, torch.Tensor], chunk_bytes: int, push_weight: float | None = None
) -> serde.Outgoing:
    return serde.Outgoing(
        run_id="r",
        sender=2,
        step=4,
        round=9,
        tensor_id=0,
        codec="topk",
        dim=1000,
        parts=parts,
        chunk_bytes=chunk_bytes,
        push_weight=push_weight,
    )


def test_a_push_sum_weight_survives_both_wire_forms_exactly() -> None:
    parts = {
        "values": torch.linspace(-1, 1, 50),
        "indices": torch.arange(0, 1000, 20, dtype=torch.int32),
    }
    w = 1.0 / 3.0  # a float64 that float32 would round: the header carries a double
    out = _outgoing(parts, 64, push_weight=w)
    assert out.count > 1
    for k in range(out.count):
        raw, _ = serde.raw_frame_from_wire(out.raw(k))
        pbf, _ = serde.frame_from_wire(pb.TensorFrame.FromString(out.frame(k).SerializeToString()))
        assert raw.push_weight == pbf.push_weight == (w if k == 0 else None)


@pytest.mark.parametrize("chunk_bytes", [7, 64, 1 << 20])
def test_raw_messages_carry_the_same_headers_and_bodies_as_protobuf_frames(
    chunk_bytes: int,
) -> None:
    parts = {
        "values": torch.linspace(-1, 1, 50).to(torch.float16),
        "indices": torch.arange(0, 1000, 20, dtype=torch.int32),
    }
    out = _outgoing(parts, chunk_bytes)
    payload = bytearray()
    for k in range(out.count):
        raw_info, raw_body = serde.raw_frame_from_wire(out.raw(k))
        pb_info, pb_body = serde.frame_from_wire(
            pb.TensorFrame.FromString(out.frame(k).SerializeToString())
        )
        assert raw_info == pb_info
        assert bytes(raw_body) == pb_body
        assert raw_info.chunk_offset == len(payload)
        payload += raw_body
    head, _ = serde.raw_frame_from_wire(out.raw(0))
    assert head.parts is not None
    got = serde.tensors_from_payload(payload, head.parts)
    for name, t in parts.items():
        assert torch.equal(got[name], t)


def test_raw_message_layout_is_varint_header_body() -> None:
    header = pb.FrameHeader(run_id="r" * 200, sender=1)  # a header longer than 127 bytes
    h = header.SerializeToString()
    msg = serde.raw_message(header, b"body")
    assert msg == bytes([(len(h) & 0x7F) | 0x80, len(h) >> 7]) + h + b"body"
    info, body = serde.raw_frame_from_wire(msg)
    assert (info.run_id, info.sender, bytes(body)) == ("r" * 200, 1, b"body")


@pytest.mark.parametrize(
    ("message", "text"),
    [
        (b"", "no varint header length"),
        (b"\xff" * 12, "no varint header length"),
        (b"\x80\x80", "no varint header length"),  # the varint runs off the end
        (b"\x40" + b"\x00" * 10, "does not fit"),  # a 64-byte header in an 11-byte message
        (b"\x03\xff\xfe\xfd" + b"body", "not a concord.v1.FrameHeader"),
    ],
)
def test_malformed_raw_messages_are_refused(message: bytes, text: str) -> None:
    with pytest.raises(serde.MalformedFrameError, match=text):
        serde.raw_frame_from_wire(message)


def test_outgoing_builds_chunks_lazily_from_the_tensor() -> None:
    values = torch.arange(10, dtype=torch.float32)
    out = _outgoing({"values": values}, 16)
    assert out.count == 3
    values[9] = 99.0  # a single part is a view: chunks built later see the tensor as it is then
    _, body = serde.raw_frame_from_wire(out.raw(2))
    assert torch.frombuffer(bytearray(body), dtype=torch.float32).tolist() == [8.0, 99.0]
    empty = _outgoing({"values": torch.zeros(0)}, 16)
    assert empty.count == 1
    info, body = serde.raw_frame_from_wire(empty.raw(0))
    assert (info.byte_length, len(body)) == (0, 0)
    none = serde.tensors_from_payload(bytearray(), (serde.PartSpec("values", torch.float32, 0, 0),))
    assert none["values"].shape == (0,)
