"""Admission: which peers are in the run and which are still alive — sans-io (no MQTT, no clock:
the caller passes ``now``, a `time.monotonic` value).

`Admission` owns the peer table (one record per peer id ``0 … n-1``); nobody else reads or
writes it. The orchestrator talks to it through `PeerAdmission`, a handful of intentions
answered with small immutable values: file what a peer said (`PeerAdmission.heard` → `Heard`),
drop or take back a peer (`Dropped`, `Readmitted`), start a stage, sweep for the silent, and
ask who a round waits for (`PeerAdmission.expected`), who gossips where (`Roster`), whether
everyone is here (`RollCall`), how the run ended (`Tally`) and each peer as it stands
(`PeerInfo`, a snapshot). Its settings are `concord.orchestrator.options.AdmissionOptions`.

* **gathering** — each peer announces itself with a retained ``status`` "ready" carrying its gRPC
  address, steps per epoch and model fingerprint; the run starts when every peer did
  (`Admission.roll_call`) and all agree (`Admission.agreed_steps_per_epoch`);
* **liveness** — every message from a peer counts as a sign of life (`Admission.heard`); a peer
  is dropped when it reports "failed" (`Admission.heard` says so), when its Last-Will
  ("offline") is not contradicted within two heartbeats, or when it is silent for the liveness
  timeout while it still owes the stage work (`Admission.sweep`). While the orchestrator is cut
  off from the broker nobody is silent by their own fault (`Admission.cut_off`): after a reconnect
  peers get the broker session's longest reconnect backoff on top of the timeout to come back.

A retained "ready" stamped more than ``stale_after`` seconds before the orchestrator started (a
peer waits at most ``network.startup_timeout`` for its run, so that one's peer is long gone: a
leftover of an earlier run under the same id) is refused, and the caller clears its topic; so is
a status stamped with another orchestrator incarnation than this one's.

A message of an unknown peer id is refused (`Heard.refused`; the caller logs and counts it). A
status is not trusted: one whose address is not ``host:port`` (port 1–65535) is refused (logged,
dropped) and so is an address change of an admitted peer once the run is set up (a repaired
schedule must carry the addresses the peers already know, or they refuse it).

What a drop means for pending rounds and the schedule is the caller's business
(`concord.orchestrator.app`): `Admission.drop` only marks the peer and says whether it was news
and whether it still owed the stage work.

**Re-admission** — a peer restarted with the same command announces "ready" again during the
``train`` stage, possibly at a new address: `Admission.heard` says so (``readmit``), and so it
does for a dropped peer whose heartbeats come back during training (stalled or cut off, alive
after all); the caller drops it if it was not dropped yet (its old incarnation is gone) and
`Admission.readmit` takes it back from a step (``joins_at``, `Admission.rejoin_step`): where the
live peers will be `REJOIN_LEAD` seconds from now, judged by their step reports and pace
(`Progress`), so that the peer has fetched a neighbour's parameters before its neighbours get
there — until then they neither gossip with it nor wait for it, and their step boundaries, at
which a Fetch is answered, keep coming. It owes statistics (`Admission.expected`) only once it
reported a step at or past ``joins_at`` itself — until it trains it cannot send any, and a round
waiting for them would hold its neighbours inside a step, where nobody answers its Fetch — and
the live peers reached that step too. Only such a "ready" (a new incarnation) may change a
peer's address once the run is set up.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

import structlog

from concord.errors import OrchestratorError
from concord.orchestrator.options import AdmissionOptions
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
class _Peer:
    """One peer's record in the table (`Admission` alone reads and writes it)."""

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

    def view(self) -> PeerInfo:
        return PeerInfo(
            state=self.state,
            address=self.address,
            fingerprint=self.fingerprint,
            step=self.step,
            last_seen=self.last_seen,
            gone=self.gone,
            joins_at=self.joins_at,
            readmissions=self.readmissions,
        )


# -- the answers: small immutable values ----------------------------------------------------------


@dataclass(frozen=True)
class PeerInfo:
    """A peer as admission sees it at one moment (a snapshot: the manifest, the metrics)."""

    state: str = "unknown"  # its last status ("unknown": none yet)
    address: str | None = None  # its admitted gRPC address
    fingerprint: str = ""  # its model's fingerprint
    step: int = 0  # the last step it reported in this stage
    last_seen: float = 0.0  # monotonic time it was last heard (0: never)
    gone: bool = False  # dropped from the run
    joins_at: int | None = None  # re-admitted and not yet in step: the step it joins at
    readmissions: int = 0


