"""Datasets: MNIST-1D generation and cache, digits, Gaussian mixture, CIFAR-10 files, quadratics."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from concord.core.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    DATASET_NAMES,
    DATASETS,
    DatasetNotFoundError,
    HeterogeneousQuadratics,
    UnsafePickleError,
    augment_cifar,
    dataset_options,
    load_dataset,
)
from concord.core.data import mnist1d as m1d
from concord.core.data.base import stratified_split
from concord.core.data.cifar import TEST_FILE, TRAIN_FILES, restricted_load
from concord.core.data.datasets import DIGITS_FILE, read_digits
from concord.core.registry import UnknownNameError

torch.set_num_threads(1)


# ---------------------------------------------------------------- registry / load_dataset


def test_every_dataset_name_is_registered() -> None:
    assert list(DATASETS.names()) == list(DATASET_NAMES)


def test_unknown_dataset_and_option_errors_name_the_choices(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="mnist1d"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match=r"no option\(s\) bogus; valid: .*num_samples"):
        load_dataset("mnist1d", cache_dir=tmp_path, bogus=1)
    with pytest.raises(ValueError, match="seed"):
        load_dataset("digits", seed=-1)
    assert "test_fraction" in dataset_options("digits")


# ---------------------------------------------------------------- MNIST-1D


def test_mnist1d_shapes_balance_and_standardisation(tmp_path: Path) -> None:
    ds = load_dataset("mnist1d", seed=1, cache_dir=tmp_path, num_samples=1000)
    assert ds.input_shape == (40,)
    assert ds.x_train.shape == (800, 40)
    assert ds.x_test.shape == (200, 40)
    assert ds.x_train.dtype == torch.float32
    assert ds.y_train.dtype == torch.int64
    counts = torch.bincount(torch.cat([ds.y_train, ds.y_test]), minlength=10)
    assert counts.tolist() == [100] * 10  # num_samples // 10 per class by construction
    train_counts = torch.bincount(ds.y_train, minlength=10)
    assert int(train_counts.min()) >= 60
    assert int(train_counts.max()) <= 100
    x = torch.cat([ds.x_train, ds.x_test]).double()
    # standardised with the scalar statistics of the whole set; float32 storage → 1e-5
    assert abs(float(x.mean())) < 1e-5
    assert abs(float(x.std(unbiased=False)) - 1) < 1e-5
    json.dumps(ds.meta)


def test_mnist1d_is_deterministic_per_seed() -> None:
    a = load_dataset("mnist1d", seed=3, num_samples=500, use_cache=False)
    b = load_dataset("mnist1d", seed=3, num_samples=500, use_cache=False)
    c = load_dataset("mnist1d", seed=4, num_samples=500, use_cache=False)
    assert torch.equal(a.x_train, b.x_train)
    assert torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_train, c.x_train)
    assert a.meta["cache_path"] is None


def test_mnist1d_cache_is_written_then_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_dataset("mnist1d", seed=0, cache_dir=tmp_path, num_samples=300)
    assert first.meta["cache_hit"] is False
    files = list(tmp_path.glob("mnist1d-*.npz"))
    assert [str(f) for f in files] == [first.meta["cache_path"]]

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("regenerated although a cache file exists")

    monkeypatch.setattr(m1d, "generate_mnist1d", fail)
    second = load_dataset("mnist1d", seed=0, cache_dir=tmp_path, num_samples=300)
    assert second.meta["cache_hit"] is True
    assert torch.equal(first.x_train, second.x_train)
    assert torch.equal(first.y_test, second.y_test)
    # another parameter → another key, so no stale reuse
    with pytest.raises(AssertionError, match="regenerated"):
        load_dataset("mnist1d", seed=0, cache_dir=tmp_path, num_samples=300, shear_scale=0.5)


def test_mnist1d_corrupt_cache_is_regenerated(tmp_path: Path) -> None:
    first = load_dataset("mnist1d", seed=0, cache_dir=tmp_path, num_samples=200)
    Path(first.meta["cache_path"]).write_bytes(b"not a zip file")
    again = load_dataset("mnist1d", seed=0, cache_dir=tmp_path, num_samples=200)
    assert again.meta["cache_hit"] is False
    assert torch.equal(first.x_train, again.x_train)


def test_mnist1d_cache_dir_defaults_to_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCORD_CACHE", str(tmp_path / "c"))
    ds = load_dataset("mnist1d", num_samples=100)
    assert Path(ds.meta["cache_path"]).parent == tmp_path / "c"


def test_mnist1d_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="train_split"):
        m1d.generate_mnist1d(0, train_split=1.5)
    with pytest.raises(ValueError, match="padding"):
        m1d.generate_mnist1d(0, padding=(10, 5))
    with pytest.raises(ValueError, match="num_samples"):
        m1d.generate_mnist1d(0, num_samples=3)


def test_mnist1d_smoothing_matches_scipy_gaussian_filter() -> None:
    ndimage = pytest.importorskip("scipy.ndimage")
    z = np.random.default_rng(0).standard_normal((4, 72))
    ref = ndimage.gaussian_filter1d(z, 2.0, axis=1, mode="reflect")
    np.testing.assert_allclose(m1d.gaussian_smooth(z), ref, atol=1e-12)  # same filter, fp64


def test_mnist1d_templates_start_at_zero_and_signals_carry_class_information() -> None:
    t = m1d.templates()
    assert t.shape == (10, 12)
    assert np.allclose(t[:, 0], 0)
    assert np.allclose(t[:, -1], 0)
    x_tr, y_tr, x_te, y_te = m1d.generate_mnist1d(0, num_samples=2000)
    # nearest class centroid beats chance (10 %) clearly; the paper's linear model reaches ~32 %
    cent = np.stack([x_tr[y_tr == c].mean(0) for c in range(10)])
    pred = ((x_te[:, None, :] - cent[None]) ** 2).sum(-1).argmin(1)
    assert (pred == y_te).mean() > 0.2


# ---------------------------------------------------------------- digits and Gaussian mixture


def test_digits_stratified_split_in_unit_range() -> None:
    a = load_dataset("digits", seed=0, root="/nonexistent", cache_dir="/nonexistent")
    b = load_dataset("digits", seed=0)
    assert a.input_shape == (1, 8, 8)
    assert a.x_train.shape[1:] == (1, 8, 8)
    assert a.num_train + a.num_test == 1797
    assert float(a.x_train.min()) >= 0
    assert float(a.x_train.max()) <= 1
    assert torch.equal(a.x_train, b.x_train)
    total = torch.bincount(torch.cat([a.y_train, a.y_test]), minlength=10).double()
    test = torch.bincount(a.y_test, minlength=10).double()
    assert torch.all((test - 0.2 * total).abs() <= 0.5)  # round(0.2·count) per class


def test_shipped_digits_file_equals_scikit_learns_copy() -> None:
    """digits.npz (scripts/export_digits.py) holds exactly sklearn's load_digits, and the loader
    gives what the former sklearn-based loader gave: pixels ÷ 16 as float32, the same split."""
    datasets = pytest.importorskip(
        "sklearn.datasets",
        reason="scikit-learn is not installed (it comes with the dev extra); nothing to compare",
    )
    bunch = datasets.load_digits()
    data, target = read_digits()
    assert data.dtype == np.uint8
    assert target.dtype == np.uint8
    assert np.array_equal(data, bunch.data)
    assert np.array_equal(target, bunch.target)
    ds = load_dataset("digits", seed=5, test_fraction=0.3)
    x = (np.asarray(bunch.data, dtype=np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = np.asarray(bunch.target, dtype=np.int64)
    tr, te = stratified_split(y, 0.3, np.random.default_rng(5))
    assert torch.equal(ds.x_train, torch.from_numpy(x[tr]))
    assert torch.equal(ds.y_test, torch.from_numpy(y[te]))


def test_digits_load_from_package_data_without_sklearn() -> None:
    """The digits file is package data and loading it never imports scikit-learn (checked in a
    fresh interpreter, where no other test can have imported sklearn already)."""
    import importlib.resources

    assert (importlib.resources.files("concord.core.data") / DIGITS_FILE).is_file()
    code = (
        "import sys\n"
        "from concord.core.data import load_dataset\n"
        "ds = load_dataset('digits', seed=0)\n"
        "assert ds.num_train + ds.num_test == 1797, ds\n"
        "assert 'sklearn' not in sys.modules, 'loading digits imported sklearn'\n"
        "sys.modules['sklearn'] = None  # and it works where sklearn cannot be imported at all\n"
        "assert load_dataset('digits', seed=1).num_test == ds.num_test\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr


def test_gaussian_mixture_is_seeded_balanced_and_learnable() -> None:
    d = load_dataset("gaussian-mixture", seed=2, num_classes=5, dim=8, num_samples=2000)
    e = load_dataset("gaussian-mixture", seed=2, num_classes=5, dim=8, num_samples=2000)
    assert torch.equal(d.x_test, e.x_test)
    assert d.input_shape == (8,)
    assert d.num_classes == 5
    assert torch.bincount(d.y_train, minlength=5).tolist() == [320] * 5
    mu = torch.stack([d.x_train[d.y_train == c].mean(0) for c in range(5)])
    acc = (torch.cdist(d.x_test, mu).argmin(1) == d.y_test).float().mean()
    assert acc > 0.6  # separation 4 → ~0.8-0.9 Bayes accuracy; nearest mean is near-optimal


# ---------------------------------------------------------------- CIFAR-10


_PurePythonPickler: Any = pickle._Pickler  # the pure-Python pickler has an overridable dispatch


class _Py2Pickler(_PurePythonPickler):
    """Writes str and bytes as Python 2 ``str`` opcodes (BINSTRING), like the official files."""

    dispatch = _PurePythonPickler.dispatch.copy()

    def _save_py2_str(self, obj: str | bytes) -> None:
        b = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(b) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(b)]) + b)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(b)) + b)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str
    dispatch[str] = _save_py2_str


def _py2_pickle(obj: object) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    # the official files were written by numpy 1.x under Python 2: numpy.core, not numpy._core
    return buf.getvalue().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")


def _write_fake_cifar(directory: Path, per_batch: int = 3) -> dict[str, np.ndarray]:
    """Batch files in the official format: Python-2 protocol-2 pickles of dicts with str keys."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written: dict[str, np.ndarray] = {}
    for name in (*TRAIN_FILES, TEST_FILE):
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=per_batch)]
        obj = {
            b"batch_label": name.encode(),
            b"labels": labels,
            b"data": data,
            b"filenames": [f"img{i}.png".encode() for i in range(per_batch)],
        }
        payload = _py2_pickle(obj)
        assert b"numpy.core.multiarray\n_reconstruct" in payload
        assert b"_codecs" not in payload
        (directory / name).write_bytes(payload)
        written[name] = data
    return written


