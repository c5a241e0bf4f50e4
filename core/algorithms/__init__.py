"""Decentralized training algorithms, each written once for both engines (see `base`).

What each algorithm is (traits, hyperparameters, citation) is declared torch-free in `catalog`;
this package loads lazily, so that ``import concord.core.algorithms.catalog`` (the config
validator, the orchestrator) does not import torch. The torch-bound names below are imported on
first access; ``ALGORITHMS`` is complete then (every implementation of the catalog registered).
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any

from concord.core.algorithms.catalog import CATALOG, AlgorithmSpec, plugin_spec
from concord.core.plugins import PluginError, is_spec, resolve

if TYPE_CHECKING:
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
    from concord.core.registry import Registry

# exported name → submodule defining it
_LAZY = {
    "ALGORITHMS": "base",
    "Algorithm": "base",
    "RoundControl": "base",
    "SingleRound": "base",
    "StepContext": "base",
    "StepReport": "base",
    "communicate": "base",
    "gossip_rounds": "base",
    "sent_rows": "base",
    "LocalSGD": "optim",
    "SGDConfig": "optim",
}
# submodules that `from concord.core.algorithms import <module>` reached before loading was lazy
_SUBMODULES = frozenset(
    {
        "ad_psgd",
        "ada",
        "allreduce",
        "async_sgp",
        "base",
        "bipartite",
        "buffers",
        "choco",
        "correction",
        "d2",
        "detag",
        "dsgd",
        "exact_diffusion",
        "gradient_tracking",
        "local_sgd",
        "optim",
        "overlap",
        "qgm",
        "relay",
        "relaysgd",
        "sgp",
    }
)


def load_all() -> None:
    """Import every implementation of the catalog (registering it in ``ALGORITHMS``)."""
    for spec in CATALOG.values():
        spec.load()


def _registry() -> Registry[type[Algorithm]]:
    from concord.core.algorithms.base import ALGORITHMS as REGISTRY

    return REGISTRY


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        if name == "ALGORITHMS":
            load_all()
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def make_algorithm(name: str, optimizer: LocalSGD, **hyper: Any) -> Algorithm:
    """Instantiate an algorithm by its config name — a catalog name or a user's
    ``"module:Class"`` — with its hyperparameters (keyword arguments of its constructor, e.g.
    ``choco``: ``codec``, ``gamma``)."""
    if name in CATALOG or not is_spec(name):
        load_all()
        cls = _registry().get(name)
    else:  # a user's "module:Class" (concord.core.plugins)
        cls = resolve(plugin_spec(name).implementation, "algorithm")
        from concord.core.algorithms.base import Algorithm

        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise PluginError(f"algorithm {name!r}: {cls!r} is not an Algorithm subclass")
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
    "CATALOG",
    "Algorithm",
    "AlgorithmSpec",
    "LocalSGD",
    "RoundControl",
    "SGDConfig",
    "SingleRound",
    "StepContext",
    "StepReport",
    "communicate",
    "gossip_rounds",
    "load_all",
    "make_algorithm",
    "sent_rows",
]
