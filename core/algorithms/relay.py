"""The RelaySum mechanism (Vogels et al., "RelaySum for Decentralized Deep Learning on
Heterogeneous Data", NeurIPS 2021; docs/algorithms.md#relaysgd) over
`concord.core.comm.Comm.exchange`.

On a spanning tree T every directed edge i → j carries, at step t,

    m_{i→j}^t = v_i^t + Σ_{k ∈ N(i)∖{j}} m_{k→i}^{t−1}        (m^{−1} = 0)

"my value plus the relay of what I last heard from all *other* neighbours". A node keeps the last
message received on each incoming edge, and after the exchange

    S_i^t = v_i^t + Σ_{j ∈ N(i)} m_{j→i}^t = Σ_k v_k^{t − d_T(i, k) + 1}   (for t ≥ d_T(i, k) − 1)

holds every node's value exactly once, delayed by (tree distance − 1) steps; with fixed values
S_i/n is the exact mean after diameter(T) steps. No counts travel: the algorithms relay
quantities whose "not arrived yet" value is 0 (`concord.core.algorithms.relaysgd`), which keeps
every message a d-vector — the size peers accept on the wire.

Two trees (``double-binary-tree``): coordinate c travels over tree c mod 2 (even coordinates over
the binary tree, odd ones over its mirror). Each directed edge of the union carries one
d-vector holding the coordinates of the tree(s) it belongs to and zeros elsewhere, so an edge of
a single tree sends d, not d/2, values (see the module docstring of `relaysgd`).

A message that does not arrive counts as a *dropped* message: it is taken as 0 — removed
from the relayed sums and their counts — and the round's `MixOutcome` names the neighbour.

Tensor shapes: values v [k, d] (k local replicas, rows = ``ranks``); the memory of received
messages [E_in, d], one row per incoming tree edge of a local replica, in (src, dst) order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from concord.core.comm import Comm, Edge, MixOutcome
from concord.core.graphs.graph import Graph


class RelaySum:
    """RelaySum over ``trees`` (one, or two with coordinates split by parity) for the local
    replicas ``ranks`` of a Comm. ``memory`` holds the last received message per incoming edge."""

    def __init__(
        self,
        trees: Sequence[Graph],
        ranks: Sequence[int],
        d: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if not trees or len({t.n for t in trees}) != 1:
            raise ValueError("RelaySum needs one or more spanning trees on the same nodes")
        self.trees = tuple(trees)
        self.ranks = list(ranks)
        self.d = d
        self._row = row = {r: i for i, r in enumerate(self.ranks)}
        members: dict[Edge, frozenset[int]] = {}  # directed edge → trees it belongs to
        for t, tree in enumerate(self.trees):
            for a, b in tree.edges:
                for e in ((a, b), (b, a)):
                    members[e] = members.get(e, frozenset()) | {t}
        self.in_edges: list[Edge] = sorted(e for e in members if e[1] in row)
        self.out_edges: list[Edge] = sorted(e for e in members if e[0] in row)
        in_index = {e: i for i, e in enumerate(self.in_edges)}

        def index(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        self._in_rows = index([row[dst] for _, dst in self.in_edges])
        self._out_rows = index([row[src] for src, _ in self.out_edges])
        self._out_back = index([in_index[(dst, src)] for src, dst in self.out_edges])
        self._masks: torch.Tensor | None = None  # [patterns, d] coordinate masks (two trees)
        self._in_pattern = self._out_pattern = index([])
        if len(self.trees) > 1:
            patterns = sorted(set(members.values()), key=sorted)
            coord_tree = torch.arange(d, device=device) % len(self.trees)
            self._masks = torch.stack(
                [torch.isin(coord_tree, index(sorted(p))).to(dtype) for p in patterns]
            )
            pattern_of = {p: i for i, p in enumerate(patterns)}
            self._in_pattern = index([pattern_of[members[e]] for e in self.in_edges])
            self._out_pattern = index([pattern_of[members[e]] for e in self.out_edges])
        self.memory = torch.zeros(len(self.in_edges), d, dtype=dtype, device=device)

    def reset(self) -> None:
        """Forget every received message (m = 0), e.g. after an exact average."""
        self.memory.zero_()

    def _incoming_sum(self, memory: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(like).index_add_(0, self._in_rows, memory)

    def relay(
        self, v: torch.Tensor, comm: Comm, *, step: int, round: int
    ) -> tuple[torch.Tensor, MixOutcome]:
        """One exchange: send m_{i→j} for every local i, receive m_{j→i}; returns S [k, d] (own
        value plus every message received now) and who answered."""
        if v.shape != (len(self.ranks), self.d):
            raise ValueError(f"relay values have shape {tuple(v.shape)}; expected [k, d]")
        heard = self._incoming_sum(self.memory, v)  # Σ_k m_{k→i}^{t−1}
        out = (v + heard).index_select(0, self._out_rows)
        out.sub_(self.memory.index_select(0, self._out_back))  # minus what j itself sent
        if self._masks is not None:
            out.mul_(self._masks.index_select(0, self._out_pattern))
        outgoing = dict(zip(self.out_edges, out.unbind(0), strict=True))
        got = comm.exchange(outgoing, self.in_edges, step=step, round=round)
        memory = torch.zeros_like(self.memory)
        outcome = MixOutcome(
            answered=[[] for _ in self.ranks],
            missing=[[] for _ in self.ranks],
            rejected=[[] for _ in self.ranks],
        )
        row = self._row
        for i, edge in enumerate(self.in_edges):
            message = got.get(edge)
            src, dst = edge
            if message is None:  # dropped: contributes 0 (and its count) this step
                outcome.missing[row[dst]].append(src)
                continue
            if message.shape != (self.d,):
                outcome.rejected[row[dst]].append((src, f"message of shape {tuple(message.shape)}"))
                continue
            memory[i] = message.to(memory.dtype)
            outcome.answered[row[dst]].append(src)
        if self._masks is not None:  # coordinates of trees the edge is not on stay 0
            memory.mul_(self._masks.index_select(0, self._in_pattern))
        self.memory = memory
        return v + self._incoming_sum(memory, v), outcome
