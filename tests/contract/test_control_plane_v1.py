"""The control-plane schema fields added for stages, membership repair and evaluation records:
round trips, defaults for payloads written without them, and specific rejections."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import msgpack
import pytest

from concord.protos.control_plane import (
    SCHEMA_VERSION,
    TOPICS,
    Message,
    Metrics,
    PayloadError,
    RunControl,
    Schedule,
    Stats,
    Status,
    Topics,
    decode,
    encode,
)

TOPICS_ = Topics("run-v1")


def topic_of(message: Message) -> str:
    kind = message.KIND
    peer = getattr(message, "peer", None) if TOPICS[kind].per_peer else None
    return TOPICS_.topic(kind, peer)


def schedule(**kw: Any) -> Schedule:
    base: dict[str, Any] = {
        "version": 4,
        "peers": [0, 1, 2, 4],
        "topology": "ring",
        "weights": None,
        "kappa": 1.0,
        "seed": 0,
        "phases": [{"index": 1, "topology": None}],
    }
    base.update(kw)
    return Schedule(**base)


def raw(kind: str, **fields: Any) -> bytes:
    """A hand-made payload (bypasses `encode`'s validation, as a foreign writer would)."""
    return msgpack.packb({"v": SCHEMA_VERSION, "kind": kind, **fields}, use_bin_type=True)


def raw_of(message: Message, **changes: Any) -> bytes:
    data = msgpack.unpackb(encode(message), raw=False)
    data.update(changes)
    return msgpack.packb(data, use_bin_type=True)


NEW_FIELDS = [
    schedule(
        addresses=["127.0.0.1:50051", "10.0.0.2:6000", "peer-2.local:7000", "[::1]:65535"],
        effective_step=120,
        reason="peer 3 left (silent for 6.2 s)",
    ),
    schedule(  # an ada-feedback decision point: the graph per phase and the decision's step
        phases=[{"index": 1, "topology": "exponential:3"}, {"index": 2, "topology": "ring"}],
        effective_step=21,
        decided_at=19,
        reason="ada-feedback step 19: K 2 -> 3 (denser)",
    ),
    RunControl(action="start", stage="calibrate", steps=40, step_base=0, ts=1.0),
    RunControl(action="start", stage="train", steps=0, step_base=40),
    RunControl(action="stop", reason="run finished"),
    Status(
        peer=3,
        state="ready",
        stage="calibrate",
        steps_per_epoch=125,
        fingerprint="sha256:0123abcd",
        address="127.0.0.1:5003",
    ),
    Status(peer=1, state="failed", reason="CUDA out of memory", stage="train"),
    Stats(peer=2, step=7, round=1, theta=0.5, grad_norm=1.25, stage="calibrate"),
    Metrics(peer=0, step=99, values={"accuracy": 0.875, "loss": 0.5}, event="eval"),
    Metrics(peer=0, step=99, values={"loss": 0.5}, event="step"),
]


@pytest.mark.parametrize("message", NEW_FIELDS, ids=lambda m: f"{m.KIND}")
def test_new_fields_round_trip(message: Message) -> None:
    decoded = decode(topic_of(message), encode(message), type(message))
    assert decoded == message
    assert type(decoded) is type(message)


def test_payloads_without_the_new_fields_get_their_defaults() -> None:
    """A writer that does not know the new fields (same schema version) is still understood."""
    s = decode(
        TOPICS_.topic("schedule"),
        raw(
            "schedule",
            version=1,
            peers=[0, 1],
            topology="ring",
            weights=None,
            kappa=1.0,
            seed=0,
            phases=[],
        ),
    )
    assert isinstance(s, Schedule)
    assert (s.addresses, s.effective_step, s.decided_at) == ([], 0, None)
    c = decode(TOPICS_.topic("control"), raw("control", action="start"))
    assert isinstance(c, RunControl)
    assert (c.stage, c.steps, c.step_base) == ("train", 0, 0)
    st = decode(TOPICS_.topic("status", 1), raw("status", peer=1, state="ready"))
    assert isinstance(st, Status)
    assert (st.stage, st.steps_per_epoch, st.fingerprint, st.reason) == ("train", 0, "", "")
    stats = decode(
        TOPICS_.topic("stats", 1),
        raw("stats", peer=1, step=0, round=1, theta=0.0, grad_norm=0.0),
    )
    assert isinstance(stats, Stats)
    assert stats.stage == "train"
    m = decode(TOPICS_.topic("metrics", 1), raw("metrics", peer=1, step=0))
    assert isinstance(m, Metrics)
    assert (m.event, m.values) == ("step", {})


# -- rejections: encode refuses to send, decode refuses to accept -------------------------------

INVALID: list[tuple[str, Message, str]] = [
    ("addresses-length", schedule(addresses=["127.0.0.1:1", "127.0.0.1:2"]), r"addresses lists 2"),
    ("address-no-port", schedule(peers=[0], addresses=["localhost"]), r"addresses\[0\]"),
    ("address-port-0", schedule(peers=[0], addresses=["localhost:0"]), r"addresses\[0\]"),
    ("address-port-big", schedule(peers=[0], addresses=["h:65536"]), r"addresses\[0\]"),
    ("address-no-host", schedule(peers=[0], addresses=[":5000"]), r"addresses\[0\]"),
    ("address-bad-port", schedule(peers=[0, 1], addresses=["h:1", "h:x1"]), r"addresses\[1\]"),
    ("negative-effective-step", schedule(effective_step=-1), r"effective_step"),
    ("negative-decided-at", schedule(decided_at=-1), r"decided_at"),
    ("empty-peers", schedule(peers=[]), r"peers must list at least one"),
    ("control-stage", RunControl(action="start", stage="warmup"), r"stage.*'warmup'"),
    ("control-step-base", RunControl(action="start", step_base=-5), r"step_base"),
    ("control-steps", RunControl(action="start", steps=-1), r"steps must be"),
    ("status-stage", Status(peer=0, state="ready", stage="eval"), r"stage.*'eval'"),
    ("status-spe", Status(peer=0, state="ready", steps_per_epoch=-1), r"steps_per_epoch"),
    (
        "stats-stage",
        Stats(peer=0, step=0, round=1, theta=0.0, grad_norm=0.0, stage="x"),
        r"stage.*'x'",
    ),
    ("metrics-event", Metrics(peer=0, step=0, event="epoch"), r"event.*'epoch'"),
]


@pytest.mark.parametrize(
    ("message", "field"), [(m, f) for _, m, f in INVALID], ids=[i for i, _, _ in INVALID]
)
def test_invalid_new_fields_are_rejected_with_the_field_name(message: Message, field: str) -> None:
    with pytest.raises(PayloadError, match=field) as sent:
        encode(message)
    assert sent.value.topic == message.KIND
    # the same message from a foreign writer is rejected on receipt, naming the field
    payload = raw(message.KIND, **asdict(message))
    topic = topic_of(message)
    with pytest.raises(PayloadError, match=field) as got:
        decode(topic, payload)
    assert got.value.topic == topic
    assert message.KIND in got.value.problem


@pytest.mark.parametrize(
    ("message", "changes", "field"),
    [
        (schedule(), {"addresses": "127.0.0.1:1"}, "schedule.addresses"),
        (schedule(), {"addresses": [5000]}, "schedule.addresses"),
        (schedule(), {"effective_step": 1.5}, "schedule.effective_step"),
        (schedule(), {"decided_at": "19"}, "schedule.decided_at"),
        (RunControl(action="start"), {"stage": 1}, "control.stage"),
        (RunControl(action="start"), {"step_base": "0"}, "control.step_base"),
        (RunControl(action="start"), {"steps": True}, "control.steps"),
        (Status(peer=0, state="ready"), {"fingerprint": None}, "status.fingerprint"),
        (Status(peer=0, state="ready"), {"steps_per_epoch": 1.0}, "status.steps_per_epoch"),
        (Metrics(peer=0, step=0), {"event": None}, "metrics.event"),
    ],
)
def test_wrong_types_of_new_fields_are_rejected(
    message: Message, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(PayloadError, match=field.replace(".", r"\.")):
        decode(topic_of(message), raw_of(message, **changes))


def test_stage_names_are_the_documented_ones() -> None:
    for stage in ("calibrate", "train"):
        for message in (
            RunControl(action="start", stage=stage),
            Status(peer=0, state="done", stage=stage),
            Stats(peer=0, step=0, round=1, theta=0.0, grad_norm=0.0, stage=stage),
        ):
            assert decode(topic_of(message), encode(message)) == message
