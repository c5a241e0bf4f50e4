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

Bounds (a neighbour, or anyone holding its identity, must not grow this peer without limit):

* bytes in flight per sender (`reserve` / `release`): chunk 0 of a tensor reserves its byte
  length against the sender's budget (≈ two tensors, set by the transport); the reservation moves
  with the tensor into its slot and is released when the round collects it (`take`), when the
  step is left (`advance`), when it turns out late or a duplicate, or when its stream dies
  half-way (the servicer releases it). A chunk 0 over the budget is refused.
* entries the network created and no round is waiting for yet (early tensors, rejections): at
  most ``per_sender`` per sender and ``per_step`` per step; one more is dropped and counted
  (`dropped`) — `deliver` raises `RejectedError` ("overload") so the sender learns it.
* a slot whose round has already collected it (`take`) is closed: a tensor arriving for it
  afterwards is late (``ACK_LATE``), never filed again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
import torch

from concord.errors import RejectedError
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
    missed_deadlines: int = 0  # rounds that gave up on a neighbour's tensor at the deadline
    skipped: int = 0  # times a neighbour became suspect (`network.skip_after` rounds missed)
    back: int = 0  # times a suspect neighbour was taken back
    not_waited: int = 0  # (neighbour, round) pairs a suspect was missing without a wait
    dropped_sends: int = 0  # tensors not sent to a suspect (its last one still in flight)

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


class Mailbox:
    """Slots for complete tensors; the loop's only shared state with the round coroutine.

    Invariant: every slot's step is ≥ ``self.step`` (older slots are dropped by `advance`).
    """

    def __init__(self, *, per_sender: int = 16, per_step: int = 256) -> None:
        self._slots: dict[Key, asyncio.Future[Arrival | Rejection]] = {}
        self.step = 0
        self.per_sender, self.per_step = per_sender, per_step
        self._unawaited: set[Key] = set()  # network-created slots no round has asked for yet
        self._sizes: dict[Key, int] = {}  # bytes reserved by the tensor filed in a slot
        self._held: dict[int, int] = {}  # sender → bytes reserved (assembling + filed)
        self._closed: set[Key] = set()  # slots their round has collected (this step or later)
        self.dropped = 0  # entries refused by the caps
        self.newest: dict[int, int] = {}  # sender → the latest step of a tensor it delivered
        self.watch: asyncio.Future[None] | None = None  # resolved when `newest` moves (`seen`)

    # -- bytes in flight ------------------------------------------------------------------------

    def held(self, sender: int) -> int:
        return self._held.get(sender, 0)

    def reserve(self, sender: int, nbytes: int, budget: int) -> bool:
        """Reserve ``nbytes`` of ``sender``'s in-flight budget; False (nothing reserved) when it
        would exceed ``budget``."""
        held = self._held.get(sender, 0)
        if held + nbytes > budget:
            return False
        self._held[sender] = held + nbytes
        return True

    def release(self, sender: int, nbytes: int) -> None:
        left = self._held.get(sender, 0) - nbytes
        if left > 0:
            self._held[sender] = left
        else:
            self._held.pop(sender, None)

    def _drop(self, key: Key) -> asyncio.Future[Arrival | Rejection] | None:
        fut = self._slots.pop(key, None)
        self._unawaited.discard(key)
        size = self._sizes.pop(key, 0)
        if size:
            self.release(key[0], size)
        return fut

    def seen(self, sender: int, step: int) -> None:
        """``sender`` sent a tensor of ``step`` (filed, late, or refused as too far ahead): a
        round waiting for one of its earlier steps stops waiting (streams are in order, so that
        one is here already or never comes)."""
        if step > self.newest.get(sender, -1):
            self.newest[sender] = step
            if self.watch is not None and not self.watch.done():
                self.watch.set_result(None)

    def _admit(self, key: Key) -> None:
        """Room for one more network-created slot (raises `RejectedError` "overload")."""
        if key in self._slots:
            return
        sender, step = key[0], key[1]
        mine = sum(1 for k in self._unawaited if k[0] == sender)
        if mine >= self.per_sender:
            self.dropped += 1
            raise RejectedError(
                "overload", f"peer {sender} has {mine} tensors waiting here (cap {self.per_sender})"
            )
        same_step = sum(1 for k in self._unawaited if k[1] == step)
        if same_step >= self.per_step:
            self.dropped += 1
            raise RejectedError(
                "overload", f"{same_step} tensors waiting for step {step} (cap {self.per_step})"
            )

    def _slot(self, key: Key) -> asyncio.Future[Arrival | Rejection]:
        fut = self._slots.get(key)
        if fut is None:
            fut = self._slots[key] = asyncio.get_running_loop().create_future()
        return fut

    def deliver(self, arrival: Arrival, reserved: int = 0) -> bool:
        """File a complete tensor; False when it is late (its step is over here, or its round
        has already collected that slot). ``reserved``: bytes `reserve`d for it, now held by its
        slot (released by `take` / `advance`), or released at once when it is not filed. Raises
        `RejectedError` ("overload", after releasing) when the caps leave no room for it."""
        key = (arrival.sender, arrival.step, arrival.round, arrival.tensor_id)
        self.seen(arrival.sender, arrival.step)
        if arrival.step < self.step or key in self._closed:
            self.release(arrival.sender, reserved)
            return False
        try:
            self._admit(key)
        except RejectedError:
            self.release(arrival.sender, reserved)
            raise
        fut = self._slots.get(key)
        if fut is None:
            fut = self._slot(key)
            self._unawaited.add(key)
        if fut.done():  # a duplicate, or a rejection got there first
            self.release(arrival.sender, reserved)
        else:
            fut.set_result(arrival)
            if reserved:
                self._sizes[key] = reserved
        return True

    def reject(self, key: Key, reason: str, *, horizon: int) -> None:
        """Mark a slot as refused (so its round does not wait for it); ignored when its step is
        over, beyond ``horizon`` (no slots for arbitrary future steps), already filled or
        collected, or when the caps leave no room (counted in `dropped`)."""
        if not self.step <= key[1] <= horizon or key in self._closed:
            return
        fut = self._slots.get(key)
        if fut is None:
            try:
                self._admit(key)
            except RejectedError:
                return
            fut = self._slot(key)
            self._unawaited.add(key)
        if not fut.done():
            fut.set_result(Rejection(key[0], reason))

    def slot(self, key: Key) -> asyncio.Future[Arrival | Rejection]:
        """The slot a round waits on (not counted against the caps)."""
        self._unawaited.discard(key)
        return self._slot(key)

    def take(self, key: Key) -> None:
        """The round has collected ``key`` (or given up on it): drop the slot, release its bytes,
        and treat anything arriving for it from now on as late."""
        fut = self._drop(key)
        if fut is not None and not fut.done():
            fut.cancel()
        if key[1] >= self.step:
            self._closed.add(key)

    def advance(self, step: int) -> None:
        """Enter ``step``: slots of earlier steps are dropped (and their bytes released)."""
        self.step = max(self.step, step)
        for key in [k for k in self._slots if k[1] < self.step]:
            fut = self._drop(key)
            if fut is not None and not fut.done():
                fut.cancel()
        self._closed = {k for k in self._closed if k[1] >= self.step}

    def __len__(self) -> int:
        return len(self._slots)
