"""Hypothesis strategies that build grammar-aware wire inputs.

Data plane (protos/data_plane.proto, docs/protocol.md#data-plane): a `Receiver` (the receiving
peer's configuration), valid tensors cut into chunks by the real sender (`concord.peer.serde.
Outgoing`, parts from the real codecs), then mutations at every level of the grammar —

* header fields: out-of-range, mismatched and boundary values of every `FrameHeader` field
  (run id, sender, step, round, tensor id, codec, chunk index/count, byte length, offset, dim,
  push weight) and of the part table (dtype, numel, offset, name; parts dropped, duplicated,
  reordered, added to later chunks);
* protobuf encoding: duplicated, unknown and wrongly typed fields appended to a serialized header
  (still a message protobuf may accept: the last scalar wins, repeated fields concatenate);
* bodies: truncated, extended, replaced, NaN/±inf written into floating parts;
* streams: chunks dropped, duplicated, swapped, interleaved with another tensor, cut short;
* raw bytes: truncation, bit flips, insertions, duplicated slices, broken varint prefixes.

Control plane (protos/control_plane.py): a valid payload of every message kind derived from the
message's declared field types (`Annotated` constraints included), then mutations — a field
replaced by a wrong-typed, non-finite, negative, huge or nested-garbage value, a required field
dropped, unknown fields added, a wrong ``v`` or ``kind``, non-map and undecodable payloads,
oversized payloads — on every topic of a run (per-peer topics with valid and broken peer ids).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from types import NoneType, UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import msgpack
import torch
from annotated_types import Ge, Gt, Le, Lt, MinLen
from google.protobuf import text_format
from google.protobuf.message import DecodeError
from hypothesis import strategies as st
from pydantic.fields import FieldInfo

from concord.core.compress import CODEC_NAMES, codec_key, make_codec
from concord.peer import serde
from concord.peer.validate import STEP_WINDOW, ReceiverView
from concord.protos import control_plane as cp
from concord.protos import data_plane_pb2 as pb

RUN_ID = "fuzz-run"
FINGERPRINT = "5eed" * 16
PEER_ID = 0  # the receiving peer
U32 = 2**32 - 1
U64 = 2**64 - 1
I64_MIN = -(2**63)

Draw = Callable[[st.SearchStrategy[Any]], Any]


class _Shown:
    """Hypothesis prints a failing case with its ``repr`` (not field by field)."""

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))


def show_header(h: pb.FrameHeader | pb.HelloRequest | None) -> str:
    return "None" if h is None else "{" + text_format.MessageToString(h, as_one_line=True) + "}"


def show_bytes(b: bytes | None, limit: int = 48) -> str:
    if b is None:
        return "None"
    return f"<{len(b)} B {b[:limit].hex()}{'…' if len(b) > limit else ''}>"


# =============================================================================================
# Data plane


@dataclass(frozen=True)
class Receiver:
    """The receiving peer's configuration (what `ReceiverView` is built from); ``sender`` is the
    one neighbour whose stream a case plays."""

    dim: int
    codec: str
    ratio: float
    levels: int
    chunk_bytes: int
    max_tensor_bytes: int
    current_step: int
    world_size: int
    sender: int
    step_window: int = STEP_WINDOW

    def view(self, current_step: int | None = None) -> ReceiverView:
        sender = self.sender
        return ReceiverView(
            run_id=RUN_ID,
            peer_id=PEER_ID,
            fingerprint=FINGERPRINT,
            dim=self.dim,
            codecs=frozenset({"none", self.codec}),
            ratio=self.ratio,
            chunk_bytes=self.chunk_bytes,
            max_tensor_bytes=self.max_tensor_bytes,
            current_step=self.current_step if current_step is None else current_step,
            is_neighbour=lambda s, step, rnd, tensor: s == sender,
            world_size=self.world_size,
            step_window=self.step_window,
            levels=self.levels,
        )

    def codec_of(self, name: str) -> Any:
        return make_codec(name, ratio=self.ratio, levels=self.levels)


@st.composite
def receivers(draw: Draw) -> Receiver:
    world = draw(st.integers(2, 6))
    return Receiver(
        dim=draw(st.integers(1, 300)),
        codec=draw(st.sampled_from(CODEC_NAMES)),
        ratio=draw(st.sampled_from([0.01, 0.1, 0.5, 1.0])),
        levels=draw(st.sampled_from([2, 16, 127, 300])),
        chunk_bytes=draw(st.sampled_from([8, 64, 1024])),
        max_tensor_bytes=draw(st.sampled_from([1 << 16, 1 << 12])),
        current_step=draw(st.integers(0, 20) | st.just(2**62)),
        world_size=world,
        sender=draw(st.integers(1, world - 1)),
    )


@dataclass
class Tensor:
    """One valid tensor as the real sender builds it: its encoded parts and chunks."""

    step: int
    round: int
    tensor_id: int
    codec: str
    push_weight: float | None
    parts: dict[str, torch.Tensor]
    chunks: list[tuple[pb.FrameHeader, bytes]]

    @property
    def payload(self) -> bytes:
        return b"".join(body for _, body in self.chunks)


@st.composite
def tensors(draw: Draw, rx: Receiver) -> Tensor:
    """A valid tensor for ``rx`` (its step may be late: that one is answered ACK_LATE)."""
    codec = draw(st.sampled_from(sorted({"none", rx.codec})))
    step = max(0, rx.current_step + draw(st.integers(-2, rx.step_window)))
    tensor_id = draw(st.sampled_from([serde.TENSOR_MIX, serde.TENSOR_ALLREDUCE, serde.TENSOR_EDGE]))
    # an all-reduce tensor belongs to round 0 (concord.peer.validate.check_frame)
    rnd = (
        0
        if tensor_id == serde.TENSOR_ALLREDUCE
        else draw(st.integers(0, 1000) | st.just(U64 >> 20))
    )
    seed = draw(st.integers(0, 2**32 - 1))
    big = [] if codec == "fp16" else [1e30]  # float16 overflows to inf beyond 65504
    scale = draw(st.sampled_from([0.0, 1e-30, 1.0, 1e3, *big]))
    x = torch.randn(rx.dim, generator=torch.Generator().manual_seed(seed)) * scale
    parts = rx.codec_of(codec).encode(x, key=codec_key(rx.sender, rnd)).parts
    weight = draw(st.none() | st.floats(1e-6, 1e6))
    out = serde.Outgoing(
        run_id=RUN_ID,
        sender=rx.sender,
        step=step,
        round=rnd,
        tensor_id=tensor_id,
        codec=codec,
        dim=rx.dim,
        parts=parts,
        chunk_bytes=rx.chunk_bytes,
        push_weight=weight,
    )
    chunks = [(out.header(i), bytes(out.body(i))) for i in range(out.count)]
    return Tensor(step, rnd, out.tensor_id, codec, weight, parts, chunks)


def _copy(h: pb.FrameHeader) -> pb.FrameHeader:
    out = pb.FrameHeader()
    out.CopyFrom(h)
    return out


def _interesting_ints(*around: int, top: int) -> st.SearchStrategy[int]:
    near = [v + d for v in around for d in (-1, 0, 1)]
    fixed = [0, 1, 2, 3, 2**31 - 1, 2**31, top, top - 1, *near]
    return st.sampled_from(sorted({v for v in fixed if 0 <= v <= top})) | st.integers(0, top)


BAD_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 5e-324, 1.7e308, -1e-300]


def _mutate_parts(draw: Draw, h: pb.FrameHeader, rx: Receiver) -> None:
    parts = list(h.parts)
    op = draw(st.sampled_from(["clear", "drop", "dup", "reverse", "dtype", "numel", "off", "name"]))
    if op == "clear" or not parts:
        del h.parts[:]
        if op != "clear":  # a part table on a chunk that should have none, or a made-up one
            h.parts.add(name="values", dtype=pb.DTYPE_FLOAT32, numel=rx.dim, offset=0)
        return
    i = draw(st.integers(0, len(parts) - 1))
    if op == "drop":
        del h.parts[i]
    elif op == "dup":
        h.parts.add().CopyFrom(parts[i])
    elif op == "reverse":
        del h.parts[:]
        h.parts.extend(reversed(parts))
    elif op == "dtype":
        h.parts[i].dtype = draw(st.integers(0, 9) | st.just(2**31 - 1))
    elif op == "numel":
        h.parts[i].numel = draw(_interesting_ints(parts[i].numel, rx.dim, top=U64))
    elif op == "off":
        h.parts[i].offset = draw(_interesting_ints(parts[i].offset, h.byte_length, top=U64))
    else:
        names = ["", "values", "scale", "indices", "bits", "levels", "x" * 300]
        h.parts[i].name = draw(st.sampled_from(names))


def mutate_header(draw: Draw, h: pb.FrameHeader, rx: Receiver) -> pb.FrameHeader:
    """One field of ``h`` set to an out-of-range, mismatched or boundary value."""
    h = _copy(h)
    name = draw(
        st.sampled_from(
            [
                "run_id",
                "sender",
                "step",
                "round",
                "tensor_id",
                "codec",
                "chunk_index",
                "chunk_count",
                "byte_length",
                "chunk_offset",
                "dim",
                "push_weight",
                "parts",
            ]
        )
    )
    if name == "run_id":
        h.run_id = draw(st.sampled_from(["", "other", RUN_ID + "x", "é" * 3, "x" * 1000]))
    elif name == "sender":
        h.sender = draw(_interesting_ints(PEER_ID, rx.sender, rx.world_size, top=U32))
    elif name == "step":
        cur, window = rx.current_step, rx.step_window
        h.step = draw(_interesting_ints(cur, cur + window, top=U64))
    elif name == "round":
        h.round = draw(_interesting_ints(h.round, top=U64))
    elif name == "tensor_id":
        h.tensor_id = draw(_interesting_ints(top=U32))
    elif name == "codec":
        h.codec = draw(st.integers(-1, 10) | st.just(2**31 - 1))  # type: ignore[assignment]
    elif name == "chunk_index":
        h.chunk_index = draw(_interesting_ints(h.chunk_index, h.chunk_count, top=U32))
    elif name == "chunk_count":
        h.chunk_count = draw(_interesting_ints(h.chunk_count, top=U32))
    elif name == "byte_length":
        h.byte_length = draw(_interesting_ints(h.byte_length, rx.max_tensor_bytes, top=U64))
    elif name == "chunk_offset":
        h.chunk_offset = draw(_interesting_ints(h.chunk_offset, h.byte_length, top=U64))
    elif name == "dim":
        h.dim = draw(_interesting_ints(rx.dim, top=U64))
    elif name == "push_weight":
        if draw(st.booleans()):
            h.ClearField("push_weight")
        else:
            h.push_weight = draw(st.sampled_from(BAD_FLOATS) | st.floats())
    else:
        _mutate_parts(draw, h, rx)
    return h


_BAD_PATTERNS = {  # a NaN / ±inf in every floating wire dtype
    4: [struct.pack("<f", v) for v in (math.nan, math.inf, -math.inf)],
    2: [b"\x00\x7e", b"\x00\x7c", b"\x00\xfc", b"\xc0\x7f", b"\x80\x7f"],
}


def mutate_body(draw: Draw, body: bytes) -> bytes:
    op = draw(st.sampled_from(["truncate", "extend", "replace", "nonfinite", "empty"]))
    if op == "truncate" and body:
        return body[: draw(st.integers(0, len(body) - 1))]
    if op == "extend":
        return body + draw(st.binary(min_size=1, max_size=64))
    if op == "replace":
        return draw(st.binary(min_size=len(body), max_size=len(body)))
    if op == "nonfinite" and len(body) >= 2:
        size = draw(st.sampled_from([4, 2] if len(body) >= 4 else [2]))
        at = draw(st.integers(0, (len(body) - size) // size)) * size
        return body[:at] + draw(st.sampled_from(_BAD_PATTERNS[size])) + body[at + size :]
    return b""


def _tag(number: int, wire_type: int) -> bytes:
    return serde._varint(number << 3 | wire_type)


@st.composite
def extra_fields(draw: Draw) -> bytes:
    """Protobuf fields appended to a serialized header: duplicates of known fields (same or wrong
    wire type), unknown fields, a stray Part, invalid wire types, truncated values."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.integers(1, 14) | st.sampled_from([15, 16, 1000, 2**29 - 1]))
        wire_type = draw(st.sampled_from([0, 0, 1, 2, 2, 5, 3, 4, 6, 7]))
        out += _tag(number, wire_type)
        if wire_type == 0:
            out += serde._varint(draw(st.sampled_from([0, 1, 2**32, U64]) | st.integers(0, U64)))
        elif wire_type == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif wire_type == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        elif wire_type == 2:
            value = draw(
                st.binary(max_size=16)
                | st.just(pb.Part(name="values", dtype=1, numel=1).SerializeToString())
                | st.text(max_size=8).map(str.encode)
            )
            length = len(value) + draw(st.sampled_from([0, 0, 0, 1, -1, 2**40]))
            out += serde._varint(max(0, length)) + value
    if draw(st.integers(0, 9)) == 0:  # cut the last field short
        out = out[: draw(st.integers(0, len(out)))]
    return bytes(out)


