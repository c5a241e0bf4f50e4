"""The global budget's start-up barrier of the asynchronous algorithms in peer processes, and
the contact graph it runs on: a mixin of `concord.peer.asynchronous.AsyncPeer`, whose state
(the lock, the levels, the progress vector) and sending it uses (docs/algorithms.md, "Start-up
barrier"; the levels' wire field: docs/protocol.md)."""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
from typing import Protocol

import numpy as np
import structlog

from concord.core.loop import StepRunner
from concord.peer.async_wire import ACK, PROGRESS, Message

log = structlog.get_logger(__name__)


class _Notes(Protocol):
    wait_s: float  # seconds the step blocked (the barrier's wait counts in the first step's)


class StartupBarrier:
    """The barrier's half of `AsyncPeer` (which sets these attributes and defines the methods
    below that raise here)."""

    runner: StepRunner
    rank: int
    n: int
    cond: threading.Condition
    notes: _Notes
    ready: bool
    levels: list[int]
    barrier_neighbours: set[int] | None

    def send(self, j: int, msg: Message) -> concurrent.futures.Future[Message | None]:
        raise NotImplementedError

    def heard(self, msg: Message | None) -> None:
        raise NotImplementedError

    def global_progress(self) -> float:
        raise NotImplementedError

    def progress_now(self) -> tuple[int, ...]:
        raise NotImplementedError

    def contacts(self) -> tuple[set[int], set[int]]:
        """(in-neighbours, out-neighbours) of this peer in any round of the run: over one
        period of each phase's schedule (its ``period``; AD-PSGD's partners come from the
        same matrices), or for a random schedule (no period) every member of it, both ways (a
        superset of any round's)."""
        ins: set[int] = set()
        outs: set[int] = set()
        r = self.runner
        for phase in r.plan.phases:
            if phase.mode != "gossip":
                continue
            schedule = r.schedules.get(phase)
            if schedule.period is None:  # random: any member may be drawn
                ins |= {int(j) for j in schedule.members}
                outs |= {int(j) for j in schedule.members}
                continue
            for k in range(schedule.period):
                P = schedule.matrix(k)
                ins |= {int(j) for j in np.nonzero(P[self.rank])[0]}
                outs |= {int(j) for j in np.nonzero(P[:, self.rank])[0]}
        ins.discard(self.rank)
        outs.discard(self.rank)
        return ins, outs

    def neighbours(self) -> set[int]:
        """Every peer this one exchanges with in some round (`contacts`: in- and
        out-neighbours)."""
        ins, outs = self.contacts()
        return ins | outs

    def contact_graph(self) -> dict[int, set[int]]:
        """Every peer → the peers it exchanges with in some round, both directions (over one
        period of each gossip phase's schedule; a random schedule: all its members)."""
        graph: dict[int, set[int]] = {i: set() for i in range(self.n)}
        r = self.runner
        for phase in r.plan.phases:
            if phase.mode != "gossip":
                continue
            schedule = r.schedules.get(phase)
            if schedule.period is None:
                members = {int(j) for j in schedule.members}
                for i in members:
                    graph[i] |= members - {i}
                continue
            for k in range(schedule.period):
                for i, j in zip(*np.nonzero(schedule.matrix(k)), strict=True):
                    if i != j:
                        graph[int(i)].add(int(j))
                        graph[int(j)].add(int(i))
        return graph

    def eccentricity(self) -> int:
        """The largest hop count from this peer to a peer it can reach in `contact_graph`."""
        graph = self.contact_graph()
        seen, frontier, hops = {self.rank}, {self.rank}, 0
        while True:
            frontier = {j for i in frontier for j in graph[i]} - seen
            if not frontier:
                return hops
            seen |= frontier
            hops += 1

    def barrier_level(self, neighbours: set[int]) -> int:
        """This peer's level (call under the lock): 0 at its barrier, then 1 + the lowest
        level its neighbours told, 0 while one of them is not known to be at its barrier.
        Level L means every peer within L hops is at or past its barrier (by induction: each
        neighbour's L − 1 covers its own L − 1 hops)."""
        told = [self.levels[j] for j in neighbours]
        level = 1 + min(told) if told and min(told) >= 0 else 0
        self.levels[self.rank] = max(self.levels[self.rank], min(level, self.n))
        return self.levels[self.rank]

    def told_level(self, sender: int, level: int) -> None:
        """A PROGRESS from ``sender``, or its ack of ours: it is at its barrier, at ``level``
        (call under the lock; levels only grow)."""
        self.levels[sender] = max(self.levels[sender], min(level, self.n))

    def await_neighbours(self, limit: float) -> None:
        """The global budget's start-up barrier (training thread, before the stage's first
        step): wait until every peer of the run this one can reach through the graph has
        reached its own barrier, at most ``limit`` seconds. A peer that started alone would
        otherwise spend the run's budget by itself while the others start.

        Transitive, by levels carried in the step field of PROGRESS messages and of their
        acks (`barrier_level`): a peer polls its neighbours until its level reaches its
        eccentricity (every reachable peer at its barrier). A peer answers a PROGRESS with an
        ack once at its barrier (CLOSED before). Waiting only for the neighbours would let
        peers 1 and 3 of a ring start peer 2 while peer 0, their other neighbour, is still
        joining: peer 2 would spend the global budget alone."""
        neighbours = self.neighbours()
        with self.cond:
            self.ready = True  # from now on PROGRESS is answered with an ack
            self.levels[self.rank] = max(self.levels[self.rank], 0)
            self.barrier_neighbours = neighbours
        need = self.eccentricity()
        t0 = time.perf_counter()
        inflight: dict[int, concurrent.futures.Future[Message | None]] = {}
        sent: dict[int, float] = {}
        level = 0
        while time.perf_counter() - t0 < limit:
            with self.cond:
                level = self.barrier_level(neighbours)
            if level >= need or self.global_progress() >= self.runner.total_steps:
                break
            now = time.perf_counter()
            for j in sorted(neighbours):  # one PROGRESS in flight per neighbour, ≥ 20 ms apart
                if j not in inflight and now - sent.get(j, -math.inf) >= 0.02:
                    msg = Message(PROGRESS, self.rank, level, progress=self.progress_now())
                    inflight[j], sent[j] = self.send(j, msg), now
            first = concurrent.futures.FIRST_COMPLETED
            concurrent.futures.wait(list(inflight.values()), timeout=0.02, return_when=first)
            for j, future in list(inflight.items()):
                if not future.done():
                    continue
                del inflight[j]
                answer = future.result()
                with self.cond:
                    self.heard(answer)
                    if answer is not None and answer.kind == ACK:
                        self.told_level(j, answer.step)
        if level < need and self.global_progress() < self.runner.total_steps:
            with self.cond:
                waiting = sorted(j for j in neighbours if self.levels[j] < 0)
            log.warning("async.start_without", neighbours=waiting, level=level, needed=need)
        self.notes.wait_s += time.perf_counter() - t0
