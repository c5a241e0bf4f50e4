"""The MQTT control-plane contract: topic names, round trips, and specific rejections."""

from __future__ import annotations

import dataclasses
import json
import math

import msgpack
import pytest

from concord.protos.control_plane import (
    MAX_PAYLOAD_BYTES,
    MAX_ROUNDS,
    MESSAGES,
    SCHEMA_VERSION,
    TOPICS,
    Decision,
    Heartbeat,
    Metrics,
    PayloadError,
    Plan,
    Presence,
    RunControl,
    Schedule,
    Stats,
    Status,
    Topics,
    decode,
    encode,
    message_schemas,
)

EXAMPLES = [
    Schedule(
        version=3,
        peers=[0, 1, 2, 4],
        topology="ring",
        weights=None,
        kappa=1.0,
        seed=0,
        phases=[{"index": 1, "topology": "ring"}, {"index": 2, "topology": None}],
        reason="peer 3 left",
    ),
    Plan(
        total_steps=100,
        phases={"version": 1, "phases": []},
        lr={"base_lr": 0.1},
        control={"mode": "adaptive"},
    ),
    RunControl(action="start", ts=1.5),
    Presence(state="offline", ts=4.0, reason="connection lost"),
    Status(peer=2, state="training", step=10, address="127.0.0.1:5000", ts=2.0),
    Heartbeat(peer=2, step=10, ts=3.0),
    Stats(peer=1, step=5, round=2, theta=0.25, grad_norm=1.5, bytes_sent=4096),
    Decision(step=5, round=2, repeat=True, target=0.1, statistic=0.3, reason="above-target"),
    Metrics(peer=1, step=5, values={"acc": 0.9}),
    Metrics(
        peer=1,
        step=5,
        values={"loss": 0.5},
        stats=[
            Stats(peer=1, step=5, round=1, theta=0.25, grad_norm=1.5, bytes_sent=4096),
            Stats(peer=1, step=5, round=2, theta=0.125, grad_norm=1.5, bytes_sent=8192),
        ],
    ),
]


def test_every_kind_has_a_topic_and_an_example() -> None:
    assert set(MESSAGES) == set(TOPICS)
    assert {m.KIND for m in EXAMPLES} == set(MESSAGES)


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: m.KIND)
def test_round_trip(message: object) -> None:
    topics = Topics("run-1")
    kind = message.KIND  # type: ignore[attr-defined]
    peer = getattr(message, "peer", None) if TOPICS[kind].per_peer else None
    topic = topics.topic(kind, peer)
    assert topic.startswith("concord/v1/run-1/")
    assert topics.parse(topic) == (kind, peer)
    assert decode(topic, encode(message)) == message  # type: ignore[arg-type]


def test_topic_names_and_qos_are_documented_values() -> None:
    t = Topics("r")
    assert t.topic("stats", 3) == "concord/v1/r/stats/3"
    assert t.wildcard("status") == "concord/v1/r/status/+"
    assert t.wildcard("decision") == "concord/v1/r/decision"
    assert TOPICS["schedule"].retain
    assert TOPICS["status"].retain
    assert TOPICS["plan"].retain
    assert not TOPICS["stats"].retain
    with pytest.raises(ValueError, match="run id"):
        Topics("a/b")
    with pytest.raises(PayloadError, match="unknown topic"):
        t.parse("concord/v1/r/gossip")
    with pytest.raises(PayloadError, match="not a topic of run"):
        t.parse("concord/v1/other/plan")
    with pytest.raises(PayloadError, match="peer id"):
        t.parse("concord/v1/r/stats/x")


