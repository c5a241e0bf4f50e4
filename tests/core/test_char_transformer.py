"""`char-transformer`: shapes, replica independence, the last-block shortcut, causality, chunked
evaluation, option errors, and a short training run on `pystdlib-chars` that lowers held-out loss.

Tolerances: 1e-5 absolute on logits of order 1 where the same arithmetic runs in a different
batching (k replicas vs one, chunks vs one batch, one query vs all): float32 matrix products may
block the sums differently, which moves results by a few ulp (≈ 1e-6), never by 1e-5."""

from __future__ import annotations

import pytest
import torch

from concord.core.data import load_dataset
from concord.core.models import FlatParams, build_model, evaluate, loss_and_grad
from concord.core.models.transformer import EVAL_CHUNK, ReplicaCharTransformer

TOL = 1e-5
SMALL = {"layers": 2, "width": 32, "heads": 4}


def _model(k: int, context: int = 16, vocab: int = 98, **options: int) -> ReplicaCharTransformer:
    model = build_model(
        "char-transformer",
        k,
        input_shape=(context,),
        num_classes=vocab,
        seed=0,
        **{**SMALL, **options},
    )
    assert isinstance(model, ReplicaCharTransformer)
    return model


def _perturb(model: ReplicaCharTransformer) -> None:
    """Make the replicas differ (they start equal)."""
    flat = FlatParams(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        flat.data.add_(0.05 * torch.randn(flat.data.shape, generator=gen))


def _codes(*shape: int, vocab: int = 98) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(2)).float()


def test_forward_shape_and_replica_stacked_equals_per_replica() -> None:
    k = 3
    model = _model(k)
    _perturb(model)
    x = _codes(k, 5, 16)
    out = model(x)
    assert out.shape == (k, 5, 98)
    state = model.state_dict()
    for i in range(k):
        single = _model(1)
        with torch.no_grad():
            for name, p in single.named_parameters():
                p.copy_(state[name][i : i + 1])
        assert torch.allclose(single(x[i : i + 1]), out[i : i + 1], atol=TOL, rtol=0)
    assert not torch.allclose(out[0], out[1], atol=1e-3)  # the replicas really differ


def test_initial_replicas_are_identical_and_independent_of_k() -> None:
    one, four = FlatParams(_model(1)), FlatParams(_model(4))
    assert torch.equal(four.data, one.data.expand(4, -1))


def test_last_block_shortcut_matches_the_full_block_and_attention_is_causal() -> None:
    model = _model(2)
    _perturb(model)
    x = _codes(2, 4, 16)
    codes = x.long()
    where = torch.arange(16).expand_as(codes)
    h = model.tokens(codes) + model.positions(where)
    first = model.blocks[0](h)
    full = model.blocks[1](first)
    short = model.blocks[1](first, last_only=True)
    assert short.shape == (2, 4, 1, 32)
    assert torch.allclose(short[:, :, 0], full[:, :, -1], atol=TOL, rtol=0)
    # changing the last character leaves every earlier position's output of a block unchanged
    x2 = x.clone()
    x2[:, :, -1] = (x2[:, :, -1] + 1) % 98
    h2 = model.tokens(x2.long()) + model.positions(where)
    first2 = model.blocks[0](h2)
    assert torch.allclose(first2[:, :, :-1], first[:, :, :-1], atol=TOL, rtol=0)
    assert not torch.allclose(first2[:, :, -1], first[:, :, -1], atol=1e-3)


def test_chunked_evaluation_equals_one_batch() -> None:
    model = _model(2)
    _perturb(model)
    x = _codes(2, EVAL_CHUNK + 37, 16)
    with_grad = model(x)
    with torch.no_grad():
        chunked = model(x)
    assert torch.allclose(chunked, with_grad.detach(), atol=TOL, rtol=0)


def test_option_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="width=30 must be a multiple of heads=4"):
        _model(1, width=30)
    with pytest.raises(ValueError, match="option layers must be an integer >= 1"):
        _model(1, layers=0)
    with pytest.raises(ValueError, match=r"needs input_shape \(context,\)"):
        build_model("char-transformer", 1, input_shape=(4, 4), num_classes=10)


def test_short_training_lowers_held_out_loss_below_the_unigram_entropy() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matrices: one thread is fastest on a shared 2-core machine
    try:
        _train_and_check()
    finally:
        torch.set_num_threads(threads)


def _train_and_check() -> None:
    torch.manual_seed(0)
    data = load_dataset("pystdlib-chars", seed=0, num_samples=6000, seq_len=16)
    k, batch, lr = 1, 32, 0.3
    model = build_model(
        "char-transformer", k, input_shape=(16,), num_classes=data.num_classes, seed=0, **SMALL
    )
    flat = FlatParams(model)
    x_test, y_test = data.x_test[:400], data.y_test[:400]
    _, before = evaluate(model, x_test, y_test)
    gen = torch.Generator().manual_seed(0)
    velocity = torch.zeros_like(flat.data)
    for _ in range(150):
        idx = torch.randint(0, data.num_train, (k, batch), generator=gen)
        _, grad, _ = loss_and_grad(model, flat, data.x_train[idx], data.y_train[idx])
        grad = grad / grad.norm(dim=1, keepdim=True).clamp(min=1.0)  # clip at norm 1
        velocity.mul_(0.9).add_(grad)
        with torch.no_grad():
            flat.data.sub_(lr * velocity)
    _, after = evaluate(model, x_test, y_test)
    p = torch.bincount(data.y_train, minlength=data.num_classes).double() / data.num_train
    unigram = float(-(p[p > 0] * p[p > 0].log()).sum())  # ≈ 3.25 nats
    assert float(before.max()) > unigram + 0.5  # untrained: worse than counting characters
    assert float(after.max()) < unigram - 0.1  # learnt context beyond the unigram
