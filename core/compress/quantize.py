"""Casts (none, fp16, bf16) and quantisers (int8, sign, qsgd); see the table in
`concord.core.compress`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch

from concord.core.compress.base import (
    CODECS,
    Codec,
    CodecError,
    Parts,
    check_scale,
    message_generator,
)

# ---------------------------------------------------------------------------------------------
# Casts


class _Cast(Codec):
    dtype: ClassVar[torch.dtype]

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"values": (self.dtype, d)}

    def _encode_rows(self, x: torch.Tensor, keys: Sequence[int]) -> dict[str, torch.Tensor]:
        return {"values": x.to(self.dtype)}

    def _decode_rows(self, parts: Parts, d: int, keys: Sequence[int]) -> torch.Tensor:
        return parts["values"].to(torch.float32)


@CODECS.register("none")
class NoCodec(_Cast):
    """Identity: raw float32 (Q(x) = x)."""

    name, lossy, dtype = "none", False, torch.float32


@CODECS.register("fp16")
class FP16(_Cast):
    """IEEE half: relative error ≤ 2⁻¹¹ for |x| in [6.1e-5, 65504]; overflows above."""

    name, dtype = "fp16", torch.float16


@CODECS.register("bf16")
class BF16(_Cast):
    """bfloat16: float32's range, relative error ≤ 2⁻⁸."""

    name, dtype = "bf16", torch.bfloat16


# ---------------------------------------------------------------------------------------------
# Quantisation


@CODECS.register("int8")
class Int8(Codec):
    """Per-tensor symmetric int8: s = max_j |x_j| / 127, q = round(x/s) ∈ [−127, 127], Q = s·q.

    Deterministic rounding (default, |Q(x) − x| ≤ s/2 per coordinate) or, with
    ``stochastic=True``, q = ⌊x/s + u⌋ with u ~ U[0, 1) from the message generator (unbiased,
    |Q(x) − x| < s). An all-zero vector has s = 0 and decodes to zeros."""

    name = "int8"

    def __init__(self, *, ratio: float = 0.01, seed: int = 0, stochastic: bool = False) -> None:
        super().__init__(ratio=ratio, seed=seed)
        self.stochastic = stochastic

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"scale": (torch.float32, 1), "values": (torch.int8, d)}

    def _encode_rows(self, x: torch.Tensor, keys: Sequence[int]) -> dict[str, torch.Tensor]:
        lo, hi = torch.aminmax(x, dim=1, keepdim=True)
        scale = torch.maximum(hi, lo.neg()) / 127
        y = x / torch.where(scale > 0, scale, torch.ones_like(scale))
        if self.stochastic:
            for r, key in enumerate(keys):
                noise = torch.rand(x.shape[1], generator=message_generator(self.seed, key))
                y[r].add_(noise)
            y.floor_()
        else:
            y.round_()
        return {"scale": scale, "values": y.clamp_(-127, 127).to(torch.int8)}

    def _decode_rows(self, parts: Parts, d: int, keys: Sequence[int]) -> torch.Tensor:
        return parts["values"].to(torch.float32).mul_(parts["scale"])

    def _check_values(self, parts: Parts, d: int) -> None:
        check_scale(self.name, parts)


