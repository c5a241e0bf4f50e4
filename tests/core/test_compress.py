"""Codecs: the compression operator Q of each, wire sizes, batched == per-row, bad input."""

from __future__ import annotations

import pytest
import torch

from core.compress import CODEC_NAMES, CodecError, Encoded, codec_key, make_codec
from core.config import CODEC_NAMES as CONFIG_CODECS

D = 1000


def _x(k: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(k, D, generator=torch.Generator().manual_seed(seed))


def test_codec_names_match_config() -> None:
    assert CODEC_NAMES == CONFIG_CODECS


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_batched_roundtrip_equals_per_row_bitwise(name: str) -> None:
    codec = make_codec(name, ratio=0.05, seed=4)
    x = _x()
    keys = [codec_key(r, 9) for r in range(3)]
    batched = codec.roundtrip(x, keys=keys)
    for row, key, got in zip(x, keys, batched, strict=True):
        enc = codec.encode(row, key=key)
        assert sum(t.numel() * t.element_size() for t in enc.parts.values()) == codec.wire_bytes(D)
        assert {n: (t.dtype, t.numel()) for n, t in enc.parts.items()} == codec.part_specs(D)
        # bitwise: the vectorized engine must predict exactly what a peer decodes
        assert torch.equal(codec.decode(enc, key=key), got), name


def test_operator_properties() -> None:
    x = _x(1)[0]
    assert torch.equal(make_codec("none").roundtrip(x[None], keys=[0])[0], x)
    for name, rel in (("fp16", 1e-3), ("bf16", 1e-2)):  # half precisions' unit round-off
        y = make_codec(name).roundtrip(x[None], keys=[0])[0]
        assert torch.allclose(y, x, rtol=rel, atol=1e-6)
    y = make_codec("int8").roundtrip(x[None], keys=[0])[0]
    scale = x.abs().max() / 127
    assert (y - x).abs().max() <= scale / 2 + 1e-7  # rounding to the nearest level
    topk = make_codec("topk", ratio=0.01).roundtrip(x[None], keys=[0])[0]
    kept = topk.nonzero().flatten()
    assert len(kept) == 10
    assert set(kept.tolist()) == set(x.abs().topk(10).indices.tolist())
    r = make_codec("randomk", ratio=0.01, seed=1)
    a, b = r.indices(D, codec_key(2, 5)), r.indices(D, codec_key(2, 5))
    assert torch.equal(a, b)
    assert not torch.equal(a, r.indices(D, codec_key(3, 5)))
    y = make_codec("sign").roundtrip(x[None], keys=[0])[0]
    assert torch.allclose(y, torch.where(x >= 0, 1.0, -1.0) * x.abs().mean())
    assert make_codec("sign").wire_bytes(D) == 125 + 4
    assert make_codec("topk", ratio=0.01).wire_bytes(D) == 10 * 8


def test_malformed_input_is_rejected() -> None:
    topk = make_codec("topk", ratio=0.01)
    good = topk.encode(_x(1)[0], key=0)
    with pytest.raises(CodecError, match="parts"):
        topk.decode(Encoded("topk", {"values": good.parts["values"]}, D), key=0)
    with pytest.raises(CodecError, match=r"expected torch\.int32"):
        topk.decode(
            Encoded("topk", {**good.parts, "indices": good.parts["indices"].long()}, D), key=0
        )
    bad = good.parts["indices"].clone()
    bad[0] = D + 5
    with pytest.raises(CodecError, match="outside"):
        topk.decode(Encoded("topk", {**good.parts, "indices": bad}, D), key=0)
    int8 = make_codec("int8")
    enc = int8.encode(_x(1)[0], key=0)
    with pytest.raises(CodecError, match="scale"):
        int8.decode(Encoded("int8", {**enc.parts, "scale": torch.tensor([float("nan")])}, D), key=0)
    with pytest.raises(CodecError, match="given to"):
        int8.decode(Encoded("sign", enc.parts, D), key=0)
    with pytest.raises(ValueError, match="ratio"):
        make_codec("topk", ratio=0)
