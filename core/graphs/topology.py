"""Named topologies and their gossip schedules (torch-free) — docs/algorithms.md#topologies.

Entry points: `make_schedule` (what the engines and the orchestrator use), `build_graph` (static
graphs and trees, e.g. for RelaySum), `describe` (the JSON summary behind
``concord topology NAME --peers N --json``), plus `double_binary_trees` and `bfs_spanning_tree`.
Node ids are 0…n−1, n ≥ 2. Definitions:

* ``complete`` all pairs; ``ring`` i ↔ i±1 mod n; ``chain`` i ↔ i+1; ``star`` 0 ↔ i.
* ``torus`` m × (n/m) periodic grid with m the largest divisor of n with m ≤ √n (Tao Lin's
  ``TorusGraph``); needs m ≥ 3 (so n ≥ 9 and n not prime or 2·prime), else the "torus" would
  degenerate into a ring or prism.
* ``hypercube`` i ↔ i XOR 2^k, n a power of 2 (relaysgd ``HyperCubeTopology``).
* ``exponential`` static undirected i ↔ i ± 2^k mod n, k = 0…⌊log2(n−1)⌋ (degree 7/9/11 for
  n = 16/32/64).
* ``exponential:K`` the k-peer undirected exponential graph: hops 1, 2, 4, …, 2^(K−1) in both
  directions, 1 ≤ K ≤ ⌈log2 n⌉ (= ⌊log2(n−1)⌋ + 1). K = 1 is the ring, K = ⌈log2 n⌉ the full
  ``exponential``; the family is nested (each K's edges contain K − 1's), so its spectral gap
  grows with K. The graph family the Ada interpretations move along
  (`concord.core.graphs.adagraph`).
* ``exponential-one-peer`` time-varying, period T = ⌊log2(n−1)⌋ + 1. For n = 2^τ round k pairs
  i with i XOR 2^(k mod τ) (hypercube dimension exchange: the symmetric one-peer exponential
  graph, each node talks to the node 2^k away), pairwise weights ½/½. The τ factors commute and
  their product is exactly 11ᵀ/n (finite-time exact averaging, Ying et al. 2021). For other n it
  falls back to Tao Lin's undirected ``UndirectedTimeVaryingSGPGraph``: round k links
  i ↔ i ± 2^(k mod T) mod n, a circulant (hence regular) degree-2 graph with Metropolis weights
  (= 1/3, the same as his row-normalised A + I); not finite-time exact.
* ``exponential-one-peer-directed`` time-varying and *directed* (SGP, Assran et al. 2019; quasi-
  global-momentum ``DirectedTimeVaryingOnePeerGraph``), period T = ⌊log2(n−1)⌋ + 1: in round k
  node i pushes to i + 2^(k mod T) mod n, keeping ½ and sending ½ (column-stochastic
  `concord.core.graphs.mixing.push_weights`). The shift is a bijection for every n, so every node
  also receives exactly one message and W_k is doubly stochastic (push-sum weights stay 1) — for n a
  power of 2 the T factors multiply to 11ᵀ/n exactly. Only push-sum algorithms (``sgp``) may use it:
  W_k is not symmetric.
* ``bipartite-exponential`` time-varying, n even, period max(1, ⌊log2(n−1)⌋): round k uses hop
  h = 2^(k mod T + 1) − 1 (odd) and pairs each odd i with i + h mod n — a perfect matching,
  pairwise weights (``TimeVaryingBipartiteExponentialOnePeerGraph``). n = 4 is refused
  (its only hop 1 leaves the graph disconnected).
* ``random-matching`` time-varying, seeded: round k draws a permutation with
  ``np.random.default_rng((seed, k))`` and pairs consecutive entries (odd n: the last node sits
  out); pairwise weights (``TimeVaryingRandomPairGraph``). Effective p = n/(2(n−1)) for even n,
  ½ for odd n.
* ``binary-tree`` node w > 0 has parent ⌊w/2⌋ (node 0 is attached only to node 1);
  ``double-binary-tree`` that tree ∪ its mirror w ↦ n−1−w (relaysgd "double-binary-trees").
* ``file:PATH`` an edge-list file (`concord.core.graphs.edgelist`).

Default weights: ``metropolis`` for static graphs (1/3 on the ring, 1/n on complete),
``pairwise`` for matchings (one-peer with n a power of 2, bipartite, random matching),
``file`` when an edge-list file gives weights. κ ∈ (0, 1] gives the lazy W_κ = κW + (1−κ)I.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from concord.core.graphs.edgelist import read_edge_list
from concord.core.graphs.graph import (
    Graph,
    TopologyError,
    UnknownTopologyError,
    bfs_spanning_tree,
    binary_tree_graph,
    chain_graph,
    complete_graph,
    distance_stats,
    exponential_graph,
    hypercube_graph,
    is_power_of_two,
    k_peer_exponential_graph,
    log2_floor,
    ring_graph,
    star_graph,
    torus_graph,
    whole_number,
)
from concord.core.graphs.mixing import (
    WEIGHT_RULES,
    check_kappa,
    push_weights,
    validate_mixing,
    weights_for,
)
from concord.core.graphs.schedules import (
    RoundBuilder,
    Spectral,
    TopologySchedule,
    check_connected_over_period,
)
from concord.core.plugins import accepts, is_spec, resolve
from concord.core.records import JSON
from concord.core.registry import Registry
from concord.core.specs import TOPOLOGY_SPECS, TopologySpec

__all__ = [
    "DIRECTED_TOPOLOGIES",
    "TIME_VARYING",
    "TOPOLOGY_NAMES",
    "WEIGHT_RULES",
    "Graph",
    "Spectral",
    "TopologyError",
    "TopologySchedule",
    "UnknownTopologyError",
    "bfs_spanning_tree",
    "build_graph",
    "check_connected_over_period",
    "describe",
    "double_binary_trees",
    "exponential_k",
    "exponential_name",
    "make_schedule",
    "max_exponential_k",
    "topology_spec",
    "validate_mixing",
]

FILE_PREFIX = "file:"
EXPONENTIAL_PREFIX = "exponential:"


def max_exponential_k(n: int) -> int:
    """⌈log2 n⌉ (= ⌊log2(n−1)⌋ + 1 for n ≥ 2): the K of the densest ``exponential:K``."""
    return log2_floor(n - 1) + 1 if n >= 2 else 1


def exponential_name(k: int) -> str:
    """The topology name of the k-peer exponential graph, ``exponential:K``."""
    return f"{EXPONENTIAL_PREFIX}{k}"


def exponential_k(name: str, n: int | None = None) -> int | None:
    """K of an ``exponential:K`` name (also ``ring`` = 1 and, given n, ``exponential`` =
    ⌈log2 n⌉); None for other topologies. A malformed K raises `TopologyError`; with ``n`` the
    range 1 ≤ K ≤ ⌈log2 n⌉ is checked too."""
    if name == "ring":
        return 1
    if name == "exponential":
        return max_exponential_k(n) if n is not None else None
    if not name.startswith(EXPONENTIAL_PREFIX):
        return None
    text = name[len(EXPONENTIAL_PREFIX) :]
    if not (text.isascii() and text.isdigit()) or int(text) < 1 or text != str(int(text)):
        raise TopologyError(
            f"topology {name!r}: K in 'exponential:K' must be an integer >= 1 (hops 1, 2, …, "
            "2^(K-1)); e.g. 'exponential:2'"
        )
    k = int(text)
    if n is not None and k > max_exponential_k(n):
        raise TopologyError(
            f"topology {name!r} needs K <= ceil(log2 n) = {max_exponential_k(n)} for n={n} "
            f"(hop 2^(K-1) = {1 << (k - 1)} must stay below n); 'exponential:"
            f"{max_exponential_k(n)}' is the densest (= 'exponential')"
        )
    return k


@dataclass(frozen=True)
class Family:
    """A topology instantiated for n: its round graphs, period and default weight rule."""

    round_graph: Callable[[int], Graph]
    period: int | None  # None: random (seeded) rounds
    default_weights: str
    expected: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None  # (E[W], E[WᵀW])
    fixed_matrix: np.ndarray | None = None  # weights given by an edge-list file
    arcs: Callable[[int], list[tuple[int, int]]] | None = None  # directed: round k's arcs i → j


FamilyBuilder = Callable[[int, int], Family]  # (n, seed) → Family
TOPOLOGIES: Registry[FamilyBuilder] = Registry("topology", TOPOLOGY_SPECS)


def _static(graph: Graph) -> Family:
    return Family(round_graph=lambda _k: graph, period=1, default_weights="metropolis")


def double_binary_trees(n: int) -> tuple[Graph, Graph]:
    """The binary tree and its mirror (w ↦ n−1−w) used by RelaySGD's double binary trees.

    Each is a spanning tree with max degree ≤ 3; RelaySGD sends half of the coordinates over each.
    """
    _check_n(n)
    tree = binary_tree_graph(n)
    return tree, tree.relabel([n - 1 - w for w in range(n)])


def _double_tree_union(n: int) -> Graph:
    a, b = double_binary_trees(n)
    return a.union(b)


_STATIC: dict[str, Callable[[int], Graph]] = {
    "complete": complete_graph,
    "ring": ring_graph,
    "chain": chain_graph,
    "star": star_graph,
    "torus": torus_graph,
    "hypercube": hypercube_graph,
    "exponential": exponential_graph,
}


def _register_static(name: str, fn: Callable[[int], Graph]) -> None:
    TOPOLOGIES.add(name, lambda n, _seed: _static(fn(n)))


for _name, _fn in _STATIC.items():
    _register_static(_name, _fn)


# ---- time-varying schedules ----------------------------------------------------------------


@TOPOLOGIES.register("exponential-one-peer")
def _one_peer(n: int, _seed: int) -> Family:
    if is_power_of_two(n):
        tau = log2_floor(n)
        graphs = [
            Graph.from_edges(n, ((i, i ^ (1 << k)) for i in range(n) if not i & (1 << k)))
            for k in range(tau)
        ]
        return Family(lambda k: graphs[k % tau], tau, "pairwise")
    period = log2_floor(n - 1) + 1
    graphs = [
        Graph.from_edges(n, ((i, (i + (1 << k)) % n) for i in range(n))) for k in range(period)
    ]
    return Family(lambda k: graphs[k % period], period, "metropolis")


@TOPOLOGIES.register("exponential-one-peer-directed")
def _one_peer_directed(n: int, _seed: int) -> Family:
    period = log2_floor(n - 1) + 1
    arcs = [[(i, (i + (1 << k)) % n) for i in range(n)] for k in range(period)]
    graphs = [Graph.from_edges(n, a) for a in arcs]
    return Family(lambda k: graphs[k % period], period, "push", arcs=lambda k: arcs[k % period])


@TOPOLOGIES.register("bipartite-exponential")
def _bipartite(n: int, _seed: int) -> Family:
    if n % 2:
        raise TopologyError(
            f"topology 'bipartite-exponential' needs an even n (odd ids pair with even ids); "
            f"got n={n}"
        )
    if n == 4:
        raise TopologyError(
            "topology 'bipartite-exponential' with n=4 only uses hop 1, which splits the peers "
            "into {1, 2} and {3, 0}; use n=2 or an even n >= 6"
        )
    period = max(1, log2_floor(n - 1))
    graphs = []
    for k in range(period):
        h = (1 << (k + 1)) - 1
        graphs.append(Graph.from_edges(n, ((i, (i + h) % n) for i in range(1, n, 2))))
    return Family(lambda k: graphs[k % period], period, "pairwise")


@TOPOLOGIES.register("random-matching")
def _random_matching(n: int, seed: int) -> Family:
    def round_graph(k: int) -> Graph:
        perm = np.random.default_rng((seed, k)).permutation(n)
        return Graph.from_edges(n, zip(perm[0::2].tolist(), perm[1::2].tolist(), strict=False))

    def expected() -> tuple[np.ndarray, np.ndarray]:
        # P(i and j are paired) = 1/(n−1) (even n) or 1/n (odd n); the pairwise W is an
        # orthogonal projection (W = Wᵀ = W²), so E[WᵀW] = E[W] = (1 − n·b) I + b·11ᵀ.
        b = 0.5 / (n - 1) if n % 2 == 0 else 0.5 / n
        EW = (1.0 - n * b) * np.eye(n) + b * np.ones((n, n))
        return EW, EW.copy()

    return Family(round_graph, None, "pairwise", expected=expected)


# ---- trees ---------------------------------------------------------------------------------

_register_static("binary-tree", binary_tree_graph)
_register_static("double-binary-tree", _double_tree_union)

# The built-in names and their traits, read from the spec table (`concord.core.specs`); code
# asks `topology_spec(name)` (which knows registered names and plug-ins too).
TOPOLOGY_NAMES: tuple[str, ...] = tuple(TOPOLOGY_SPECS)
TIME_VARYING: tuple[str, ...] = tuple(
    n for n in TOPOLOGY_SPECS if TOPOLOGY_SPECS.get(n).time_varying
)
"""Built-in topologies whose graph changes from step to step (a period of graphs)."""
DIRECTED_TOPOLOGIES: tuple[str, ...] = tuple(
    n for n in TOPOLOGY_SPECS if TOPOLOGY_SPECS.get(n).directed
)
"""Built-in topologies with column-stochastic matrices: for push-sum algorithms only."""
_FORMS = ("module:builder", "exponential:K", "or file:PATH")  # the forms besides the names


def topology_spec(name: str) -> TopologySpec:
    """The traits of topology ``name``: a declared name, ``exponential:K`` or ``file:PATH``
    (static), or a ``module:builder`` plug-in (its builder's ``spec``, default static);
    `UnknownTopologyError` (with the closest name) or `concord.core.plugins.PluginError`."""
    if name.startswith((FILE_PREFIX, EXPONENTIAL_PREFIX)):
        return TopologySpec(name)
    spec = TOPOLOGY_SPECS.lookup(name)
    if spec is None:
        raise UnknownTopologyError(TOPOLOGY_SPECS.unknown(name, *_FORMS))
    return spec


def _plugin_family(name: str, n: int, seed: int) -> Family:
    """A ``module:builder`` topology: ``builder(n[, seed=])`` returns a `Graph` (static) or a
    `Family`."""
    fn = resolve(name, "topology")
    out = fn(n, seed=seed) if accepts(fn, "seed") else fn(n)
    if isinstance(out, Family):
        return out
    if isinstance(out, Graph):
        return _static(out)
    raise TopologyError(
        f"topology {name!r}: the builder returned a {type(out).__name__}; expected a Graph or a "
        "concord.core.graphs.topology.Family"
    )


# ---- public entry points -------------------------------------------------------------------


def _check_n(n: int) -> int:
    nn = whole_number(n, f"number of peers n must be an integer >= 2; got {n!r}")
    if nn < 2:
        raise TopologyError(f"number of peers n must be >= 2 for a topology; got n={nn}")
    return nn


def _check_seed(seed: int) -> int:
    message = f"seed must be a non-negative integer; got {seed!r}"
    s = whole_number(seed, message)
    if s < 0:
        raise TopologyError(message)
    return s


def _family(name: str, n: int, seed: int) -> Family:
    if not isinstance(name, str):
        raise TopologyError(f"topology name must be a string; got {name!r}")
    if name.startswith(FILE_PREFIX):
        path = name[len(FILE_PREFIX) :]
        if not path:
            raise TopologyError("topology 'file:' needs a path, e.g. 'file:graphs/office.txt'")
        graph, W = read_edge_list(path, n)
        return Family(lambda _k: graph, 1, "file" if W is not None else "metropolis", None, W)
    if name.startswith(EXPONENTIAL_PREFIX):
        return _static(k_peer_exponential_graph(n, exponential_k(name, n) or 1))
    if name not in TOPOLOGIES and is_spec(name):
        return _plugin_family(name, n, seed)
    if name not in TOPOLOGIES:
        raise UnknownTopologyError(TOPOLOGY_SPECS.unknown(name, *_FORMS))
    return TOPOLOGIES.get(name)(n, seed)


def _round_builder(fam: Family, rule: str, name: str, n: int) -> RoundBuilder:
    """Round k → (graph, W) for weight rule ``rule`` (validated here)."""
    arcs = fam.arcs
    if arcs is not None:
        if rule != "push":
            raise TopologyError(
                f"topology {name!r} is directed: its weights are fixed (each node keeps "
                f"1/(outdeg + 1) and pushes that share to each out-neighbour, column "
                f"stochastic); leave weights unset (got {rule!r})"
            )
        return lambda k: (fam.round_graph(k), push_weights(n, arcs(k)))
    if rule == "file":
        fixed = fam.fixed_matrix
        if fixed is None:
            raise TopologyError(
                f"weights 'file' need an edge-list file with weights ('i j w' lines); "
                f"topology {name!r} has none; use one of {', '.join(WEIGHT_RULES)}"
            )
        graph0 = fam.round_graph(0)
        return lambda _k: (graph0, fixed)
    if rule not in WEIGHT_RULES:
        raise UnknownTopologyError(
            f"unknown weights {rule!r}; valid: {', '.join(WEIGHT_RULES)}, "
            "or 'file' (for a weighted edge-list file)"
        )

    def build(k: int) -> tuple[Graph, np.ndarray]:
        g = fam.round_graph(k)
        what = f"{name} (n={n})" if fam.period == 1 else f"{name} (n={n}) round {k}"
        return g, weights_for(rule, g, what=what)

    return build


def make_schedule(
    name: str, n: int, *, weights: str | None = None, kappa: float = 1.0, seed: int = 0
) -> TopologySchedule:
    """Build the gossip schedule of topology ``name`` for ``n`` peers.

    Parameters: ``name`` ∈ `TOPOLOGY_NAMES`, ``"exponential:K"`` or ``"file:PATH"``; ``n`` ≥ 2
    (some topologies need more, see the module docstring); ``weights`` ∈ `WEIGHT_RULES` (or
    "file" for a weighted edge list), None = the topology's default; ``kappa`` ∈ (0, 1] lazy
    factor; ``seed`` ≥ 0 (random schedules only). Every matrix is validated (symmetric, doubly
    stochastic, supported on the graph; column stochastic for `DIRECTED_TOPOLOGIES`) and the
    union over one period must be connected (strongly, for directed ones); violations raise
    `TopologyError`.
    """
    nn = _check_n(n)
    k = check_kappa(kappa)
    s = _check_seed(seed)
    fam = _family(name, nn, s)
    rule = fam.default_weights if weights is None else weights
    build = _round_builder(fam, rule, name, nn)
    schedule = TopologySchedule(
        name=name,
        n=nn,
        weights=rule,
        kappa=k,
        seed=s,
        period=fam.period,
        build=build,
        expected=fam.expected,
        directed=fam.arcs is not None,
    )
    check_connected_over_period(schedule)
    return schedule


def build_graph(name: str, n: int) -> Graph:
    """The static graph of a static topology or tree (or a ``file:PATH`` edge list).

    Time-varying names are refused: use ``make_schedule(name, n).graph(k)`` or ``.union_graph()``.
    ``double-binary-tree`` returns the union of both trees (see `double_binary_trees`).
    """
    nn = _check_n(n)
    if topology_spec(name).time_varying:
        raise TopologyError(
            f"topology {name!r} is time-varying and has no single graph; use "
            f"make_schedule({name!r}, {nn}).graph(k) or .union_graph()"
        )
    return _family(name, nn, 0).round_graph(0)


def describe(
    name: str, n: int, *, weights: str | None = None, kappa: float = 1.0, seed: int = 0
) -> dict[str, JSON]:
    """JSON-able summary of a topology (for ``concord topology NAME --peers N --json``).

    Keys: name, peers, weights, kappa, seed, time_varying, period, max_degree (max over the
    rounds of one period: links a peer uses in one round), edges (distinct links used over one
    period; for random schedules every pair that can be drawn), edges_per_round (max), regular
    (every round's graph is regular), diameter and mean_distance (of the union graph over one
    period; None for random schedules), spectral_gap, p, lambda2, lambda_n,
    exact_average_after, spectral_rounds (rounds the spectral values describe).
    """
    sch = make_schedule(name, n, weights=weights, kappa=kappa, seed=seed)
    sp = sch.spectral()
    rounds = [sch.graph(k) for k in range(sch.period if sch.period is not None else 1)]
    union = sch.union_graph()
    stats = distance_stats(union) if sch.period is not None else None
    if sch.period is None:
        regular = sch.n % 2 == 0  # a perfect matching each round iff n is even
    else:
        regular = all(g.is_regular() for g in rounds)
    return {
        "name": sch.name,
        "peers": sch.n,
        "weights": sch.weights,
        "kappa": sch.kappa,
        "seed": sch.seed,
        "time_varying": sch.time_varying,
        "period": sch.period,
        "max_degree": max(g.max_degree for g in rounds),
        "edges": len(union.edges),
        "edges_per_round": max(len(g.edges) for g in rounds),
        "regular": bool(regular),
        "diameter": stats[0] if stats else None,
        "mean_distance": round(stats[1], 6) if stats else None,
        "spectral_gap": sp.spectral_gap,
        "p": sp.p,
        "lambda2": sp.lambda2,
        "lambda_n": sp.lambda_n,
        "exact_average_after": sp.exact_average_after,
        "spectral_rounds": sp.rounds,
    }
