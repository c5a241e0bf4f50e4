"""Asynchronous SGP — push-sum gossip without a barrier (Assran, Loizou, Ballas & Rabbat, ICML
2019, the overlap / τ-bounded variant of Stochastic Gradient Push).
docs/algorithms.md#asynchronous-sgp.

State per peer i: the push-sum weight w_i (float64, w⁰ = 1) and the model z_i; its numerator is
x_i = w_i z_i. When peer i's local step k ends (its gradient taken at z_i when the step began):

    x_i ← w_i z_i − η d_i
    for every out-neighbour j of column i of P^k:  send (p_ji x_i, p_ji w_i)     (`push_split`)
    x_i ← p_ii x_i;  w_i ← p_ii w_i
    x_i += Σ arrived x-shares;  w_i += Σ arrived w-shares;  z_i = x_i / w_i       (`absorb`)

"Arrived" is whatever has reached i by then for rounds ≤ k: it never waits, unless the staleness
of the oldest neighbour information it has not mixed would exceed τ (``async.max_staleness``). A
message sent for round m (the sender's local step m) has staleness k − m when mixed at the
receiver's step k; so at the end of step k peer i waits until every message addressed to it for
rounds ≤ k − τ has arrived (`due_rounds`); round 0 is always due at the end of step 0 (every peer
starts with its in-neighbours). τ = 0 is a barrier: synchronous ``sgp`` on the same matrices.

A message of a round m > k (from an in-neighbour ahead of i) is *held* until the end of i's step
m, when i's own share of round m leaves (`mixable`; staleness 0), except at i's last step, which
mixes everything. Mixing it earlier would let a behind peer absorb several rounds of income at
once and then, catching up, push out a fraction 1 − p_ii of its weight at each of the following
steps with nothing left to mix: w falls as p_ii^L and its gradient steps on z = x / w grow as
η / w. Held, a peer's weight income matches its outgo round by round.

Column stochasticity keeps Σ_i x_i + (x in flight) and Σ_i w_i + (w in flight) = n constant,
whatever the peers' rates: at every quiescent point (no message in flight) Σ w_i = n, and the
de-biased z_i still average to the right value under unequal rates.
"""

from __future__ import annotations

import numpy as np
import torch

from concord.core.algorithms.base import register_algorithm
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.sgp import SGP


def push_split(
    numerators: torch.Tensor,
    weights: np.ndarray,
    P: np.ndarray,
    senders: list[int],
    min_weight: float = 0.0,
) -> tuple[torch.Tensor, np.ndarray, list[tuple[int, int, float]]]:
    """Split the numerators ``[m, d]`` and weights ``[m]`` of peers ``senders`` by the columns of
    the column-stochastic ``P``: returns what each keeps (p_ii x_i, p_ii w_i) and the messages
    ``(row in numerators, destination j, p_ji)``; the x-share of a message is p_ji · numerators[row]
    and its w-share p_ji · weights[row].

    A sender whose weight is below ``min_weight`` (``async.min_weight``) keeps everything this
    round — its column is e_i, still stochastic, so Σ x and Σ w are unchanged — and its messages
    carry p = 0: empty shares that only complete the round. Its weight then never falls below
    ``min_weight`` × min p_ii, which bounds its gradient steps on z = x / w by η / that."""
    hold = weights < min_weight
    keep = np.array(
        [1.0 if h else P[i, i] for i, h in zip(senders, hold, strict=True)], dtype=np.float64
    )
    factors = torch.from_numpy(keep).to(device=numerators.device, dtype=numerators.dtype)
    kept = numerators * factors.unsqueeze(1)
    messages = [
        (row, int(j), 0.0 if hold[row] else float(P[j, i]))
        for row, i in enumerate(senders)
        for j in np.nonzero(P[:, i])[0]
        if j != i
    ]
    return kept, weights * keep, messages


def absorb(
    kept: torch.Tensor, kept_weight: float, shares: list[torch.Tensor], weights: list[float]
) -> tuple[torch.Tensor, float]:
    """One peer's mix: its kept numerator plus the arrived x-shares (in the order given) and its
    kept weight plus their w-shares; returns (numerator, weight), z = numerator / weight."""
    x = kept.clone()
    w = kept_weight
    for s, ws in zip(shares, weights, strict=True):
        x.add_(s)
        w += ws
    return x, w


def due_rounds(step: int, max_staleness: int) -> int:
    """Rounds m ≤ this (negative: none) must be mixed when a peer's step ``step`` ends, so that
    no mixed message is older than ``max_staleness`` steps.

    Round 0 is due at the end of step 0 whatever τ (a start-up barrier): a peer that started
    before its in-neighbours would otherwise push away half its weight at each of its first τ
    steps while receiving nothing, and its gradient steps on z = x / w grow as η / w = η 2^k."""
    return 0 if step == 0 else step - max_staleness


def mixable(round_: int, step: int, final: bool) -> bool:
    """Is a message of round ``round_`` mixed at the end of the receiver's step ``step``? Rounds
    ≤ ``step``; a later round is held until the receiver's own step of that round ends (module
    docstring), unless this is its ``final`` step, which mixes everything it holds."""
    return final or round_ <= step


@register_algorithm
class AsyncSGP(SGP):
    """The synchronous form of asynchronous SGP (equal speeds, no delay, or τ = 0): ``sgp``. The
    asynchronous run is simulated by `concord.sim.asynchronous`, which keeps the push-sum
    weights and momentum in this object (checkpoints hold them)."""

    spec = CATALOG["async-sgp"]
