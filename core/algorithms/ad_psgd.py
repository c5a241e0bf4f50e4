"""AD-PSGD — Asynchronous Decentralized Parallel SGD (Lian, Zhang, Zhang & Liu, ICML 2018).
docs/algorithms.md#ad-psgd.

Every peer runs wait-free local steps. A step reads the model x_i at its start, computes the
stochastic gradient there, and when it ends applies the local optimizer's direction to the model
as it is *then* (averaging by neighbours may have moved it meanwhile: the gradient is stale by
exactly that), x_i ← x_i − η d_i. An *active* peer then averages atomically with ONE neighbour j
(pairwise and symmetric: both become (x_i + x_j)/2, so Σ x is unchanged).

Deadlock avoidance (the paper's choice): the graph is bipartite, split into active and passive
peers; only active peers initiate an averaging, a passive peer only answers. Two peers never
wait on each other's request. Here the active peers are the odd ranks and the passive peers the
even ranks (`is_active`): ``bipartite-exponential`` pairs each odd i with an even i + h, and a
ring of even n is bipartite the same way. The partner of active i at its local step k is one of
its passive neighbours in round k of the run's topology (`partner`): the only one when round k is
a matching — then, with equal speeds and no delay, the run is exactly D-SGD on those matchings
(`ADPSGD.step` is that synchronous reference) — else they take turns (k mod the count).

With a one-way delay δ the averaging is split so that the mean is still preserved (what a real
peer does, `absorb_reply`): the active peer sends x_i^s (its model when the step ended); at
arrival the passive peer sets x_j ← (x_j + x_i^s)/2 and answers with its old x_j; at the reply's
arrival the active peer adds ½ (x_j^old − x_i^s), keeping the local steps it took meanwhile.
The two changes cancel: Σ x is preserved (to float rounding: the two halves are rounded
separately).
"""

from __future__ import annotations

import numpy as np
import torch

from concord.core.algorithms.base import Algorithm, register_algorithm
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.dsgd import DSGD


def is_active(rank: int) -> bool:
    """Whether peer ``rank`` initiates averagings (odd ranks; even ranks are passive)."""
    return rank % 2 == 1


def partner(W: np.ndarray, rank: int, step: int) -> int | None:
    """The neighbour active peer ``rank`` averages with at its local step ``step``, from round
    ``step``'s mixing matrix ``W``: one of its passive neighbours in turn (None: it has none this
    round). ValueError if a neighbour is active (the graph is not split odd/even)."""
    row = np.nonzero(W[rank])[0]
    neighbours = [int(j) for j in row if j != rank]
    wrong = [j for j in neighbours if is_active(j) == is_active(rank)]
    if wrong:
        raise ValueError(
            f"ad-psgd: peers {rank} and {wrong[0]} are neighbours but both "
            f"{'active (odd)' if is_active(rank) else 'passive (even)'}; AD-PSGD needs a "
            "bipartite topology with odd peers on one side (e.g. bipartite-exponential, or a "
            "ring of even n)"
        )
    if not neighbours:
        return None
    return neighbours[step % len(neighbours)]


def pairwise_average(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(a + b)/2: what both peers of an atomic averaging set their model to. The sum of the two
    results equals a + b up to one rounding of (a + b)/2 (halving is exact in binary floats)."""
    return (a + b).mul_(0.5)


def absorb_reply(x: torch.Tensor, sent: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """The active side of a delayed averaging, in place: x ← x + ½ (answer − sent), where
    ``sent`` is the model it sent and ``answer`` the passive peer's model before averaging."""
    return x.add_(answer.sub(sent), alpha=0.5)


@register_algorithm
class ADPSGD(DSGD):
    """The synchronous form of AD-PSGD (equal speeds, no delay): D-SGD, one gossip round per step
    on the run's topology. The asynchronous run is simulated by `concord.sim.asynchronous`,
    which uses this class's local optimizer (momentum) state and the rules above."""

    spec = CATALOG["ad-psgd"]
    start = Algorithm.start  # no overlap: an asynchronous step has no exchange to start early
