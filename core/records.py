"""Run records: every JSON document a run leaves behind, as declared types (torch-free).

One frozen dataclass per record kind, written with ``to_json()`` and read with
``from_json(obj, where=...)``, which validates every field and raises `RecordError` naming the
file, the line and the field. The JSON Schema of each kind (`record_schema`, ``concord records
schema``) is generated from these declarations. docs/records.md lists the fields.

======================  ========================  =============================================
kind                    type                      where
======================  ========================  =============================================
``step``                `StepRecord`              a ``metrics.jsonl`` line (``"kind": "step"``)
``eval``                `EvalRecord`              a ``metrics.jsonl`` line (``"kind": "eval"``)
``summary``             `RunSummary`              a run's ``summary.json``
``peer-summary``        `PeerSummary`             a peer's ``summary.json`` (``peers/peer-i/``)
``checkpoint``          `CheckpointRunState`      ``checkpoint.pt``'s ``"run"`` table
``control-checkpoint``  `ControlCheckpointState`  ``orchestrator-checkpoint.json``
``manifest``            `Manifest`                a run's ``manifest.json``
``orchestrator``        `OrchestratorSummary`     ``orchestrator-summary.json``
``calibration``         `CalibrationRecord`       ``calibration.json`` (constant targets)
======================  ========================  =============================================

Every record carries ``"version"`` (`Record.VERSION`). A document without one was written
before records were typed (version 0): it is read with its old key names mapped to the
canonical ones (`Record.LEGACY`, e.g. ``acc_avg_model`` → ``accuracy_avg_model``); a version
newer than this concord reads raises `RecordVersionError` naming it. One name per metric:

* ``accuracy_avg_model`` / ``loss_avg_model`` — test accuracy / loss of the averaged model x̄;
* ``accuracy_mean_peer``, ``accuracy_worst_peer``, ``accuracy_best_peer``, ``loss_mean_peer`` —
  over the replicas evaluated (a peer's own record: its one replica);
* ``train_acc`` and ``loss`` — of a step's training batches; ``xi`` — the exact consensus
  distance Ξ; ``theta`` — the estimator Θ.

Open-ended parts stay JSON values under a typed key: a step record's ``extra`` (what a peer or
an algorithm adds per step: timings, missing neighbours, …) is written flat beside the fixed
fields, and a checkpoint's component states (``controller``, ``feedback``) are JSON tables.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Literal, Self, TypeAlias

import pydantic
from pydantic import ConfigDict, TypeAdapter

from concord.errors import ConcordError

__all__ = [
    "JSON",
    "RECORD_KINDS",
    "CalibrationRecord",
    "CheckpointRunState",
    "ControlCheckpointState",
    "CounterState",
    "EvalRecord",
    "Manifest",
    "MetricsRecord",
    "OrchestratorSummary",
    "PeerSummary",
    "Record",
    "RecordError",
    "RecordVersionError",
    "RunSummary",
    "StepRecord",
    "metrics_record",
    "peer_accuracy",
    "peer_loss",
    "record_schema",
]

JSON: TypeAlias = pydantic.JsonValue
"""A JSON value (the open-ended parts of a record)."""

_STRICT = ConfigDict(strict=True, extra="forbid")


class RecordError(ConcordError, ValueError):
    """A run record that does not match its declared type. ``where`` is the file (and line),
    ``field`` the dotted field path ("" for the record itself)."""

    def __init__(self, where: str, field: str, problem: str) -> None:
        self.where, self.field, self.problem = where, field, problem
        at = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{at} {problem}")


class RecordVersionError(RecordError):
    """A record of a version this concord does not read (written by a newer one)."""


def _plain(value: Any) -> Any:
    """A dataclass, mapping or sequence as plain JSON containers (lists, dicts)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def _problem(cls: type[Record], err: Any) -> str:
    """A sentence for one pydantic error of a ``cls`` document."""
    kind = f"a version-{cls.VERSION} {cls.KIND} record"
    if err["type"] == "unexpected_keyword_argument":
        return f"not a field of {kind}"
    if err["type"] == "missing":
        return f"missing (required in {kind})"
    return f"{err['msg']} (got {err['input']!r})"


