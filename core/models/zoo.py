"""Built-in replica-batched architectures and the model registry.

Names (``MODEL_NAMES``) and their options (all optional):

* ``mlp`` — fully connected ReLU/tanh network on the flattened input.
  ``hidden``: list of positive ints (default ``[256, 256]``; ``[]`` gives a linear model),
  ``activation``: ``"relu"`` (default) or ``"tanh"``.
* ``cnn1d`` — the MNIST-1D CNN of Greydanus 2020 ("Scaling down deep learning", ``ConvBase``):
  three Conv1d layers (kernel 5/3/3, stride 2, padding 1, ReLU) and a linear head. Input shape
  ``(L,)`` or ``(C, L)``. ``width``: channels per conv layer, ≥ 1 (default 25 as in the paper).
* ``cnn`` — small 2-D CNN for 8×8 digits and 32×32 CIFAR: ``blocks`` × (Conv3×3 pad 1 → ReLU →
  MaxPool 2), channels ``width·2^i`` in block i, then a linear head. Input shape ``(H, W)`` or
  ``(C, H, W)``. ``width`` ≥ 1 (default 32); ``blocks`` ≥ 1 (default: 2 if min(H, W) < 16 else 3;
  needs min(H, W) ≥ 2^blocks).
* ``resnet20`` — ResNet-20 for CIFAR (He et al. 2016, §4.2): 3×3 stem conv, 3 stages × 3 basic
  blocks with 16/32/64 × ``width`` channels (stride 2 entering stages 2 and 3), global average pool,
  linear head; convolutions have no bias. Input shape ``(C, H, W)``. Options:
  ``width`` integer factor ≥ 1 (default 1);
  ``norm``: ``"bn"`` (BatchNorm, default) or ``"gn"`` (GroupNorm);
  ``gn_groups``: groups per GroupNorm layer, must divide 16·width (default 2, as used with GN in the
  EPFL decentralized-learning code, ``group_norm_num_groups``);
  ``shortcut``: ``"b"`` (default; 1×1 conv + norm projection where the shape changes — the
  ``downsample`` of the Koloskova/Lin/Vogels code base used by Consensus Control and RelaySGD) or
  ``"a"`` (He et al.'s parameter-free CIFAR option: subsample and zero-pad channels).
* ``char-transformer`` — a small causal transformer for next-character prediction (input
  ``(context,)`` of character codes); options ``layers`` (2), ``width`` (128), ``heads`` (4, must
  divide width). See :mod:`concord.core.models.transformer`.

Every model draws its initial weights with PyTorch's default initialisation (see
:meth:`ReplicaModel.reset_parameters`), not with the custom schemes of the cited code bases.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's universal alias)
from torch import Tensor, nn

from concord.core.models.layers import (
    ReplicaBatchNorm,
    ReplicaConv1d,
    ReplicaConv2d,
    ReplicaGroupNorm,
    ReplicaLinear,
    ReplicaModel,
    flatten_features,
    fold,
)
from concord.core.models.transformer import build_char_transformer
from concord.core.registry import Registry
from concord.core.specs import MODEL_SPECS

ModelBuilder = Callable[..., ReplicaModel]
MODELS: Registry[ModelBuilder] = Registry("model", MODEL_SPECS)

_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "tanh": torch.tanh}


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"option {name} must be an integer >= 1, got {value!r}")
    return value


def _choice(name: str, value: object, valid: Sequence[str]) -> str:
    if value not in valid:
        raise ValueError(f"option {name}={value!r} is not valid; choose one of {', '.join(valid)}")
    return str(value)


def _conv_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


# ----------------------------------------------------------------------------------------- mlp


class ReplicaMLP(ReplicaModel):
    """``[k, B, *input_shape]`` → flatten → (Linear → activation)* → Linear."""

    def __init__(
        self,
        k: int,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        arch: str,
        hidden: tuple[int, ...],
        activation: str,
    ) -> None:
        super().__init__(k, input_shape=input_shape, num_classes=num_classes, arch=arch)
        widths = [math.prod(input_shape), *hidden, num_classes]
        self.layers = nn.ModuleList(ReplicaLinear(k, a, b) for a, b in itertools.pairwise(widths))
        self.activation = _ACTIVATIONS[activation]

    def _forward(self, x: Tensor) -> Tensor:
        h = x.reshape(self.k, x.shape[1], -1)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(self.layers) - 1:
                h = self.activation(h)
        return h


@MODELS.register("mlp")
def _build_mlp(
    k: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    arch: str,
    *,
    hidden: Sequence[int] = (256, 256),
    activation: str = "relu",
) -> ReplicaModel:
    if isinstance(hidden, str | bytes) or not isinstance(hidden, Sequence):
        raise ValueError(f"option hidden must be a list of positive ints, got {hidden!r}")
    widths = tuple(_positive_int("hidden[]", h) for h in hidden)
    _choice("activation", activation, sorted(_ACTIVATIONS))
    return ReplicaMLP(
        k,
        input_shape=input_shape,
        num_classes=num_classes,
        arch=arch,
        hidden=widths,
        activation=activation,
    )


# --------------------------------------------------------------------------------------- cnn1d


class ReplicaCNN1d(ReplicaModel):
    """Greydanus' MNIST-1D ``ConvBase``: 3 × (Conv1d stride 2 pad 1 → ReLU), linear head."""

    kernels = (5, 3, 3)

    def __init__(
        self,
        k: int,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        arch: str,
        width: int,
    ) -> None:
        super().__init__(k, input_shape=input_shape, num_classes=num_classes, arch=arch)
        channels, length = (1, input_shape[0]) if len(input_shape) == 1 else input_shape
        convs = []
        for kernel in self.kernels:
            convs.append(ReplicaConv1d(k, channels, width, kernel, stride=2, padding=1))
            channels, length = width, _conv_out(length, kernel, 2, 1)
        if length < 1:
            raise ValueError(
                f"input_shape={input_shape} is too short for cnn1d (3 stride-2 convolutions); "
                "need length >= 3"
            )
        self.convs = nn.ModuleList(convs)
        self.head = ReplicaLinear(k, width * length, num_classes)
        self._in_channels = 1 if len(input_shape) == 1 else input_shape[0]

    def _forward(self, x: Tensor) -> Tensor:
        # channels-last [k, B, L, C] throughout (see ReplicaConv1d.forward_channels_last)
        h = x.reshape(self.k, x.shape[1], self._in_channels, x.shape[-1]).transpose(2, 3)
        for conv in self.convs:
            h = F.relu(conv.forward_channels_last(h))  # type: ignore[operator]
        # per replica, features in torch.flatten order of [C, L] (as the reference ConvBase)
        out: torch.Tensor = self.head(h.transpose(2, 3).reshape(self.k, x.shape[1], -1))
        return out