@dataclass(frozen=True)
class Heard:
    """What one message from a peer means to the caller."""

    refused: str | None = None  # not filed, and why (the caller logs and counts it)
    changed: bool = False  # waiters should re-check
    drop: str | None = None  # the peer failed: drop it for this reason
    readmit: bool = False  # a dropped (or restarted) peer is back: the caller re-admits it
    stale: bool = False  # a retained "ready" left over from an earlier run: the caller clears it
    gone: bool = False  # the peer is out of the run (its statistics are not counted)


@dataclass(frozen=True)
class Dropped:
    """A peer was dropped just now; ``owed``: it had not finished the stage (its place in the
    schedule must be repaired)."""

    owed: bool


@dataclass(frozen=True)
class Readmitted:
    """A dropped peer was taken back: at ``address``, joining the gossip at step ``joins_at``."""

    joins_at: int
    address: str


@dataclass(frozen=True)
class Roster:
    """The live peers (sorted), their addresses, and the newest step any of them reported: what
    a schedule version is built over."""

    peers: tuple[int, ...]
    addresses: tuple[str, ...]
    newest_step: int


@dataclass(frozen=True)
class RollCall:
    """Gathering: ``ready`` once every peer announced its address and steps per epoch;
    ``missing``: the peers with no address yet."""

    ready: bool
    missing: tuple[int, ...]


@dataclass(frozen=True)
class Tally:
    """How the run ended for its peers: those that finished a stage, those dropped."""

    done: tuple[int, ...]
    dropped: tuple[int, ...]


class PeerAdmission(Protocol):
    """What the orchestrator asks of admission (module docstring): nothing else of it is read."""

    def heard(self, peer: int, message: Message, now: float, stage: str) -> Heard:
        """File a message from ``peer`` (``stage``: the run's current one, "" before setup)."""
        ...

    def drop(self, peer: int, reason: str, stage: str) -> Dropped | None:
        """Drop ``peer``; None if it was gone already."""
        ...

    def readmit(self, peer: int, now: float) -> Readmitted | None:
        """Take a dropped ``peer`` back; None if it was not dropped or has no address."""
        ...

    def begin_stage(self, now: float) -> None:
        """A stage starts: silence is counted from ``now``, steps restart."""
        ...

    def cut_off(self, now: float, backoff: float) -> None:
        """The broker session is down; silence counts from ``backoff`` seconds after ``now``."""
        ...

    def sweep(self, now: float, stage: str) -> list[tuple[int, str]]:
        """The peers to drop now, each with the reason."""
        ...

    def roll_call(self) -> RollCall:
        """Whether every peer has announced itself."""
        ...

    def agreed_steps_per_epoch(self) -> int:
        """The peers' common steps per epoch (`OrchestratorError` if they disagree)."""
        ...

    def expected(self, stage: str) -> set[int]:
        """The peers whose statistics a round of ``stage`` waits for."""
        ...

    def known_step(self, peers: set[int]) -> int:
        """The step every one of ``peers`` is known to have reached."""
        ...

    def roster(self) -> Roster:
        """The live peers, their addresses and newest step."""
        ...

    def tally(self, stage: str) -> Tally:
        """The peers that finished ``stage`` and the peers dropped."""
        ...

    @property
    def peers(self) -> Mapping[int, PeerInfo]:
        """Every peer as it stands now (snapshots)."""
        ...


