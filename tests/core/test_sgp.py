"""SGP / push-sum (Assran et al. 2019, docs/algorithms.md#sgp) and its directed schedule: column-
stochastic validation, the one-peer directed exponential graph, push-sum weights and their
invariants, equality with D-SGD where P is doubly stochastic, state, phases, control, config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from concord.core.algorithms import LocalSGD, SGDConfig, StepContext, make_algorithm
from concord.core.algorithms.sgp import SGP
from concord.core.config import ConfigError, load_config
from concord.core.control.plan import Phase
from concord.core.graphs.graph import Graph, TopologyError
from concord.core.graphs.mixing import push_weights, validate_column_stochastic, validate_mixing
from concord.core.graphs.schedules import TopologySchedule, check_connected_over_period
from concord.core.graphs.topology import DIRECTED_TOPOLOGIES, make_schedule
from concord.core.loop import check_algorithm
from concord.sim.vectorized import VectorizedComm

torch.set_num_threads(1)
GOSSIP = Phase(index=1, start=0, end=10**9, mode="gossip", topology=None, controlled=False)
EXACT = Phase(index=1, start=0, end=10**9, mode="exact", topology=None, controlled=False)
DIRECTED = "exponential-one-peer-directed"
# float64 sums of n ≤ 16 terms in [0, n]: round-off ~1e-15 per round; 1e-12 after hundreds
ROUNDOFF = 1e-12


def _sgd(momentum: float = 0.0) -> LocalSGD:
    return LocalSGD(SGDConfig(momentum=momentum, nesterov=momentum > 0, weight_decay=0.0))


def _sgp() -> SGP:
    algo = make_algorithm("sgp", _sgd(0.9))
    assert isinstance(algo, SGP)
    return algo


def _ctx(
    t: int, lr: float, comm: VectorizedComm, matrix: object, phase: Phase = GOSSIP, **kw: object
) -> StepContext:
    return StepContext(
        step=t,
        lr=lr,
        phase=phase,
        comm=comm,
        matrix=matrix,  # type: ignore[arg-type]
        round_offset=t,
        **kw,  # type: ignore[arg-type]
    )


def _unbalanced_schedule(n: int, period: int, seed: int) -> list[np.ndarray]:
    """Column-stochastic push matrices whose in-degrees differ: each round, a directed cycle
    (strong connectivity) plus random extra arcs into a few nodes."""
    rng = np.random.default_rng(seed)
    mats = []
    for _ in range(period):
        arcs = [(i, (i + 1) % n) for i in range(n)]
        hubs = rng.choice(n, 2, replace=False)
        arcs += [(int(i), int(h)) for h in hubs for i in range(n) if i != h and rng.random() < 0.6]
        mats.append(push_weights(n, arcs))
    return mats


# ---- the directed schedule --------------------------------------------------------------------


def test_push_weights_and_column_stochastic_validation() -> None:
    W = push_weights(4, [(0, 1), (0, 2), (1, 2), (2, 3), (3, 0)])
    assert W[:, 0].tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])  # 0 keeps 1/3, sends 2
    np.testing.assert_allclose(W.sum(axis=0), 1.0, rtol=0, atol=1e-15)
    validate_column_stochastic(W)
    assert W.sum(axis=1)[2] == pytest.approx(1 / 3 + 1 / 2 + 1 / 2)  # rows need not sum to 1
    with pytest.raises(TopologyError, match="not symmetric"):
        validate_mixing(W)
    with pytest.raises(TopologyError, match="column 1 sums to"):
        validate_column_stochastic(W * np.array([1.0, 0.5, 1.0, 1.0]))
    with pytest.raises(TopologyError, match="negative"):
        validate_column_stochastic(np.array([[1.5, 0.0], [-0.5, 1.0]]))
    with pytest.raises(TopologyError, match=r"W\[2, 0\] = 0.333333 but \(2, 0\) is not an edge"):
        validate_column_stochastic(W, graph=Graph.from_edges(4, [(0, 1), (1, 2), (2, 3), (0, 3)]))
    with pytest.raises(TopologyError, match="not an arc"):
        push_weights(3, [(1, 1)])


@pytest.mark.parametrize("n", [2, 3, 6, 8, 16])
def test_directed_one_peer_exponential_schedule(n: int) -> None:
    sch = make_schedule(DIRECTED, n)
    assert DIRECTED in DIRECTED_TOPOLOGIES
    assert sch.directed
    assert sch.weights == "push"
    period = int(np.floor(np.log2(n - 1))) + 1
    assert sch.period == period
    for k in range(period):
        W = sch.matrix(k)
        hop = (1 << k) % n
        for i in range(n):  # i keeps ½ and pushes ½ to i + 2^k
            assert W[i, i] == 0.5
            assert W[(i + hop) % n, i] == 0.5
        # the shift is a bijection for every n: also rows sum to 1 (push-sum weights stay 1)
        np.testing.assert_array_equal(W.sum(axis=1), np.ones(n))
        if 2 * hop != n:  # (the hop n/2 is its own inverse)
            assert not np.array_equal(W, W.T)
    P = np.linalg.multi_dot([*reversed(sch.matrices()), np.eye(n)])
    # power of 2: Π_k (I + S^{2^k})/2 = 11ᵀ/n (docs/algorithms.md#spectral-quantities)
    exact = n & (n - 1) == 0
    assert np.allclose(P, 1 / n, rtol=0, atol=1e-15) == exact
    assert sch.spectral().exact_average_after == (period if exact else None)


def test_directed_schedule_errors() -> None:
    with pytest.raises(TopologyError, match="is directed: its weights are fixed"):
        make_schedule(DIRECTED, 8, weights="pairwise")
    mats = [push_weights(4, [(0, 1), (1, 0), (2, 3), (3, 2)])]  # two separate pairs
    graph = Graph.from_edges(4, [(0, 1), (2, 3)])
    pairs = TopologySchedule(
        name="pairs",
        n=4,
        weights="push",
        kappa=1.0,
        seed=0,
        period=1,
        build=lambda k: (graph, mats[0]),
        directed=True,
    )
    with pytest.raises(TopologyError, match="not strongly connected"):
        check_connected_over_period(pairs)
    one_way = Graph.from_edges(3, [(0, 1), (1, 2)])
    chain = TopologySchedule(  # 0 → 1 → 2: connected as a graph, not strongly
        name="one-way",
        n=3,
        weights="push",
        kappa=1.0,
        seed=0,
        period=1,
        build=lambda k: (one_way, push_weights(3, [(0, 1), (1, 2)])),
        directed=True,
    )
    with pytest.raises(TopologyError, match=r"node 0 cannot be reached from nodes \[1, 2\]"):
        check_connected_over_period(chain)


# ---- push-sum ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [16, 6])
def test_sgp_equals_dsgd_where_push_sum_weights_stay_one(n: int) -> None:
    """§3.6: on the one-peer directed exponential graph P is doubly stochastic (for n = 16 the
    product over a period is 11ᵀ/n), so w ≡ 1 and SGP is D-SGD on the same matrices — the
    same floating-point operations (x·1, x/1 are exact): bit for bit."""
    d = 12
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(n, d, generator=gen, dtype=torch.float64)
    grads = [torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(25)]
    sch = make_schedule(DIRECTED, n)
    a, b = x0.clone(), x0.clone()
    ca, cb = VectorizedComm(n), VectorizedComm(n)
    sgp, dsgd = _sgp(), make_algorithm("dsgd", _sgd(0.9))
    sgp.setup(a, ca)
    for t, g in enumerate(grads):
        sgp.step(a, g, _ctx(t, 0.1, ca, sch.matrix))
        dsgd.step(b, g, _ctx(t, 0.1, cb, sch.matrix))
    assert torch.equal(a, b)
    assert sgp.weights is not None
    np.testing.assert_array_equal(sgp.weights, np.ones(n))
    assert ca.counters.bytes_wire == cb.counters.bytes_wire == 25 * n * d * 8  # one arc each


def test_push_sum_debiases_unbalanced_weights_to_the_average() -> None:
    """Unequal in-degrees: w_i genuinely varies, Σ_i w_i = n stays, the numerators alone are
    biased toward the heavy nodes, and z = x / w reaches consensus on the initial average."""
    n, d = 6, 8
    mats = _unbalanced_schedule(n, 4, seed=1)
    assert any(not np.allclose(W.sum(axis=1), 1.0) for W in mats)  # not row stochastic
    z = torch.randn(n, d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    average = z.mean(0)
    comm, algo = VectorizedComm(n), _sgp()
    algo.setup(z, comm)
    spread = 0.0
    for t in range(300):
        algo.step(z, torch.zeros_like(z), _ctx(t, 0.0, comm, lambda k: mats[k % 4]))
        w = algo.weights
        assert w is not None
        assert abs(w.sum() - n) < ROUNDOFF
        assert w.min() > 0
        spread = max(spread, float(np.abs(w - 1).max()))
    assert spread > 0.2  # the push-sum weights do vary
    numerators = z * torch.from_numpy(algo.weights).unsqueeze(1)  # type: ignore[arg-type]
    assert float((numerators - average).abs().max()) > 0.05  # plain gossip would be biased
    # geometric convergence over 300 rounds of a strongly connected schedule; float64 round-off
    torch.testing.assert_close(z, average.expand(n, d), rtol=0, atol=1e-10)


def test_sgp_training_keeps_the_weight_sum_and_converges_on_quadratics() -> None:
    """Heterogeneous quadratics on the unbalanced schedule with a decaying step: the de-biased
    models approach x* (the mean of the b_i), the numerators' sum stays Σ_i w_i z_i."""
    n, d = 6, 5
    mats = _unbalanced_schedule(n, 3, seed=3)
    b = torch.randn(n, d, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    z = torch.zeros(n, d, dtype=torch.float64)
    comm, algo = VectorizedComm(n), make_algorithm("sgp", _sgd())
    algo.setup(z, comm)
    for t in range(3000):
        algo.step(z, z - b, _ctx(t, 0.5 / (1 + t) ** 0.75, comm, lambda k: mats[k % 3]))
    assert abs(algo.weights.sum() - n) < ROUNDOFF  # type: ignore[union-attr]
    # the O(η) consensus error of a decaying step: η ≈ 1.2e-3 at the end
    assert float((z - b.mean(0)).norm(dim=1).max()) < 0.02


def test_exact_phase_averages_the_numerators_and_resets_the_weights() -> None:
    n, d = 6, 4
    mats = _unbalanced_schedule(n, 2, seed=5)
    z = torch.randn(n, d, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    comm, algo = VectorizedComm(n), _sgp()
    algo.setup(z, comm)
    for t in range(5):
        algo.step(z, torch.zeros_like(z), _ctx(t, 0.0, comm, lambda k: mats[k % 2]))
    w = algo.weights.copy()  # type: ignore[union-attr]
    total = (z * torch.from_numpy(w).unsqueeze(1)).sum(0)
    report = algo.step(z, torch.zeros_like(z), _ctx(5, 0.0, comm, lambda k: mats[0], EXACT))
    assert report.exact_average
    torch.testing.assert_close(z, (total / n).expand(n, d), rtol=0, atol=ROUNDOFF)
    np.testing.assert_array_equal(algo.weights, np.ones(n))  # type: ignore[arg-type]


def test_controlled_rounds_use_the_next_matrices() -> None:
    class Twice:
        def after_round(self, r: int, x: torch.Tensor, theta: torch.Tensor) -> bool:
            return r < 3

    n, d = 8, 3
    sch = make_schedule(DIRECTED, n)
    used: list[int] = []

    def matrix(k: int) -> np.ndarray:
        used.append(k)
        return sch.matrix(k)

    z = torch.randn(n, d, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    comm, algo = VectorizedComm(n), _sgp()
    algo.setup(z, comm)
    ctx = _ctx(0, 0.0, comm, matrix, control=Twice())
    ctx.round_offset = 4
    report = algo.step(z, torch.zeros_like(z), ctx)
    assert report.rounds == 3
    assert used == [4, 5, 6]
    assert len(report.statistics) == 3


def test_state_dict_round_trip() -> None:
    n, d = 6, 4
    mats = _unbalanced_schedule(n, 3, seed=8)
    gen = torch.Generator().manual_seed(9)
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    grads = [torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(10)]
    comm, algo = VectorizedComm(n), _sgp()
    algo.setup(z, comm)
    for t in range(5):
        algo.step(z, grads[t], _ctx(t, 0.1, comm, lambda k: mats[k % 3]))
    state = {k: v.clone() for k, v in algo.state_dict().items()}
    assert set(state) == {"momentum", "push_weights"}
    assert state["push_weights"].dtype == torch.float64
    resumed, y = _sgp(), z.clone()
    resumed.load_state_dict(state)
    for t in range(5, 10):
        algo.step(z, grads[t], _ctx(t, 0.1, comm, lambda k: mats[k % 3]))
        resumed.step(y, grads[t], _ctx(t, 0.1, comm, lambda k: mats[k % 3]))
    assert torch.equal(z, y)
    with pytest.raises(RuntimeError, match="setup"):
        _sgp().step(y, grads[0], _ctx(0, 0.1, comm, lambda k: mats[0]))


# ---- config ---------------------------------------------------------------------------------


def test_config_accepts_sgp_on_directed_and_symmetric_topologies() -> None:
    for topology in (DIRECTED, "ring", "exponential-one-peer"):
        cfg = load_config(None, ["algorithm=sgp", f"topology={topology}"], environ={})
        assert cfg.topology == topology


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm=dsgd", f"topology={DIRECTED}"], "only algorithm 'sgp'.*not 'dsgd'"),
        (["algorithm=choco", f"topology={DIRECTED}"], "only algorithm 'sgp'"),
        (["algorithm=sgp", f"topology={DIRECTED}", "weights=pairwise"], "weights are fixed"),
        (["algorithm=sgp", "compression.codec=bf16"], "does not apply to algorithm 'sgp'"),
        (["algorithm=sgp", "hyper.rounds=2"], "accepts none"),
    ],
)
def test_config_errors(overrides: list[str], match: str) -> None:
    def check() -> None:
        check_algorithm(load_config(None, overrides, environ={}))

    with pytest.raises((ConfigError, ValueError), match=match):
        check()