class Record:
    """Base of the record types: versioned JSON documents with validated reading.

    Subclasses are frozen, keyword-only dataclasses whose fields are the document's keys;
    ``KIND`` names the kind (``concord records schema KIND``), ``TAG`` is the value of the
    document's ``"kind"`` key where it has one (metrics lines), ``LEGACY`` maps the key names of
    unversioned (version-0) documents to the canonical ones. A subclass with an ``extra`` field
    keeps the keys it does not declare there (JSON values), written flat beside its fields."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT
    KIND: ClassVar[str]
    VERSION: ClassVar[int] = 1
    TAG: ClassVar[str | None] = None
    LEGACY: ClassVar[Mapping[str, str]] = {}

    def to_json(self) -> dict[str, JSON]:
        """The document: ``kind`` (if tagged), ``version``, the fields (``extra`` flattened)."""
        body: dict[str, JSON] = {} if self.TAG is None else {"kind": self.TAG}
        body["version"] = self.VERSION
        plain = _plain(self)
        extra = plain.pop("extra", None) or {}
        unset = {f.name for f in fields(self) if f.default is None}  # type: ignore[arg-type]
        body.update((k, v) for k, v in plain.items() if v is not None or k not in unset)
        clash = sorted(set(extra) & set(body))
        if clash:
            raise RecordError(type(self).__name__, "extra", f"keys {clash} shadow fixed fields")
        body.update(extra)
        return body

    @classmethod
    def from_json(cls, obj: object, *, where: str) -> Self:
        """Validate ``obj`` (a parsed JSON document) as this kind. Raises `RecordError` naming
        ``where`` (file and line) and the field, `RecordVersionError` for a newer version."""
        if not isinstance(obj, Mapping):
            raise RecordError(where, "", f"expected a JSON object, got {type(obj).__name__}")
        body: dict[str, JSON] = _plain(obj)
        version = body.pop("version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise RecordError(where, "version", f"{version!r} is not a record version")
        if version > cls.VERSION:
            raise RecordVersionError(
                where,
                "version",
                f"a version-{version} {cls.KIND} record; this concord reads versions "
                f"0 to {cls.VERSION} (upgrade concord to read it)",
            )
        if version == 0:
            body = cls._upgrade(body)
        if cls.TAG is not None:
            tag = body.pop("kind", None)
            if tag != cls.TAG:
                raise RecordError(where, "kind", f"{tag!r}; expected {cls.TAG!r}")
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        if "extra" in names:
            body["extra"] = {k: body.pop(k) for k in list(body) if k not in names}
        try:
            record: Self = _adapter(cls).validate_json(json.dumps(body))
        except pydantic.ValidationError as exc:
            err = exc.errors()[0]
            path = ".".join(str(p) for p in err["loc"])
            raise RecordError(where, path, _problem(cls, err)) from None
        return record

    @classmethod
    def _upgrade(cls, body: dict[str, JSON]) -> dict[str, JSON]:
        """A version-0 document with the canonical key names (`LEGACY`)."""
        return {cls.LEGACY.get(k, k): v for k, v in body.items()}

    @classmethod
    def json_schema(cls) -> dict[str, JSON]:
        """The JSON Schema of this kind's documents, generated from the declared fields."""
        schema: dict[str, Any] = _adapter(cls).json_schema()
        props: dict[str, Any] = schema.setdefault("properties", {})
        head: dict[str, Any] = {}
        if cls.TAG is not None:
            head["kind"] = {"const": cls.TAG, "title": "Kind", "type": "string"}
        head["version"] = {"const": cls.VERSION, "title": "Version", "type": "integer"}
        if "extra" in props:
            del props["extra"]
            schema["additionalProperties"] = True
        schema["properties"] = {**head, **props}
        schema["required"] = [*head, *schema.get("required", [])]
        schema["description"] = (cls.__doc__ or "").strip()
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        return schema


# ---------------------------------------------------------------------------------------------
# metrics.jsonl