def test_qos_and_retain_match_the_documented_table() -> None:
    """The contract's docstring table is the documentation users read: code must agree."""
    import concord.protos.control_plane as cp

    rows = {}
    for line in (cp.__doc__ or "").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("``"):
            name = cells[0].strip("`").split("/")[0]
            rows[name] = (cells[1], int(cells[2]), cells[3] == "yes")
    assert set(rows) == set(TOPICS)
    for name, spec in TOPICS.items():
        assert rows[name] == (MESSAGES[name].__name__, spec.qos, spec.retain), name
    # the state is reliable and retained; the per-step hot path is QoS 0 (docstring: why)
    state = {"schedule", "plan", "control", "status", "orchestrator"}
    assert {n for n, s in TOPICS.items() if s.qos == 1} == state


def _stats_map(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"peer": 1, "step": 5, "round": 1, "theta": 0.5, "grad_norm": 1.0}
    return {**base, **over}


@pytest.mark.parametrize(
    ("stats", "match"),
    [
        ([_stats_map(theta="x")], r"metrics.stats\[0\]: stats.theta must be float"),
        ([_stats_map(), _stats_map(round=2, grad_norm=-1.0)], r"grad_norm must be a finite"),
        ([_stats_map(peer=2)], "is for peer 2 step 5, not this record's peer 1 step 5"),
        ([_stats_map(step=4)], "is for peer 1 step 4"),
        ([_stats_map(round=2)], "rounds go 1, 2"),
        ([_stats_map(extra=1)], r"metrics.stats\[0\]: unknown field"),
        ([3], "metrics.stats must be list\\[Stats\\]"),
        ("x", "metrics.stats must be list"),
    ],
)
def test_metrics_with_bad_embedded_stats_are_rejected(stats: object, match: str) -> None:
    payload = _raw(v=SCHEMA_VERSION, kind="metrics", peer=1, step=5, values={}, stats=stats)
    with pytest.raises(PayloadError, match=match) as info:
        decode("concord/v1/r/metrics/1", payload)
    assert info.value.topic == "concord/v1/r/metrics/1"


def test_stats_ride_only_on_step_records() -> None:
    s = Stats(peer=1, step=5, round=1, theta=0.5, grad_norm=1.0)
    with pytest.raises(PayloadError, match="only on a step record"):
        encode(Metrics(peer=1, step=5, event="eval", stats=[s]))


def _raw(**fields: object) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\xc1garbage", "not a msgpack map"),
        (_raw(), "schema version None"),
        (msgpack.packb([1, 2]), "must be a msgpack map"),
        (
            _raw(v=SCHEMA_VERSION + 1, kind="stats"),
            f"schema version {SCHEMA_VERSION + 1} is not supported",
        ),
        (_raw(v=SCHEMA_VERSION - 1, kind="stats"), "this build speaks"),
        (_raw(v=SCHEMA_VERSION, kind="gossip"), "unknown kind 'gossip'"),
        (  # a constrained string says its pattern, not "must be str"
            _raw(
                v=SCHEMA_VERSION,
                kind="plan",
                total_steps=0,
                phases={},
                lr={},
                control={},
                store_prefix=":",
            ),
            r"plan: store_prefix must match '\^\[0-9a-f\]\{0,64\}\$'; got ':'",
        ),
        (
            _raw(v=SCHEMA_VERSION, kind="stats", peer=1, step=1, round=1, theta=0.1),
            "stats.grad_norm is missing",
        ),
        (
            _raw(v=SCHEMA_VERSION, kind="stats", peer=1, step=1, round=1, theta="x", grad_norm=1.0),
            "stats.theta must be float",
        ),
        (
            _raw(
                v=SCHEMA_VERSION, kind="stats", peer=1, step=1, round=1, theta=-1.0, grad_norm=1.0
            ),
            "theta must be a finite number",
        ),
        (
            _raw(
                v=SCHEMA_VERSION,
                kind="stats",
                peer=1,
                step=1,
                round=1,
                theta=math.nan,
                grad_norm=1.0,
            ),
            "theta must be a finite number",
        ),
        (
            _raw(v=SCHEMA_VERSION, kind="stats", peer=1, step=1, round=0, theta=1.0, grad_norm=1.0),
            "round is 1-based",
        ),
        (
            _raw(
                v=SCHEMA_VERSION, kind="stats", peer=True, step=1, round=1, theta=1.0, grad_norm=1.0
            ),
            "stats.peer must be int",
        ),
        (
            _raw(
                v=SCHEMA_VERSION,
                kind="stats",
                peer=1,
                step=1,
                round=1,
                theta=1.0,
                grad_norm=1.0,
                extra=1,
            ),
            "unknown field",
        ),
        (_raw(v=SCHEMA_VERSION, kind="status", peer=1, state="sleepy"), "state must be one of"),
        (_raw(v=SCHEMA_VERSION, kind="orchestrator", state="away"), "online, offline; got 'away'"),
        (b"\x00" * (300 * 1024), "exceeds"),
    ],
)
def test_malformed_payloads_are_rejected_with_specific_errors(payload: bytes, match: str) -> None:
    with pytest.raises(PayloadError, match=match) as info:
        decode("concord/v1/r/stats/1", payload)
    assert info.value.topic == "concord/v1/r/stats/1"


