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

**Each payload's schema is its class declaration**: field types with their constraints (strict
scalars, bounds, finite statistics, allowed values; unknown fields refused), validated by pydantic.
`decode` is msgpack-unpack plus validation against that declaration, `encode` validates before it
packs, and `message_schemas` exports every payload's JSON Schema (for the documentation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import NoneType, UnionType
from typing import (
    Annotated,
    Any,
    ClassVar,
    Literal,
    NamedTuple,
    TypeAlias,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

import msgpack
from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    TypeAdapter,
    ValidationError,
    model_validator,
    with_config,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, ErrorDetails, core_schema
from typing_extensions import TypedDict

from concord.errors import PayloadError as PayloadError

SCHEMA_VERSION = 2  # 2: Metrics.stats (lagged statistics ride on the step record), Presence
ROOT = "concord/v1"
MAX_PAYLOAD_BYTES = 256 * 1024  # control messages are small; anything bigger is rejected
SIGNED_KIND = "signed"  # the kind of a signed envelope (`concord.protos.signing`)
MAX_ROUNDS = 10_000  # gossip rounds of one step: a round number beyond this is a forgery
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# a peer id level: ASCII digits only (str.isdigit also takes "²", which int() refuses), few
# enough for int() (a 5,000-digit level exceeds its digit limit)
_PEER_LEVEL = re.compile(r"[0-9]{1,9}")


# ---------------------------------------------------------------------------------------------
# Declared field types
#
# Every payload schema below is its class declaration: a frozen dataclass whose field types
# carry their constraints (pydantic validates them; type checkers see plain ``int``, ``str``, …).
# Scalars are strict — no ``"1"`` → 1, ``1.0`` → 1 or ``True`` → 1 coercions (an int is accepted
# for a float); unknown fields are refused. Invariants spanning fields are the classes'
# ``@model_validator`` methods. The messages are plain dataclasses, not pydantic models:
# constructing one does not validate (a sender may build a bad one), `encode` and `decode` do.

PeerState = Literal["starting", "ready", "training", "done", "failed", "offline"]
PEER_STATES: tuple[str, ...] = get_args(PeerState)
RunAction = Literal["start", "stop"]
RUN_ACTIONS: tuple[str, ...] = get_args(RunAction)
PresenceState = Literal["online", "offline"]
PRESENCE_STATES: tuple[str, ...] = get_args(PresenceState)
Stage = Literal["calibrate", "train"]
STAGES: tuple[str, ...] = get_args(Stage)
EVENTS: tuple[str, ...] = ("step", "eval")


@dataclass(frozen=True)
class Says:
    """How a constraint reads in an error: ``<field> <text>; got <value>`` (default: derived from
    the field's bounds, e.g. "must be ≥ 0")."""

    text: str


class _Check:
    """A constraint checked after the type (a ``value_error`` at the field's place); ``phrase``
    is its wording in errors, `json` what it adds to the field's JSON Schema."""

    def __init__(self, phrase: str) -> None:
        self.phrase = phrase

    def check(self, value: Any) -> bool:
        raise NotImplementedError

    def json(self) -> dict[str, Any]:
        return {}

    def _validate(self, value: Any) -> Any:
        if not self.check(value):
            raise ValueError(self.phrase)
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._validate, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(schema), **self.json()}


class OneOf(_Check):
    """A string out of ``values`` (an ``enum`` in the JSON Schema; ``str`` to type checkers, so
    senders may pass any ``str`` variable)."""

    def __init__(self, values: tuple[str, ...]) -> None:
        super().__init__(f"must be one of {', '.join(values)}")
        self.values = values

    def check(self, value: Any) -> bool:
        return value in self.values

    def json(self) -> dict[str, Any]:
        return {"enum": list(self.values)}


class HostPort(_Check):
    """``host:port`` with a port in 1–65535 (a gRPC address)."""

    def __init__(self) -> None:
        super().__init__("must be 'host:port' with a port in 1–65535")

    def check(self, value: Any) -> bool:
        host, sep, port = value.rpartition(":")
        return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)

    def json(self) -> dict[str, Any]:
        return {"pattern": r"^.+:[0-9]{1,5}$"}


@with_config(ConfigDict(extra="forbid"))
class PhaseTopology(TypedDict):
    """One entry of `Schedule.phases`: a phase and its topology (None: the run's topology)."""

    index: Annotated[int, Strict(), Field(ge=0)]
    topology: Annotated[str, Strict()] | None


