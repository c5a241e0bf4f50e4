"""RelaySum / RelaySGD (Vogels et al. NeurIPS 2021): exact averaging after diameter steps
(docs/algorithms.md#reproduction-targets), heterogeneous quadratics, the count rule, spanning
trees, hyperparameter and config errors, state, phases and traffic."""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from concord.core.algorithms import LocalSGD, SGDConfig, StepContext, make_algorithm
from concord.core.algorithms.relay import RelaySum
from concord.core.algorithms.relaysgd import support_graph
from concord.core.comm import Comm, CommCounters, Edge
from concord.core.config import ConfigError, load_config
from concord.core.control.plan import Phase
from concord.core.graphs.graph import Graph, TopologyError, distance_stats
from concord.core.graphs.topology import (
    TopologySchedule,
    build_graph,
    double_binary_trees,
    make_schedule,
)
from concord.core.graphs.trees import graph_center, relay_trees
from concord.sim.vectorized import VectorizedComm

torch.set_num_threads(1)
GOSSIP = Phase(index=1, start=0, end=10**9, mode="gossip", topology=None, controlled=False)
EXACT = Phase(index=1, start=0, end=10**9, mode="exact", topology=None, controlled=False)


def _sgd(momentum: float = 0.0) -> LocalSGD:
    return LocalSGD(SGDConfig(momentum=momentum, nesterov=momentum > 0, weight_decay=0.0))


@functools.cache
def _schedule(topology: str, n: int) -> TopologySchedule:
    return make_schedule(topology, n)


def _ctx(
    t: int, lr: float, comm: Comm, topology: str, phase: Phase = GOSSIP, **kw: object
) -> StepContext:
    return StepContext(
        step=t,
        lr=lr,
        phase=phase,
        comm=comm,
        matrix=_schedule(topology, comm.world_size).matrix,
        round_offset=t,
        **kw,  # type: ignore[arg-type]
    )


class DroppingComm(VectorizedComm):
    """Loses the messages of the directed edges listed for each step."""

    def __init__(self, n: int, drops: Mapping[int, set[Edge]]) -> None:
        super().__init__(n)
        self.drops = drops

    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        incoming: Sequence[Edge],
        *,
        step: int = 0,
        round: int = 0,
    ) -> dict[Edge, torch.Tensor]:
        got = super().exchange(outgoing, incoming, step=step, round=round)
        return {e: m for e, m in got.items() if e not in self.drops.get(step, set())}


# ---- §9.3: exact averaging after diameter steps ----------------------------------------------


@pytest.mark.parametrize(
    ("topology", "diameter"), [("chain", 15), ("binary-tree", 6), ("double-binary-tree", 6)]
)
def test_relaysum_averages_exactly_after_diameter_steps(topology: str, diameter: int) -> None:
    n, d = 16, 9
    trees = relay_trees(build_graph(topology, n))
    assert max(distance_stats(t)[0] for t in trees) == diameter  # type: ignore[index]
    v = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mean = v.mean(0)
    comm = VectorizedComm(n)
    relay = RelaySum(trees, comm.ranks, d, dtype=v.dtype, device=v.device)
    errors = []
    for t in range(diameter):
        sums, outcome = relay.relay(v, comm, step=t, round=t)
        assert outcome.complete
        errors.append(float((sums / n - mean).abs().max()))
    # one step short, the farthest values are still missing (≈ |v_k|/n ≥ 1e-3 here) …
    assert errors[-2] > 1e-3
    # … after `diameter` steps every replica holds the exact mean: float64 round-off of a sum of
    # 16 O(1) values (relayed by adding and subtracting sums) is ~1e-15; 1e-12 leaves margin
    assert errors[-1] < 1e-12


def test_relaysgd_grad_spreads_one_update_to_everyone_exactly() -> None:
    """RelaySum/Grad with a single heterogeneous step, then no gradient: after diameter steps
    every model is x⁰ + mean(u) = mean(v), the §9.3 mean-estimation run inside the algorithm."""
    n, d, lr = 16, 5, 0.5
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(1, d, generator=gen, dtype=torch.float64).expand(n, d).clone()
    v = torch.randn(n, d, generator=gen, dtype=torch.float64)
    for topology, diameter in (("chain", 15), ("binary-tree", 6)):
        x, comm = x0.clone(), VectorizedComm(n)
        algo = make_algorithm("relaysgd-grad", _sgd())
        algo.setup(x, comm)
        algo.step(x, (x0 - v) / lr, _ctx(0, lr, comm, topology))  # x^{½} = v
        for t in range(1, diameter):
            assert float((x - v.mean(0)).abs().max()) > 1e-3  # not everything arrived yet
            algo.step(x, torch.zeros_like(x), _ctx(t, lr, comm, topology))
        # float64 round-off of O(1) sums, as above
        torch.testing.assert_close(x, v.mean(0).expand(n, d), rtol=0, atol=1e-12)