def _raw(header: bytes, body: bytes) -> bytes:
    return serde._varint(len(header)) + header + body


@st.composite
def raw_mutations(draw: Draw, message: bytes) -> bytes:
    """Byte-level damage to one raw message."""
    op = draw(st.sampled_from(["truncate", "flip", "insert", "dup", "varint", "concat", "random"]))
    n = len(message)
    if op == "truncate":
        return message[: draw(st.integers(0, max(0, n - 1)))]
    if op == "flip" and n:
        i = draw(st.integers(0, n - 1))
        bit = 1 << draw(st.integers(0, 7))
        return message[:i] + bytes([message[i] ^ bit]) + message[i + 1 :]
    if op == "insert":
        i = draw(st.integers(0, n))
        return message[:i] + draw(st.binary(min_size=1, max_size=16)) + message[i:]
    if op == "dup" and n:
        i = draw(st.integers(0, n - 1))
        j = draw(st.integers(i + 1, n))
        return message[:j] + message[i:j] + message[j:]
    if op == "varint":
        prefix = draw(
            st.sampled_from([b"", b"\x80", b"\x80" * 10, b"\xff" * 10 + b"\x01", b"\xff" * 9])
            | st.integers(0, U64).map(serde._varint)
        )
        used = _varint_len(message)
        return prefix + message[used:]
    if op == "concat":
        return message + message
    return draw(st.binary(max_size=64))


