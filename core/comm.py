"""The communication interface every algorithm is written against ("one algorithm, two engines").

Tensors passed here have a leading dimension of *the replicas this process holds*, k:

* in the vectorized engine k = n (all replicas, one process) and communication is in-memory
  linear algebra (`concord.sim.vectorized.VectorizedComm`);
* in a peer process k = 1 and the same calls go over gRPC (`peer` package).

Row ``r`` of a local tensor belongs to the global replica ``comm.ranks[r]``. Mixing matrices are
always the *global* n×n matrices from `concord.core.graphs.topology`; each backend only uses the
rows of its local replicas. Weights are float64 numpy arrays (the topology code is torch-free);
tensors stay in the dtype/device they come in.

A gossip round never raises because a neighbour is slow, dead or sends garbage: it returns a
`MixOutcome` saying who answered and what weight was renormalised, and the mix uses what arrived.

Overlap (start → handle → wait): `Comm.start_mix` and `Comm.start_allreduce_mean` start the same
exchange as `mix` / `allreduce_mean` and return a `Pending` handle at once; ``handle.wait()``
returns what the blocking call would have. In a peer the exchange runs on the event loop while the
training thread computes (`concord.peer.comm.PeerComm`); in the vectorized engine the handle is
complete when it is returned (the default here: the blocking call, run at start). Between start and
wait the caller must leave ``x`` unchanged (a peer sends it without copying it) and start no other
exchange. Algorithms use it to gossip x_t while the gradient at x_t is computed
(docs/algorithms.md#overlap).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import torch

if TYPE_CHECKING:
    from concord.core.compress import Codec

Edge = tuple[int, int]
"""A directed edge (src, dst) between global replica ids."""
T = TypeVar("T")


@dataclass
class CommCounters:
    """Traffic accounting, cumulative over the life of a `Comm` (all local replicas together)."""

    bytes_raw: int = 0  # payload bytes before compression (dtype size × elements)
    bytes_wire: int = 0  # bytes actually put on the wire (after the codec)
    messages: int = 0  # tensors sent (one per directed edge per round)
    rounds: int = 0  # gossip rounds / exchanges performed
    edges: dict[Edge, list[int]] = field(default_factory=dict)  # (src, dst) → [raw, wire]

    def add(self, *, raw: int, wire: int, messages: int) -> None:
        self.bytes_raw += raw
        self.bytes_wire += wire
        self.messages += messages

    def add_edges(self, edges: Sequence[Edge], *, raw: int, wire: int) -> None:
        """Account one message of ``raw``/``wire`` bytes on each directed edge (and in total)."""
        for edge in edges:
            entry = self.edges.get(edge)
            if entry is None:
                self.edges[edge] = [raw, wire]
            else:
                entry[0] += raw
                entry[1] += wire
        self.add(raw=raw * len(edges), wire=wire * len(edges), messages=len(edges))

    def edge_table(self) -> list[dict[str, int]]:
        return [
            {"src": s, "dst": d, "bytes_raw": r, "bytes_wire": w}
            for (s, d), (r, w) in sorted(self.edges.items())
        ]


@dataclass
class MixOutcome:
    """What happened in one gossip round, per local replica (row)."""

    answered: list[list[int]] = field(default_factory=list)  # neighbours whose tensor arrived
    missing: list[list[int]] = field(default_factory=list)  # late or dead neighbours
    rejected: list[list[tuple[int, str]]] = field(default_factory=list)  # (neighbour, reason)

    @property
    def complete(self) -> bool:
        return not any(self.missing) and not any(self.rejected)


@dataclass
class MixResult:
    x: torch.Tensor  # [k, d] mixed rows: x_i' = Σ_j w_ij Q(x_j) (renormalised over what arrived)
    outcome: MixOutcome
    sent: torch.Tensor | None = None  # [k, d] Q(x_i): the local rows as neighbours decoded them
    # [k] float64, when ``push`` was given: Σ_j W[i, j] w_j over the same messages as ``x``
    push: torch.Tensor | None = None


class Pending(ABC, Generic[T]):
    """An exchange started by `Comm.start_mix` or `Comm.start_allreduce_mean` (module
    docstring): in flight until `wait` returns its result."""

    @abstractmethod
    def done(self) -> bool:
        """Whether the exchange has ended (`wait` would not block); never blocks."""

    @abstractmethod
    def wait(self) -> T:
        """Block until the exchange has ended; its result. A second call returns the same."""


class Completed(Pending[T]):
    """A handle whose exchange ended before it was returned (the in-memory engine)."""

    def __init__(self, value: T) -> None:
        self._value = value

    def done(self) -> bool:
        return True

    def wait(self) -> T:
        return self._value


class Comm(ABC):
    """Abstract transport seen by `core` algorithms."""

    counters: CommCounters

    @property
    @abstractmethod
    def world_size(self) -> int:
        """n, the number of replicas in the whole run."""

    @property
    @abstractmethod
    def ranks(self) -> Sequence[int]:
        """Global ids of the k local replicas, in row order."""

    @abstractmethod
    def mix(
        self,
        x: torch.Tensor,
        W: np.ndarray,
        *,
        codec: Codec | None = None,
        step: int = 0,
        round: int = 0,
        push: torch.Tensor | None = None,
    ) -> MixResult:
        """One gossip round with the global mixing matrix ``W`` (n×n, float64).

        Returns rows ``Σ_j W[i, j] Q(x_j)`` for every local replica i, where Q is ``codec``'s
        encode→decode (identity when None; the self term uses Q(x_i) too, so that CHOCO's
        public copies stay identical on every peer). ``x`` is not modified. ``step`` and
        ``round`` (the run's global gossip-round index) tag the frames and seed random codecs.
        ``push`` ([k] float64): push-sum weights of the local rows; each travels *with* its
        row's message (real peers: in the frame header) and ``MixResult.push`` holds
        ``Σ_j W[i, j] w_j`` over exactly the messages that made up ``x``. A push-sum round is
        not renormalised over what arrived (a lost message drops its numerator and its weight;
        W need only be column-stochastic).
        """

    @abstractmethod
    def allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        """Exact average over all n replicas, returned for every local row ([k, d])."""

    def start_mix(
        self,
        x: torch.Tensor,
        W: np.ndarray,
        *,
        codec: Codec | None = None,
        step: int = 0,
        round: int = 0,
        push: torch.Tensor | None = None,
    ) -> Pending[MixResult]:
        """`mix` without blocking (module docstring): the handle's `Pending.wait` returns its
        `MixResult`. Leave ``x`` unchanged until then. Default: `mix` now, a completed handle."""
        return Completed(self.mix(x, W, codec=codec, step=step, round=round, push=push))

    def start_allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> Pending[torch.Tensor]:
        """`allreduce_mean` without blocking (module docstring); leave ``x`` unchanged until
        `Pending.wait`. Default: `allreduce_mean` now, a completed handle."""
        return Completed(self.allreduce_mean(x, step=step))

    @abstractmethod
    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        incoming: Sequence[Edge],
        *,
        step: int = 0,
        round: int = 0,
    ) -> dict[Edge, torch.Tensor]:
        """Per-edge messages (RelaySGD, CHOCO, push-sum).

        ``outgoing`` maps every directed edge (src, dst) with a local ``src`` to a 1-D tensor;
        ``incoming`` lists the edges with a local ``dst`` whose message this call must return.
        Edges whose message did not arrive are absent from the result.
        """

    def release(self, result: MixResult) -> None:  # noqa: B027 - optional hook
        """The caller is done with ``result`` (of `mix`): it will read neither ``result.x`` nor
        any view of it again, so a backend may reuse that memory for a later round (the
        vectorized engine does: its [n, d] results are hundreds of MB at large n)."""

    def begin_step(self, step: int) -> None:  # noqa: B027 - optional hook
        """The local replicas enter training step ``step`` (called by `concord.core.loop.StepRunner`
        before every step, whether or not it communicates; a network backend uses it to accept
        neighbours' messages for the steps ahead, e.g. after local-only steps)."""

    def mean_scalar(self, values: torch.Tensor) -> float:
        """Mean over all n replicas of one scalar per local replica ([k] → float)."""
        v = values.detach().reshape(-1, 1).to(torch.float64)
        return float(self.allreduce_mean(v)[0, 0])
