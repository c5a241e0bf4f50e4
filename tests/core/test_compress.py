"""Codecs: the compression operator Q of each, wire sizes, batched == per-row, bad input."""

from __future__ import annotations

import itertools

import pytest
import torch

from concord.core.compress import (
    CODEC_NAMES,
    CODECS,
    Codec,
    CodecError,
    Encoded,
    Int8,
    RandomK,
    codec_key,
    make_codec,
    message_generator,
)
from concord.core.config import CODEC_NAMES as CONFIG_CODECS

torch.set_num_threads(1)
D = 1000


def _x(k: int = 3, d: int = D, seed: int = 0) -> torch.Tensor:
    return torch.randn(k, d, generator=torch.Generator().manual_seed(seed))


def test_codec_names_match_config_and_registry() -> None:
    assert CODEC_NAMES == CONFIG_CODECS
    assert set(CODECS.names()) == set(CODEC_NAMES)
    assert not make_codec("none").lossy
    assert all(make_codec(n).lossy for n in CODEC_NAMES if n != "none")


def _inputs() -> list[tuple[str, torch.Tensor]]:
    ties = torch.randint(-3, 4, (4, 203), generator=torch.Generator().manual_seed(5)).float()
    zeros = torch.zeros(2, 16)
    zeros[1, 3] = -2.0
    return [("gaussian", _x(3)), ("odd-d-with-ties", ties), ("zeros", zeros), ("d=1", _x(3, 1))]


CODECS_UNDER_TEST: list[tuple[str, Codec]] = [
    *((n, make_codec(n, ratio=0.05, seed=4)) for n in CODEC_NAMES),
    ("randomk-dense", make_codec("randomk", ratio=0.5, seed=4)),
    ("int8-stochastic", Int8(seed=4, stochastic=True)),
    ("qsgd-int16-levels", make_codec("qsgd", levels=1000, seed=4)),
    ("qsgd-unbiased", make_codec("qsgd", levels=3, unbiased=True, seed=4)),
]


@pytest.mark.parametrize(
    ("label", "codec"), CODECS_UNDER_TEST, ids=[c[0] for c in CODECS_UNDER_TEST]
)
def test_batched_roundtrip_equals_per_row_bitwise(label: str, codec: Codec) -> None:
    for what, x in _inputs():
        k, d = x.shape
        keys = [codec_key(r, 9) for r in range(k)]
        batched = codec.roundtrip(x, keys=keys)
        assert batched.dtype == torch.float32
        assert batched.shape == x.shape
        for row, key, got in zip(x, keys, batched, strict=True):
            enc = codec.encode(row, key=key)
            assert enc.d == d
            specs = codec.part_specs(d)
            assert list(enc.parts) == list(specs)  # wire order
            assert {n: (t.dtype, t.numel()) for n, t in enc.parts.items()} == specs
            assert all(t.dim() == 1 for t in enc.parts.values())
            assert enc.nbytes == codec.wire_bytes(d)
            # bitwise: the vectorized engine must predict exactly what a peer decodes
            assert torch.equal(codec.decode(enc, key=key), got), (label, what)


def test_wire_bytes() -> None:
    assert make_codec("none").wire_bytes(D) == 4 * D
    assert make_codec("fp16").wire_bytes(D) == make_codec("bf16").wire_bytes(D) == 2 * D
    assert make_codec("int8").wire_bytes(D) == D + 4
    assert make_codec("sign").wire_bytes(D) == 125 + 4
    assert make_codec("sign").wire_bytes(D + 1) == 126 + 4
    assert make_codec("qsgd").wire_bytes(D) == D + 4  # s = 16: int8 levels
    assert make_codec("qsgd", levels=128).wire_bytes(D) == 2 * D + 4  # int16 levels
    assert make_codec("topk", ratio=0.01).wire_bytes(D) == 10 * 8
    assert make_codec("randomk", ratio=0.01).wire_bytes(D) == 10 * 4
    assert make_codec("topk", ratio=1e-6).part_specs(D)["values"] == (torch.float32, 1)  # m ≥ 1


def _q(name: str, x: torch.Tensor, ratio: float = 0.01) -> torch.Tensor:
    return make_codec(name, ratio=ratio).roundtrip(x[None], keys=[0])[0]