class Shaped(_Check):
    """A map validated as a `TypedDict` (its JSON Schema), kept a plain ``dict`` in Python."""

    def __init__(self, shape: type, phrase: str) -> None:
        super().__init__(phrase)
        self.adapter: TypeAdapter[Any] = TypeAdapter(shape)

    def check(self, value: Any) -> bool:
        try:
            self.adapter.validate_python(value)
        except ValidationError:
            return False
        return True

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return self.adapter.json_schema()


Int: TypeAlias = Annotated[int, Strict()]
NonNeg: TypeAlias = Annotated[int, Strict(), Field(ge=0)]
Round: TypeAlias = Annotated[
    int, Strict(), Field(ge=1, le=MAX_ROUNDS), Says(f"is 1-based, at most {MAX_ROUNDS}")
]
Float: TypeAlias = Annotated[float, Strict()]
FiniteNonNeg: TypeAlias = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Str: TypeAlias = Annotated[str, Strict()]
Bool: TypeAlias = Annotated[bool, Strict()]
StageName: TypeAlias = Annotated[str, Strict(), OneOf(STAGES)]
Address: TypeAlias = Annotated[str, Strict(), HostPort()]
PhaseEntry: TypeAlias = Annotated[
    dict[Str, Any], Shaped(PhaseTopology, "must be {index: int ≥ 0, topology: str | None}")
]

# decoding: strict scalars in lax containers (a dict is accepted for an embedded message);
# encoding re-validates the message object itself
_CONFIG = ConfigDict(extra="forbid", revalidate_instances="always")


# ---------------------------------------------------------------------------------------------
# Payload schemas


@dataclass(frozen=True)
class Message:
    """Base of all payloads: ``KIND`` names the schema; subclasses declare their fields."""

    KIND: ClassVar[str] = ""
    __pydantic_config__: ClassVar[ConfigDict] = _CONFIG

    def validate(self) -> None:
        """Check the message against its schema; `PayloadError` (topic: the kind) if it fails."""
        try:
            _check(type(self), self, self.KIND)
        except PayloadError as exc:  # the topic names the kind already
            raise PayloadError(self.KIND, exc.problem.removeprefix(f"{self.KIND}: ")) from None


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
    version: NonNeg
    # ids of the live peers the topology is built over
    peers: Annotated[
        list[NonNeg],
        Field(min_length=1, json_schema_extra={"uniqueItems": True}),
        Says("must list at least one live peer"),
    ]
    topology: Str
    weights: Str | None
    kappa: Annotated[float, Strict(), Field(gt=0, le=1)]
    seed: Int
    phases: list[PhaseEntry]  # [{"index": k, "topology": name | None}]
    reason: Str = ""
    addresses: list[Address] = field(default_factory=list)  # gRPC host:port of peers[i]
    effective_step: NonNeg = 0  # peers switch to this schedule at the start of this step
    decided_at: NonNeg | None = None  # ada-feedback: the latest decision point it reflects
    # the orchestrator's incarnation (run nonce, `Presence.incarnation`): "" from a sender that
    # has none (schema 2 before it; peers then follow such a presence only)
    incarnation: Str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Schedule:
        if len(set(self.peers)) != len(self.peers):
            raise ValueError(f"peers must be distinct ids ≥ 0; got {self.peers}")
        if self.addresses and len(self.addresses) != len(self.peers):
            raise ValueError(
                f"addresses lists {len(self.addresses)} entries for {len(self.peers)} peers"
            )
        return self


@dataclass(frozen=True)
class Plan(Message):
    """The phase plan (`concord.core.control.plan.PhasePlan.to_dict`), LR schedule and control
    settings."""

    KIND: ClassVar[str] = "plan"
    total_steps: NonNeg
    phases: dict[Str, Any]
    lr: dict[Str, Any]
    control: dict[Str, Any]
    # network.transport = "torch": the torch.distributed TCPStore the orchestrator hosts, and
    # the per-run secret prefix of its keys ("": none, an older orchestrator)
    store: Address | None = None
    store_prefix: Annotated[str, Strict(), Field(pattern=r"^[0-9a-f]{0,64}$")] = ""
    # the orchestrator's incarnation (run nonce, `Presence.incarnation`): "" from a sender that
    # has none (schema 2 before it; peers then follow such a presence only)
    incarnation: Str = ""