@CODECS.register("sign")
class Sign(Codec):
    """1 bit per coordinate plus the ℓ₁ scale: Q(x) = (‖x‖₁/d)·sign(x), sign(0) = +1.

    ‖x‖₁ is accumulated in float64 and rounded to float32, so the scale does not depend on how
    torch splits the reduction (1-D vs row-batched, thread count) except in astronomically rare
    float32 rounding ties."""

    name = "sign"

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"scale": (torch.float32, 1), "bits": (torch.uint8, -(-d // 8))}

    def _encode_rows(self, x: torch.Tensor, keys: Sequence[int]) -> dict[str, torch.Tensor]:
        k, d = x.shape
        positive = (x >= 0).to(torch.uint8)
        if d % 8:
            positive = torch.nn.functional.pad(positive, (0, 8 - d % 8))
        flags = positive.reshape(k, -1, 8)
        bits = flags[:, :, 0].clone()
        for i in range(1, 8):  # one strided pass per bit beats a sum over a size-8 dimension
            bits |= flags[:, :, i] << i
        scale = x.abs().sum(dim=1, keepdim=True, dtype=torch.float64).div_(d).to(torch.float32)
        return {"scale": scale, "bits": bits}

    def _decode_rows(self, parts: Parts, d: int, keys: Sequence[int]) -> torch.Tensor:
        bits, scale = parts["bits"], parts["scale"]
        k, nb = bits.shape
        out = torch.empty(k, nb, 8)
        for i in range(8):  # one strided pass per bit beats broadcasting over a size-8 dim
            out[:, :, i] = (bits >> i) & 1
        return out.reshape(k, -1)[:, :d].mul_(2).sub_(1).mul_(scale)  # ±1 · s, exact

    def _check_values(self, parts: Parts, d: int) -> None:
        check_scale(self.name, parts)


QSGD_MAX_LEVELS = 32767  # signed levels travel as int8 up to 127, as int16 up to this


@CODECS.register("qsgd")
class QSGD(Codec):
    """QSGD with s levels (Alistarh et al., NeurIPS 2017), in the form of the CHOCO-SGD code
    (Koloskova et al. 2019, `convex_code` ``qsgd_quantize``; docs/algorithms.md#compression-codecs):

        ℓ_j = ⌊s|x_j|/‖x‖₂⌋ + [u_j < frac(s|x_j|/‖x‖₂)],  u_j ~ U[0, 1) from the message generator
        Q(x)_j = τ · sign(x_j) · ‖x‖₂ · ℓ_j / s

    ℓ_j ∈ [0, s] is |x_j|/‖x‖₂ rounded stochastically to the grid {0, 1/s, …, 1}, so without τ
    (``unbiased=True``: τ = 1) E[Q(x)] = x. The default is the *biased*, variance-reduced version
    CHOCO runs (``is_biased``): τ = 1/(1 + min(d/s², √d/s)), the inverse of QSGD's variance bound
    1 + min(d/s², √d/s) (QSGD Lemma 3.1), which makes Q a δ-compressor E‖Q(x) − x‖² ≤ (1 − τ)‖x‖²
    as CHOCO's analysis needs; E[Q(x)] = τ x. ``levels`` s ∈ [1, 32767] (config
    ``compression.levels``, default 16: the convex code's "4-bit"; the deep-learning code's
    ``quantize_level`` b bits means s = 2^b − 1).

    Wire: ``scale`` fp32 [1] = τ‖x‖₂/s, then ``levels`` [d] = sign(x_j)·ℓ_j as int8 when s ≤ 127,
    int16 otherwise; decode is ``levels · scale`` (one float32 product per coordinate, so the
    receiver does not need to know τ). ‖x‖₂ is accumulated in float64 and rounded to float32 (as
    `Sign`'s ℓ₁ norm), and τ/s is applied in float64: the batched and per-row paths agree bitwise.
    An all-zero vector has scale 0 and decodes to zeros. A receiver rejects |level| > s."""

    name = "qsgd"
    takes_levels = True

    def __init__(
        self, *, ratio: float = 0.01, seed: int = 0, levels: int = 16, unbiased: bool = False
    ) -> None:
        super().__init__(ratio=ratio, seed=seed)
        if isinstance(levels, bool) or not isinstance(levels, int):
            raise ValueError(
                f"qsgd levels (compression.levels) must be an integer in [1, {QSGD_MAX_LEVELS}]; "
                f"got {levels!r}"
            )
        if not 1 <= levels <= QSGD_MAX_LEVELS:
            raise ValueError(
                f"qsgd levels (compression.levels) must be in [1, {QSGD_MAX_LEVELS}] (signed "
                f"levels travel as int8 up to 127, int16 above); got {levels}"
            )
        self.levels = levels
        self.unbiased = bool(unbiased)
        self.level_dtype = torch.int8 if levels <= 127 else torch.int16

    def __repr__(self) -> str:
        return f"QSGD(levels={self.levels}, unbiased={self.unbiased}, seed={self.seed})"

    def tau(self, d: int) -> float:
        """The scaling τ of a d-vector: 1 unbiased, else 1/(1 + min(d/s², √d/s))."""
        if self.unbiased:
            return 1.0
        s = self.levels
        return 1.0 / (1.0 + min(d / s**2, math.sqrt(d) / s))

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"scale": (torch.float32, 1), "levels": (self.level_dtype, d)}

    def _encode_rows(self, x: torch.Tensor, keys: Sequence[int]) -> dict[str, torch.Tensor]:
        k, d = x.shape
        s = self.levels
        # squares in float64: a float32 square overflows to inf above |x| ≈ 1.8e19
        norm = x.double().square_().sum(dim=1, keepdim=True).sqrt_()
        norm32 = norm.to(torch.float32)
        y = x.abs().div_(torch.where(norm32 > 0, norm32, torch.ones_like(norm32))).mul_(s)
        level = y.floor()
        frac = y.sub_(level)
        u = torch.empty(k, d)
        for r, key in enumerate(keys):
            torch.rand(d, generator=message_generator(self.seed, key), out=u[r])
        level.add_(u.lt_(frac)).clamp_(0, s)  # ≤ s: guards round-off of |x_j|/‖x‖₂ above 1
        signed = torch.where(x < 0, level.neg(), level).to(self.level_dtype)
        scale = norm32.double().mul_(self.tau(d) / s).to(torch.float32)
        return {"scale": scale, "levels": signed}

    def _decode_rows(self, parts: Parts, d: int, keys: Sequence[int]) -> torch.Tensor:
        return parts["levels"].to(torch.float32).mul_(parts["scale"])

    def _check_values(self, parts: Parts, d: int) -> None:
        check_scale(self.name, parts)
        lo, hi = torch.aminmax(parts["levels"])
        s = self.levels
        if int(lo) < -s or int(hi) > s:
            bad = int(lo) if int(lo) < -s else int(hi)
            raise CodecError(f"qsgd: level {bad} outside [-{s}, {s}] (levels = {s})")