@dataclass(frozen=True, kw_only=True)
class StepRecord(Record):
    """One training step (a ``metrics.jsonl`` line). Values are over the replicas the writer
    holds: all n in the vectorized engine and a run's record, one in a peer's own file.
    ``peers``: how many peers the orchestrator's run record aggregates; ``peer``: the writer
    of a peer's own record. Keys beyond the fields (a peer's timings, missing neighbours, …)
    are kept in ``extra``."""

    KIND: ClassVar[str] = "step"
    TAG: ClassVar[str | None] = "step"

    step: int
    epoch: float | None
    phase: int | None
    lr: float | None
    loss: float | None
    train_acc: float | None
    rounds: int
    theta: float | None
    target: float | None
    grad_norm: float | None
    bytes_sent: int
    rounds_total: int
    xi: float | None = None
    graph: str | None = None
    graph_k: int | None = None
    graph_k_peers: list[int] | None = None
    # asynchronous algorithms (`concord.sim.asynchronous`): a step is a window of virtual time
    virtual_time: float | None = None  # virtual seconds at the end of the step
    local_steps: int | None = None  # local steps the peers completed in it
    staleness_mean: float | None = None  # of the neighbour information mixed in it, in steps
    staleness_max: int | None = None
    wait_s: float | None = None  # virtual seconds the peers spent waiting in it, summed
    peer: int | None = None
    peers: int | None = None
    extra: dict[str, JSON] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EvalRecord(Record):
    """One evaluation (a ``metrics.jsonl`` line): the averaged model x̄ and the replicas
    evaluated on the test set. A peer's own record (``peer``) holds its one replica's accuracy
    and loss as ``accuracy_mean_peer`` and ``loss_mean_peer``."""

    KIND: ClassVar[str] = "eval"
    TAG: ClassVar[str | None] = "eval"
    LEGACY: ClassVar[Mapping[str, str]] = {
        "acc_avg_model": "accuracy_avg_model",
        "acc_mean_peer": "accuracy_mean_peer",
        "acc_worst_peer": "accuracy_worst_peer",
        "acc_best_peer": "accuracy_best_peer",
    }
    PEER_LEGACY: ClassVar[Mapping[str, str]] = {
        "accuracy": "accuracy_mean_peer",
        "loss": "loss_mean_peer",
    }

    step: int
    epoch: float | None
    xi: float | None = None
    accuracy_avg_model: float | None = None
    loss_avg_model: float | None = None
    accuracy_mean_peer: float | None = None
    accuracy_worst_peer: float | None = None
    accuracy_best_peer: float | None = None
    loss_mean_peer: float | None = None
    peer: int | None = None
    peers: int | None = None

    @classmethod
    def _upgrade(cls, body: dict[str, JSON]) -> dict[str, JSON]:
        body = super()._upgrade(body)
        if "peer" in body:  # a peer's own record: "accuracy" and "loss" of its replica
            body = {cls.PEER_LEGACY.get(k, k): v for k, v in body.items()}
        return body


MetricsRecord: TypeAlias = StepRecord | EvalRecord


def metrics_record(obj: object, *, where: str) -> MetricsRecord:
    """A ``metrics.jsonl`` line as its record type, by its ``"kind"``."""
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    if kind == "step":
        return StepRecord.from_json(obj, where=where)
    if kind == "eval":
        return EvalRecord.from_json(obj, where=where)
    if not isinstance(obj, Mapping):
        raise RecordError(where, "", f"expected a JSON object, got {type(obj).__name__}")
    raise RecordError(where, "kind", f"{kind!r}; expected 'step' or 'eval'")


def peer_accuracy(values: Mapping[str, float]) -> float | None:
    """A peer's test accuracy in its published evaluation values (``accuracy_mean_peer``, or
    ``accuracy`` from peers older than typed records)."""
    value = values.get("accuracy_mean_peer", values.get("accuracy"))
    return None if value is None or not math.isfinite(value) else float(value)


def peer_loss(values: Mapping[str, float]) -> float | None:
    """A peer's test loss in its published evaluation values (``loss_mean_peer``, or ``loss``
    from peers older than typed records)."""
    value = values.get("loss_mean_peer", values.get("loss"))
    return None if value is None or not math.isfinite(value) else float(value)


# ---------------------------------------------------------------------------------------------
# summary.json


