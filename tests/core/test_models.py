"""Replica-batched models against k separate standard ``torch.nn`` models with the same weights."""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's universal alias)
from torch import Tensor, nn

from concord.core.models import (
    MODEL_NAMES,
    FlatParams,
    GenericReplicaModel,
    ReplicaModel,
    build_model,
    evaluate,
    loss_and_grad,
)
from concord.core.models.layers import ReplicaConv1d
from concord.core.registry import UnknownNameError

torch.set_num_threads(1)

# Grouped/batched kernels (grouped conv, baddbmm, BN over k·C channels) add the same float32
# products as the per-model kernels but in a different order (other blocking / vectorisation), so
# results agree to a few float32 ulps, not bit for bit. Rounding error scales with the size of the
# summed terms, not of the (possibly cancelled) result, so we allow 1e-5 relative to each entry OR
# to the largest entry of the tensor. The worst case is BatchNorm on tiny maps (2×2 at batch 6):
# dividing by small standard deviations amplifies rounding; observed ≤ 3e-6 of the largest entry
# for ResNet-20 (BN, k = 3), ≤ 5e-7 for the other models.
RTOL = 1e-5


def assert_close_scaled(got: Tensor, want: Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=RTOL, atol=RTOL * float(want.abs().max()))


# (name, options, input_shape) — small inputs keep the test fast; resnet20 accepts any H, W.
CASES: list[tuple[str, dict[str, Any], tuple[int, ...]]] = [
    ("mlp", {"hidden": [16, 12]}, (40,)),
    ("mlp", {"hidden": [], "activation": "tanh"}, (2, 5)),
    ("cnn1d", {}, (40,)),
    ("cnn1d", {"width": 8}, (2, 24)),
    ("cnn", {"width": 4}, (8, 8)),
    ("cnn", {"width": 4}, (3, 32, 32)),
    ("resnet20", {}, (3, 8, 8)),
    ("resnet20", {"norm": "gn", "gn_groups": 4, "shortcut": "a"}, (3, 8, 8)),
    ("resnet20", {"width": 2, "norm": "gn", "shortcut": "b"}, (1, 8, 8)),
]
IDS = [f"{n}-{'-'.join(f'{k}={v}' for k, v in o.items())}-{s}" for n, o, s in CASES]
NUM_CLASSES = 5


# ---------------------------------------------------------------- reference standard modules


class RefCNN1d(nn.Module):
    def __init__(self, channels: int, length: int, width: int) -> None:
        super().__init__()
        self.channels = channels
        self.convs = nn.ModuleList()
        for kernel in (5, 3, 3):
            self.convs.append(nn.Conv1d(channels, width, kernel, stride=2, padding=1))
            channels, length = width, (length + 2 - kernel) // 2 + 1
        self.head = nn.Linear(width * length, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = x.view(x.shape[0], self.channels, x.shape[-1])
        for conv in self.convs:
            h = conv(h).relu()
        return self.head(h.flatten(1))


class RefCNN(nn.Module):
    def __init__(self, shape: tuple[int, ...], width: int) -> None:
        super().__init__()
        c, h, w = (1, *shape) if len(shape) == 2 else shape
        self.channels = c
        blocks = 2 if min(h, w) < 16 else 3
        self.convs = nn.ModuleList()
        for i in range(blocks):
            self.convs.append(nn.Conv2d(c, width * 2**i, 3, padding=1))
            c, h, w = width * 2**i, h // 2, w // 2
        self.head = nn.Linear(c * h * w, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = x.view(x.shape[0], self.channels, *x.shape[-2:])
        for conv in self.convs:
            h = F.max_pool2d(conv(h).relu(), 2)
        return self.head(h.flatten(1))


class RefBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: Any, shortcut: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = norm(cout)
        self.proj: nn.Module | None = None
        self.pad = 0
        if (stride != 1 or cin != cout) and shortcut == "b":
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))
        elif stride != 1 or cin != cout:  # option A, written as in He et al. / akamaster
            self.pad = (cout - cin) // 2

    def forward(self, x: Tensor) -> Tensor:
        out = self.norm2(self.conv2(F.relu(self.norm1(self.conv1(x)))))
        if self.proj is not None:
            sc = self.proj(x)
        elif self.pad:
            sc = F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))
        else:
            sc = x
        return F.relu(out + sc)


