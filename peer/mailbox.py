"""Received tensors waiting for the training thread, keyed by (sender, step, round, tensor id).

The event loop fills the mailbox (`concord.peer.transport`), the training thread's coroutine waits
on it (`Transport.round_`). A tensor may arrive before its round starts here — a neighbour one or
two steps ahead — and then waits in its slot; a tensor of a step this peer has already left is
refused as late (the sender gets ``ACK_LATE``); entering a step drops every older slot.

A slot resolves to either the `Arrival` or a `Rejection` (the tensor was refused by
`concord.peer.validate`): the round then records the neighbour as *rejected* instead of waiting for
it until the deadline.

Receive buffers: each tensor is assembled into one uninitialised ``numpy.empty`` buffer of exactly
its byte length (no zero fill: every byte is written by a chunk before the tensor is filed, and
a tensor whose chunks do not cover it is rejected); no per-chunk objects are kept, and the parts
are zero-copy ``torch.frombuffer`` views of it. The peer tunes glibc malloc at start
(`concord.peer.memory.tune_malloc`, docs/transport.md#memory), so these buffers come from the heap
without page faulting every time; the training thread drops its reference after the mix, which
returns the memory for the next round's buffer. Buffers are never reused by the receiver itself: the
training thread may still read an earlier `Arrival` of the same sender.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
import torch

from concord.peer import serde

Key = tuple[int, int, int, int]  # (sender, step, round, tensor id)


@dataclass
class Arrival:
    """One complete, validated tensor from ``sender`` (its parts packed in ``payload``)."""

    sender: int
    step: int
    round: int
    tensor_id: int
    codec: str
    parts: tuple[serde.PartSpec, ...]
    payload: bytearray | np.ndarray  # uint8, exactly the tensor's byte length
    push_weight: float | None = None  # the sender's push-sum weight, when it sent one (SGP)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Zero-copy views of the named parts."""
        return serde.tensors_from_payload(self.payload, self.parts)


@dataclass(frozen=True)
class Rejection:
    """The tensor in this slot was refused; ``reason`` names the broken check."""

    sender: int
    reason: str


@dataclass
class Counters:
    """Receive-side counts for metrics and the summary (cumulative)."""

    received: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # reason class → count
    late: int = 0
    send_failures: int = 0

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Mailbox:
    """Slots for complete tensors; the loop's only shared state with the round coroutine.

    Invariant: every slot's step is ≥ ``self.step`` (older slots are dropped by `advance`).
    """

    def __init__(self) -> None:
        self._slots: dict[Key, asyncio.Future[Arrival | Rejection]] = {}
        self.step = 0

    def _slot(self, key: Key) -> asyncio.Future[Arrival | Rejection]:
        fut = self._slots.get(key)
        if fut is None:
            fut = self._slots[key] = asyncio.get_running_loop().create_future()
        return fut

    def deliver(self, arrival: Arrival) -> bool:
        """File a complete tensor; False when it is late (its step is over here)."""
        if arrival.step < self.step:
            return False
        fut = self._slot((arrival.sender, arrival.step, arrival.round, arrival.tensor_id))
        if not fut.done():
            fut.set_result(arrival)
        return True

    def reject(self, key: Key, reason: str, *, horizon: int) -> None:
        """Mark a slot as refused (so its round does not wait for it); ignored when its step is
        over, beyond ``horizon`` (no slots for arbitrary future steps), or already filled."""
        if not self.step <= key[1] <= horizon:
            return
        fut = self._slot(key)
        if not fut.done():
            fut.set_result(Rejection(key[0], reason))

    def slot(self, key: Key) -> asyncio.Future[Arrival | Rejection]:
        return self._slot(key)

    def advance(self, step: int) -> None:
        """Enter ``step``: slots of earlier steps are dropped."""
        self.step = max(self.step, step)
        for key in [k for k in self._slots if k[1] < self.step]:
            fut = self._slots.pop(key)
            if not fut.done():
                fut.cancel()

    def __len__(self) -> int:
        return len(self._slots)
