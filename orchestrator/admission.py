"""Admission: which peers are in the run and which are still alive — sans-io (no MQTT, no clock:
the caller passes ``now``, a `time.monotonic` value).

`Admission` owns the peer table (`PeerInfo` per peer id ``0 … n-1``):

* **gathering** — each peer announces itself with a retained ``status`` "ready" carrying its gRPC
  address, steps per epoch and model fingerprint; the run starts when every peer did
  (`Admission.ready`) and all agree (`Admission.agreed_steps_per_epoch`);
* **liveness** — every message from a peer counts as a sign of life (`Admission.heard`); a peer
  is dropped when it reports "failed" (`Admission.on_status` says so), when its Last-Will
  ("offline") is not contradicted within two heartbeats, or when it is silent for the liveness
  timeout while it still owes the stage work (`Admission.sweep`). While the orchestrator is cut
  off from the broker nobody is silent by their own fault (`Admission.cut_off`): after a reconnect
  peers get the broker session's longest reconnect backoff on top of the timeout to come back.

A retained "ready" stamped more than ``stale_after`` seconds before the orchestrator started (a
peer waits at most ``network.startup_timeout`` for its run, so that one's peer is long gone: a
leftover of an earlier run under the same id) is refused, and the caller clears its topic.

A status is not trusted: one whose address is not ``host:port`` (port 1–65535) is refused (logged,
dropped) and so is an address change of an admitted peer once the run is set up (a repaired
schedule must carry the addresses the peers already know, or they refuse it).

What a drop means for pending rounds and the schedule is the caller's business
(`concord.orchestrator.app`): `Admission.drop` only marks the peer and says whether it was news.

**Re-admission** — a peer restarted with the same command announces "ready" again during the
``train`` stage, possibly at a new address: `Admission.on_status` says so (``readmit``); the
caller drops it if it was not dropped yet (its old incarnation is gone) and `Admission.readmit`
takes it back from a step (``joins_at``, `Admission.rejoin_step`): where the live peers will be
`REJOIN_LEAD` seconds from now, judged by their step reports and pace (`Progress`), so that the
peer has fetched a neighbour's parameters before its neighbours get there — until then they
neither gossip with it nor wait for it, and their step boundaries, at which a Fetch is answered,
keep coming. It owes statistics (`Admission.expected`) only once it reported a step at or past
``joins_at`` itself — until it trains it cannot send any, and a round waiting for them would hold
its neighbours inside a step, where nobody answers its Fetch — and the live peers reached that
step too. Only such a "ready" (a new incarnation) may change a peer's address once the run is set
up.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import structlog

from concord.errors import OrchestratorError
from concord.orchestrator.schedules import REPAIR_AHEAD
from concord.protos.control_plane import Heartbeat, Message, Metrics, Stats, Status

log = structlog.get_logger("concord.orchestrator.admission")

PACE_WINDOW = 2.0  # seconds of a peer's step reports its pace is measured over
# seconds from re-admitting a restarted peer to the step it joins at (at most half a step
# deadline): its Hello and Fetch reached its neighbours 0.07-0.11 s after the schedule on the
# loaded 2-core reference machine (bench/chaos.py restart); later, it costs a deadline
REJOIN_LEAD = 0.5


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a usable gRPC ``host:port`` (None: it is)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return "expected HOST:PORT with a port in 1-65535"
    if any(c.isspace() for c in host) or "/" in host:
        return "the host contains spaces or '/'"
    return None


class Progress:
    """A peer's step reports of the last `PACE_WINDOW` seconds (a heartbeat: the step in
    progress; a step record: the step after it): where it was last seen and how fast it moves."""

    def __init__(self) -> None:
        self.reports: deque[tuple[float, int]] = deque()  # (monotonic time, step)

    def add(self, now: float, step: int) -> None:
        if self.reports and step < self.reports[-1][1]:
            self.reports.clear()  # numbered anew: a new stage, or a new incarnation
        self.reports.append((now, step))
        while now - self.reports[0][0] > PACE_WINDOW:
            self.reports.popleft()

    def pace(self) -> float | None:
        """Steps per second over the window; None with less than half of it reported."""
        if not self.reports:
            return None
        (t0, s0), (t1, s1) = self.reports[0], self.reports[-1]
        return (s1 - s0) / (t1 - t0) if t1 - t0 >= PACE_WINDOW / 2 else None

    def ahead(self, now: float, lead: float, pace: float) -> float | None:
        """The step it will be at ``lead`` seconds after ``now``, moving at ``pace``; a peer
        silent for longer than the window (stalled) is not moved on past it."""
        if not self.reports:
            return None
        t, step = self.reports[-1]
        return step + pace * (min(now - t, PACE_WINDOW) + lead)


@dataclass
class PeerInfo:
    state: str = "unknown"
    address: str | None = None
    step: int = 0
    last_seen: float = 0.0
    steps_per_epoch: int = 0
    fingerprint: str = ""
    stage_done: str = ""  # last stage this peer reported done
    gone: bool = False
    offline_at: float | None = None  # its Last-Will arrived (confirmed by silence, see sweep)
    joins_at: int | None = None  # re-admitted: the step it (re)joins at (`Admission.readmit`)
    starts_at: int | None = None  # … and the first step it reported at or past that one
    readmissions: int = 0
    progress: Progress = field(default_factory=Progress)


@dataclass(frozen=True)
class StatusOutcome:
    """What one ``status`` message means to the caller: ``changed`` — waiters should re-check;
    ``drop`` — the peer failed and must be dropped for this reason."""

    changed: bool
    drop: str | None = None
    readmit: bool = False  # a dropped peer announced "ready" again: the caller re-admits it
    stale: bool = False  # a retained "ready" left over from an earlier run: the caller clears it


class Admission:
    """The peer table of one run (see the module docstring)."""

    def __init__(
        self,
        n: int,
        *,
        liveness_timeout: float,
        heartbeat: float,
        started_at: float = 0.0,
        stale_after: float = float("inf"),
    ) -> None:
        """``started_at`` (wall clock, `time.time`) and ``stale_after`` (seconds): a "ready"
        stamped more than ``stale_after`` before the orchestrator started is a leftover of an
        earlier run under this id (its peer gave up waiting long ago) and is refused."""
        self.n = n
        self.started_at, self.stale_after = started_at, stale_after
        self.peers = {i: PeerInfo() for i in range(n)}
        self.timeout = liveness_timeout
        self.confirm = 2 * heartbeat + 0.2  # a Last-Will stands once this passed in silence
        self.grace_until = 0.0  # nobody is silent before this (after a broker outage)

    # -- queries -------------------------------------------------------------------------------

    def knows(self, peer: int) -> bool:
        return 0 <= peer < self.n

    def live(self) -> set[int]:
        return {i for i, p in self.peers.items() if not p.gone}

    def expected(self, stage: str) -> set[int]:
        """Live peers that still owe ``stage`` its work (whose statistics a round waits for); a
        re-admitted peer only once it reported a step at or past its joining step and the others
        have reached the step it reported first (module docstring)."""
        live = self.live()
        joining = {i for i in live if self.peers[i].joins_at is not None}
        if joining:
            reached = self.known_step(live - joining)
            for i in list(joining):
                starts_at = self.peers[i].starts_at
                if starts_at is not None and reached >= starts_at:
                    self.peers[i].joins_at = None  # in step with the others now
                    joining.discard(i)
        return {i for i in live - joining if self.peers[i].stage_done != stage}

    def finished(self, stage: str) -> list[int]:
        return [i for i, p in self.peers.items() if p.stage_done == stage]

    def dropped(self) -> list[int]:
        return sorted(i for i, p in self.peers.items() if p.gone)

    def addresses(self, peers: list[int]) -> list[str]:
        return [self.peers[i].address or "" for i in peers]

    def newest_step(self, peers: list[int]) -> int:
        return max((self.peers[i].step for i in peers), default=0)

    def known_step(self, peers: set[int]) -> int:
        """The step every one of ``peers`` is known to have reached (the slowest's last report);
        0 when there are none."""
        return min((self.peers[i].step for i in peers), default=0)

    # -- gathering -----------------------------------------------------------------------------

    def ready(self) -> bool:
        """Every peer announced its address and steps per epoch."""
        return all(p.address and p.steps_per_epoch for p in self.peers.values())

    def missing(self) -> list[int]:
        return sorted(i for i, p in self.peers.items() if not p.address)

    def agreed_steps_per_epoch(self) -> int:
        """The peers' common steps per epoch; `OrchestratorError` unless all peers agree on it
        and on the model fingerprint."""
        spe = {p.steps_per_epoch for p in self.peers.values()}
        fps = {p.fingerprint for p in self.peers.values()}
        if len(spe) != 1 or len(fps) != 1:
            raise OrchestratorError(
                f"peers disagree on steps per epoch {sorted(spe)} or model fingerprint "
                f"({len(fps)} different): are they running the same config?"
            )
        return spe.pop()

    # -- events --------------------------------------------------------------------------------

    def heard(self, peer: int, message: Message, now: float) -> None:
        """A message from a known ``peer`` arrived: anything but a Last-Will is a sign of life."""
        info = self.peers[peer]
        if not (isinstance(message, Status) and message.state == "offline"):
            info.offline_at = None  # alive after all
        if isinstance(message, Heartbeat):
            info.last_seen, info.step = now, message.step
            info.progress.add(now, message.step)
        elif isinstance(message, Stats | Metrics):
            info.last_seen = now
            if isinstance(message, Metrics) and message.event == "step":
                info.progress.add(now, message.step + 1)
        if isinstance(message, Heartbeat | Stats | Metrics):
            joins_at = info.joins_at
            if joins_at is not None and info.starts_at is None and message.step >= joins_at:
                info.starts_at = message.step  # the re-admitted peer trains: it can report now

    def on_status(self, peer: int, status: Status, now: float, stage: str) -> StatusOutcome:
        """File a peer's ``status`` (``stage``: the run's current stage, "" before setup)."""
        info = self.peers[peer]
        if status.peer != peer:
            log.warning("control.rejected", topic="status", peer=peer, problem="peer mismatch")
            return StatusOutcome(changed=False)
        old = 0 < status.ts < self.started_at - self.stale_after
        if not stage and status.state == "ready" and old:
            log.warning(
                "control.rejected",
                topic="status",
                peer=peer,
                problem=f"a 'ready' of {self.started_at - status.ts:.0f} s before this run began",
            )
            return StatusOutcome(changed=False, stale=True)
        if status.state == "offline":  # a Last-Will: confirmed by silence in sweep
            info.state, info.offline_at = status.state, now
            return StatusOutcome(changed=False)
        # a peer announces "ready" only when it starts: mid-training, that is a restart (dropped
        # already, or not yet: its Last-Will may still be unconfirmed)
        back = stage == "train" and status.state == "ready"
        if status.address is not None and status.state in ("ready", "training"):
            problem = address_problem(status.address)
            moved = status.address != info.address
            if problem is None and stage and info.address and moved and not back:
                problem = f"changes the admitted address {info.address!r} during the run"
            if problem is not None:
                log.warning(
                    "control.rejected",
                    topic="status",
                    peer=peer,
                    problem=f"address {status.address!r}: {problem}",
                )
                return StatusOutcome(changed=False)
        info.state, info.last_seen, info.step = status.state, now, status.step
        drop = None
        if status.state in ("ready", "training"):
            if status.address:
                info.address = status.address
            if status.steps_per_epoch:
                info.steps_per_epoch = status.steps_per_epoch
            if status.fingerprint:
                info.fingerprint = status.fingerprint
        elif status.state == "done":
            info.stage_done = status.stage
        elif status.state == "failed" and stage and not info.gone:
            drop = f"status {status.state}" + (f": {status.reason}" if status.reason else "")
        return StatusOutcome(changed=True, drop=drop, readmit=back and bool(info.address))

    def drop(self, peer: int, reason: str) -> bool:
        """Mark ``peer`` gone; False if it already was."""
        info = self.peers[peer]
        if info.gone:
            return False
        info.gone = True
        log.warning("peer.dropped", peer=peer, reason=reason, live=sorted(self.live()))
        return True

    def readmit(self, peer: int, joins_at: int, now: float) -> bool:
        """Take a dropped ``peer`` back (it announced "ready" again): live from now, joining the
        gossip at step ``joins_at``; False if it was not dropped."""
        info = self.peers[peer]
        if not info.gone or not info.address:
            return False
        info.gone, info.offline_at, info.last_seen = False, None, now
        info.joins_at, info.stage_done, info.step = joins_at, "", joins_at
        info.starts_at = None
        info.readmissions += 1
        log.warning(
            "peer.readmitted",
            peer=peer,
            address=info.address,
            joins_at=joins_at,
            live=sorted(self.live()),
        )
        return True

    def rejoin_step(self, now: float, deadline: float) -> int:
        """The step a peer re-admitted at ``now`` joins at: where the live peers will be
        `REJOIN_LEAD` seconds (at most half the step ``deadline``, which bounds the joining
        peer's wait for them in its first round) from now — the most advanced one's last report
        moved on at their median pace — and at least `REPAIR_AHEAD` steps past the newest step
        a live peer reported."""
        live = [self.peers[i] for i in sorted(self.live())]
        newest = max((p.step for p in live), default=0) + REPAIR_AHEAD
        paces = [pace for p in live if (pace := p.progress.pace()) is not None]
        if not paces:
            return newest
        lead, pace = min(REJOIN_LEAD, deadline / 2), max(0.0, statistics.median(paces))
        ahead = [a for p in live if (a := p.progress.ahead(now, lead, pace)) is not None]
        return max(newest, math.ceil(max(ahead, default=0.0)))

    def begin_stage(self, now: float) -> None:
        """A stage starts: every peer's silence is counted from now."""
        for info in self.peers.values():
            info.last_seen = now
            info.step = 0  # step numbers restart with every stage
            info.progress = Progress()

    # -- liveness ------------------------------------------------------------------------------

    def cut_off(self, now: float, backoff: float) -> None:
        """The broker session is down: no Last-Will stands, and silence counts only from
        ``backoff`` seconds (the longest reconnect delay) after this."""
        self.grace_until = now + backoff
        for info in self.peers.values():
            info.offline_at = None

    def sweep(self, now: float, stage: str) -> list[tuple[int, str]]:
        """The peers to drop now, with the reason (each once): a Last-Will that stood for
        ``confirm`` seconds, or a peer busy in ``stage`` and silent past the timeout. Nobody is
        dropped before the run's first stage."""
        out: list[tuple[int, str]] = []
        if not stage:
            return out
        for i, info in self.peers.items():
            if info.offline_at is not None and now - info.offline_at > self.confirm:
                info.offline_at = None
                if not info.gone:
                    out.append((i, "Last-Will (offline) and silent since"))
        if now >= self.grace_until:
            named = {i for i, _ in out}
            for i, info in self.peers.items():
                busy = info.stage_done != stage
                silent = now - max(info.last_seen, self.grace_until)
                if not info.gone and i not in named and busy and silent > self.timeout:
                    out.append((i, f"silent for {silent:.1f} s"))
        return out