def _varint_len(message: bytes) -> int:
    for i, byte in enumerate(message[:10]):
        if byte < 0x80:
            return i + 1
    return min(len(message), 10)


@dataclass(repr=False)
class RawCase(_Shown):
    """One ``ExchangeRaw`` message; ``header`` and ``body`` when it is a valid frame as built."""

    rx: Receiver
    message: bytes
    header: pb.FrameHeader | None
    body: bytes | None

    def __repr__(self) -> str:
        return (
            f"RawCase({self.rx}, message={show_bytes(self.message, 400)}, "
            f"header={show_header(self.header)}, body={show_bytes(self.body)})"
        )


@st.composite
def raw_frames(draw: Draw) -> RawCase:
    """A chunk of a valid tensor, as is or with damaged header fields, protobuf encoding, body or
    raw bytes."""
    rx = draw(receivers())
    tensor = draw(tensors(rx))
    header, body = draw(st.sampled_from(tensor.chunks))
    valid = True
    if draw(st.booleans()):
        header = mutate_header(draw, header, rx)
    if draw(st.integers(0, 3)) == 0:
        body = mutate_body(draw, body)
    encoded = header.SerializeToString()
    if draw(st.integers(0, 3)) == 0:
        encoded += draw(extra_fields())
        valid = False
    message = _raw(encoded, body)
    if draw(st.integers(0, 2)) == 0:
        message = draw(raw_mutations(message))
        valid = False
    return RawCase(rx, message, header if valid else None, body if valid else None)


