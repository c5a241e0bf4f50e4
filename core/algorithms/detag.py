"""DeTAG: gradient tracking with by-phase accelerated gossip (Lu & De Sa, "Optimal Complexity in
Decentralized Training", ICML 2021, Algorithm 2 with the accelerated gossip of Algorithm 3; the
momentum variant DeTAGM, Algorithm 4; the DeTAG* ordering of the extended JMLR 24(93), 2023
version). ``dsgt`` (DSGT / GT-DSGD, Pu & Nedić 2021; Zhang & You 2019) is its R = 1, η = 0 case.
docs/algorithms.md#detag-and-dsgt.

One Concord step is one DeTAG *phase* k: one stochastic gradient g_i at the current model x_i
(Algorithm 2's R mini-batches of B at the same point x_k are one mini-batch here: set
``optim.batch_size`` = R·B for the paper's oracle budget), then R gossip rounds. Per local
replica i, with α the step's learning rate and d_i the local optimizer's direction at x_i
(`LocalSGD.direction`: g_i + weight decay; the local momentum buffer, see DeTAGM below):

    order "detag" (Algorithm 2):
        (x, y) ← G_R(x − α y, y);   y ← y + d − d_prev
    order "detag*" (§6.5: the gradient first, then the rounds, on the *current* model):
        y ← y + d − d_prev;         (x, y) ← G_R(x − α y, y)
    then d_prev ← d.

G_R is R rounds of accelerated gossip (Algorithm 3, heavy-ball/Chebyshev momentum on the gossip)
applied to both vectors: z_{−1} = z_0, z_{r+1} = (1 + η) W z_r − η z_{r−1}. Algorithm 2 writes
the phase end as x_{k+1} = x̃_R − α y_R with x̃_0 = x_k; G_R is linear, so that is G_R(x_k − α y_k),
which is what travels here (the "local step, then gossip" form of D-SGD and gradient tracking).

Initialisation: y = d_prev = 0 before the first step, whose correction comes before the gossip
in both orders — the tracker starts from the first direction, y_0 = d_0 (as the public
public third-party implementation does; with y_0 = 0 Algorithm 2's first phase would not move x).
So the two orders agree on step 0.

DSGT: order "detag*" with R = 1, η = 0 is *exactly* the classical recursion
(docs/algorithms.md#gradient-tracking), y^t = W y^{t−1} + g^t − g^{t−1} (y^0 = g^0), x^{t+1} = W(x^t
− α y^t); with the local optimizer's direction for g and a constant α it is also exactly
`concord.core.algorithms.gradient_tracking` (its correction c = α(d − y)). The order "detag" with R
= 1, η = 0 is DSGT with a tracker one step older, x^{t+1} = W(x^t − α y^{t−1}) — the price of
overlapping the phase's gradient with its gossip. The registered name ``dsgt`` is this class with R
= 1, η = 0 and order "detag*" fixed.

DeTAGM (Algorithm 4): the tracker tracks the momentum buffer v ← β v + g instead of the
gradient; the buffer stays local. That is the direction tracked here with ``optim.momentum`` =
β > 0 and ``optim.nesterov = false``. With Nesterov (Concord's default) the tracked direction is
g + μ m — a Nesterov variant that is not in the paper; with momentum 0 it is DeTAG.

Hyperparameters (``[hyper]``):

* ``rounds`` R, an integer ≥ 1 (default 2, the paper's choice on label-sorted data, Table 3);
* ``eta`` η ∈ [0, 1), or ``"auto"``/omitted: η = (1 − √(1 − λ²)) / (1 + √(1 − λ²)) with
  λ = max(|λ₂|, |λₙ|) of the step's W (over each connected group of the live members, so a
  schedule repaired after a peer left keeps a meaningful λ); η = 0 gives plain gossip rounds.
  The paper tuned η ∈ {0, 0.1, 0.2, 0.4} (§6.6); the formula gives 0.25 on a ring of 8;
* ``order`` "detag" (default) or "detag*";
* the local optimizer's: lr α > 0 (the schedule), momentum μ ∈ [0, 1), weight decay ≥ 0.

Shapes: ``x``, ``grad``, the tracker y and d_prev are [k, d] (rows = local replicas).
Invariants: W symmetric and doubly stochastic ⇒ G_R preserves the mean of what it mixes
(mean z_{r+1} = (1 + η) mean z_r − η mean z_{r−1}), so after every step ȳ = mean_i d_prev,i —
the tracker's mean is the mean of the latest local directions (the mean gradient for plain SGD)
— and x̄ ← x̄ − α ȳ, the all-reduce SGD step with that mean direction (the current one in
"detag*", the previous step's in "detag").

Communication: per round, the model part through `Comm.mix` (the run's fp16/bf16 cast applies,
the own remainder kept as in `gossip_rounds`) and the tracker through `Comm.exchange` as raw
float32 per-edge messages, at the same (step, round) and W: two d-vectors per directed edge
and round, R rounds per step with the global round indices ctx.round_offset … + R − 1, and
``StepReport.rounds`` = R, so schedules, round counters and metrics stay consistent. (One
concatenated [x, y] message of 2d values per round would be a single `Comm.mix`, but a peer's
transport accepts only tensors of the model's dimension d — `concord.peer.validate.check_parts`; the
bytes are the same.) The acceleration's previous iterate z_{r−1} is local state of the step.

Topology: DeTAG assumes one fixed W; the config rejects time-varying topologies. Each phase of
the plan may use its own static topology (η is computed per matrix).

Exact phases: x ← mean(x − α y) by one all-reduce (y being the tracker the order uses), then the
tracker restarts from the local direction, y ← d, d_prev ← d — without communication, and the
invariant ȳ = mean d_prev still holds; gossip steps after the phase continue from there.

Consensus control does not apply: R is the algorithm's own number of rounds. The config leaves
the default control inert for ``detag``/``dsgt`` (as for all-reduce and local SGD) and rejects
an explicit ``control.mode``; a `RoundControl` in the context is not consulted. The θ_i of every
round of the model part (‖x_i after − x_i before‖²) is still reported for metrics.

Message loss: a missing model or tracker message is left out and the weights renormalised
(`Comm.mix`, `exchange_mix`); the mean invariants then hold only approximately.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

import numpy as np
import torch

from concord.core.algorithms.base import (
    Algorithm,
    StepContext,
    StepReport,
    register_algorithm,
    sent_rows,
)
from concord.core.algorithms.buffers import buffers_state, restored_pair
from concord.core.algorithms.catalog import CATALOG
from concord.core.algorithms.correction import check_state, exchange_mix
from concord.core.algorithms.optim import LocalSGD
from concord.core.control.consensus import local_theta
from concord.core.graphs.mixing import consensus_contraction

Order = Literal["detag", "detag*"]
ORDERS: tuple[str, ...] = ("detag", "detag*")


def accelerated_eta(lam: float) -> float:
    """η = (1 − √(1 − λ²)) / (1 + √(1 − λ²)) for λ ∈ [0, 1] (Algorithm 3): 0 for λ = 0 (exact
    averaging), → 1 as λ → 1."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"λ must be in [0, 1]; got {lam}")
    s = math.sqrt(max(0.0, 1.0 - lam * lam))
    return (1.0 - s) / (1.0 + s)


