"""Synthetic problems: a Gaussian-mixture classification dataset and heterogeneous quadratics.

`load_gaussian_mixture` — C classes in R^d; class means μ_c ~ N(0, s²/(2d) · I) so that the typical
distance between two means is ≈ s (= ``separation``) noise standard deviations; samples
x = μ_y + N(0, I) with balanced labels, seeded stratified train/test split.

`HeterogeneousQuadratics` — the random-quadratics test problem of the RelaySGD paper (Vogels et al.
2021, ``paper-figures/random_quadratics.py``; docs/algorithms.md#reproduction-targets), with the
heterogeneity set in closed form instead of by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from concord.core.data.base import (
    Dataset,
    check_fraction,
    check_positive_int,
    split_dataset,
    stratified_split,
)


def load_gaussian_mixture(
    *,
    seed: int = 0,
    num_classes: int = 10,
    dim: int = 20,
    num_samples: int = 10000,
    separation: float = 4.0,
    test_fraction: float = 0.2,
) -> Dataset:
    """Gaussian-mixture classification dataset.

    Hyperparameters: num_classes ≥ 2, dim ≥ 1, num_samples ≥ 2·num_classes (labels i mod C, so
    classes are balanced), separation > 0 (typical distance between class means in units of the
    unit noise std; 4 gives roughly 80–90 % Bayes accuracy for 10 classes in 20 dimensions),
    test_fraction in (0, 1). Deterministic given all parameters and ``seed``.
    """
    C = check_positive_int("num_classes", num_classes, 2)
    d = check_positive_int("dim", dim, 1)
    N = check_positive_int("num_samples", num_samples, 2 * C)
    if (
        isinstance(separation, bool)
        or not isinstance(separation, int | float)
        or not (0 < separation < math.inf)
    ):
        raise ValueError(f"separation must be a finite number > 0, got {separation!r}")
    tf = check_fraction("test_fraction", test_fraction)
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((C, d)) * (float(separation) / math.sqrt(2 * d))
    y = np.arange(N, dtype=np.int64) % C
    x = means[y] + rng.standard_normal((N, d))
    split = stratified_split(y, tf, rng)
    return split_dataset(
        "gaussian-mixture",
        x.astype(np.float32),
        y,
        split,
        num_classes=C,
        meta={
            "source": "generated",
            "seed": seed,
            "num_classes": C,
            "dim": d,
            "num_samples": N,
            "separation": float(separation),
            "test_fraction": tf,
        },
    )


class HeterogeneousQuadratics:
    """n least-squares objectives f_i(x) = ½ ‖A_i x − b_i‖², x ∈ R^d; global f = (1/n) Σ_i f_i.

    Construction (RelaySGD paper style, seeded torch.Generator, float64):

    - A_i ~ N(0, 1)^{d×d}, rescaled so that the largest eigenvalue of H_i = A_iᵀA_i is L (each f_i
      is L-smooth); with ``mu`` given, the eigenvalues of H_i are set to linspace(mu, L, d) instead
      (each f_i is also mu-strongly convex);
    - b_i = A_i c_i with local optima c_i = x₀ + s·v_i, v_i ~ N(0, I); the gradient at the global
      optimum, ∇f_i(x*) = A_iᵀA_i(x* − c_i), is linear in s, so s is chosen in closed form such that
      the heterogeneity ζ² = (1/n) Σ_i ‖∇f_i(x*)‖² equals ``zeta2`` exactly;
    - x₀ is chosen so that the global optimum x* lies at distance ``r0`` from the origin.

    Stochastic gradients add ξ ~ N(0, sigma2/d · I), so E‖ξ‖² = sigma2.

    Hyperparameters: n ≥ 1, d ≥ 1, zeta2 ≥ 0 (must be 0 when n = 1), sigma2 ≥ 0, L > 0,
    0 < mu < L or None, r0 ≥ 0.

    Attributes: ``A`` [n, d, d], ``b`` [n, d], ``H`` = AᵀA [n, d, d], ``optimum`` [d] (float64),
    ``f_star`` = f(optimum).
    """

    def __init__(
        self,
        n: int,
        d: int = 10,
        *,
        zeta2: float = 1.0,
        sigma2: float = 0.0,
        seed: int = 0,
        L: float = 1.0,
        mu: float | None = None,
        r0: float = 1.0,
    ) -> None:
        self.n = check_positive_int("n", n)
        self.d = check_positive_int("d", d)
        for name, v in (("zeta2", zeta2), ("sigma2", sigma2), ("r0", r0)):
            if not 0 <= v < math.inf:
                raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
        if not 0 < L < math.inf:
            raise ValueError(f"L must be a finite number > 0, got {L!r}")
        if mu is not None and not 0 < mu < L:
            raise ValueError(f"mu must be None or in (0, L={L}), got {mu!r}")
        if self.n == 1 and zeta2 > 0:
            raise ValueError(f"zeta2 must be 0 for a single worker (n=1), got {zeta2}")
        self.zeta2 = float(zeta2)
        self.sigma2 = float(sigma2)
        g = torch.Generator().manual_seed(seed)
        dt = torch.float64
        A = torch.randn(self.n, self.d, self.d, generator=g, dtype=dt)
        U, S, Vh = torch.linalg.svd(A)
        if mu is None:
            S = S * (math.sqrt(L) / S[:, :1])
        else:
            S = torch.linspace(mu, L, self.d, dtype=dt).flip(0).sqrt().expand(self.n, -1)
        A = U @ torch.diag_embed(S) @ Vh
        H = A.transpose(1, 2) @ A
        Hsum = H.sum(0)
        V = torch.randn(self.n, self.d, generator=g, dtype=dt)
        # x* − x₀ = s·w with w = (Σ H_i)⁻¹ Σ H_i v_i;  ∇f_i(x*) = s · H_i (w − v_i).
        w = torch.linalg.solve(Hsum, torch.einsum("nij,nj->i", H, V))
        G = torch.einsum("nij,nj->ni", H, w[None, :] - V)
        base = float((G**2).sum(1).mean())
        s = math.sqrt(self.zeta2 / base) if base > 0 else 0.0
        target = torch.randn(self.d, generator=g, dtype=dt)
        target = target * (r0 / float(target.norm())) if float(target.norm()) > 0 else target
        x0 = target - s * w
        C = x0[None, :] + s * V  # local optima c_i
        self.A = A
        self.H = H
        self.c = C
        self.b = torch.einsum("nij,nj->ni", A, C)
        self.optimum = torch.linalg.solve(Hsum, torch.einsum("nji,nj->i", A, self.b))
        self.f_star = self.loss(self.optimum)

    def grad(
        self, X: torch.Tensor, ranks: Sequence[int], generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Gradients of the workers ``ranks`` at the rows of X: [k, d] → [k, d] (X's dtype).

        Row j is ∇f_{ranks[j]}(X[j]) = A_rᵀ(A_r X[j] − b_r), plus N(0, sigma2/d · I) noise drawn
        from ``generator`` when sigma2 > 0 (a generator is then required).
        """
        idx = self._ranks(X, ranks)
        H = self.H[idx].to(X.dtype)
        c = self.c[idx].to(X.dtype)
        out = torch.einsum("kij,kj->ki", H, X - c)
        if self.sigma2 > 0:
            if generator is None:
                raise ValueError("sigma2 > 0 needs a torch.Generator for the gradient noise")
            noise = torch.randn(X.shape, generator=generator, dtype=X.dtype, device=X.device)
            out = out + noise * math.sqrt(self.sigma2 / self.d)
        return out

    def local_losses(self, X: torch.Tensor, ranks: Sequence[int]) -> torch.Tensor:
        """f_{ranks[j]}(X[j]) for each row: [k, d] → [k] (float64)."""
        idx = self._ranks(X, ranks)
        r = torch.einsum("kij,kj->ki", self.A[idx], X.to(torch.float64)) - self.b[idx]
        return 0.5 * (r**2).sum(1)

    def loss(self, x: torch.Tensor) -> float:
        """Global f(x) = (1/n) Σ_i ½ ‖A_i x − b_i‖² at a single point x [d]."""
        if x.shape != (self.d,):
            raise ValueError(f"x must have shape [{self.d}], got {tuple(x.shape)}")
        r = torch.einsum("nij,j->ni", self.A, x.to(torch.float64)) - self.b
        return float(0.5 * (r**2).sum(1).mean())

    def measured_zeta2(self) -> float:
        """(1/n) Σ_i ‖∇f_i(x*)‖² recomputed from the problem (equals ``zeta2`` up to rounding)."""
        G = self.grad(self.optimum.expand(self.n, -1), range(self.n))
        return float((G**2).sum(1).mean())

    def _ranks(self, X: torch.Tensor, ranks: Sequence[int]) -> torch.Tensor:
        idx = torch.as_tensor(list(ranks), dtype=torch.int64)
        if X.dim() != 2 or X.shape[1] != self.d or X.shape[0] != idx.numel():
            raise ValueError(
                f"X must have shape [len(ranks)={idx.numel()}, d={self.d}], got {tuple(X.shape)}"
            )
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.n):
            raise ValueError(f"ranks must lie in 0..{self.n - 1}, got {list(ranks)}")
        return idx