@dataclass(repr=False)
class FrameCase(_Shown):
    """One chunk's header (as the wire would carry it) and body length, checked against ``rx``;
    ``valid``: an unmodified chunk of a tensor for the current window."""

    rx: Receiver
    header: pb.FrameHeader
    body_len: int
    valid: bool

    def __repr__(self) -> str:
        return (
            f"FrameCase({self.rx}, header={show_header(self.header)}, "
            f"body_len={self.body_len}, valid={self.valid})"
        )


@st.composite
def frame_cases(draw: Draw) -> FrameCase:
    rx = draw(receivers())
    tensor = draw(tensors(rx))
    header, body = draw(st.sampled_from(tensor.chunks))
    valid = True
    for _ in range(draw(st.integers(0, 3))):
        header = mutate_header(draw, header, rx)
        valid = False
    if draw(st.integers(0, 4)) == 0:
        body = mutate_body(draw, body)
        valid = False
    if draw(st.integers(0, 4)) == 0:  # reparse with duplicated / unknown fields
        with contextlib.suppress(DecodeError):  # protobuf refuses it: no header to check
            header = pb.FrameHeader.FromString(header.SerializeToString() + draw(extra_fields()))
        valid = False
    return FrameCase(rx, header, len(body), valid)


@dataclass(repr=False)
class HelloCase(_Shown):
    rx: Receiver
    hello: pb.HelloRequest
    valid: bool

    def __repr__(self) -> str:
        return f"HelloCase({self.rx}, hello={show_header(self.hello)}, valid={self.valid})"