@dataclass(frozen=True, kw_only=True)
class RunSummary(Record):
    """A run's ``summary.json`` (both engines): its shape, final accuracies, traffic and time.
    The accuracies are of the final evaluation; the processes engine adds what its children
    did (``peers_completed`` … ``control_fallbacks``)."""

    KIND: ClassVar[str] = "summary"

    engine: Literal["vectorized", "processes"]
    algorithm: str
    topology: str
    peers: int
    steps: int
    epochs: float
    seed: int
    plan: str
    control_mode: str
    control_factor: float | None
    accuracy_avg_model: float | None
    accuracy_worst_peer: float | None
    accuracy_mean_peer: float | None
    gossip_rounds_total: int
    bytes_sent_total: int
    bytes_raw_total: int
    final_consensus_distance: float | None
    partition_sha256: str | None
    wall_seconds: float
    run_dir: str
    resumed_from_step: int | None = None
    label: str | None = None
    control_lagged: bool | None = None
    partition_mismatch: list[int] | None = None
    peers_completed: list[int] | None = None
    peers_dropped: list[int] | None = None
    children_failed: dict[str, int] | None = None
    children_errors: dict[str, str] | None = None
    control_fallbacks: int | None = None


@dataclass(frozen=True, kw_only=True)
class PeerSummary(Record):
    """A peer process's ``summary.json``: how far it got and what it sent. Keys beyond the
    fields (transport and coordination counters, rejoin details) are kept in ``extra``."""

    KIND: ClassVar[str] = "peer-summary"
    LEGACY: ClassVar[Mapping[str, str]] = {"accuracy": "accuracy_mean_peer"}

    completed: bool
    engine: Literal["processes"] = "processes"
    peer: int | None = None
    steps: int | None = None
    error: str | None = None
    accuracy_mean_peer: float | None = None
    gossip_rounds_total: int = 0
    bytes_sent_total: int = 0
    bytes_raw_total: int = 0
    bytes_per_edge: list[dict[str, int]] = field(default_factory=list)
    partition_sha256: str | None = None
    control_fallbacks: int = 0
    resumed_from_step: int | None = None
    wall_seconds: float | None = None
    run_dir: str | None = None
    extra: dict[str, JSON] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# checkpoint.pt's run state


@dataclass(frozen=True, kw_only=True)
class CounterState:
    """A `Comm`'s byte counters: totals and ``edges`` rows [source, destination, raw, wire]."""

    __pydantic_config__: ClassVar[ConfigDict] = _STRICT

    bytes_raw: int
    bytes_wire: int
    messages: int
    rounds: int
    edges: list[tuple[int, int, int, int]]


@dataclass(frozen=True, kw_only=True)
class CheckpointRunState(Record):
    """``checkpoint.pt``'s ``"run"`` table: what the engine needs beyond tensors to continue
    after ``next_step − 1``. ``controller`` and ``feedback`` are the consensus and graph
    controllers' own JSON states; ``peer``, ``step_base`` and ``config`` (the run's identity,
    `concord.core.config.run_identity`) are a peer's."""

    KIND: ClassVar[str] = "checkpoint"

    engine: Literal["vectorized", "peer"]
    next_step: int
    total_steps: int
    rounds_total: int
    counters: CounterState
    controller: dict[str, JSON] | None = None
    feedback: dict[str, JSON] | None = None
    wall_seconds: float | None = None
    peer: int | None = None
    step_base: int = 0
    config: str | None = None

    @property
    def finished(self) -> bool:
        """The run's every step is done."""
        return self.next_step >= self.total_steps


@dataclass(frozen=True, kw_only=True)
class ControlCheckpointState(Record):
    """``orchestrator-checkpoint.json``: the control plane's share of a run's state at the
    peers' checkpoint steps. ``config`` is the run's identity (`concord.core.config.run_identity`),
    ``step_base`` the train stage's first step (after a calibration pass of that many steps),
    ``calibration`` the calibration pass's result (its `CalibrationRecord` document),
    ``controller`` the consensus controller's state after each checkpoint step, by step
    (decimal)."""

    KIND: ClassVar[str] = "control-checkpoint"

    config: str
    steps_per_epoch: int
    step_base: int
    calibration: dict[str, JSON] | None
    controller: dict[str, dict[str, JSON]]

    @property
    def steps(self) -> set[int]:
        """The checkpoint steps this state holds the controller's state for."""
        return {int(k) for k in self.controller}


