"""The MQTT control-plane contract: topic names, round trips, and specific rejections."""

from __future__ import annotations

import math

import msgpack
import pytest

from concord.protos.control_plane import (
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
