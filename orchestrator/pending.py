"""Statistics awaited from the expected peers, sans-io: what `concord.orchestrator.rounds` (per
gossip round) and `concord.orchestrator.graphs` (per step) share.

Each keeps a ``pending`` dict of entries, one per step or round, filled one peer's statistic at a
time; an entry is *due* when every expected peer reported it (done) or ``timeout`` seconds after
its first statistic (stale: decided on what arrived).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from concord.protos.control_plane import Stats


class Awaited(Protocol):
    """An entry of a ``pending`` dict: when its first statistic came and those so far."""

    opened: float  # clock value when its first statistic arrived
    stats: dict[int, Stats]  # by peer


K = TypeVar("K", int, tuple[int, int])
E = TypeVar("E", bound=Awaited)


def take_due(
    pending: dict[K, E], expected: set[int], now: float, timeout: float, *, in_order: bool
) -> list[tuple[K, E, bool]]:
    """Remove the due entries from ``pending`` and return them in key order as
    ``(key, entry, done)``: ``done`` when every ``expected`` peer reported, else stale.
    ``in_order``: stop at the first entry that is not due (steps feed a controller in order)."""
    due = []
    for key in sorted(pending):
        entry = pending[key]
        done = expected <= set(entry.stats)
        if done or now - entry.opened >= timeout:
            due.append((key, pending.pop(key), done))
        elif in_order:
            break
    return due