# ---------------------------------------------------------------------------------------------
# manifest.json and the orchestrator's summary


@dataclass(frozen=True, kw_only=True)
class Manifest(Record):
    """A run's ``manifest.json``: its shape (steps, plan, topology spectra), the model's
    fingerprint, and where it ran — versions and machine (vectorized engine) or the run id,
    the admitted peers' addresses and the resolved config (orchestrator). ``host``: the facts
    that decide whether two hosts compute the same bits (CPU family/model/flags, BLAS, torch's
    build, threads). ``created`` is an ISO 8601 time."""

    KIND: ClassVar[str] = "manifest"

    engine: Literal["vectorized", "processes"]
    created: str
    peers: int
    steps: int
    steps_per_epoch: int
    plan: dict[str, JSON]
    topologies: dict[str, JSON]
    fingerprint: str | None
    seed: int | None = None
    algorithm: str | None = None
    topology: str | None = None
    parameters: int | None = None
    device: str | None = None
    concord: str | None = None
    git_commit: str | None = None
    python: str | None = None
    torch: str | None = None
    numpy: str | None = None
    platform: str | None = None
    torch_threads: int | None = None
    host: dict[str, JSON] | None = None
    run: str | None = None
    addresses: dict[str, str | None] | None = None
    config: dict[str, JSON] | None = None

    @classmethod
    def _upgrade(cls, body: dict[str, JSON]) -> dict[str, JSON]:
        """Version 0: the vectorized engine wrote no ``engine``; the orchestrator wrote
        ``created`` as Unix seconds."""
        import datetime as dt

        body = super()._upgrade(body)
        body.setdefault("engine", "processes" if "run" in body else "vectorized")
        created = body.get("created")
        if isinstance(created, int | float) and not isinstance(created, bool):
            body["created"] = dt.datetime.fromtimestamp(created, dt.UTC).isoformat()
        return body


@dataclass(frozen=True, kw_only=True)
class OrchestratorSummary(Record):
    """``orchestrator-summary.json``: how the control plane's run went. ``completed`` False
    with ``error`` (and the ``stage`` it failed in) for a run that ended on an error;
    ``cpu_seconds`` includes an embedded broker's routing."""

    KIND: ClassVar[str] = "orchestrator"

    run: str
    peers_done: list[int]
    peers_dropped: list[int]
    schedule_versions: int
    rejected_payloads: int
    stats_ignored: int
    stats_refused: int
    control_handler_errors: int
    graph_decisions: int | None
    graph_steps_partial: int | None
    wall_seconds: float
    cpu_seconds: float
    completed: bool | None = None
    error: str | None = None
    stage: str | None = None


# ---------------------------------------------------------------------------------------------
# calibration.json


@dataclass(frozen=True, kw_only=True)
class CalibrationRecord(Record):
    """``calibration.json``: the calibration pass of consensus control's constant targets — the
    maximum of ``statistic`` (``"theta"`` or ``"xi"``) per phase of an uncontrolled run, by
    1-based phase index (decimal). `concord.core.control.calibration.Calibration` reads and
    writes it."""

    KIND: ClassVar[str] = "calibration"

    statistic: str
    max_statistic: dict[str, float]


RECORD_KINDS: dict[str, type[Record]] = {
    cls.KIND: cls
    for cls in (
        StepRecord,
        EvalRecord,
        RunSummary,
        PeerSummary,
        CheckpointRunState,
        ControlCheckpointState,
        Manifest,
        OrchestratorSummary,
        CalibrationRecord,
    )
}
"""Every record kind by name (``concord records schema KIND``)."""


def record_schema(kind: str) -> dict[str, JSON]:
    """The JSON Schema of record kind ``kind`` (`RECORD_KINDS`); KeyError lists the kinds."""
    if kind not in RECORD_KINDS:
        raise KeyError(f"unknown record kind {kind!r}; one of {', '.join(RECORD_KINDS)}")
    return RECORD_KINDS[kind].json_schema()
