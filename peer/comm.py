"""`PeerComm`: the `concord.core.comm.Comm` interface of one peer, backed by the gRPC transport.

The training thread calls these methods synchronously; each submits one coroutine to the peer's
event loop (`asyncio.run_coroutine_threadsafe`) and waits for it. All tensor arithmetic (packing,
the weighted sum, renormalisation) happens here, in the training thread, never on the loop.

`Breakdown`: where a step's communication time goes, as the training thread sees it —
``encode_ms`` (codec encode and building the frames), ``wait_ms`` (from handing the round to the
loop until it ends: sending, the wire, waiting for the neighbours) and ``mix_ms`` (decoding and
the weighted sum). The peer adds them to each step record (`take_breakdown`); the rest of the
step is computation and control.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import structlog
import torch

from concord.core.comm import Comm, CommCounters, Edge, MixOutcome, MixResult
from concord.core.compress import CodecError, Encoded, codec_key
from concord.peer.serde import TENSOR_ALLREDUCE, TENSOR_EDGE, TENSOR_MIX

if TYPE_CHECKING:
    from concord.core.compress import Codec
    from concord.peer.mailbox import Arrival
    from concord.peer.transport import Transport

log = structlog.get_logger("concord.peer.comm")
_SLACK = 5.0  # seconds a round may overrun its deadline before the training thread gives up


@dataclass
class Breakdown:
    """Milliseconds of one step spent in each part of communication (module docstring)."""

    encode_ms: float = 0.0
    wait_ms: float = 0.0
    mix_ms: float = 0.0

    def as_record(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


class PeerComm(Comm):
    def __init__(
        self, rank: int, world_size: int, transport: Transport, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.rank = rank
        self.n = world_size
        self.transport = transport
        self.loop = loop
        self.counters = CommCounters()
        self.last_outcome: MixOutcome | None = None
        self.step_base = 0  # added to data-plane step numbers (a run's stages never share one)
        self.breakdown = Breakdown()

    def take_breakdown(self) -> dict[str, float]:
        """This step's `Breakdown` as record fields; starts the next one."""
        out, self.breakdown = self.breakdown.as_record(), Breakdown()
        return out

    def begin_step(self, step: int) -> None:
        """Move the mailbox (owned by the loop) to this step: neighbours' frames are accepted up
        to STEP_WINDOW steps ahead of it even when the algorithm did not communicate for a while
        (local SGD's local-only steps)."""
        self.loop.call_soon_threadsafe(self.transport.mailbox.advance, self.step_base + step)

    @property
    def world_size(self) -> int:
        return self.n

    @property
    def ranks(self) -> Sequence[int]:
        return (self.rank,)

    def _round(
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
    ) -> tuple[dict[int, Arrival], MixOutcome]:
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
        t1 = time.perf_counter()
        self.breakdown.encode_ms += (t1 - t0) * 1e3
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            # `round_` ends at its deadline (sends and receives are bounded per tensor); this
            # is the backstop: a round stuck beyond it is recorded as missing every neighbour,
            # never an exception out of the training step
            arrived, outcome = future.result(timeout=2 * self.transport.deadline + _SLACK)
        except concurrent.futures.TimeoutError:
            future.cancel()
            log.warning(
                "round.overrun",
                peer=self.rank,
                step=step,
                round=round,
                tensor_id=tensor_id,
                waited=2 * self.transport.deadline + _SLACK,
            )
            arrived = {}
            outcome = MixOutcome(answered=[[]], missing=[list(receive_from)], rejected=[[]])
        self.breakdown.wait_ms += (time.perf_counter() - t1) * 1e3
        wire = sum(t.numel() * t.element_size() for t in parts.values())
        self.counters.add_edges([(self.rank, j) for j in send_to], raw=flat.numel() * 4, wire=wire)
        self.last_outcome = outcome
        return arrived, outcome

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
        arrived, outcome = self._round(
            step=step,
            round=round,
            tensor_id=TENSOR_MIX,
            values=x[0],
            send_to=send_to,
            receive_from=receive_from,
            encoded=encoded,
            push_weight=own_weight,
        )
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
        # takes its numerator and its weight with it, the ratio x/w stays unbiased, and P need
        # only be column-stochastic (rows may sum to anything)
        if weight is None and abs(total - 1.0) > 1e-12:
            acc.div_(total)
        self.counters.rounds += 1
        mixed = None if weight is None else torch.tensor([weight], dtype=torch.float64)
        self.breakdown.mix_ms += (time.perf_counter() - t0) * 1e3
        return MixResult(x=acc.unsqueeze(0), outcome=outcome, sent=sent, push=mixed)

    def allreduce_mean(self, x: torch.Tensor, *, step: int = 0) -> torch.Tensor:
        """All-to-all over gRPC (n − 1 messages per peer; fine for the small n of one host or a
        lab; a ring all-reduce is the scalable alternative). Missing peers are left out."""
        others = [j for j in range(self.n) if j != self.rank]
        arrived, _ = self._round(
            step=step,
            round=0,
            tensor_id=TENSOR_ALLREDUCE,
            values=x[0],
            send_to=others,
            receive_from=others,
        )
        total = x[0].clone()
        for j in sorted(arrived):
            total += arrived[j].tensors()["values"].to(x.dtype)
        return (total / (1 + len(arrived))).unsqueeze(0)

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
