"""CHOCO-SGD: decentralized SGD with compressed gossip and error feedback (Koloskova, Stich &
Jaggi, ICML 2019; "Decentralized Deep Learning with Arbitrary Communication Compression",
ICLR 2020). ALGORITHMS.md §3.7.

Every replica keeps a public copy x̂_i, known to its neighbours, and s_i = Σ_j w_ij x̂_j. Per step:

    x_i ← x_i − η d_i                      local optimizer step (local Nesterov momentum)
    q_i = x_i − x̂_i                        the change since the last published copy
    exchange Q(q_i); x̂_i ← x̂_i + Q(q_i);  s_i ← s_i + Σ_j w_ij Q(q_j)
    x_i ← x_i + γ (s_i − x̂_i)              consensus step of size γ

Order: compress-then-correct (the order of `epfml/powergossip`'s ChocoGossip), so the correction
uses the public copies this step's messages just updated. Every replica starts with x̂ = s = 0.
With Q = identity and γ = 1 this is exactly D-SGD (tested). One compressed exchange per step:
consensus-control rounds do not apply (a controlled phase runs one exchange). An exact-averaging
phase averages x and resets x̂ = s = x, which keeps all public copies consistent.

Hyperparameters: γ ∈ (0, 1] (smaller for more aggressive compression: sign ≈ 0.45, top-1 % ≈
0.04 in the CHOCO papers); the codec (`core.compress`). W must be static (the s_i bookkeeping
assumes the same neighbours every step); the config rejects time-varying topologies.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from core.algorithms.base import ALGORITHMS, Algorithm, StepContext, StepReport
from core.algorithms.optim import LocalSGD
from core.comm import Comm
from core.compress import Codec, make_codec


@ALGORITHMS.register("choco")
class Choco(Algorithm):
    name: ClassVar[str] = "choco"

    def __init__(
        self, optimizer: LocalSGD, *, codec: Codec | None = None, gamma: float = 1.0
    ) -> None:
        if not 0 < gamma <= 1:
            raise ValueError(f"CHOCO consensus step gamma must be in (0, 1]; got {gamma}")
        self.optimizer = optimizer
        self.codec = codec or make_codec("none")
        self.gamma = gamma
        self.public: torch.Tensor | None = None  # x̂ [k, d]
        self.mixed: torch.Tensor | None = None  # s  [k, d]

    def setup(self, x: torch.Tensor, comm: Comm) -> None:
        # x̂⁰ = s⁰ = 0 as in the CHOCO paper: consistent on every replica without a first
        # exchange, whatever the initial models (the first message carries Q(x))
        self.public = torch.zeros_like(x)
        self.mixed = torch.zeros_like(x)

    def step(self, x: torch.Tensor, grad: torch.Tensor, ctx: StepContext) -> StepReport:
        if self.public is None or self.mixed is None:
            self.setup(x, ctx.comm)
        assert self.public is not None  # set by setup
        assert self.mixed is not None
        self.optimizer.step(x, grad, ctx.lr)
        if ctx.phase.mode == "exact":
            x.copy_(ctx.comm.allreduce_mean(x, step=ctx.step))
            self.public.copy_(x)
            self.mixed.copy_(x)
            return StepReport(exact_average=True)
        index = ctx.round_offset
        before = x.clone()
        result = ctx.comm.mix(
            x - self.public, ctx.matrix(index), codec=self.codec, step=ctx.step, round=index
        )
        sent = result.sent if result.sent is not None else x - self.public
        self.public.add_(sent)
        self.mixed.add_(result.x)
        x.add_(self.mixed - self.public, alpha=self.gamma)
        theta_local = (x - before).double().pow(2).sum(dim=1)
        return StepReport(
            rounds=1, theta_local=theta_local, statistics=[theta_local], outcomes=[result.outcome]
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = dict(self.optimizer.state_dict())
        if self.public is not None and self.mixed is not None:
            state.update(public=self.public, mixed=self.mixed)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(state)
        self.public = state["public"].clone() if "public" in state else None
        self.mixed = state["mixed"].clone() if "mixed" in state else None
