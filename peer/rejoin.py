"""The ``rejoining`` state of a peer (`concord.peer.lifecycle`): catching up with neighbours that
went on without it.

Two moments, one path for the parameters: a peer that starts behind — a static peer restarted on
its run directory, or an orchestrated peer re-admitted into the train stage in progress (late
join) — asks its neighbours for their parameters (`fetch`: ``Fetch`` to each, concurrently; the
most advanced answer wins) and, when it takes one, adopts the neighbour's parameters and portable
algorithm state (`adopt`) and starts at that neighbour's step (`Restart`, `Readmission`: where to
start, given the answer). A peer that finds itself behind all its neighbours by more than its
step window mid-training (it was stalled and they dropped it) jumps to their step instead
(`Jumps`): their parameters are not fetched, gossip pulls its own back in.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog
import torch

from concord.core.loop import StepRunner
from concord.core.records import JSON
from concord.core.task import ClassificationTask
from concord.peer.comm import PeerComm
from concord.peer.transport import Fetched

__all__ = ["Jumps", "Readmission", "Rejoined", "Restart", "adopt", "fetch", "rejoin"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Rejoined:
    """Where a rejoining peer starts: ``step`` (of its stage), with the round counter
    ``rounds_total`` (None: its own), from ``got`` (None: nothing adopted); ``record``: what
    the summary says of it (``rejoined``; empty when it went on from where it was)."""

    step: int
    rounds_total: int | None
    got: Fetched | None
    record: dict[str, int]


@dataclass(frozen=True)
class Restart:
    """A restarted static peer, at ``start`` (its checkpoint's next step, or 0): it adopts the
    most advanced answer when that is more than ``fetch_after`` (``network.rejoin_fetch_after``)
    steps ahead, and continues at that neighbour's step + 1 — with the round counter to match
    (one round per step), so its frames carry the keys its neighbours expect and land inside
    their step window; otherwise it goes on from ``start`` with what it has."""

    start: int
    fetch_after: int
    # adopt the parameters but stay at ``start``: an asynchronous algorithm whose messages are
    # not matched by step under the global budget, where a peer's step count is the progress
    # it adds (taking a neighbour's would count steps nobody took: the run would stop early)
    keep_step: bool = False

    def place(self, got: Fetched | None, step_base: int, total: int) -> Rejoined:
        if got is None:
            return Rejoined(self.start, None, None, {})
        to = got.step - step_base + 1
        if got.step - step_base - self.start <= self.fetch_after or to >= total:
            return Rejoined(self.start, None, None, {})
        if self.keep_step:
            record = {"from_peer": got.sender, "at_step": self.start, "neighbour_step": to - 1}
            return Rejoined(self.start, None, got, {**record, "checkpoint_step": self.start})
        record = {"from_peer": got.sender, "at_step": to, "checkpoint_step": self.start}
        return Rejoined(to, got.round + 1, got, record)


@dataclass(frozen=True)
class Readmission:
    """An orchestrated peer re-admitted at step ``join_at``: it starts there — with the
    answering neighbour's round counter when answered at the boundary of ``join_at``
    (`concord.peer.transport.Transport.joins_at`) — or, if that neighbour is already past it,
    at its step + 1 (the round counter to match, one round per step; a jump corrects the rest).
    Without an answer it starts at ``join_at`` from its initial parameters, and gossip pulls
    them in."""

    join_at: int

    def place(self, got: Fetched | None, step_base: int, total: int) -> Rejoined:
        if got is None:
            start = min(self.join_at, total - 1)
            return Rejoined(start, start, None, {"at_step": start, "readmitted_at": self.join_at})
        local = got.step - step_base
        start = min(self.join_at if local <= self.join_at else local + 1, total - 1)
        record = {"from_peer": got.sender, "at_step": start, "readmitted_at": self.join_at}
        return Rejoined(start, got.round + (start - local), got, record)


def fetch(comm: PeerComm, peers: list[int]) -> Fetched | None:
    """The most advanced Fetch answer of ``peers``, asked concurrently from the training thread
    (None: nobody answered); each ask waits for that neighbour's next step boundary, at worst two
    deadlines and some slack."""
    timeout = 2 * comm.transport.deadline + 5.0
    future = asyncio.run_coroutine_threadsafe(comm.transport.fetch_any(peers, timeout), comm.loop)
    return future.result(timeout + 10.0)


def rejoin(
    runner: StepRunner,
    task: ClassificationTask,
    comm: PeerComm,
    peers: list[int],
    how: Restart | Readmission,
    total: int,
) -> Rejoined:
    """The one fetch path of both ways of rejoining: fetch from ``peers``, place the peer as
    ``how`` says, adopt what it takes (parameters, portable state, round counter); logged as
    ``peer.rejoin``."""
    got = fetch(comm, peers)
    placed = how.place(got, comm.step_base, total)
    if placed.got is not None:
        adopt(runner, task, placed.got)
    if placed.rounds_total is not None:
        runner.rounds_total = placed.rounds_total
    where = placed.record or {"step": placed.step}
    if got is not None and placed.got is None:
        where = {**where, "neighbour_step": got.step}
    say = log.warning if placed.record else log.info
    say("peer.rejoin", fetched=placed.got is not None, **where)
    return placed


def adopt(runner: StepRunner, task: ClassificationTask, got: Fetched) -> None:
    """Take over a Fetch answer: the neighbour's parameters and the algorithm state it sent
    (`Algorithm.portable_state`, e.g. the momentum, as hivemind's ``load_state_from_peers``
    takes the optimizer's); the rest of the state (trackers, error feedback) stays this
    peer's, the checkpoint's or the fresh one."""
    with torch.no_grad():
        task.x[0].copy_(got.x.to(task.x.device, task.x.dtype))
    if not got.state:
        return
    state = runner.algorithm.state_dict()
    for name, v in got.state.items():
        state[name] = v.to(task.x.device, task.x.dtype).reshape(1, -1)
    runner.algorithm.load_state_dict(state)
    log.info("peer.rejoin_state", from_peer=got.sender, parts=sorted(got.state))


class Jumps:
    """Mid-training catch-up (`concord.runtime.driver.drive`'s ``skip``): behind its neighbours
    by more than the step window (they skipped it while it was stalled, or it restarted from an
    old checkpoint), this peer can mix with nobody: it jumps to their step — the round counter
    too, so frame keys match — and gossip pulls its stale parameters back in
    (`concord.peer.transport.Transport.behind`). ``taken`` lists (from, to) of each jump."""

    def __init__(
        self, runner: StepRunner, comm: PeerComm, neighbours: list[int], total: int
    ) -> None:
        self.runner, self.comm, self.neighbours, self.total = runner, comm, neighbours, total
        self.taken: list[tuple[int, int]] = []

    def target(self, step: int) -> tuple[int, int] | None:
        """(step, round) to jump to from ``step``; None: stay."""
        ahead = self.comm.transport.behind(self.comm.step_base + step, self.neighbours)
        if ahead is None:
            return None
        to = ahead[0] - self.comm.step_base
        if to >= self.total:
            return None  # no step of this stage (a bogus claim): stay
        return to, ahead[1]

    def take(self, step: int, to: int, round: int) -> None:
        """Jump from ``step`` to ``to``, at gossip round ``round``."""
        log.warning("peer.jump", from_step=step, to_step=to, round=round)
        transport = self.comm.transport
        self.comm.loop.call_soon_threadsafe(transport.jumped)  # before the next round's coroutine
        self.runner.rounds_total = round
        self.taken.append((step, to))

    def landed(self, step: int) -> int | None:
        """The step jumped from, when ``step`` is where the last jump landed."""
        return self.taken[-1][0] if self.taken and self.taken[-1][1] == step else None

    def summary(self) -> dict[str, JSON]:
        """The summary's ``jumps`` (how many) and ``steps_jumped`` (steps run nowhere)."""
        return {"jumps": len(self.taken), "steps_jumped": sum(to - at for at, to in self.taken)}
