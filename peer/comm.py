"""`RoundComm`: the `concord.core.comm.Comm` interface of one peer; `PeerComm`: over the gRPC
transport (`concord.peer.torch_plane.TorchComm`: over torch.distributed, ``network.transport``).

The training thread calls these methods; each submits one coroutine to the peer's event loop
(`asyncio.run_coroutine_threadsafe`). `mix`, `allreduce_mean` and `exchange` wait for it; the
non-blocking `start_mix` and `start_allreduce_mean` return a `RoundHandle` at once, and the round
runs on the loop — sending, the wire, collecting the neighbours' tensors — while the training
thread goes on (computing the step's gradient: docs/algorithms.md#overlap) until it calls
``wait``. All tensor arithmetic (packing, the weighted sum, renormalisation) happens here, in the
training thread, never on the loop: encoding when the round starts, decoding and mixing in
``wait``.

`Breakdown`: where a step's communication time goes, as the training thread sees it —
``encode_ms`` (codec encode and building the frames), ``wait_ms`` (blocked on the round: from
handing it to the loop, or from ``wait`` for a started round, until it ends: sending, the wire,
waiting for the neighbours), ``mix_ms`` (decoding and the weighted sum) and ``overlap_ms`` (a
started round in flight while the training thread did other work, from start to ``wait``). The
peer adds them to each step record (`take_breakdown`); the rest of the step is computation and
control.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import structlog
import torch

from concord.core.comm import Comm, CommCounters, Edge, MixOutcome, MixResult, Pending
from concord.core.compress import CodecError, Encoded, codec_key
from concord.peer.serde import TENSOR_ALLREDUCE, TENSOR_EDGE, TENSOR_MIX

if TYPE_CHECKING:
    from concord.core.compress import Codec
    from concord.peer.mailbox import Arrival
    from concord.peer.transport import Transport

log = structlog.get_logger("concord.peer.comm")
_SLACK = 5.0  # seconds a round may overrun its deadline before the training thread gives up
SWITCH_INTERVAL = 0.001
"""Seconds a thread holds the GIL while another waits for it (`sys.setswitchinterval`; Python's
default 5 ms), set when a `PeerComm` is made. The training thread gives the GIL up in every
kernel and system call, and the event loop — copying gRPC chunks, which holds the GIL — keeps it
for up to the interval before the training thread gets it back: with 1 ms the gRPC peers of
`bench/step_overhead.py` stepped 58 ms against 66 ms (two interleaved pairs, load ≈ 10 on 2
cores; docs/performance.md). The setting is the interpreter's, not the object's: it stays for
the rest of the process (a peer process makes one `PeerComm` and lives as long), and an
application that embeds peers and wants another interval sets it after making them."""
T = TypeVar("T")


class Delivered(Protocol):
    """One neighbour's tensor as a data plane hands it over (`concord.peer.mailbox.Arrival` on
    gRPC; `concord.peer.torch_plane` builds its own): validated, its parts readable."""

    @property
    def codec(self) -> str: ...

    @property
    def push_weight(self) -> float | None: ...

    def tensors(self) -> dict[str, torch.Tensor]: ...


Received = tuple[Mapping[int, Delivered], MixOutcome]


@dataclass
class Breakdown:
    """Milliseconds of one step spent in each part of communication (module docstring)."""

    encode_ms: float = 0.0
    wait_ms: float = 0.0
    mix_ms: float = 0.0
    overlap_ms: float = 0.0

    def as_record(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


class RoundComm(Comm):
    """The `Comm` of one peer process (k = 1) over a data plane that runs *rounds*: a round sends
    one tensor to some neighbours and collects theirs (`_start`, then `_finish`). The arithmetic
    — codecs, the weighted sum, renormalisation, push-sum weights, the average — lives here,
    once, for every plane: gRPC (`PeerComm`) and torch.distributed
    (`concord.peer.torch_plane.TorchComm`)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.n = world_size
        self.counters = CommCounters()
        self.last_outcome: MixOutcome | None = None
        self.step_base = 0  # added to data-plane step numbers (a run's stages never share one)
        self.breakdown = Breakdown()

    def take_breakdown(self) -> dict[str, float]:
        """This step's `Breakdown` as record fields; starts the next one."""
        out, self.breakdown = self.breakdown.as_record(), Breakdown()
        return out

    @property
    def world_size(self) -> int:
        return self.n

    @property
    def ranks(self) -> Sequence[int]:
        return (self.rank,)

    @abstractmethod
    def _start(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        values: torch.Tensor,
        send_to: list[int],
        receive_from: list[int],
        encoded: Encoded | None = None,
        push_weight: float | None = None,
    ) -> _Round:
        """Start one round and return at once (training thread): send ``encoded`` — or
        ``values`` as float32, without a copy: leave them unchanged until `_finish` — to every
        peer of ``send_to``; collect one tensor from each of ``receive_from``."""

    @abstractmethod
    def _finish(self, r: _Round, *, overlapped: bool) -> Received:
        """Wait for a started round (training thread); what arrived and the outcome.
        ``overlapped``: the caller did other work since `_start` (`Breakdown.overlap_ms`)."""

    @abstractmethod
    def _done(self, r: _Round) -> bool:
        """Whether a started round has ended; never blocks."""

    def _release(self, r: _Round) -> None:
        """A finished round's received tensors are no longer read (its handle's ``finish`` has
        returned): a plane may reuse their buffers. Nothing to do by default."""

    def _ended(self, r: _Round, t1: float, outcome: MixOutcome, *, overlapped: bool) -> None:
        """Account a round that ended: `Breakdown` (``t1``: when `_finish` was called),
        counters, `last_outcome`."""
        if overlapped:
            self.breakdown.overlap_ms += (t1 - r.started) * 1e3
        self.breakdown.wait_ms += (time.perf_counter() - (t1 if overlapped else r.started)) * 1e3
        self.counters.add_edges(r.edges, raw=r.raw, wire=r.wire)
        self.last_outcome = outcome

    def _round(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        values: torch.Tensor,
        send_to: list[int],
        receive_from: list[int],
    ) -> Received:
        """One blocking round (`_start`, then `_finish`)."""
        r = self._start(
            step=step,
            round=round,
            tensor_id=tensor_id,
            values=values,
            send_to=send_to,
            receive_from=receive_from,
        )
        return self._finish(r, overlapped=False)

    def mix(
        self,
        x: torch.Tensor,
        W: np.ndarray,
        *,
        codec: Codec | None = None,
        step: int = 0,
        round: int = 0,
        push: torch.Tensor | None = None,
    ) -> MixResult:
        handle = self.start_mix(x, W, codec=codec, step=step, round=round, push=push)
        return handle.result(overlapped=False)

    def start_mix(
        self,
        x: torch.Tensor,
        W: np.ndarray,
        *,
        codec: Codec | None = None,
        step: int = 0,
        round: int = 0,
        push: torch.Tensor | None = None,
    ) -> RoundHandle[MixResult]:
        """Encode (training thread), hand the round to the loop and return; the handle's
        ``wait`` decodes and mixes what arrived (`mix`'s result). ``x`` is sent without a copy
        (raw float32): leave it unchanged until ``wait`` has returned."""
        i = self.rank
        own_weight = None if push is None else float(push[0])
        receive_from = [j for j in range(self.n) if j != i and W[i, j] > 0]
        send_to = [j for j in range(self.n) if j != i and W[j, i] > 0]
        encoded = None
        sent = x
        t0 = time.perf_counter()
        if codec is not None and codec.name != "none":
            encoded = codec.encode(x[0], key=codec_key(i, round))
            sent = codec.decode(encoded, key=codec_key(i, round)).unsqueeze(0).to(x.dtype)
        self.breakdown.encode_ms += (time.perf_counter() - t0) * 1e3
        started = self._start(
            step=step,
            round=round,
            tensor_id=TENSOR_MIX,
            values=x[0],
            send_to=send_to,
            receive_from=receive_from,
            encoded=encoded,
            push_weight=own_weight,
        )

        def combine(received: Received) -> MixResult:
            arrived, outcome = received
            t0 = time.perf_counter()
            acc = sent[0] * float(W[i, i])  # a fresh tensor: the neighbours are added in place
            total = float(W[i, i])
            weight = None if own_weight is None else own_weight * float(W[i, i])
            for j in receive_from:
                got = arrived.get(j)
                if got is None:
                    continue
                if weight is not None and got.push_weight is None:
                    outcome.rejected[0].append((j, "push-sum round without the sender's weight"))
                    continue
                if encoded is not None and codec is not None:
                    try:
                        value = codec.decode(
                            Encoded(got.codec, got.tensors(), x.shape[1]), key=codec_key(j, round)
                        )
                    except CodecError as exc:  # parts were validated on arrival
                        outcome.rejected[0].append((j, str(exc)))
                        continue
                else:
                    value = got.tensors()["values"]
                acc.add_(value.to(x.dtype), alpha=float(W[i, j]))  # one pass, no temporaries
                total += float(W[i, j])
                if weight is not None and got.push_weight is not None:
                    weight += float(W[i, j]) * got.push_weight
            # renormalise over what arrived — except in push-sum rounds: there a lost message
            # takes its numerator and its weight with it, the ratio x/w stays unbiased, and P
            # need only be column-stochastic (rows may sum to anything)
            if weight is None and abs(total - 1.0) > 1e-12:
                acc.div_(total)
            self.counters.rounds += 1
            mixed = None if weight is None else torch.tensor([weight], dtype=torch.float64)
            self.breakdown.mix_ms += (time.perf_counter() - t0) * 1e3
            return MixResult(x=acc.unsqueeze(0), outcome=outcome, sent=sent, push=mixed)

        return RoundHandle(self, started, combine)

    def allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        """All-to-all over gRPC (n − 1 messages per peer; fine for the small n of one host or a
        lab; a ring all-reduce is the scalable alternative). Missing peers are left out."""
        return self.start_allreduce_mean(x, step=step).result(overlapped=False)

    def start_allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> RoundHandle[torch.Tensor]:
        """`allreduce_mean` without blocking: ``x`` is sent without a copy; leave it unchanged
        until the handle's ``wait`` has returned the average."""
        others = [j for j in range(self.n) if j != self.rank]
        started = self._start(
            step=step,
            round=0,
            tensor_id=TENSOR_ALLREDUCE,
            values=x[0],
            send_to=others,
            receive_from=others,
        )

        def average(received: Received) -> torch.Tensor:
            arrived, _ = received
            total = x[0].clone()
            for j in sorted(arrived):
                total += arrived[j].tensors()["values"].to(x.dtype)
            return (total / (1 + len(arrived))).unsqueeze(0)

        return RoundHandle(self, started, average)

    def exchange(
        self,
        outgoing: Mapping[Edge, torch.Tensor],
        incoming: Sequence[Edge],
        *,
        step: int = 0,
        round: int = 0,
    ) -> dict[Edge, torch.Tensor]:
        """Per-edge messages (RelaySGD, push-sum): one tensor per outgoing edge, then every
        incoming edge's tensor (tensor id TENSOR_EDGE; receivers tell edges apart by sender)."""
        for src, _ in outgoing:
            if src != self.rank:
                raise ValueError(f"edge from {src}: this peer is {self.rank}")
        for (_, dst), tensor in outgoing.items():
            self._round(
                step=step,
                round=round,
                tensor_id=TENSOR_EDGE,
                values=tensor,
                send_to=[dst],
                receive_from=[],
            )
        sources = [src for src, dst in incoming if dst == self.rank]
        arrived, _ = self._round(
            step=step,
            round=round,
            tensor_id=TENSOR_EDGE,
            values=torch.zeros(0),
            send_to=[],
            receive_from=sources,
        )
        return {
            (src, dst): arrived[src].tensors()["values"].clone()
            for src, dst in incoming
            if src in arrived
        }


