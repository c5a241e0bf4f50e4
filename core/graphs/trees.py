"""Spanning trees for RelaySum / RelaySGD (Vogels et al. NeurIPS 2021; docs/algorithms.md#relaysgd).

Torch-free (the config validator uses it). `relay_trees` picks, on the run's topology graph, the
tree(s) RelaySGD relays over, from the algorithm's hyperparameters ``hyper.tree`` and
``hyper.root``:

* ``"auto"`` (default): the topology itself if it is a tree (``chain``, ``binary-tree``,
  ``star``, an edge-list file that is a tree); the two trees of ``double-binary-tree`` if the
  topology is exactly their union (half of the coordinates go over each); otherwise the
  BFS spanning tree from ``root``;
* ``"chain"``, ``"binary-tree"``, ``"double-binary-tree"``: that named tree (pair) of
  `concord.core.graphs.topology`, which must be a subgraph of the topology — peers only exchange
  tensors with their topology neighbours. E.g. ``topology = "ring"``, ``hyper.tree = "chain"`` is
  the paper's chain, the spanning tree of the ring;
* ``"bfs"``: the BFS shortest-path spanning tree of the topology from ``root``
  (`concord.core.graphs.graph.bfs_spanning_tree`; relaysgd's social-network experiment).

Root choice: ``root = "center"`` (default) takes a *center* of the graph, the node of smallest
eccentricity (lowest id on ties). A BFS tree from r has depth ecc(r), so rooting it at a center
minimises the tree's depth — its diameter is at most 2·radius — and with it the worst relay
delay (a value from node k reaches node i after d_T(i, k) steps). ``root`` may also be a node id.
"""

from __future__ import annotations

import numpy as np

from concord.core.graphs.graph import Graph, TopologyError, bfs_distances, bfs_spanning_tree
from concord.core.graphs.topology import build_graph, double_binary_trees

TREE_CHOICES: tuple[str, ...] = ("auto", "chain", "binary-tree", "double-binary-tree", "bfs")
NAMED_TREES: tuple[str, ...] = ("chain", "binary-tree", "double-binary-tree")


def check_tree_choice(tree: object, root: object) -> None:
    """Raise ValueError naming ``hyper.tree`` / ``hyper.root`` unless both are valid values
    (whether they fit the topology is checked by `relay_trees`)."""
    if not isinstance(tree, str) or tree not in TREE_CHOICES:
        raise ValueError(f"hyper.tree must be one of {', '.join(TREE_CHOICES)}; got {tree!r}")
    if root == "center":
        return
    if isinstance(root, bool) or not isinstance(root, int) or root < 0:
        raise ValueError(f"hyper.root must be 'center' or a node id >= 0; got {root!r}")
    if tree in NAMED_TREES:
        raise ValueError(
            f"hyper.root = {root} only applies to BFS spanning trees (hyper.tree = 'bfs' or "
            f"'auto'); hyper.tree = {tree!r} is a fixed tree"
        )


def is_tree(graph: Graph) -> bool:
    """Connected with n − 1 edges."""
    return len(graph.edges) == graph.n - 1 and graph.is_connected()


def graph_center(graph: Graph) -> int:
    """The node of smallest eccentricity (lowest id on ties); TopologyError if disconnected."""
    best, best_ecc = 0, None
    for s in range(graph.n):
        d = bfs_distances(graph, s)
        if np.any(d < 0):
            raise TopologyError("a disconnected graph has no center (no spanning tree)")
        ecc = int(d.max())
        if best_ecc is None or ecc < best_ecc:
            best, best_ecc = s, ecc
    return best


def _named(tree: str, n: int) -> tuple[Graph, ...]:
    if tree == "double-binary-tree":
        return double_binary_trees(n)
    return (build_graph(tree, n),)


def relay_trees(graph: Graph, tree: str = "auto", root: int | str = "center") -> tuple[Graph, ...]:
    """The spanning tree(s) RelaySGD uses on ``graph`` (module docstring): one tree, or the two
    trees of ``double-binary-tree`` (coordinate c travels over tree c mod 2).

    Raises TopologyError (a ValueError) naming ``hyper.tree`` / ``hyper.root`` when the choice
    does not fit the graph.
    """
    check_tree_choice(tree, root)
    n = graph.n
    if tree in NAMED_TREES:
        trees = _named(tree, n)
        edges = set(graph.edges)
        for t in trees:
            missing = [e for e in t.edges if e not in edges]
            if missing:
                raise TopologyError(
                    f"hyper.tree = {tree!r} is not a subgraph of the topology (n={n}): its edge "
                    f"{missing[0]} is not a topology edge, and peers only exchange tensors with "
                    f"their neighbours; use hyper.tree = 'auto' or 'bfs'"
                )
        return trees
    if tree == "auto":
        if is_tree(graph):
            return (graph,)
        a, b = double_binary_trees(n)
        if graph == a.union(b):
            return a, b
    if root == "center":
        try:
            r = graph_center(graph)
        except TopologyError:
            raise TopologyError(
                f"hyper.tree = {tree!r}: the topology (n={n}) is disconnected; RelaySGD needs a "
                "spanning tree"
            ) from None
    else:
        r = int(root)
        if r >= n:
            raise TopologyError(f"hyper.root = {r} is not a node of the topology (n={n})")
    return (bfs_spanning_tree(graph, r),)
