"""Consensus distance Ξ, local statistic θ_i, estimator Θ and its sandwich bounds (Kong 2021)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from concord.core.control.consensus import (
    consensus_distance,
    grad_norms,
    local_theta,
    squared_row_norms,
    theta,
)

torch.set_num_threads(1)

N = 16
# Float64 round-off of sums over n·d ≈ 10³ terms is ~1e-13 relative; 1e-9 leaves ample margin
# while still catching any real violation of the bounds (the equality cases are exact in theory).
REL = 1e-9


def ring_w(n: int) -> np.ndarray:
    """Ring mixing matrix with weights 1/3 (self and both neighbours), float64 [n, n]."""
    eye = np.eye(n)
    return (eye + np.roll(eye, 1, axis=1) + np.roll(eye, -1, axis=1)) / 3.0


def spectrum(W: np.ndarray) -> tuple[float, float, float]:
    """(λ₂, λₙ, p) of a symmetric W; p = 1 − max(|λ₂|, |λₙ|)²."""
    ev = np.sort(np.linalg.eigvalsh(W))[::-1]
    lam2, lamn = float(ev[1]), float(ev[-1])
    lam = max(abs(lam2), abs(lamn))
    return lam2, lamn, 1.0 - lam * lam


def one_round_theta(W: np.ndarray, X: np.ndarray) -> float:
    """Θ after one gossip round X ← W X, via the library's local θ_i (each row's own change)."""
    before = torch.from_numpy(X)
    after = torch.from_numpy(W @ X)
    thetas = local_theta(before, after)
    # Θ² = (1/n) Σ θ_i, checked here against the definition as well
    assert theta(thetas) ** 2 == pytest.approx(float(thetas.mean()), rel=1e-12)  # fsum vs mean
    return theta(thetas)


def test_ring_spectrum_matches_closed_form() -> None:
    lam2, lamn, p = spectrum(ring_w(N))
    # closed form 1/3 + (2/3)cos(2π/n) for λ₂ and −1/3 for even n
    # (docs/algorithms.md#spectral-quantities); eigvalsh is accurate to ~1e-15 for a 16×16 symmetric
    # matrix
    assert lam2 == pytest.approx(1 / 3 + 2 / 3 * np.cos(2 * np.pi / N), abs=1e-12)
    assert lamn == pytest.approx(-1 / 3, abs=1e-12)
    assert p == pytest.approx(0.0989, abs=1e-4)  # docs/algorithms.md#spectral-quantities


def test_consensus_distance_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, 37)) + 5.0
    direct = np.sqrt(np.var(X, axis=0).sum())  # population variance across replicas, summed
    frob = np.sqrt(np.linalg.norm(X - X.mean(axis=0), "fro") ** 2 / N)
    assert consensus_distance(torch.from_numpy(X)) == pytest.approx(direct, rel=1e-12)
    assert direct == pytest.approx(frob, rel=1e-12)  # same definition, two round-off paths
    # float32 input is reduced in float64: only the float32 storage of X itself differs
    X32 = torch.from_numpy(X).float()
    expect32 = np.sqrt(np.var(X32.double().numpy(), axis=0).sum())
    assert consensus_distance(X32) == pytest.approx(expect32, rel=1e-12)
    # trailing dimensions are flattened
    assert consensus_distance(torch.from_numpy(X).reshape(N, 37, 1)) == pytest.approx(direct)


def test_consensus_distance_zero_at_consensus() -> None:
    row = torch.arange(5, dtype=torch.float64)
    assert consensus_distance(row.repeat(N, 1)) == 0.0
    assert consensus_distance(row.unsqueeze(0)) == 0.0


def test_bad_shapes_raise() -> None:
    with pytest.raises(ValueError, match=r"shape \[k, d\]"):
        consensus_distance(torch.zeros(5))
    with pytest.raises(ValueError, match="floating-point"):
        consensus_distance(torch.zeros(3, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="same shape"):
        local_theta(torch.zeros(3, 2), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="empty"):
        theta([])
    with pytest.raises(ValueError, match=r"thetas\[1\]"):
        theta([1.0, -0.5])
    with pytest.raises(ValueError, match=r"thetas\[0\]"):
        theta([float("nan")])


def _check_sandwich(W: np.ndarray, X: np.ndarray) -> tuple[float, float]:
    lam2, lamn, p = spectrum(W)
    xi = consensus_distance(torch.from_numpy(X))
    th = one_round_theta(W, X)
    assert (1 - lam2) ** 2 * xi**2 <= th**2 * (1 + REL)
    assert th**2 <= (1 - lamn) ** 2 * xi**2 * (1 + REL)
    assert th**2 <= 4 * xi**2 * (1 + REL)
    assert xi <= (2 / p) * th * (1 + REL)  # Lemma A.1 of Kong et al.
    return xi, th


def test_sandwich_random_disagreement() -> None:
    rng = np.random.default_rng(1)
    W = ring_w(N)
    for _ in range(5):
        X = rng.normal(size=(N, 64)) * rng.uniform(0.1, 10.0)
        xi, th = _check_sandwich(W, X)
        # random disagreement is mostly high-frequency: Θ is of the order of Ξ
        # (docs/algorithms.md#consensus-distance-and-the-estimator)
        assert 0.5 * xi < th < 1.5 * xi


def test_sandwich_low_frequency_disagreement_is_tight() -> None:
    """Smooth disagreement (the λ₂ eigenvector) attains the lower bound: Θ = (1 − λ₂)Ξ."""
    W = ring_w(N)
    lam2, _, _ = spectrum(W)
    rng = np.random.default_rng(2)
    v = rng.normal(size=(1, 32))
    wave = np.cos(2 * np.pi * np.arange(N) / N)[:, None]
    X = wave * v + rng.normal(size=(1, 32))  # plus a common offset, invisible to both Ξ and Θ
    xi, th = _check_sandwich(W, X)
    assert th == pytest.approx((1 - lam2) * xi, rel=REL)
    assert th < 0.06 * xi  # Θ under-states Ξ ~20× here, as the docstring warns


def test_sandwich_highest_frequency_attains_upper_side() -> None:
    W = ring_w(N)
    _, lamn, _ = spectrum(W)
    X = np.where(np.arange(N) % 2 == 0, 1.0, -1.0)[:, None] * np.ones((1, 8))
    xi, th = _check_sandwich(W, X)
    assert th == pytest.approx((1 - lamn) * xi, rel=REL)


def test_sandwich_on_dsgd_like_disagreement() -> None:
    """Disagreement built by gossip + noisy local steps (as in D-SGD) stays within the bounds."""
    W = ring_w(N)
    rng = np.random.default_rng(3)
    X = np.zeros((N, 20))
    for _ in range(50):
        X = W @ (X - 0.1 * rng.normal(size=X.shape))
    _check_sandwich(W, X)


def test_local_theta_and_grad_norms() -> None:
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
    th = local_theta(torch.from_numpy(a).float(), torch.from_numpy(b).float())
    assert th.shape == (4,)
    assert th.dtype == torch.float64
    # float32 storage of a and b limits agreement to ~1e-6 relative
    np.testing.assert_allclose(th.numpy(), ((b - a) ** 2).sum(axis=1), rtol=1e-5)
    g = grad_norms(torch.from_numpy(a))
    assert g.shape == (4,)
    assert g.dtype == torch.float64
    np.testing.assert_allclose(g.numpy(), np.linalg.norm(a, axis=1), rtol=1e-12)
    assert theta(th) == pytest.approx(theta(th.tolist()), rel=1e-15)  # tensor or list input


def test_local_theta_is_the_float64_norm_of_the_float32_difference() -> None:
    """θ_i of float32 models: their float32 difference, squared norm accumulated in float64.
    Against float64 arithmetic on that difference only the summation order differs (1e-13
    relative over 10⁵ terms); against the float64 difference of the same float32 values each
    squared coordinate moves by at most 2 · 2⁻²⁴ relative (the difference's one rounding)."""
    gen = torch.Generator().manual_seed(5)
    before = torch.randn(3, 100_000, generator=gen)
    after = before + 1e-3 * torch.randn(3, 100_000, generator=gen)
    th = local_theta(before, after)
    exact = (after - before).double().square().sum(dim=1)
    np.testing.assert_allclose(th.numpy(), exact.numpy(), rtol=1e-13)
    wide = (after.double() - before.double()).square().sum(dim=1)
    np.testing.assert_allclose(th.numpy(), wide.numpy(), rtol=2 * 2.0**-24)


def test_squared_row_norms_of_a_lone_row_equal_those_among_others() -> None:
    """A peer reduces its one row alone; the vectorized engine reduces rows in blocks
    (`assign_mixed`): both must give the same bits for the same row."""
    D = torch.randn(5, 300_001, generator=torch.Generator().manual_seed(6))
    together = squared_row_norms(D)
    assert together.dtype == torch.float64
    for i in range(5):
        assert torch.equal(squared_row_norms(D[i : i + 1]), together[i : i + 1])