def test_relaysgd_without_gradient_stays_at_the_initial_model() -> None:
    n, d = 16, 6
    x0 = torch.randn(1, d, generator=torch.Generator().manual_seed(2)).expand(n, d).clone()
    x, comm = x0.clone(), VectorizedComm(n)
    algo = make_algorithm("relaysgd", _sgd(0.9))
    algo.setup(x, comm)
    for t in range(20):
        algo.step(x, torch.zeros_like(x), _ctx(t, 0.1, comm, "binary-tree"))
    assert torch.equal(x, x0)  # every relayed deviation is exactly 0


# ---- §5.2: the rule with counts and the x⁰ fill -----------------------------------------------


def _reference_relaysgd(
    tree: Graph, x0: torch.Tensor, grads: list[torch.Tensor], lr: float, drops: dict[int, set[Edge]]
) -> torch.Tensor:
    """RelaySGD exactly as written in docs/algorithms.md#relaysgd: messages m and counts c per edge,
    x_i ← (1/n)[S_i + (n − N_i) x⁰]; a dropped message is removed from the sum and the count."""
    n = tree.n
    nbrs = [tree.neighbors(i) for i in range(n)]
    m = {(i, j): torch.zeros_like(x0[0]) for i in range(n) for j in nbrs[i]}
    c = dict.fromkeys(m, 0)
    x = x0.clone()
    for t, g in enumerate(grads):
        half = x - lr * g  # plain SGD
        new_m = {
            (i, j): half[i] + sum((m[(k, i)] for k in nbrs[i] if k != j), torch.zeros_like(x0[0]))
            for (i, j) in m
        }
        new_c = {(i, j): 1 + sum(c[(k, i)] for k in nbrs[i] if k != j) for (i, j) in m}
        for e in drops.get(t, set()):
            new_m[e], new_c[e] = torch.zeros_like(x0[0]), 0
        m, c = new_m, new_c
        for i in range(n):
            s = half[i] + sum((m[(j, i)] for j in nbrs[i]), torch.zeros_like(x0[0]))
            count = 1 + sum(c[(j, i)] for j in nbrs[i])
            x[i] = (s + (n - count) * x0[i]) / n
    return x


def test_relaysgd_equals_the_count_rule_with_dropped_messages() -> None:
    n, d, lr, steps = 10, 4, 0.3, 25
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(1, d, generator=gen, dtype=torch.float64).expand(n, d).clone()
    grads = [torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(steps)]
    tree = build_graph("binary-tree", n)
    arcs = [(i, j) for i, j in tree.edges] + [(j, i) for i, j in tree.edges]
    rng = np.random.default_rng(0)
    drops = {t: {arcs[a] for a in rng.choice(len(arcs), 3, replace=False)} for t in range(steps)}
    expected = _reference_relaysgd(tree, x0, grads, lr, drops)
    x, comm = x0.clone(), DroppingComm(n, drops)
    algo = make_algorithm("relaysgd", _sgd())
    algo.setup(x, comm)
    for t, g in enumerate(grads):
        report = algo.step(x, g, _ctx(t, lr, comm, "binary-tree"))
        missing = {(j, i) for i, row in enumerate(report.outcomes[0].missing) for j in row}
        assert missing == drops[t]
    # relaying deviations from x⁰ instead of (sum, count) pairs: the same sums in another
    # order, float64 round-off of O(1) values over 25 steps (~1e-15 each)
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-12)


# ---- §9.5: heterogeneous quadratics ----------------------------------------------------------


def _quadratics(name: str, topology: str, steps: int, **hyper: object) -> list[float]:
    """f_i(x) = ½‖x − b_i‖², exact gradients, constant step 0.1; max_i ‖x_i − x*‖ per step."""
    n, d, lr = 16, 10, 0.1
    b = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x_star = b.mean(0)
    x, comm = torch.zeros(n, d, dtype=torch.float64), VectorizedComm(n)
    algo = make_algorithm(name, _sgd(), **hyper)
    algo.setup(x, comm)
    errors = []
    for t in range(steps):
        algo.step(x, x - b, _ctx(t, lr, comm, topology))
        errors.append(float((x - x_star).norm(dim=1).max()))
    return errors