def test_wrong_kind_for_expected_type() -> None:
    with pytest.raises(PayloadError, match="expected a 'decision' message, got 'stats'"):
        decode("t", encode(next(m for m in EXAMPLES if isinstance(m, Stats))), expect=Decision)


def test_encode_refuses_invalid_messages() -> None:
    with pytest.raises(PayloadError, match="kappa"):
        encode(
            Schedule(
                version=0, peers=[0], topology="ring", weights=None, kappa=2.0, seed=0, phases=[]
            )
        )
    with pytest.raises(PayloadError, match="distinct"):
        encode(
            Schedule(
                version=0, peers=[0, 0], topology="ring", weights=None, kappa=1.0, seed=0, phases=[]
            )
        )


def test_encode_refuses_a_message_no_receiver_would_accept() -> None:
    """A sender learns at once that a message exceeds MAX_PAYLOAD_BYTES (receivers refuse it)."""
    with pytest.raises(PayloadError, match="bytes exceed the 262144 bytes") as info:
        encode(Status(peer=0, state="failed", reason="x" * MAX_PAYLOAD_BYTES))
    assert info.value.topic == "status"
    assert len(encode(Status(peer=0, state="failed", reason="x" * 1000))) < MAX_PAYLOAD_BYTES


# -- the schemas are the class declarations ------------------------------------------------------


def test_every_message_exports_its_json_schema() -> None:
    schemas = message_schemas()
    assert set(schemas) == set(MESSAGES)
    for kind, schema in schemas.items():
        cls = MESSAGES[kind]
        names = [f.name for f in dataclasses.fields(cls)]
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        assert schema["title"] == cls.__name__
        assert schema["additionalProperties"] is False, kind  # unknown fields are refused
        assert list(schema["properties"]) == ["v", "kind", *names], kind  # the wire map's keys
        assert schema["properties"]["v"]["const"] == SCHEMA_VERSION
        assert schema["properties"]["kind"]["const"] == kind
        assert schema["required"] == ["v", "kind", *required], kind
        json.dumps(schema)  # plain JSON, ready for the docs
    stats = schemas["stats"]["properties"]
    assert stats["round"] == {
        "minimum": 1,
        "maximum": MAX_ROUNDS,
        "title": "Round",
        "type": "integer",
    }
    assert stats["theta"]["minimum"] == 0
    assert stats["stage"]["enum"] == ["calibrate", "train"]
    assert schemas["status"]["properties"]["state"]["enum"][-1] == "offline"
    assert schemas["metrics"]["properties"]["stats"]["items"] == {"$ref": "#/$defs/Stats"}
    schedule = schemas["schedule"]["properties"]
    assert schedule["peers"]["minItems"] == 1
    assert schedule["peers"]["uniqueItems"]
    assert schedule["kappa"]["exclusiveMinimum"] == 0
    assert schedule["kappa"]["maximum"] == 1
    assert schedule["phases"]["items"]["required"] == ["index", "topology"]