@st.composite
def hellos(draw: Draw) -> HelloCase:
    rx = draw(receivers())
    codec = draw(st.sampled_from(sorted({"none", rx.codec})))
    hello = serde.hello_request(RUN_ID, rx.sender, FINGERPRINT, codec)
    valid = True
    for _ in range(draw(st.integers(0, 3))):
        valid = False
        name = draw(
            st.sampled_from(["run_id", "peer_id", "protocol_version", "fingerprint", "codec"])
        )
        if name == "run_id":
            hello.run_id = draw(st.sampled_from(["", "other", RUN_ID.upper()]) | st.text())
        elif name == "peer_id":
            hello.peer_id = draw(_interesting_ints(PEER_ID, rx.world_size, top=U32))
        elif name == "protocol_version":
            hello.protocol_version = draw(_interesting_ints(serde.PROTOCOL_VERSION, top=U32))
        elif name == "fingerprint":
            fp = ["", FINGERPRINT[:-1], FINGERPRINT.upper(), "x" * 10_000, FINGERPRINT + "0"]
            hello.model_fingerprint = draw(st.sampled_from(fp) | st.text())
        else:
            hello.codec = draw(st.integers(-1, 10) | st.just(2**31 - 1))  # type: ignore[assignment]
    if draw(st.integers(0, 4)) == 0:
        try:
            hello = pb.HelloRequest.FromString(hello.SerializeToString() + draw(extra_fields()))
        except DecodeError:  # not a HelloRequest: gRPC's deserializer refuses it
            return HelloCase(rx, pb.HelloRequest(), False)
        valid = False
    return HelloCase(rx, hello, valid)


@dataclass(repr=False)
class StreamCase(_Shown):
    """The messages of one Exchange stream from ``rx.sender``. ``frames`` are the chunks as
    (header, body) when no raw bytes were damaged (so ``Exchange`` can carry them as protobuf
    messages too); ``sent``: the tensors of an undamaged stream, in order."""

    rx: Receiver
    messages: list[bytes]
    frames: list[tuple[pb.FrameHeader, bytes]] | None
    sent: list[Tensor] | None

    def __repr__(self) -> str:
        if self.frames is not None:
            shown = [f"{show_header(h)} + {show_bytes(b)}" for h, b in self.frames]
        else:
            shown = [show_bytes(m, 400) for m in self.messages]
        items = "".join(f"\n  {m}," for m in shown)
        return f"StreamCase({self.rx}, valid={self.sent is not None}, messages=[{items}\n])"