def test_cifar_loads_fake_batches_and_normalises(tmp_path: Path) -> None:
    d = tmp_path / "cifar-10-batches-py"
    raw = _write_fake_cifar(d)
    ds = load_dataset("cifar10", root=d)
    assert ds.x_train.shape == (15, 3, 32, 32)
    assert ds.x_test.shape == (3, 3, 32, 32)
    assert ds.input_shape == (3, 32, 32)
    assert ds.y_train.dtype == torch.int64
    px = raw["data_batch_2"][1].reshape(3, 32, 32)[2, 5, 7]  # channel 2, row 5, col 7
    want = (px / 255.0 - CIFAR10_MEAN[2]) / CIFAR10_STD[2]
    assert abs(float(ds.x_train[4, 2, 5, 7]) - want) < 1e-5  # float32 arithmetic
    # the parent directory works too, and so does $CONCORD_DATA
    assert load_dataset("cifar10", root=tmp_path).num_train == 15
    json.dumps(ds.meta)


def test_cifar_missing_files_raise_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONCORD_DATA", str(tmp_path))
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("cifar10")
    msg = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    assert str((tmp_path / "cifar-10-batches-py").resolve()) in msg
    assert "data_batch_1" in msg
    assert "test_batch" in msg
    assert "Nothing is downloaded" in msg


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_os_system(tmp_path: Path) -> None:
    d = tmp_path / "cifar-10-batches-py"
    _write_fake_cifar(d)
    marker = tmp_path / "pwned"
    (d / "data_batch_3").write_bytes(_py2_pickle({b"data": _Evil(marker)}))
    with pytest.raises(UnsafePickleError, match=r"data_batch_3.*(posix|os|nt)\.system"):
        load_dataset("cifar10", root=d)
    assert not marker.exists()