@dataclass(frozen=True)
class RunControl(Message):
    """Start (or stop) a stage of the run; retained, so a late peer learns the current one."""

    KIND: ClassVar[str] = "control"
    action: Annotated[str, Strict(), OneOf(RUN_ACTIONS)]  # "start" | "stop"
    reason: Str = ""
    ts: Float = 0.0
    stage: StageName = "train"  # "calibrate": the uncontrolled pass of constant targets; "train"
    steps: NonNeg = 0  # steps to run in this stage (0: the whole plan)
    step_base: NonNeg = 0  # added to step numbers on the data plane (stages never reuse a step)
    # the orchestrator's incarnation (run nonce, `Presence.incarnation`): "" from a sender that
    # has none (schema 2 before it; peers then follow such a presence only)
    incarnation: Str = ""


@dataclass(frozen=True)
class Status(Message):
    """A peer's lifecycle state; retained, its Last-Will is state "offline"."""

    KIND: ClassVar[str] = "status"
    peer: NonNeg
    state: Annotated[str, Strict(), OneOf(PEER_STATES)]
    step: NonNeg = 0
    address: Str | None = None
    ts: Float = 0.0
    stage: StageName = "train"
    steps_per_epoch: NonNeg = 0  # from the peer's data partition (all peers must agree)
    fingerprint: Str = ""  # model fingerprint (parameter names, shapes, dtypes)
    reason: Str = ""  # why a peer failed
    # the orchestrator incarnation this peer follows ("": it holds no presence yet); the
    # orchestrator ignores a status stamped with another one (an earlier run's leftover)
    incarnation: Str = ""
    nonce: Str = ""  # a random nonce of this peer process, which the presence acknowledges


@dataclass(frozen=True)
class Presence(Message):
    """The orchestrator's presence: "online" once connected (retained, re-published after a
    reconnect), "offline" when it leaves — published by itself at the end of a run, by the
    broker (its Last-Will) when it crashes or its connection breaks."""

    KIND: ClassVar[str] = "orchestrator"
    state: Annotated[str, Strict(), OneOf(PRESENCE_STATES)]
    ts: Float = 0.0
    reason: Str = ""
    # a random nonce the orchestrator draws at start (one per incarnation of a run): every
    # schedule, plan, control and decision it publishes carries it, and peers act only on those
    # of the presence they follow, so nothing of an earlier run under the same id is obeyed
    incarnation: Str = ""
    # the nonces of the peers' latest statuses (`Status.nonce`, one per peer): a peer follows an
    # incarnation only once its presence acknowledges this peer process — proof that it is live
    # now, not a recording of an earlier run's
    acks: Annotated[list[Str], Field(max_length=100_000)] = field(default_factory=list)


@dataclass(frozen=True)
class Heartbeat(Message):
    """A peer's periodic sign of life, with the step it is at."""

    KIND: ClassVar[str] = "heartbeat"
    peer: NonNeg
    step: NonNeg
    ts: Float


@dataclass(frozen=True)
class Stats(Message):
    """A peer's scalars after gossip round ``round`` (1-based) of ``step``: every round of a
    controlled step (consensus control), the step's last round of every step of an
    ``ada-feedback`` run (graph feedback; the orchestrator routes it by the step's phase)."""

    KIND: ClassVar[str] = "stats"
    peer: NonNeg
    step: NonNeg
    round: Round
    theta: FiniteNonNeg  # θ_i = ‖x_i(after) − x_i(before)‖²
    grad_norm: FiniteNonNeg  # ‖g_i‖ of this step
    bytes_sent: NonNeg = 0
    stage: StageName = "train"


@dataclass(frozen=True)
class Decision(Message):
    """Barrier mode: repeat/stop after ``round`` of ``step``. Lagged mode: only the decision closing
    ``step`` is published, its ``rounds_next`` = the rounds of step ``step + control.lag`` (the
    lag is part of the run's config, which every peer has)."""

    KIND: ClassVar[str] = "decision"
    step: NonNeg
    round: Annotated[int, Strict(), Field(ge=0, le=MAX_ROUNDS)]
    repeat: Bool
    target: FiniteNonNeg | None = None
    statistic: FiniteNonNeg | None = None
    rounds_next: Annotated[int, Strict(), Field(ge=1, le=MAX_ROUNDS)] | None = None
    reason: Str = ""
    # the orchestrator's incarnation (run nonce, `Presence.incarnation`): "" from a sender that
    # has none (schema 2 before it; peers then follow such a presence only)
    incarnation: Str = ""


