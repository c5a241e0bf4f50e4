"""AD-PSGD — Asynchronous Decentralized Parallel SGD (Lian, Zhang, Zhang & Liu, ICML 2018),
with two deliberate deviations from the paper's Algorithm 1, stated below.
docs/algorithms.md#ad-psgd.

Every peer runs wait-free local steps. A step reads the model x_i at its start, computes the
stochastic gradient there, and when it ends applies the local optimizer's direction to the model
as it is *then* (averaging by neighbours may have moved it meanwhile: the gradient is stale by
exactly that), x_i ← x_i − η d_i. An *active* peer then averages atomically with ONE neighbour j
(pairwise and symmetric: both become (x_i + x_j)/2, so Σ x is unchanged).

Deviation 1, the update order. The paper's Algorithm 1 averages first and then applies the
gradient step to the averaged model only (x_i ← (x_i + x_j)/2, then x_i ← x_i − γ∇F(x̂_i); global
form X_{k+1} = X_k W_k − γ ∂g(X̂_k)): the partner's model never contains i's step. Here the
gradient step comes first and the averaging after it ("local step, then gossip", like D-SGD), so
half of every active peer's step goes to its partner: x_i, x_j ← (x_i − η d_i + x_j)/2. The
peer processes (`concord.peer.asynchronous`) use the same order, so both engines run this
variant; neither runs the paper's.

Deviation 2, the partner choice. The paper draws the partner uniformly at random among the
neighbours; here active i at its local step k takes its neighbours of round k of the run's
topology in turn (`concord.core.algorithms.bipartite.round_partner`: neighbour k mod d). On a
matching (bipartite-exponential) that is the only neighbour, and with equal speeds and no delay
the run is exactly D-SGD on those matchings (`ADPSGD.step` is that synchronous reference). On a
denser round the turns are not balanced: on a ring of even n (neighbours in rank order) the
active peers all take their lower neighbour at even steps (a perfect matching) but at odd steps
peer n − 1 takes n − 2 (its list [0, n − 2] wraps), as n − 3 does: peer n − 2 averages twice in
that step (one after the other) and peer 0 not at all.

Deadlock avoidance (the paper's choice): the graph is bipartite, split into active and passive
peers; only active peers initiate an averaging, a passive peer only answers. Two peers never
wait on each other's request. Here the active peers are the odd ranks and the passive peers the
even ranks (`is_active`): every edge of every round must join an odd and an even peer, and the
edges the round-robin choice uses over one period must connect the peers
(`concord.core.algorithms.bipartite.schedule_problems`, checked when the config is loaded;
`partner` checks each round's matrix again). The averaging is always ½ – ½: ``kappa`` and
``weights`` are refused for ad-psgd by the config.

With a one-way delay δ the averaging is split so that the mean is still preserved (what a real
peer does, `absorb_reply`): the active peer sends x_i^s (its model when the step ended); at
arrival the passive peer sets x_j ← (x_j + x_i^s)/2 and answers with its old x_j; at the reply's
arrival the active peer adds ½ (x_j^old − x_i^s), keeping the local steps it took meanwhile.
The two changes cancel: Σ x is preserved (to float rounding: the two halves are rounded
separately) once the reply has arrived.
"""

from __future__ import annotations

import numpy as np
import torch

from concord.core.algorithms.base import Algorithm, register_algorithm
from concord.core.algorithms.bipartite import (
    is_active,
    parity_problem,
    round_partner,
    same_parity_edge,
)
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.dsgd import DSGD

__all__ = ["ADPSGD", "absorb_reply", "is_active", "pairwise_average", "partner"]


def partner(W: np.ndarray, rank: int, step: int) -> int | None:
    """The neighbour active peer ``rank`` averages with at its local step ``step``, from round
    ``step``'s mixing matrix ``W``: one of its neighbours in turn (None: it has none this
    round). ValueError naming the pair if any edge of ``W`` joins two peers of the same parity
    (the graph is not split odd/even)."""
    edge = same_parity_edge(W)
    if edge is not None:
        raise ValueError(parity_problem(edge, f"ad-psgd round {step}"))
    return round_partner(W, rank, step)


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
