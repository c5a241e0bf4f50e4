"""CHOCO-SGD: decentralized SGD with compressed gossip and error feedback (Koloskova, Stich &
Jaggi, ICML 2019 "Decentralized Stochastic Optimization and Gossip Algorithms with Compressed
Communication"; Koloskova, Lin, Stich & Jaggi, ICLR 2020 "Decentralized Deep Learning with
Arbitrary Communication Compression"). docs/algorithms.md#choco-sgd.

State per local replica i (tensors [k, d], rows = local replicas):

* x̂_i — the public copy of x_i, known identically to i and its neighbours; x̂⁰ = x⁰;
* s_i = Σ_j w_ij x̂_j — the mix of the public copies of i's neighbourhood (itself included);
  s⁰ = x⁰ (every replica starts from the common x⁰, so Σ_j w_ij x⁰ = x⁰).

Per step, with Q the codec's encode→decode (`concord.core.compress`):

    x_i ← x_i − η d_i                      local optimizer step (local momentum, weight decay)
    q_i = x_i − x̂_i                        what changed since the last published copy
    send Q(q_i); receive Q(q_j)             one exchange: comm.mix(q, W) = Σ_j w_ij Q(q_j)
    x̂_i ← x̂_i + Q(q_i);  s_i ← s_i + Σ_j w_ij Q(q_j)
    x_i ← x_i + γ (s_i − x̂_i)              consensus step of size γ

Order. There are two (docs/algorithms.md#choco-sgd): the official ChocoSGD code first corrects x
with the old public copies, then compresses; `epfml/powergossip`'s ChocoGossip (used here)
compresses first, so the correction already sees this step's messages. With Q = identity and γ = 1
the order used here is *exactly* Concord's D-SGD, "local step, then gossip" (x ← s = Σ_j w_ij
x_j^{t+½}; tested to float64 round-off), which is the form the phase plan, the θ statistic and
consensus control are defined on; the official order reduces to the other D-PSGD form x ← W x − η g,
whose gossip acts on the iterate before the step.

Invariants: W symmetric and doubly stochastic and *static* (s_i assumes the same neighbours every
step — the config rejects time-varying topologies); every message arrives (a lost Q(q_j) leaves
x̂_j stale at that neighbour for the rest of the run, or until an exact-averaging phase resets
it; a peer reports the loss in the round's outcome). The consensus step preserves the mean x̄
up to float round-off, since s = W x̂ keeps Σ_i (s_i − x̂_i) = 0.

Consensus control: CHOCO runs exactly one compressed exchange per step; extra gossip rounds do
not apply (the per-step compressed exchange *is* the consensus mechanism and γ its step size).
In a controlled phase the step's statistic θ_i = ‖γ (s_i − x̂_i)‖² is still reported to the
controller once (so its bookkeeping and metrics stay consistent) and a "repeat" answer is
ignored. An exact-averaging phase of the plan averages x and resets x̂ = s = x̄ on every replica,
which keeps all public copies consistent across the switch.

Hyperparameters: γ ∈ (0, 1], ``compression.gamma`` — smaller for more aggressive compression
(reported: sign 0.45–0.5 and qsgd 0.4 on ResNet-20/ring-8; top-1 % 0.04, random-1 % 0.01 on
convex problems; measured on average consensus over a ring of 16, d = 1000:
top-1 % needs γ ≤ 0.05 — 0.1 drifts, 1 diverges — sign does best near 0.2, qsgd 4-bit contracts
by 0.982 per round at the reported 0.34); the codec (``compression.codec``/``ratio``/``levels``,
any of `concord.core.compress.CODEC_NAMES`); the local optimizer (`LocalSGD`).
"""

from __future__ import annotations

import math

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
from concord.core.algorithms.optim import LocalSGD
from concord.core.comm import Comm
from concord.core.compress import Codec, make_codec


@register_algorithm
class Choco(Algorithm):
    spec = CATALOG["choco"]

    def __init__(
        self, optimizer: LocalSGD, *, codec: Codec | None = None, gamma: float = 1.0
    ) -> None:
        if isinstance(gamma, bool) or not isinstance(gamma, int | float):
            raise ValueError(f"CHOCO consensus step gamma must be a number; got {gamma!r}")
        if not (math.isfinite(gamma) and 0 < gamma <= 1):
            raise ValueError(
                f"CHOCO consensus step gamma (compression.gamma) must be in (0, 1]; got {gamma}"
            )
        self.optimizer = optimizer
        self.codec = codec if codec is not None else make_codec("none")
        self.gamma = float(gamma)
        self._wire: Codec | None = None if self.codec.name == "none" else self.codec
        self.public: torch.Tensor | None = None  # x̂ [k, d]
        self.mixed: torch.Tensor | None = None  # s  [k, d]

    def setup(self, x: torch.Tensor, comm: Comm) -> None:
        """x̂ = s = x⁰; ``x`` must hold the common initial model in every row."""
        if x.shape[0] > 1 and not torch.equal(x, x[:1].expand_as(x)):
            gap = float((x - x[:1]).abs().max())
            raise ValueError(
                "choco: the local replicas must start from the common initial model x⁰ "
                f"(public copies x̂ = s = x⁰); rows differ by up to {gap:.3g}"
            )
        self.public = x.detach().clone()
        self.mixed = x.detach().clone()

    def _state(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.public is None or self.mixed is None:
            raise RuntimeError("choco: call setup(x⁰, comm) (or load_state_dict) before step")
        return self.public, self.mixed

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        public, mixed = self._state()
        self.optimizer.step(x, grad, ctx.lr)
        if ctx.phase.mode == "exact":
            x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
            public.copy_(x)
            mixed.copy_(x)
            return StepReport(exact_average=True)
        index = ctx.round_offset
        q = x - public
        result = ctx.comm.mix(q, ctx.matrix(index), codec=self._wire, step=ctx.step, round=index)
        public.add_(sent_rows(result, q, self._wire, ctx.comm, index))
        mixed.add_(result.x)
        correction = (mixed - public).mul_(self.gamma)
        x.add_(correction)
        theta_local = correction.double().pow(2).sum(dim=1)
        ctx.control.after_round(1, x, theta_local)  # reported once; no extra rounds (docstring)
        return StepReport(
            rounds=1, theta_local=theta_local, statistics=[theta_local], outcomes=[result.outcome]
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        return buffers_state(self.optimizer.state_dict(), public=self.public, mixed=self.mixed)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        public, mixed = restored_pair("choco", state, "public", "mixed")
        self.optimizer.load_state_dict(state)
        self.public, self.mixed = public, mixed