def test_relaysgd_reaches_the_optimum_where_dsgd_stalls() -> None:
    dsgd = _quadratics("dsgd", "ring", 1000)
    # D-SGD's fixed point is off x* by O(η ζ / (1 − λ)): it has stopped improving …
    assert dsgd[-1] > 0.5
    assert dsgd[-1] == pytest.approx(dsgd[499], rel=1e-6)
    # … RelaySGD's only fixed point is x_i = x* (docs/algorithms.md#relaysgd), reached linearly;
    # 1e-6 is the brief's bar, far above float64 round-off
    for topology in ("chain", "binary-tree"):
        assert _quadratics("relaysgd", topology, 1000)[-1] <= 1e-6
    assert _quadratics("relaysgd", "ring", 1000, tree="chain")[-1] <= 1e-6  # chain ⊂ ring


def test_relaysgd_grad_has_an_exact_mean_but_a_delay_floor() -> None:
    """RelaySum/Grad applies every update once (mean → x* exactly) but with different delays,
    which leaves an O(η) disagreement under a constant step (module docstring)."""
    n, d, lr = 16, 10, 0.1
    b = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x, comm = torch.zeros(n, d, dtype=torch.float64), VectorizedComm(n)
    algo = make_algorithm("relaysgd-grad", _sgd())
    algo.setup(x, comm)
    for t in range(1000):
        algo.step(x, x - b, _ctx(t, lr, comm, "chain"))
    assert float((x.mean(0) - b.mean(0)).norm()) < 1e-12  # round-off of the mean's update
    assert float((x - x.mean(0)).norm(dim=1).max()) > 0.1


# ---- trees, hyperparameters, config ----------------------------------------------------------


def test_trees_from_the_topology() -> None:
    n = 16
    assert relay_trees(build_graph("chain", n)) == (build_graph("chain", n),)
    assert relay_trees(build_graph("double-binary-tree", n)) == double_binary_trees(n)
    assert graph_center(build_graph("chain", n)) == 7  # eccentricity 8 (7 and 8), lowest id
    ring = build_graph("ring", n)
    ring_tree = relay_trees(ring)[0]  # every node is a center: root 0; 8 is reached via 7
    assert set(ring_tree.edges) == set(ring.edges) - {(8, 9)}
    assert distance_stats(ring_tree) == distance_stats(build_graph("chain", n))
    # a BFS tree from the center is no deeper than the radius: the torus 4×4 has radius 4
    torus = build_graph("torus", n)
    assert distance_stats(relay_trees(torus)[0])[0] <= 2 * 4  # type: ignore[index]
    assert relay_trees(torus, "bfs", 5)[0].neighbors(5) == torus.neighbors(5)
    assert relay_trees(build_graph("ring", n), "chain") == (build_graph("chain", n),)
    assert len(relay_trees(build_graph("complete", n), "double-binary-tree")) == 2
    W = make_schedule("double-binary-tree", n).matrix(0)
    assert support_graph(W) == build_graph("double-binary-tree", n)


@pytest.mark.parametrize(
    ("hyper", "match"),
    [
        ({"tree": "ring"}, "hyper.tree must be one of"),
        ({"tree": 3}, "hyper.tree must be one of"),
        ({"root": -1}, "hyper.root must be 'center' or a node id"),
        ({"root": True}, "hyper.root must be 'center' or a node id"),
        ({"tree": "chain", "root": 2}, "hyper.root = 2 only applies to BFS"),
        ({"trees": "auto"}, "accepts"),
    ],
)
def test_hyperparameter_errors(hyper: dict[str, object], match: str) -> None:
    for name in ("relaysgd", "relaysgd-grad"):
        with pytest.raises(ValueError, match=match):
            make_algorithm(name, _sgd(), **hyper)


def test_tree_errors_name_the_problem() -> None:
    with pytest.raises(TopologyError, match=r"hyper.tree = 'chain' is not a subgraph"):
        relay_trees(build_graph("star", 8), "chain")
    with pytest.raises(TopologyError, match=r"hyper.root = 9 is not a node"):
        relay_trees(build_graph("ring", 8), "bfs", 9)
    disconnected = Graph.from_edges(4, [(0, 1), (2, 3)])
    with pytest.raises(TopologyError, match="disconnected"):
        relay_trees(disconnected)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["topology=exponential-one-peer"], "is time-varying; algorithm 'relaysgd' relays"),
        (["topology=random-matching"], "is time-varying"),
        (['phase_topologies=["ring", "chain", "ring"]'], "every phase must use topology 'ring'"),
        (["topology=star", "hyper.tree=binary-tree"], "hyper.tree = 'binary-tree' is not a sub"),
        (["hyper.tree=bfs", "hyper.root=8"], "hyper.root = 8 is not a node"),
        (["compression.codec=fp16"], "does not apply to algorithm 'relaysgd'"),
        (["topology=exponential-one-peer-directed"], "only algorithm 'sgp'"),
    ],
)
def test_config_errors(overrides: list[str], match: str) -> None:
    for name in ("relaysgd", "relaysgd-grad"):
        with pytest.raises(ConfigError, match=match.replace("'relaysgd'", f"'{name}'")):
            load_config(None, [f"algorithm={name}", "peers=8", *overrides], environ={})


