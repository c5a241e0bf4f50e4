"""Weight rules, lazy matrices, validation and spectral helpers (concord.core.graphs.mixing)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from concord.core.graphs.graph import Graph, TopologyError, UnknownTopologyError
from concord.core.graphs.mixing import (
    WEIGHT_RULES,
    consensus_contraction,
    lazy,
    metropolis_hastings,
    mixing_p,
    pairwise,
    spectral_gap,
    spectral_values,
    uniform,
    validate_mixing,
    weights_for,
)
from concord.core.graphs.topology import build_graph

# Matrices built from a handful of float additions are exact to ~1e-15; 1e-12 leaves margin
# without hiding a wrong weight (the smallest weight difference tested is ≥ 1e-3).
ATOL = 1e-12


def _random_graph(n: int, prob: float, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < prob]
    pairs += [(i, i + 1) for i in range(n - 1)]  # keep it connected
    return Graph.from_edges(n, pairs)


def test_weight_rule_names() -> None:
    assert WEIGHT_RULES == ("metropolis", "uniform", "pairwise")


def test_metropolis_ring_is_one_third() -> None:
    W = metropolis_hastings(build_graph("ring", 10))
    for i in range(10):
        assert W[i, i] == pytest.approx(1 / 3, abs=ATOL)
        assert W[i, (i + 1) % 10] == pytest.approx(1 / 3, abs=ATOL)
        assert W[i, (i + 5) % 10] == 0.0


def test_metropolis_complete_is_exact_average() -> None:
    W = metropolis_hastings(build_graph("complete", 7))
    np.testing.assert_allclose(W, np.full((7, 7), 1 / 7), atol=ATOL)


def test_metropolis_star_weights() -> None:
    n = 6
    W = metropolis_hastings(build_graph("star", n))
    # every edge touches the centre (degree n−1) → 1/n; leaves keep 1 − 1/n; centre keeps 1/n
    assert W[0, 3] == pytest.approx(1 / n, abs=ATOL)
    assert W[3, 3] == pytest.approx(1 - 1 / n, abs=ATOL)
    assert W[0, 0] == pytest.approx(1 / n, abs=ATOL)
    assert W[2, 3] == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metropolis_valid_on_irregular_graphs(seed: int) -> None:
    g = _random_graph(20, 0.2, seed)
    W = metropolis_hastings(g)
    validate_mixing(W, graph=g)  # raises if not symmetric / doubly stochastic / off-support
    assert np.all(W >= 0)


def test_uniform_on_regular_graph() -> None:
    W = uniform(build_graph("torus", 16))
    assert W[0, 0] == pytest.approx(1 / 5, abs=ATOL)
    assert np.count_nonzero(W[0]) == 5
    validate_mixing(W)


def test_uniform_refuses_irregular_graph() -> None:
    with pytest.raises(TopologyError, match=r"'uniform' need a regular graph.*degrees 1\.\.15"):
        uniform(build_graph("star", 16), what="star (n=16)")


def test_pairwise_on_matching_and_refused_otherwise() -> None:
    g = Graph.from_edges(5, [(0, 3), (1, 2)])  # node 4 unmatched
    W = pairwise(g)
    assert W[0, 3] == W[3, 0] == W[0, 0] == 0.5
    assert W[4, 4] == 1.0
    validate_mixing(W, graph=g)
    with pytest.raises(TopologyError, match=r"need a matching.*max degree 2"):
        pairwise(build_graph("ring", 6))


def test_metropolis_equals_pairwise_on_matchings() -> None:
    g = Graph.from_edges(6, [(0, 5), (1, 4), (2, 3)])
    np.testing.assert_allclose(metropolis_hastings(g), pairwise(g), atol=ATOL)


def test_weights_for_unknown_rule_lists_valid() -> None:
    with pytest.raises(UnknownTopologyError, match="metropolis, uniform, pairwise"):
        weights_for("uniformm", build_graph("ring", 4))


def test_lazy_maps_eigenvalues() -> None:
    W = metropolis_hastings(build_graph("ring", 16))
    l2, ln = spectral_values(W)
    for kappa in (1.0, 0.5, 0.1, 0.01):
        Wk = lazy(W, kappa)
        validate_mixing(Wk)
        k2, kn = spectral_values(Wk)
        # eigenvalue map λ ↦ κλ + 1 − κ is affine and order-preserving
        assert k2 == pytest.approx(kappa * l2 + 1 - kappa, abs=ATOL)
        assert kn == pytest.approx(kappa * ln + 1 - kappa, abs=ATOL)
    assert lazy(W, 1.0) is not W


@pytest.mark.parametrize("kappa", [0.0, -0.1, 1.5, math.nan, math.inf, "x"])
def test_lazy_rejects_bad_kappa(kappa: object) -> None:
    with pytest.raises(TopologyError, match=r"kappa must be .*\(0, 1\]"):
        lazy(np.eye(3), kappa)  # type: ignore[arg-type]


def test_validate_accepts_valid() -> None:
    validate_mixing(np.full((4, 4), 0.25))
    validate_mixing(np.eye(3))


@pytest.mark.parametrize(
    ("W", "pattern"),
    [
        (np.ones((2, 3)) / 3, r"W must be a non-empty square .*shape \(2, 3\)"),
        (np.ones(4), r"square 2-D matrix"),
        (np.array([[1.5, -0.5], [-0.5, 1.5]]), r"negative entries: W\[0, 1\] = -0.5"),
        (np.array([[0.5, 0.5], [0.3, 0.7]]), r"not symmetric: W\[0, 1\] = 0.5 but W\[1, 0\] = 0.3"),
        (np.array([[0.5, 0.2], [0.2, 0.8]]), r"W row 0 sums to 0.7, not 1"),
        (np.array([[np.nan, 0.5], [0.5, 0.5]]), r"non-finite entries: W\[0, 0\]"),
        (np.array([[1 + 0j, 0], [0, 1]]), r"real numeric matrix"),
    ],
)
def test_validate_rejects(W: np.ndarray, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        validate_mixing(W)


def test_validate_names_the_matrix_and_checks_support() -> None:
    with pytest.raises(TopologyError, match=r"^W_3 row 1 sums"):
        validate_mixing(np.array([[1.0, 0, 0], [0, 0.9, 0], [0, 0, 1.0]]), what="W_3")
    g = Graph.from_edges(3, [(0, 1)])
    W = np.array([[0.5, 0.25, 0.25], [0.25, 0.75, 0.0], [0.25, 0.0, 0.75]])
    with pytest.raises(TopologyError, match=r"W\[0, 2\] = 0.25 but \(0, 2\) is not an edge"):
        validate_mixing(W, graph=g)


@pytest.mark.parametrize("n", [6, 16, 33])
def test_ring_spectral_closed_form(n: int) -> None:
    W = metropolis_hastings(build_graph("ring", n))
    l2, ln = spectral_values(W)
    # eigenvalues 1/3 + (2/3)cos(2πk/n) (docs/algorithms.md#spectral-quantities); eigvalsh is
    # accurate to ~1e-15
    assert l2 == pytest.approx(1 / 3 + 2 / 3 * math.cos(2 * math.pi / n), abs=1e-12)
    k_min = n // 2
    assert ln == pytest.approx(1 / 3 + 2 / 3 * math.cos(2 * math.pi * k_min / n), abs=1e-12)
    lam = max(abs(l2), abs(ln))
    assert spectral_gap(W) == pytest.approx(1 - lam, abs=1e-12)
    assert mixing_p(W) == pytest.approx(1 - lam**2, abs=1e-12)


def test_gap_extremes() -> None:
    assert spectral_gap(np.full((5, 5), 0.2)) == pytest.approx(1.0, abs=1e-12)
    blocks = np.zeros((4, 4))
    blocks[:2, :2] = blocks[2:, 2:] = 0.5  # two disconnected pairs
    assert spectral_gap(blocks) == pytest.approx(0.0, abs=1e-12)
    assert mixing_p(np.eye(3)) == pytest.approx(0.0, abs=1e-12)


def test_contraction_of_non_symmetric_product_is_singular_value() -> None:
    g1 = Graph.from_edges(4, [(0, 1), (2, 3)])
    g2 = Graph.from_edges(4, [(1, 2)])
    P = pairwise(g2) @ pairwise(g1)
    assert not np.allclose(P, P.T)
    J = np.full((4, 4), 0.25)
    expected = np.linalg.svd(P - J, compute_uv=False)[0]
    assert consensus_contraction(P) == pytest.approx(expected, abs=1e-12)
    l2, ln = spectral_values(P)
    assert l2 >= ln
