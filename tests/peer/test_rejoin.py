"""Where a rejoining peer starts (`concord.peer.rejoin`): one fetch path, two placements — a
restarted static peer (`Restart`) and an orchestrated peer re-admitted at a step (`Readmission`)."""

from __future__ import annotations

import torch

from concord.peer.rejoin import Readmission, Restart
from concord.peer.transport import Fetched

BASE = 100  # the stage's step_base: wire steps are BASE + local steps
TOTAL = 500  # steps of the stage


def answer(sender: int, local_step: int, round: int) -> Fetched:
    """A neighbour's Fetch answer taken before its local step ``local_step``."""
    return Fetched(sender, BASE + local_step, round, torch.zeros(4))


def test_a_restarted_peer_without_an_answer_goes_on_from_its_checkpoint() -> None:
    placed = Restart(start=40, fetch_after=10).place(None, BASE, TOTAL)
    assert (placed.step, placed.rounds_total, placed.got, placed.record) == (40, None, None, {})


def test_a_restarted_peer_close_behind_keeps_its_own_parameters() -> None:
    how = Restart(start=40, fetch_after=10)
    placed = how.place(answer(2, 50, 50), BASE, TOTAL)  # 10 steps ahead: not more than 10
    assert (placed.step, placed.got, placed.record) == (40, None, {})


def test_a_restarted_peer_far_behind_takes_the_answer_and_starts_after_it() -> None:
    got = answer(2, 51, 57)
    placed = Restart(start=40, fetch_after=10).place(got, BASE, TOTAL)
    assert placed.got is got
    assert (placed.step, placed.rounds_total) == (52, 58)  # one round per step from there
    assert placed.record == {"from_peer": 2, "at_step": 52, "checkpoint_step": 40}


def test_a_restarted_peer_that_keeps_its_step_takes_only_the_parameters() -> None:
    # AD-PSGD under the global budget: its step count is the progress it adds to Σ k; taking
    # the neighbour's (51) would count 11 steps nobody took, and the run would stop early
    got = answer(2, 51, 57)
    placed = Restart(start=40, fetch_after=10, keep_step=True).place(got, BASE, TOTAL)
    assert placed.got is got
    assert (placed.step, placed.rounds_total) == (40, None)  # its own step and rounds
    assert placed.record == {
        "from_peer": 2, "at_step": 40, "neighbour_step": 51, "checkpoint_step": 40
    }  # fmt: skip
    # close behind: nothing adopted, as without keep_step
    close = Restart(start=40, fetch_after=10, keep_step=True).place(answer(2, 50, 50), BASE, TOTAL)
    assert (close.step, close.got) == (40, None)


def test_only_ad_psgd_keeps_its_step() -> None:
    from concord.core.algorithms.catalog import CATALOG

    assert [n for n, s in CATALOG.items() if not s.steps_align] == ["ad-psgd"]


def test_a_restarted_peer_does_not_jump_past_the_end_of_the_stage() -> None:
    placed = Restart(start=0, fetch_after=10).place(answer(1, TOTAL - 1, 9), BASE, TOTAL)
    assert (placed.step, placed.got) == (0, None)


def test_a_readmitted_peer_without_an_answer_starts_at_its_step_with_its_own_parameters() -> None:
    placed = Readmission(join_at=80).place(None, BASE, TOTAL)
    assert (placed.step, placed.rounds_total, placed.got) == (80, 80, None)
    assert placed.record == {"at_step": 80, "readmitted_at": 80}


def test_a_readmitted_peer_answered_at_its_joining_step_takes_the_neighbours_rounds() -> None:
    got = answer(0, 80, 93)  # answered at the boundary of step 80 (`Transport.joins_at`)
    placed = Readmission(join_at=80).place(got, BASE, TOTAL)
    assert (placed.step, placed.rounds_total, placed.got) == (80, 93, got)
    assert placed.record == {"from_peer": 0, "at_step": 80, "readmitted_at": 80}


def test_a_readmitted_peer_whose_neighbour_is_past_its_step_starts_after_the_neighbour() -> None:
    placed = Readmission(join_at=80).place(answer(3, 85, 99), BASE, TOTAL)
    assert (placed.step, placed.rounds_total) == (86, 100)
    assert placed.record == {"from_peer": 3, "at_step": 86, "readmitted_at": 80}


def test_a_readmission_after_the_end_starts_at_the_last_step() -> None:
    placed = Readmission(join_at=TOTAL + 5).place(None, BASE, TOTAL)
    assert placed.step == TOTAL - 1
