"""The MQTT control-plane contract: every topic name and every payload schema, in one place.

Topics live under one versioned root, ``concord/v1/<run>/…``. Payloads are msgpack maps carrying
the schema version ``v`` and their ``kind``; `decode` validates a payload against its topic and
raises `PayloadError` naming the topic, the field and what is wrong — a malformed or
wrong-version message is rejected (and logged by the receiver), never a crash. Tensors never
cross the broker.

| topic (under concord/v1/<run>/) | payload    | QoS | retained | who publishes                  |
| ------------------------------- | ---------- | --- | -------- | ------------------------------ |
| ``schedule``                    | Schedule   | 1   | yes      | orchestrator                   |
| ``plan``                        | Plan       | 1   | yes      | orchestrator                   |
| ``control``                     | RunControl | 1   | yes      | orchestrator (start / stop)    |
| ``status/<peer>``               | Status     | 1   | yes      | peer; broker (Last-Will)       |
| ``orchestrator``                | Presence   | 1   | yes      | orchestrator; broker (Will)    |
| ``heartbeat/<peer>``            | Heartbeat  | 0   | no       | peer                           |
| ``stats/<peer>``                | Stats      | 0   | no       | peer, after every gossip round |
|                                 |            |     |          | of a barrier-controlled step,  |
|                                 |            |     |          | of the calibration pass, and   |
|                                 |            |     |          | once per step in ada-feedback  |
| ``decision``                    | Decision   | 0   | no       | orchestrator                   |
| ``metrics/<peer>``              | Metrics    | 0   | no       | peer, once per training step   |
|                                 |            |     |          | (lagged control: carrying the  |
|                                 |            |     |          | step's Stats) and evaluation   |

Retained topics give a late or reconnecting subscriber the current schedule, plan, run state and
every peer's last status at once. The Last-Will on ``status/<peer>`` is a Status with state
"offline", so a crashed peer is announced by the broker itself; the orchestrator's Last-Will on
``orchestrator`` likewise tells the peers that nobody will decide any more (they stop waiting
for decisions at once, and wait again when it is back online). This module is torch-free (the
orchestrator imports it).

**QoS 0 on the per-step topics** (stats, decision, metrics, heartbeat), QoS 1 on the state:

* Every session is a clean session and a reconnect opens a new client (`concord.protos.mqtt.Bus`): a
  message in flight when a connection breaks is lost at QoS 1 as at QoS 0, and the broker keeps
  nothing for a disconnected client. Over a live connection TCP delivers QoS 0 in order. QoS 1
  would add no guarantee here, only a PUBACK per message and hop.
* Those PUBACKs are not free. Every MQTT packet wakes a process (peer, broker, orchestrator) on
  a host whose cores are busy training, and a wake-up costs the training threads it preempts
  far more than its own CPU time. Per controlled step, QoS 1 stats and decisions cost 6n + 2
  wake-ups on top of the step's metrics; with QoS 0 and the lagged statistics riding on the
  metrics message it is n + 1, the decision's fan-out (bench/control.py measures the result).
* Loss is already part of the protocol: a round whose statistics do not all arrive is decided
  on a timeout (`concord.orchestrator.rounds`), a peer without its decision falls back
  (`concord.peer.control`), a missed metrics record is written from the peers that reported.

The state (schedule, plan, control, status and presence with their Last-Wills) stays QoS 1 and
retained: it is rare, and a retained message is what a late or reconnecting client starts from.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar, get_args

import msgpack

from concord.errors import PayloadError as PayloadError

SCHEMA_VERSION = 2  # 2: Metrics.stats (lagged statistics ride on the step record), Presence
ROOT = "concord/v1"
MAX_PAYLOAD_BYTES = 256 * 1024  # control messages are small; anything bigger is rejected
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


# ---------------------------------------------------------------------------------------------
# Payload schemas

PeerState = Literal["starting", "ready", "training", "done", "failed", "offline"]
PEER_STATES: tuple[str, ...] = get_args(PeerState)
RunAction = Literal["start", "stop"]
PresenceState = Literal["online", "offline"]
PRESENCE_STATES: tuple[str, ...] = get_args(PresenceState)
Stage = Literal["calibrate", "train"]
STAGES: tuple[str, ...] = get_args(Stage)


@dataclass(frozen=True)
class Message:
    """Base of all payloads: ``KIND`` names the schema; subclasses list their fields."""

    KIND: ClassVar[str] = ""

    def validate(self) -> None:
        """Extra range checks; raise ValueError with the field name."""


@dataclass(frozen=True)
class Schedule(Message):
    """Which peers gossip, over which topology, per phase. ``version`` grows with every change
    (a repaired schedule after a peer left has a higher version). Peers take each phase's
    topology from ``phases`` (None: the run's ``topology``). Adaptive graphs (``ada-feedback``,
    `concord.core.graphs.adagraph`) publish a new version at every decision point, even when the
    graph stays: ``decided_at`` is the step whose statistics the phases' topologies reflect, and a
    peer reaching that decision's effective step waits until it holds a schedule with
    ``decided_at`` ≥ that step."""

    KIND: ClassVar[str] = "schedule"
    version: int
    peers: list[int]  # ids of the live peers the topology is built over
    topology: str
    weights: str | None
    kappa: float
    seed: int
    phases: list[dict[str, Any]]  # [{"index": k, "topology": name | None}]
    reason: str = ""
    addresses: list[str] = field(default_factory=list)  # gRPC host:port of peers[i]
    effective_step: int = 0  # peers switch to this schedule at the start of this step
    decided_at: int | None = None  # ada-feedback: the latest decision point it reflects

    def validate(self) -> None:
        _nonneg("version", self.version)
        _nonneg("effective_step", self.effective_step)
        if self.decided_at is not None:
            _nonneg("decided_at", self.decided_at)
        if len(set(self.peers)) != len(self.peers) or any(p < 0 for p in self.peers):
            raise ValueError(f"peers must be distinct ids ≥ 0; got {self.peers}")
        if not self.peers:
            raise ValueError("peers must list at least one live peer")
        if self.addresses and len(self.addresses) != len(self.peers):
            raise ValueError(
                f"addresses lists {len(self.addresses)} entries for {len(self.peers)} peers"
            )
        for i, a in enumerate(self.addresses):
            host, sep, port = a.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"addresses[{i}] = {a!r}; expected 'host:port'")
        if not 0 < self.kappa <= 1:
            raise ValueError(f"kappa must be in (0, 1]; got {self.kappa}")
        for i, ph in enumerate(self.phases):
            if not isinstance(ph, dict) or set(ph) != {"index", "topology"}:
                raise ValueError(f"phases[{i}] must be {{index, topology}}; got {ph!r}")


@dataclass(frozen=True)
class Plan(Message):
    """The phase plan (`concord.core.control.plan.PhasePlan.to_dict`), LR schedule and control
    settings."""

    KIND: ClassVar[str] = "plan"
    total_steps: int
    phases: dict[str, Any]
    lr: dict[str, Any]
    control: dict[str, Any]

    def validate(self) -> None:
        _nonneg("total_steps", self.total_steps)


@dataclass(frozen=True)
class RunControl(Message):
    KIND: ClassVar[str] = "control"
    action: str  # "start" | "stop"
    reason: str = ""
    ts: float = 0.0
    stage: str = "train"  # "calibrate": the uncontrolled pass of constant targets; "train"
    steps: int = 0  # steps to run in this stage (0: the whole plan)
    step_base: int = 0  # added to step numbers on the data plane (stages never reuse a step)

    def validate(self) -> None:
        if self.action not in get_args(RunAction):
            raise ValueError(f"action must be 'start' or 'stop'; got {self.action!r}")
        _stage(self.stage)
        _nonneg("steps", self.steps)
        _nonneg("step_base", self.step_base)


@dataclass(frozen=True)
class Status(Message):
    KIND: ClassVar[str] = "status"
    peer: int
    state: str
    step: int = 0
    address: str | None = None
    ts: float = 0.0
    stage: str = "train"
    steps_per_epoch: int = 0  # from the peer's data partition (all peers must agree)
    fingerprint: str = ""  # model fingerprint (parameter names, shapes, dtypes)
    reason: str = ""  # why a peer failed

    def validate(self) -> None:
        _nonneg("peer", self.peer)
        _nonneg("step", self.step)
        _nonneg("steps_per_epoch", self.steps_per_epoch)
        _stage(self.stage)
        if self.state not in PEER_STATES:
            raise ValueError(f"state must be one of {', '.join(PEER_STATES)}; got {self.state!r}")


@dataclass(frozen=True)
class Presence(Message):
    """The orchestrator's presence: "online" once connected (retained, re-published after a
    reconnect), "offline" when it leaves — published by itself at the end of a run, by the
    broker (its Last-Will) when it crashes or its connection breaks."""

    KIND: ClassVar[str] = "orchestrator"
    state: str
    ts: float = 0.0
    reason: str = ""

    def validate(self) -> None:
        if self.state not in PRESENCE_STATES:
            raise ValueError(
                f"state must be one of {', '.join(PRESENCE_STATES)}; got {self.state!r}"
            )


@dataclass(frozen=True)
class Heartbeat(Message):
    KIND: ClassVar[str] = "heartbeat"
    peer: int
    step: int
    ts: float

    def validate(self) -> None:
        _nonneg("peer", self.peer)
        _nonneg("step", self.step)


@dataclass(frozen=True)
class Stats(Message):
    """A peer's scalars after gossip round ``round`` (1-based) of ``step``: every round of a
    controlled step (consensus control), the step's last round of every step of an
    ``ada-feedback`` run (graph feedback; the orchestrator routes it by the step's phase)."""

    KIND: ClassVar[str] = "stats"
    peer: int
    step: int
    round: int
    theta: float  # θ_i = ‖x_i(after) − x_i(before)‖²
    grad_norm: float  # ‖g_i‖ of this step
    bytes_sent: int = 0
    stage: str = "train"

    def validate(self) -> None:
        _stage(self.stage)
        _nonneg("peer", self.peer)
        _nonneg("step", self.step)
        if self.round < 1:
            raise ValueError(f"round is 1-based; got {self.round}")
        _finite_nonneg("theta", self.theta)
        _finite_nonneg("grad_norm", self.grad_norm)
        _nonneg("bytes_sent", self.bytes_sent)


@dataclass(frozen=True)
class Decision(Message):
    """Barrier mode: repeat/stop after ``round`` of ``step``. Lagged mode: only the decision closing
    ``step`` is published, its ``rounds_next`` = the rounds of step ``step + control.lag`` (the
    lag is part of the run's config, which every peer has)."""

    KIND: ClassVar[str] = "decision"
    step: int
    round: int
    repeat: bool
    target: float | None = None
    statistic: float | None = None
    rounds_next: int | None = None
    reason: str = ""

    def validate(self) -> None:
        _nonneg("step", self.step)
        _nonneg("round", self.round)
        if self.target is not None:
            _finite_nonneg("target", self.target)
        if self.statistic is not None:
            _finite_nonneg("statistic", self.statistic)
        if self.rounds_next is not None and self.rounds_next < 1:
            raise ValueError(f"rounds_next must be ≥ 1; got {self.rounds_next}")


@dataclass(frozen=True)
class Metrics(Message):
    """A peer's record of one training step (``event`` "step") or evaluation ("eval"). In a
    lagged-control step it also carries the step's per-round `Stats` (``stats``): nothing is
    decided before the step's last round, so they travel with the step's record — one message
    per peer and step, the same as without control."""

    KIND: ClassVar[str] = "metrics"
    peer: int
    step: int
    values: dict[str, float] = field(default_factory=dict)
    event: str = "step"  # "step" (training step record) or "eval" (evaluation of the replica)
    stats: list[Stats] = field(default_factory=list)  # lagged control: this step's rounds

    def validate(self) -> None:
        _nonneg("peer", self.peer)
        _nonneg("step", self.step)
        if self.event not in ("step", "eval"):
            raise ValueError(f"event must be 'step' or 'eval'; got {self.event!r}")
        for key, value in self.values.items():
            if not isinstance(key, str) or not _is_number(value):
                raise ValueError(f"values must map names to numbers; got {key!r}: {value!r}")
        if self.stats and self.event != "step":
            raise ValueError("stats ride only on a step record (event 'step')")
        for i, s in enumerate(self.stats):
            if not isinstance(s, Stats):
                raise ValueError(f"stats[{i}] must be a stats map; got {s!r}")
            s.validate()
            if (s.peer, s.step) != (self.peer, self.step):
                raise ValueError(
                    f"stats[{i}] is for peer {s.peer} step {s.step}, "
                    f"not this record's peer {self.peer} step {self.step}"
                )
            if s.round != i + 1:
                raise ValueError(f"stats[{i}] has round {s.round}; rounds go 1, 2, … in order")


MESSAGES: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (Schedule, Plan, RunControl, Status, Presence, Heartbeat, Stats, Decision, Metrics)
}


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _nonneg(name: str, v: int) -> None:
    if v < 0:
        raise ValueError(f"{name} must be ≥ 0; got {v}")


