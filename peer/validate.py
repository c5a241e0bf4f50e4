"""Checks on every incoming frame and tensor, as pure functions.

A failed check raises `RejectedError` with a domain reason; the transport maps reasons to gRPC
status codes in one place (`concord.peer.servicer.STATUS_OF`), logs sender and reason, counts it,
and keeps serving everyone else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from concord.core.compress import make_codec
from concord.errors import RejectedError as RejectedError
from concord.peer.serde import (
    PROTOCOL_VERSION,
    TENSOR_ALLREDUCE,
    TENSOR_EDGE,
    TENSOR_FETCH,
    TENSOR_MIX,
    FrameInfo,
    Hello,
    PartSpec,
)

# "identity": the TLS certificate names another peer; "overload": a receive bound (in-flight
# bytes, mailbox entries) is exhausted; "idle": a stream stayed silent past its idle timeout
Reason = Literal["invalid", "precondition", "permission", "too-big", "identity", "overload", "idle"]
TENSOR_IDS = frozenset({TENSOR_MIX, TENSOR_ALLREDUCE, TENSOR_EDGE})  # every id the protocol has

ALLOWED_DTYPES = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int32,
    torch.uint8,
    torch.int16,
)
STEP_WINDOW = 2  # a neighbour may be this many steps ahead of us


@dataclass(frozen=True)
class ReceiverView:
    """What the receiver knows when a frame arrives."""

    run_id: str
    peer_id: int
    fingerprint: str
    dim: int  # the model's parameter count
    codecs: frozenset[str]  # codecs this peer decodes
    ratio: float  # compression.ratio (sizes of top-k / random-k parts)
    chunk_bytes: int
    max_tensor_bytes: int
    current_step: int  # the step this peer is in (or about to enter)
    is_neighbour: Callable[[int, int, int, int], bool]  # (sender, step, round, tensor id)
    world_size: int
    step_window: int = STEP_WINDOW  # + the algorithm's longest run of local-only steps
    levels: int = 16  # compression.levels (qsgd parts: int8 levels up to 127, int16 above)
    tensor_ids: frozenset[int] = TENSOR_IDS  # the ids this run's algorithm sends at all
    max_abs_value: float | None = None  # network.max_abs_value: bound on floating values
    # a Fetch answer's optional parts besides "values": the algorithm's portable state
    # (`concord.core.algorithms.base.Algorithm.portable_state`), each a float32 ``dim``-vector
    fetch_state: frozenset[str] = frozenset()


def check_hello(h: Hello, view: ReceiverView) -> None:
    if h.run_id != view.run_id:
        raise RejectedError(
            "permission", f"run {h.run_id!r} is not this peer's run {view.run_id!r}"
        )
    if h.protocol_version != PROTOCOL_VERSION:
        raise RejectedError(
            "precondition",
            f"protocol version {h.protocol_version}; this peer speaks {PROTOCOL_VERSION}",
        )
    if not 0 <= h.peer_id < view.world_size or h.peer_id == view.peer_id:
        raise RejectedError("permission", f"peer id {h.peer_id} is not another peer of this run")
    if h.model_fingerprint != view.fingerprint:
        raise RejectedError(
            "precondition",
            f"model fingerprint {h.model_fingerprint[:12]}… differs from {view.fingerprint[:12]}…"
            " (different model architecture or size)",
        )
    if h.codec is None or h.codec not in view.codecs:
        raise RejectedError("invalid", f"codec {h.codec!r} is not decoded by this peer")


def check_frame(f: FrameInfo, body_len: int, view: ReceiverView, *, expected_sender: int) -> None:
    """Header checks of one chunk (before its body is stored)."""
    if f.run_id != view.run_id:
        raise RejectedError("permission", f"frame of run {f.run_id!r}")
    if f.sender != expected_sender:
        raise RejectedError(
            "permission", f"frame claims sender {f.sender} on peer {expected_sender}'s stream"
        )
    if body_len > view.chunk_bytes:
        raise RejectedError("too-big", f"chunk of {body_len} bytes > limit {view.chunk_bytes}")
    if f.byte_length > view.max_tensor_bytes:
        raise RejectedError(
            "too-big", f"tensor of {f.byte_length} bytes > limit {view.max_tensor_bytes}"
        )
    if f.codec is None or f.codec not in view.codecs:
        raise RejectedError("invalid", "unknown or unsupported codec")
    if f.dim != view.dim:
        raise RejectedError(
            "precondition", f"tensor of dimension {f.dim}; the model has {view.dim}"
        )
    if not 0 <= f.chunk_index < f.chunk_count:
        raise RejectedError("invalid", f"chunk {f.chunk_index} of {f.chunk_count}")
    if f.chunk_offset + body_len > f.byte_length:
        raise RejectedError(
            "invalid",
            f"chunk at {f.chunk_offset}+{body_len} exceeds the tensor's {f.byte_length} bytes",
        )
    if f.step > view.current_step + view.step_window:
        raise RejectedError(
            "precondition", f"step {f.step} is too far ahead of this peer's {view.current_step}"
        )
    if f.tensor_id not in view.tensor_ids:
        raise RejectedError(
            "permission",
            f"tensor id {f.tensor_id} is not expected (this peer takes {sorted(view.tensor_ids)})",
        )
    if f.tensor_id == TENSOR_ALLREDUCE and f.round != 0:
        raise RejectedError("permission", f"all-reduce tensor in round {f.round}; expected 0")
    if not view.is_neighbour(f.sender, f.step, f.round, f.tensor_id):
        raise RejectedError(
            "permission", f"peer {f.sender} is not a neighbour in step {f.step} round {f.round}"
        )
    if f.chunk_index == 0:
        check_parts(f, view)
        w = f.push_weight
        if w is not None and not (math.isfinite(w) and w > 0):
            raise RejectedError("invalid", f"push-sum weight {w!r}; must be finite and > 0")


def check_parts(f: FrameInfo, view: ReceiverView) -> None:
    if f.parts is None:
        raise RejectedError("invalid", "part table has an unknown dtype")
    if not f.parts:
        raise RejectedError("invalid", "chunk 0 carries no part table")
    end = 0
    for p in f.parts:
        if p.dtype not in ALLOWED_DTYPES:
            raise RejectedError("invalid", f"part {p.name!r} has dtype {p.dtype}")
        if p.offset != end:
            raise RejectedError("invalid", f"part {p.name!r} at offset {p.offset}, expected {end}")
        end += p.nbytes
    if end != f.byte_length:
        raise RejectedError("invalid", f"parts cover {end} bytes, tensor has {f.byte_length}")
    got = {p.name: (p.dtype, p.numel) for p in f.parts}
    if f.tensor_id == TENSOR_FETCH:
        extra = [p.name for p in f.parts[1:]]
        if f.parts[0].name != "values" or not set(extra) <= view.fetch_state:
            raise RejectedError(
                "invalid",
                f"a Fetch answer's parts are 'values' then some of {sorted(view.fetch_state)}; "
                f"got {[p.name for p in f.parts]}",
            )
        want = dict.fromkeys(("values", *extra), (torch.float32, view.dim))
    else:
        codec = make_codec(f.codec or "none", ratio=view.ratio, levels=view.levels)
        want = codec.part_specs(view.dim)
    if got != want or len(got) != len(f.parts):
        raise RejectedError(
            "invalid", f"codec {f.codec!r} of a {view.dim}-vector expects parts {want}; got {got}"
        )


def _non_finite(
    name: str, t: torch.Tensor, where: str = "", bound: float | None = None
) -> RejectedError | None:
    """The rejection of ``t`` (one floating part, or a slice of it) when it holds a NaN or ±inf.

    A float32/bfloat16 sum is one vectorised pass and is non-finite whenever an element is (one
    thread, 64 MiB: ~3 ms chunk by chunk while each chunk just copied is in cache, ~6 ms cold,
    against ~7.5 / ~9 ms for ``aminmax``). Only when the sum is not finite (a bad value, or finite
    values overflowing the sum: possible, never seen with real parameters) does the exact check
    run: ``aminmax``, one min/max pass without temporaries (NaN propagates into both, ±inf shows
    in one). float16 sums overflow at 65504, so float16 takes ``aminmax`` directly. With a
    ``bound`` (``network.max_abs_value``) every element must also satisfy |v| ≤ bound: that needs
    the ``aminmax`` pass always."""
    if bound is None and t.dtype != torch.float16 and math.isfinite(float(t.sum())):
        return None
    lo, hi = torch.aminmax(t)
    if math.isfinite(float(lo)) and math.isfinite(float(hi)):
        top = max(-float(lo), float(hi))
        if bound is not None and top > bound:
            return RejectedError(
                "invalid",
                f"part {name!r} has a value of magnitude {top:.6g} > max_abs_value {bound:g}"
                f"{where}",
            )
        return None
    bad = int((~torch.isfinite(t)).sum())
    return RejectedError("invalid", f"part {name!r} has {bad} non-finite value(s){where}")


def check_values(
    tensors: dict[str, torch.Tensor],
    parts: tuple[PartSpec, ...],
    max_abs_value: float | None = None,
) -> None:
    """Finite values (of magnitude ≤ ``max_abs_value`` when set) in every floating part of an
    assembled tensor."""
    for p in parts:
        t = tensors[p.name]
        if t.is_floating_point() and t.numel() > 0:
            err = _non_finite(p.name, t, bound=max_abs_value)
            if err is not None:
                raise err


@dataclass
class _Pending:
    part: PartSpec
    values: torch.Tensor
    done: int = 0  # elements checked so far


class FiniteScan:
    """`check_values` for a tensor being assembled, region by region: `advance` checks the
    floating elements that the chunks received so far cover completely, each chunk while it is
    still in cache. Once the scan has advanced to the tensor's byte length, every floating
    element has been checked exactly once (finite, and within ``max_abs_value`` when set)."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        parts: tuple[PartSpec, ...],
        max_abs_value: float | None = None,
    ) -> None:
        self._bound = max_abs_value
        self._pending = [
            _Pending(p, t)
            for p in parts
            if (t := tensors[p.name]).is_floating_point() and t.numel() > 0
        ]

    def advance(self, received: int) -> None:
        """Check every floating element lying entirely within the first ``received`` bytes;
        raises `RejectedError` naming the part and the elements that are not all finite."""
        for q in self._pending:
            t = q.values
            end = min(t.numel(), max(0, (received - q.part.offset) // t.element_size()))
            if end > q.done:
                err = _non_finite(
                    q.part.name, t[q.done : end], f" (elements {q.done}–{end - 1})", self._bound
                )
                if err is not None:
                    raise err
                q.done = end


def tensor_bytes(dim: int, codecs: frozenset[str], ratio: float, levels: int) -> int:
    """The largest payload (bytes) of a ``dim``-vector in any of ``codecs``: what one legitimate
    incoming tensor occupies (the part tables are checked exactly, so no valid tensor is larger)."""
    largest = 0
    for name in codecs:
        specs = make_codec(name, ratio=ratio, levels=levels).part_specs(dim)
        size = sum(n * torch.empty(0, dtype=dt).element_size() for dt, n in specs.values())
        largest = max(largest, size)
    return largest
