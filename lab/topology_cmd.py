"""``concord topology NAME --peers N``: what a topology is (its help lists every name and the
``file:PATH`` edge-list format) and its spectral values."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence

import click

from concord.core.graphs.topology import DIRECTED_TOPOLOGIES, TIME_VARYING, TOPOLOGY_NAMES


def topology_help() -> str:
    """The command's help: the names (from the registry) and the edge-list format that
    `concord.core.graphs.edgelist.read_edge_list` accepts."""
    static = [n for n in TOPOLOGY_NAMES if n not in TIME_VARYING]
    varying = [n for n in TIME_VARYING if n not in DIRECTED_TOPOLOGIES]
    return f"""Describe a topology: degree, spectral gap 1 − max(|λ₂|, |λₙ|), p = 1 − λ².

\b
NAME is one of
  static:        {_names(static)}
  exponential:K  the k-peer exponential graph: hops 1, 2, …, 2^(K−1)
  time-varying:  {_names(varying)}
                 (random-matching draws its rounds from --seed)
  directed:      {_names(DIRECTED_TOPOLOGIES)} (push-sum: sgp only)
  file:PATH      an edge-list file, below

\b
file:PATH — one link per line, nodes 0 … n−1 (n = --peers):
  i j      weights from --weights (default metropolis)
  i j w    the mixing weight W[i,j] = W[j,i] = w in (0, 1]; a node's self
           weight is 1 − the sum of its links' weights (at most 1)
Either every line has a weight or none does. '#' starts a comment, blank
lines are skipped, commas may separate the fields; a link listed twice
(either direction) must repeat its weight; no self-loops; the graph must be
connected. Example (a 4-node ring with a chord):
  0 1
  1 2
  2 3
  3 0
  0 2   # the chord
"""


def _names(names: Sequence[str]) -> str:
    """``names`` comma-separated, wrapped under the help's second column (click indents the
    help by 2: ≤ 78 columns in all)."""
    lines = textwrap.wrap(", ".join(names), width=76 - 17, break_on_hyphens=False)
    return ("\n" + " " * 17).join(lines)


def show_topology(
    name: str, peers: int, weights: str | None, kappa: float, seed: int, as_json: bool
) -> None:
    """Print `concord.core.graphs.topology.describe` (a ValueError: the caller's error)."""
    from concord.core.graphs.topology import describe

    info = describe(name, peers, weights=weights, kappa=kappa, seed=seed)
    if as_json:
        click.echo(json.dumps(info))
        return
    width = max(len(k) for k in info)
    for key, value in info.items():
        click.echo(f"{key:<{width}}  {value}")
