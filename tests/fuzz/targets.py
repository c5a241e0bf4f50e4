"""The fuzz targets: each runs one generated case through the code under test and checks its
properties. A target returns the case's outcome (``"ok"``, ``"late"``, ``"rejected"``); a
broken property is an `AssertionError`, and any exception other than the documented rejections
(`ALLOWED`) escapes as it is — both are crashes (`tests.fuzz.test_fuzz_*` lets hypothesis shrink
them, ``bench/fuzz.py`` counts them).

Properties:

* ``serde``: `concord.peer.serde.raw_frame_from_wire` returns a frame or raises
  `MalformedFrameError`; a valid message round-trips (header fields and body).
* ``check_hello`` / ``check_frame``: pass or raise `RejectedError` whose reason has a gRPC status
  (`concord.peer.servicer.STATUS_OF`); a valid Hello or chunk passes.
* ``receive``: a stream played into the real servicer (`GossipServicer.ExchangeRaw`, no gRPC
  server: a stand-in context whose ``abort`` raises) ends normally or aborted with a rejection
  status, counted once; every Ack names a filed (or late) tensor; every filed tensor decodes with
  its codec or raises `CodecError`; a valid stream is acknowledged tensor by tensor and its
  tensors arrive byte for byte; ``Exchange`` (protobuf frames) gives the same Acks and status.
* ``control_plane``: `Topics.parse` and `decode` (as `concord.protos.mqtt.Bus` calls them) return
  or raise `PayloadError`; a decoded message is of its topic's kind and re-encodes to the same
  fields; a valid payload decodes to the fields it carries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import msgpack
import structlog
import torch
from hypothesis import HealthCheck, settings

from concord.core.compress import CodecError, Encoded, codec_key
from concord.errors import MalformedFrameError, PayloadError, RejectedError
from concord.peer import serde
from concord.peer.mailbox import Arrival, Counters, Mailbox, Rejection
from concord.peer.servicer import REJECTION_CODES, STATUS_OF, GossipServicer, Greetings
from concord.peer.validate import check_frame, check_hello
from concord.protos import control_plane as cp
from concord.protos import data_plane_pb2 as pb
from tests.fuzz import strategies as gen

ALLOWED = (MalformedFrameError, RejectedError, CodecError, PayloadError)
CASE_TIMEOUT = 10.0  # seconds: a case still running then is a hang

# ---------------------------------------------------------------------------------------------
# Data plane


def serde_target(case: gen.RawCase) -> str:
    try:
        info, body = serde.raw_frame_from_wire(case.message)
    except MalformedFrameError:
        assert case.header is None, "a valid raw frame was refused"
        return "rejected"
    if case.header is not None:
        expected, _ = serde.frame_from_wire(pb.TensorFrame(header=case.header))
        assert repr(info) == repr(expected), f"header round trip: {info} != {expected}"
        assert bytes(body) == case.body, "body round trip"
    return "ok"


def _rejection(check: Callable[[], None]) -> RejectedError | None:
    try:
        check()
    except RejectedError as r:
        return r
    return None


def hello_target(case: gen.HelloCase) -> str:
    r = _rejection(lambda: check_hello(serde.hello_from_wire(case.hello), case.rx.view()))
    if r is None:
        return "ok"
    assert r.reason in STATUS_OF, f"rejection reason {r.reason!r} has no status code"
    assert not case.valid, f"a valid Hello was refused: {r}"
    return "rejected"


def frame_target(case: gen.FrameCase) -> str:
    info, _ = serde.frame_from_wire(pb.TensorFrame(header=case.header))
    view = case.rx.view()
    r = _rejection(lambda: check_frame(info, case.body_len, view, expected_sender=case.rx.sender))
    if r is None:
        return "ok"
    assert r.reason in STATUS_OF, f"rejection reason {r.reason!r} has no status code"
    assert not case.valid, f"a valid chunk was refused: {r}"
    return "rejected"


class AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode, detail: str) -> None:
        super().__init__(f"{code.name}: {detail}")
        self.code, self.detail = code, detail


CONNECTION = "ipv4:127.0.0.1:50000"


class _Context:
    """What the servicer uses of a `grpc.aio.ServicerContext`."""

    def peer(self) -> str:
        return CONNECTION

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise AbortedError(code, details)


class _Peer:
    """A `concord.peer.servicer.ServedPeer` for one receiver configuration."""

    def __init__(self, rx: gen.Receiver) -> None:
        self.rx = rx
        self.peer_id = gen.PEER_ID
        self.step_window = rx.step_window
        self.mailbox = Mailbox()
        self.counters = Counters()
        self.greeted = Greetings()
        self.greeted.add(CONNECTION, rx.sender)  # the sender said Hello on this connection
        self.rejections: dict[int, tuple[int, str]] = {}
        self.require_identity = False
        self.budget = 4 * rx.max_tensor_bytes  # room for every tensor of a case
        self.idle_timeout = CASE_TIMEOUT

    def view(self) -> Any:
        return self.rx.view(current_step=self.mailbox.step)


@dataclasses.dataclass
class Played:
    peer: _Peer
    acks: list[bytes]
    aborted: AbortedError | None


async def _play(rx: gen.Receiver, items: list[Any], raw: bool) -> Played:
    peer = _Peer(rx)
    peer.mailbox.advance(rx.current_step)
    servicer = GossipServicer(peer)  # type: ignore[arg-type]

    async def requests() -> AsyncIterator[Any]:
        for item in items:
            yield item

    method = servicer.ExchangeRaw if raw else servicer.Exchange
    acks, aborted = [], None
    try:
        async for ack in method(requests(), _Context()):  # type: ignore[arg-type]
            acks.append(ack.SerializeToString())  # noqa: PERF401 - keep those before an abort
    except AbortedError as exc:
        aborted = exc
    return Played(peer, acks, aborted)


_LOOP: asyncio.AbstractEventLoop | None = None


def _run(coro: Any, timeout: float) -> Any:
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP.run_until_complete(asyncio.wait_for(coro, timeout))


def _check_played(rx: gen.Receiver, p: Played) -> None:
    rejected = sum(p.peer.counters.rejected.values())
    if p.aborted is not None:
        assert p.aborted.code in REJECTION_CODES, f"aborted with {p.aborted.code}"
        assert rejected == 1, f"one rejection counted {rejected} times"
    else:
        assert rejected == 0, "a rejection without an aborted stream"
    assert p.peer.counters.received == len(p.acks)
    assert p.peer.counters.late == sum(pb.Ack.FromString(a).status == pb.ACK_LATE for a in p.acks)
    slots = p.peer.mailbox._slots
    for raw_ack in p.acks:
        ack = pb.Ack.FromString(raw_ack)
        assert ack.receiver == gen.PEER_ID
        key = (rx.sender, ack.step, ack.round, ack.tensor_id)
        if ack.status == pb.ACK_OK:
            fut = slots.get(key)
            assert fut is not None, f"ACK_OK for {key} but no slot"
            assert fut.done(), f"ACK_OK for {key} but no filed tensor"
        else:
            assert ack.step < rx.current_step, f"ACK_LATE for step {ack.step}"
    filed = 0
    for key, fut in slots.items():
        assert key[1] >= p.peer.mailbox.step, "a slot of a step that is over"
        if not fut.done():
            continue
        got = fut.result()
        if isinstance(got, Rejection):
            continue
        filed += len(got.payload)
        _decode_arrival(rx, got)
    held = p.peer.mailbox.held(rx.sender)
    assert held == filed, f"{held} bytes held for the sender, {filed} in filed tensors"


def _decode_arrival(rx: gen.Receiver, a: Arrival) -> torch.Tensor | None:
    """What the training thread does with an arrival (`concord.peer.comm`): decode it."""
    assert len(a.payload) == sum(part.nbytes for part in a.parts)
    try:
        out = rx.codec_of(a.codec).decode(
            Encoded(a.codec, a.tensors(), rx.dim), key=codec_key(a.sender, a.round)
        )
    except CodecError:
        return None
    assert out.shape == (rx.dim,)
    assert out.dtype == torch.float32
    return out


def receive_target(case: gen.StreamCase, timeout: float = CASE_TIMEOUT) -> str:
    rx = case.rx
    with structlog.testing.capture_logs():  # rejections are logged: keep them off the output
        played = _run(_play(rx, case.messages, raw=True), timeout)
        _check_played(rx, played)
        if case.frames is not None:
            frames = [pb.TensorFrame(header=h, body=b) for h, b in case.frames]
            other = _run(_play(rx, frames, raw=False), timeout)
            _check_played(rx, other)
            assert other.acks == played.acks, "Exchange and ExchangeRaw acknowledge differently"
            codes = [(x.code, x.detail) if x else None for x in (played.aborted, other.aborted)]
            assert codes[0] == codes[1], f"Exchange and ExchangeRaw end differently: {codes}"
    if case.sent is not None:
        _check_valid_stream(rx, case.sent, played)
    if played.aborted is not None:
        return "rejected"
    return "ok"


def _check_valid_stream(rx: gen.Receiver, sent: list[gen.Tensor], p: Played) -> None:
    assert p.aborted is None, f"a valid stream was refused: {p.aborted}"
    assert len(p.acks) == len(sent), f"{len(p.acks)} acks for {len(sent)} tensors"
    first: dict[tuple[int, int, int, int], gen.Tensor] = {}
    for t, raw_ack in zip(sent, p.acks, strict=True):
        ack = pb.Ack.FromString(raw_ack)
        assert (ack.step, ack.round, ack.tensor_id) == (t.step, t.round, t.tensor_id)
        late = t.step < rx.current_step
        assert ack.status == (pb.ACK_LATE if late else pb.ACK_OK)
        if not late:
            first.setdefault((rx.sender, t.step, t.round, t.tensor_id), t)
    for key, t in first.items():
        got = p.peer.mailbox._slots[key].result()
        assert isinstance(got, Arrival)
        assert bytes(got.payload) == t.payload, "payload differs from what was sent"
        assert got.codec == t.codec
        assert repr(got.push_weight) == repr(t.push_weight)
        for name, tensor in got.tensors().items():
            assert torch.equal(tensor, t.parts[name].reshape(-1)), f"part {name!r} differs"
        decoded = _decode_arrival(rx, got)
        assert decoded is not None, "a tensor the sender's codec encoded does not decode"


# ---------------------------------------------------------------------------------------------
# Control plane


def _canon(x: Any) -> Any:
    if isinstance(x, cp.Message):
        return _canon(dataclasses.asdict(x))
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_canon(v) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return "<nan>"
    return x


def _covers(got: Any, sent: Any) -> bool:
    """``got`` carries every field of ``sent`` (embedded messages gain their defaults)."""
    if isinstance(sent, dict):
        return isinstance(got, dict) and all(
            k in got and _covers(got[k], v) for k, v in sent.items()
        )
    if isinstance(sent, list):
        return (
            isinstance(got, list)
            and len(got) == len(sent)
            and all(_covers(g, v) for g, v in zip(got, sent, strict=True))
        )
    return bool(got == sent)


def control_target(case: gen.PayloadCase) -> str:
    parsed: tuple[str, int | None] | None = None
    refused: PayloadError | None = None
    try:
        parsed = gen.TOPICS.parse(case.topic)
    except PayloadError as exc:
        refused = exc
    assert refused is None or refused.topic == case.topic
    try:
        message = cp.decode(case.topic, case.payload)
    except PayloadError as exc:
        refused = exc
    else:
        refused = None
    if refused is not None:
        assert refused.topic == case.topic
        assert not case.valid, f"a valid payload was refused: {refused}"
        return "rejected"
    if parsed is not None:
        want = cp.TOPICS[parsed[0]].kind
        assert want == message.KIND, f"a {message.KIND!r} payload accepted on a {want!r} topic"
    oversized: PayloadError | None = None
    try:
        encoded = cp.encode(message)
    except PayloadError as exc:  # accepted just under the size limit, its defaults push it over
        oversized = exc
    if oversized is not None:
        assert "bytes exceed" in oversized.problem, oversized
        assert len(case.payload) > cp.MAX_PAYLOAD_BYTES - 1024, len(case.payload)
        return "ok" if parsed is not None else "rejected"
    again = cp.decode(case.topic, encoded)  # a decoded message is a valid one
    assert _canon(again) == _canon(message), "decode ∘ encode changed the message"
    if case.valid:
        sent = msgpack.unpackb(case.payload, raw=False)
        got = _canon(message)
        for name, value in sent.items():
            if name not in ("v", "kind"):
                assert _covers(got[name], _canon(value)), f"field {name!r}: {got[name]} ≠ {value}"
    return "ok" if parsed is not None else "rejected"


TARGETS: dict[str, tuple[Callable[[], Any], Callable[[Any], str]]] = {
    "serde": (gen.raw_frames, serde_target),
    "check_hello": (gen.hellos, hello_target),
    "check_frame": (gen.frame_cases, frame_target),
    "receive": (gen.streams, receive_target),
    "control_plane": (gen.payloads, control_target),
}
"""name → (strategy factory, target)."""


def examples(default: int = 300) -> int:
    """Examples per target in the test suite: ``CONCORD_FUZZ_EXAMPLES`` (default 300)."""
    return int(os.environ.get("CONCORD_FUZZ_EXAMPLES", default))


def fuzz_settings(max_examples: int | None = None) -> settings:
    """No deadline (a shared 2-core machine), no example database (nothing left in the work
    tree), every health check off (the strategies build big inputs on purpose); derandomized —
    the same examples on every run — under CI (``CI`` set) or ``CONCORD_FUZZ_DERANDOMIZE=1``."""
    ci = bool(os.environ.get("CI")) or os.environ.get("CONCORD_FUZZ_DERANDOMIZE") == "1"
    return settings(
        max_examples=examples() if max_examples is None else max_examples,
        deadline=None,
        derandomize=ci,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
