"""The peer lifecycle (`concord.peer.lifecycle`): every allowed transition is taken, every other
pair of states is refused with an error naming both, and docs/architecture.md shows the table the
code holds."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import structlog

from concord.peer.lifecycle import (
    STATES,
    TERMINAL,
    TRANSITIONS,
    IllegalTransitionError,
    Lifecycle,
    State,
    markdown,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ALL_PAIRS = list(itertools.product(State, State))
REFUSED = [pair for pair in ALL_PAIRS if pair not in TRANSITIONS]


def _path_to(state: State) -> list[State]:
    """The states after ``starting`` on a shortest allowed path to ``state`` (breadth first)."""
    paths: dict[State, list[State]] = {State.STARTING: []}
    frontier = [State.STARTING]
    while frontier:
        nxt = []
        for a in frontier:
            for x, b in TRANSITIONS:
                if x == a and b not in paths:
                    paths[b] = [*paths[a], b]
                    nxt.append(b)
        frontier = nxt
    return paths[state]


def at(state: State) -> Lifecycle:
    """A lifecycle brought to ``state`` through allowed transitions only."""
    life = Lifecycle()
    for s in _path_to(state):
        life.to(s)
    assert life.state == state
    return life


def test_every_state_is_reachable_and_every_live_state_can_end() -> None:
    for state in State:
        at(state)  # raises KeyError when unreachable
    for state in set(State) - TERMINAL:
        assert any(a == state and b == State.FAILED for a, b in TRANSITIONS), state
    assert not [pair for pair in TRANSITIONS if pair[0] in TERMINAL]  # an end is final
    assert set(STATES) == set(State)  # every state says what it means


@pytest.mark.parametrize(("src", "dst"), list(TRANSITIONS), ids=lambda s: str(s))
def test_an_allowed_transition_is_taken_and_logged(src: State, dst: State) -> None:
    life = at(src)
    with structlog.testing.capture_logs() as logs:
        life.to(dst, step=7)
    assert life.state == dst
    assert life.history[-2:] == [src, dst]
    (line,) = [x for x in logs if x["event"] == "peer.state"]
    assert (line["from"], line["to"], line["step"]) == (str(src), str(dst), 7)


@pytest.mark.parametrize(("src", "dst"), REFUSED, ids=lambda s: str(s))
def test_a_transition_not_in_the_table_is_refused_naming_both_states(
    src: State, dst: State
) -> None:
    life = at(src)
    with pytest.raises(IllegalTransitionError, match=f"from {src} to {dst}"):
        life.to(dst)
    assert life.state == src  # unchanged


def test_the_refused_pairs_are_all_the_others() -> None:
    assert len(REFUSED) + len(TRANSITIONS) == len(State) ** 2
    assert len(REFUSED) > len(TRANSITIONS)  # the table is a restriction, not a formality


def test_fail_ends_a_live_lifecycle_and_leaves_an_ended_one() -> None:
    life = at(State.TRAINING)
    life.fail(error="boom")
    assert life.state == State.FAILED
    assert life.ended
    done = at(State.DONE)
    done.fail()
    assert done.state == State.DONE


def _section(text: str, title: str) -> str:
    """The body of the ``## title`` section of a Markdown page."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match is not None, f"docs/architecture.md has no '## {title}' section"
    return match.group(1)


def test_the_docs_show_the_table_of_the_code() -> None:
    section = _section(DOCS.read_text(encoding="utf-8"), "Peer lifecycle")
    assert markdown() in section, (
        "docs/architecture.md#peer-lifecycle differs from the code: paste the output of "
        "`python -c 'from concord.peer.lifecycle import markdown; print(markdown())'`"
    )
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (.+) \|$", section, re.M)
    assert {(State(a), State(b)): why for a, b, why in rows} == dict(TRANSITIONS)
    states = re.findall(r"^\| `(\w+)` \| ([^|]+) \|$", section, re.M)
    assert {State(s): meaning for s, meaning in states} == dict(STATES)