@dataclass(frozen=True)
class Metrics(Message):
    """A peer's record of one training step (``event`` "step") or evaluation ("eval"). In a
    lagged-control step it also carries the step's per-round `Stats` (``stats``): nothing is
    decided before the step's last round, so they travel with the step's record — one message
    per peer and step, the same as without control."""

    KIND: ClassVar[str] = "metrics"
    peer: NonNeg
    step: NonNeg
    values: dict[Str, Float] = field(default_factory=dict)  # NaN allowed: a diverged loss
    event: Annotated[str, Strict(), OneOf(EVENTS)] = "step"  # "step" record or "eval"uation
    stats: list[Stats] = field(default_factory=list)  # lagged control: this step's rounds

    @model_validator(mode="after")
    def _consistent(self) -> Metrics:
        if self.stats and self.event != "step":
            raise ValueError("stats ride only on a step record (event 'step')")
        for i, s in enumerate(self.stats):
            if (s.peer, s.step) != (self.peer, self.step):
                raise ValueError(
                    f"stats[{i}] is for peer {s.peer} step {s.step}, "
                    f"not this record's peer {self.peer} step {self.step}"
                )
            if s.round != i + 1:
                raise ValueError(f"stats[{i}] has round {s.round}; rounds go 1, 2, … in order")
        return self


MESSAGES: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (Schedule, Plan, RunControl, Status, Presence, Heartbeat, Stats, Decision, Metrics)
}
_ADAPTERS: dict[type[Message], TypeAdapter[Any]] = {
    cls: TypeAdapter(cls) for cls in MESSAGES.values()
}


def message_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of every payload, by kind: the wire map, ``v`` and ``kind`` included."""
    out: dict[str, dict[str, Any]] = {}
    for kind, cls in MESSAGES.items():
        schema = _ADAPTERS[cls].json_schema()
        schema["properties"] = {
            "v": {"const": SCHEMA_VERSION, "type": "integer", "title": "Schema version"},
            "kind": {"const": kind, "type": "string", "title": "Kind"},
            **schema["properties"],
        }
        schema["required"] = ["v", "kind", *schema.get("required", [])]
        out[kind] = schema
    return out


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
            if len(parts) != 2 or not _PEER_LEVEL.fullmatch(parts[1]):
                raise PayloadError(topic, f"expected {spec.kind}/<peer id>")
            return spec.kind, int(parts[1])
        if len(parts) != 1:
            raise PayloadError(topic, f"unexpected sub-topic after {spec.kind!r}")
        return spec.kind, None


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(message: Message) -> bytes:
    """msgpack map {"v": SCHEMA_VERSION, "kind": KIND, **fields} (validated first).

    `PayloadError` (topic: the kind) when it would exceed `MAX_PAYLOAD_BYTES`, which every
    receiver refuses (a received message just under the limit may re-encode a few bytes over
    it, its omitted defaults written out)."""
    message.validate()
    payload = {"v": SCHEMA_VERSION, "kind": message.KIND, **_to_map(message)}
    packed: bytes = msgpack.packb(payload, use_bin_type=True)
    if len(packed) > MAX_PAYLOAD_BYTES:
        raise PayloadError(
            message.KIND,
            f"{len(packed)} bytes exceed the {MAX_PAYLOAD_BYTES} bytes every receiver accepts",
        )
    return packed


def _to_map(message: Message) -> dict[str, Any]:
    """The message's fields in declaration order, embedded messages as maps (what
    `dataclasses.asdict` gives for a validated message, without copying every container)."""
    layout = _layout(type(message))
    out = {name: getattr(message, name) for name in layout.names}
    for name in layout.embedded:
        out[name] = [_to_map(m) if isinstance(m, Message) else m for m in out[name]]
    return out


M = TypeVar("M", bound=Message)


def decode(topic: str, payload: bytes, expect: type[M] | None = None) -> Message:
    """Validate ``payload`` received on ``topic``; `PayloadError` says exactly what is wrong. On
    a topic of the contract (``concord/v1/<run>/<topic>…``) the message must be of the kind that
    topic carries."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise PayloadError(topic, f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    try:
        data = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=0)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        if _is_envelope(payload):  # it holds bytes, which no message does
            raise PayloadError(
                topic,
                "a signed envelope, but this receiver has no run CA to verify it with (give it "
                "network.tls, or the sender network.tls.sign_control = false)",
            ) from None
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
    message = _check(cls, data, topic)
    carries = _topic_kind(topic)  # after the schema: a malformed message says what is wrong
    if carries is not None and carries != cls.KIND:
        raise PayloadError(topic, f"a {kind!r} message on a {carries!r} topic")
    return message