def _stage(v: str) -> None:
    if v not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}; got {v!r}")


def _finite_nonneg(name: str, v: float) -> None:
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be a finite number ≥ 0; got {v}")


# ---------------------------------------------------------------------------------------------
# Topics


@dataclass(frozen=True)
class TopicSpec:
    kind: str
    qos: int
    retain: bool
    per_peer: bool


TOPICS: dict[str, TopicSpec] = {
    "schedule": TopicSpec("schedule", 1, True, False),
    "plan": TopicSpec("plan", 1, True, False),
    "control": TopicSpec("control", 1, True, False),
    "status": TopicSpec("status", 1, True, True),
    "orchestrator": TopicSpec("orchestrator", 1, True, False),
    "heartbeat": TopicSpec("heartbeat", 0, False, True),
    "stats": TopicSpec("stats", 0, False, True),
    "decision": TopicSpec("decision", 0, False, False),
    "metrics": TopicSpec("metrics", 0, False, True),
}


class Topics:
    """Topic names of one run."""

    def __init__(self, run: str) -> None:
        if not _RUN_ID.match(run):
            raise ValueError(
                f"run id {run!r} must be 1–64 characters of letters, digits, '_', '.', '-' "
                "(it becomes an MQTT topic level)"
            )
        self.run = run
        self.base = f"{ROOT}/{run}"

    def topic(self, kind: str, peer: int | None = None) -> str:
        spec = TOPICS[kind]
        if spec.per_peer != (peer is not None):
            raise ValueError(f"topic {kind!r} {'needs' if spec.per_peer else 'takes no'} peer id")
        return f"{self.base}/{kind}" + (f"/{peer}" if peer is not None else "")

    def wildcard(self, kind: str) -> str:
        """Subscription filter: ``…/stats/+`` for per-peer topics, the topic itself otherwise."""
        return f"{self.base}/{kind}" + ("/+" if TOPICS[kind].per_peer else "")

    def all(self) -> str:
        return f"{self.base}/#"

    def parse(self, topic: str) -> tuple[str, int | None]:
        """``concord/v1/<run>/stats/3`` → ("stats", 3); PayloadError for foreign topics."""
        prefix = self.base + "/"
        if not topic.startswith(prefix):
            raise PayloadError(topic, f"not a topic of run {self.run!r}")
        parts = topic[len(prefix) :].split("/")
        spec = TOPICS.get(parts[0])
        if spec is None:
            raise PayloadError(topic, f"unknown topic {parts[0]!r}; known: {', '.join(TOPICS)}")
        if spec.per_peer:
            if len(parts) != 2 or not parts[1].isdigit():
                raise PayloadError(topic, f"expected {spec.kind}/<peer id>")
            return spec.kind, int(parts[1])
        if len(parts) != 1:
            raise PayloadError(topic, f"unexpected sub-topic after {spec.kind!r}")
        return spec.kind, None


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(message: Message) -> bytes:
    """msgpack map {"v": SCHEMA_VERSION, "kind": KIND, **fields} (validated first)."""
    try:
        message.validate()
    except ValueError as exc:
        raise PayloadError(message.KIND, str(exc)) from None
    payload = {"v": SCHEMA_VERSION, "kind": message.KIND, **asdict(message)}
    packed: bytes = msgpack.packb(payload, use_bin_type=True)
    return packed


