"""Casts (none, fp16, bf16) and quantisers (int8, sign); see the table in `core.compress`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from core.compress.base import CODECS, Codec, Parts, check_scale, message_generator

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
