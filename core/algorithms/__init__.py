"""Decentralized training algorithms, each written once for both engines (see `base`)."""

from __future__ import annotations

from typing import Any

from core.algorithms import allreduce, choco, dsgd  # noqa: F401  (register)
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


def make_algorithm(name: str, optimizer: LocalSGD, **hyper: Any) -> Algorithm:
    """Instantiate a registered algorithm by its config name with its hyperparameters."""
    return ALGORITHMS.get(name)(optimizer, **hyper)  # type: ignore[call-arg]


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