def _stream_op(draw: Draw, chunks: list[tuple[pb.FrameHeader, bytes]], rx: Receiver) -> None:
    op = draw(st.sampled_from(["header", "body", "drop", "dup", "swap", "other", "cut"]))
    i = draw(st.integers(0, len(chunks) - 1))
    header, body = chunks[i]
    if op == "header":
        chunks[i] = (mutate_header(draw, header, rx), body)
    elif op == "body":
        chunks[i] = (header, mutate_body(draw, body))
    elif op == "drop" and len(chunks) > 1:
        del chunks[i]
    elif op == "dup":
        chunks.insert(i, chunks[i])
    elif op == "swap":
        j = draw(st.integers(0, len(chunks) - 1))
        chunks[i], chunks[j] = chunks[j], chunks[i]
    elif op == "other":
        chunks.insert(i, draw(st.sampled_from(draw(tensors(rx)).chunks)))
    elif op == "cut":
        del chunks[i + 1 :]


@st.composite
def streams(draw: Draw) -> StreamCase:
    """One or two valid tensors (chunked), damaged at the stream, header, body or byte level."""
    rx = draw(receivers())
    sent = [draw(tensors(rx)) for _ in range(draw(st.integers(1, 2)))]
    chunks = [c for t in sent for c in t.chunks]
    damaged = False
    for _ in range(draw(st.integers(0, 3))):
        _stream_op(draw, chunks, rx)
        damaged = True
    if not chunks:
        chunks = list(sent[0].chunks)
    messages = [_raw(h.SerializeToString(), b) for h, b in chunks]
    frames: list[tuple[pb.FrameHeader, bytes]] | None = chunks
    if draw(st.integers(0, 4)) == 0:
        i = draw(st.integers(0, len(messages) - 1))
        if draw(st.booleans()):
            h, b = chunks[i]
            messages[i] = _raw(h.SerializeToString() + draw(extra_fields()), b)
        else:
            messages[i] = draw(raw_mutations(messages[i]))
        frames, damaged = None, True
    return StreamCase(rx, messages, frames, None if damaged else sent)


# =============================================================================================
# Control plane


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    meta: list[Any] = []
    while get_origin(tp) is Annotated:
        tp, *more = get_args(tp)
        meta += more
    return tp, meta


