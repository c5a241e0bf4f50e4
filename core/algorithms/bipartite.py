"""AD-PSGD's graph rule, torch-free (the config validator checks it before a run starts;
`concord.core.algorithms.ad_psgd` applies it at every step). docs/algorithms.md#ad-psgd.

Active peers (odd ranks) initiate averagings, passive peers (even ranks) only answer, so every
edge must join an odd and an even peer. In round k active peer i averages with its neighbours of
that round in turn: neighbour number k mod d (d: its degree in round k, neighbours in rank
order) — round-robin, where the paper draws a neighbour at random. Over a periodic schedule of
period T, in round r it therefore uses exactly the neighbours whose number is ≡ r (mod gcd(T, d))
(`used_edges`); the graph of those edges must be connected, or some peers never mix with the
others.
"""

from __future__ import annotations

import math

import numpy as np

from concord.core.graphs.graph import Graph, describe_components


def is_active(rank: int) -> bool:
    """Whether peer ``rank`` initiates averagings (odd ranks; even ranks are passive)."""
    return rank % 2 == 1


def neighbours(W: np.ndarray, rank: int) -> list[int]:
    """Peer ``rank``'s neighbours in mixing matrix ``W`` (rank order, itself excluded)."""
    return [int(j) for j in np.nonzero(W[rank])[0] if j != rank]


def round_partner(W: np.ndarray, rank: int, step: int) -> int | None:
    """The neighbour active peer ``rank`` averages with at its local step ``step`` in round
    matrix ``W`` (round-robin; None: no neighbour this round). Does not check the graph."""
    row = neighbours(W, rank)
    return row[step % len(row)] if row else None


def same_parity_edge(W: np.ndarray) -> tuple[int, int] | None:
    """The first edge (i < j) of ``W`` between two active or two passive peers, else None."""
    rows, cols = np.nonzero(W)
    bad = (rows < cols) & (rows % 2 == cols % 2)
    if not bad.any():
        return None
    k = int(np.argmax(bad))
    return int(rows[k]), int(cols[k])


def parity_problem(edge: tuple[int, int], where: str) -> str:
    """The refusal of a same-parity ``edge`` (``where``: the topology and round)."""
    i, j = edge
    side = "active (odd)" if is_active(i) else "passive (even)"
    return (
        f"{where}: peers {i} and {j} are neighbours but both {side}; AD-PSGD averages only "
        "between an odd (active) and an even (passive) peer — use a bipartite topology with "
        "odd peers on one side (bipartite-exponential, or a ring of even n)"
    )


def used_edges(matrices: list[np.ndarray]) -> list[tuple[int, int]]:
    """The edges (active, passive) that round-robin partner choice uses over a periodic
    schedule whose rounds are ``matrices`` (one period): in round r, peer i's neighbours whose
    number is ≡ r (mod gcd(T, d)), since steps k ≡ r (mod T) reach exactly those k mod d."""
    period = len(matrices)
    n = matrices[0].shape[0]
    used: set[tuple[int, int]] = set()
    for r, W in enumerate(matrices):
        for i in range(1, n, 2):
            row = neighbours(W, i)
            if row:
                g = math.gcd(period, len(row))
                used.update((i, j) for idx, j in enumerate(row) if idx % g == r % g)
    return sorted(used)


def schedule_problems(name: str, matrices: list[np.ndarray]) -> list[str]:
    """Why AD-PSGD cannot run on the periodic schedule ``name`` whose one period is
    ``matrices`` (empty: it can): a same-parity edge in any round (the pair named), or a graph
    of used edges that is not connected."""
    period = len(matrices)
    for r, W in enumerate(matrices):
        edge = same_parity_edge(W)
        if edge is not None:
            where = f"topology {name!r}" + (f" round {r}" if period > 1 else "")
            return [parity_problem(edge, where)]
    graph = Graph.from_edges(matrices[0].shape[0], used_edges(matrices))
    if graph.is_connected():
        return []
    return [
        f"topology {name!r}: the edges AD-PSGD's round-robin partner choice uses over one "
        f"period ({period} rounds) do not connect the peers: {describe_components(graph)}"
    ]
