"""The round book under ``control.mode = "fixed"``: peers run ``control.rounds`` rounds on their
own, so the book records every round (through the controller) and publishes no decision."""

from __future__ import annotations

import pytest

from concord.core.config import RunConfig, load_config
from concord.core.control.controller import ConsensusController
from concord.core.control.runplan import control_config, make_lr_schedule, make_plan
from concord.orchestrator.rounds import RoundBook
from concord.protos.control_plane import Stats

PEERS = {0, 1, 2}
STEPS_PER_EPOCH = 10  # with epochs=2: 20 steps, phases [0, 10) [10, 15) [15, 20)


def config(*extra: str) -> RunConfig:
    return load_config(
        None,
        [
            "epochs=2",
            "optim.warmup=0.0",
            "control.mode=fixed",
            "control.rounds=3",
            "control.max_rounds=4",
            "control.phases=[1, 2]",
            *extra,
        ],
        environ={},
    )


def book_of(cfg: RunConfig) -> RoundBook:
    plan = make_plan(cfg, make_lr_schedule(cfg, STEPS_PER_EPOCH))
    return RoundBook("train", plan, controller=ConsensusController(control_config(cfg), plan))


def step_stats(step: int, rounds: int) -> list[Stats]:
    """Every peer's statistics of ``step``, as they arrive on the step records: peer by peer,
    each with its rounds 1 … rounds in order."""
    return [
        Stats(peer=p, step=step, round=r, theta=0.1 * r + p, grad_norm=1.0)
        for p in (2, 0, 1)
        for r in range(1, rounds + 1)
    ]


@pytest.mark.parametrize("lagged", [False, True])
def test_every_round_is_recorded_and_nothing_is_published(lagged: bool) -> None:
    book = book_of(config(f"control.lagged={str(lagged).lower()}"))
    assert book.silent
    published = []
    for step in (0, 1, 9):  # phase 1
        for s in step_stats(step, 3):
            published += book.add(s, PEERS, now=0.0)
    for s in step_stats(10, 3):  # phase 2, also controlled
        published += book.add(s, PEERS, now=0.0)
    assert published == []
    assert len(book.records) == 4 * 3
    for i, rec in enumerate(book.records):
        assert (rec.round, rec.peers, rec.partial) == (i % 3 + 1, 3, False)
        assert (rec.repeat, rec.target, rec.reason) == (i % 3 < 2, None, "fixed-rounds")
        assert rec.rounds_next == (3 if lagged and i % 3 == 2 else None)
    assert (book.ignored, book.refused) == (0, 0)


def test_a_step_cut_short_is_closed_without_a_decision() -> None:
    """A round that never completes (a peer left mid-step) is decided on its timeout, and the
    next step closes the incomplete one; still nothing is published."""
    book = book_of(config())
    out = []
    for s in step_stats(0, 1):
        out += book.add(s, PEERS, now=0.0)
    out += book.add(Stats(peer=0, step=0, round=2, theta=1.0, grad_norm=1.0), PEERS, now=0.0)
    out += book.expire(PEERS, now=100.0)  # round 2 decided partial
    for s in step_stats(1, 3):
        out += book.add(s, PEERS, now=100.0)
    assert out == []
    assert [(r.step, r.round, r.partial) for r in book.records][:2] == [(0, 1, False), (0, 2, True)]
    assert [(r.step, r.round, r.repeat) for r in book.records[2:]] == [
        (1, 1, True),
        (1, 2, True),
        (1, 3, False),
    ]
