"""`simulate`: one run of a config on this host, in either engine, returning its summary.

The vectorized engine trains all n replicas batched in this process (`concord.sim.engine`); the
processes engine starts an orchestrator and n peer processes on loopback
(`concord.sim.processes`). Both write the same kind of run directory and return the same summary
keys (``accuracy_avg_model``, ``accuracy_worst_peer``, ``gossip_rounds_total``,
``bytes_sent_total``, ``wall_seconds``, ``run_dir`` …).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from concord.core.config import RunConfig, apply_overrides, load_config, parse_overrides
from concord.core.records import JSON
from concord.runtime.rundir import default_run_dir

__all__ = ["simulate"]

Engine = Literal["vectorized", "processes"]


def simulate(
    config: RunConfig | str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | Sequence[str] = (),
    engine: Engine | None = None,
    out: str | Path | None = None,
    progress: bool = False,
    broker: str | None = None,
) -> dict[str, JSON]:
    """Run ``config`` and return its summary (`concord.core.records.RunSummary` as its JSON
    document, also written to ``<run dir>/summary.json``; docs/records.md lists the fields).

    ``config``: a `RunConfig`, a TOML file, or None for the defaults. ``overrides``: dotted keys,
    as a mapping (``{"peers": 16}``) or as ``--set`` strings (``["peers=16"]``), applied on top.
    ``engine``: overrides the config's ``engine``. ``out``: the run directory (default
    ``runs/<timestamp>-<label>``). ``broker``: the processes engine's MQTT broker (default: the
    config's ``orchestrator.broker``, else an embedded one). Raises `concord.ConfigError` for an
    invalid config, before anything runs. ``CONCORD_*`` environment variables are not read here
    (the command line reads them): what a notebook runs is what its code says.
    """
    extra = dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    cfg = config if isinstance(config, RunConfig) else load_config(config, environ={})
    if extra:
        cfg = apply_overrides(cfg, extra)
    if engine is not None and engine != cfg.engine:
        cfg = apply_overrides(cfg, {"engine": engine})
    run_dir = Path(out) if out is not None else default_run_dir(cfg)
    if cfg.engine == "processes":
        from concord.sim.processes import run_processes

        return run_processes(cfg, run_dir, progress=progress, broker=broker)
    from concord.sim.engine import run

    return run(cfg, run_dir, progress=progress)