class RefResNet20(nn.Module):
    def __init__(self, cin: int, width: int, norm: str, gn_groups: int, shortcut: str) -> None:
        super().__init__()

        def make_norm(c: int) -> nn.Module:
            return nn.BatchNorm2d(c) if norm == "bn" else nn.GroupNorm(gn_groups, c)

        planes = [16 * width, 32 * width, 64 * width]
        self.conv = nn.Conv2d(cin, planes[0], 3, 1, 1, bias=False)
        self.norm = make_norm(planes[0])
        blocks: list[nn.Module] = []
        c = planes[0]
        for s, cout in enumerate(planes):
            for b in range(3):
                blocks.append(RefBlock(c, cout, 2 if s and not b else 1, make_norm, shortcut))
                c = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(planes[-1], NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = self.blocks(F.relu(self.norm(self.conv(x))))
        return self.head(h.mean(dim=(2, 3)))


def make_reference(name: str, options: dict[str, Any], shape: tuple[int, ...]) -> nn.Module:
    """One replica as a plain torch.nn model, constructed in the replica model's layer order."""
    if name == "mlp":
        widths = [math.prod(shape), *options.get("hidden", [256, 256]), NUM_CLASSES]
        act = nn.Tanh if options.get("activation") == "tanh" else nn.ReLU
        layers: list[nn.Module] = [nn.Flatten()]
        for i in range(len(widths) - 1):
            layers += [nn.Linear(widths[i], widths[i + 1]), act()]
        return nn.Sequential(*layers[:-1])
    if name == "cnn1d":
        channels, length = (1, shape[0]) if len(shape) == 1 else shape
        return RefCNN1d(channels, length, options.get("width", 25))
    if name == "cnn":
        return RefCNN(shape, options.get("width", 32))
    return RefResNet20(
        shape[0],
        options.get("width", 1),
        options.get("norm", "bn"),
        options.get("gn_groups", 2),
        options.get("shortcut", "b"),
    )


def float_buffers(module: nn.Module) -> list[Tensor]:
    return [b for b in module.buffers() if b.is_floating_point()]


def copy_replica(model: ReplicaModel, i: int, ref: nn.Module) -> None:
    """Copy replica i's parameters and float buffers into ``ref`` (same order and shapes)."""
    pairs: list[tuple[Tensor, Tensor]] = [*zip(model.parameters(), ref.parameters(), strict=True)]
    pairs += zip(float_buffers(model), float_buffers(ref), strict=True)
    with torch.no_grad():
        for src, dst in pairs:
            assert src.shape[1:] == dst.shape
            dst.copy_(src[i])


def perturbed(name: str, options: dict[str, Any], shape: tuple[int, ...], k: int) -> ReplicaModel:
    """A model whose replicas all differ (noise on every parameter) so mix-ups would show."""
    model = build_model(name, k, input_shape=shape, num_classes=NUM_CLASSES, seed=3, **options)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def batch(
    k: int, shape: tuple[int, ...], b: int = 6, classes: int = NUM_CLASSES, seed: int = 5
) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(k, b, *shape, generator=gen)
    return x, torch.randint(0, classes, (k, b), generator=gen)


# ----------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize(("name", "options", "shape"), CASES, ids=IDS)
def test_forward_grad_and_buffers_match_separate_models(
    name: str, options: dict[str, Any], shape: tuple[int, ...], k: int
) -> None:
    model = perturbed(name, options, shape, k)
    flat = FlatParams(model)
    refs = [make_reference(name, options, shape) for _ in range(k)]
    for i, ref in enumerate(refs):
        copy_replica(model, i, ref)
    x, y = batch(k, shape)

    loss, grad, correct = loss_and_grad(model, flat, x, y)
    logits = model(x)  # second train-mode pass: compared below with the refs' second pass

    for i, ref in enumerate(refs):
        ref.train()
        out = ref(x[i])
        ref_loss = F.cross_entropy(out, y[i])
        ref_grad = torch.cat(
            [g.flatten() for g in torch.autograd.grad(ref_loss, list(ref.parameters()))]
        )
        assert_close_scaled(loss[i], ref_loss.detach())
        assert_close_scaled(grad[i], ref_grad)
        assert correct[i] == (out.argmax(1) == y[i]).sum()
        assert_close_scaled(logits[i], ref(x[i]).detach())
        # BatchNorm running statistics were updated per replica, twice, exactly like the ref's.
        for mine, theirs in zip(float_buffers(model), float_buffers(ref), strict=True):
            assert_close_scaled(mine[i], theirs)

    acc, mean_loss = evaluate(model, x[0], y[0], batch_size=4)
    assert model.training  # evaluate restores the mode
    for i, ref in enumerate(refs):
        ref.eval()
        with torch.no_grad():
            out = ref(x[0])
        assert_close_scaled(mean_loss[i], F.cross_entropy(out, y[0]))
        assert acc[i].item() == pytest.approx((out.argmax(1) == y[0]).float().mean().item())


@pytest.mark.parametrize(
    ("kernel", "stride", "padding", "length", "b", "c_in", "layout"),
    [
        (5, 2, 1, 40, 4, 2, "rows"),
        (3, 2, 1, 19, 4, 2, "rows"),
        (3, 1, 0, 7, 4, 2, "rows"),
        (3, 1, 2, 6, 4, 2, "rows"),
        (4, 3, 3, 11, 4, 2, "rows"),
        (1, 1, 0, 5, 4, 2, "rows"),
        (2, 3, 4, 7, 1, 1, "rows"),  # stride > kernel, padding ≥ kernel, B = C = 1
        (5, 1, 6, 3, 2, 3, "rows"),  # some taps read only padding
        (1, 2, 2, 5, 3, 1, "rows"),
        (3, 2, 1, 12, 3, 3, "channels_last"),  # the input in torch.channels_last format
        (3, 2, 0, 12, 3, 3, "transposed"),  # a non-contiguous view as input
    ],
)
def test_channels_last_conv1d_matches_conv1d_with_gradients(
    kernel: int, stride: int, padding: int, length: int, b: int, c_in: int, layout: str
) -> None:
    """`ReplicaConv1d.forward_channels_last` (im2col + bmm, its own backward) against
    ``F.conv1d`` per replica: output, input gradient and weight/bias gradients, with padding
    wider than some taps reach and inputs in any memory layout (float32 sums in another order:
    1e-5 relative)."""
    k, c_out = 3, 5
    conv = ReplicaConv1d(k, c_in, c_out, kernel, stride=stride, padding=padding)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    h = torch.randn(k, b, length, c_in, generator=gen)
    if layout == "channels_last":
        h = h.to(memory_format=torch.channels_last)
    elif layout == "transposed":
        h = h.transpose(2, 3).contiguous().transpose(2, 3)
    h.requires_grad_(True)
    out = conv.forward_channels_last(h)
    probe = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * probe).sum(), [h, conv.weight, conv.bias])
    for i in range(k):
        hi = h[i].detach().transpose(1, 2).clone().requires_grad_(True)  # [B, C, L]
        w, bias = conv.weight[i].detach().requires_grad_(True), conv.bias[i].detach()
        bias.requires_grad_(True)
        ref = F.conv1d(hi, w, bias, stride=stride, padding=padding)  # [B, C', L']
        assert_close_scaled(out[i].detach(), ref.detach().transpose(1, 2))
        want = torch.autograd.grad((ref * probe[i].transpose(1, 2)).sum(), [hi, w, bias])
        assert_close_scaled(grads[0][i], want[0].transpose(1, 2))
        assert_close_scaled(grads[1][i], want[1])
        assert_close_scaled(grads[2][i], want[2])


