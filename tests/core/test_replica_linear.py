"""`ReplicaLinear`'s hand-written backward (weight gradient computed row-major, ``gᵀ x``)
against autograd's gradient of the same map, replica by replica."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional

from concord.core.models.layers import ReplicaLinear


@pytest.mark.parametrize(("k", "batch", "d_in", "d_out"), [(3, 16, 40, 512), (2, 64, 1024, 10)])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_match_autograd_per_replica(
    k: int, batch: int, d_in: int, d_out: int, bias: bool
) -> None:
    g = torch.Generator().manual_seed(0)
    layer = ReplicaLinear(k, d_in, d_out, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=g))
        if layer.bias is not None:
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=g))
    x = torch.randn(k, batch, d_in, generator=g, requires_grad=True)
    upstream = torch.randn(k, batch, d_out, generator=g)
    out = layer(x)
    (out * upstream).sum().backward()
    assert layer.weight.grad is not None
    assert layer.weight.grad.is_contiguous()
    assert x.grad is not None
    for i in range(k):
        w = layer.weight.detach()[i].clone().requires_grad_(True)
        b = layer.bias.detach()[i].clone().requires_grad_(True) if layer.bias is not None else None
        xi = x.detach()[i].clone().requires_grad_(True)
        ref = functional.linear(xi, w, b)
        # the forward is the same product: equal to float32 rounding of a d_in-term sum
        torch.testing.assert_close(out[i].detach(), ref.detach(), rtol=1e-5, atol=1e-5)
        (ref * upstream[i]).sum().backward()
        # each gradient entry is the same batch (or d_out) sum, possibly summed in another
        # order: float32 reorder error of sums of ≤ 1024 unit-variance products, ~1e-6 relative
        assert w.grad is not None
        assert xi.grad is not None
        torch.testing.assert_close(layer.weight.grad[i], w.grad, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(x.grad[i], xi.grad, rtol=1e-5, atol=1e-4)
        if b is not None:
            assert layer.bias is not None
            assert layer.bias.grad is not None
            assert b.grad is not None
            torch.testing.assert_close(layer.bias.grad[i], b.grad, rtol=1e-5, atol=1e-4)
