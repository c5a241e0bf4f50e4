"""The minimal inputs of what the fuzzers found, kept as plain regression tests."""

from __future__ import annotations

import msgpack
import pytest
import torch

from concord.core.compress import Encoded, make_codec
from concord.protos.control_plane import SCHEMA_VERSION, PayloadError, Topics, decode


@pytest.mark.parametrize("level", ["²", "٣", "7" * 5000])
def test_a_peer_id_level_that_is_no_ascii_number_is_refused(level: str) -> None:
    """``str.isdigit`` took "²" (int() refuses it) and a 5,000-digit level (beyond int()'s digit
    limit): a ValueError escaped `Topics.parse`, which the MQTT bus does not catch."""
    with pytest.raises(PayloadError, match="expected heartbeat/<peer id>"):
        Topics("r").parse(f"concord/v1/r/heartbeat/{level}")


def test_a_payload_of_another_kind_than_its_topic_is_refused() -> None:
    """A valid RunControl published on the decision topic decoded as a RunControl (the bus passes
    the topic's kind and the message to its handler separately)."""
    payload = msgpack.packb({"v": SCHEMA_VERSION, "kind": "control", "action": "start"})
    with pytest.raises(PayloadError, match="a 'control' message on a 'decision' topic"):
        decode("concord/v1/r/decision", payload)
    assert decode("concord/v1/r/control", payload).KIND == "control"


def test_qsgd_encodes_a_large_finite_vector_with_a_finite_scale() -> None:
    """Found by the ``receive`` target: QSGD squares the float32 input before summing in float64,
    so |x| ≳ 1.8e19 overflows the norm to inf; the receiver then rejects the sender's tensor
    (non-finite scale) — a valid vector does not round-trip."""
    codec = make_codec("qsgd", levels=2)
    x = torch.tensor([3.4486e29])
    parts = codec.encode(x, key=5).parts
    assert torch.isfinite(parts["scale"]).all(), f"scale {parts['scale']}"
    y = codec.decode(Encoded("qsgd", parts, 1), key=5)
    assert torch.isfinite(y).all()


def test_a_message_accepted_just_under_the_size_limit_is_not_re_sent_over_it() -> None:
    """A status of 262,094 bytes (under MAX_PAYLOAD_BYTES) decoded fine, but re-encoding it wrote
    out its omitted defaults and gave 262,194 bytes, which every receiver refuses; `encode` let it
    through. It now refuses with the size, as receivers would (found by bench/chaos.py's fuzz)."""
    from concord.protos.control_plane import MAX_PAYLOAD_BYTES, encode

    fields = {"v": SCHEMA_VERSION, "kind": "status", "peer": 0, "state": "failed"}
    payload = msgpack.packb({**fields, "reason": "x" * (MAX_PAYLOAD_BYTES - 100)})
    assert len(payload) <= MAX_PAYLOAD_BYTES
    message = decode("concord/v1/r/status/0", payload)
    with pytest.raises(PayloadError, match="bytes exceed the 262144 bytes every receiver accepts"):
        encode(message)