def group_contraction(W: np.ndarray) -> float:
    """λ = max(|λ₂|, |λₙ|) of the symmetric doubly-stochastic W, taken over each connected group
    of W's support (a peer that left has an identity row and is a group of its own; 0 if every
    group is a single node)."""
    A = np.asarray(W, dtype=np.float64)
    n = A.shape[0]
    seen = np.zeros(n, dtype=bool)
    lam = 0.0
    for start in range(n):
        if seen[start]:
            continue
        group, frontier = [start], [start]
        seen[start] = True
        while frontier:
            nxt = np.flatnonzero((A[frontier] != 0).any(axis=0) & ~seen)
            seen[nxt] = True
            frontier = nxt.tolist()
            group.extend(frontier)
        if len(group) > 1:
            idx = np.sort(np.asarray(group))
            lam = max(lam, consensus_contraction(A[np.ix_(idx, idx)]))
    return lam


def _check_rounds(rounds: Any) -> int:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(
            f"detag: hyper.rounds (phase length R) must be an integer ≥ 1; got {rounds!r}"
        )
    return rounds


def _check_eta(eta: Any) -> float | None:
    if eta is None or eta == "auto":
        return None
    if isinstance(eta, bool) or not isinstance(eta, int | float):
        raise ValueError(
            f"detag: hyper.eta (accelerated-gossip momentum) must be a number in [0, 1) or "
            f"'auto'; got {eta!r}"
        )
    if not (math.isfinite(eta) and 0 <= eta < 1):
        raise ValueError(f"detag: hyper.eta must be in [0, 1) (or 'auto': from λ); got {eta}")
    return float(eta)


def _check_order(order: Any) -> Order:
    if order not in ORDERS:
        raise ValueError(f"detag: hyper.order must be one of {list(ORDERS)}; got {order!r}")
    return cast(Order, order)


