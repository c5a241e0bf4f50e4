"""Mailbox slots: early tensors wait, late ones are refused, rejections resolve their slot."""

from __future__ import annotations

import asyncio

import torch

from concord.peer.mailbox import Arrival, Mailbox, Rejection
from concord.peer.serde import PartSpec


def _arrival(sender: int, step: int, round: int) -> Arrival:
    payload = bytearray(torch.arange(3, dtype=torch.float32).numpy().tobytes())
    return Arrival(
        sender, step, round, 0, "none", (PartSpec("values", torch.float32, 3, 0),), payload
    )


def test_early_tensor_waits_and_late_tensor_is_refused() -> None:
    async def main() -> None:
        box = Mailbox()
        box.advance(5)
        assert box.deliver(_arrival(1, 6, 9))  # a neighbour one step ahead
        assert not box.deliver(_arrival(1, 4, 7))  # a step this peer has left
        slot = box.slot((1, 6, 9, 0))
        assert slot.done()
        got = slot.result()
        assert isinstance(got, Arrival)
        assert got.tensors()["values"].tolist() == [0.0, 1.0, 2.0]
        box.advance(7)  # entering step 7 drops the slot of step 6
        assert len(box) == 0

    asyncio.run(main())


def test_rejection_resolves_a_slot_within_the_horizon_only() -> None:
    async def main() -> None:
        box = Mailbox()
        box.advance(3)
        waiting = box.slot((2, 3, 3, 0))
        box.reject((2, 3, 3, 0), "INVALID_ARGUMENT: nan", horizon=5)
        assert waiting.result() == Rejection(2, "INVALID_ARGUMENT: nan")
        box.reject((2, 99, 99, 0), "too far ahead", horizon=5)  # no slot for far-future steps
        box.reject((2, 1, 1, 0), "old", horizon=5)
        assert len(box) == 1
        # a slot already filled keeps its tensor
        box.deliver(_arrival(1, 4, 4))
        box.reject((1, 4, 4, 0), "duplicate", horizon=5)
        assert isinstance(box.slot((1, 4, 4, 0)).result(), Arrival)

    asyncio.run(main())


def test_advance_cancels_waiting_slots_of_old_steps() -> None:
    async def main() -> None:
        box = Mailbox()
        slot = box.slot((1, 0, 0, 0))
        box.advance(1)
        assert slot.cancelled()
        box.advance(0)  # never goes back
        assert box.step == 1

    asyncio.run(main())
