"""Test doubles shared by the algorithm tests: the real vectorized Comm, recording its calls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from concord.core.comm import Edge, MixResult
from concord.core.compress import Codec
from concord.sim.vectorized import VectorizedComm


class SpyComm(VectorizedComm):
    """The vectorized Comm, recording every call as (kind, step, round); all-reduce has no
    round (-1)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.calls: list[tuple[str, int, int]] = []

    @property
    def steps(self) -> list[tuple[str, int]]:
        """The calls as (kind, step)."""
        return [(kind, step) for kind, step, _ in self.calls]

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
        self.calls.append(("mix", step, round))
        return super().mix(x, W, codec=codec, step=step, round=round, push=push)

    def allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        self.calls.append(("allreduce", step, -1))
        return super().allreduce_mean(x, step=step)

    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        incoming: Sequence[Edge],
        *,
        step: int = 0,
        round: int = 0,
    ) -> dict[Edge, torch.Tensor]:
        self.calls.append(("exchange", step, round))
        return super().exchange(outgoing, incoming, step=step, round=round)
