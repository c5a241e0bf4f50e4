"""Frame and handshake checks (pure functions) with the reason each bad input gets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from concord.core.compress import Encoded, codec_key, make_codec
from concord.peer.serde import (
    PROTOCOL_VERSION,
    FrameInfo,
    Hello,
    PartSpec,
    frame_from_wire,
    frames,
    tensors_from_payload,
)
from concord.peer.validate import (
    FiniteScan,
    ReceiverView,
    RejectedError,
    check_frame,
    check_hello,
    check_values,
)

VIEW = ReceiverView(
    run_id="r",
    peer_id=0,
    fingerprint="f" * 64,
    dim=10,
    codecs=frozenset({"none"}),
    ratio=0.01,
    chunk_bytes=16,
    max_tensor_bytes=1 << 20,
    current_step=5,
    is_neighbour=lambda s, st, r, t: s == 1,
    world_size=4,
)


def _frames(**kw: object) -> list[tuple[FrameInfo, bytes]]:
    args: dict = {
        "run_id": "r",
        "sender": 1,
        "step": 5,
        "round": 7,
        "tensor_id": 0,
        "codec": "none",
        "dim": 10,
        "parts": {"values": torch.arange(10, dtype=torch.float32)},
        "chunk_bytes": 16,
    }
    args.update(kw)
    return [frame_from_wire(f) for f in frames(**args)]


def test_good_frames_pass_and_chunking_covers_the_payload() -> None:
    got = _frames()
    assert len(got) == 3  # 40 bytes in 16-byte chunks
    assert [f.chunk_offset for f, _ in got] == [0, 16, 32]
    for f, body in got:
        check_frame(f, len(body), VIEW, expected_sender=1)


@pytest.mark.parametrize(
    ("change", "reason", "text"),
    [
        ({"run_id": "x"}, "permission", "run"),
        ({"sender": 2}, "permission", "claims sender"),
        ({"step": 8}, "precondition", "too far ahead"),
        ({"byte_length": 1 << 21}, "too-big", "limit"),
        ({"dim": 11}, "precondition", "dimension"),
        ({"codec": None}, "invalid", "codec"),
        ({"chunk_index": 3}, "invalid", "chunk 3 of 3"),
        ({"parts": None}, "invalid", "unknown dtype"),
        ({"parts": (PartSpec("values", torch.float64, 5, 0),)}, "invalid", "dtype"),
        ({"parts": (PartSpec("values", torch.float32, 9, 0),)}, "invalid", "cover"),
    ],
)
def test_bad_headers_are_rejected_with_a_reason(change: dict, reason: str, text: str) -> None:
    f, body = _frames()[0]
    with pytest.raises(RejectedError, match=text) as info:
        check_frame(dataclasses.replace(f, **change), len(body), VIEW, expected_sender=1)
    assert info.value.reason == reason


def test_a_push_sum_weight_rides_in_chunk_0_and_must_be_finite_and_positive() -> None:
    got = _frames(push_weight=0.625)
    assert [f.push_weight for f, _ in got] == [0.625, None, None]
    assert all(f.push_weight is None for f, _ in _frames())  # absent unless sent
    for f, body in got:
        check_frame(f, len(body), VIEW, expected_sender=1)
    f, body = got[0]
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(RejectedError, match="push-sum weight") as info:
            check_frame(dataclasses.replace(f, push_weight=bad), len(body), VIEW, expected_sender=1)
        assert info.value.reason == "invalid"


def test_oversized_chunk_and_non_neighbour() -> None:
    f, _ = _frames()[0]
    with pytest.raises(RejectedError, match="limit 16") as info:
        check_frame(f, 17, VIEW, expected_sender=1)
    assert info.value.reason == "too-big"
    g, body = _frames(sender=3)[0]
    with pytest.raises(RejectedError, match="not a neighbour"):
        check_frame(g, len(body), VIEW, expected_sender=3)


def test_non_finite_values_are_rejected() -> None:
    parts = (PartSpec("values", torch.float32, 3, 0),)
    check_values({"values": torch.tensor([1.0, 2.0, 3.0])}, parts)
    with pytest.raises(RejectedError, match="2 non-finite"):
        check_values({"values": torch.tensor([1.0, float("nan"), float("inf")])}, parts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_each_kind_of_non_finite_value_is_caught(dtype: torch.dtype, bad: float) -> None:
    parts = (PartSpec("values", dtype, 4, 0), PartSpec("indices", torch.int32, 2, 8))
    values = torch.tensor([-3.0, 0.0, 2.0, 5.0], dtype=dtype)
    ints = torch.tensor([0, 3], dtype=torch.int32)
    check_values({"values": values, "indices": ints}, parts)
    values[2] = bad
    with pytest.raises(RejectedError, match="1 non-finite") as info:
        check_values({"values": values, "indices": ints}, parts)
    assert info.value.reason == "invalid"
    empty = (PartSpec("values", dtype, 0, 0),)
    check_values({"values": torch.zeros(0, dtype=dtype)}, empty)  # nothing to check


def test_handshake_checks() -> None:
    good = Hello("r", 1, PROTOCOL_VERSION, "f" * 64, "none")
    check_hello(good, VIEW)
    for bad, text in [
        (dataclasses.replace(good, run_id="x"), "run"),
        (dataclasses.replace(good, protocol_version=9), "protocol version 9"),
        (dataclasses.replace(good, peer_id=0), "not another peer"),
        (dataclasses.replace(good, peer_id=7), "not another peer"),
        (dataclasses.replace(good, model_fingerprint="g" * 64), "fingerprint"),
        (dataclasses.replace(good, codec="topk"), "codec"),
    ]:
        with pytest.raises(RejectedError, match=text):
            check_hello(bad, VIEW)


def _scan_in_chunks(parts: dict[str, torch.Tensor], chunk: int) -> None:
    """Pack ``parts`` back to back and scan them the way the receiver does, chunk by chunk."""
    specs, payload, offset = [], bytearray(), 0
    for name, t in parts.items():
        specs.append(PartSpec(name, t.dtype, t.numel(), offset))
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        payload += raw
        offset += len(raw)
    buf = np.empty(len(payload), dtype=np.uint8)
    scan = FiniteScan(tensors_from_payload(buf, tuple(specs)), tuple(specs))
    for start in range(0, len(payload), chunk):
        end = min(start + chunk, len(payload))
        buf[start:end] = np.frombuffer(payload, dtype=np.uint8)[start:end]
        scan.advance(end)


@pytest.mark.parametrize("chunk", [3, 7, 64, 1 << 20])
def test_the_chunkwise_scan_catches_what_check_values_catches(chunk: int) -> None:
    # chunks split elements and parts at odd offsets; every floating element is checked once
    parts = {
        "values": torch.linspace(-2, 2, 37).to(torch.float16),
        "indices": torch.arange(37, dtype=torch.int32),
        "scale": torch.tensor([0.5, 3.0e38, 3.0e38]),  # finite, but its float32 sum overflows
        "bf": torch.linspace(-1, 1, 11).to(torch.bfloat16),
    }
    _scan_in_chunks(parts, chunk)
    for name, index in [("values", 36), ("scale", 0), ("bf", 5), ("values", 0)]:
        for bad in (float("nan"), float("inf"), -float("inf")):
            broken = {k: v.clone() for k, v in parts.items()}
            broken[name][index] = bad
            with pytest.raises(RejectedError, match=f"part '{name}' has 1 non-finite") as info:
                _scan_in_chunks(broken, chunk)
            assert info.value.reason == "invalid"
    broken = {k: v.clone() for k, v in parts.items()}
    broken["indices"][3] = -1  # integers are not checked
    _scan_in_chunks(broken, chunk)


def test_check_values_accepts_finite_values_whose_sum_overflows() -> None:
    parts = (PartSpec("values", torch.float32, 2, 0),)
    check_values({"values": torch.tensor([3.0e38, 3.0e38])}, parts)
    with pytest.raises(RejectedError, match="1 non-finite"):
        check_values({"values": torch.tensor([3.0e38, float("inf")])}, parts)


@pytest.mark.parametrize("levels", [16, 1000])
def test_qsgd_frames_are_checked_against_the_receivers_levels(levels: int) -> None:
    """qsgd parts (scale fp32 [1], levels int8 for s ≤ 127 else int16 [d]) survive protobuf
    framing and the checks, and decode to the sender's Q(x); a payload laid out for the other
    level width, or of the wrong length, is refused with the expected parts named."""
    codec = make_codec("qsgd", levels=levels, seed=3)
    x = torch.randn(10, generator=torch.Generator().manual_seed(0))
    key = codec_key(1, 7)
    enc = codec.encode(x, key=key)
    view = dataclasses.replace(
        VIEW, codecs=frozenset({"none", "qsgd"}), levels=levels, chunk_bytes=1 << 10
    )
    got = _frames(codec="qsgd", parts=enc.parts, chunk_bytes=1 << 10)
    assert len(got) == 1
    f, body = got[0]
    check_frame(f, len(body), view, expected_sender=1)
    assert f.parts is not None
    tensors = tensors_from_payload(bytearray(body), f.parts)
    check_values(tensors, f.parts)
    assert torch.equal(
        codec.decode(Encoded("qsgd", tensors, 10), key=key), codec.roundtrip(x[None], keys=[key])[0]
    )
    other = torch.int16 if levels <= 127 else torch.int8
    bad_dtype = {"scale": enc.parts["scale"], "levels": enc.parts["levels"].to(other)}
    bad_length = {"scale": enc.parts["scale"], "levels": enc.parts["levels"][:-1]}
    for parts in (bad_dtype, bad_length):
        g, chunk = _frames(codec="qsgd", parts=parts, chunk_bytes=1 << 10)[0]
        with pytest.raises(RejectedError, match="codec 'qsgd' of a 10-vector expects") as info:
            check_frame(g, len(chunk), view, expected_sender=1)
        assert info.value.reason == "invalid"