def test_casts() -> None:
    x = _x(1)[0]
    assert torch.equal(_q("none", x), x)
    for name, unit in (("fp16", 2**-11), ("bf16", 2**-8)):  # unit round-off of each format
        err = (_q(name, x) - x).abs()
        tiny = x.abs() < 2**-14  # fp16 subnormals have an absolute, not relative, error bound
        assert bool((err[~tiny] <= unit * x.abs()[~tiny]).all()), name
        assert bool((err[tiny] <= 2**-25).all()), name


def test_int8_deterministic_rounding() -> None:
    x = _x(1)[0]
    y = _q("int8", x)
    scale = float(x.abs().max()) / 127
    # nearest level: ≤ s/2, plus float32 round-off of x/s and q·s (a few ulps of max|x|)
    assert float((y - x).abs().max()) <= scale / 2 + 4e-7 * float(x.abs().max())
    assert float((y / scale).round().sub(y / scale).abs().max()) < 1e-4  # on the grid
    assert torch.equal(_q("int8", torch.zeros(D)), torch.zeros(D))


def test_int8_stochastic_rounding_is_unbiased_and_seeded() -> None:
    x = _x(1, 200)[0]
    codec = Int8(seed=3, stochastic=True)
    scale = float(x.abs().max()) / 127
    draws = torch.stack([codec.roundtrip(x[None], keys=[key])[0] for key in range(400)])
    assert float((draws - x).abs().max()) < scale + 1e-6  # one level at most
    # E[Q(x)] = x; the mean of 400 draws has standard deviation ≤ s/(2·√400) = s/40
    assert float((draws.mean(0) - x).abs().max()) < scale / 40 * 5
    assert torch.equal(draws[7], codec.roundtrip(x[None], keys=[7])[0])  # same key, same draw
    assert not torch.equal(draws[7], draws[8])


def test_topk_keeps_exactly_the_largest() -> None:
    x = _x(1)[0]
    y = _q("topk", x, ratio=0.01)
    kept = y.nonzero().flatten()
    assert set(kept.tolist()) == set(x.abs().topk(10).indices.tolist())
    assert torch.equal(y[kept], x[kept])
    enc = make_codec("topk", ratio=0.01).encode(x, key=0)
    assert bool((enc.parts["indices"][1:] > enc.parts["indices"][:-1]).all())  # sorted on the wire


@pytest.mark.parametrize(("d", "ratio"), [(D, 0.01), (D, 0.5), (300_000, 0.001)])
def test_randomk_indices_are_shared_by_key(d: int, ratio: float) -> None:
    """Sender and receiver (separate codec objects, same seed) regenerate the same coordinates;
    other keys or seeds give others. Covers the permutation and the sparse-sampling paths."""
    sender, receiver = (
        RandomK(ratio=ratio, seed=1),
        RandomK(ratio=ratio, seed=1),
    )
    m = sender.kept(d)
    key = codec_key(2, 5)
    a = sender.indices(d, key)
    assert torch.equal(a, receiver.indices(d, key))
    assert a.numel() == m
    assert bool((a[1:] > a[:-1]).all())  # sorted, distinct
    assert int(a[0]) >= 0
    assert int(a[-1]) < d
    assert not torch.equal(a, sender.indices(d, codec_key(3, 5)))
    assert not torch.equal(a, sender.indices(d, codec_key(2, 6)))
    other_seed = RandomK(ratio=ratio, seed=2)
    assert not torch.equal(a, other_seed.indices(d, key))
    x = _x(1, d)[0]
    y = receiver.decode(sender.encode(x, key=key), key=key)
    assert torch.equal(y[a], x[a])  # biased: the values as they are
    assert int(y.count_nonzero()) == m


def test_randomk_covers_coordinates_uniformly() -> None:
    """Over 2000 keys each of 100 coordinates is drawn Binomial(2000, 0.1) times (mean 200,
    sd 13.4); all counts within 6 sd (a failure here means biased sampling)."""
    codec = RandomK(ratio=0.1, seed=0)
    counts = torch.zeros(100)
    for key in range(2000):
        counts[codec.indices(100, key)] += 1
    assert float((counts - 200).abs().max()) < 6 * 13.4