M = TypeVar("M", bound=Message)


def decode(topic: str, payload: bytes, expect: type[M] | None = None) -> Message:
    """Validate ``payload`` received on ``topic``; `PayloadError` says exactly what is wrong."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise PayloadError(topic, f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        data = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise PayloadError(topic, f"not a msgpack map ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict):
        raise PayloadError(topic, f"payload must be a msgpack map, got {type(data).__name__}")
    version = data.pop("v", None)
    if version != SCHEMA_VERSION:
        raise PayloadError(
            topic,
            f"schema version {version!r} is not supported (this build speaks {SCHEMA_VERSION})",
        )
    kind = data.pop("kind", None)
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise PayloadError(topic, f"unknown kind {kind!r}")
    if expect is not None and cls is not expect:
        raise PayloadError(topic, f"expected a {expect.KIND!r} message, got {kind!r}")
    return _build(topic, cls, data)


def _build(topic: str, cls: type[Message], data: Mapping[str, Any]) -> Message:
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise PayloadError(topic, f"unknown field(s) {', '.join(unknown)} in {cls.KIND!r}")
    for name, f in names.items():
        if name not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise PayloadError(topic, f"{cls.KIND}.{name} is missing")
            continue
        check = _CHECKS.get(str(f.type))
        if check is not None and not check(data[name]):
            raise PayloadError(topic, f"{cls.KIND}.{name} must be {f.type}; got {data[name]!r}")
    values = dict(data)
    for name, inner in _NESTED.get(cls.KIND, {}).items():
        if name in values:
            values[name] = [
                _nested(topic, f"{cls.KIND}.{name}[{i}]", inner, item)
                for i, item in enumerate(values[name])
            ]
    try:
        message = cls(**values)
        message.validate()
    except (TypeError, ValueError) as exc:
        raise PayloadError(topic, f"{cls.KIND}: {exc}") from None
    return message


def _nested(topic: str, where: str, cls: type[Message], item: Mapping[str, Any]) -> Message:
    """A message embedded in another (a map without ``v``/``kind``); errors name its place."""
    try:
        return _build(topic, cls, item)
    except PayloadError as exc:
        raise PayloadError(topic, f"{where}: {exc.problem}") from None


# fields holding lists of embedded messages, per kind
_NESTED: dict[str, dict[str, type[Message]]] = {"metrics": {"stats": Stats}}


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_CHECKS: dict[str, Callable[[object], bool]] = {
    "int": _is_int,
    "float": _is_number,
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "str | None": lambda v: v is None or isinstance(v, str),
    "float | None": lambda v: v is None or _is_number(v),
    "int | None": lambda v: v is None or _is_int(v),
    "list[int]": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "list[dict[str, Any]]": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "dict[str, Any]": lambda v: isinstance(v, dict),
    "dict[str, float]": lambda v: isinstance(v, dict),
    "list[Stats]": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
}