def _bounds(meta: list[Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for m in meta:
        items = m.metadata if isinstance(m, FieldInfo) else [m]
        for item in items:
            for cls, key in ((Ge, "ge"), (Gt, "gt"), (Le, "le"), (Lt, "lt"), (MinLen, "min_len")):
                if isinstance(item, cls):
                    found[key] = next(iter(dataclasses.astuple(item)))
            if getattr(item, "allow_inf_nan", None) is False:
                found["finite"] = True
            if isinstance(getattr(item, "pattern", None), str):
                found["pattern"] = item.pattern
    return found


_SCALAR_JSON = st.none() | st.booleans() | st.integers(I64_MIN, U64) | st.floats() | st.text()
JSONISH = st.recursive(
    _SCALAR_JSON,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def valid_value(tp: Any) -> st.SearchStrategy[Any]:
    """A valid wire value (msgpack-able) of a declared field type."""
    tp, meta = _unwrap(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType):
        return st.one_of(*[valid_value(a) for a in args])
    if tp is NoneType:
        return st.none()
    for m in meta:
        if isinstance(m, cp.OneOf):
            return st.sampled_from(m.values)
        if isinstance(m, cp.HostPort):
            host = st.sampled_from(["127.0.0.1", "localhost", "[::1]", "peer-3.example"])
            return st.builds(lambda h, p: f"{h}:{p}", host, st.integers(1, 65535))
        if isinstance(m, cp.Shaped):
            topology = st.none() | st.sampled_from(["ring", "torus", "exponential"])
            return st.fixed_dictionaries({"index": st.integers(0, 100), "topology": topology})
    b = _bounds(meta)
    if tp is bool:
        return st.booleans()
    if tp is int:
        lo = b.get("ge", b["gt"] + 1 if "gt" in b else I64_MIN)
        hi = b.get("le", b["lt"] - 1 if "lt" in b else U64)
        return st.integers(lo, min(hi, lo + 20)) | st.integers(lo, hi)
    if tp is float:
        return st.floats(
            min_value=b.get("ge", b.get("gt")),
            max_value=b.get("le", b.get("lt")),
            exclude_min="gt" in b,
            exclude_max="lt" in b,
            allow_nan=not b,
            allow_infinity=False if b.get("finite") or len(b) > 1 else None,
        )
    if tp is str:
        if "pattern" in b:  # a constrained string: valid values match it
            return st.from_regex(b["pattern"], fullmatch=True)
        return st.text(max_size=12)
    if origin is list:
        item = args[0]
        if isinstance(item, type) and issubclass(item, cp.Message):
            return st.lists(message_maps(item), max_size=3)
        return st.lists(valid_value(item), min_size=b.get("min_len", 0), max_size=4)
    if origin is dict:
        value = args[1]
        values = JSONISH if value is Any else valid_value(value)
        return st.dictionaries(st.text(max_size=8), values, max_size=3)
    raise TypeError(f"no strategy for declared type {tp!r}")


def _fix(cls: type[cp.Message], m: dict[str, Any]) -> dict[str, Any]:
    """The invariants spanning fields (the classes' model validators)."""
    if cls is cp.Schedule:
        m["peers"] = list(dict.fromkeys(m["peers"]))
        if m.get("addresses"):
            m["addresses"] = [
                m["addresses"][i % len(m["addresses"])] for i in range(len(m["peers"]))
            ]
    if cls is cp.Metrics and m.get("stats"):
        m["event"] = "step"
        for i, s in enumerate(m["stats"]):
            s.update(peer=m["peer"], step=m["step"], round=i + 1)
    return m


def message_maps(cls: type[cp.Message]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid field map of ``cls`` (without ``v`` and ``kind``): every required field, any of
    the optional ones."""
    hints = get_type_hints(cls, include_extras=True)
    required, optional = {}, {}
    for f in dataclasses.fields(cls):
        has_default = f.default is not dataclasses.MISSING or (
            f.default_factory is not dataclasses.MISSING
        )
        (optional if has_default else required)[f.name] = valid_value(hints[f.name])
    return st.fixed_dictionaries(required, optional=optional).map(lambda m: _fix(cls, m))


GARBAGE_SCALARS = st.sampled_from(
    [
        None,
        True,
        False,
        -1,
        0,
        cp.MAX_ROUNDS + 1,
        2**31,
        2**63 - 1,
        U64,
        I64_MIN,
        math.nan,
        math.inf,
        -math.inf,
        -0.0,
        5e-324,
        -1.5,
        1e308,
        "",
        "1",
        "nan",
        "\x00",
        "x" * 5000,
        b"",
        msgpack.ExtType(1, b"x"),
        msgpack.Timestamp(0),
    ]
) | st.one_of(st.integers(I64_MIN, U64), st.floats(), st.text(max_size=8), st.binary(max_size=4))
GARBAGE = st.recursive(
    GARBAGE_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.just(""), inner, max_size=3)
    ),
    max_leaves=12,
)


@dataclass
class PayloadCase:
    """A control-plane message on ``topic``; ``valid``: a payload of the topic's kind built
    from the declaration (it must decode, and re-encode to the same fields)."""

    topic: str
    payload: bytes
    kind: str  # the topic's kind
    valid: bool


TOPICS = cp.Topics(RUN_ID)


@st.composite
def topics(draw: Draw) -> tuple[str, str, bool]:
    """(topic, its kind, well-formed?) for every topic of the run; broken ones now and then."""
    kind = draw(st.sampled_from(sorted(cp.TOPICS)))
    peer = draw(st.integers(0, 4096)) if cp.TOPICS[kind].per_peer else None
    topic = TOPICS.topic(kind, peer)
    if draw(st.integers(0, 5)):
        return topic, kind, True
    broken = draw(
        st.sampled_from(
            [
                f"{TOPICS.base}/{kind}/²",
                f"{TOPICS.base}/{kind}/٣",
                f"{TOPICS.base}/{kind}/{'7' * 5000}",
                f"{TOPICS.base}/{kind}/-1",
                f"{TOPICS.base}/{kind}/",
                f"{TOPICS.base}/{kind}/1/2",
                f"{TOPICS.base}/{kind}/+",
                f"{TOPICS.base}/{kind}",
                f"{TOPICS.base}/unknown",
                f"{cp.ROOT}/other/{kind}",
                f"{TOPICS.base}/",
                "",
                "#",
                topic + "/x",
            ]
        )
        | st.text(max_size=12).map(lambda t: f"{TOPICS.base}/{t}")
    )
    return broken, kind, False


def _pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


@st.composite
def payloads(draw: Draw) -> PayloadCase:
    """A payload for every topic of a run: valid, or damaged at the field, map or byte level."""
    topic, kind, topic_ok = draw(topics())
    cls = cp.MESSAGES[kind]
    if draw(st.integers(0, 9)) == 0:  # a payload of another kind on this topic
        cls = cp.MESSAGES[draw(st.sampled_from(sorted(cp.MESSAGES)))]
    fields = draw(message_maps(cls))
    head: dict[Any, Any] = {"v": cp.SCHEMA_VERSION, "kind": cls.KIND}
    valid = topic_ok and kind == cls.KIND
    if draw(st.integers(0, 2)) == 0:
        return PayloadCase(topic, _pack({**head, **fields}), kind, valid)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(
            st.sampled_from(
                ["field", "field", "drop", "unknown", "nested", "v", "kind", "int-for-float"]
            )
        )
        names = sorted(fields)
        if op == "field" and names:
            fields[draw(st.sampled_from(names))] = draw(GARBAGE)
        elif op == "drop" and names:
            del fields[draw(st.sampled_from(names))]
        elif op == "unknown":
            fields[draw(st.text(max_size=8) | st.sampled_from(["V", "Kind", "kind "]))] = draw(
                GARBAGE
            )
        elif op == "nested":  # inside an embedded message (Metrics.stats) or a map field
            for name in names:
                value = fields[name]
                maps = [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
                if maps:
                    draw(st.sampled_from(maps))[draw(st.text(max_size=6))] = draw(GARBAGE)
                elif isinstance(value, dict):
                    value[draw(st.text(max_size=6))] = draw(GARBAGE)
        elif op == "v":
            head["v"] = draw(st.sampled_from([1, 3, "2", 2.0, True, None, -2, U64]) | GARBAGE)
            if draw(st.integers(0, 4)) == 0:
                del head["v"]
        elif op == "kind":
            other = st.sampled_from([*sorted(cp.MESSAGES), "presence", "", "STATS", "stats "])
            head["kind"] = draw(other | GARBAGE)
            if draw(st.integers(0, 4)) == 0:
                del head["kind"]
        elif op == "int-for-float":  # an int where a float is declared: valid on the wire
            hints = get_type_hints(cls)
            floats = [n for n in names if hints.get(n) in (float, float | None)]
            if floats and isinstance(fields[floats[0]], float) and math.isfinite(fields[floats[0]]):
                fields[floats[0]] = round(fields[floats[0]])
    shape = draw(st.integers(0, 19))
    if shape == 0:
        obj: Any = draw(GARBAGE)  # not a map at all
    elif shape == 1:
        obj = {**head, **fields, draw(st.integers(-5, 5) | st.binary(max_size=2)): 1}
    elif shape == 2:  # oversized: beyond MAX_PAYLOAD_BYTES
        obj = {
            **head,
            **fields,
            "reason": "x" * (cp.MAX_PAYLOAD_BYTES + draw(st.integers(-64, 64))),
        }
    else:
        obj = {**head, **fields}
    try:
        payload = _pack(obj)
    except (ValueError, TypeError, OverflowError):  # keys msgpack cannot pack
        payload = b"\x81\xc0\xc0"  # {nil: nil}
    if draw(st.integers(0, 9)) == 0:
        op = draw(st.sampled_from(["truncate", "flip", "append", "random"]))
        if op == "truncate":
            payload = payload[: draw(st.integers(0, max(0, len(payload) - 1)))]
        elif op == "flip" and payload:
            i = draw(st.integers(0, len(payload) - 1))
            payload = payload[:i] + bytes([payload[i] ^ 0xFF]) + payload[i + 1 :]
        elif op == "append":
            payload += draw(st.binary(min_size=1, max_size=8))
        else:
            payload = draw(st.binary(max_size=64))
    return PayloadCase(topic, payload, kind, False)