def test_config_accepts_trees_of_static_topologies() -> None:
    for overrides in (["topology=chain"], ["topology=ring", "hyper.tree=chain"], ["hyper.root=3"]):
        cfg = load_config(None, ["algorithm=relaysgd", *overrides], environ={})
        assert cfg.algorithm == "relaysgd"


# ---- state, phases, control, traffic ---------------------------------------------------------


@pytest.mark.parametrize("name", ["relaysgd", "relaysgd-grad"])
def test_state_dict_round_trip(name: str) -> None:
    n, d = 8, 5
    gen = torch.Generator().manual_seed(4)
    x0 = torch.randn(1, d, generator=gen, dtype=torch.float64).expand(n, d).clone()
    grads = [torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(10)]
    x, comm = x0.clone(), VectorizedComm(n)
    algo = make_algorithm(name, _sgd(0.9), tree="double-binary-tree")
    algo.setup(x, comm)
    for t in range(5):
        algo.step(x, grads[t], _ctx(t, 0.1, comm, "double-binary-tree"))
    state = {k: v.clone() for k, v in algo.state_dict().items()}
    assert {"momentum", "relay_memory"} <= set(state)
    assert ("reference" in state) == (name == "relaysgd")
    resumed, y = make_algorithm(name, _sgd(0.9), tree="double-binary-tree"), x.clone()
    resumed.load_state_dict(state)  # the tree is built at the next step, memory applied then
    for t in range(5, 10):
        algo.step(x, grads[t], _ctx(t, 0.1, comm, "double-binary-tree"))
        resumed.step(y, grads[t], _ctx(t, 0.1, comm, "double-binary-tree"))
    assert torch.equal(x, y)
    bad = make_algorithm(name, _sgd(0.9))  # a single tree: different memory shape
    bad.load_state_dict(state)
    with pytest.raises(ValueError, match="relay memory has shape"):
        bad.step(y, grads[0], _ctx(0, 0.1, comm, "chain"))


def test_step_needs_setup_and_a_common_start() -> None:
    comm = VectorizedComm(4)
    algo = make_algorithm("relaysgd", _sgd())
    with pytest.raises(RuntimeError, match="setup"):
        algo.step(torch.zeros(4, 3), torch.zeros(4, 3), _ctx(0, 0.1, comm, "chain"))
    with pytest.raises(ValueError, match="common initial model"):
        algo.setup(torch.randn(4, 3), comm)


def test_exact_phase_restarts_the_relay_from_the_average() -> None:
    n, d = 8, 4
    gen = torch.Generator().manual_seed(5)
    x0 = torch.randn(1, d, generator=gen).expand(n, d).clone()
    x, comm = x0.clone(), VectorizedComm(n)
    algo = make_algorithm("relaysgd", _sgd())
    algo.setup(x, comm)
    for t in range(3):
        algo.step(x, torch.randn(n, d, generator=gen), _ctx(t, 0.1, comm, "chain"))
    report = algo.step(x, torch.randn(n, d, generator=gen), _ctx(3, 0.1, comm, "chain", EXACT))
    assert report.exact_average
    assert torch.equal(x, x[:1].expand_as(x))
    after = x.clone()
    for t in range(4, 8):  # no gradient: the relay restarted from the common average
        algo.step(x, torch.zeros_like(x), _ctx(t, 0.1, comm, "chain"))
    assert torch.equal(x, after)


def test_one_exchange_per_step_reported_once_and_counted_per_edge() -> None:
    class Repeat:
        calls = 0

        def after_round(self, r: int, x: torch.Tensor, theta: torch.Tensor) -> bool:
            Repeat.calls += 1
            return True  # "repeat" is ignored: the relay is one exchange per step

    n, d = 16, 7
    x, comm = torch.zeros(n, d), VectorizedComm(n)
    algo = make_algorithm("relaysgd", _sgd())
    algo.setup(x, comm)
    grad = torch.randn(n, d, generator=torch.Generator().manual_seed(6))
    report = algo.step(x, grad, _ctx(0, 0.1, comm, "binary-tree", control=Repeat()))
    assert report.rounds == 1
    assert Repeat.calls == 1
    assert report.theta_local is not None
    assert report.theta_local.shape == (n,)
    # one float32 d-vector per directed tree edge: 2 · 15 messages
    assert comm.counters.messages == 30
    assert comm.counters.bytes_wire == 30 * d * 4
    assert len(comm.counters.edge_table()) == 30


