"""Buffers kept across steps (issue 14, item 7): the blocked and in-place forms of the step's
arithmetic give the bits of the plain forms, and reused memory never leaks into a result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from concord.core.algorithms import LocalSGD, SGDConfig
from concord.core.algorithms.base import assign_mixed
from concord.core.comm import MixOutcome, MixResult
from concord.core.control.consensus import local_theta
from concord.core.graphs.topology import make_schedule
from concord.core.models import BLOCK_BYTES, FlatParams, build_model, cache_blocks, loss_and_grad
from concord.core.models.flat import TRANSPOSED_COPY_MIN
from concord.sim.vectorized import VectorizedComm


@pytest.mark.parametrize(
    ("total", "unit", "min_size"),
    [(0, 8, 1), (1, 8, 2), (5, 10**9, 1), (10, 1, 1), (1024, 78_858 * 8, 2), (7, 2 << 20, 2)],
)
def test_cache_blocks_cover_the_range_in_blocks_of_at_least_min_size(
    total: int, unit: int, min_size: int
) -> None:
    blocks = cache_blocks(total, unit, min_size=min_size)
    assert [i for s, e in blocks for i in range(s, e)] == list(range(total))
    size = max(min_size, BLOCK_BYTES // unit, 1)
    for s, e in blocks:
        assert min(min_size, total) <= e - s < size + min_size


def _pair(k: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(k, d, generator=gen)
    return x, x + 1e-3 * torch.randn(k, d, generator=gen)


# d = 300 000: a block of rows is 3 rows of float32, so k = 7 and 9 take several blocks (the
# last of k = 7 absorbs the lone 7th row); k = 1 … 3 take one call
@pytest.mark.parametrize("k", [1, 2, 3, 7, 9])
def test_assign_mixed_is_local_theta_then_copy_bit_for_bit(k: int) -> None:
    x, mixed = _pair(k, 300_000)
    want = local_theta(x, mixed)
    got = assign_mixed(x, mixed)
    assert torch.equal(got, want)
    assert torch.equal(x, mixed)


@pytest.mark.parametrize(
    ("momentum", "nesterov", "weight_decay", "masked"),
    [
        (0.9, True, 1e-4, True),
        (0.9, True, 1e-4, False),
        (0.9, False, 1e-4, True),
        (0.9, True, 0.0, True),
        (0.0, False, 1e-4, True),
        (0.0, False, 0.0, False),
    ],
)
def test_local_sgd_step_is_x_minus_lr_direction_bit_for_bit(
    momentum: float, nesterov: bool, weight_decay: float, masked: bool
) -> None:
    """`LocalSGD.step` runs the chain of `direction` block by block of rows (7 rows of
    300 000 parameters: blocks of 3, 3 and 1 rows) in a scratch buffer it keeps; the
    parameters and momentum are those of the unblocked ``x − lr · direction``."""
    k, d = 7, 300_000
    config = SGDConfig(momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    mask = (torch.arange(d) % 3 != 0).float() if masked else None
    blocked, plain = LocalSGD(config, mask), LocalSGD(config, mask)
    x, _ = _pair(k, d)
    y = x.clone()
    gen = torch.Generator().manual_seed(1)
    for lr in (0.1, 0.05, 0.01):
        grad = torch.randn(k, d, generator=gen)
        before = grad.clone()
        blocked.step(x, grad, lr)
        y.sub_(plain.direction(y, grad), alpha=lr)
        assert torch.equal(grad, before)  # the gradient is read, never written
        assert torch.equal(x, y)
        momenta = (blocked.state_dict().get("momentum"), plain.state_dict().get("momentum"))
        assert momenta == (None, None) or torch.equal(*momenta)


def test_flat_grad_writes_into_the_callers_buffer() -> None:
    model = build_model("mlp", 3, input_shape=(5,), num_classes=4, seed=0, hidden=[6])
    flat = FlatParams(model)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 8, 5, generator=gen), torch.randint(0, 4, (3, 8), generator=gen)
    _, fresh, _ = loss_and_grad(model, flat, x, y)
    buffer = torch.full_like(flat.data, float("nan"))
    _, into, _ = loss_and_grad(model, flat, x, y, out=buffer)
    assert into is buffer
    assert torch.equal(into, fresh)
    with pytest.raises(ValueError, match="gradient buffer"):
        loss_and_grad(model, flat, x, y, out=torch.empty(3, flat.d + 1))


@pytest.mark.parametrize("k", [1, 3])
def test_flat_grad_copies_large_transposed_weight_gradients_bit_for_bit(k: int) -> None:
    """A 256 × 128 linear weight (2¹⁵ elements, `TRANSPOSED_COPY_MIN`) gets its transposed
    gradient copied one replica at a time; every row is autograd's gradient, bit for bit."""
    model = build_model("mlp", k, input_shape=(128,), num_classes=4, seed=0, hidden=[256])
    flat = FlatParams(model)
    assert model.layers[0].weight.shape[1:].numel() >= TRANSPOSED_COPY_MIN  # the looped path
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(k, 8, 128, generator=gen), torch.randint(0, 4, (k, 8), generator=gen)
    _, grad, _ = loss_and_grad(model, flat, x, y)
    logits = model(x)  # no dropout or batch statistics in an MLP: the same forward again
    per_sample = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), y.flatten(), reduction="none"
    )
    grads = torch.autograd.grad(per_sample.view(k, -1).mean(dim=1).sum(), list(model.parameters()))
    want = torch.cat([g.reshape(k, -1) for g in grads], dim=1)
    assert torch.equal(grad, want)


@pytest.mark.parametrize("n", [8, 160])  # a dense W, and the sparse product from n = 128 on
def test_vectorized_mix_reuses_a_released_result_and_nothing_else(n: int) -> None:
    W = make_schedule("ring", n).matrix(0)
    gen = torch.Generator().manual_seed(n)
    x, z = torch.randn(n, 33, generator=gen), torch.randn(n, 33, generator=gen)
    want_x = VectorizedComm(n).mix(x, W).x
    want_z = VectorizedComm(n).mix(z, W).x

    comm = VectorizedComm(n)
    first = comm.mix(x, W)
    kept = comm.mix(z, W)  # not released: a new tensor, the first stays as it was
    assert kept.x.untyped_storage().data_ptr() != first.x.untyped_storage().data_ptr()
    assert torch.equal(first.x, want_x)
    memory = first.x.untyped_storage().data_ptr()
    first.x.fill_(float("nan"))  # whatever a released buffer holds must not show through
    comm.release(first)
    again = comm.mix(z, W)
    assert again.x.untyped_storage().data_ptr() == memory
    assert torch.equal(again.x, want_z)
    # a result that is an input of the round is not written over, even when released
    comm.release(again)
    chained = comm.mix(again.x, W)
    assert chained.x.untyped_storage().data_ptr() != memory
    assert torch.equal(chained.x, VectorizedComm(n).mix(want_z, W).x)


def test_vectorized_release_ignores_tensors_it_did_not_lend() -> None:
    n = 6
    W = make_schedule("ring", n).matrix(0)
    comm = VectorizedComm(n)
    foreign = torch.zeros(n, 4)
    comm.release(MixResult(x=foreign, outcome=MixOutcome()))
    out = comm.mix(torch.ones(n, 4), W).x
    assert out.untyped_storage().data_ptr() != foreign.untyped_storage().data_ptr()
    assert torch.equal(foreign, torch.zeros(n, 4))
    np.testing.assert_allclose(out.numpy(), np.ones((n, 4)), rtol=1e-6)
