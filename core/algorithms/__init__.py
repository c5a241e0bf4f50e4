"""Decentralized training algorithms, each written once for both engines (see `base`)."""

from __future__ import annotations

import inspect
from typing import Any

from concord.core.algorithms import (  # noqa: F401  (register)
    ada,
    allreduce,
    choco,
    d2,
    detag,
    dsgd,
    exact_diffusion,
    gradient_tracking,
    local_sgd,
    qgm,
    relaysgd,
    sgp,
)
from concord.core.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    RoundControl,
    SingleRound,
    StepContext,
    StepReport,
    communicate,
    gossip_rounds,
    sent_rows,
)
from concord.core.algorithms.optim import LocalSGD, SGDConfig


def make_algorithm(name: str, optimizer: LocalSGD, **hyper: Any) -> Algorithm:
    """Instantiate a registered algorithm by its config name with its hyperparameters
    (keyword arguments of its constructor, e.g. ``choco``: ``codec``, ``gamma``)."""
    cls = ALGORITHMS.get(name)
    try:
        inspect.signature(cls).bind(optimizer, **hyper)
    except TypeError as exc:
        accepted = [p for p in inspect.signature(cls).parameters if p != "optimizer"]
        raise ValueError(
            f"algorithm {name!r}: hyperparameters {sorted(hyper)} do not fit ({exc}); "
            f"it accepts {accepted or 'none'}"
        ) from None
    return cls(optimizer, **hyper)  # type: ignore[call-arg]


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
    "sent_rows",
]
