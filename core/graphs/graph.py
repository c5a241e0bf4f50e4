"""Undirected communication graphs: the `Graph` value type and traversal helpers (torch-free).

A `Graph` is the *support* of a gossip round: node ids are 0…n−1 and ``edges`` lists each
undirected link once as ``(i, j)`` with ``i < j``, sorted, without duplicates or self-loops.
Mixing weights live in `concord.core.graphs.mixing`; named topologies and time-varying schedules in
`concord.core.graphs.topology` / `concord.core.graphs.schedules`. Traversals (BFS distances,
diameter, spanning trees) are
plain O(n·(n + |E|)) Python, fine for the few hundred nodes Concord simulates.
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from concord.errors import TopologyError as TopologyError
from concord.errors import UnknownTopologyError as UnknownTopologyError


@dataclass(frozen=True)
class Graph:
    """An undirected simple graph on nodes 0…n−1.

    Invariants (checked on construction): ``n >= 1``; every edge ``(i, j)`` has
    ``0 <= i < j < n``; ``edges`` is sorted and has no duplicates. Use `Graph.from_edges` to build
    one from an arbitrary iterable of pairs (it orders, sorts and de-duplicates).
    """

    n: int
    edges: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int | np.integer) or self.n < 1:
            raise TopologyError(f"graph size n must be an integer >= 1; got {self.n!r}")
        prev: tuple[int, int] | None = None
        for e in self.edges:
            if len(e) != 2:
                raise TopologyError(f"graph edge {e!r} is not a pair (i, j)")
            i, j = e
            if not (0 <= i < j < self.n):
                raise TopologyError(
                    f"graph edge {e!r} is invalid for n={self.n}: need 0 <= i < j < n "
                    "(use Graph.from_edges to normalise arbitrary pairs)"
                )
            if prev is not None and e <= prev:
                raise TopologyError(
                    f"graph edges must be sorted without duplicates; {e!r} follows {prev!r} "
                    "(use Graph.from_edges to normalise)"
                )
            prev = e

    @classmethod
    def from_edges(cls, n: int, pairs: Iterable[tuple[int, int]]) -> Graph:
        """Build a graph from arbitrary pairs: orders each pair, sorts, drops duplicates.

        Self-loops ``(i, i)`` are rejected (a mixing matrix's diagonal is not an edge).
        """
        norm: set[tuple[int, int]] = set()
        for a, b in pairs:
            i, j = int(a), int(b)
            if i == j:
                raise TopologyError(f"self-loop ({i}, {j}) is not an edge")
            norm.add((i, j) if i < j else (j, i))
        return cls(int(n), tuple(sorted(norm)))

    @cached_property
    def _adj(self) -> tuple[tuple[int, ...], ...]:
        lists: list[list[int]] = [[] for _ in range(self.n)]
        for i, j in self.edges:
            lists[i].append(j)
            lists[j].append(i)
        return tuple(tuple(sorted(x)) for x in lists)

    def _check_node(self, i: int) -> int:
        if not (0 <= i < self.n):
            raise TopologyError(f"node {i!r} out of range for a graph with n={self.n}")
        return int(i)

    def neighbors(self, i: int) -> tuple[int, ...]:
        """Neighbours of node ``i`` in increasing order (without ``i`` itself)."""
        return self._adj[self._check_node(i)]

    def degrees(self) -> np.ndarray:
        """Degree of every node, int64 array of shape (n,)."""
        return np.array([len(a) for a in self._adj], dtype=np.int64)

    @property
    def max_degree(self) -> int:
        return max((len(a) for a in self._adj), default=0)

    def is_regular(self) -> bool:
        d = self.degrees()
        return bool(np.all(d == d[0]))

    @cached_property
    def _adj_matrix(self) -> np.ndarray:
        A = np.zeros((self.n, self.n), dtype=bool)
        if self.edges:
            e = np.asarray(self.edges, dtype=np.int64)
            A[e[:, 0], e[:, 1]] = True
            A[e[:, 1], e[:, 0]] = True
        A.flags.writeable = False
        return A

    def adjacency(self) -> np.ndarray:
        """Boolean symmetric adjacency matrix, shape (n, n), False on the diagonal (a copy)."""
        return self._adj_matrix.copy()

    def is_connected(self) -> bool:
        return bool(np.all(bfs_distances(self, 0) >= 0))

    def union(self, other: Graph) -> Graph:
        """The graph with the edges of both (same n)."""
        if other.n != self.n:
            raise TopologyError(f"cannot unite graphs with n={self.n} and n={other.n}")
        return Graph(self.n, tuple(sorted(set(self.edges) | set(other.edges))))

    def relabel(self, mapping: Iterable[int]) -> Graph:
        """The same graph with node ``w`` renamed ``mapping[w]`` (a permutation of 0…n−1)."""
        m = [int(x) for x in mapping]
        if sorted(m) != list(range(self.n)):
            raise TopologyError(f"relabel mapping must be a permutation of 0..{self.n - 1}")
        return Graph.from_edges(self.n, ((m[i], m[j]) for i, j in self.edges))


def bfs_distances(graph: Graph, source: int) -> np.ndarray:
    """Hop distances from ``source`` (int64, shape (n,)); −1 marks unreachable nodes.

    Sparse graphs (mean degree ≤ 16): queue BFS over adjacency lists, O(n + |E|). Dense graphs:
    one vectorised step per distance level on the adjacency matrix (few levels, many edges).
    """
    src = graph._check_node(source)
    if 2 * len(graph.edges) <= 16 * graph.n:
        adj, d = graph._adj, [-1] * graph.n
        d[src] = 0
        queue = deque([src])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if d[v] < 0:
                    d[v] = d[u] + 1
                    queue.append(v)
        return np.asarray(d, dtype=np.int64)
    A = graph._adj_matrix
    dist = np.full(graph.n, -1, dtype=np.int64)
    dist[src] = 0
    frontier = np.array([src])
    level = 0
    while frontier.size:
        level += 1
        frontier = np.flatnonzero(A[frontier].any(axis=0) & (dist < 0))
        dist[frontier] = level
    return dist


def components(graph: Graph) -> list[list[int]]:
    """Connected components, each a sorted node list, ordered by smallest node."""
    seen = np.zeros(graph.n, dtype=bool)
    out: list[list[int]] = []
    for s in range(graph.n):
        if not seen[s]:
            comp = np.flatnonzero(bfs_distances(graph, s) >= 0)
            seen[comp] = True
            out.append([int(c) for c in comp])
    return out


def distance_stats(graph: Graph) -> tuple[int, float] | None:
    """(diameter, mean distance over ordered pairs i ≠ j), or None if disconnected.

    For n = 1 returns (0, 0.0). Mean distance is what RelaySum's effective delay depends on
    (tree statistics: chain n=16 → 15 / 5.67, binary tree n=16 → 6 / 3.48).
    """
    if graph.n == 1:
        return 0, 0.0
    diam, total = 0, 0
    for s in range(graph.n):
        d = bfs_distances(graph, s)
        if np.any(d < 0):
            return None
        diam = max(diam, int(d.max()))
        total += int(d.sum())
    return diam, total / (graph.n * (graph.n - 1))


def bfs_spanning_tree(graph: Graph, root: int = 0) -> Graph:
    """Shortest-path (BFS) spanning tree rooted at ``root``; neighbours visited in id order.

    Used by RelaySum on arbitrary graphs (relaysgd ``SocialNetworkTreeTopology``: BFS
    shortest-path spanning tree from a chosen root). Raises TopologyError if disconnected.
    """
    r = graph._check_node(root)
    parent = np.full(graph.n, -1, dtype=np.int64)
    parent[r] = r
    queue = deque([r])
    while queue:
        u = queue.popleft()
        for v in graph.neighbors(u):
            if parent[v] < 0:
                parent[v] = u
                queue.append(v)
    missing = np.flatnonzero(parent < 0)
    if missing.size:
        raise TopologyError(
            f"cannot build a spanning tree: graph is disconnected "
            f"(nodes {missing[:10].tolist()} unreachable from root {r})"
        )
    return Graph.from_edges(graph.n, ((int(parent[v]), v) for v in range(graph.n) if v != r))


def describe_components(graph: Graph, limit: int = 4) -> str:
    """Short text naming the components of a disconnected graph, for error messages."""
    comps = components(graph)
    parts = [
        "{" + ", ".join(map(str, c[:8])) + (", …" if len(c) > 8 else "") + "}"
        for c in comps[:limit]
    ]
    more = f" and {len(comps) - limit} more" if len(comps) > limit else ""
    return f"{len(comps)} components: " + ", ".join(parts) + more


def whole_number(value: object, message: str) -> int:
    """``value`` as a Python int (a NumPy integer too); `TopologyError` with ``message`` when it
    is not an integer or is a bool."""
    if isinstance(value, bool):
        raise TopologyError(message)
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TopologyError(message) from None


def log2_floor(x: int) -> int:
    """⌊log2 x⌋ for x ≥ 1."""
    return x.bit_length() - 1


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


# ---- named static graphs (docs/algorithms.md#topologies) -----------------------------------------


def complete_graph(n: int) -> Graph:
    return Graph(n, tuple((i, j) for i in range(n) for j in range(i + 1, n)))


def ring_graph(n: int) -> Graph:
    return Graph.from_edges(n, ((i, (i + 1) % n) for i in range(n)))


def chain_graph(n: int) -> Graph:
    return Graph(n, tuple((i, i + 1) for i in range(n - 1)))


def star_graph(n: int) -> Graph:
    return Graph(n, tuple((0, i) for i in range(1, n)))


def torus_graph(n: int) -> Graph:
    m = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    if m < 3:
        raise TopologyError(
            f"topology 'torus' needs n = m·c with 3 <= m <= c (m the largest divisor <= √n), "
            f"e.g. 9, 12, 15, 16, 18, 20, 24, 25; n={n} gives {m}×{n // m}; use 'ring' or "
            f"'exponential'"
        )
    c = n // m
    pairs = []
    for r in range(m):
        for col in range(c):
            v = r * c + col
            pairs.append((v, r * c + (col + 1) % c))
            pairs.append((v, ((r + 1) % m) * c + col))
    return Graph.from_edges(n, pairs)


def hypercube_graph(n: int) -> Graph:
    if not is_power_of_two(n):
        raise TopologyError(
            f"topology 'hypercube' needs n to be a power of 2 (2, 4, 8, 16, …); got n={n}"
        )
    dims = log2_floor(n)
    return Graph.from_edges(n, ((i, i ^ (1 << b)) for i in range(n) for b in range(dims)))


def exponential_graph(n: int) -> Graph:
    hops = [1 << k for k in range(log2_floor(n - 1) + 1)]
    return Graph.from_edges(n, ((i, (i + h) % n) for i in range(n) for h in hops))


def k_peer_exponential_graph(n: int, k: int) -> Graph:
    """i ↔ i ± 2^j mod n for j = 0 … k−1 (1 ≤ k ≤ ⌊log2(n−1)⌋ + 1 = ⌈log2 n⌉): k = 1 is the
    ring, the largest k the full ``exponential`` graph."""
    hops = [1 << j for j in range(k)]
    return Graph.from_edges(n, ((i, (i + h) % n) for i in range(n) for h in hops))


def binary_tree_graph(n: int) -> Graph:
    return Graph(n, tuple(sorted((w // 2, w) for w in range(1, n))))
