"""Concord: decentralized (gossip) training of PyTorch models with consensus control.

The public Python API (a tour with a runnable example: docs/api.md)::

    import concord

    cfg = concord.load_config(None, ["peers=8", "epochs=2"])
    summary = concord.simulate(cfg, engine="vectorized", out="runs/notebook")
    summary["accuracy_avg_model"], summary["gossip_rounds_total"]

* configuration: `RunConfig` (the validated, frozen model), `load_config` (defaults → TOML file →
  ``CONCORD_*`` environment → ``key=value`` overrides), `build_config`, `apply_overrides`;
* running: `simulate` — one run in either engine, returning its summary;
* what can be named in a config: `ALGORITHMS` (the algorithm catalog: name → `AlgorithmSpec`
  with its traits), `DATASETS` and `PARTITIONERS` (registries; ``register`` your own), `TOPOLOGIES`,
  `CODECS`, `MODELS`;
* errors: one hierarchy rooted in `ConcordError` (`concord.errors`).

Names load on first use: ``import concord`` itself imports neither torch nor the network stack,
so the orchestrator (which never imports torch) and short CLI commands stay light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from concord import errors as _errors
from concord.errors import *  # noqa: F403  (the hierarchy; errors.__all__ is re-exported)
from concord.version import __version__

if TYPE_CHECKING:
    from concord.core.algorithms.catalog import CATALOG as ALGORITHMS
    from concord.core.algorithms.catalog import AlgorithmSpec
    from concord.core.compress.base import CODECS
    from concord.core.config import RunConfig, apply_overrides, build_config, load_config
    from concord.core.data.datasets import DATASETS
    from concord.core.data.partition import PARTITIONERS
    from concord.core.graphs.topology import TOPOLOGIES
    from concord.core.models.zoo import MODELS
    from concord.sim.run import simulate

# public name -> (module, attribute), imported on first use
_LAZY: dict[str, tuple[str, str]] = {
    "ALGORITHMS": ("concord.core.algorithms.catalog", "CATALOG"),
    "AlgorithmSpec": ("concord.core.algorithms.catalog", "AlgorithmSpec"),
    "CODECS": ("concord.core.compress.base", "CODECS"),
    "DATASETS": ("concord.core.data.datasets", "DATASETS"),
    "MODELS": ("concord.core.models.zoo", "MODELS"),
    "PARTITIONERS": ("concord.core.data.partition", "PARTITIONERS"),
    "RunConfig": ("concord.core.config", "RunConfig"),
    "TOPOLOGIES": ("concord.core.graphs.topology", "TOPOLOGIES"),
    "apply_overrides": ("concord.core.config", "apply_overrides"),
    "build_config": ("concord.core.config", "build_config"),
    "load_config": ("concord.core.config", "load_config"),
    "simulate": ("concord.sim.run", "simulate"),
}

# the lazy names, the version and the exception hierarchy (kept in `concord.errors.__all__`)
__all__ = [
    "ALGORITHMS",
    "CODECS",
    "DATASETS",
    "MODELS",
    "PARTITIONERS",
    "TOPOLOGIES",
    "AlgorithmSpec",
    "RunConfig",
    "__version__",
    "apply_overrides",
    "build_config",
    "load_config",
    "simulate",
]
__all__ += _errors.__all__


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'concord' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