def test_sign_reconstructs_scaled_signs() -> None:
    x = _x(1, 13)[0]
    x[4] = 0.0
    y = _q("sign", x)
    expected = torch.where(x >= 0, 1.0, -1.0) * x.abs().double().mean().float()
    assert torch.equal(y, expected)  # sign(0) = +1
    e = torch.zeros(10)
    e[0], e[9] = 1.0, 1.0
    e[1:9] = -1.0
    bits = make_codec("sign").encode(e, key=0).parts["bits"]
    assert bits.tolist() == [1, 2]  # little-endian bits, zero padding


def test_codec_key_and_generator() -> None:
    keys = {codec_key(s, r) for s, r in itertools.product(range(64), range(2000))}
    assert len(keys) == 64 * 2000  # no collisions between (sender, round) pairs
    assert codec_key(4095, 10**9) != codec_key(0, 10**9 + 1)
    with pytest.raises(ValueError, match="sender"):
        codec_key(1 << 16, 0)
    with pytest.raises(ValueError, match="round"):
        codec_key(0, -1)
    draw = [torch.rand(4, generator=message_generator(s, k)) for s, k in ((0, 1), (1, 0), (0, 1))]
    assert torch.equal(draw[0], draw[2])
    assert not torch.equal(draw[0], draw[1])


def _with(enc: Encoded, **parts: torch.Tensor) -> Encoded:
    return Encoded(enc.codec, {**enc.parts, **parts}, enc.d)


def test_malformed_input_is_rejected() -> None:
    topk = make_codec("topk", ratio=0.01)
    good = topk.encode(_x(1)[0], key=0)
    idx, values = good.parts["indices"], good.parts["values"]
    cases: list[tuple[Encoded, str]] = [
        (Encoded("topk", {"values": values}, D), "missing part 'indices'"),
        (_with(good, extra=values), "unknown part 'extra'"),
        (
            _with(good, indices=idx.long()),
            r"'indices' has dtype torch\.int64; expected torch\.int32",
        ),
        (_with(good, values=values[:-1]), r"'values' has shape \[9\]; expected \[10\]"),
        (_with(good, values=values.reshape(2, 5)), r"shape \[2, 5\]"),
        (
            _with(good, indices=idx.clone().index_fill_(0, torch.tensor([9]), D + 5)),
            "1005 out of range",
        ),
        (_with(good, indices=idx.clone().index_fill_(0, torch.tensor([0]), -1)), "-1 out of range"),
        (_with(good, indices=idx.flip(0)), "strictly increasing"),
        (
            _with(good, indices=idx.clone().index_fill_(0, torch.tensor([1]), int(idx[0]))),
            "repeats",
        ),
        (Encoded("topk", good.parts, 0), "d = 0"),
        (Encoded("sign", good.parts, D), "'sign' payload given to the 'topk' codec"),
    ]
    for enc, message in cases:
        with pytest.raises(CodecError, match=message):
            topk.decode(enc, key=0)
    for name in ("int8", "sign", "qsgd"):
        codec = make_codec(name)
        enc = codec.encode(_x(1)[0], key=0)
        for bad, message in (
            (float("nan"), "nan is not finite"),
            (float("inf"), "inf is not finite"),
            (-1.0, r"-1\.0 is negative"),
        ):
            with pytest.raises(CodecError, match=f"{name}: scale {message}"):
                codec.decode(_with(enc, scale=torch.tensor([bad])), key=0)
    assert issubclass(CodecError, ValueError)


def test_bad_arguments() -> None:
    for ratio in (0, -0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="ratio"):
            make_codec("topk", ratio=ratio)
    with pytest.raises(ValueError, match="1-D"):
        make_codec("int8").encode(_x(2), key=0)
    with pytest.raises(ValueError, match="floating-point"):
        make_codec("int8").encode(torch.arange(5), key=0)
    with pytest.raises(ValueError, match="empty"):
        make_codec("sign").encode(torch.zeros(0), key=0)
    with pytest.raises(ValueError, match="2 keys for 3 rows"):
        make_codec("randomk").roundtrip(_x(3), keys=[0, 1])
    with pytest.raises(KeyError, match="valid: "):
        make_codec("zip")
