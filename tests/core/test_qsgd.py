"""QSGD: levels and wire dtype, the unbiased and the biased (CHOCO) variants in expectation,
determinism given the message key, bad levels and malformed parts, the config switch."""

from __future__ import annotations

import math

import pytest
import torch

from concord.core.compress import QSGD, CodecError, Encoded, codec_key, make_codec
from concord.core.config import ConfigError, load_config
from concord.core.loop import make_run_codec

torch.set_num_threads(1)


def _x(d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _draws(codec: QSGD, x: torch.Tensor, n: int) -> torch.Tensor:
    """n independent draws of Q(x): one per message key."""
    return codec.roundtrip(x.expand(n, -1), keys=[codec_key(r % 16, r // 16) for r in range(n)])


def test_levels_choose_the_wire_dtype_and_size() -> None:
    d = 1000
    for levels, dtype, nbytes in ((1, torch.int8, d + 4), (127, torch.int8, d + 4)):
        codec = make_codec("qsgd", levels=levels)
        assert codec.part_specs(d) == {"scale": (torch.float32, 1), "levels": (dtype, d)}
        assert codec.wire_bytes(d) == nbytes
    for levels in (128, 32767):
        codec = make_codec("qsgd", levels=levels)
        assert codec.part_specs(d)["levels"] == (torch.int16, d)
        assert codec.wire_bytes(d) == 2 * d + 4
    assert make_codec("qsgd").part_specs(d)["levels"][0] == torch.int8  # default s = 16


@pytest.mark.parametrize("levels", [1, 16, 127, 128, 32767])
def test_values_lie_on_the_grid(levels: int) -> None:
    """|level| ≤ s; unbiased: every coordinate is one of the two grid points around it, so
    |Q(x)_j − x_j| < ‖x‖₂/s (plus float32 round-off of the products)."""
    x = _x(500)
    codec = QSGD(levels=levels, unbiased=True, seed=3)
    enc = codec.encode(x, key=5)
    lv = enc.parts["levels"].to(torch.int64)
    assert int(lv.abs().max()) <= levels
    assert bool(((lv == 0) | (lv.sign() == x.sign().to(torch.int64))).all())  # sign kept
    step = float(x.norm()) / levels
    assert float((codec.decode(enc, key=5) - x).abs().max()) < step * (1 + 1e-5)


def test_unbiased_variant_is_unbiased() -> None:
    """E[Q(x)] = x. Q(x)_j takes two values one step h = ‖x‖₂/s apart, so its sd is ≤ h/2 and
    the mean of N = 4000 draws has sd ≤ h/(2√N); all 200 coordinates within 5 of those sd (a
    Gaussian tail of 6e-7 each; the draws are seeded, so the test is deterministic)."""
    d, s, n = 200, 16, 4000
    x = _x(d, 1)
    draws = _draws(QSGD(levels=s, unbiased=True, seed=7), x, n)
    h = float(x.norm()) / s
    assert float((draws.mean(0) - x).abs().max()) < 5 * h / (2 * math.sqrt(n))
    biased = _draws(QSGD(levels=s, seed=7), x, n)  # the default is not: E = τx ≠ x
    assert float((biased.mean(0) - x).abs().max()) > 20 * h / (2 * math.sqrt(n))


@pytest.mark.parametrize(("d", "s", "tau"), [(1000, 16, 1 / (1 + math.sqrt(1000) / 16))])
def test_biased_variant_scales_by_tau(d: int, s: int, tau: float) -> None:
    """The default (CHOCO's ``is_biased``) sends the same levels as the unbiased variant scaled
    by τ = 1/(1 + min(d/s², √d/s)), so E[Q(x)] = τx; and it is a δ-compressor with δ = τ:
    E‖Q(x) − x‖² ≤ (1 − τ)‖x‖²."""
    x = _x(d, 2)
    biased, unbiased = QSGD(levels=s, seed=1), QSGD(levels=s, seed=1, unbiased=True)
    assert biased.tau(d) == pytest.approx(tau, rel=1e-12)
    assert unbiased.tau(d) == 1.0
    eb, eu = biased.encode(x, key=3), unbiased.encode(x, key=3)
    assert torch.equal(eb.parts["levels"], eu.parts["levels"])  # same draws, same levels
    # two float32 roundings of the scale (each ≤ 2⁻²⁴ relative)
    ratio = float(eb.parts["scale"][0]) / float(eu.parts["scale"][0])
    assert ratio == pytest.approx(tau, rel=2e-7)
    n = 2000
    draws = _draws(biased, x, n)
    # sd of the mean ≤ τ‖x‖₂/(2s√N) per coordinate; 5 sd over the 1000 coordinates
    bound = 5 * tau * float(x.norm()) / (2 * s * math.sqrt(n))
    assert float((draws.mean(0) - tau * x).abs().max()) < bound
    error = float((draws - x).pow(2).sum(1).mean()) / float(x.pow(2).sum())
    assert error < 1 - tau  # measured 0.51 against 1 − τ = 0.66


def test_tau_takes_the_smaller_of_the_two_variance_terms() -> None:
    assert QSGD(levels=16).tau(100) == pytest.approx(1 / (1 + 100 / 256))  # d/s² < √d/s
    assert QSGD(levels=16).tau(1000) == pytest.approx(1 / (1 + math.sqrt(1000) / 16))
    assert QSGD(levels=1).tau(1) == 0.5


def test_deterministic_given_the_key_and_seed() -> None:
    """Separate codec objects with the same seed (sender and receiver) agree for one key; another
    key or another seed gives another draw."""
    x = _x(300, 4)
    a, b = QSGD(seed=5), QSGD(seed=5)
    key = codec_key(2, 11)
    assert torch.equal(a.decode(a.encode(x, key=key), key=key), b.roundtrip(x[None], keys=[key])[0])
    levels = a.encode(x, key=key).parts["levels"]
    assert torch.equal(levels, b.encode(x, key=key).parts["levels"])
    assert not torch.equal(levels, a.encode(x, key=codec_key(3, 11)).parts["levels"])
    assert not torch.equal(levels, a.encode(x, key=codec_key(2, 12)).parts["levels"])
    assert not torch.equal(levels, QSGD(seed=6).encode(x, key=key).parts["levels"])


def test_edge_vectors() -> None:
    codec = QSGD(levels=16)
    assert torch.equal(codec.roundtrip(torch.zeros(2, 9), keys=[0, 1]), torch.zeros(2, 9))
    one_hot = torch.zeros(50)
    one_hot[7] = -3.0
    enc = codec.encode(one_hot, key=0)
    assert enc.parts["levels"][7] == -16  # |x_j| = ‖x‖₂: the top level, whatever the draw
    assert int(enc.parts["levels"].count_nonzero()) == 1
    expected = -3.0 * codec.tau(50)
    assert float(codec.decode(enc, key=0)[7]) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("levels", [0, -1, 32768, 2.5, True, "16"])
def test_bad_levels_are_refused(levels: object) -> None:
    with pytest.raises(ValueError, match=r"qsgd levels \(compression\.levels\)"):
        make_codec("qsgd", levels=levels)  # type: ignore[arg-type]


def test_malformed_parts_are_rejected() -> None:
    codec = QSGD(levels=16)
    good = codec.encode(_x(100), key=0)
    lv = good.parts["levels"]
    cases: list[tuple[dict[str, torch.Tensor], str]] = [
        ({"levels": lv.to(torch.int16)}, r"'levels' has dtype torch\.int16; expected torch\.int8"),
        ({"levels": lv[:-1]}, r"'levels' has shape \[99\]; expected \[100\]"),
        ({"levels": lv.clone().index_fill_(0, torch.tensor([3]), 17)}, r"level 17 outside"),
        ({"levels": lv.clone().index_fill_(0, torch.tensor([3]), -128)}, r"level -128 outside"),
        ({"scale": torch.tensor([float("nan")])}, "scale nan is not finite"),
        ({"scale": torch.tensor([-1.0])}, r"scale -1\.0 is negative"),
        ({"scale": torch.tensor([1.0, 2.0])}, r"'scale' has shape \[2\]"),
    ]
    for change, message in cases:
        with pytest.raises(CodecError, match=message):
            codec.decode(Encoded("qsgd", {**good.parts, **change}, 100), key=0)
    wide = QSGD(levels=1000)  # int16 levels: a receiver with s = 1000 wants int16
    with pytest.raises(CodecError, match=r"expected torch\.int16"):
        wide.decode(good, key=0)


def test_config_builds_the_codec() -> None:
    base = ["algorithm=choco", "compression.codec=qsgd", "compression.gamma=0.3"]
    cfg = load_config(None, base, environ={})
    codec = make_run_codec(cfg)
    assert isinstance(codec, QSGD)
    assert (codec.levels, codec.unbiased, codec.seed) == (16, False, cfg.seed)
    cfg = load_config(
        None, [*base, "compression.levels=255", "compression.unbiased=true"], environ={}
    )
    codec = make_run_codec(cfg)
    assert isinstance(codec, QSGD)
    assert (codec.levels, codec.unbiased) == (255, True)
    for bad in ("0", "32768"):
        with pytest.raises(ConfigError, match=r"compression\.levels"):
            load_config(None, [*base, f"compression.levels={bad}"], environ={})
    with pytest.raises(ConfigError, match="needs error feedback"):
        load_config(None, ["compression.codec=qsgd"], environ={})  # lossy: choco only
