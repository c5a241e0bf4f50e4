"""The virtual clock of the asynchronous simulation (`concord.sim.asynchronous`).

Time is an integer number of nanoseconds (ticks): sums of step and message times are exact, so
equal speeds put every peer's step ends at exactly the same instants and the same seed gives the
same order of events on every machine. Events at one instant form a *wave*, popped together and
ordered by (kind, peer, insertion): arrivals before step ends, then peer rank, then the order in
which they were scheduled — no ties are left to the heap.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from concord.core.config import RunConfig

TICKS_PER_SECOND = 1_000_000_000


def to_ticks(seconds: float) -> int:
    """Virtual seconds as integer ticks (nanoseconds)."""
    return round(seconds * TICKS_PER_SECOND)


class Kind(IntEnum):
    """What happens at a peer; within one instant arrivals come first."""

    ARRIVE = 0  # a message reaches the peer
    END = 1  # the peer's local step (its compute) ends


@dataclass(order=True, frozen=True)
class Event:
    time: int
    kind: int
    peer: int
    seq: int
    payload: Any = field(default=None, compare=False)


class EventQueue:
    """A priority queue of `Event`s popped a wave (one instant) at a time."""

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: int, kind: Kind, peer: int, payload: Any = None) -> None:
        heapq.heappush(self._heap, Event(time, int(kind), peer, self._seq, payload))
        self._seq += 1

    def pending(self, kind: Kind) -> int:
        """How many events of ``kind`` are scheduled."""
        return sum(1 for e in self._heap if e.kind == kind)

    def payloads(self, kind: Kind) -> list[Any]:
        """The payloads of the scheduled events of ``kind`` (in no particular order)."""
        return [e.payload for e in self._heap if e.kind == kind]

    def pop_kind_wave(self, kind: Kind) -> tuple[int, list[Event]] | None:
        """Every event of ``kind`` at the earliest instant that has one (sorted), leaving the
        other kinds queued; None when there is none (draining messages at the end of a run)."""
        of_kind = [e for e in self._heap if e.kind == kind]
        if not of_kind:
            return None
        now = min(e.time for e in of_kind)
        wave = sorted(e for e in of_kind if e.time == now)
        self._heap = [e for e in self._heap if not (e.kind == kind and e.time == now)]
        heapq.heapify(self._heap)
        return now, wave

    def pop_wave(self, until: int) -> tuple[int, list[Event]] | None:
        """Every event of the earliest instant if it is ≤ ``until`` (sorted), else None."""
        if not self._heap or self._heap[0].time > until:
            return None
        now = self._heap[0].time
        wave = []
        while self._heap and self._heap[0].time == now:
            wave.append(heapq.heappop(self._heap))
        return now, wave


@dataclass(frozen=True)
class VirtualClock:
    """Per-peer step times and per-link delays, in ticks; ``window``: the ticks of one engine
    step, the fastest peer's local step (so with equal speeds one engine step is one step of
    every peer)."""

    compute: tuple[int, ...]
    delay: tuple[tuple[int, ...], ...]  # row = sender
    window: int

    @classmethod
    def from_config(cls, cfg: RunConfig) -> VirtualClock:
        section = cfg.asynchrony
        speeds = section.speed_list(cfg.peers, cfg.seed)
        compute = tuple(to_ticks(section.compute_s * s) for s in speeds)
        if min(compute) < 1:  # the config refuses it (`AsyncConfig.problems`): never clamp
            raise ValueError(
                f"async.compute_s: a step of {section.compute_s * min(speeds):.3g} s is below "
                "the virtual clock's resolution of 1 ns"
            )
        delay = tuple(tuple(to_ticks(d) for d in row) for row in section.delay_matrix(cfg.peers))
        return cls(compute=compute, delay=delay, window=min(compute))