@register_algorithm
class DeTAG(Algorithm):
    spec = CATALOG["detag"]

    def __init__(
        self,
        optimizer: LocalSGD,
        *,
        rounds: int = 2,
        eta: float | str | None = None,
        order: str = "detag",
    ) -> None:
        self.optimizer = optimizer
        self.rounds = _check_rounds(rounds)
        self.eta = _check_eta(eta)  # None: from λ of the step's matrix
        self.order: Order = _check_order(order)
        self.tracker: torch.Tensor | None = None  # y [k, d]
        self.previous: torch.Tensor | None = None  # d_prev [k, d]
        self._eta_of: tuple[np.ndarray, float] | None = None  # (W, η) of the last matrix

    def gossip_eta(self, W: np.ndarray) -> float:
        """The accelerated-gossip η used with ``W``: the fixed value, or the formula of λ(W)
        (cached for the last matrix; recomputed when another one comes)."""
        if self.eta is not None:
            return self.eta
        cached = self._eta_of
        if cached is not None and (cached[0] is W or np.array_equal(cached[0], W)):
            return cached[1]
        eta = accelerated_eta(group_contraction(W))
        self._eta_of = (W, eta)
        return eta

    def _state(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(y, d_prev, first): zeros before the first step."""
        first = self.tracker is None
        self.tracker = check_state(self.name, self.tracker, x)
        self.previous = check_state(self.name, self.previous, x)
        return self.tracker, self.previous, first

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        y, previous, first = self._state(x)
        d = self.optimizer.direction(x, grad)
        correct_first = first or self.order == "detag*"
        if correct_first:
            y.add_(d).sub_(previous)
        half = x - ctx.lr * y
        if ctx.phase.mode == "exact":
            x.copy_(ctx.comm.allreduce_mean(half, step=ctx.step))
            y.copy_(d)
            previous.copy_(d)
            return StepReport(exact_average=True)
        report = self._accelerated_gossip(half, y, ctx)
        x.copy_(half)
        if not correct_first:
            y.add_(d).sub_(previous)
        previous.copy_(d)
        return report

    def _accelerated_gossip(
        self, model: torch.Tensor, tracker: torch.Tensor, ctx: StepContext
    ) -> StepReport:
        """R rounds of z_{r+1} = (1 + η) W z_r − η z_{r−1} (z_{−1} = z_0) on ``model`` and
        ``tracker``, in place."""
        report = StepReport()
        old_model: torch.Tensor | None = None
        old_tracker: torch.Tensor | None = None
        for r in range(self.rounds):
            index = ctx.round_offset + r
            W = ctx.matrix(index)
            eta = self.gossip_eta(W)
            result = ctx.comm.mix(model, W, codec=ctx.codec, step=ctx.step, round=index)
            mixed = result.x
            if ctx.codec is not None:  # keep the own remainder x_i − Q(x_i) (`base`)
                mixed = mixed + (model - sent_rows(result, model, ctx.codec, ctx.comm, index))
            tracked = exchange_mix(tracker, W, ctx.comm, step=ctx.step, round=index)
            if eta != 0:
                prev_m = model if old_model is None else old_model
                prev_t = tracker if old_tracker is None else old_tracker
                mixed = (1 + eta) * mixed - eta * prev_m
                tracked = (1 + eta) * tracked - eta * prev_t
                old_model, old_tracker = model.clone(), tracker.clone()
            theta_local = local_theta(model, mixed)
            model.copy_(mixed)
            tracker.copy_(tracked)
            report.add_round(theta_local, result.outcome)
        return report

    def state_dict(self) -> dict[str, torch.Tensor]:
        return buffers_state(
            self.optimizer.state_dict(), tracker=self.tracker, previous=self.previous
        )

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        tracker, previous = restored_pair(self.name, state, "tracker", "previous")
        self.optimizer.load_state_dict(state)
        self.tracker, self.previous = tracker, previous


@register_algorithm
class DSGT(DeTAG):
    """DSGT / GT-DSGD: `DeTAG` with R = 1, η = 0 and order "detag*" fixed (module docstring) —
    the classical gradient-tracking recursion with one gossip round."""

    spec = CATALOG["dsgt"]

    def __init__(self, optimizer: LocalSGD, **hyper: Any) -> None:
        if hyper:
            raise ValueError(
                f"algorithm 'dsgt' is DeTAG with rounds = 1, eta = 0, order = 'detag*' fixed; it "
                f"takes no hyperparameters (got {', '.join(f'hyper.{k}' for k in sorted(hyper))})"
                "; use algorithm = 'detag' to set them"
            )
        super().__init__(optimizer, rounds=1, eta=0.0, order="detag*")
