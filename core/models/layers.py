"""Replica-batched layers: one module holds k independent replicas of a layer.

Every parameter has a leading replica dimension k (``weight[i]`` is replica i's weight), and the k
forward/backward passes run as single batched kernels, with no Python loop over replicas:

* convolutions are grouped convolutions with ``groups = k`` (Krizhevsky et al. 2012 introduced
  grouped convolutions; here each group is one replica);
* linear layers are one batched matrix product (``torch.baddbmm``);
* BatchNorm over the k·C folded channels computes exactly per-replica statistics (Ioffe & Szegedy
  2015), GroupNorm with G groups per replica is GroupNorm with k·G groups (Wu & He 2018).

Activation layouts (the invariants every layer relies on):

* dense activations: ``[k, B, F]`` (replica first);
* convolutional activations: ``[B, k·C, *S]`` — replicas are *folded into channels*, replica i
  owns channels ``i·C … (i+1)·C − 1``. :func:`fold` / :func:`unfold` convert between
  ``[k, B, C, *S]`` and this layout, :func:`flatten_features` goes from it to dense
  ``[k, B, C·prod(S)]`` in the same channel-major order as ``torch.flatten`` on one replica's
  ``[B, C, *S]``.

Initialisation: :meth:`ReplicaLayer.reset_parameters` draws **one** replica's values from a
``torch.Generator`` with PyTorch's default initialisation for that layer type and copies them to all
k replicas, so the result does not depend on k (decentralized runs start from a common x⁰).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's universal alias)
from torch import Tensor, nn

__all__ = [
    "ReplicaBatchNorm",
    "ReplicaConv1d",
    "ReplicaConv2d",
    "ReplicaGroupNorm",
    "ReplicaLayer",
    "ReplicaLinear",
    "ReplicaModel",
    "flatten_features",
    "fold",
    "unfold",
]


def fold(x: Tensor) -> Tensor:
    """``[k, B, C, *S]`` → ``[B, k·C, *S]`` (replicas folded into channels; copies)."""
    k, b, c = x.shape[:3]
    return x.transpose(0, 1).reshape(b, k * c, *x.shape[3:])


def unfold(h: Tensor, k: int) -> Tensor:
    """``[B, k·C, *S]`` → ``[k, B, C, *S]`` (a view)."""
    b, kc = h.shape[:2]
    return h.view(b, k, kc // k, *h.shape[2:]).transpose(0, 1)


def flatten_features(h: Tensor, k: int) -> Tensor:
    """``[B, k·C, *S]`` → ``[k, B, C·prod(S)]``, per replica in ``torch.flatten`` order."""
    return h.reshape(h.shape[0], k, -1).transpose(0, 1)


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (number of replicas) must be an integer >= 1, got {k!r}")


class ReplicaLayer(nn.Module):
    """Base of the replica-batched layers: k replicas, parameters shaped ``[k, *per_replica]``."""

    def __init__(self, k: int) -> None:
        super().__init__()
        _check_k(k)
        self.k = k

    def reset_parameters(self, generator: torch.Generator) -> None:
        """Draw one replica's parameters from ``generator`` and copy them to all k replicas."""
        raise NotImplementedError

    @staticmethod
    def _replicate(param: Tensor, value: Tensor) -> None:
        with torch.no_grad():
            param.copy_(value.unsqueeze(0).expand_as(param))


def _default_uniform_init(
    weight: nn.Parameter, bias: nn.Parameter | None, generator: torch.Generator
) -> None:
    """PyTorch's default nn.Linear / nn.ConvNd init (He et al. 2015 uniform with a = √5).

    Draws exactly what ``nn.Linear``/``nn.ConvNd.reset_parameters`` draws (weight, then bias), so a
    generator seeded with s reproduces ``torch.manual_seed(s); nn.Linear(...)``.
    """
    w = torch.empty(weight.shape[1:], dtype=weight.dtype)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=generator)
    ReplicaLayer._replicate(weight, w)
    if bias is not None:
        fan_in = w[0].numel()
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        b = torch.empty(bias.shape[1:], dtype=bias.dtype)
        nn.init.uniform_(b, -bound, bound, generator=generator)
        ReplicaLayer._replicate(bias, b)


