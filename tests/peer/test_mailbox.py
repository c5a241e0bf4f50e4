"""Mailbox slots: early tensors wait, late ones are refused, rejections resolve their slot."""

from __future__ import annotations

import asyncio

import pytest
import torch

from concord.errors import RejectedError
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


def test_a_flood_is_capped_per_sender_and_per_step_and_counted() -> None:
    async def main() -> None:
        box = Mailbox(per_sender=4, per_step=6)
        box.advance(2)
        for r in range(4):
            assert box.deliver(_arrival(1, 2, r))
        with pytest.raises(RejectedError, match="cap 4"):  # the 5th early tensor of sender 1
            box.deliver(_arrival(1, 2, 99))
        for r in range(2):
            assert box.deliver(_arrival(2, 2, r))
        with pytest.raises(RejectedError, match="cap 6"):  # a 7th entry for step 2
            box.deliver(_arrival(3, 2, 0))
        box.reject((3, 2, 5, 0), "bad", horizon=4)  # rejections count too: dropped
        assert len(box) == 6
        assert box.dropped == 3
        # a round's own slot is never capped, and awaiting a slot frees its place
        assert not box.slot((3, 2, 0, 0)).done()
        box.slot((1, 2, 0, 0))
        assert box.deliver(_arrival(1, 3, 0))  # sender 1 has 3 early entries again

    asyncio.run(main())


def test_bytes_in_flight_are_released_when_taken_dropped_or_late() -> None:
    async def main() -> None:
        box = Mailbox()
        assert box.reserve(1, 12, budget=24)
        assert box.reserve(1, 12, budget=24)
        assert not box.reserve(1, 1, budget=24)  # over the budget: nothing reserved
        assert box.held(1) == 24
        assert box.deliver(_arrival(1, 0, 1), reserved=12)
        assert box.deliver(_arrival(1, 1, 1), reserved=12)
        box.take((1, 0, 1, 0))  # the round collected it
        assert box.held(1) == 12
        assert box.reserve(1, 12, budget=24)
        assert not box.deliver(_arrival(1, 0, 1), reserved=12)  # collected already: late
        assert box.held(1) == 12
        box.advance(2)  # step 1's tensor is dropped with its bytes
        assert box.held(1) == 0
        assert len(box) == 0

    asyncio.run(main())
