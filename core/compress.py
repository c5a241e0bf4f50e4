"""Compression codecs for gossip tensors, shared by both engines.

A codec turns a float32 vector x ∈ R^d into named flat parts for the wire (`Encoded`) and back.
``decode(encode(x))`` is the compression operator Q of CHOCO-SGD (Koloskova, Stich & Jaggi, ICML
2019); `roundtrip` applies it to all k local rows at once and is **bitwise identical** to the
per-row path, which is what lets the vectorized engine predict real peers exactly.

| codec   | parts on the wire                               | Q(x)                               |
| ------- | ----------------------------------------------- | ---------------------------------- |
| none    | values fp32 [d]                                 | x                                  |
| fp16    | values fp16 [d]                                 | fp32(fp16(x))                      |
| bf16    | values bf16 [d]                                 | fp32(bf16(x))                      |
| int8    | values int8 [d], scale fp32 [1]                 | round(x/s)·s, s = max|x|/127       |
| topk    | values fp32 [m], indices int32 [m]              | x on the m largest |x_j|, 0 else   |
| randomk | values fp32 [m] (indices regenerated from key)  | x on m seeded random coords, 0 else|
| sign    | bits uint8 [⌈d/8⌉], scale fp32 [1]              | (‖x‖₁/d)·sign(x)                   |

m = max(1, round(ratio·d)), ratio ∈ (0, 1]. topk/randomk are the biased (unscaled) versions of
the CHOCO code; sign follows its ℓ₁-scaled variant (ALGORITHMS.md §3.7). Random codecs draw from a
`torch.Generator` seeded with (seed, key), key = `codec_key(sender, round)`, so the receiver
regenerates the indices and nothing random crosses the wire.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.registry import Registry

CODEC_NAMES: tuple[str, ...] = ("none", "fp16", "bf16", "int8", "topk", "randomk", "sign")
LOSSLESS_ENOUGH = ("none", "fp16", "bf16")  # usable without error feedback


class CodecError(ValueError):
    """Malformed encoded input (wrong parts, dtypes, sizes, non-finite scale, bad indices)."""


def codec_key(sender: int, round: int) -> int:
    """Per-(sender, global round) seed of random codecs; both engines use this rule."""
    return sender * 1_000_003 + round


@dataclass(frozen=True)
class Encoded:
    codec: str
    parts: dict[str, torch.Tensor]
    d: int


class Codec(ABC):
    name: str = ""
    lossy: bool = True

    def __init__(self, *, ratio: float = 0.01, seed: int = 0) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"compression ratio must be in (0, 1]; got {ratio}")
        self.ratio = ratio
        self.seed = seed

    def kept(self, d: int) -> int:
        return max(1, round(self.ratio * d))

    @abstractmethod
    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        """Expected dtype and element count of every part for a d-vector."""

    @abstractmethod
    def encode(self, x: torch.Tensor, *, key: int) -> Encoded: ...

    @abstractmethod
    def _decode(self, parts: dict[str, torch.Tensor], d: int, key: int) -> torch.Tensor: ...

    def decode(self, enc: Encoded, *, key: int) -> torch.Tensor:
        specs = self.part_specs(enc.d)
        if enc.codec != self.name:
            raise CodecError(f"{enc.codec!r} payload given to the {self.name!r} codec")
        if set(enc.parts) != set(specs):
            raise CodecError(f"{self.name}: parts {sorted(enc.parts)}, expected {sorted(specs)}")
        for name, (dtype, numel) in specs.items():
            t = enc.parts[name]
            if t.dtype != dtype or t.numel() != numel:
                raise CodecError(
                    f"{self.name}: part {name!r} is {t.dtype}[{t.numel()}], "
                    f"expected {dtype}[{numel}]"
                )
        return self._decode(enc.parts, enc.d, key)

    def roundtrip(self, x: torch.Tensor, *, keys: Sequence[int]) -> torch.Tensor:
        """Q applied to every row of x [k, d] (default: row by row)."""
        return torch.stack(
            [self.decode(self.encode(row, key=kk), key=kk) for row, kk in zip(x, keys, strict=True)]
        )

    def wire_bytes(self, d: int) -> int:
        return sum(
            n * torch.empty(0, dtype=dt).element_size() for dt, n in self.part_specs(d).values()
        )


CODECS: Registry[type[Codec]] = Registry("codec")


def make_codec(name: str, *, ratio: float = 0.01, seed: int = 0) -> Codec:
    return CODECS.get(name)(ratio=ratio, seed=seed)


class _Cast(Codec):
    dtype: torch.dtype = torch.float32

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"values": (self.dtype, d)}

    def encode(self, x: torch.Tensor, *, key: int) -> Encoded:
        return Encoded(self.name, {"values": x.detach().reshape(-1).to(self.dtype)}, x.numel())

    def _decode(self, parts: dict[str, torch.Tensor], d: int, key: int) -> torch.Tensor:
        return parts["values"].to(torch.float32)

    def roundtrip(self, x: torch.Tensor, *, keys: Sequence[int]) -> torch.Tensor:
        return x.to(self.dtype).to(torch.float32)


@CODECS.register("none")
class NoCodec(_Cast):
    name, lossy, dtype = "none", False, torch.float32

    def roundtrip(self, x: torch.Tensor, *, keys: Sequence[int]) -> torch.Tensor:
        return x


@CODECS.register("fp16")
class FP16(_Cast):
    name, dtype = "fp16", torch.float16


@CODECS.register("bf16")
class BF16(_Cast):
    name, dtype = "bf16", torch.bfloat16


def _check_scale(name: str, scale: torch.Tensor) -> float:
    value = float(scale[0])
    if not torch.isfinite(scale).all() or value < 0:
        raise CodecError(f"{name}: scale {value} must be finite and ≥ 0")
    return value


@CODECS.register("int8")
class Int8(Codec):
    name = "int8"

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"values": (torch.int8, d), "scale": (torch.float32, 1)}

    @staticmethod
    def _quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = x.abs().amax(dim=-1, keepdim=True) / 127
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(x / safe).clamp_(-127, 127).to(torch.int8)
        return q, scale

    def encode(self, x: torch.Tensor, *, key: int) -> Encoded:
        q, scale = self._quantise(x.detach().reshape(-1).to(torch.float32))
        return Encoded(self.name, {"values": q, "scale": scale.reshape(1)}, x.numel())

    def _decode(self, parts: dict[str, torch.Tensor], d: int, key: int) -> torch.Tensor:
        scale = _check_scale(self.name, parts["scale"])
        return parts["values"].to(torch.float32) * scale

    def roundtrip(self, x: torch.Tensor, *, keys: Sequence[int]) -> torch.Tensor:
        q, scale = self._quantise(x.to(torch.float32))
        return q.to(torch.float32) * scale


@CODECS.register("topk")
class TopK(Codec):
    name = "topk"

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        m = self.kept(d)
        return {"values": (torch.float32, m), "indices": (torch.int32, m)}

    def encode(self, x: torch.Tensor, *, key: int) -> Encoded:
        flat = x.detach().reshape(-1).to(torch.float32)
        idx = torch.topk(flat.abs(), self.kept(flat.numel()), sorted=False).indices
        idx = idx.sort().values
        return Encoded(
            self.name, {"values": flat[idx], "indices": idx.to(torch.int32)}, flat.numel()
        )

    def _decode(self, parts: dict[str, torch.Tensor], d: int, key: int) -> torch.Tensor:
        idx = parts["indices"].to(torch.int64)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= d):
            raise CodecError(f"topk: indices outside [0, {d})")
        out = torch.zeros(d)
        out[idx] = parts["values"]
        return out

    def roundtrip(self, x: torch.Tensor, *, keys: Sequence[int]) -> torch.Tensor:
        x = x.to(torch.float32)
        idx = torch.topk(x.abs(), self.kept(x.shape[1]), dim=1, sorted=False).indices
        return torch.zeros_like(x).scatter_(1, idx, x.gather(1, idx))


@CODECS.register("randomk")
class RandomK(Codec):
    name = "randomk"

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"values": (torch.float32, self.kept(d))}

    def indices(self, d: int, key: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + key) % (2**63))
        return torch.randperm(d, generator=gen)[: self.kept(d)].sort().values

    def encode(self, x: torch.Tensor, *, key: int) -> Encoded:
        flat = x.detach().reshape(-1).to(torch.float32)
        return Encoded(self.name, {"values": flat[self.indices(flat.numel(), key)]}, flat.numel())

    def _decode(self, parts: dict[str, torch.Tensor], d: int, key: int) -> torch.Tensor:
        out = torch.zeros(d)
        out[self.indices(d, key)] = parts["values"]
        return out


@CODECS.register("sign")
class Sign(Codec):
    name = "sign"
    _weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)

    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        return {"bits": (torch.uint8, -(-d // 8)), "scale": (torch.float32, 1)}

    def _pack(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = x.shape[-1]
        pad = -d % 8
        positive = (x >= 0).to(torch.uint8)
        if pad:
            positive = torch.nn.functional.pad(positive, (0, pad))
        bits = (positive.reshape(*x.shape[:-1], -1, 8) * self._weights).sum(-1, dtype=torch.uint8)
        scale = x.abs().sum(-1, keepdim=True) / d
        return bits, scale

    def _unpack(self, bits: torch.Tensor, scale: torch.Tensor, d: int) -> torch.Tensor:
        positive = (bits.unsqueeze(-1) & self._weights) > 0
        signs = positive.reshape(*bits.shape[:-1], -1)[..., :d].to(torch.float32) * 2 - 1
        return signs * scale

    def encode(self, x: torch.Tensor, *, key: int) -> Encoded:
        bits, scale = self._pack(x.detach().reshape(-1).to(torch.float32))
        return Encoded(self.name, {"bits": bits, "scale": scale.reshape(1)}, x.numel())

    def _decode(self, parts: dict[str, torch.Tensor], d: int, key: int) -> torch.Tensor:
        _check_scale(self.name, parts["scale"])
        return self._unpack(parts["bits"], parts["scale"], d)

    def roundtrip(self, x: torch.Tensor, *, keys: Sequence[int]) -> torch.Tensor:
        bits, scale = self._pack(x.to(torch.float32))
        return self._unpack(bits, scale, x.shape[-1])