def _sent_stats(s: Stats) -> dict[str, object]:
    """A `Stats` as sent: its fields, without an empty ``sketch`` (left off the wire)."""
    return {k: v for k, v in dataclasses.asdict(s).items() if k != "sketch" or v}


def test_wire_format_is_the_plain_field_map() -> None:
    """Valid messages encode to the msgpack map of their fields in declaration order, behind
    ``v`` and ``kind`` — byte for byte what peers and orchestrators of this schema version send."""
    s1 = Stats(peer=1, step=5, round=1, theta=0.25, grad_norm=1.5, bytes_sent=4096)
    s2 = Stats(peer=1, step=5, round=2, theta=0.125, grad_norm=1.5)
    fields_1 = {"peer": 1, "step": 5, "round": 1, "theta": 0.25, "grad_norm": 1.5}
    assert encode(s1) == _raw(
        v=SCHEMA_VERSION, kind="stats", **fields_1, bytes_sent=4096, stage="train"
    )
    m = Metrics(peer=1, step=5, values={"loss": 0.5}, stats=[s1, s2])
    assert encode(m) == _raw(
        v=SCHEMA_VERSION,
        kind="metrics",
        peer=1,
        step=5,
        values={"loss": 0.5},
        event="step",
        stats=[_sent_stats(s1), _sent_stats(s2)],
    )
    for message in EXAMPLES:
        body = msgpack.unpackb(encode(message), raw=False)
        fields = dataclasses.asdict(message)
        if isinstance(message, Stats | Metrics):  # an empty sketch is left off the wire
            fields = _sent_stats(message) if isinstance(message, Stats) else fields
            if isinstance(message, Metrics):
                fields["stats"] = [_sent_stats(s) for s in message.stats]
        assert body == {"v": SCHEMA_VERSION, "kind": message.KIND, **fields}


def test_constructing_does_not_validate_but_sending_does() -> None:
    bad = Stats(peer=0, step=0, round=1, theta=math.inf, grad_norm=0.0)
    with pytest.raises(PayloadError, match=r"theta must be a finite number ≥ 0; got inf") as info:
        bad.validate()
    assert (info.value.topic, info.value.problem) == (
        "stats",
        "theta must be a finite number ≥ 0; got inf",
    )
    with pytest.raises(PayloadError, match="theta"):
        encode(bad)
    Stats(peer=0, step=0, round=1, theta=0.0, grad_norm=0.0).validate()


def _forged(kind: str, **fields: object) -> bytes:
    return _raw(v=SCHEMA_VERSION, kind=kind, **fields)


