"""The MQTT control-plane contract: topic names, round trips, and specific rejections."""

from __future__ import annotations

import math

import msgpack
import pytest

from protos.control_plane import (
    MESSAGES,
    SCHEMA_VERSION,
    TOPICS,
    Decision,
    Heartbeat,
    Metrics,
    PayloadError,
    Plan,
    RunControl,
    Schedule,
    Stats,
    Status,
    Topics,
    decode,
    encode,
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
    Status(peer=2, state="training", step=10, address="127.0.0.1:5000", ts=2.0),
    Heartbeat(peer=2, step=10, ts=3.0),
    Stats(peer=1, step=5, round=2, theta=0.25, grad_norm=1.5, bytes_sent=4096),
    Decision(step=5, round=2, repeat=True, target=0.1, statistic=0.3, reason="above-target"),
    Metrics(peer=1, step=5, values={"acc": 0.9}),
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
    assert TOPICS["stats"].qos == 1
    with pytest.raises(ValueError, match="run id"):
        Topics("a/b")
    with pytest.raises(PayloadError, match="unknown topic"):
        t.parse("concord/v1/r/gossip")
    with pytest.raises(PayloadError, match="not a topic of run"):
        t.parse("concord/v1/other/plan")
    with pytest.raises(PayloadError, match="peer id"):
        t.parse("concord/v1/r/stats/x")


def _raw(**fields: object) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"\xc1garbage", "not a msgpack map"),
        (_raw(), "schema version None"),
        (msgpack.packb([1, 2]), "must be a msgpack map"),
        (_raw(v=2, kind="stats"), "schema version 2 is not supported"),
        (_raw(v=SCHEMA_VERSION, kind="gossip"), "unknown kind 'gossip'"),
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
        (b"\x00" * (300 * 1024), "exceeds"),
    ],
)
def test_malformed_payloads_are_rejected_with_specific_errors(payload: bytes, match: str) -> None:
    with pytest.raises(PayloadError, match=match) as info:
        decode("concord/v1/r/stats/1", payload)
    assert info.value.topic == "concord/v1/r/stats/1"


def test_wrong_kind_for_expected_type() -> None:
    with pytest.raises(PayloadError, match="expected a 'decision' message, got 'stats'"):
        decode("t", encode(EXAMPLES[5]), expect=Decision)


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