@MODELS.register("cnn1d")
def _build_cnn1d(
    k: int, input_shape: tuple[int, ...], num_classes: int, arch: str, *, width: int = 25
) -> ReplicaModel:
    if len(input_shape) not in (1, 2):
        raise ValueError(f"cnn1d needs input_shape (L,) or (C, L), got {input_shape}")
    return ReplicaCNN1d(
        k,
        input_shape=input_shape,
        num_classes=num_classes,
        arch=arch,
        width=_positive_int("width", width),
    )


# ----------------------------------------------------------------------------------------- cnn


class ReplicaCNN(ReplicaModel):
    """``blocks`` × (Conv2d 3×3 pad 1 → ReLU → MaxPool 2), channels ``width·2^i``, linear head."""

    def __init__(
        self,
        k: int,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        arch: str,
        width: int,
        blocks: int,
    ) -> None:
        super().__init__(k, input_shape=input_shape, num_classes=num_classes, arch=arch)
        channels, height, wide = (1, *input_shape) if len(input_shape) == 2 else input_shape
        self._in_channels = channels
        convs = []
        for i in range(blocks):
            convs.append(ReplicaConv2d(k, channels, width * 2**i, 3, padding=1))
            channels, height, wide = width * 2**i, height // 2, wide // 2
        self.convs = nn.ModuleList(convs)
        self.head = ReplicaLinear(k, channels * height * wide, num_classes)

    def _forward(self, x: Tensor) -> Tensor:
        h = fold(x.reshape(self.k, x.shape[1], self._in_channels, *x.shape[-2:]))
        for conv in self.convs:
            h = F.max_pool2d(F.relu(conv(h)), 2)
        out: torch.Tensor = self.head(flatten_features(h, self.k))
        return out


@MODELS.register("cnn")
def _build_cnn(
    k: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    arch: str,
    *,
    width: int = 32,
    blocks: int | None = None,
) -> ReplicaModel:
    if len(input_shape) not in (2, 3):
        raise ValueError(f"cnn needs input_shape (H, W) or (C, H, W), got {input_shape}")
    side = min(input_shape[-2:])
    n_blocks = (2 if side < 16 else 3) if blocks is None else _positive_int("blocks", blocks)
    if side < 2**n_blocks:
        raise ValueError(
            f"cnn with blocks={n_blocks} needs height and width >= {2**n_blocks}, "
            f"got input_shape={input_shape}"
        )
    return ReplicaCNN(
        k,
        input_shape=input_shape,
        num_classes=num_classes,
        arch=arch,
        width=_positive_int("width", width),
        blocks=n_blocks,
    )


