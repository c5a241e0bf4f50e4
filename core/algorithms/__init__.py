"""Decentralized training algorithms, each written once for both engines (see `base`)."""

from __future__ import annotations

from core.algorithms import allreduce, dsgd  # noqa: F401  (register)
from core.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    RoundControl,
    SingleRound,
    StepContext,
    StepReport,
    communicate,
    gossip_rounds,
)
from core.algorithms.optim import LocalSGD, SGDConfig


def make_algorithm(name: str, optimizer: LocalSGD) -> Algorithm:
    """Instantiate a registered algorithm by its config name."""
    return ALGORITHMS.get(name)(optimizer)  # type: ignore[call-arg]


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "LocalSGD",
    "RoundControl",
    "SGDConfig",
    "SingleRound",
    "StepContext",
    "StepReport",
    "communicate",
    "gossip_rounds",
    "make_algorithm",
]
