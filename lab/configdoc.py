"""The configuration reference (``docs/configuration.md``), generated from `RunConfig`.

`render_markdown` walks `concord.core.config.RunConfig` and its section models and writes one
table per section: every key with its type, default, valid range and description. Types,
defaults and ranges come from the pydantic model itself; the prose comes from `DESCRIPTIONS`
(keyed by dotted key) and, for a key missing there, from the field's own ``description``, so the
reference cannot drift from the code: ``tests/lab/test_config_cmd.py`` checks that the committed
file equals the generated text and that every key has a description. ``concord config doc``
prints it. This module is torch-free.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from concord.core.config import (
    ALGORITHM_NAMES,
    CODEC_NAMES,
    DATASET_NAMES,
    MODEL_NAMES,
    PARTITION_NAMES,
    RunConfig,
)

__all__ = ["DESCRIPTIONS", "ConfigKey", "config_keys", "render_markdown"]


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{n}`" for n in names)


# Prose for every key, by dotted key (a key missing here falls back to the field's own
# ``description`` in `concord.core.config`). Units are stated in the text.
DESCRIPTIONS: dict[str, str] = {
    "name": "Run name: the control-plane run id (an MQTT topic level) and the label of the "
    "run directory. Unset: run id `concord` (static peers: `static`), directory label "
    "`<algorithm>-<topology>-n<peers>`.",
    "peers": "Number of peers n (replicas).",
    "topology": "Gossip graph: `complete`, `ring`, `chain`, `star`, `torus`, `hypercube`, "
    "`exponential`, `exponential:K`, `exponential-one-peer`, "
    "`exponential-one-peer-directed` (SGP only), `bipartite-exponential`, "
    "`random-matching`, `binary-tree`, `double-binary-tree`, or `file:PATH` (edge list). "
    "Unused by `ada-schedule`/`ada-feedback`, which choose their own graphs.",
    "weights": "Mixing-weight rule: `metropolis`, `uniform` (regular graphs only) or "
    "`pairwise` (matchings only). Unset: the topology's natural rule (`metropolis` for "
    "static graphs, `pairwise` for matchings, the file's weights for `file:`).",
    "kappa": "Lazy mixing W_κ = κ·W + (1 − κ)·I; κ = 1 is W itself.",
    "algorithm": f"Training algorithm: {_names(ALGORITHM_NAMES)} (docs/algorithms.md).",
    "hyper": "The algorithm's own hyperparameters, e.g. `hyper.rounds` (DeTAG), "
    "`hyper.beta` (QGM), `hyper.local_steps` (local SGD), `hyper.graphs` (ada-schedule).",
    "plan": "Phase plan: `gossip` (every phase gossips), `exact` (every phase averages "
    "exactly), `dec-phase-K` (only phase K gossips, the others average exactly), or a list "
    'of per-phase modes such as `["gossip", "exact", "exact"]`.',
    "phase_topologies": "One topology per phase (`null`/absent entries: `topology`); the "
    "list has one entry per phase (len(optim.milestones) + 1).",
    "dataset": 'Dataset section; `dataset = "digits"` is shorthand for `[dataset] name`.',
    "dataset.name": f"Dataset: {_names(DATASET_NAMES)}. Nothing is downloaded at run time.",
    "dataset.samples": "Generated datasets: total number of samples.",
    "dataset.root": "Directory of on-disk datasets (CIFAR-10 python batches).",
    "dataset.test_samples": "Evaluate on at most this many test samples.",
    "dataset.augment": "Training-time augmentation (CIFAR-10: random crop and flip).",
    "dataset.options": "Extra keyword arguments passed to the dataset builder.",
    "partition": 'Partition section; `partition = "dirichlet"` is shorthand for '
    "`[partition] scheme`.",
    "partition.scheme": f"How the training set is split over peers: {_names(PARTITION_NAMES)}, "
    "or `module:callable` (user code).",
    "partition.alpha": "Dirichlet concentration α of the `dirichlet` scheme (smaller: more "
    "label skew).",
    "partition.shuffled_fraction": "`sorted` scheme: fraction of the label-sorted data that is "
    'shuffled before the split (DeTAG\'s "unshuffled" data at 0).',
    "partition.shards_per_peer": "`shards` scheme: label-sorted shards per peer.",
    "partition.options": "Extra keyword arguments passed to a user partitioner.",
    "model": 'Model section; `model = "mlp"` is shorthand for `[model] name`.',
    "model.name": f"Model: {_names(MODEL_NAMES)}, or `module:callable` (user code).",
    "model.width": "Width factor / base channel count of the model (model-specific default).",
    "model.norm": "Normalisation layers: `bn` (BatchNorm) or `gn` (GroupNorm); unset: the "
    "model's default.",
    "model.hidden": "`mlp`: hidden layer sizes.",
    "model.options": "Extra keyword arguments passed to the model builder.",
    "optim": "The local optimizer (SGD) and learning-rate schedule.",
    "optim.lr": "Peak learning rate η.",
    "optim.momentum": "Local momentum μ (each replica keeps its own buffer, never "
    "communicated). QGM requires it to equal `hyper.beta`.",
    "optim.nesterov": "Nesterov momentum (true) or heavy ball (false).",
    "optim.weight_decay": "Weight decay added to the gradient (not to biases and "
    "normalisation parameters).",
    "optim.batch_size": "Local (per-peer) mini-batch size.",
    "optim.warmup": "Linear warm-up, as a fraction of training.",
    "optim.warmup_from": "Warm-up starts at this multiple of `lr`.",
    "optim.milestones": "Learning-rate decays, as fractions of training in (0, 1), strictly "
    "increasing; the training phases are split at these points.",
    "optim.gamma": "Learning-rate multiplier at each milestone.",
    "control": "Consensus control (docs/algorithms.md#consensus-control). The default, "
    "adaptive control of phase 1, is inert for algorithms and phases it does not apply to.",
    "control.mode": "`none`; `constant` (target = factor × Ξ_max of an automatic "
    "uncontrolled calibration pass); `adaptive` (target = factor × EMA of the mean local "
    "gradient norm); `fixed` (not consensus control: exactly `rounds` gossip rounds in every "
    "step of the controlled phases, for equal-budget comparisons).",
    "control.factor": "Multiplier of the target (Ξ_max or the gradient-norm EMA).",
    "control.phases": "Controlled phases, 1-based.",
    "control.max_rounds": "Upper bound on gossip rounds per step.",
    "control.lagged": "true: the rounds of step t are decided from the statistics of step "
    "t − lag (no per-round barrier); false: repeat/stop after every round.",
    "control.lag": "Lagged mode: the feedback delay L in steps (must stay 1 unless "
    "`lagged = true`).",
    "control.ema": "EMA coefficient of the adaptive target's gradient-norm average "
    "(0: no smoothing).",
    "control.statistic": "What the controller is fed: `theta` (the estimator Θ), `sketch` (Ξ "
    "estimated from 64-float random sketches the peers send with θ_i) or `xi` (exact Ξ, "
    "vectorized engine only).",
    "eval": "Evaluation schedule.",
    "eval.every": "Evaluate every this many epochs.",
    "eval.peers": "Also evaluate every replica (on the first `peer_samples` test samples) at "
    "intermediate evaluations.",
    "eval.peer_samples": "Test samples per replica at intermediate evaluations (unset: all); "
    "the final evaluation always uses the whole test set.",
    "compression": "What travels on gossip edges.",
    "compression.codec": f"Codec: {_names(CODEC_NAMES)}. `fp16`/`bf16` work with any gossip "
    'algorithm; the lossy codecs need `algorithm = "choco"`.',
    "compression.ratio": "`topk`/`randomk`: fraction of coordinates kept.",
    "compression.gamma": "CHOCO consensus step size γ.",
    "compression.levels": "`qsgd`: quantisation levels s.",
    "compression.unbiased": "`qsgd`: drop the variance-reducing factor τ (unbiased quantiser).",
    "network": "The data plane of real peers (ignored by the vectorized engine).",
    "network.addresses": "Static mode (no orchestrator): `host:port` of every peer, in id "
    "order; peer i listens at `addresses[i]`.",
    "network.deadline": "Seconds a gossip round waits for a neighbour's tensor.",
    "network.startup_timeout": "Seconds a peer waits for its neighbours at start.",
    "network.chunk_bytes": "Maximum body bytes of one data-plane frame (docs/protocol.md). "
    "Fewer, larger chunks cost less per tensor (docs/performance.md); on a link so slow that "
    "a chunk takes longer than `stream_idle_timeout` to cross it, lower it.",
    "network.max_tensor_bytes": "Largest encoded tensor a peer accepts, in bytes.",
    "network.tls": "Optional mTLS between peers; every path may contain `{id}`, replaced by "
    "the peer id (docs/deployment.md#mtls-certificates).",
    "network.tls.ca": "Path of the run CA certificate (PEM).",
    "network.tls.cert": "Path of this peer's certificate (PEM).",
    "network.tls.key": "Path of this peer's private key (PEM).",
    "orchestrator": "The control plane of real peers (ignored by the vectorized engine).",
    "orchestrator.broker": "`mqtt://HOST[:PORT]` (1883) or `mqtts://HOST[:PORT]` (8883, TLS) of "
    "the MQTT broker, optionally with `USER@`; never a password (see `broker_password_file`); "
    "unset: the orchestrator embeds an anonymous broker on 127.0.0.1.",
    "orchestrator.heartbeat": "Seconds between peer heartbeats.",
    "orchestrator.liveness_timeout": "Seconds of silence after which a peer is dropped and "
    "the schedule repaired; must exceed two heartbeats.",
    "orchestrator.decision_timeout": "Seconds a round waits for all statistics "
    "(orchestrator) or for a decision (peer).",
    "metrics": "An opt-in Prometheus endpoint on the orchestrator and every peer "
    "(docs/deployment.md#metrics; ignored by the vectorized engine).",
    "epochs": "Training length in epochs (may be fractional).",
    "seed": "Seed of data order, partition, initialisation and random topologies.",
    "engine": "`processes` (orchestrator + peer processes over gRPC/MQTT) or `vectorized` "
    "(all replicas batched in one process).",
    "device": "`auto`, `cpu`, `cuda` or `cuda:N`.",
    "threads": "torch intra-op threads per process (unset: 1 in each peer process, torch's "
    "default in the vectorized engine).",
}


@dataclass(frozen=True)
class ConfigKey:
    """One key of the config: dotted name, the pydantic field, and its section model if any."""

    key: str
    field: FieldInfo
    section: type[BaseModel] | None


def _section_model(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def config_keys(model: type[BaseModel] = RunConfig, prefix: str = "") -> Iterator[ConfigKey]:
    """Every key of ``model``, depth first: a section key is followed by its own keys."""
    for name, field in model.model_fields.items():
        section = _section_model(field.annotation)
        key = prefix + name
        yield ConfigKey(key, field, section)
        if section is not None:
            yield from config_keys(section, key + ".")


def description(item: ConfigKey) -> str:
    """`DESCRIPTIONS`, else the field's own description; empty when neither has one."""
    if item.key in DESCRIPTIONS:
        return DESCRIPTIONS[item.key]
    own = (item.field.description or "").strip()
    if not own:
        return ""
    own = own[0].upper() + own[1:]
    return own if own.endswith(".") else own + "."


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_name(a) for a in args if a is not type(None)]
        optional = any(a is type(None) for a in args)
        return " \\| ".join(parts) + (" (optional)" if optional else "")
    if origin is list:
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict:
        return "table"
    if annotation is typing.Any:
        return "any"
    names = {str: "string", int: "integer", float: "float", bool: "boolean"}
    if isinstance(annotation, type) and annotation in names:
        return names[annotation]
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(table)"
    if value is None:
        return "unset"
    if value == {}:
        return "`{}`"
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _range(field: FieldInfo) -> str:
    parts = []
    for m in field.metadata:
        if isinstance(m, Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, Ge):
            parts.append(f"≥ {m.ge}")
        elif isinstance(m, Lt):
            parts.append(f"< {m.lt}")
        elif isinstance(m, Le):
            parts.append(f"≤ {m.le}")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_HEADER = """\
# Configuration reference

<!-- Generated by `concord config doc` (concord.lab.configdoc) from the pydantic model
concord.core.config.RunConfig; tests/lab/test_config_cmd.py fails when this file is stale.
Regenerate with: concord config doc > docs/configuration.md -->

A run is described by one TOML file; every key is optional. Values are layered as
defaults → the file → `CONCORD_<KEY>` environment variables (`CONCORD_PEERS=16`,
`CONCORD_CONTROL__FACTOR=0.5`: a double underscore separates a section from its key) →
`--set key=value` on the command line (`--set control.factor=0.5`). Validation reports every
problem at once, each with its dotted key. `concord config show [--set …] [FILE]` prints the
resolved configuration, `concord config schema` its JSON Schema.

Units: durations are seconds, sizes bytes, `optim.warmup` and `optim.milestones` fractions of
training. "unset" means the key has no value by default (omit it in TOML). Type `a | b` means
either; `(optional)` means the key may be left unset.
"""


def _table(rows: list[ConfigKey], prefix: str) -> list[str]:
    lines = ["| key | type | default | range | description |", "| --- | --- | --- | --- | --- |"]
    for item in rows:
        short = item.key.removeprefix(prefix)
        lines.append(
            f"| `{short}` | {_type_name(item.field.annotation)} | {_default(item.field)} "
            f"| {_range(item.field)} | {_cell(description(item))} |"
        )
    return lines


def render_markdown() -> str:
    """The whole reference, as committed in ``docs/configuration.md``."""
    keys = list(config_keys())
    out = [_HEADER]
    top = [k for k in keys if "." not in k.key and k.section is None]
    out += ["## Top-level keys", "", *_table(top, ""), ""]
    for item in keys:
        if item.section is None:
            continue
        rows = [k for k in keys if "." in k.key and k.key.rsplit(".", 1)[0] == item.key]
        out += [f"## `[{item.key}]`", "", description(item), ""]
        out += [*_table(rows, item.key + "."), ""]
    return "\n".join(out).rstrip() + "\n"