def test_im2col_gradients_pass_gradcheck() -> None:
    """The im2col function's hand-written backward (and its backward's backward) against finite
    differences in float64."""
    from concord.core.models.layers import _Im2Col

    gen = torch.Generator().manual_seed(2)
    for size, stride, padding, length in [(3, 2, 1, 7), (2, 3, 4, 5), (4, 1, 0, 6)]:
        out_len = (length + 2 * padding - size) // stride + 1
        h = torch.randn(2, 2, length, 3, generator=gen, dtype=torch.float64, requires_grad=True)

        def f(x: Tensor, size: int = size, stride: int = stride, padding: int = padding,
              out_len: int = out_len) -> Tensor:  # fmt: skip
            return _Im2Col.apply(x, size, stride, padding, out_len)  # type: ignore[no-any-return]

        assert torch.autograd.gradcheck(f, (h,))
        assert torch.autograd.gradgradcheck(f, (h,))


def test_batchnorm_running_stats_are_per_replica() -> None:
    model = build_model("resnet20", 3, input_shape=(3, 8, 8), num_classes=NUM_CLASSES)
    flat = FlatParams(model)
    before = flat.buffers_flat()
    assert before is not None
    x, y = batch(3, (3, 8, 8))
    x[2] = x[0]  # replicas 0 and 2 see the same batch, replica 1 another one
    loss_and_grad(model, flat, x, y)
    after = flat.buffers_flat()
    assert after is not None
    assert not torch.equal(after, before)
    torch.testing.assert_close(after[0], after[2], rtol=0, atol=0)  # identical inputs and weights
    assert not torch.allclose(after[0], after[1])
    flat.load_buffers_flat(before)
    torch.testing.assert_close(flat.buffers_flat(), before, rtol=0, atol=0)