def test_double_tree_messages_carry_only_their_tree_coordinates() -> None:
    n, d = 16, 6
    a, b = double_binary_trees(n)
    comm = VectorizedComm(n)
    relay = RelaySum((a, b), comm.ranks, d, dtype=torch.float64, device=torch.device("cpu"))
    seen: dict[Edge, torch.Tensor] = {}

    class Spy(VectorizedComm):
        def exchange(self, outgoing, incoming, *, step=0, round=0):  # type: ignore[no-untyped-def]
            seen.update({e: m.clone() for e, m in outgoing.items()})
            return super().exchange(outgoing, incoming, step=step, round=round)

    v = torch.randn(n, d, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    relay.relay(v, Spy(n), step=0, round=0)
    only_a = {(i, j) for i, j in a.edges} - set(b.edges)
    only_b = {(i, j) for i, j in b.edges} - set(a.edges)
    for i, j in only_a:
        assert torch.equal(seen[(i, j)][1::2], torch.zeros(d // 2, dtype=torch.float64))
        assert torch.equal(seen[(i, j)][0::2], v[i, 0::2])  # first step: own value only
    for i, j in only_b:
        assert torch.equal(seen[(j, i)][0::2], torch.zeros(d // 2, dtype=torch.float64))
    assert len(seen) == 2 * len(a.union(b).edges)


class _Mailboxes:
    """Messages between threads, one thread per replica (what the peers' transport does)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: dict[tuple[int, Edge], torch.Tensor] = {}


class RankComm(Comm):
    """The k = 1 view of replica ``rank``: `exchange` posts its messages, then waits for its
    incoming ones (as `concord.peer.comm.PeerComm` does over gRPC)."""

    def __init__(self, rank: int, n: int, boxes: _Mailboxes) -> None:
        self.rank, self.n, self.boxes = rank, n, boxes
        self.counters = CommCounters()

    @property
    def world_size(self) -> int:
        return self.n

    @property
    def ranks(self) -> Sequence[int]:
        return (self.rank,)

    def mix(self, x, W, *, codec=None, step=0, round=0):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        raise NotImplementedError

    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        incoming: Sequence[Edge],
        *,
        step: int = 0,
        round: int = 0,
    ) -> dict[Edge, torch.Tensor]:
        with self.boxes.cond:
            for e, m in outgoing.items():
                self.boxes.messages[(step, e)] = m.clone()
            self.boxes.cond.notify_all()
            keys = [(step, e) for e in incoming]
            ok = self.boxes.cond.wait_for(
                lambda: all(k in self.boxes.messages for k in keys), timeout=10
            )
            assert ok, f"replica {self.rank}: messages of step {step} missing"
            return {e: self.boxes.messages[(step, e)] for e in incoming}


@pytest.mark.parametrize(
    ("name", "topology"), [("relaysgd", "double-binary-tree"), ("relaysgd-grad", "ring")]
)
def test_one_replica_per_process_matches_the_vectorized_rows(name: str, topology: str) -> None:
    """One algorithm, two engines at the Comm level: n threads each holding one replica (k = 1,
    their own RelaySum over RankComm) end with the n-row vectorized run's parameters."""
    n, d, steps = 8, 6, 12
    gen = torch.Generator().manual_seed(8)
    x0 = torch.randn(1, d, generator=gen, dtype=torch.float64).expand(n, d).clone()
    grads = [torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(steps)]
    x, comm = x0.clone(), VectorizedComm(n)
    algo = make_algorithm(name, _sgd(0.9))
    algo.setup(x, comm)
    for t, g in enumerate(grads):
        algo.step(x, g, _ctx(t, 0.1, comm, topology))
    boxes = _Mailboxes()

    def replica(i: int) -> torch.Tensor:
        xi, ci = x0[i : i + 1].clone(), RankComm(i, n, boxes)
        alg = make_algorithm(name, _sgd(0.9))
        alg.setup(xi, ci)
        for t, g in enumerate(grads):
            alg.step(xi, g[i : i + 1], _ctx(t, 0.1, ci, topology))
        return xi

    with ThreadPoolExecutor(n) as pool:
        rows = list(pool.map(replica, range(n)))
    # the same operations in the same order (incoming edges sorted by sender in both): exact
    torch.testing.assert_close(torch.cat(rows), x, rtol=0, atol=0)