# ------------------------------------------------------------------------------------ resnet20


class _ZeroPadShortcut(nn.Module):
    """He et al.'s option A on the folded layout: ``h[..., ::s, ::s]``, zero-pad each replica's
    channels from ``cin`` to ``cout`` (half before, half after)."""

    def __init__(self, k: int, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.k, self.cin, self.cout, self.stride = k, cin, cout, stride

    def forward(self, h: Tensor) -> Tensor:
        h = h[:, :, :: self.stride, :: self.stride]
        b, _, height, wide = h.shape
        lo = (self.cout - self.cin) // 2
        hi = self.cout - self.cin - lo
        h = F.pad(h.reshape(b, self.k, self.cin, height, wide), (0, 0, 0, 0, lo, hi))
        return h.reshape(b, self.k * self.cout, height, wide)


class _BasicBlock(nn.Module):
    """conv3×3 → norm → ReLU → conv3×3 → norm, plus shortcut, then ReLU (He et al. 2016)."""

    def __init__(
        self,
        k: int,
        cin: int,
        cout: int,
        stride: int,
        norm: Callable[[int], nn.Module],
        shortcut: str,
    ) -> None:
        super().__init__()
        self.conv1 = ReplicaConv2d(k, cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm1 = norm(cout)
        self.conv2 = ReplicaConv2d(k, cout, cout, 3, padding=1, bias=False)
        self.norm2 = norm(cout)
        self.shortcut: nn.Module
        if stride == 1 and cin == cout:
            self.shortcut = nn.Identity()
        elif shortcut == "b":
            self.shortcut = nn.Sequential(
                ReplicaConv2d(k, cin, cout, 1, stride=stride, bias=False), norm(cout)
            )
        else:
            self.shortcut = _ZeroPadShortcut(k, cin, cout, stride)

    def forward(self, h: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(h)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(h))


class ReplicaResNet20(ReplicaModel):
    """ResNet-20 (He et al. 2016) for k replicas; see the module docstring for the options."""

    def __init__(
        self,
        k: int,
        *,
        input_shape: tuple[int, ...],
        num_classes: int,
        arch: str,
        width: int,
        norm: str,
        gn_groups: int,
        shortcut: str,
    ) -> None:
        super().__init__(k, input_shape=input_shape, num_classes=num_classes, arch=arch)

        def make_norm(channels: int) -> nn.Module:
            if norm == "bn":
                return ReplicaBatchNorm(k, channels)
            return ReplicaGroupNorm(k, gn_groups, channels)

        planes = [16 * width, 32 * width, 64 * width]
        self.conv = ReplicaConv2d(k, input_shape[0], planes[0], 3, padding=1, bias=False)
        self.norm = make_norm(planes[0])
        stages = []
        cin = planes[0]
        for s, cout in enumerate(planes):
            blocks = []
            for b in range(3):
                stride = 2 if s > 0 and b == 0 else 1
                blocks.append(_BasicBlock(k, cin, cout, stride, make_norm, shortcut))
                cin = cout
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.head = ReplicaLinear(k, planes[-1], num_classes)

    def _forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.norm(self.conv(fold(x))))
        h = self.stages(h).mean(dim=(2, 3))  # global average pool: [B, k·C]
        out: torch.Tensor = self.head(flatten_features(h, self.k))
        return out


@MODELS.register("resnet20")
def _build_resnet20(
    k: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    arch: str,
    *,
    width: int = 1,
    norm: str = "bn",
    gn_groups: int = 2,
    shortcut: str = "b",
) -> ReplicaModel:
    if len(input_shape) != 3:
        raise ValueError(f"resnet20 needs input_shape (C, H, W), got {input_shape}")
    width = _positive_int("width", width)
    _choice("norm", norm, ("bn", "gn"))
    _choice("shortcut", shortcut, ("a", "b"))
    gn_groups = _positive_int("gn_groups", gn_groups)
    if norm == "gn" and (16 * width) % gn_groups:
        raise ValueError(
            f"option gn_groups={gn_groups} must divide the narrowest layer's {16 * width} channels "
            f"(16 × width={width})"
        )
    return ReplicaResNet20(
        k,
        input_shape=input_shape,
        num_classes=num_classes,
        arch=arch,
        width=width,
        norm=norm,
        gn_groups=gn_groups,
        shortcut=shortcut,
    )


MODELS.add("char-transformer", build_char_transformer)  # concord.core.models.transformer

MODEL_NAMES: tuple[str, ...] = tuple(MODELS.names())