def test_groupnorm_model_has_no_buffers_and_trains() -> None:
    model = build_model("resnet20", 2, input_shape=(3, 8, 8), num_classes=3, norm="gn")
    flat = FlatParams(model)
    assert flat.buffers_flat() is None
    assert flat.d_buf == 0
    x, y = batch(2, (3, 8, 8), b=4, classes=3)
    loss, grad, _ = loss_and_grad(model, flat, x, y)
    flat.data.sub_(0.01 * grad)
    loss_after, _, _ = loss_and_grad(model, flat, x, y)
    assert bool((loss_after < loss).all())  # a small gradient step on the same batch helps


@pytest.mark.parametrize(("name", "options", "shape"), CASES, ids=IDS)
def test_init_is_independent_of_k_and_equals_torch_default_init(
    name: str, options: dict[str, Any], shape: tuple[int, ...]
) -> None:
    one = build_model(name, 1, input_shape=shape, num_classes=NUM_CLASSES, seed=7, **options)
    many = build_model(name, 16, input_shape=shape, num_classes=NUM_CLASSES, seed=7, **options)
    other = build_model(name, 1, input_shape=shape, num_classes=NUM_CLASSES, seed=8, **options)
    flat_one, flat_many = FlatParams(one), FlatParams(many)
    torch.testing.assert_close(flat_many.data, flat_one.data.expand(16, -1), rtol=0, atol=0)
    assert not torch.equal(FlatParams(other).data, flat_one.data)
    # Same draws as constructing the standard torch.nn model right after torch.manual_seed(7).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        ref = make_reference(name, options, shape)
    ref_flat = torch.cat([p.detach().flatten() for p in ref.parameters()])
    torch.testing.assert_close(flat_one.data[0], ref_flat, rtol=0, atol=0)


def test_flat_params_alias_the_model() -> None:
    model = build_model("cnn1d", 3, input_shape=(40,), num_classes=10)
    flat = FlatParams(model)
    assert flat.data.shape == (3, flat.d)
    assert flat.d == sum(p[0].numel() for p in model.parameters())
    assert flat.offsets[0] == 0
    assert len(flat.names) == len(flat.shapes) == len(list(model.parameters()))
    x, _ = batch(3, (40,))
    out = model(x).detach()
    flat.data[1].mul_(2.0)  # in-place write to replica 1 only
    out2 = model(x).detach()
    torch.testing.assert_close(out2[0], out[0], rtol=0, atol=0)
    assert not torch.allclose(out2[1], out[1])
    with torch.no_grad():  # and the other way round: a parameter write shows up in data
        dict(model.named_parameters())["head.weight"][2].fill_(0.25)
    off = flat.offsets[flat.names.index("head.weight")]
    assert bool((flat.data[2, off : off + 10 * 125] == 0.25).all())
    with pytest.raises(AttributeError):
        flat.data = torch.zeros(3, flat.d)  # type: ignore[misc]


def test_decay_mask_zeroes_biases_and_norm_parameters() -> None:
    model = build_model("resnet20", 1, input_shape=(3, 8, 8), num_classes=10)
    flat = FlatParams(model)
    for name, shape, off in zip(flat.names, flat.shapes, flat.offsets, strict=True):
        segment = flat.decay_mask[off : off + math.prod(shape)]
        decayed = name.endswith("weight") and len(shape) >= 2  # conv/linear weights only
        assert bool((segment == float(decayed)).all()), name
    assert any(".norm1." in n for n in flat.names)
    mlp = FlatParams(build_model("mlp", 1, input_shape=(4,), num_classes=2, hidden=[3]))
    assert mlp.decay_mask.tolist() == [1.0] * 12 + [0.0] * 3 + [1.0] * 6 + [0.0] * 2


