"""Overlap of communication with computation: the combine-then-adapt step (``overlap = true``;
docs/algorithms.md#overlap).

D-PSGD as Lian et al. (NeurIPS 2017, Algorithm 1) state it gossips the model the gradient is
taken at and applies the local update after the mix:

    x_i^{t+1} = Σ_j w_ij x_j^t − η · u_i^t,     u_i^t = the local optimizer's direction at x_i^t

What replica i sends at step t, x_i^t, does not depend on step t's gradient, so the exchange
starts before the gradient is computed (`start_exchange`, from `Algorithm.start`) and ends after
it (`finish_exchange`, from `Algorithm.step`): in a peer the round runs on the event loop while
the training thread computes forward and backward; in the vectorized engine it has completed
when it is started. The direction u_i^t is computed from x_i^t before the mix lands (its weight
decay term is λ x_i^t), and ``x`` stays x^t until then.

Consensus control (barrier and lagged) applies unchanged: the first round is the overlapped
one, θ_i = ‖Σ_j w_ij x_j^t − x_i^t‖² (the statistic of x^t), and the controller is asked after
the local update; each repeat round then mixes the updated model x^{t+1} as a step without
overlap does, its θ_i = ‖x_i(after) − x_i(before)‖². An exact-averaging phase averages x^t
likewise, x_i^{t+1} = (1/n) Σ_j x_j^t − η u_i^t (the rows differ by their own update after it).

Shapes: ``x`` and the direction are [k, d] (rows = local replicas). Invariant: with W doubly
stochastic the mean moves by the mean update only, x̄^{t+1} = x̄^t − η ū^t, as without overlap.
"""

from __future__ import annotations

import torch

from concord.core.algorithms.base import (
    InFlight,
    StepContext,
    StepReport,
    assign_mixed,
    gossip_rounds,
    sent_rows,
)


def start_exchange(x: torch.Tensor, ctx: StepContext, *, exact: bool) -> None:
    """Start the exchange of ``x`` (x^t, left unchanged until `finish_exchange`) into
    ``ctx.inflight``: the exact average when ``exact``, else gossip round ``ctx.round_offset``
    with the phase's matrix and ``ctx.codec``."""
    if exact:
        ctx.inflight = InFlight(average=ctx.comm.start_allreduce_mean(x, step=ctx.step))
        return
    index = ctx.round_offset
    handle = ctx.comm.start_mix(x, ctx.matrix(index), codec=ctx.codec, step=ctx.step, round=index)
    ctx.inflight = InFlight(mix=handle, round=index)


def finish_exchange(x: torch.Tensor, direction: torch.Tensor, ctx: StepContext) -> StepReport:
    """``x ← C x^t − ctx.lr · direction`` with C the exchange `start_exchange` started (gossip
    keeps the own cast remainder, as `concord.core.algorithms.base.gossip_rounds`), then the
    repeat rounds ``ctx.control`` asks for (module docstring); returns what happened."""
    inflight = ctx.inflight
    if inflight is None:
        raise RuntimeError("finish_exchange without an exchange started (start_exchange)")
    ctx.inflight = None
    if inflight.average is not None:
        x.copy_(inflight.average.wait())
        x.sub_(direction, alpha=ctx.lr)
        return StepReport(exact_average=True)
    if inflight.mix is None:
        raise RuntimeError("an InFlight holds neither a mix nor an average")
    result = inflight.mix.wait()
    mixed = result.x
    if ctx.codec is not None:  # keep the own remainder x_i − Q(x_i)
        mixed = mixed + (x - sent_rows(result, x, ctx.codec, ctx.comm, inflight.round))
    theta_local = assign_mixed(x, mixed)
    ctx.comm.release(result)
    x.sub_(direction, alpha=ctx.lr)
    report = StepReport(
        rounds=1, theta_local=theta_local, statistics=[theta_local], outcomes=[result.outcome]
    )
    if ctx.control.after_round(1, x, theta_local):
        gossip_rounds(x, ctx, report)
    return report


def direction_buffer(buffer: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """A [k, d] buffer for the step's direction that lives across steps (``buffer`` when it
    fits ``x``, else a new one): no fresh parameter-sized tensor per step."""
    if buffer is None or buffer.shape != x.shape or buffer.dtype != x.dtype:
        return torch.empty_like(x)
    return buffer