def _is_envelope(payload: bytes) -> bool:
    """Whether ``payload`` is a signed envelope (`concord.protos.signing`)."""
    try:
        data = msgpack.unpackb(payload, raw=False, max_bin_len=len(payload))
    except Exception:  # not even that
        return False
    return isinstance(data, dict) and data.get("kind") == SIGNED_KIND


def _topic_kind(topic: str) -> str | None:
    """The kind a topic of some run (``concord/v1/<run>/<topic>…``) carries; None for a topic
    outside the contract (its problems are `Topics.parse`'s)."""
    levels = topic.split("/")
    if len(levels) < 4 or "/".join(levels[:2]) != ROOT:
        return None
    spec = TOPICS.get(levels[3])
    return None if spec is None else spec.kind


def _check(cls: type[M], data: Any, topic: str) -> M:
    """Validate ``data`` (a map, or a message object) as a ``cls``; `PayloadError` otherwise."""
    try:
        message: M = _ADAPTERS[cls].validate_python(data)
    except ValidationError as exc:
        raise PayloadError(topic, _problem(cls, data, exc.errors(include_url=False))) from None
    return message


# ---------------------------------------------------------------------------------------------
# Validation errors → one specific problem, in the contract's words
#
# "stats.theta must be float; got 'x'" (a wrong type: the field and its declared type),
# "stats.grad_norm is missing", "unknown field(s) extra in 'stats'", "stats: theta must be a
# finite number ≥ 0; got nan" (a constraint), "metrics.stats[0]: …" (inside an embedded message).
# Several errors: unknown fields first, then missing ones, wrong types, broken constraints.

_UNKNOWN, _MISSING, _TYPE, _CONSTRAINT = range(4)
_NOT_TYPE_ERRORS = {
    "value_error",
    "assertion_error",
    "finite_number",
    "literal_error",
    "string_pattern_mismatch",
}


class _Found(NamedTuple):
    rank: int  # _UNKNOWN … _CONSTRAINT
    where: str  # "" or the embedded message's place, "metrics.stats[0]: "
    kind: str  # of the message it concerns
    text: str  # the problem (for an unknown field: its name)


def _problem(cls: type[Message], data: Any, errors: list[ErrorDetails]) -> str:
    found = [_describe(cls, data, e) for e in errors]
    first = min(found, key=lambda f: f.rank)  # min keeps the first of a rank: pydantic's order
    if first.rank != _UNKNOWN:
        return first.text
    names = sorted(f.text for f in found if f[:3] == first[:3])  # all of that message, at once
    return f"{first.where}unknown field(s) {', '.join(names)} in {first.kind!r}"


def _describe(cls: type[Message], data: Any, error: ErrorDetails) -> _Found:
    loc, kind, where = list(error["loc"]), error["type"], ""
    is_type = _is_type_error(kind)
    # descend into embedded messages (metrics.stats[i]) unless the item itself has a wrong type
    while len(loc) >= 2 and isinstance(loc[1], int) and not (len(loc) == 2 and is_type):
        inner = _layout(cls).embedded.get(str(loc[0]))
        if inner is None:
            break
        where += f"{cls.KIND}.{loc[0]}[{loc[1]}]: "
        data, cls, loc = _child(_child(data, loc[0]), loc[1]), inner, loc[2:]
    if not loc:  # an invariant across fields (a model validator)
        return _Found(_CONSTRAINT, where, cls.KIND, f"{where}{cls.KIND}: {_error_text(error)}")
    name = str(loc[0])
    if kind == "unexpected_keyword_argument" and len(loc) == 1:
        return _Found(_UNKNOWN, where, cls.KIND, name)
    if kind == "missing" and len(loc) == 1:
        return _Found(_MISSING, where, cls.KIND, f"{where}{cls.KIND}.{name} is missing")
    if is_type:  # the field and its declared type, whatever inside it is wrong
        shown = _layout(cls).type_names.get(name, "?")
        text = f"{where}{cls.KIND}.{name} must be {shown}; got {_child(data, name)!r}"
        return _Found(_TYPE, where, cls.KIND, text)
    place = name + "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for k in loc[1:])
    hint = _layout(cls).hints.get(name)
    phrase = (_phrase(hint, len(loc) - 1) if hint is not None else "") or _error_text(error)
    text = f"{where}{cls.KIND}: {place} {phrase}; got {error['input']!r}"
    return _Found(_CONSTRAINT, where, cls.KIND, text)