def test_fingerprint_same_for_any_k_and_differs_across_architectures() -> None:
    def fp(name: str, k: int, **options: Any) -> str:
        shape = (40,) if name in ("mlp", "cnn1d", "char-transformer") else (3, 32, 32)
        return FlatParams(
            build_model(name, k, input_shape=shape, num_classes=10, **options)
        ).fingerprint()

    prints = {name: fp(name, 1) for name in MODEL_NAMES}
    assert all(fp(name, 16, seed=4) == prints[name] for name in ("mlp", "cnn1d", "cnn"))
    assert fp("resnet20", 3) == prints["resnet20"]
    assert len(set(prints.values())) == len(MODEL_NAMES)
    variants = {
        fp("resnet20", 1, norm="gn"),
        fp("resnet20", 1, shortcut="a"),
        fp("cnn1d", 1, width=32),
    }
    assert len(variants) == 3
    assert not variants & set(prints.values())
    assert len(prints["mlp"]) == 64  # sha256 hex
    int(prints["mlp"], 16)  # raises if not hex


# ------------------------------------------------------------------------- generic wrapper


def user_mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def user_bn_mlp(width: int = 8) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(40, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 4)
    )


@pytest.fixture
def user_module(monkeypatch: pytest.MonkeyPatch) -> str:
    mod = types.ModuleType("concord_test_user_models")
    mod.user_mlp = user_mlp  # type: ignore[attr-defined]
    mod.user_bn_mlp = user_bn_mlp  # type: ignore[attr-defined]
    mod.not_a_module = lambda: 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod.__name__


@pytest.mark.parametrize("k", [1, 3])
def test_generic_equals_builtin_mlp(user_module: str, k: int) -> None:
    rng_before = torch.random.get_rng_state()
    generic = build_model(f"{user_module}:user_mlp", k, input_shape=(40,), num_classes=10, seed=2)
    assert torch.equal(torch.random.get_rng_state(), rng_before)  # init used a forked RNG
    builtin = build_model("mlp", k, input_shape=(40,), num_classes=10, seed=2, hidden=[16])
    assert isinstance(generic, GenericReplicaModel)
    fg, fb = FlatParams(generic), FlatParams(builtin)
    assert fg.names == ["net.1.weight", "net.1.bias", "net.3.weight", "net.3.bias"]
    assert fg.shapes == fb.shapes
    torch.testing.assert_close(fg.data, fb.data, rtol=0, atol=0)  # both are torch's default init
    noise = torch.randn(k, fg.d, generator=torch.Generator().manual_seed(0))
    fg.data.add_(noise)
    fb.data.add_(noise)
    x, y = batch(k, (40,), b=8, classes=10)
    for got, want in zip(
        loss_and_grad(generic, fg, x, y), loss_and_grad(builtin, fb, x, y), strict=True
    ):
        assert_close_scaled(got, want)
    assert fg.fingerprint() != fb.fingerprint()
    assert (
        fg.fingerprint()
        == FlatParams(
            build_model(f"{user_module}:user_mlp", 4, input_shape=(40,), num_classes=10)
        ).fingerprint()
    )


def test_generic_batchnorm_updates_stacked_buffers_per_replica(user_module: str) -> None:
    model = build_model(f"{user_module}:user_bn_mlp", 3, input_shape=(40,), num_classes=4, width=6)
    flat = FlatParams(model)
    with torch.no_grad():
        flat.data.add_(0.1 * torch.randn(3, flat.d, generator=torch.Generator().manual_seed(1)))
    refs = [user_bn_mlp(6) for _ in range(3)]
    for i, ref in enumerate(refs):
        copy_replica(model, i, ref)
    x, y = batch(3, (40,), b=8, classes=4)
    _, grad, _ = loss_and_grad(model, flat, x, y)
    bufs = flat.buffers_flat()
    assert bufs is not None
    assert bufs.shape == (3, 12)  # running mean and var of 6 channels; the counter is left out
    for i, ref in enumerate(refs):
        ref_loss = F.cross_entropy(ref(x[i]), y[i])
        ref_grad = torch.cat(
            [g.flatten() for g in torch.autograd.grad(ref_loss, list(ref.parameters()))]
        )
        assert_close_scaled(grad[i], ref_grad)
        ref_bufs = torch.cat([b.flatten() for b in float_buffers(ref)])
        assert_close_scaled(bufs[i], ref_bufs)
    tracked = dict(model.named_buffers())["net.2.num_batches_tracked"]
    assert tracked.tolist() == [1, 1, 1]
    model.reset_parameters(0)
    assert tracked.tolist() == [0, 0, 0]