class ReplicaLinear(ReplicaLayer):
    """k linear maps ``y_i = x_i W_iᵀ + b_i``: ``[k, B, in]`` → ``[k, B, out]``.

    Parameters: ``weight [k, out, in]``, ``bias [k, out]`` (optional).
    """

    def __init__(self, k: int, in_features: int, out_features: int, *, bias: bool = True) -> None:
        super().__init__(k)
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(k, out_features, in_features))
        self.bias = nn.Parameter(torch.empty(k, out_features)) if bias else None

    def reset_parameters(self, generator: torch.Generator) -> None:
        _default_uniform_init(self.weight, self.bias, generator)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = _Linear.apply(x, self.weight, self.bias)  # type: ignore[no-untyped-call]
        return out

    def extra_repr(self) -> str:
        return f"k={self.k}, in={self.in_features}, out={self.out_features}"


class _Linear(torch.autograd.Function):
    """``x Wᵀ + b`` batched over replicas (``torch.baddbmm``) whose weight gradient comes out
    row-major like the weight, ``gᵀ x`` ([k, out, in]). Autograd's own backward of the
    transposed operand computes ``xᵀ g`` ([k, in, out]) and hands over its transpose, which
    `concord.core.models.flat.FlatParams.grad` then copies through a transposing loop (12 % of a
    peer's training thread in `bench/step_overhead.py`, docs/performance.md); this way the copy
    into the flat gradient is a plain one. Each entry is the same sum over the batch."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: Tensor, weight: Tensor, bias: Tensor | None
    ) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None  # type: ignore[attr-defined]
        wt = weight.transpose(1, 2)
        if bias is None:
            return torch.bmm(x, wt)
        return torch.baddbmm(bias.unsqueeze(1), x, wt)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors  # type: ignore[attr-defined]
        need_x, need_w, need_b = ctx.needs_input_grad  # type: ignore[attr-defined]
        gx = torch.bmm(grad, weight) if need_x else None
        gw = torch.bmm(grad.transpose(1, 2), x) if need_w else None
        has_bias = ctx.has_bias  # type: ignore[attr-defined]
        gb = grad.sum(dim=1) if has_bias and need_b else None
        return gx, gw, gb


class _ReplicaConvNd(ReplicaLayer):
    """Grouped convolution, one group per replica: ``[B, k·Cin, *S]`` → ``[B, k·Cout, *S']``.

    Parameters: ``weight [k, Cout, Cin, *kernel]``, ``bias [k, Cout]`` (optional); reshaped to the
    ``[k·Cout, Cin, *kernel]`` weight of ``F.convNd(..., groups=k)`` on every call.
    """

    ndim: int

    def __init__(
        self,
        k: int,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        padding: int = 0,
        bias: bool = True,
    ) -> None:
        super().__init__(k)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        kernel = (kernel_size,) * self.ndim
        self.weight = nn.Parameter(torch.empty(k, out_channels, in_channels, *kernel))
        self.bias = nn.Parameter(torch.empty(k, out_channels)) if bias else None

    def reset_parameters(self, generator: torch.Generator) -> None:
        _default_uniform_init(self.weight, self.bias, generator)

    def _grouped(self) -> tuple[Tensor, Tensor | None]:
        w = self.weight.reshape(self.k * self.out_channels, *self.weight.shape[2:])
        b = None if self.bias is None else self.bias.reshape(-1)
        return w, b

    def extra_repr(self) -> str:
        return (
            f"k={self.k}, {self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, bias={self.bias is not None}"
        )


def _tap_range(tap: int, stride: int, padding: int, length: int, out_len: int) -> tuple[int, int]:
    """The output positions [lo, hi) whose input index o·stride + tap − padding lies inside
    [0, length) (the others read the zero padding)."""
    lo = max(0, -((tap - padding) // stride))  # ceil((padding − tap) / stride)
    hi = min(out_len, (length - 1 + padding - tap) // stride + 1)
    return lo, max(lo, hi)


class _Im2Col(torch.autograd.Function):
    """im2col of channels-last 1-D activations: ``[k, B, L, C]`` → ``[k, B, L', K·C]`` in (tap,
    channel) order, zero padding included. Forward: the padded input (one copy, only when
    padded), then one copy of its overlapping windows — a strided view; backward: one zero buffer
    and one strided add per tap. Slicing a padded copy and concatenating instead (autograd's
    way) allocates and zero-fills a full-size gradient per tap and per padding (the speed-up
    measured: docs/performance.md#the-vectorized-engine)."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        h: Tensor,
        size: int,
        stride: int,
        padding: int,
        out_len: int,
    ) -> Tensor:
        k, b, length, c = h.shape
        # row-major [k, B, L + 2p, C] whatever h's layout (F.pad keeps a channels_last format)
        hp = (F.pad(h, (0, 0, padding, padding)) if padding else h).contiguous()
        # window o, tap j, channel c ↦ hp[o·stride + j, c]: overlapping rows of a strided view,
        # copied once into a tensor of its own (never a view of the input)
        windows = hp.as_strided(
            (k, b, out_len, size, c), (hp.stride(0), hp.stride(1), stride * c, c, 1)
        )
        cols = windows.contiguous().view(k, b, out_len, size * c)
        ctx.meta = (size, stride, padding, out_len, length, c)  # type: ignore[attr-defined]
        return cols

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor, None, None, None, None]:
        size, stride, padding, out_len, length, c = ctx.meta  # type: ignore[attr-defined]
        k, b = grad.shape[:2]
        out = grad.new_zeros(k, b, length, c)
        for tap in range(size):
            lo, hi = _tap_range(tap, stride, padding, length, out_len)
            if hi > lo:
                first = lo * stride + tap - padding
                dst = out[:, :, first : first + (hi - lo - 1) * stride + 1 : stride, :]
                dst += grad[:, :, lo:hi, tap * c : (tap + 1) * c]
        return out, None, None, None, None