def _is_type_error(kind: str) -> bool:
    return kind not in _NOT_TYPE_ERRORS and not kind.startswith(("greater_", "less_", "too_"))


def _error_text(error: ErrorDetails) -> str:
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("error"), Exception):
        return str(ctx["error"])
    return error["msg"]


def _child(data: Any, key: str | int) -> Any:
    try:
        if isinstance(key, str) and not isinstance(data, Mapping):
            return getattr(data, key)
        return data[key]
    except (AttributeError, KeyError, IndexError, TypeError):
        return None


@dataclass(frozen=True)
class _Layout:
    """What encoding and error reporting need to know of a message class's declaration."""

    names: tuple[str, ...]  # the fields, in declaration (= wire) order
    hints: dict[str, Any]  # declared types, constraints included (``Annotated``)
    type_names: dict[str, str]  # as errors name them: "int", "float | None", "list[Stats]"
    embedded: dict[str, type[Message]]  # fields holding lists of embedded messages

    @classmethod
    def of(cls, message: type[Message]) -> _Layout:
        names = tuple(f.name for f in fields(message))
        extras = get_type_hints(message, include_extras=True)
        plain = get_type_hints(message)
        embedded = {}
        for name in names:
            args = get_args(plain[name])
            if get_origin(plain[name]) is list and _is_message_class(args[0]):
                embedded[name] = args[0]
        return cls(
            names,
            {n: extras[n] for n in names},
            {n: _type_name(plain[n]) for n in names},
            embedded,
        )


_LAYOUTS: dict[type[Message], _Layout] = {}


def _layout(cls: type[Message]) -> _Layout:
    layout = _LAYOUTS.get(cls)
    if layout is None:
        layout = _LAYOUTS[cls] = _Layout.of(cls)
    return layout


def _is_message_class(tp: object) -> bool:
    return isinstance(tp, type) and issubclass(tp, Message)


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _type_name(args[0])
    if origin in (Union, UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(_type_name(a) for a in args)}]"
    if tp is NoneType:
        return "None"
    return getattr(tp, "__name__", None) or str(tp).removeprefix("typing.")


def _phrase(tp: Any, depth: int) -> str:
    """The wording of the constraints declared ``depth`` levels into ``tp`` (0: on the field,
    1: on a list item or dict value, …)."""
    metadata: list[Any] = []
    while True:
        if get_origin(tp) is Annotated:
            tp, *meta = get_args(tp)
            metadata += meta
            continue
        if get_origin(tp) in (Union, UnionType):  # X | None: the constraints of X
            tp = next(a for a in get_args(tp) if a is not NoneType)
            continue
        if depth == 0:
            break
        args = get_args(tp)
        if not args:
            return ""
        tp, metadata, depth = args[-1], [], depth - 1
    return _wording(metadata)


def _wording(metadata: list[Any]) -> str:
    found: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, Says):
            return m.text
        if isinstance(m, _Check):
            return m.phrase
        for item in getattr(m, "metadata", [m]):  # Field(...) holds annotated-types objects
            for attr in ("ge", "gt", "le", "lt", "min_length", "allow_inf_nan", "pattern"):
                if getattr(item, attr, None) is not None:
                    found[attr] = getattr(item, attr)
    low = ("[", found["ge"]) if "ge" in found else ("(", found["gt"]) if "gt" in found else None
    high = ("]", found["le"]) if "le" in found else (")", found["lt"]) if "lt" in found else None
    finite = "a finite number " if found.get("allow_inf_nan") is False else ""
    if low and high:
        return f"must be {finite}in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"must be {finite}{'≥' if low[0] == '[' else '>'} {low[1]}"
    if high:
        return f"must be {finite}{'≤' if high[0] == ']' else '<'} {high[1]}"
    if "min_length" in found:
        return f"must have at least {found['min_length']} item(s)"
    if "pattern" in found:
        return f"must match {found['pattern']!r}"
    return f"must be {finite.strip()}" if finite else ""
