"""Edge-list files for the ``file:PATH`` topology (torch-free).

Format: one link per line, ``i j`` (weights from a rule, default Metropolis) or ``i j w``
(explicit mixing weight W[i, j] = W[j, i] = w ∈ (0, 1]; the self weight is 1 − Σ_j w_ij).
Either every line has a weight or none does. Node ids are integers 0…n−1; ``#`` starts a
comment; blank lines are ignored; commas may separate fields. A link may be listed twice (in
either direction) only with the same weight. The graph must be connected. Every error names the
file and, where there is one, the line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from concord.core.graphs.graph import Graph, TopologyError, describe_components

_SUM_ATOL = 1e-12  # float slack when checking that a node's listed weights sum to at most 1


def read_edge_list(path: str | Path, n: int) -> tuple[Graph, np.ndarray | None]:
    """Parse an edge-list file into (graph, W or None).

    W (float64 (n, n), symmetric, doubly stochastic) is returned only when the file lists weights.
    Raises `TopologyError` for a missing/unreadable file, a malformed line, a node id outside
    0…n−1, a self-loop, a bad or conflicting weight, weights summing above 1 at a node, an empty
    file, or a disconnected graph.
    """
    p = Path(path)
    if not p.exists():
        raise TopologyError(f"topology file {str(p)!r} does not exist")
    if not p.is_file():
        raise TopologyError(f"topology file {str(p)!r} is not a regular file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TopologyError(f"cannot read topology file {str(p)!r}: {exc}") from None

    seen: dict[tuple[int, int], tuple[float | None, int]] = {}
    weighted: bool | None = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].replace(",", " ").strip()
        if not line:
            continue
        where = f"{p}:{lineno}"
        tokens = line.split()
        if len(tokens) not in (2, 3):
            raise TopologyError(f"{where}: expected 'i j' or 'i j w', got {raw.strip()!r}")
        try:
            i, j = int(tokens[0]), int(tokens[1])
        except ValueError:
            raise TopologyError(
                f"{where}: node ids must be integers, got {tokens[0]!r} {tokens[1]!r}"
            ) from None
        for node in (i, j):
            if not 0 <= node < n:
                raise TopologyError(
                    f"{where}: node {node} out of range for n={n} (valid ids 0..{n - 1})"
                )
        if i == j:
            raise TopologyError(
                f"{where}: self-loop '{i} {j}'; list only links between different nodes "
                "(the self weight is implied)"
            )
        has_w = len(tokens) == 3
        if weighted is None:
            weighted = has_w
        elif weighted != has_w:
            raise TopologyError(
                f"{where}: {'has' if has_w else 'lacks'} a weight but earlier lines "
                f"{'do not' if has_w else 'do'}; give a weight on every line or on none"
            )
        w: float | None = None
        if has_w:
            try:
                w = float(tokens[2])
            except ValueError:
                raise TopologyError(f"{where}: weight {tokens[2]!r} is not a number") from None
            if not (math.isfinite(w) and 0.0 < w <= 1.0):
                raise TopologyError(f"{where}: weight {tokens[2]} must be in (0, 1]")
        key = (min(i, j), max(i, j))
        if key in seen:
            prev_w, prev_line = seen[key]
            if prev_w != w:
                raise TopologyError(
                    f"{where}: link {key[0]}-{key[1]} has weight {w} but line {prev_line} "
                    f"gave {prev_w}"
                )
            continue
        seen[key] = (w, lineno)

    if not seen:
        raise TopologyError(f"topology file {str(p)!r} lists no links")
    graph = Graph(n, tuple(sorted(seen)))
    if not graph.is_connected():
        raise TopologyError(
            f"topology file {str(p)!r}: the graph on n={n} nodes is not connected "
            f"({describe_components(graph)})"
        )
    if not weighted:
        return graph, None
    W = np.zeros((n, n), dtype=np.float64)
    for (i, j), (w, _) in seen.items():
        W[i, j] = W[j, i] = float(w) if w is not None else 0.0
    sums = W.sum(axis=1)
    over = np.flatnonzero(sums > 1.0 + _SUM_ATOL)
    if over.size:
        node = int(over[0])
        raise TopologyError(
            f"topology file {str(p)!r}: weights at node {node} sum to {sums[node]:.12g} > 1, "
            "so its self weight 1 − Σ would be negative"
        )
    W[np.diag_indices(n)] = np.clip(1.0 - sums, 0.0, None)
    return graph, W
