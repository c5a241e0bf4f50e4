"""Mixing (gossip) weights on a `Graph`, their validation, and spectral helpers (torch-free).

A mixing matrix W is float64, shape (n, n), with w_ij > 0 only if i = j or (i, j) is an edge.
Every matrix built here is **symmetric and doubly stochastic** (rows and columns sum to 1) with
non-negative entries; `validate_mixing` checks exactly that. One gossip round on row-stacked
models X (n × d) is X ← W X.

Weight rules (docs/algorithms.md#mixing-weights):

* ``metropolis`` — Metropolis–Hastings: w_ij = 1 / (1 + max(deg_i, deg_j)) on each edge,
  w_ii = 1 − Σ_j w_ij (used by the RelaySGD gossip baselines, Vogels et al. NeurIPS 2021).
  Valid for every undirected graph; 1/3 on a ring, 1/n on the complete graph.
* ``uniform`` — row-normalised A + I: w_ij = 1/(deg_i + 1) (Tao Lin's code base,
  quasi-global-momentum). Doubly stochastic only for *regular* graphs, so it is refused otherwise.
* ``pairwise`` — ½ to self, ½ to the peer; only for matchings (max degree ≤ 1); unmatched nodes
  keep weight 1.

Directed schedules (push-sum / SGP, Assran et al. 2019) use **column-stochastic** matrices
instead: `push_weights` gives node i's mass to itself and its out-neighbours in equal shares
(W[j, i] = 1/(outdeg_i + 1) for each arc i → j), and `validate_column_stochastic` checks them
(non-negative, columns sum to 1; rows need not). They are kept apart from the symmetric rule set on
purpose: every other algorithm relies on W being symmetric and doubly stochastic.

Lazy (slack) matrix (DeTAG experiments, Lu & De Sa 2021): W_κ = κ W + (1 − κ) I, κ ∈ (0, 1].
Spectral quantities (docs/algorithms.md#spectral-quantities): λ := max(|λ₂|, |λₙ|) = ‖W − 11ᵀ/n‖₂
for a symmetric doubly-stochastic W; spectral gap 1 − λ; mixing parameter p = 1 − λ² (Koloskova et
al. 2020: ‖XW − X̄‖² ≤ (1 − p)‖X − X̄‖²).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

import numpy as np

from concord.core.graphs.graph import Graph, TopologyError, UnknownTopologyError
from concord.core.registry import Registry


class WeightRule(Protocol):
    """A weight rule: graph → symmetric doubly-stochastic (n, n) float64 matrix."""

    def __call__(self, graph: Graph, *, what: str = "graph") -> np.ndarray: ...


WEIGHT_RULE_REGISTRY: Registry[WeightRule] = Registry("weight rule")


@WEIGHT_RULE_REGISTRY.register("metropolis")
def metropolis_hastings(graph: Graph, *, what: str = "graph") -> np.ndarray:
    """Metropolis–Hastings weights; valid for any undirected graph (``what`` is unused)."""
    n = graph.n
    W = np.zeros((n, n), dtype=np.float64)
    if graph.edges:
        deg = graph.degrees()
        e = np.asarray(graph.edges, dtype=np.int64)
        w = 1.0 / (1.0 + np.maximum(deg[e[:, 0]], deg[e[:, 1]]))
        W[e[:, 0], e[:, 1]] = w
        W[e[:, 1], e[:, 0]] = w
    W[np.diag_indices(n)] = 1.0 - W.sum(axis=1)
    return W


@WEIGHT_RULE_REGISTRY.register("uniform")
def uniform(graph: Graph, *, what: str = "graph") -> np.ndarray:
    """Row-normalised A + I, w_ij = 1/(deg + 1); refused unless the graph is regular."""
    deg = graph.degrees()
    if not graph.is_regular():
        raise TopologyError(
            f"weights 'uniform' need a regular graph (all degrees equal) to be doubly stochastic; "
            f"{what} has degrees {int(deg.min())}..{int(deg.max())}; use weights='metropolis'"
        )
    A = graph.adjacency().astype(np.float64) + np.eye(graph.n)
    return A / (float(deg[0]) + 1.0)


@WEIGHT_RULE_REGISTRY.register("pairwise")
def pairwise(graph: Graph, *, what: str = "graph") -> np.ndarray:
    """Pairwise averaging on a matching: ½ self + ½ peer; unmatched nodes keep their value."""
    if graph.max_degree > 1:
        raise TopologyError(
            f"weights 'pairwise' need a matching (max degree 1); {what} has max degree "
            f"{graph.max_degree}; use weights='metropolis'"
        )
    W = np.eye(graph.n, dtype=np.float64)
    for i, j in graph.edges:
        W[i, i] = W[j, j] = W[i, j] = W[j, i] = 0.5
    return W


WEIGHT_RULES: tuple[str, ...] = tuple(WEIGHT_RULE_REGISTRY.names())


def weights_for(rule: str, graph: Graph, *, what: str = "graph") -> np.ndarray:
    """Apply the named weight rule (one of `WEIGHT_RULES`) to ``graph``."""
    try:
        fn = WEIGHT_RULE_REGISTRY.get(rule)
    except KeyError:
        raise UnknownTopologyError(
            f"unknown weights {rule!r}; valid: {', '.join(WEIGHT_RULES)}"
        ) from None
    return fn(graph, what=what)


def check_kappa(kappa: float) -> float:
    """Validate the lazy factor κ ∈ (0, 1] and return it as a float."""
    try:
        k = float(kappa)
    except (TypeError, ValueError):
        raise TopologyError(f"kappa must be a number in (0, 1]; got {kappa!r}") from None
    if not (math.isfinite(k) and 0.0 < k <= 1.0):
        raise TopologyError(
            f"kappa must be in (0, 1] (lazy W_κ = κW + (1−κ)I; 1 = no slack); got {kappa!r}"
        )
    return k


def lazy(W: np.ndarray, kappa: float) -> np.ndarray:
    """W_κ = κ W + (1 − κ) I (new array). Eigenvalues map λ ↦ κλ + 1 − κ; κ = 1 returns a copy."""
    k = check_kappa(kappa)
    M = np.asarray(W, dtype=np.float64)
    if k == 1.0:
        return M.copy()
    return k * M + (1.0 - k) * np.eye(M.shape[0])


def validate_mixing(
    W: np.ndarray, *, what: str = "W", atol: float = 1e-10, graph: Graph | None = None
) -> None:
    """Check that W is a symmetric, doubly-stochastic, non-negative square matrix.

    If ``graph`` is given, off-diagonal non-zeros must also be edges of it. Raises
    `TopologyError` naming the first offending entry/row; returns None when W is valid.
    """
    M = _check_entries(W, what, atol)
    asym = np.abs(M - M.T)
    if asym.max() > atol:
        i, j = np.unravel_index(int(np.argmax(asym)), asym.shape)
        raise TopologyError(
            f"{what} is not symmetric: {what}[{i}, {j}] = {M[i, j]:.12g} but "
            f"{what}[{j}, {i}] = {M[j, i]:.12g} (atol {atol:g})"
        )
    for kind in ("row", "column"):
        _check_sums(M, kind, what, atol, "a mixing matrix must be doubly stochastic")
    _check_support(M, what, atol, graph)


def validate_column_stochastic(
    W: np.ndarray, *, what: str = "W", atol: float = 1e-10, graph: Graph | None = None
) -> None:
    """Check that W is a non-negative square matrix whose *columns* sum to 1 (push-sum).

    Column j is what node j sends (W[i, j] to node i, W[j, j] kept), so the total mass Σ_i x_i
    is preserved by x ← W x; rows may sum to anything. If ``graph`` is given, off-diagonal
    non-zeros must be edges of it (the undirected support of the directed arcs).
    """
    M = _check_entries(W, what, atol)
    _check_sums(M, "column", what, atol, "a push-sum matrix must be column stochastic")
    _check_support(M, what, atol, graph)


def _check_sums(M: np.ndarray, kind: str, what: str, atol: float, rule: str) -> None:
    """Every row (``kind`` "row") or column ("column") of ``M`` sums to 1 within ``atol``;
    `TopologyError` naming the first one off, how many are, and the ``rule`` broken."""
    sums = M.sum(axis=1 if kind == "row" else 0)
    off = np.flatnonzero(np.abs(sums - 1.0) > atol)
    if off.size:
        i = int(off[0])
        raise TopologyError(
            f"{what} {kind} {i} sums to {sums[i]:.12g}, not 1 ({rule}; {off.size} of "
            f"{M.shape[0]} {kind}s are off, atol {atol:g})"
        )


def _check_entries(W: np.ndarray, what: str, atol: float) -> np.ndarray:
    """A non-empty square real matrix with finite, non-negative entries, as float64."""
    M = np.asarray(W)
    if M.ndim != 2 or M.shape[0] != M.shape[1] or M.shape[0] == 0:
        raise TopologyError(f"{what} must be a non-empty square 2-D matrix; got shape {M.shape}")
    if not np.issubdtype(M.dtype, np.number) or np.iscomplexobj(M):
        raise TopologyError(f"{what} must be a real numeric matrix; got dtype {M.dtype}")
    M = M.astype(np.float64, copy=False)
    bad = np.argwhere(~np.isfinite(M))
    if bad.size:
        i, j = bad[0]
        raise TopologyError(f"{what} has non-finite entries: {what}[{i}, {j}] = {M[i, j]}")
    neg = np.argwhere(atol < -M)
    if neg.size:
        i, j = neg[0]
        raise TopologyError(
            f"{what} has negative entries: {what}[{i}, {j}] = {M[i, j]:.6g} (weights must be >= 0)"
        )
    return M


def _check_support(M: np.ndarray, what: str, atol: float, graph: Graph | None) -> None:
    if graph is None:
        return
    n = M.shape[0]
    if graph.n != n:
        raise TopologyError(f"{what} is {n}×{n} but the graph has n={graph.n}")
    outside = (np.abs(M) > atol) & ~graph.adjacency()
    np.fill_diagonal(outside, False)
    hit = np.argwhere(outside)
    if hit.size:
        i, j = hit[0]
        raise TopologyError(
            f"{what}[{i}, {j}] = {M[i, j]:.6g} but ({i}, {j}) is not an edge of the graph"
        )


def push_weights(n: int, arcs: Iterable[tuple[int, int]]) -> np.ndarray:
    """Column-stochastic push-sum weights for the directed arcs ``(i, j)`` = i → j on n nodes.

    Node i keeps 1/(outdeg_i + 1) and sends the same share to each out-neighbour: W[j, i] =
    W[i, i] = 1/(outdeg_i + 1) (½ self, ½ peer on a one-peer graph). Duplicate arcs count once;
    self-arcs are refused.
    """
    out: list[set[int]] = [set() for _ in range(n)]
    for a, b in arcs:
        i, j = int(a), int(b)
        if i == j or not (0 <= i < n and 0 <= j < n):
            raise TopologyError(f"arc ({i}, {j}) is not an arc between two of the {n} nodes")
        out[i].add(j)
    W = np.zeros((n, n), dtype=np.float64)
    for i, targets in enumerate(out):
        share = 1.0 / (len(targets) + 1)
        W[i, i] = share
        for j in targets:
            W[j, i] = share
    return W


def _is_symmetric(M: np.ndarray, atol: float = 1e-12) -> bool:
    return bool(np.allclose(M, M.T, rtol=0.0, atol=atol))


def spectral_values(W: np.ndarray) -> tuple[float, float]:
    """(λ₂, λₙ): second-largest and smallest eigenvalue of a symmetric W (n ≥ 2).

    For a non-symmetric W (e.g. a product of symmetric matrices) the eigenvalues are complex in
    general; this then returns the largest and smallest *real parts* after removing the
    consensus eigenvalue 1. For n = 1 returns (0, 0).
    """
    M = np.asarray(W, dtype=np.float64)
    n = M.shape[0]
    if n < 2:
        return 0.0, 0.0
    if _is_symmetric(M):
        ev = np.linalg.eigvalsh((M + M.T) / 2.0)  # ascending
        return float(ev[-2]), float(ev[0])
    cev = np.linalg.eigvals(M)
    drop = int(np.argmin(np.abs(cev - 1.0)))  # the consensus eigenvalue (1 for a stochastic M)
    rest = np.delete(cev, drop).real
    return float(rest.max()), float(rest.min())


def consensus_contraction(M: np.ndarray) -> float:
    """λ = ‖M − 11ᵀ/n‖₂, the worst-case contraction of the disagreement X − X̄ by one M.

    For a symmetric doubly-stochastic M this equals max(|λ₂|, |λₙ|) (computed that way, with
    `eigvalsh`); for a non-symmetric product of such matrices it is the largest singular value.
    """
    A = np.asarray(M, dtype=np.float64)
    n = A.shape[0]
    if n < 2:
        return 0.0
    if _is_symmetric(A):
        l2, ln = spectral_values(A)
        return float(min(1.0, max(abs(l2), abs(ln))))
    sigma = float(np.linalg.norm(A - np.full((n, n), 1.0 / n), 2))
    return min(1.0, sigma)


def spectral_gap(W: np.ndarray) -> float:
    """1 − max(|λ₂|, |λₙ|) (``rho`` in Tao Lin's code): 1 = exact averaging, 0 = disconnected."""
    return 1.0 - consensus_contraction(W)


def mixing_p(W: np.ndarray) -> float:
    """Mixing parameter p = 1 − λ², λ = max(|λ₂|, |λₙ|) (Koloskova et al. 2020, Assumption 1)."""
    lam = consensus_contraction(W)
    return 1.0 - lam * lam