def test_restricted_unpickler_allows_plain_arrays_only() -> None:
    arr = np.arange(6, dtype=np.uint8).reshape(2, 3)
    out = restricted_load(pickle.dumps({b"a": arr, b"l": [1, "x", b"y"]}, protocol=4))
    np.testing.assert_array_equal(out[b"a"], arr)  # Python-3-written files load too
    with pytest.raises(UnsafePickleError, match="object dtype"):
        restricted_load(pickle.dumps(np.array([1, "a"], dtype=object), protocol=4))
    with pytest.raises(UnsafePickleError, match="recarray"):  # array subclasses refused
        restricted_load(pickle.dumps(np.arange(3).view(np.recarray), protocol=4))
    with pytest.raises(UnsafePickleError, match=r"_codecs\.encode"):
        restricted_load(pickle.dumps(b"bytes via protocol 2 need a global", protocol=2))


def test_augment_cifar_crops_and_flips_each_image() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 3, 32, 32, generator=g)  # [k, B, C, H, W]; distinct values everywhere
    out = augment_cifar(x, torch.Generator().manual_seed(1), fill=0.0)
    again = augment_cifar(x, torch.Generator().manual_seed(1), fill=0.0)
    assert out.shape == x.shape
    assert torch.equal(out, again)
    padded = torch.nn.functional.pad(x.reshape(-1, 3, 32, 32), (4, 4, 4, 4))
    for img, src in zip(out.reshape(-1, 3, 32, 32), padded, strict=True):
        candidates = [
            src[:, oy : oy + 32, ox : ox + 32].flip(-1)
            if flip
            else src[:, oy : oy + 32, ox : ox + 32]
            for oy in range(9)
            for ox in range(9)
            for flip in (False, True)
        ]
        assert sum(torch.equal(img, c) for c in candidates) == 1


