"""Helpers of the correction-form algorithms (gradient tracking, D², exact diffusion).

They keep a per-replica correction [k, d] next to the local optimizer and take the optimizer's
*update* u = x(after its step) − x(before) rather than its step, as the RelaySGD code does
(docs/algorithms.md#gradient-tracking), so momentum and weight decay compose with the correction
unchanged. Everything here goes through the `concord.core.comm.Comm` interface only.
"""

from __future__ import annotations

import numpy as np
import torch

from concord.core.algorithms.base import StepContext, sent_rows
from concord.core.algorithms.optim import LocalSGD
from concord.core.comm import Comm, Edge, MixOutcome


def local_update(
    optimizer: LocalSGD, x: torch.Tensor, grad: torch.Tensor, lr: float
) -> torch.Tensor:
    """u = −η · direction ([k, d], a new tensor): the local optimizer's update, whose momentum
    buffer advances as in `LocalSGD.step`; ``x`` is not modified."""
    return optimizer.direction(x, grad).mul_(-lr)


def check_state(name: str, state: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The per-replica state of algorithm ``name`` for parameters ``x`` ([k, d]): zeros on first
    use (every correction starts at 0), else the state itself if its shape fits."""
    if state is None:
        return torch.zeros_like(x)
    if state.shape != x.shape:
        raise ValueError(
            f"{name}: state of shape {tuple(state.shape)} does not fit parameters "
            f"{tuple(x.shape)} (a checkpoint of another model or engine?)"
        )
    return state


def gossip_once(
    x: torch.Tensor, W: np.ndarray, ctx: StepContext
) -> tuple[torch.Tensor, MixOutcome]:
    """One gossip round Σ_j w_ij x_j with round index ``ctx.round_offset`` ([k, d], a new
    tensor). With a cast codec the own remainder x_i − Q(x_i) is kept, exactly as in
    `concord.core.algorithms.base.gossip_rounds`, so the mean is preserved."""
    index = ctx.round_offset
    result = ctx.comm.mix(x, W, codec=ctx.codec, step=ctx.step, round=index)
    mixed = result.x
    if ctx.codec is not None:
        mixed = mixed + (x - sent_rows(result, x, ctx.codec, ctx.comm, index))
    return mixed, result.outcome


def exchange_mix(
    m: torch.Tensor, W: np.ndarray, comm: Comm, *, step: int, round: int
) -> torch.Tensor:
    """Σ_j W[i, j] m_j for every local row i ([k, d], a new tensor), the rows travelling as
    per-edge messages (`Comm.exchange`, raw float32 in a peer) — for a second vector in the same
    gossip round as a `Comm.mix` of the model (a peer's mix carries one d-vector per round).
    The weights are renormalised over the messages that arrived, as `Comm.mix` does."""
    ranks = list(comm.ranks)
    outgoing: dict[Edge, torch.Tensor] = {}
    incoming: list[Edge] = []
    sources: list[list[int]] = []
    for row, i in enumerate(ranks):
        for j in np.flatnonzero(W[:, i]).tolist():
            if j != i:
                outgoing[(i, j)] = m[row]
        sources.append([j for j in np.flatnonzero(W[i]).tolist() if j != i])
        incoming.extend((j, i) for j in sources[-1])
    got = comm.exchange(outgoing, incoming, step=step, round=round)
    out = torch.empty_like(m)
    for row, i in enumerate(ranks):
        acc = m[row] * float(W[i, i])
        total = float(W[i, i])
        for j in sources[row]:
            value = got.get((j, i))
            if value is None:
                continue
            acc = acc + value.to(m.dtype) * float(W[i, j])
            total += float(W[i, j])
        out[row] = acc if abs(total - 1.0) <= 1e-12 else acc / total
    return out