# ----------------------------------------------------------------------------------- errors


def test_unknown_model_name_lists_valid_names() -> None:
    assert MODEL_NAMES == ("mlp", "cnn1d", "cnn", "resnet20", "char-transformer")
    with pytest.raises(
        UnknownNameError,
        match="unknown model 'resnet18'; valid: char-transformer, cnn, cnn1d, mlp, resnet20",
    ):
        build_model("resnet18", 1, input_shape=(3, 32, 32), num_classes=10)


@pytest.mark.parametrize(
    ("name", "shape", "options", "message"),
    [
        (
            "cnn1d",
            (40,),
            {"widht": 3},
            r"unknown option\(s\) widht for model 'cnn1d'; valid options: width",
        ),
        ("cnn1d", (40,), {"width": 0}, "option width must be an integer >= 1, got 0"),
        (
            "cnn1d",
            (3, 32, 32),
            {},
            r"cnn1d needs input_shape \(L,\) or \(C, L\), got \(3, 32, 32\)",
        ),
        ("cnn1d", (2,), {}, "too short for cnn1d.*need length >= 3"),
        ("mlp", (4,), {"hidden": "256"}, "option hidden must be a list of positive ints"),
        ("mlp", (4,), {"hidden": [8, -1]}, r"option hidden\[\] must be an integer >= 1, got -1"),
        (
            "mlp",
            (4,),
            {"activation": "gelu"},
            "option activation='gelu' is not valid; choose one of relu, tanh",
        ),
        ("cnn", (4, 4), {"blocks": 3}, "cnn with blocks=3 needs height and width >= 8"),
        (
            "resnet20",
            (3, 32, 32),
            {"norm": "ln"},
            "option norm='ln' is not valid; choose one of bn, gn",
        ),
        ("resnet20", (3, 32, 32), {"norm": "gn", "gn_groups": 3}, "option gn_groups=3 must divide"),
        ("resnet20", (3, 32, 32), {"shortcut": "c"}, "option shortcut='c' is not valid"),
        ("resnet20", (32, 32), {}, r"resnet20 needs input_shape \(C, H, W\)"),
    ],
)
def test_bad_options_raise_specific_errors(
    name: str, shape: tuple[int, ...], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(name, 2, input_shape=shape, num_classes=10, **options)


def test_bad_arguments_raise_specific_errors(user_module: str) -> None:
    with pytest.raises(ValueError, match=r"k .* must be an integer >= 1, got 0"):
        build_model("mlp", 0, input_shape=(4,), num_classes=2)
    with pytest.raises(ValueError, match="num_classes must be an integer >= 1"):
        build_model("mlp", 1, input_shape=(4,), num_classes=0)
    with pytest.raises(ValueError, match="input_shape must be a non-empty tuple of positive ints"):
        build_model("mlp", 1, input_shape=(4, 0), num_classes=2)
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_xyz'"):
        build_model("no_such_module_xyz:f", 1, input_shape=(4,), num_classes=2)
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        build_model(f"{user_module}:missing", 1, input_shape=(4,), num_classes=2)
    with pytest.raises(ValueError, match="does not accept options"):
        build_model(f"{user_module}:user_mlp", 1, input_shape=(4,), num_classes=2, depth=3)
    with pytest.raises(ValueError, match=r"returned int, not an nn\.Module"):
        build_model(f"{user_module}:not_a_module", 1, input_shape=(4,), num_classes=2)
    with pytest.raises(
        ValueError, match=r"user model maps .* to \(2, 4\); expected \[2, num_classes=3\]"
    ):
        build_model(f"{user_module}:user_bn_mlp", 1, input_shape=(40,), num_classes=3)
    model = build_model("mlp", 2, input_shape=(4,), num_classes=3, hidden=[5])
    with pytest.raises(ValueError, match=r"input x has shape \(3, 1, 4\); expected \[k=2, B"):
        model(torch.zeros(3, 1, 4))
    flat = FlatParams(model)
    with pytest.raises(ValueError, match=r"labels y have shape \(2,\); expected \[k=2, B=1\]"):
        loss_and_grad(model, flat, torch.zeros(2, 1, 4), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"buffers have shape \(2, 1\); expected \[k=2, d_buf=0\]"):
        flat.load_buffers_flat(torch.zeros(2, 1))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        evaluate(model, torch.zeros(3, 4), torch.zeros(3, dtype=torch.long), batch_size=0)
