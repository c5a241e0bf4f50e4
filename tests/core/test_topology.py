"""Named topologies, schedules, spectral values and edge-list files (concord.core.graphs.topology &
friends)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from concord.core.graphs.graph import Graph, TopologyError, bfs_distances, distance_stats
from concord.core.graphs.mixing import validate_column_stochastic, validate_mixing
from concord.core.graphs.schedules import TopologySchedule
from concord.core.graphs.topology import (
    TOPOLOGIES,
    TOPOLOGY_NAMES,
    UnknownTopologyError,
    bfs_spanning_tree,
    build_graph,
    check_connected_over_period,
    describe,
    double_binary_trees,
    make_schedule,
)
from concord.core.registry import UnknownNameError

# The docs/algorithms.md#spectral-quantities table is printed to 4 decimals: compare at half a unit
# of the 4th decimal.
TABLE_TOL = 5e-5

# n values each topology accepts (small, odd, even, powers of two where required).
VALID_N: dict[str, tuple[int, ...]] = {
    "complete": (2, 3, 8, 16),
    "ring": (2, 3, 7, 16),
    "chain": (2, 5, 16),
    "star": (2, 5, 16),
    "torus": (9, 12, 16, 25, 32),
    "hypercube": (2, 4, 8, 16),
    "exponential": (2, 3, 12, 16),
    "exponential-one-peer": (2, 3, 8, 12, 16, 20),
    "exponential-one-peer-directed": (2, 3, 6, 8, 16),
    "bipartite-exponential": (2, 6, 8, 10, 16),
    "random-matching": (2, 3, 9, 16),
    "binary-tree": (2, 3, 10, 16),
    "double-binary-tree": (2, 3, 10, 16),
}


def test_names_match_registry() -> None:
    assert tuple(TOPOLOGIES.names()) == TOPOLOGY_NAMES
    assert set(VALID_N) == set(TOPOLOGY_NAMES)


def test_module_is_torch_free() -> None:
    # the orchestrator imports concord.core.graphs.topology and must never import torch
    # (docs/architecture.md#layers)
    code = (
        "import sys, concord.core.graphs.topology, concord.core.graphs.mixing; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


@pytest.mark.parametrize(
    ("name", "n"), [(name, n) for name, ns in VALID_N.items() for n in ns], ids=str
)
def test_every_topology_builds_valid_matrices(name: str, n: int) -> None:
    sch = make_schedule(name, n, seed=3)
    assert sch.name == name
    assert sch.n == n
    rounds = sch.period if sch.period is not None else 6
    for k in range(rounds):
        W = sch.matrix(k)
        g = sch.graph(k)
        assert W.shape == (n, n)
        assert W.dtype == np.float64
        if sch.directed:  # push-sum: column stochastic, on the arcs' undirected support
            validate_column_stochastic(W, graph=g)
        else:
            validate_mixing(W, graph=g)  # symmetric, doubly stochastic, on the graph's support
        for i in range(n):
            nb = sch.neighbors(i, k)
            assert [j for j, _ in nb] == [j for j in g.neighbors(i) if W[i, j] > 0]
            assert all(w == W[i, j] > 0 for j, w in nb)
            assert sch.self_weight(i, k) + sum(w for _, w in nb) == pytest.approx(1.0, abs=1e-12)
    check_connected_over_period(sch)
    sp = sch.spectral()
    assert 0.0 < sp.spectral_gap <= 1.0 + 1e-12
    assert sp.p == pytest.approx(1 - (1 - sp.spectral_gap) ** 2, abs=1e-12)
    if sch.period is not None:
        np.testing.assert_array_equal(sch.matrix(sch.period), sch.matrix(0))  # periodic


@pytest.mark.parametrize(
    ("n", "gap", "p"), [(16, 0.0507, 0.0989), (32, 0.0128, 0.0255), (64, 0.0032, 0.0064)]
)
def test_ring_spectral_values(n: int, gap: float, p: float) -> None:
    sch = make_schedule("ring", n)
    assert sch.weights == "metropolis"
    assert sch.matrix(0)[0, 1] == pytest.approx(1 / 3, abs=1e-15)
    sp = sch.spectral()
    assert sp.spectral_gap == pytest.approx(gap, abs=TABLE_TOL)
    assert 1 - sp.lambda2 == pytest.approx(gap, abs=TABLE_TOL)  # λₙ = −1/3 for even n
    assert sp.lambda_n == pytest.approx(-1 / 3, abs=1e-12)
    assert sp.p == pytest.approx(p, abs=TABLE_TOL)
    # closed form (2/3)(1 − cos(2π/n)), eigvalsh accuracy ~1e-15
    assert sp.spectral_gap == pytest.approx(2 / 3 * (1 - math.cos(2 * math.pi / n)), abs=1e-12)


@pytest.mark.parametrize(("n", "gap", "shape"), [(16, 0.4000, 4), (32, 0.1172, 4), (64, 0.1172, 8)])
def test_torus_spectral_values(n: int, gap: float, shape: int) -> None:
    g = build_graph("torus", n)
    assert g.is_regular()
    assert g.max_degree == 4
    sch = make_schedule("torus", n)
    assert sch.matrix(0)[0, 0] == pytest.approx(1 / 5, abs=1e-15)
    assert sch.spectral().spectral_gap == pytest.approx(gap, abs=TABLE_TOL)
    # (2/5)(1 − cos(2π/c)) with c the longer side n/m (m = 4, 4, 8)
    c = n // shape
    assert 1 - sch.spectral().lambda2 == pytest.approx(0.4 * (1 - math.cos(2 * math.pi / c)))


@pytest.mark.parametrize(("n", "gap", "deg"), [(16, 0.5, 7), (32, 0.4, 9), (64, 1 / 3, 11)])
def test_static_exponential_spectral_values(n: int, gap: float, deg: int) -> None:
    g = build_graph("exponential", n)
    assert g.max_degree == deg
    assert g.is_regular()
    assert make_schedule("exponential", n).spectral().spectral_gap == pytest.approx(
        gap, abs=TABLE_TOL
    )


def test_hypercube_and_complete() -> None:
    assert build_graph("hypercube", 16).neighbors(5) == (1, 4, 7, 13)
    assert make_schedule("hypercube", 16).spectral().spectral_gap == pytest.approx(0.4, abs=1e-12)
    sp = make_schedule("complete", 16).spectral()
    assert (sp.spectral_gap, sp.p, sp.exact_average_after) == (1.0, 1.0, 1)


@pytest.mark.parametrize("n", [2, 16, 32, 64])
def test_one_peer_exponential_exact_average(n: int) -> None:
    sch = make_schedule("exponential-one-peer", n)
    tau = int(math.log2(n))
    assert sch.period == tau
    assert sch.weights == "pairwise"
    P = np.eye(n)
    for k in range(tau):
        g = sch.graph(k)
        assert g.max_degree == 1
        assert len(g.edges) == n // 2
        assert all(j - i == 2**k for i, j in g.edges)  # peer at distance 2^k (i XOR 2^k)
        P = sch.matrix(k) @ P
    # Entries of every partial product are dyadic rationals m/2^r with r ≤ log2 n, so float64
    # represents them exactly and the product is exact: 1e-12 only guards against a platform
    # BLAS reordering sums (which still cannot round a dyadic with ≤ 53 bits).
    assert np.max(np.abs(P - 1.0 / n)) < 1e-12
    sp = sch.spectral()
    assert sp.exact_average_after == tau
    assert sp.rounds == tau
    assert (sp.spectral_gap, sp.p) == (1.0, 1.0)
    # any window of τ consecutive rounds also averages exactly (the factors commute)
    Q = np.eye(n)
    for k in range(3, 3 + tau):
        Q = sch.matrix(k) @ Q
    assert np.max(np.abs(Q - 1.0 / n)) < 1e-12


def test_one_peer_exponential_fallback_for_other_n() -> None:
    sch = make_schedule("exponential-one-peer", 12)
    assert sch.period == 4
    assert sch.weights == "metropolis"
    for k in range(4):
        h = 2**k
        g = sch.graph(k)
        assert g.neighbors(0) == tuple(sorted({h % 12, (-h) % 12}))
        assert g.is_regular()
        assert g.max_degree == 2
        assert sch.matrix(k)[0, h] == pytest.approx(1 / 3, abs=1e-15)
    assert sch.spectral().exact_average_after is None
    with pytest.raises(TopologyError, match="'pairwise' need a matching"):
        make_schedule("exponential-one-peer", 12, weights="pairwise")


def test_bipartite_exponential() -> None:
    sch = make_schedule("bipartite-exponential", 16)
    assert sch.period == 3  # hops 1, 3, 7
    for k, h in enumerate((1, 3, 7)):
        g = sch.graph(k)
        assert len(g.edges) == 8
        assert g.max_degree == 1
        for i in range(1, 16, 2):
            assert (i + h) % 16 in g.neighbors(i)
    with pytest.raises(TopologyError, match=r"needs an even n.*n=7"):
        make_schedule("bipartite-exponential", 7)
    with pytest.raises(TopologyError, match="n=4 only uses hop 1"):
        make_schedule("bipartite-exponential", 4)


def test_random_matching_deterministic_per_seed() -> None:
    a = make_schedule("random-matching", 16, seed=7)
    b = make_schedule("random-matching", 16, seed=7)
    c = make_schedule("random-matching", 16, seed=8)
    assert a.period is None
    assert a.weights == "pairwise"
    # out-of-order and repeated queries give the same rounds (pure function of (seed, k))
    for k in [5, 0, 3, 5, 100, 0]:
        np.testing.assert_array_equal(a.matrix(k), b.matrix(k))
        assert a.graph(k).max_degree == 1
        assert len(a.graph(k).edges) == 8
    assert any(a.graph(k) != c.graph(k) for k in range(5))
    assert a.graph(0) != a.graph(1)
    expect = Graph.from_edges(
        16, zip(*[iter(np.random.default_rng((7, 2)).permutation(16))] * 2, strict=True)
    )
    assert a.graph(2) == expect


def test_random_matching_odd_n_leaves_one_alone() -> None:
    sch = make_schedule("random-matching", 9, seed=1)
    for k in range(5):
        deg = sch.graph(k).degrees()
        assert sorted(deg.tolist()) == [0] + [1] * 8
        alone = int(np.flatnonzero(deg == 0)[0])
        assert sch.matrix(k)[alone, alone] == 1.0


@pytest.mark.parametrize(("n", "p"), [(16, 0.5333), (32, 0.5161), (64, 0.5079)])
def test_random_matching_effective_p(n: int, p: float) -> None:
    sp = make_schedule("random-matching", n).spectral()
    assert sp.p == pytest.approx(p, abs=TABLE_TOL)
    assert sp.p == pytest.approx(n / (2 * (n - 1)), abs=1e-12)


@pytest.mark.parametrize(("n", "kappa"), [(8, 1.0), (7, 1.0), (8, 0.5)])
def test_random_matching_p_matches_monte_carlo(n: int, kappa: float) -> None:
    sch = make_schedule("random-matching", n, seed=11, kappa=kappa)
    rounds = 4000
    G = sum(sch.matrix(k).T @ sch.matrix(k) for k in range(rounds)) / rounds
    J = np.full((n, n), 1 / n)
    p_hat = 1 - np.linalg.eigvalsh(G - J)[-1]
    # Entries of WᵀW are 0, ½ or 1, so each entry of the 4000-round mean has std ≤ 0.008; the top
    # eigenvalue of the noisy estimate is biased upward, so p̂ runs low by ≈ 0.011 (measured over
    # 10 seeds for these cases, worst 0.019). 0.03 accepts that while a wrong closed form
    # (e.g. using 1/n instead of 1/(n−1) for even n: 0.571 vs 0.5 at n = 8) fails.
    assert p_hat == pytest.approx(sch.spectral().p, abs=0.03)


def test_kappa_makes_schedule_lazy() -> None:
    base = make_schedule("ring", 16).matrix(0)
    sch = make_schedule("ring", 16, kappa=0.1)
    assert sch.kappa == 0.1
    np.testing.assert_allclose(sch.matrix(0), 0.1 * base + 0.9 * np.eye(16), atol=1e-15)
    # 1 − λ₂ scales by κ (eigenvalue map λ ↦ κλ + 1 − κ)
    assert 1 - sch.spectral().lambda2 == pytest.approx(0.1 * 0.050746978, abs=1e-9)


def test_matrix_is_cached_read_only_and_rejects_bad_round() -> None:
    sch = make_schedule("exponential-one-peer", 8)
    W = sch.matrix(1)
    assert sch.period == 3
    assert sch.matrix(1 + 3 * 3) is W  # cached per position in the period
    with pytest.raises(ValueError, match="read-only"):
        W[0, 0] = 42.0
    assert sch.matrix(1)[0, 0] == 0.5
    with pytest.raises(TopologyError, match="k must be >= 0"):
        sch.matrix(-1)
    with pytest.raises(TopologyError, match="integer"):
        sch.graph(1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "diameter", "mean_chain", "tree_diam", "mean_tree"),
    [(16, 15, 5.67, 6, 3.48), (32, 31, 11.0, 8, 4.91), (64, 63, 21.67, 10, 6.54)],
)
def test_tree_statistics(
    n: int, diameter: int, mean_chain: float, tree_diam: int, mean_tree: float
) -> None:
    # docs/algorithms.md#spectral-quantities tree table, printed to 2 decimals → compare to half a
    # unit of the 2nd
    chain, tree = describe("chain", n), describe("binary-tree", n)
    assert chain["diameter"] == diameter
    assert chain["mean_distance"] == pytest.approx(mean_chain, abs=5e-3)
    assert tree["diameter"] == tree_diam
    assert tree["max_degree"] == 3
    assert tree["mean_distance"] == pytest.approx(mean_tree, abs=5e-3)


def test_binary_tree_shape() -> None:
    g = build_graph("binary-tree", 10)
    assert g.edges == ((0, 1), (1, 2), (1, 3), (2, 4), (2, 5), (3, 6), (3, 7), (4, 8), (4, 9))
    assert g.neighbors(0) == (1,)


@pytest.mark.parametrize("n", [2, 7, 16])
def test_double_binary_trees(n: int) -> None:
    t1, t2 = double_binary_trees(n)
    for t in (t1, t2):
        assert len(t.edges) == n - 1
        assert t.is_connected()
        assert t.max_degree <= 3
    assert t2 == Graph.from_edges(n, ((n - 1 - i, n - 1 - j) for i, j in t1.edges))
    assert build_graph("double-binary-tree", n) == t1.union(t2)


def test_bfs_spanning_tree() -> None:
    g = build_graph("torus", 16)
    t = bfs_spanning_tree(g, root=5)
    assert len(t.edges) == 15
    assert t.is_connected()
    assert set(t.edges) <= set(g.edges)
    np.testing.assert_array_equal(bfs_distances(t, 5), bfs_distances(g, 5))  # shortest paths
    with pytest.raises(TopologyError, match="disconnected"):
        bfs_spanning_tree(Graph.from_edges(4, [(0, 1), (2, 3)]))


def test_graph_invariants() -> None:
    g = Graph.from_edges(4, [(3, 0), (1, 0), (0, 3)])
    assert g.edges == ((0, 1), (0, 3))
    assert g.degrees().tolist() == [2, 1, 0, 1]
    assert g.max_degree == 2
    A = g.adjacency()
    assert A.dtype == bool
    assert (A == A.T).all()
    assert A[0, 3]
    assert not A[0, 0]
    assert not g.is_connected()
    assert distance_stats(g) is None
    for bad in [((1, 0),), ((0, 1), (0, 1)), ((0, 2), (0, 1)), ((0, 9),)]:
        with pytest.raises(TopologyError):
            Graph(4, bad)
    with pytest.raises(TopologyError, match="self-loop"):
        Graph.from_edges(3, [(1, 1)])
    with pytest.raises(TopologyError, match="out of range"):
        g.neighbors(4)


def test_describe_is_json_summary() -> None:
    d = describe("ring", 16)
    json.dumps(d)  # JSON-able
    required = {
        "name", "peers", "weights", "kappa", "period", "max_degree", "edges", "spectral_gap",
        "p", "lambda2", "lambda_n", "exact_average_after", "regular", "diameter",
    }  # fmt: skip
    assert required <= d.keys()
    assert (d["peers"], d["edges"], d["max_degree"], d["regular"], d["diameter"]) == (
        16, 16, 2, True, 8,
    )  # fmt: skip
    one_peer = describe("exponential-one-peer", 16)
    assert one_peer["exact_average_after"] == 4
    assert one_peer["max_degree"] == 1
    assert one_peer["edges"] == 32
    assert one_peer["edges_per_round"] == 8
    rm = describe("random-matching", 8, seed=2)
    json.dumps(rm)
    assert rm["period"] is None
    assert rm["diameter"] is None
    assert rm["regular"] is True


# ---- errors ---------------------------------------------------------------------------------


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UnknownTopologyError) as info:
        make_schedule("rign", 8)
    msg = str(info.value)
    assert "unknown topology 'rign' (did you mean 'ring'?)" in msg
    assert "file:PATH" in msg
    assert all(name in msg for name in TOPOLOGY_NAMES)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, UnknownNameError)


@pytest.mark.parametrize(
    ("name", "n", "kwargs", "pattern"),
    [
        ("hypercube", 12, {}, r"'hypercube' needs n to be a power of 2.*n=12"),
        ("star", 16, {"weights": "uniform"}, r"'uniform' need a regular graph.*degrees 1\.\.15"),
        ("ring", 8, {"kappa": 0.0}, r"kappa must be in \(0, 1\].*got 0"),
        ("ring", 8, {"kappa": 1.01}, r"kappa must be in \(0, 1\]"),
        ("ring", 1, {}, r"n must be >= 2.*n=1"),
        ("complete", 0, {}, r"n must be >= 2"),
        ("ring", 8, {"weights": "gossip"}, r"unknown weights 'gossip'; valid: metropolis"),
        ("ring", 8, {"weights": "file"}, r"'file' need an edge-list file with weights"),
        ("random-matching", 8, {"seed": -1}, r"seed must be a non-negative integer"),
        ("torus", 8, {}, r"'torus' needs n = m·c.*n=8 gives 2×4"),
        ("torus", 13, {}, r"n=13 gives 1×13"),
        ("random-matching", 7, {"weights": "uniform"}, r"round 0 has degrees 0\.\.1"),
    ],
)
def test_clear_errors(name: str, n: int, kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        make_schedule(name, n, **kwargs)  # type: ignore[arg-type]


def test_n_must_be_an_integer() -> None:
    with pytest.raises(TopologyError, match="integer"):
        make_schedule("ring", 4.0)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="integer"):
        make_schedule("ring", True)


def test_build_graph_refuses_time_varying() -> None:
    with pytest.raises(TopologyError, match=r"time-varying.*make_schedule"):
        build_graph("exponential-one-peer", 8)


def test_check_connected_over_period_reports_components() -> None:
    g0, g1 = Graph.from_edges(4, [(0, 1)]), Graph.from_edges(4, [(2, 3)])
    W0 = np.array([[0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    W1 = W0[[2, 3, 0, 1]][:, [2, 3, 0, 1]]
    sch = TopologySchedule(
        name="two-pairs",
        n=4,
        weights="pairwise",
        kappa=1.0,
        seed=0,
        period=2,
        build=lambda k: (g0, W0) if k % 2 == 0 else (g1, W1),
    )
    with pytest.raises(TopologyError, match=r"'two-pairs'.*one period \(2 rounds\).*\{0, 1\}"):
        check_connected_over_period(sch)


# ---- edge-list files ------------------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "graph.txt"
    p.write_text(text)
    return str(p)


def test_file_topology_with_rule_weights(tmp_path: Path) -> None:
    path = _write(tmp_path, "# a ring of 4\n0 1\n1 2  # trailing comment\n\n2,3\n3 0\n0 1\n")
    sch = make_schedule(f"file:{path}", 4)
    assert sch.weights == "metropolis"
    assert sch.period == 1
    assert sch.graph(0) == build_graph("ring", 4)
    np.testing.assert_allclose(sch.matrix(0), make_schedule("ring", 4).matrix(0), atol=1e-15)
    assert build_graph(f"file:{path}", 4) == build_graph("ring", 4)


def test_file_topology_with_explicit_weights(tmp_path: Path) -> None:
    path = _write(tmp_path, "0 1 0.5\n1 2 0.25\n")
    sch = make_schedule(f"file:{path}", 3)
    assert sch.weights == "file"
    expect = np.array([[0.5, 0.5, 0], [0.5, 0.25, 0.25], [0, 0.25, 0.75]])
    np.testing.assert_allclose(sch.matrix(0), expect, atol=1e-15)
    lazy = make_schedule(f"file:{path}", 3, kappa=0.5).matrix(0)
    np.testing.assert_allclose(lazy, 0.5 * expect + 0.5 * np.eye(3), atol=1e-15)
    # an explicit rule overrides the file's weights
    assert make_schedule(f"file:{path}", 3, weights="metropolis").weights == "metropolis"


@pytest.mark.parametrize(
    ("text", "n", "pattern"),
    [
        ("0 1\n1 2\n1 x\n", 3, r"graph\.txt:3: node ids must be integers"),
        ("0 1\n\n# c\n1 2 3 4\n", 3, r"graph\.txt:4: expected 'i j' or 'i j w'"),
        ("0 1\n1 17\n", 16, r"graph\.txt:2: node 17 out of range for n=16 \(valid ids 0\.\.15\)"),
        ("0 1\n2 3\n", 4, r"not connected.*2 components: \{0, 1\}, \{2, 3\}"),
        ("0 1\n1 2\n", 4, r"not connected.*\{3\}"),
        ("0 0\n", 2, r"graph\.txt:1: self-loop"),
        ("0 1 0.5\n1 2\n", 3, r"graph\.txt:2: lacks a weight"),
        ("0 1 1.5\n", 2, r"graph\.txt:1: weight 1\.5 must be in \(0, 1\]"),
        ("0 1 0.6\n1 2 0.6\n", 3, r"weights at node 1 sum to 1\.2 > 1"),
        ("0 1 0.5\n1 0 0.4\n", 2, r"graph\.txt:2: link 0-1 has weight 0\.4 but line 1 gave 0\.5"),
        ("# nothing\n", 2, r"lists no links"),
    ],
)
def test_bad_edge_list_files(tmp_path: Path, text: str, n: int, pattern: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(TopologyError, match=pattern):
        make_schedule(f"file:{path}", n)


def test_missing_edge_list_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(TopologyError, match=r"topology file '.*nope\.txt' does not exist"):
        make_schedule(f"file:{missing}", 4)
    with pytest.raises(TopologyError, match="needs a path"):
        make_schedule("file:", 4)
