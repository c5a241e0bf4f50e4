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

The declared field types and their constraints are `concord.protos.fields`; the base class
`Message`, validation and the wording of a refused payload are `concord.protos.validation`. Every
public name of the contract is importable from here (``__all__``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

import msgpack
from pydantic import Field, Strict, model_validator

from concord.errors import PayloadError
from concord.protos.fields import (
    EVENTS,
    MAX_ROUNDS,
    PEER_STATES,
    PRESENCE_STATES,
    RUN_ACTIONS,
    STAGES,
    Address,
    Bool,
    FiniteNonNeg,
    Float,
    HostPort,
    Int,
    NonNeg,
    OneOf,
    PeerState,
    PhaseEntry,
    PhaseTopology,
    PresenceState,
    Round,
    RunAction,
    Says,
    Shaped,
    Stage,
    StageName,
    Str,
)
from concord.protos.validation import M, Message, adapter, check, layout

# the contract's public names (the field vocabulary and the base class live in
# `concord.protos.fields` and `concord.protos.validation`; they are imported from here)
__all__ = [
    "EVENTS",
    "MAX_PAYLOAD_BYTES",
    "MAX_ROUNDS",
    "MESSAGES",
    "PEER_STATES",
    "PRESENCE_STATES",
    "ROOT",
    "RUN_ACTIONS",
    "SCHEMA_VERSION",
    "SIGNED_KIND",
    "STAGES",
    "TOPICS",
    "Decision",
    "Heartbeat",
    "HostPort",
    "Message",
    "Metrics",
    "OneOf",
    "PayloadError",
    "PeerState",
    "PhaseTopology",
    "Plan",
    "Presence",
    "PresenceState",
    "RunAction",
    "RunControl",
    "Says",
    "Schedule",
    "Shaped",
    "Stage",
    "Stats",
    "Status",
    "TopicSpec",
    "Topics",
    "decode",
    "encode",
    "message_schemas",
]

MAX_SKETCH = 1024  # floats in a `Stats.sketch` (the sketch has `SKETCH_SIZE` = 64 of them)
_FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
SCHEMA_VERSION = 2  # 2: Metrics.stats (lagged statistics ride on the step record), Presence
ROOT = "concord/v1"
MAX_PAYLOAD_BYTES = 256 * 1024  # control messages are small; anything bigger is rejected
SIGNED_KIND = "signed"  # the kind of a signed envelope (`concord.protos.signing`)
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# a peer id level: ASCII digits only (str.isdigit also takes "²", which int() refuses), few
# enough for int() (a 5,000-digit level exceeds its digit limit)
_PEER_LEVEL = re.compile(r"[0-9]{1,9}")


# ---------------------------------------------------------------------------------------------
# Payload schemas (the field types: `concord.protos.fields`; the base class, validation and the
# wording of a refusal: `concord.protos.validation`)


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
    # control statistic "sketch" only: s_i = S_t x_i after the round (`concord.core.control.sketch`,
    # k floats); empty otherwise. Optional with a default: schema 2 payloads without it still decode
    sketch: Annotated[list[_FiniteFloat], Field(max_length=MAX_SKETCH)] = field(
        default_factory=list
    )


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


def message_schemas() -> dict[str, dict[str, Any]]:
    """The JSON Schema of every payload, by kind: the wire map, ``v`` and ``kind`` included."""
    out: dict[str, dict[str, Any]] = {}
    for kind, cls in MESSAGES.items():
        schema = adapter(cls).json_schema()
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


# fields added within a schema version, left off the wire while empty: a decoder of the same
# version without them (which refuses unknown fields) still reads every message that does not
# use them — `Stats.sketch` is sent only by runs with control.statistic "sketch"
_OMIT_WHEN_EMPTY: dict[str, tuple[str, ...]] = {"stats": ("sketch",)}


def _to_map(message: Message) -> dict[str, Any]:
    """The message's fields in declaration order, embedded messages as maps (what
    `dataclasses.asdict` gives for a validated message, without copying every container)."""
    shape = layout(type(message))
    omit = _OMIT_WHEN_EMPTY.get(message.KIND, ())
    out = {
        name: getattr(message, name)
        for name in shape.names
        if not (name in omit and not getattr(message, name))
    }
    for name in shape.embedded:
        out[name] = [_to_map(m) if isinstance(m, Message) else m for m in out[name]]
    return out


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
    message = check(cls, data, topic)
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