class PeerComm(RoundComm):
    """`RoundComm` over the peer's gRPC `concord.peer.transport.Transport`: each round is one
    coroutine on the peer's event loop (module docstring)."""

    def __init__(
        self, rank: int, world_size: int, transport: Transport, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__(rank, world_size)
        self.transport = transport
        self.loop = loop
        # the training thread and the loop share one GIL (below)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))

    def begin_step(self, step: int) -> None:
        """Move the mailbox (owned by the loop) to this step: neighbours' frames are accepted up
        to STEP_WINDOW steps ahead of it even when the algorithm did not communicate for a while
        (local SGD's local-only steps)."""
        self.loop.call_soon_threadsafe(self.transport.mailbox.advance, self.step_base + step)

    def _start(
        self,
        *,
        step: int,
        round: int,
        tensor_id: int,
        values: torch.Tensor,
        send_to: list[int],
        receive_from: list[int],
        encoded: Encoded | None = None,
        push_weight: float | None = None,
    ) -> _Round:
        """Build the frames (training thread) and hand the round to the loop."""
        t0 = time.perf_counter()
        step += self.step_base
        flat = values.detach().to(torch.float32).contiguous().view(-1)
        parts = encoded.parts if encoded is not None else {"values": flat}
        frames = (
            self.transport.frames(
                step=step,
                round=round,
                tensor_id=tensor_id,
                codec=encoded.codec if encoded is not None else "none",
                parts=parts,
                push_weight=push_weight,
            )
            if send_to
            else None
        )
        coro = self.transport.round_(
            step=step,
            round=round,
            tensor_id=tensor_id,
            frames=frames,
            send_to=send_to,
            receive_from=receive_from,
        )
        started = time.perf_counter()
        self.breakdown.encode_ms += (started - t0) * 1e3
        wire = sum(t.numel() * t.element_size() for t in parts.values())
        return _GrpcRound(
            future=asyncio.run_coroutine_threadsafe(coro, self.loop),
            started=started,
            step=step,
            round=round,
            tensor_id=tensor_id,
            edges=[(self.rank, j) for j in send_to],
            receive_from=receive_from,
            raw=flat.numel() * 4,
            wire=wire,
        )

    def _done(self, r: _Round) -> bool:
        assert isinstance(r, _GrpcRound)
        return r.future.done()

    def _finish(self, r: _Round, *, overlapped: bool) -> Received:
        assert isinstance(r, _GrpcRound)
        t1 = time.perf_counter()
        try:
            # `round_` ends at its deadline (sends and receives are bounded per tensor); this
            # is the backstop: a round stuck beyond it is recorded as missing every neighbour,
            # never an exception out of the training step
            arrived, outcome = r.future.result(timeout=2 * self.transport.deadline + _SLACK)
        except concurrent.futures.TimeoutError:
            r.future.cancel()
            log.warning(
                "round.overrun",
                peer=self.rank,
                step=r.step,
                round=r.round,
                tensor_id=r.tensor_id,
                waited=2 * self.transport.deadline + _SLACK,
            )
            arrived = {}
            outcome = MixOutcome(answered=[[]], missing=[list(r.receive_from)], rejected=[[]])
        self._ended(r, t1, outcome, overlapped=overlapped)
        return arrived, outcome


@dataclass
class _Round:
    """One round started on a data plane (`RoundComm._start`) and what to account when it
    ends."""

    started: float  # perf_counter when it was handed over
    step: int  # with the step base
    round: int
    tensor_id: int
    edges: list[Edge]  # (this peer, j) for every j sent to
    receive_from: list[int]
    raw: int  # bytes per message before the codec
    wire: int  # bytes per message on the wire


@dataclass
class _GrpcRound(_Round):
    """A round handed to the event loop (`PeerComm._start`)."""

    future: concurrent.futures.Future[tuple[dict[int, Arrival], MixOutcome]] = field(
        default_factory=concurrent.futures.Future
    )


class RoundHandle(Pending[T]):
    """A round of a `RoundComm` in flight on its data plane (`concord.core.comm.Pending`):
    ``done`` polls it without blocking; ``wait`` (training thread) blocks until it has ended,
    then runs ``finish`` — the decoding and arithmetic — on what arrived, once. ``finish`` must
    not keep a received tensor (or a view of one) beyond its return: the plane may reuse their
    buffers for later rounds (`RoundComm._release`)."""

    def __init__(self, comm: RoundComm, round: _Round, finish: Callable[[Received], T]) -> None:
        self.comm = comm
        self.round = round
        self._finish = finish
        self._result: tuple[T] | None = None

    def done(self) -> bool:
        return self._result is not None or self.comm._done(self.round)

    def wait(self) -> T:
        return self.result(overlapped=True)

    def result(self, *, overlapped: bool) -> T:
        """`wait`; ``overlapped=False`` for a blocking call that waits right after the start
        (its time is all ``wait_ms``, none ``overlap_ms``)."""
        if self._result is None:
            self._result = (self._finish(self.comm._finish(self.round, overlapped=overlapped)),)
            self.comm._release(self.round)  # ``finish`` keeps nothing it received
        return self._result[0]