_STATS = {"peer": 1, "step": 5, "round": 1, "theta": 0.5, "grad_norm": 1.0}
_DECISION = {"step": 5, "round": 1, "repeat": False}


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (
            _forged("stats", **_STATS, admin=True),
            "unknown field(s) admin in 'stats'",
        ),
        (
            _forged("decision", **_DECISION, zz=1, aa=2),
            "unknown field(s) aa, zz in 'decision'",
        ),
        (
            _forged("stats", **{**_STATS, "grad_norm": math.inf}),
            "stats: grad_norm must be a finite number ≥ 0; got inf",
        ),
        (
            _forged("decision", **_DECISION, statistic=math.nan),
            "decision: statistic must be a finite number ≥ 0; got nan",
        ),
        (
            _forged("decision", **_DECISION, target=-0.5),
            "decision: target must be a finite number ≥ 0; got -0.5",
        ),
        (
            _forged("stats", **{**_STATS, "peer": -3}),
            "stats: peer must be ≥ 0; got -3",
        ),
        (
            _forged("stats", **{**_STATS, "bytes_sent": -1}),
            "stats: bytes_sent must be ≥ 0; got -1",
        ),
        (
            _forged("stats", **{**_STATS, "round": 2**40}),
            f"stats: round is 1-based, at most {MAX_ROUNDS}; got {2**40}",
        ),
        (
            _forged("decision", **_DECISION, rounds_next=MAX_ROUNDS + 1),
            f"decision: rounds_next must be in [1, {MAX_ROUNDS}]; got {MAX_ROUNDS + 1}",
        ),
        (
            _forged("decision", **{**_DECISION, "round": 10**9}),
            f"decision: round must be in [0, {MAX_ROUNDS}]; got {10**9}",
        ),
        (
            _forged("decision", **{**_DECISION, "repeat": 1}),
            "decision.repeat must be bool; got 1",
        ),
        (_forged("heartbeat", peer=1, step=2.0, ts=0.0), "heartbeat.step must be int; got 2.0"),
        (_forged("heartbeat", peer="1", step=2, ts=0.0), "heartbeat.peer must be int; got '1'"),
        (_forged("heartbeat", peer=1, step=2, ts="now"), "heartbeat.ts must be float; got 'now'"),
        (
            _forged("metrics", peer=1, step=5, values={"loss": "low"}),
            "metrics.values must be dict[str, float]; got {'loss': 'low'}",
        ),
        (
            _forged("metrics", peer=1, step=5, stats=[{**_STATS, "theta": math.nan}]),
            "metrics.stats[0]: stats: theta must be a finite number ≥ 0; got nan",
        ),
        (
            _forged("metrics", peer=1, step=5, stats=[{**_STATS, "round": 0}]),
            f"metrics.stats[0]: stats: round is 1-based, at most {MAX_ROUNDS}; got 0",
        ),
        (
            _forged(
                "schedule",
                version=1,
                peers=[0, -1],
                topology="ring",
                weights=None,
                kappa=1.0,
                seed=0,
                phases=[],
            ),
            "schedule: peers[1] must be ≥ 0; got -1",
        ),
        (
            _forged(
                "schedule",
                version=1,
                peers=[0],
                topology="ring",
                weights=None,
                kappa=1.0,
                seed=0,
                phases=[{"index": 1, "topology": "ring", "extra": 1}],
            ),
            "schedule: phases[0] must be {index: int ≥ 0, topology: str | None}; "
            "got {'index': 1, 'topology': 'ring', 'extra': 1}",
        ),
        (
            _forged("plan", total_steps=10, phases={}, lr={}, control=[]),
            "plan.control must be dict[str, Any]; got []",
        ),
        (
            _forged("control", action="restart"),
            "control: action must be one of start, stop; got 'restart'",
        ),
        (
            _forged("metrics", peer=1, step=5, event="epoch"),
            "metrics: event must be one of step, eval; got 'epoch'",
        ),
        (_forged("presence"), "unknown kind 'presence'"),
    ],
)
def test_forged_messages_are_refused_with_a_clear_problem(payload: bytes, problem: str) -> None:
    with pytest.raises(PayloadError) as info:
        decode("concord/v1/r/x", payload)
    assert info.value.problem == problem
    assert info.value.topic == "concord/v1/r/x"


def test_bytes_and_non_string_keys_are_refused() -> None:
    with pytest.raises(PayloadError, match="not a msgpack map"):
        decode("t", _forged("presence", state=b"online"))
    with pytest.raises(PayloadError, match="not a msgpack map"):
        decode("t", msgpack.packb({"v": SCHEMA_VERSION, 1: "x"}))


def test_decoded_numbers_keep_their_declared_types() -> None:
    """An int is a valid float on the wire (a foreign writer's ``0``); it arrives as a float."""
    s = decode("t", _forged("stats", **{**_STATS, "theta": 0, "grad_norm": 2}))
    assert isinstance(s, Stats)
    assert (s.theta, s.grad_norm) == (0.0, 2.0)
    assert isinstance(s.theta, float)
    m = decode("t", _forged("metrics", peer=1, step=5, values={"loss": math.nan}))
    assert isinstance(m, Metrics)
    assert math.isnan(m.values["loss"])