class Admission:
    """The peer table of one run (see the module docstring); a `PeerAdmission`."""

    def __init__(
        self,
        options: AdmissionOptions,
        *,
        incarnation: str = "",
        started_at: float = 0.0,
    ) -> None:
        """``incarnation``: the orchestrator's run nonce (a status stamped with another one is
        an earlier run's); ``started_at`` (wall clock, `time.time`): a "ready" stamped more than
        ``options.stale_after`` before it is a leftover of an earlier run under this id (its
        peer gave up waiting long ago) and is refused."""
        self.n = options.peers
        self.incarnation, self.started_at = incarnation, started_at
        self.stale_after, self.deadline = options.stale_after, options.step_deadline
        self._peers = {i: _Peer() for i in range(self.n)}
        self.timeout = options.liveness_timeout
        self.confirm = 2 * options.heartbeat + 0.2  # a Last-Will stands once this passed silent
        self.grace_until = 0.0  # nobody is silent before this (after a broker outage)

    # -- queries -------------------------------------------------------------------------------

    @property
    def peers(self) -> Mapping[int, PeerInfo]:
        return MappingProxyType({i: p.view() for i, p in self._peers.items()})

    def _live(self) -> set[int]:
        return {i for i, p in self._peers.items() if not p.gone}

    def expected(self, stage: str) -> set[int]:
        """Live peers that still owe ``stage`` its work (whose statistics a round waits for); a
        re-admitted peer only once it reported a step at or past its joining step and the others
        have reached the step it reported first (module docstring)."""
        live = self._live()
        joining = {i for i in live if self._peers[i].joins_at is not None}
        if joining:
            reached = self.known_step(live - joining)
            for i in list(joining):
                starts_at = self._peers[i].starts_at
                if starts_at is not None and reached >= starts_at:
                    self._peers[i].joins_at = None  # in step with the others now
                    joining.discard(i)
        return {i for i in live - joining if self._peers[i].stage_done != stage}

    def tally(self, stage: str) -> Tally:
        done = tuple(i for i, p in self._peers.items() if p.stage_done == stage)
        return Tally(done=done, dropped=tuple(sorted(i for i, p in self._peers.items() if p.gone)))

    def roster(self) -> Roster:
        live = sorted(self._live())
        return Roster(
            peers=tuple(live),
            addresses=tuple(self._peers[i].address or "" for i in live),
            newest_step=max((self._peers[i].step for i in live), default=0),
        )

    def known_step(self, peers: set[int]) -> int:
        """The step every one of ``peers`` is known to have reached (the slowest's last report);
        0 when there are none."""
        return min((self._peers[i].step for i in peers), default=0)

    # -- gathering -----------------------------------------------------------------------------

    def roll_call(self) -> RollCall:
        """Ready once every peer announced its address and steps per epoch."""
        peers = self._peers.values()
        ready = all(p.address and p.steps_per_epoch for p in peers)
        missing = tuple(sorted(i for i, p in self._peers.items() if not p.address))
        return RollCall(ready=ready, missing=missing)

    def agreed_steps_per_epoch(self) -> int:
        """The peers' common steps per epoch; `OrchestratorError` unless all peers agree on it
        and on the model fingerprint."""
        spe = {p.steps_per_epoch for p in self._peers.values()}
        fps = {p.fingerprint for p in self._peers.values()}
        if len(spe) != 1 or len(fps) != 1:
            raise OrchestratorError(
                f"peers disagree on steps per epoch {sorted(spe)} or model fingerprint "
                f"({len(fps)} different): are they running the same config?"
            )
        return spe.pop()

    # -- events --------------------------------------------------------------------------------

    def heard(self, peer: int, message: Message, now: float, stage: str) -> Heard:
        """File a message from ``peer`` (``stage``: the run's current stage, "" before setup):
        refused if the peer id is unknown or the status is of another orchestrator incarnation;
        otherwise a sign of life, and a status is filed (`_on_status`)."""
        if not 0 <= peer < self.n:
            return Heard(refused="unknown peer id")
        if isinstance(message, Status) and message.incarnation not in ("", self.incarnation):
            return Heard(refused="a status of another orchestrator incarnation (stale)")
        info = self._peers[peer]
        self._alive(info, message, now)
        if isinstance(message, Status):
            return self._on_status(peer, message, now, stage)
        back = stage == "train" and info.gone and info.stage_done != stage
        if isinstance(message, Heartbeat) and back:
            # dropped while it was stalled or cut off, and alive after all: take it back like a
            # restarted peer (it jumps to its neighbours' step once they send to it)
            log.warning("peer.back", peer=peer, step=message.step)
            return Heard(readmit=True, gone=True)
        return Heard(gone=info.gone)

    def _alive(self, info: _Peer, message: Message, now: float) -> None:
        """Anything but a Last-Will is a sign of life."""
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

    def _on_status(self, peer: int, status: Status, now: float, stage: str) -> Heard:
        """File a peer's ``status``."""
        info = self._peers[peer]
        if status.peer != peer:
            log.warning("control.rejected", topic="status", peer=peer, problem="peer mismatch")
            return Heard(gone=info.gone)
        old = 0 < status.ts < self.started_at - self.stale_after
        if not stage and status.state == "ready" and old:
            log.warning(
                "control.rejected",
                topic="status",
                peer=peer,
                problem=f"a 'ready' of {self.started_at - status.ts:.0f} s before this run began",
            )
            return Heard(stale=True, gone=info.gone)
        if status.state == "offline":  # a Last-Will: confirmed by silence in sweep
            info.state, info.offline_at = status.state, now
            return Heard(gone=info.gone)
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
                return Heard(gone=info.gone)
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
        readmit = back and bool(info.address)
        return Heard(changed=True, drop=drop, readmit=readmit, gone=info.gone)

    def drop(self, peer: int, reason: str, stage: str) -> Dropped | None:
        """Mark ``peer`` gone; None if it already was. ``owed``: it had not finished ``stage``."""
        info = self._peers[peer]
        if info.gone:
            return None
        info.gone = True
        log.warning("peer.dropped", peer=peer, reason=reason, live=sorted(self._live()))
        return Dropped(owed=info.stage_done != stage)

    def readmit(self, peer: int, now: float) -> Readmitted | None:
        """Take a dropped ``peer`` back (it announced "ready" again, or is heard again): live
        from now, joining the gossip at `rejoin_step`; None if it was not dropped."""
        joins_at = self.rejoin_step(now)
        info = self._peers[peer]
        if not info.gone or not info.address:
            return None
        info.gone, info.offline_at, info.last_seen = False, None, now
        info.joins_at, info.stage_done, info.step = joins_at, "", joins_at
        info.starts_at = None
        info.readmissions += 1
        log.warning(
            "peer.readmitted",
            peer=peer,
            address=info.address,
            joins_at=joins_at,
            live=sorted(self._live()),
        )
        return Readmitted(joins_at=joins_at, address=info.address)

    def rejoin_step(self, now: float) -> int:
        """The step a peer re-admitted at ``now`` joins at: where the live peers will be
        `REJOIN_LEAD` seconds (at most half the step deadline, which bounds the joining peer's
        wait for them in its first round) from now — the most advanced one's last report moved
        on at their median pace — and at least `REPAIR_AHEAD` steps past the newest step a live
        peer reported."""
        live = [self._peers[i] for i in sorted(self._live())]
        newest = max((p.step for p in live), default=0) + REPAIR_AHEAD
        paces = [pace for p in live if (pace := p.progress.pace()) is not None]
        if not paces:
            return newest
        lead, pace = min(REJOIN_LEAD, self.deadline / 2), max(0.0, statistics.median(paces))
        ahead = [a for p in live if (a := p.progress.ahead(now, lead, pace)) is not None]
        return max(newest, math.ceil(max(ahead, default=0.0)))

    def begin_stage(self, now: float) -> None:
        """A stage starts: every peer's silence is counted from now."""
        for info in self._peers.values():
            info.last_seen = now
            info.step = 0  # step numbers restart with every stage
            info.progress = Progress()

    # -- liveness ------------------------------------------------------------------------------

    def cut_off(self, now: float, backoff: float) -> None:
        """The broker session is down: no Last-Will stands, and silence counts only from
        ``backoff`` seconds (the longest reconnect delay) after this."""
        self.grace_until = now + backoff
        for info in self._peers.values():
            info.offline_at = None

    def sweep(self, now: float, stage: str) -> list[tuple[int, str]]:
        """The peers to drop now, with the reason (each once): a Last-Will that stood for
        ``confirm`` seconds, or a peer busy in ``stage`` and silent past the timeout. Nobody is
        dropped before the run's first stage."""
        out: list[tuple[int, str]] = []
        if not stage:
            return out
        for i, info in self._peers.items():
            if info.offline_at is not None and now - info.offline_at > self.confirm:
                info.offline_at = None
                if not info.gone:
                    out.append((i, "Last-Will (offline) and silent since"))
        if now >= self.grace_until:
            named = {i for i, _ in out}
            for i, info in self._peers.items():
                busy = info.stage_done != stage
                silent = now - max(info.last_seen, self.grace_until)
                if not info.gone and i not in named and busy and silent > self.timeout:
                    out.append((i, f"silent for {silent:.1f} s"))
        return out