class ReplicaConv1d(_ReplicaConvNd):
    """k 1-D convolutions as one grouped ``F.conv1d``; see :class:`_ReplicaConvNd`."""

    ndim = 1

    def forward(self, h: Tensor) -> Tensor:
        w, b = self._grouped()
        return F.conv1d(h, w, b, stride=self.stride, padding=self.padding, groups=self.k)

    def forward_channels_last(self, h: Tensor) -> Tensor:
        """The same convolution on channels-last activations ``[k, B, L, C]`` → ``[k, B, L', C']``.

        im2col (`_Im2Col`: one copy of a strided window view; backward one add per tap), then
        one batched matrix product per layer. For the small kernels and short sequences of 1-D
        models this is ~1.5× faster on CPU than a grouped ``F.conv1d`` (measured on cnn1d,
        k = 16, forward + backward) and needs no layout copies between layers."""
        k, b, length, c_in = h.shape
        size, s, p = self.kernel_size, self.stride, self.padding
        out_len = (length + 2 * p - size) // s + 1
        cols: Tensor = _Im2Col.apply(h, size, s, p, out_len)  # type: ignore[no-untyped-call]
        # weight [k, C', C, K] → [k, K·C, C'] in the (tap, channel) order of ``cols``
        w = self.weight.permute(0, 3, 2, 1).reshape(k, size * c_in, self.out_channels)
        cols = cols.reshape(k, b * out_len, size * c_in)
        out = (
            torch.bmm(cols, w)
            if self.bias is None
            else torch.baddbmm(self.bias.unsqueeze(1), cols, w)
        )
        return out.view(k, b, out_len, self.out_channels)


class ReplicaConv2d(_ReplicaConvNd):
    """k 2-D convolutions as one grouped ``F.conv2d``; see :class:`_ReplicaConvNd`."""

    ndim = 2

    def forward(self, h: Tensor) -> Tensor:
        w, b = self._grouped()
        return F.conv2d(h, w, b, stride=self.stride, padding=self.padding, groups=self.k)


