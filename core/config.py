"""Run configuration: one frozen, validated object built from defaults → TOML file → ``CONCORD_*``
environment → command-line ``--set key=value`` overrides.

Validation reports *every* problem at once, each with its dotted key, so a user fixes a config in
one go. The config is torch-free: the orchestrator validates the same config.

This module builds a config from those layers and writes it back as TOML; it is also where every
name of the config is imported from. The models live beside it: the sections of what is trained
(`concord.core.config_sections`), of where the processes talk (`concord.core.config_deploy`), and
`RunConfig` with its cross-section checks (`concord.core.config_run`). Names accepted there
(algorithms, datasets, models, partitions, topologies) are the public names of the registries in
`core`; ``tests/core/test_config.py`` checks both lists agree.
"""

from __future__ import annotations

import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ValidationError

from concord.core.config_deploy import (
    MetricsConfig,
    NetworkConfig,
    OrchestratorConfig,
    StragglerConfig,
    TLSConfig,
    TorchPlaneConfig,
)
from concord.core.config_run import RunConfig
from concord.core.config_sections import (
    ALGORITHM_NAMES,
    CODEC_NAMES,
    DATASET_NAMES,
    ENGINE_NAMES,
    MODEL_NAMES,
    PARTITION_NAMES,
    PLAN_PRESETS,
    TOPOLOGY_NAMES,
    CompressionConfig,
    ControlSection,
    DatasetConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    PartitionConfig,
)
from concord.core.suggest import closest
from concord.errors import ConfigError as ConfigError

__all__ = [
    "ALGORITHM_NAMES",
    "CODEC_NAMES",
    "DATASET_NAMES",
    "ENGINE_NAMES",
    "MODEL_NAMES",
    "PARTITION_NAMES",
    "PLAN_PRESETS",
    "TOPOLOGY_NAMES",
    "CompressionConfig",
    "ConfigError",
    "ControlSection",
    "DatasetConfig",
    "EvalConfig",
    "MetricsConfig",
    "ModelConfig",
    "NetworkConfig",
    "OptimConfig",
    "OrchestratorConfig",
    "PartitionConfig",
    "RunConfig",
    "StragglerConfig",
    "TLSConfig",
    "TorchPlaneConfig",
    "apply_overrides",
    "build_config",
    "env_overrides",
    "load_config",
    "parse_overrides",
    "parse_value",
    "reference_config",
    "run_identity",
    "to_toml",
]


# ---------------------------------------------------------------------------------------------
# Building a config from layers


def parse_value(text: str) -> Any:
    """Parse an override value as a TOML literal (``0.5``, ``true``, ``[1, 2]``, ``"x"``), else
    take it as a bare string (``ring``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            problems.append(
                (item, "an override must look like key=value (e.g. control.factor=0.5)")
            )
            continue
        out[key] = parse_value(value.strip())
    if problems:
        raise ConfigError(problems, "--set")
    return out


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``CONCORD_PEERS=16`` → {"peers": 16}; ``CONCORD_CONTROL__FACTOR=0.5`` → {"control.factor":
    0.5}.

    Only the variables naming a config key are taken (others, like CONCORD_CACHE, are not config).
    """
    environ = os.environ if environ is None else environ
    fields = set(RunConfig.model_fields)
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith("CONCORD_"):
            continue
        key = name.removeprefix("CONCORD_").lower().replace("__", ".")
        if key.split(".")[0] in fields:
            out[key] = parse_value(value)
    return out


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if isinstance(child, str) and part in ("dataset", "model"):
            child = {"name": child}
        elif isinstance(child, str) and part == "partition":
            child = {"scheme": child}
        elif not isinstance(child, dict):
            child = {}
        node[part] = child = dict(child)
        node = child
    node[parts[-1]] = value


def build_config(
    data: Mapping[str, Any], overrides: Mapping[str, Any] | None = None, source: str | None = None
) -> RunConfig:
    tree: dict[str, Any] = dict(data)
    for key, value in (overrides or {}).items():
        if isinstance(value, str) and value.lower() in ("none", "null") and _unsettable(key):
            value = None  # `--set optim.clip_norm=none`: back to unset
        _set_dotted(tree, key, value)
    try:
        return RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_problems(exc), source) from None


def _unsettable(key: str) -> bool:
    """Whether ``key`` names an optional field that takes no string (so "none" can only mean
    unset: ``optim.clip_norm``, not ``compression.codec`` whose value "none" is a codec)."""
    model: type[BaseModel] = RunConfig
    parts = key.split(".")
    for part in parts[:-1]:
        field = model.model_fields.get(part)
        ann = field.annotation if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return False
        model = ann
    field = model.model_fields.get(parts[-1])
    if field is None:
        return False
    args = typing.get_args(field.annotation)
    return type(None) in args and not any(a is str or typing.get_origin(a) is Literal for a in args)


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            parent = _section_fields(loc[:-1])
            close = closest(loc[-1], parent)
            hint = f"; did you mean {close!r}?" if close else ""
            msg = f"unknown key{hint} (valid here: {', '.join(parent)})"
        elif "input" in err and err["type"] not in ("value_error",):
            msg = f"{msg} (got {err['input']!r})"
        problems.append((".".join(loc), msg))
    return problems


def _section_fields(loc: Sequence[str]) -> list[str]:
    model: type[BaseModel] = RunConfig
    for part in loc:
        field = model.model_fields.get(part)
        ann = field.annotation if field else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return []
    return list(model.model_fields)


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
) -> RunConfig:
    """defaults → TOML file → ``CONCORD_*`` environment → ``--set`` overrides."""
    data: dict[str, Any] = {}
    source = None
    if path is not None:
        source = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError([("", f"config file {source!r} does not exist")], source)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([("", f"not valid TOML: {exc}")], source) from None
    merged = env_overrides(environ)
    merged.update(parse_overrides(overrides))
    return build_config(data, merged, source)


def apply_overrides(cfg: RunConfig, overrides: Mapping[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with dotted-key overrides applied and everything re-validated."""
    return build_config(cfg.explicit_dict(), overrides)


# what a reference run drops from the run it is compared with: the settings of the run's own
# algorithm (its hyperparameters, codec, overlap, consensus control, per-phase graphs), which the
# reference algorithm would refuse or read differently; data, model, optimiser, budget, seed,
# network and control plane stay
_ALGORITHM_KEYS = (
    "hyper",
    "compression",
    "overlap",
    "control",
    "phase_topologies",
    "plan",
    "async",
)


def reference_config(cfg: RunConfig, algorithm: str) -> RunConfig:
    """``cfg`` run by ``algorithm`` instead (e.g. the all-reduce reference of `concord sim`):
    the same data, model, optimiser, epochs, seed and deployment, with the run's own algorithm
    settings back at their defaults. ``cfg`` may set any of them explicitly — a run's own
    ``config.toml`` sets every key — and the reference still validates."""
    tree = {k: v for k, v in cfg.explicit_dict().items() if k not in _ALGORITHM_KEYS}
    name = f"{algorithm}-reference"
    return build_config(tree, {"algorithm": algorithm, "name": name})


def to_toml(cfg: RunConfig) -> str:
    """Serialise a resolved config to TOML (tables after scalars), readable by `load_config`."""
    return tomli_w.dumps(cfg.to_dict())


def run_identity(cfg: RunConfig) -> str:
    """`to_toml` of what makes two runs the same run: all of the config but where its broker
    is (a resumed run's embedded broker listens on a fresh port). Checkpoints carry it."""
    d = cfg.to_dict()
    d.get("orchestrator", {}).pop("broker", None)
    return tomli_w.dumps(d)
