"""The control-plane fields of per-run freshness and the torch store's secret prefix, added within
schema version 2 (tests/contract/test_control_plane_v1.py's rules): they round-trip, a payload
written without them gets their defaults, and bad values are refused with the field named."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from concord.protos.control_plane import (
    SCHEMA_VERSION,
    Decision,
    Message,
    PayloadError,
    Plan,
    Presence,
    RunControl,
    Schedule,
    Status,
    Topics,
    decode,
    encode,
)

TOPICS = Topics("fresh")
NONCE = "0123456789abcdef"


def _topic(message: Message) -> str:
    peer = getattr(message, "peer", None) if message.KIND in ("status",) else None
    return TOPICS.topic(message.KIND, peer)


MESSAGES = [
    Presence(state="online", ts=1.0, incarnation=NONCE, acks=["a1b2", "c3d4"]),
    Status(peer=2, state="ready", incarnation=NONCE, nonce="feedbeef"),
    RunControl(action="stop", incarnation=NONCE),
    Decision(step=3, round=1, repeat=False, incarnation=NONCE),
    Schedule(
        version=1,
        peers=[0, 1],
        topology="ring",
        weights=None,
        kappa=1.0,
        seed=0,
        phases=[],
        incarnation=NONCE,
    ),
    Plan(
        total_steps=10,
        phases={},
        lr={},
        control={},
        store="127.0.0.1:29500",
        store_prefix="ab" * 16,
        incarnation=NONCE,
    ),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.KIND)
def test_the_new_fields_round_trip(message: Message) -> None:
    assert decode(_topic(message), encode(message), type(message)) == message


def _raw(kind: str, **fields: Any) -> bytes:
    return msgpack.packb({"v": SCHEMA_VERSION, "kind": kind, **fields}, use_bin_type=True)


def test_payloads_without_them_get_their_defaults() -> None:
    p = decode(TOPICS.topic("orchestrator"), _raw("orchestrator", state="online"))
    assert isinstance(p, Presence)
    assert (p.incarnation, p.acks) == ("", [])
    s = decode(TOPICS.topic("status", 1), _raw("status", peer=1, state="ready"))
    assert isinstance(s, Status)
    assert (s.incarnation, s.nonce) == ("", "")
    plan = decode(TOPICS.topic("plan"), _raw("plan", total_steps=1, phases={}, lr={}, control={}))
    assert isinstance(plan, Plan)
    assert (plan.store_prefix, plan.incarnation) == ("", "")


@pytest.mark.parametrize(
    ("topic", "payload", "field"),
    [
        (TOPICS.topic("orchestrator"), _raw("orchestrator", state="online", acks="x"), "acks"),
        (TOPICS.topic("orchestrator"), _raw("orchestrator", state="online", incarnation=7),
         "incarnation"),
        (TOPICS.topic("plan"), _raw("plan", total_steps=1, phases={}, lr={}, control={},
                                    store_prefix="NOT-HEX"), "store_prefix"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_naming_the_field(topic: str, payload: bytes, field: str) -> None:
    with pytest.raises(PayloadError) as err:
        decode(topic, payload)
    assert field in err.value.problem
