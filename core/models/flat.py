"""All parameters of a :class:`ReplicaModel` as one ``[k, d]`` tensor, plus the train/eval passes.

With the parameters bound as views into one flat tensor ``X = FlatParams(model).data``:

* a gossip round is ``X.copy_(W @ X)`` (W the ``[k, k]`` mixing matrix),
* an optimizer step is vector arithmetic on ``[k, d]``,
* the consensus distance Ξ² = (1/k) Σ_i ‖x_i − x̄‖² is ``X.var(0, unbiased=False).sum()``
  (Kong et al. 2021, "Consensus Control for Decentralized Deep Learning", eq. of Ξ_t).

Write into ``data`` in place; the model sees the change immediately. Things that re-allocate
parameters (``model.to(...)``, ``model.double()``, ``load_state_dict(assign=True)``, a second
``FlatParams`` on the same model) break the aliasing of an existing ``FlatParams``.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's universal alias)
from torch import Tensor

from concord.core.models.layers import ReplicaModel

__all__ = ["BLOCK_BYTES", "FlatParams", "cache_blocks", "evaluate", "loss_and_grad"]

BLOCK_BYTES = 4 << 20
"""Working-set size of `cache_blocks`: a few MiB, well inside L2 + L3 (measured at n = 1024,
d = 78 858 on a 2-core EPYC: 2–8 MiB blocks are equally fast, 1 and 16 MiB slower)."""


def cache_blocks(
    total: int, unit_bytes: int, *, target: int = BLOCK_BYTES, min_size: int = 1
) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` ranges covering ``range(total)``, each about ``target``
    bytes of ``unit_bytes``-byte units (rows or columns of a [k, d] tensor) and at least
    ``min_size`` units (the last range absorbs a shorter remainder; fewer than ``min_size``
    only when ``total`` is).

    Elementwise chains over a [k, d] tensor run block by block so that one block's operands
    stay in cache from one operation to the next: one pass over memory instead of one per
    operation. Each element sees the same operations, so the bits are those of the unblocked
    chain."""
    size = max(min_size, 1, target // max(1, unit_bytes))
    bounds = list(range(0, total, size))
    if len(bounds) > 1 and total - bounds[-1] < min_size:
        bounds.pop()
    return list(zip(bounds, [*bounds[1:], total][: len(bounds)], strict=True))


TRANSPOSED_COPY_MIN = 1 << 15
"""Matrix size (elements per replica) from which `_copy_gradient` copies a transposed gradient
one replica at a time."""


def _copy_gradient(dest: Tensor, g: Tensor) -> None:
    """``dest.copy_(g)`` for a gradient ``g`` that autograd may hand over as a transposed view.

    The weight gradient of a linear layer ``x Wᵀ`` arrives as ``[k, out, in]`` with strides
    ``(·, 1, out)``. Copied as one 3-D tensor, every element written reads another cache line
    (4.0 ms for 1024 × 1024 on one core, more than the 2.6 ms of forward and backward of
    that MLP together); the 2-D copy of one replica's matrix into contiguous memory takes
    PyTorch's blocked transpose (0.41 ms). Below `TRANSPOSED_COPY_MIN` elements the matrix
    stays in cache and one call for all replicas is faster than a loop over them. A copy
    either way: the same bits."""
    if (
        g.dim() == 3
        and g.shape[1] * g.shape[2] >= TRANSPOSED_COPY_MIN
        and g.stride(1) == 1
        and g.stride(2) == g.shape[1]
    ):
        for i in range(g.shape[0]):
            dest[i].copy_(g[i])
        return
    dest.copy_(g)


class FlatParams:
    """Binds every parameter of ``model`` as a view into one float32 tensor ``data [k, d]``.

    Layout: ``model.named_parameters()`` order; parameter ``p`` of shape ``[k, *s]`` is
    ``data[:, off:off + prod(s)].view(k, *s)``. Invariant: ``p.data`` aliases ``data`` for every p.

    ``decay_mask [d]`` is 1.0 on entries that get weight decay and 0.0 elsewhere. Rule: a parameter
    is decayed iff its per-replica shape has ≥ 2 dimensions (conv and linear weights); biases and
    norm affine parameters (1-D per replica) are not. This is the convention the brief calls the
    RelaySGD one (Vogels et al. 2021 skip batch-norm parameters, ``tasks/cifar.py``), extended to
    biases and GroupNorm.

    Buffers (BatchNorm running statistics) are not part of ``data``; :meth:`buffers_flat` copies the
    floating-point buffers (each ``[k, *s]``) out as ``[k, d_buf]`` and :meth:`load_buffers_flat`
    writes such a tensor back. Integer buffers (e.g. ``num_batches_tracked`` of a user BatchNorm in
    a generic model) are counters and are left out.
    """

    def __init__(self, model: ReplicaModel) -> None:
        self.k = model.k
        self._arch = model.arch
        named = list(model.named_parameters())
        if not named:
            raise ValueError(f"model {model.arch.splitlines()[0]!r} has no parameters")
        self.names: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.offsets: list[int] = []
        off = 0
        for name, p in named:
            if p.dim() < 1 or p.shape[0] != self.k:
                raise ValueError(
                    f"parameter {name} has shape {tuple(p.shape)}; expected [k={self.k}, ...]"
                )
            if p.dtype != torch.float32:
                raise ValueError(f"parameter {name} has dtype {p.dtype}; FlatParams needs float32")
            self.names.append(name)
            self.shapes.append(tuple(p.shape[1:]))
            self.offsets.append(off)
            off += math.prod(p.shape[1:])
        self.d = off
        device = named[0][1].device
        self._data = torch.empty(self.k, self.d, dtype=torch.float32, device=device)
        self._params = [p for _, p in named]
        with torch.no_grad():
            for p, shape, o in zip(self._params, self.shapes, self.offsets, strict=True):
                n = math.prod(shape)
                view = self._data[:, o : o + n]
                view.copy_(p.reshape(self.k, n))
                p.data = view.view(self.k, *shape)
        mask = torch.zeros(self.d, dtype=torch.float32, device=device)
        for shape, o in zip(self.shapes, self.offsets, strict=True):
            if len(shape) >= 2:
                mask[o : o + math.prod(shape)] = 1.0
        self.decay_mask = mask
        self._buffers: list[tuple[str, Tensor]] = []
        for name, b in model.named_buffers():
            if not b.is_floating_point():
                continue
            if b.dim() < 1 or b.shape[0] != self.k:
                raise ValueError(
                    f"buffer {name} has shape {tuple(b.shape)}; expected [k={self.k}, ...]"
                )
            self._buffers.append((name, b))
        self.d_buf = sum(b[0].numel() for _, b in self._buffers)

    @property
    def data(self) -> Tensor:
        """``[k, d]`` float32; every parameter of the model is a view into it (write in place)."""
        return self._data

    def grad(self, loss: Tensor, *, out: Tensor | None = None) -> Tensor:
        """Gradient of ``loss.sum()`` w.r.t. all parameters as ``[k, d]``: written into ``out``
        (a float32 ``[k, d]`` buffer the caller reuses across steps) and returned, or a fresh
        tensor when ``out`` is None.

        With ``loss [k]`` holding replica i's loss in entry i, row i is replica i's gradient:
        replica i's loss depends on no other replica's parameters. Unused or frozen parameters
        get zeros.
        """
        device = self._data.device
        if out is None:
            out = torch.empty_like(self._data)
        elif (out.shape, out.dtype, out.device) != (self._data.shape, self._data.dtype, device):
            raise ValueError(
                f"gradient buffer has shape {tuple(out.shape)}, dtype {out.dtype} on {out.device}; "
                f"expected [k={self.k}, d={self.d}] float32 on {device}"
            )
        trainable = [p for p in self._params if p.requires_grad]
        found = iter(torch.autograd.grad(loss.sum(), trainable, allow_unused=True))
        for p, shape, o in zip(self._params, self.shapes, self.offsets, strict=True):
            g = next(found) if p.requires_grad else None
            # one copy per parameter straight into its slice (a reshape would copy autograd's
            # transposed weight gradients once more, a cat a third time)
            dest = out[:, o : o + math.prod(shape)].view(self.k, *shape)
            if g is None:  # frozen or unused parameter
                dest.zero_()
            else:
                _copy_gradient(dest, g)
        return out

    def fingerprint(self) -> str:
        """sha256 hex of the architecture description, parameter and floating-buffer names,
        per-replica shapes and dtypes — equal for every k, different across architectures."""
        h = hashlib.sha256()
        h.update(f"arch {self._arch}\n".encode())
        for name, p, shape in zip(self.names, self._params, self.shapes, strict=True):
            h.update(f"param {name} {shape} {p.dtype}\n".encode())
        for name, b in self._buffers:
            h.update(f"buffer {name} {tuple(b.shape[1:])} {b.dtype}\n".encode())
        return h.hexdigest()

    def buffers_flat(self) -> Tensor | None:
        """Copy of the floating-point buffers as ``[k, d_buf]`` float32 (None if there are none)."""
        if not self._buffers:
            return None
        return torch.cat([b.detach().reshape(self.k, -1).float() for _, b in self._buffers], dim=1)

    def load_buffers_flat(self, b: Tensor) -> None:
        """Write a ``[k, d_buf]`` tensor (as from :meth:`buffers_flat`) into the model's buffers."""
        if tuple(b.shape) != (self.k, self.d_buf):
            raise ValueError(
                f"buffers have shape {tuple(b.shape)}; expected [k={self.k}, d_buf={self.d_buf}]"
            )
        off = 0
        with torch.no_grad():
            for _, buf in self._buffers:
                n = buf[0].numel()
                buf.copy_(b[:, off : off + n].reshape(buf.shape))
                off += n


def loss_and_grad(
    model: ReplicaModel, flat: FlatParams, x: Tensor, y: Tensor, *, out: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """One train-mode forward/backward of all replicas.

    ``x [k, B, *input_shape]``, ``y [k, B]`` int64 labels (replica i's batch is ``x[i], y[i]``).
    Returns ``loss [k]`` (mean cross-entropy per replica, detached), ``grad [k, d]`` (gradient of
    each replica's mean loss w.r.t. its own parameters, in ``flat`` layout; written into ``out``
    if given, see `FlatParams.grad`) and ``correct [k]`` (int64 count of correct top-1
    predictions). BatchNorm running statistics are updated.
    """
    k = model.k
    if y.dim() != 2 or y.shape[0] != k or y.shape[1] != x.shape[1]:
        raise ValueError(f"labels y have shape {tuple(y.shape)}; expected [k={k}, B={x.shape[1]}]")
    model.train()
    logits = model(x)
    per_sample = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
    loss = per_sample.view(k, -1).mean(dim=1)
    grad = flat.grad(loss, out=out)
    correct = (logits.detach().argmax(dim=-1) == y).sum(dim=1)
    return loss.detach(), grad, correct


@torch.no_grad()
def evaluate(
    model: ReplicaModel, x: Tensor, y: Tensor, *, batch_size: int = 1000
) -> tuple[Tensor, Tensor]:
    """Eval-mode accuracy ``[k]`` and mean cross-entropy ``[k]`` of every replica on ``x, y``.

    ``x [N, *input_shape]`` and ``y [N]`` are shared by all replicas. ``batch_size`` ≥ 1 samples are
    evaluated per chunk by all k replicas at once, so activation memory grows with
    k × batch_size. The model's train/eval mode is restored afterwards.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = x.shape[0]
    if n == 0 or y.shape != (n,):
        raise ValueError(f"need x [N>0, ...] and y [N]; got x {tuple(x.shape)}, y {tuple(y.shape)}")
    k = model.k
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros(k, dtype=torch.float64)
    correct = torch.zeros(k, dtype=torch.int64)
    try:
        for start in range(0, n, batch_size):
            xb, yb = x[start : start + batch_size], y[start : start + batch_size]
            logits = model(xb.unsqueeze(0).expand(k, *xb.shape))
            yk = yb.unsqueeze(0).expand(k, -1)
            ce = F.cross_entropy(logits.flatten(0, 1), yk.flatten(), reduction="none")
            loss_sum += ce.view(k, -1).sum(dim=1).double().cpu()
            correct += (logits.argmax(dim=-1) == yk).sum(dim=1).cpu()
    finally:
        model.train(was_training)
    return (correct.double() / n).float(), (loss_sum / n).float()
