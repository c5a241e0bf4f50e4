"""Frames ↔ tensors round trip through real protobuf bytes (single part and several parts)."""

from __future__ import annotations

import pytest
import torch

from peer import serde
from protos import data_plane_pb2 as pb


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
