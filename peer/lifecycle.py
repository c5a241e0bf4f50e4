"""The peer process's lifecycle: its states, the transitions allowed between them (one table,
`TRANSITIONS`) and `Lifecycle`, which holds the current state and refuses any other transition.

`concord.peer.app.PeerProcess` moves through it: set up (``starting``), join the run
(``joining``), wait for each stage (``waiting``), continue from a checkpoint (``resuming``),
catch up with neighbours that went on without it (``rejoining``: a Fetch of their parameters, or
a jump to their step), train (``training``), leave (``leaving``) and end (``done`` or
``failed``). What started the process — fresh, from a checkpoint, restarted on its run directory
— is not a state: it is data (`concord.peer.app.Origin`) that picks the path through these
states. Every transition is logged (``peer.state`` with ``from``, ``to`` and the trigger's
details). docs/architecture.md#peer-lifecycle holds `markdown`'s output (a test keeps them equal).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from typing import Any

import structlog

__all__ = ["STATES", "TRANSITIONS", "IllegalTransitionError", "Lifecycle", "State", "markdown"]


class State(enum.StrEnum):
    """The states of a peer process (`STATES` says what each means)."""

    STARTING = "starting"
    JOINING = "joining"
    WAITING = "waiting"
    RESUMING = "resuming"
    REJOINING = "rejoining"
    TRAINING = "training"
    LEAVING = "leaving"
    DONE = "done"
    FAILED = "failed"


STATES: Mapping[State, str] = {
    State.STARTING: "setting up: its data and replica, the gRPC server, the coordination "
    "(and, orchestrated, the broker session)",
    State.JOINING: "joining the run: an orchestrated peer announces `ready` and waits for the "
    "first schedule; a static peer joins at once",
    State.WAITING: "joined, between stages: waiting for the coordination's next stage (static: "
    "the only one, `train`; orchestrated: `calibrate` or `train`, when the orchestrator starts it)",
    State.RESUMING: "loading its checkpoint into the replica, the algorithm and the counters "
    "(a static peer restarted on its run directory, or a run resumed with `--resume`)",
    State.REJOINING: "catching up with neighbours that went on without it: it adopts a "
    "neighbour's parameters and momentum (`Fetch`) and starts at that neighbour's step, or, "
    "behind all its neighbours by more than its step window, jumps to their step",
    State.TRAINING: "running the steps of a stage",
    State.LEAVING: "training is over: it reports its stage done, waits for the run's `stop` "
    "(orchestrated), stops its transport and writes its summary",
    State.DONE: "ended with exit code 0: trained to the end, or stopped cleanly at a step "
    "boundary by SIGTERM/SIGINT (its summary says which)",
    State.FAILED: "ended with exit code 1: it gave up waiting (`error.json`), its "
    "torch.distributed plane failed, the orchestrator stopped the run, or an unexpected error",
}

# (from, to) → what triggers it: every transition a peer may take, and no other
TRANSITIONS: Mapping[tuple[State, State], str] = {
    (State.STARTING, State.JOINING): "the gRPC server listens and the coordination is entered",
    (State.STARTING, State.FAILED): "an error while setting up",
    (State.JOINING, State.WAITING): "static: at once; orchestrated: the first schedule arrived",
    (State.JOINING, State.FAILED): "no broker or no schedule within `network.startup_timeout`, "
    "or the orchestrator or broker gone for good",
    (State.WAITING, State.TRAINING): "a stage starts from the initial parameters",
    (State.WAITING, State.RESUMING): "a stage starts and the peer holds a checkpoint to continue "
    "from",
    (State.WAITING, State.REJOINING): "a stage starts and the peer restarted without a "
    "checkpoint (static), or was re-admitted into the train stage in progress (orchestrated: "
    "late join)",
    (State.WAITING, State.LEAVING): "no further stage: a stop came first (signal, the run's "
    "`stop`, the coordination gave up), or the torch.distributed plane refused or lost the peer",
    (State.WAITING, State.FAILED): "an unexpected error",
    (State.RESUMING, State.TRAINING): "checkpoint loaded; no neighbour to ask (orchestrated "
    "`--resume`, or the torch.distributed plane)",
    (State.RESUMING, State.REJOINING): "checkpoint loaded; a restarted static peer asks its "
    "neighbours how far they are",
    (State.RESUMING, State.FAILED): "the checkpoint does not fit this run",
    (State.REJOINING, State.TRAINING): "a neighbour's parameters adopted (or none answered, or "
    "none far enough ahead), or the jump taken: it trains from the step found",
    (State.REJOINING, State.FAILED): "an unexpected error",
    (State.TRAINING, State.REJOINING): "behind all its neighbours by more than its step window "
    "(they dropped it while it was stalled): it jumps to their step",
    (State.TRAINING, State.WAITING): "a stage other than the last one is done (calibration)",
    (State.TRAINING, State.LEAVING): "the final stage is done, or a stop ended the stage at a step "
    "boundary, or the torch.distributed plane failed",
    (State.TRAINING, State.FAILED): "an unexpected error",
    (State.LEAVING, State.DONE): "exit code 0",
    (State.LEAVING, State.FAILED): "exit code 1: the coordination gave up or the orchestrator "
    "stopped the run, or the torch.distributed plane failed",
}

TERMINAL = frozenset({State.DONE, State.FAILED})


class IllegalTransitionError(RuntimeError):
    """A transition `TRANSITIONS` does not allow: a defect of the peer's driver, not bad input."""


class Lifecycle:
    """The state of one peer process; `to` moves it along `TRANSITIONS` (thread-safe: the event
    loop and the training thread both move it) and logs each move as ``peer.state``."""

    def __init__(self) -> None:
        self.state = State.STARTING
        self.history: list[State] = [State.STARTING]  # every state taken, in order
        self._lock = threading.Lock()
        self._log = structlog.get_logger(__name__)

    def to(self, state: State, **details: Any) -> None:
        """Move to ``state``; `IllegalTransitionError` (naming both states) if the table has no such
        transition. ``details`` go on the log line."""
        with self._lock:
            old = self.state
            if (old, state) not in TRANSITIONS:
                allowed = sorted(str(b) for a, b in TRANSITIONS if a == old)
                raise IllegalTransitionError(
                    f"peer lifecycle: no transition from {old!s} to {state!s} "
                    f"(from {old!s} only to: {', '.join(allowed) or 'nothing, it is final'})"
                )
            self.state = state
            self.history.append(state)
        self._log.info("peer.state", **{"from": str(old), "to": str(state)}, **details)

    def fail(self, **details: Any) -> None:
        """Move to ``failed`` unless the process has ended already (then nothing changes)."""
        if self.state not in TERMINAL:
            self.to(State.FAILED, **details)

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL


def markdown() -> str:
    """The lifecycle as docs/architecture.md shows it: a state diagram, the states and the
    transitions table, all from `STATES` and `TRANSITIONS`."""
    lines = ["```mermaid", "stateDiagram-v2", f"    [*] --> {State.STARTING}"]
    lines += [f"    {a} --> {b}" for a, b in TRANSITIONS]
    lines += [f"    {s} --> [*]" for s in sorted(TERMINAL)]
    lines += ["```", "", "| state | meaning |", "| --- | --- |"]
    lines += [f"| `{s}` | {meaning} |" for s, meaning in STATES.items()]
    lines += ["", "| from | to | trigger |", "| --- | --- | --- |"]
    lines += [f"| `{a}` | `{b}` | {why} |" for (a, b), why in TRANSITIONS.items()]
    return "\n".join(lines) + "\n"
