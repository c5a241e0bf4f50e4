"""The link emulator's logic, free of I/O: which packets are lost, how long each is held, and in
which order they leave.

A packet from host A to host B crosses A's ``up`` direction and B's ``down`` direction
(`concord.core.emulation.HostLink`); each direction may drop it (`LossModel`) and adds a delay
(`DelaySampler`). Unless ``reorder`` is asked for, a packet never leaves before an earlier
packet of its flow (same protocol, addresses and ports): its release time is at least theirs,
as on a real path where jitter comes from queues. `DelayLine` keeps the held packets in a heap
keyed by release time (ties: arrival order).
"""

from __future__ import annotations

import heapq
import random

from concord.core.emulation import HostLink, LinkSpec

_PORTS_PROTOCOLS = frozenset({6, 17, 33, 132})  # TCP, UDP, DCCP, SCTP: ports after the header
_FLOWS_KEPT = 4096  # above this many remembered flows, forget those with nothing in flight


class LossModel:
    """Drops packets at a mean rate ``loss`` in runs of mean length ``burst`` packets.

    ``burst`` = 1: independent Bernoulli draws. ``burst`` > 1: the two-state Gilbert–Elliott
    chain with loss 0 in the good state and 1 in the bad one, moving good → bad with probability
    ``loss / (burst · (1 − loss))`` and bad → good with ``1 / burst`` per packet: its stationary
    loss is ``loss`` and its loss runs are geometric with mean ``burst``."""

    def __init__(self, loss: float, burst: float, rng: random.Random) -> None:
        self.loss, self.burst, self.rng = loss, burst, rng
        self.bad = False
        self._enter = loss / (burst * (1.0 - loss)) if burst > 1 else 0.0
        self._leave = 1.0 / burst

    def lose(self) -> bool:
        """Whether the next packet is lost."""
        if self.loss <= 0.0:
            return False
        if self.burst <= 1:
            return self.rng.random() < self.loss
        if self.bad:
            self.bad = self.rng.random() >= self._leave
        else:
            self.bad = self.rng.random() < self._enter
        return self.bad


class DelaySampler:
    """One-way delays in seconds: ``delay_ms`` plus a normal deviate of standard deviation
    ``jitter_ms`` clipped to ±3σ, and the sum clipped at 0 (so the delay lies within
    [max(0, delay − 3σ), delay + 3σ]; the clipping shrinks σ by ≈ 1 %)."""

    def __init__(self, delay_ms: float, jitter_ms: float, rng: random.Random) -> None:
        self.delay = delay_ms / 1e3
        self.sigma = jitter_ms / 1e3
        self.rng = rng

    def sample(self) -> float:
        """The next packet's delay (seconds)."""
        if self.sigma <= 0.0:
            return self.delay
        bound = 3.0 * self.sigma
        deviate = min(bound, max(-bound, self.rng.gauss(0.0, self.sigma)))
        return max(0.0, self.delay + deviate)


class Direction:
    """One direction of one host's link: its loss model and delay sampler."""

    def __init__(self, spec: LinkSpec, rng: random.Random) -> None:
        self.spec = spec
        self.loss = LossModel(spec.loss, spec.loss_burst, rng)
        self.delay = DelaySampler(spec.delay_ms, spec.jitter_ms, rng)


def flow_key(packet: bytes) -> bytes:
    """The IPv4 ``packet``'s flow: protocol, addresses and (for TCP, UDP, DCCP, SCTP) ports."""
    key = packet[9:10] + packet[12:20]
    if packet[9] in _PORTS_PROTOCOLS:
        ihl = (packet[0] & 0x0F) * 4
        key += packet[ihl : ihl + 4]
    return key


class DelayLine:
    """Held packets and the links they cross. ``links``: per host IPv4 address (4 bytes) its
    (up, down) `Direction`s; a host without an entry adds nothing. ``seed`` of every draw;
    ``reorder``: release each packet at its own time even if that overtakes its flow."""

    def __init__(self, *, seed: int = 0, reorder: bool = False) -> None:
        self.rng = random.Random(seed)
        self.reorder = reorder
        self.links: dict[bytes, tuple[Direction, Direction]] = {}
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = 0
        self._flows: dict[bytes, float] = {}
        self.admitted = self.dropped = self.released = 0
        self.bytes = 0

    def set_link(self, address: bytes, link: HostLink) -> None:
        """Emulate ``link`` for the host at ``address`` (4 bytes) from now on."""
        self.links[address] = (Direction(link.up, self.rng), Direction(link.down, self.rng))

    def admit(self, packet: bytes, now: float) -> float | None:
        """Take ``packet`` (IPv4, arrived at ``now``): None if it is lost, else its release
        time. A release time ≤ ``now`` means "send at once": it is not held (nor counted in
        `held`); a later one is held until `due` hands it out."""
        self.admitted += 1
        self.bytes += len(packet)
        delay = 0.0
        for direction in (self._up(packet), self._down(packet)):
            if direction is None:
                continue
            if direction.loss.lose():
                self.dropped += 1
                return None
            delay += direction.delay.sample()
        release = now + delay
        if not self.reorder:
            key = flow_key(packet)
            release = max(release, self._flows.get(key, release))
            self._flows[key] = release
            if len(self._flows) > _FLOWS_KEPT:
                self._flows = {k: t for k, t in self._flows.items() if t > now}
        if release <= now:
            self.released += 1
            return release
        heapq.heappush(self._heap, (release, self._seq, packet))
        self._seq += 1
        return release

    def _up(self, packet: bytes) -> Direction | None:
        pair = self.links.get(packet[12:16])
        return pair[0] if pair else None

    def _down(self, packet: bytes) -> Direction | None:
        pair = self.links.get(packet[16:20])
        return pair[1] if pair else None

    def due(self, now: float) -> list[bytes]:
        """The held packets whose release time is ≤ ``now``, in release order."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        self.released += len(out)
        return out

    def next_release(self) -> float | None:
        """The earliest release time held, or None when nothing is held."""
        return self._heap[0][0] if self._heap else None

    @property
    def held(self) -> int:
        """How many packets are held."""
        return len(self._heap)