def test_augment_cifar_draws_varied_offsets_and_flips() -> None:
    x = torch.arange(32.0).expand(400, 1, 32, 32).contiguous()  # value = column index
    out = augment_cifar(x, torch.Generator().manual_seed(0), padding=4, fill=-1.0)
    row = out[:, 0, 16]  # middle row: columns of the crop, possibly reversed
    flipped = (row[:, 16] < row[:, 15]).float().mean()
    assert 0.4 < float(flipped) < 0.6  # Bernoulli(½) over 400 images: ±0.1 is 4σ
    assert len({tuple(r.tolist()) for r in row}) > 10  # many distinct horizontal offsets


# ---------------------------------------------------------------- heterogeneous quadratics


def test_quadratics_heterogeneity_and_optimum() -> None:
    q = HeterogeneousQuadratics(8, 10, zeta2=0.3, seed=1, r0=2.0)
    assert abs(q.measured_zeta2() - 0.3) < 1e-9  # closed-form scale, float64
    assert abs(float(q.optimum.norm()) - 2.0) < 1e-9
    G = q.grad(q.optimum.expand(8, -1), range(8))
    assert float(G.mean(0).norm()) < 1e-10  # x* is a stationary point of the average
    other = q.optimum + 0.1 * torch.ones(10, dtype=torch.float64)
    assert q.loss(other) > q.f_star
    assert float(torch.linalg.eigvalsh(q.H).max()) == pytest.approx(1.0, abs=1e-9)  # L = 1


def test_quadratics_grad_matches_autograd_and_noise_has_variance_sigma2() -> None:
    q = HeterogeneousQuadratics(4, 6, zeta2=1.0, sigma2=0.5, seed=0)
    X = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    ranks = [2, 0, 3]
    q.local_losses(X, ranks).sum().backward()
    assert X.grad is not None
    exact = HeterogeneousQuadratics(4, 6, zeta2=1.0, sigma2=0.0, seed=0).grad(X.detach(), ranks)
    torch.testing.assert_close(exact, X.grad)
    with pytest.raises(ValueError, match="Generator"):
        q.grad(X.detach(), ranks, None)
    g = torch.Generator().manual_seed(0)
    Xs = X.detach()[:1].expand(4000, -1)
    noise = q.grad(Xs, [2] * 4000, g) - exact[:1]
    # mean of 4000 χ²-type draws: relative std ≈ sqrt(2/6/4000) ≈ 0.01, so 5 % is 5σ
    assert abs(float((noise**2).sum(1).mean()) - 0.5) < 0.025


def test_quadratics_gradient_descent_reaches_the_optimum() -> None:
    q = HeterogeneousQuadratics(5, 4, zeta2=1.0, seed=0, mu=0.2)
    x = torch.zeros(4, dtype=torch.float64)
    for _ in range(300):
        x = x - 1.0 * q.grad(x.expand(5, -1), range(5)).mean(0)
    assert q.loss(x) - q.f_star < 1e-12  # strongly convex (mu = 0.2, L = 1): linear rate 0.8^t