class ReplicaBatchNorm(ReplicaLayer):
    """Per-replica BatchNorm (Ioffe & Szegedy 2015) on ``[B, k·C, *S]`` (any number of dims S).

    BatchNorm over the k·C folded channels normalises each channel of each replica with that
    replica's own batch statistics, i.e. exactly what k separate ``nn.BatchNorm{1,2}d(C)`` do.

    Parameters ``weight, bias [k, C]`` (init 1, 0). Buffers ``running_mean, running_var [k, C]``
    (init 0, 1), stored in the ``[k, C]`` form and handed to ``F.batch_norm`` as ``[k·C]`` views so
    the in-place running-average update lands in them. There is no ``num_batches_tracked``
    counter: the running average always uses the fixed ``momentum``.

    Hyperparameters: ``eps > 0`` (default 1e-5), ``momentum`` in (0, 1] (default 0.1), as in
    ``nn.BatchNorm``.
    """

    def __init__(
        self, k: int, num_features: int, *, eps: float = 1e-5, momentum: float = 0.1
    ) -> None:
        super().__init__(k)
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.weight = nn.Parameter(torch.ones(k, num_features))
        self.bias = nn.Parameter(torch.zeros(k, num_features))
        self.running_mean: Tensor
        self.running_var: Tensor
        self.register_buffer("running_mean", torch.zeros(k, num_features))
        self.register_buffer("running_var", torch.ones(k, num_features))

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)
            self.bias.zero_()
            self.running_mean.zero_()
            self.running_var.fill_(1.0)

    def forward(self, h: Tensor) -> Tensor:
        return F.batch_norm(
            h,
            self.running_mean.view(-1),
            self.running_var.view(-1),
            self.weight.reshape(-1),
            self.bias.reshape(-1),
            training=self.training,
            momentum=self.momentum,
            eps=self.eps,
        )

    def extra_repr(self) -> str:
        return f"k={self.k}, {self.num_features}, eps={self.eps}, momentum={self.momentum}"


class ReplicaGroupNorm(ReplicaLayer):
    """Per-replica GroupNorm (Wu & He 2018) with ``num_groups`` groups of each replica's C channels.

    On the folded layout ``[B, k·C, *S]`` this is GroupNorm with k·num_groups groups: replica i's
    channels are a contiguous block, so no group straddles two replicas.
    Parameters ``weight, bias [k, C]`` (init 1, 0); no buffers. ``num_groups`` must divide C.
    """

    def __init__(self, k: int, num_groups: int, num_channels: int, *, eps: float = 1e-5) -> None:
        super().__init__(k)
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(
                f"gn_groups={num_groups} must be >= 1 and divide the channel count {num_channels}"
            )
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(k, num_channels))
        self.bias = nn.Parameter(torch.zeros(k, num_channels))

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.weight.fill_(1.0)
            self.bias.zero_()

    def forward(self, h: Tensor) -> Tensor:
        return F.group_norm(
            h, self.k * self.num_groups, self.weight.reshape(-1), self.bias.reshape(-1), self.eps
        )

    def extra_repr(self) -> str:
        return f"k={self.k}, {self.num_groups}, {self.num_channels}, eps={self.eps}"


class ReplicaModel(nn.Module):
    """k independent replicas of a classifier: ``[k, B, *input_shape]`` → ``[k, B, num_classes]``.

    Invariants: every parameter and buffer has leading dimension ``k``; replica i's output depends
    only on replica i's parameters, buffers and inputs. ``arch`` describes the architecture and its
    options (not k, not the seed); it enters :meth:`FlatParams.fingerprint`. Subclasses implement
    :meth:`_forward`; :meth:`forward` validates the input shape first.
    """

    def __init__(
        self, k: int, *, input_shape: tuple[int, ...], num_classes: int, arch: str
    ) -> None:
        super().__init__()
        _check_k(k)
        self.k = k
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.arch = arch

    def forward(self, x: Tensor) -> Tensor:
        expected = (self.k, *self.input_shape)
        if x.dim() != len(expected) + 1 or (x.shape[0], *x.shape[2:]) != expected:
            raise ValueError(
                f"input x has shape {tuple(x.shape)}; expected [k={self.k}, B, "
                f"*input_shape={self.input_shape}]"
            )
        return self._forward(x)

    def _forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def reset_parameters(self, seed: int) -> None:
        """Re-initialise every replica identically from ``seed`` (independent of k).

        One ``torch.Generator(seed)`` feeds the layers in registration order, each drawing exactly
        what its standard ``torch.nn`` counterpart draws.
        """
        generator = torch.Generator().manual_seed(seed)
        for module in self.modules():
            if isinstance(module, ReplicaLayer):
                module.reset_parameters(generator)
