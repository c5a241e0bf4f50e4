"""Codec interface, wire container, message keys and the codec registry (see
`concord.core.compress`)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from concord.core.plugins import PluginError, is_spec, resolve
from concord.core.registry import Registry
from concord.core.specs import CODEC_SPECS
from concord.errors import CodecError as CodecError

MAX_SENDERS = 1 << 16  # codec_key packs sender ids below this (config allows ≤ 4096 peers)
_MASK64 = (1 << 64) - 1

Parts = Mapping[str, torch.Tensor]


def codec_key(sender: int, round: int) -> int:
    """Per-(sender, global gossip round) key of a message; distinct for every pair.

    Both engines and both ends of an edge use this rule, so they seed random codecs alike."""
    if not 0 <= sender < MAX_SENDERS:
        raise ValueError(f"codec_key: sender {sender} outside [0, {MAX_SENDERS})")
    if round < 0:
        raise ValueError(f"codec_key: round {round} must be ≥ 0")
    return round * MAX_SENDERS + sender


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def message_generator(seed: int, key: int) -> torch.Generator:
    """The CPU generator of message ``key`` under codec ``seed`` (well mixed, 63-bit seed)."""
    mixed = _splitmix64(_splitmix64(seed & _MASK64) ^ (key & _MASK64))
    return torch.Generator().manual_seed(mixed >> 1)


@dataclass(frozen=True)
class Encoded:
    """One encoded d-vector: named flat parts (1-D tensors) in wire order."""

    codec: str
    parts: dict[str, torch.Tensor]
    d: int  # length of the decoded vector

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts.values())


class Codec(ABC):
    """Compression operator Q with its wire format. Subclasses implement the row-batched kernels
    ``_encode_rows`` (x [k, d] float32 → parts [k, numel]) and ``_decode_rows`` (the inverse)."""

    name: ClassVar[str]
    lossy: ClassVar[bool] = True
    takes_levels: ClassVar[bool] = False  # the constructor takes ``levels`` and ``unbiased``

    def __init__(self, *, ratio: float = 0.01, seed: int = 0) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, int | float):
            raise ValueError(f"compression ratio must be a number in (0, 1]; got {ratio!r}")
        if not (math.isfinite(ratio) and 0 < ratio <= 1):
            raise ValueError(f"compression ratio must be in (0, 1]; got {ratio!r}")
        self.ratio = float(ratio)
        self.seed = int(seed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ratio={self.ratio}, seed={self.seed})"

    def kept(self, d: int) -> int:
        """m, the coordinates topk/randomk keep of a d-vector (1 ≤ m ≤ d)."""
        return max(1, round(self.ratio * d))

    @abstractmethod
    def part_specs(self, d: int) -> dict[str, tuple[torch.dtype, int]]:
        """Expected dtype and element count of every part for a d-vector, in wire order."""

    @abstractmethod
    def _encode_rows(self, x: torch.Tensor, keys: Sequence[int]) -> dict[str, torch.Tensor]: ...

    @abstractmethod
    def _decode_rows(self, parts: Parts, d: int, keys: Sequence[int]) -> torch.Tensor: ...

    def _check_values(self, parts: Parts, d: int) -> None:  # noqa: B027 - optional hook
        """Codec-specific checks of well-shaped parts (scales, indices); raise CodecError."""

    def encode(self, x: torch.Tensor, *, key: int) -> Encoded:
        """Encode a 1-D float vector [d] (cast to float32). Parts may share memory with x."""
        if x.dim() != 1:
            raise ValueError(f"{self.name}.encode takes a 1-D vector; got shape {tuple(x.shape)}")
        row = float_rows(x.reshape(1, -1), self.name)
        parts = self._encode_rows(row, [key])
        return Encoded(self.name, {n: p.reshape(-1) for n, p in parts.items()}, row.shape[1])

    def decode(self, enc: Encoded, *, key: int) -> torch.Tensor:
        """float32 [enc.d]; raises CodecError naming the problem if ``enc`` is malformed."""
        d = self._check_encoded(enc)
        rows = {n: t.reshape(1, -1) for n, t in enc.parts.items()}
        return self._decode_rows(rows, d, [key])[0]

    def roundtrip(self, x: torch.Tensor, *, keys: Sequence[int]) -> torch.Tensor:
        """decode(encode(x_r, key=keys[r])) for every row of x [k, d], batched; float32 [k, d]."""
        if x.dim() != 2:
            raise ValueError(f"{self.name}.roundtrip takes rows [k, d]; got {tuple(x.shape)}")
        if len(keys) != x.shape[0]:
            raise ValueError(f"{self.name}.roundtrip: {len(keys)} keys for {x.shape[0]} rows")
        rows = float_rows(x, self.name)
        return self._decode_rows(self._encode_rows(rows, keys), rows.shape[1], keys)

    def wire_bytes(self, d: int) -> int:
        """Exact bytes of all parts of an encoded d-vector."""
        return sum(n * dtype.itemsize for dtype, n in self.part_specs(d).values())

    def _check_encoded(self, enc: Encoded) -> int:
        name = self.name
        if enc.codec != name:
            raise CodecError(f"{enc.codec!r} payload given to the {name!r} codec")
        d = enc.d
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise CodecError(f"{name}: d = {d!r}; expected a positive int")
        specs = self.part_specs(d)
        expected = ", ".join(specs)
        for part in enc.parts:
            if part not in specs:
                raise CodecError(f"{name}: unknown part {part!r} (expected parts: {expected})")
        for part, (dtype, numel) in specs.items():
            t = enc.parts.get(part)
            if t is None:
                raise CodecError(f"{name}: missing part {part!r} (expected parts: {expected})")
            if not isinstance(t, torch.Tensor):
                raise CodecError(f"{name}: part {part!r} is a {type(t).__name__}, not a tensor")
            if t.dtype != dtype:
                raise CodecError(f"{name}: part {part!r} has dtype {t.dtype}; expected {dtype}")
            if t.dim() != 1 or t.numel() != numel:
                raise CodecError(
                    f"{name}: part {part!r} has shape {list(t.shape)}; expected [{numel}] "
                    f"for d = {d}"
                )
        self._check_values(enc.parts, d)
        return d


def float_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    if not x.is_floating_point():
        raise ValueError(f"{name}: codecs encode floating-point tensors; got {x.dtype}")
    if x.shape[1] < 1:
        raise ValueError(f"{name}: cannot encode an empty vector (d = 0)")
    return x.detach().to(torch.float32)


def check_scale(name: str, parts: Parts) -> None:
    value = float(parts["scale"][0])
    if not math.isfinite(value):
        raise CodecError(f"{name}: scale {value} is not finite")
    if value < 0:
        raise CodecError(f"{name}: scale {value} is negative")


CODEC_NAMES: tuple[str, ...] = tuple(CODEC_SPECS)  # the built-in codecs (the spec table)
CODECS: Registry[type[Codec]] = Registry("codec", CODEC_SPECS)


def make_codec(
    name: str, *, ratio: float = 0.01, seed: int = 0, levels: int = 16, unbiased: bool = False
) -> Codec:
    """The codec registered as ``name`` (see `CODEC_NAMES`) or a user's ``"module:Class"`` (a
    `Codec` subclass, `concord.core.plugins`). ``levels`` and ``unbiased`` go to codecs that
    declare ``takes_levels`` (`concord.core.compress.quantize.QSGD`)."""
    cls = CODECS.get(name) if name in CODECS or not is_spec(name) else plugin_codec(name)
    if cls.takes_levels:
        return cls(ratio=ratio, seed=seed, levels=levels, unbiased=unbiased)  # type: ignore[call-arg]
    return cls(ratio=ratio, seed=seed)


def plugin_codec(name: str) -> type[Codec]:
    """The `Codec` subclass a ``"module:Class"`` names (`PluginError` if it is not one), named
    ``name``: encoded payloads name their codec as the config does."""
    if name not in _PLUGINS:
        cls = resolve(name, "codec")
        if not (isinstance(cls, type) and issubclass(cls, Codec)):
            raise PluginError(
                f"codec {name!r}: {cls!r} is not a concord.core.compress.Codec subclass"
            )
        _PLUGINS[name] = cls if getattr(cls, "name", None) == name else _renamed(cls, name)
    return _PLUGINS[name]


def _renamed(cls: type[Codec], name: str) -> type[Codec]:
    return type(cls.__name__, (cls,), {"name": name, "__module__": cls.__module__})


_PLUGINS: dict[str, type[Codec]] = {}
