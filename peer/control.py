"""A peer's side of the control plane: follow the orchestrator over MQTT.

`ControlClient` runs on the peer's event loop: one reconnecting `concord.protos.mqtt.Bus` session
with a Last-Will (retained status "offline"), a heartbeat task, the latest schedule / plan / run
control (all retained, so a late or reconnecting peer gets them at once), and the decisions, filed
by (step, round) for the training thread to wait on.

`OrchestratedControl` is the `concord.core.loop.ControlHook` (and
`concord.core.algorithms.RoundControl`) the
training thread uses in a controlled step: after each gossip round it publishes θ_i and ‖g_i‖
and, in barrier mode, waits for the orchestrator's repeat/stop; in lagged mode it runs the rounds
planned by the decision that closed step t − lag (``control.lag``) without waiting between rounds
— it needs that decision only after the step's first round, and it is normally in by then
(`concord.core.control.controller`) — and the step's statistics ride on its metrics message
(`publish_metrics`; the contract's docstring says why the control plane counts messages). With
``control.mode = "fixed"`` (either protocol) nothing is asked: every controlled step runs exactly
``control.rounds`` rounds, known from the config, and its statistics ride on its metrics message
as in lagged mode, for the orchestrator's records; no timeout or fallback can change the rounds.

When the broker is away, the orchestrator is offline (its presence, a Last-Will when it crashed),
or a decision does not come within ``orchestrator.decision_timeout``, the peer keeps going on
what it knows: barrier mode stops after the round (one round per step,
plain gossip), lagged mode keeps the last planned number of rounds; control resumes as soon as
decisions arrive again. Each step records how its rounds were decided ("orchestrator",
"lagged-plan", "fallback").

Nothing received is trusted to be sane, signed or not (with ``network.tls`` every message is
verified against the run CA first, `concord.protos.signing`): the Bus runs every handler inside a
guard (an exception is logged with the topic and counted in ``handler_errors``, never
propagated); a schedule is applied only
if ``schedule_check`` (the coordination's: the members, addresses and mixing matrices this peer
expects) accepts it, otherwise it is refused with a logged reason and counted in
``schedules_refused`` and the peer keeps its schedule; and the rounds of a step never exceed
``control.max_rounds`` whatever a decision says (a larger ``rounds_next``, or a barrier "repeat"
at the last allowed round, is clamped, logged and counted in ``OrchestratedControl.clamped``).

Per-run freshness: the peer follows the orchestrator incarnation (run nonce) of an "online"
presence that acknowledges this peer process (its ``nonce``, sent in every status, listed in the
presence's ``acks``), and acts only on schedules, plans, controls and decisions carrying that
incarnation; before it follows one, retained messages are held back and decisions dropped, so a
validly signed message of an earlier run under the same run id — retained or replayed — is never
obeyed (``stale_refused``, ``control.stale_run``; docs/protocol.md#payloads).

How long a peer waits for what it cannot do without (`ControlClient.give_up`, polled by the
coordination's watchdog): the broker, once reached, may be lost for at most
``orchestrator.broker_lost_timeout`` seconds; while connected, the orchestrator may be absent for at
most ``orchestrator.absent_timeout`` seconds — absent meaning its presence was never seen, is
"offline" (its Last-Will after a crash), or is "online" but has not been refreshed for
`PRESENCE_SILENT` seconds. Time spent disconnected from the broker counts only towards the first
bound (absence is counted from the last (re)connection at the earliest), so a broker restart
shorter than ``broker_lost_timeout`` is survived whatever the order in which the peers and the
orchestrator come back.

`GraphStats` is the `concord.core.loop.GraphHook` of an ``ada-feedback`` run
(`concord.core.graphs.adagraph`): after
every gossip step it publishes θ_i of the step's last round and ‖g_i‖, which the orchestrator's
graph controller turns into schedules; `OrchestratedControl.wait_for_schedule` is how the peer
waits for such a schedule at a decision's effective step (same timeout, same fallback count).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import structlog
import torch

from concord.core.algorithms import RoundControl, StepReport
from concord.core.control.plan import Phase
from concord.core.control.sketch import sketch_rows
from concord.core.records import EvalRecord, MetricsRecord, StepRecord
from concord.protos.control_plane import (
    MAX_ROUNDS,
    Decision,
    Heartbeat,
    Message,
    Metrics,
    Plan,
    Presence,
    RunControl,
    Schedule,
    Stats,
    Status,
    Topics,
)
from concord.protos.mqtt import BrokerAuth, Bus
from concord.protos.signing import Signing

log = structlog.get_logger("concord.peer.control")
T = TypeVar("T")

PRESENCE_SILENT = 30.0
"""Seconds without a presence message after which an "online" orchestrator counts as absent (it
re-publishes its retained presence every 10 s: `concord.orchestrator.app.PRESENCE_REFRESH`)."""

ScheduleCheck = Callable[[Schedule, Schedule | None], str | None]
"""(candidate, schedule accepted so far) → why the candidate is refused (None: accepted)."""


class ControlClient:
    def __init__(
        self,
        url: str,
        run_id: str,
        peer_id: int,
        *,
        heartbeat: float,
        step: Callable[[], int],
        schedule_check: ScheduleCheck | None = None,
        auth: BrokerAuth | None = None,
        signing: Signing | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.schedule_check = schedule_check
        self.topics = Topics(run_id)
        self.heartbeat = heartbeat
        self.current_step = step
        self.bus = Bus(
            url,
            f"peer-{run_id}-{peer_id}",
            self.topics,
            # the presence first: what the others are judged against (`_current`)
            subscribe=["orchestrator", "schedule", "plan", "control", "decision"],
            handler=self._on_message,
            will=("status", peer_id, Status(peer=peer_id, state="offline")),
            auth=auth,
            signing=signing,
        )
        self.schedule: Schedule | None = None
        self.plan: Plan | None = None
        self.control: RunControl | None = None
        self.orchestrator: Presence | None = None  # its presence (retained; None: not seen yet)
        self.changed = asyncio.Event()
        self.decisions: dict[tuple[int, int], Decision] = {}
        self.last_of_step: dict[int, Decision] = {}  # lagged: the decision carrying rounds_next
        self._waiters: dict[tuple[int, int] | int, asyncio.Future[Decision | None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._beat: asyncio.Task[None] | None = None
        self.schedules_refused = 0  # schedules that failed `schedule_check`
        # per-run freshness: the incarnation (run nonce) of the presence this peer follows; the
        # orchestrator's other messages are acted on only when they carry it
        self.incarnation: str | None = None
        # this process's nonce, in every status it publishes: a presence that lists it among
        # its ``acks`` was published after this peer announced itself (a live orchestrator)
        self.nonce = secrets.token_hex(8)
        self.stale_refused = 0  # messages of another incarnation (an earlier run), dropped
        self._pending: dict[str, Message] = {}  # retained kinds held until their presence
        self._told_stale: set[str] = set()
        self._unconfirmed: set[tuple[str, str]] = set()  # presences not followed (logged once)
        self._refused: set[int] = set()  # versions refused (each logged once)
        # the waits' deadlines (`give_up`): monotonic times
        self.started = time.monotonic()
        self._presence_rx = self.started  # the last presence message received
        self._offline_since: float | None = None  # the orchestrator went offline
        self._connected_since: float | None = None  # the current connection (as polled)
        self._lost_since: float | None = None  # the broker was lost (as polled)

    async def __aenter__(self) -> ControlClient:
        await self.bus.__aenter__()
        self._beat = asyncio.create_task(self._heartbeats(), name=f"heartbeat-{self.peer_id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._beat is not None:
            self._beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beat
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        # our retained status must not outlive us (a later run under this id would read it)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.bus.clear("status", self.peer_id), 5)
        await self.bus.close()

    @property
    def connected(self) -> bool:
        return self.bus.connected.is_set()

    # -- incoming ------------------------------------------------------------------------------

    def _on_message(self, kind: str, peer: int | None, message: Message) -> None:
        """The Bus's handler. `Bus._dispatch` guards it: an exception is logged with the topic
        and counted (`handler_errors`), never propagated."""
        self._handle(message)

    @property
    def handler_errors(self) -> int:
        """Messages whose handling raised (counted by the Bus's guard)."""
        return self.bus.handler_errors

    def _on_schedule(self, s: Schedule) -> None:
        current = self.schedule
        if current is not None and s.version < current.version:
            return  # an older version (a re-delivery): nothing new
        if current is not None and s == current:
            return
        why = self.schedule_check(s, current) if self.schedule_check is not None else None
        if why is not None:
            self.schedules_refused += 1
            if s.version not in self._refused:
                self._refused.add(s.version)
                log.warning(
                    "schedule.refused",
                    version=s.version,
                    peers=s.peers,
                    reason=why,
                    kept=None if current is None else current.version,
                )
            return
        self.schedule = s

    def recheck(self) -> None:
        """Check the schedule held again (``schedule_check`` learned more, e.g. our address):
        one that no longer passes is dropped, and the next valid one is waited for."""
        s = self.schedule
        if s is None or self.schedule_check is None:
            return
        why = self.schedule_check(s, None)
        if why is not None:
            self.schedules_refused += 1
            log.warning("schedule.refused", version=s.version, peers=s.peers, reason=why)
            self.schedule = None

    def _current(self, message: Message) -> bool:
        """Whether an orchestrator message belongs to the presence this peer follows. Before any
        presence, a retained message (schedule, plan, control) is held back and looked at
        again once one arrives; a decision is dropped. One of another incarnation — an earlier
        run under this run id, validly signed or not, retained or replayed — is dropped, counted
        in ``stale_refused`` and logged once per incarnation."""
        got = getattr(message, "incarnation", "")
        if self.incarnation is None:
            if not isinstance(message, Decision):
                self._pending[message.KIND] = message
            return False
        if got == self.incarnation:
            return True
        self.stale_refused += 1
        if got not in self._told_stale and len(self._told_stale) < 64:
            self._told_stale.add(got)
            log.warning(
                "control.stale_run",
                kind=message.KIND,
                incarnation=got,
                current=self.incarnation,
                problem="a message of another orchestrator incarnation (an earlier run under "
                "this run id): dropped",
            )
        return False

    def _handle(self, message: Message) -> None:
        if isinstance(message, Presence):
            self._on_presence(message)
            self.changed.set()
            return
        if not self._current(message):
            return
        if isinstance(message, Schedule):
            self._on_schedule(message)
        elif isinstance(message, Plan):
            self.plan = message
        elif isinstance(message, RunControl):
            self.control = message
        elif isinstance(message, Decision):
            self._on_decision(message)
            return
        self.changed.set()

    def _on_decision(self, d: Decision) -> None:
        self.decisions[(d.step, d.round)] = d
        self._wake((d.step, d.round), d)
        if d.rounds_next is not None:
            self.last_of_step[d.step] = d
            self._wake(d.step, d)
        for old in [k for k in self.decisions if k[0] < d.step - 4]:  # bounded memory
            del self.decisions[old]
        for s in [s for s in self.last_of_step if s < d.step - 4]:
            del self.last_of_step[s]

    @property
    def orchestrator_gone(self) -> bool:
        """The orchestrator said, or its Last-Will did, that it is offline: nobody decides."""
        return self.orchestrator is not None and self.orchestrator.state == "offline"

    def gone_for(self, settle: float) -> bool:
        """The orchestrator is offline and has stayed so for ``settle`` seconds of this peer's
        current broker connection. Right after a broker restart its Last-Will ("connection
        lost") may still stand while it reconnects (its backoff is at most 5 s): a peer that
        took that at once for the end would leave before its "done" reached anyone."""
        if not self.orchestrator_gone or not self.connected:
            return False
        since = max(self._offline_since or self.started, self.bus.connected_at or self.started)
        return time.monotonic() - since >= settle

    def _on_presence(self, p: Presence) -> None:
        held = self.incarnation
        if p.state == "online" and p.incarnation != held:
            if self.nonce not in p.acks:
                # not (yet) acknowledging this peer: an earlier run's presence, retained or
                # replayed, or the live one published before our status reached it (it
                # re-stamps its presence when it does)
                told = ("presence", p.incarnation)
                if told not in self._unconfirmed and len(self._unconfirmed) < 64:
                    self._unconfirmed.add(told)
                    log.info(
                        "orchestrator.presence_unconfirmed",
                        incarnation=p.incarnation,
                        problem="an 'online' presence that does not acknowledge this peer "
                        "process: not followed (an earlier run's, or one older than our status)",
                    )
                return
            self.incarnation = p.incarnation
            if held is not None:
                log.warning("orchestrator.new_incarnation", incarnation=p.incarnation, was=held)
            for kind in ("plan", "schedule", "control"):  # held back until now: in order
                pending = self._pending.pop(kind, None)
                if pending is not None and getattr(pending, "incarnation", "") == p.incarnation:
                    self._handle(pending)
            self._pending.clear()
        elif held is not None and p.incarnation != held:
            # an offline presence (a Last-Will) of another incarnation says nothing about ours
            self.stale_refused += 1
            return
        was_gone = self.orchestrator_gone
        self.orchestrator = p
        self._presence_rx = time.monotonic()
        if self.orchestrator_gone and not was_gone:
            self._offline_since = self._presence_rx
            log.warning("orchestrator.offline", reason=p.reason)
            for fut in self._waiters.values():  # nobody will answer: stop waiting now
                if not fut.done():
                    fut.set_result(None)
            self._waiters.clear()
        elif was_gone and not self.orchestrator_gone:
            log.info("orchestrator.online")

    def orchestrator_absent(self, now: float) -> tuple[float, str]:
        """(seconds the orchestrator has been absent, how) as seen from here; (0, "") while its
        presence is "online" and fresh (module docstring)."""
        p = self.orchestrator
        if p is None:
            return now - self.started, "its presence was never seen"
        if p.state == "offline":
            since = self._offline_since if self._offline_since is not None else self.started
            return now - since, f"it is offline ({p.reason or 'no reason given'})"
        silent = now - self._presence_rx
        if silent >= PRESENCE_SILENT:
            return silent, f"its presence has not been refreshed for {silent:.0f} s"
        return 0.0, ""

    def give_up(
        self, now: float, *, absent_timeout: float, broker_lost_timeout: float
    ) -> str | None:
        """Why this peer must stop waiting (a broker lost too long, an orchestrator absent too
        long), or None; call it regularly (it tracks connection changes as it sees them).
        Before the first connection the broker is not "lost": `join` bounds that wait."""
        if not self.connected:
            self._connected_since = None
            if self._lost_since is None:
                self._lost_since = now
            lost = now - self._lost_since
            if self.bus.connects and lost >= broker_lost_timeout:
                return (
                    f"the MQTT broker has been unreachable for {lost:.1f} s "
                    f"(orchestrator.broker_lost_timeout = {broker_lost_timeout:g} s)"
                )
            return None
        self._lost_since = None
        if self._connected_since is None:
            self._connected_since = now
        absent, how = self.orchestrator_absent(now)
        absent = min(absent, now - self._connected_since)
        if absent >= absent_timeout:
            return (
                f"the orchestrator has been absent for {absent:.1f} s: {how} "
                f"(orchestrator.absent_timeout = {absent_timeout:g} s)"
            )
        return None

    async def watch(
        self, *, absent_timeout: float, broker_lost_timeout: float, every: float = 0.25
    ) -> str:
        """Poll `give_up` every ``every`` seconds; returns its reason (the caller gives up)."""
        while True:
            why = self.give_up(
                time.monotonic(),
                absent_timeout=absent_timeout,
                broker_lost_timeout=broker_lost_timeout,
            )
            if why is not None:
                return why
            await asyncio.sleep(every)

    def _wake(self, key: tuple[int, int] | int, d: Decision) -> None:
        fut = self._waiters.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(d)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.5 if left is None else min(left, 0.5))
        return True

    async def decision(self, key: tuple[int, int] | int, timeout: float) -> Decision | None:
        """The decision for (step, round), or — key = step — the step's last (lagged) decision;
        None at once when the broker or the orchestrator is away (or goes away while this
        waits), or after ``timeout``."""
        have = self.decisions.get(key) if isinstance(key, tuple) else self.last_of_step.get(key)
        if have is not None:
            return have
        if not self.connected or self.orchestrator_gone:
            return None
        fut = self._waiters.get(key)
        if fut is None or fut.done():
            fut = self._waiters[key] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            if self._waiters.get(key) is fut:
                del self._waiters[key]
            return None

    # -- outgoing ------------------------------------------------------------------------------

    def send(self, kind: str, message: Message, peer: bool = True) -> None:
        """Publish without waiting (call on this loop; other threads: ``call_soon_threadsafe``)."""
        self.send_all(kind, [message], peer)

    def send_all(self, kind: str, messages: Sequence[Message], peer: bool = True) -> None:
        """Publish ``messages`` in order without waiting, as one task (one event-loop turn)."""
        sender = self.peer_id if peer else None

        async def publish_all() -> None:
            for m in messages:
                await self.bus.publish(kind, m, sender)

        task = asyncio.create_task(publish_all(), name=f"pub-{kind}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def status(self, state: str, **fields: Any) -> None:
        """Publish this peer's status, stamped with the incarnation it follows (none yet: "")."""
        await self.bus.publish(
            "status",
            Status(
                peer=self.peer_id,
                state=state,
                step=self.current_step(),
                ts=time.time(),
                incarnation=self.incarnation or "",
                nonce=self.nonce,
                **fields,
            ),
            self.peer_id,
        )

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat)
            if self.connected:
                beat = Heartbeat(peer=self.peer_id, step=self.current_step(), ts=time.time())
                await self.bus.publish("heartbeat", beat, self.peer_id)


class OrchestratedControl:
    """ControlHook + RoundControl of a peer (module docstring). Called from the training thread."""

    def __init__(
        self,
        client: ControlClient,
        loop: asyncio.AbstractEventLoop,
        *,
        stage: str,
        lagged: bool,
        lag: int = 1,
        timeout: float,
        bytes_sent: Callable[[], int],
        max_rounds: int = MAX_ROUNDS,
        fixed_rounds: int | None = None,
        statistic: str = "theta",
    ) -> None:
        self.client = client
        # control.statistic "sketch": every round's Stats also carries s_i = S_t x_i
        self.sketch = statistic == "sketch"
        self.loop = loop
        self.stage = stage
        self.max_rounds = max(1, max_rounds)  # control.max_rounds: no decision goes beyond
        self.clamped = 0  # decisions asking for more rounds than that (logged)
        # control.mode = "fixed": the rounds of every controlled step, decided by nobody
        self.fixed = (
            None if fixed_rounds is None or stage != "train" else min(fixed_rounds, self.max_rounds)
        )
        self.lagged = lagged and stage == "train" and self.fixed is None
        self.lag = lag
        self.timeout = timeout
        self.bytes_sent = bytes_sent
        self.step = 0
        self.grad_norm = 0.0
        self.target: float | None = None
        self.planned = 1
        self.how = ""  # how this step's rounds were decided (metrics)
        self.fallbacks = 0
        self.wait_s = 0.0  # time this step spent blocked on the orchestrator (metrics)
        self._held: list[Stats] = []  # lagged: this step's statistics, for its metrics record
        self._plan_of: int | None = None  # lagged: the step whose decision plans this one

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        t0 = time.perf_counter()
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout + 30)
        finally:
            self.wait_s += time.perf_counter() - t0

    def begin(self, step: int, phase: Phase, grad_norms: torch.Tensor) -> RoundControl:
        self._flush_held()
        self.step, self.grad_norm = step, float(grad_norms[0])
        self.how = "orchestrator" if self.stage == "train" else "calibration"
        self._plan_of = None
        if self.fixed is not None:
            self.planned, self.how = self.fixed, "fixed"
        elif self.lagged:
            if step - self.lag < phase.start:
                self.planned = 1  # first `lag` steps of a controlled phase: one round
            else:
                self._plan_of = step - self.lag
                self._take_plan(wait=False)
        return self

    def _take_plan(self, *, wait: bool) -> None:
        """Lagged: take the rounds of this step from the decision that closed step t − lag.
        Every step runs at least one round, so the plan is needed only after round 1: `begin`
        takes it when it is already here (a dict read, atomic; the loop thread only adds and
        prunes entries), `after_round(1)` waits for it if it is not (with lag 1 the step's
        local update and first round overlap the slowest peer's previous step)."""
        if self._plan_of is None:
            return
        d = self.client.last_of_step.get(self._plan_of)
        if d is None and not wait:
            return
        if d is None:
            d = self._call(self.client.decision(self._plan_of, self.timeout))
        self._plan_of = None
        if d is not None and d.rounds_next is not None:
            rounds = d.rounds_next
            if rounds > self.max_rounds:
                rounds = self._clamp(d, asked=rounds)
            self.planned, self.target, self.how = rounds, d.target, "lagged-plan"
        else:
            self.how = "fallback"
            self.fallbacks += 1

    def after_round(self, round_index: int, x: torch.Tensor, theta_local: torch.Tensor) -> bool:
        stats = Stats(
            peer=self.client.peer_id,
            step=self.step,
            round=round_index,
            theta=float(theta_local[0]),
            grad_norm=self.grad_norm,
            bytes_sent=self.bytes_sent(),
            stage=self.stage,
            sketch=sketch_rows(x, self.step)[0].tolist() if self.sketch else [],
        )
        if self.fixed is not None or self.lagged:
            # nothing is decided before the step's last round: its statistics ride on the
            # step's metrics message (`publish_metrics`), no message of their own
            self._held.append(stats)
            self._take_plan(wait=True)  # mode fixed: no plan to take (`_plan_of` is None)
            return round_index < self.planned
        self.loop.call_soon_threadsafe(self.client.send, "stats", stats)
        if self.stage != "train":
            return False  # calibration: uncontrolled, one round
        d = self._call(self.client.decision((self.step, round_index), self.timeout))
        if d is None:
            self.how = "fallback"
            self.fallbacks += 1
            log.warning("control.fallback", step=self.step, round=round_index)
            return False
        self.target = d.target
        if d.repeat and round_index >= self.max_rounds:
            self._clamp(d, asked=round_index + 1)
            return False
        return d.repeat

    def _clamp(self, d: Decision, *, asked: int) -> int:
        """A decision asks for more rounds than ``control.max_rounds``: run that many."""
        self.clamped += 1
        log.warning(
            "control.clamped",
            step=d.step,
            round=d.round,
            asked=asked,
            max_rounds=self.max_rounds,
            reason=d.reason,
        )
        return self.max_rounds

    def end(self, step: int) -> float | None:
        self._take_plan(wait=False)  # a step without rounds never needed its plan
        self._plan_of = None
        return self.target

    def wait_for_schedule(self, predicate: Callable[[], bool]) -> bool:
        """Block the training thread until ``predicate`` holds (checked on the event loop at
        every control-plane message), at most the decision timeout and not at all while the
        orchestrator is offline; False (a fallback, counted) when it does not."""
        client = self.client

        def settled() -> bool:
            return predicate() or client.orchestrator_gone

        ok = bool(self._call(client.wait_for(settled, self.timeout))) and predicate()
        if not ok:
            self.fallbacks += 1
            why = "orchestrator offline" if client.orchestrator_gone else "timeout"
            log.warning("graph.schedule_timeout", step=self.step, waited=self.wait_s, why=why)
        return ok

    def publish_metrics(self, record: MetricsRecord) -> None:
        """Publish a step or evaluation record (`metrics_values`); a lagged step's record carries
        its statistics."""
        step = record.step
        event = "step" if isinstance(record, StepRecord) else "eval"
        held: list[Stats] = []
        if event == "step" and self._held and self._held[0].step == step:
            held, self._held = self._held, []
        message = Metrics(
            peer=self.client.peer_id,
            step=step,
            values=metrics_values(record),
            event=event,
            stats=held,
        )
        self.loop.call_soon_threadsafe(self.client.send, "metrics", message)

    def _flush_held(self) -> None:
        """Statistics of an earlier step whose record was not published (no metrics hook): on
        the stats topic, so the orchestrator still gets them."""
        if self._held:
            self.loop.call_soon_threadsafe(self.client.send_all, "stats", self._held)
            self._held = []

    def close(self) -> None:
        """After the last step: send what is still held."""
        self._flush_held()


def metrics_values(record: StepRecord | EvalRecord) -> dict[str, float]:
    """A record's numbers as a `Metrics` message's ``values`` (an open mapping of the control
    plane): every number of its JSON document under the record's own names (docs/records.md;
    an evaluation's ``accuracy_mean_peer`` and ``loss_mean_peer``, which the orchestrator, ``concord
    status`` and the launcher read with `concord.core.records.peer_accuracy` and ``peer_loss``),
    the ``extra`` of a step included; flags, text, lists and absent values are left out."""
    return {
        k: float(v)
        for k, v in record.to_json().items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


class GraphStats:
    """`concord.core.loop.GraphHook` of a peer in an ada-feedback run (module docstring). Called
    from the training thread; publishing happens on the event loop without waiting."""

    def __init__(
        self,
        client: ControlClient,
        loop: asyncio.AbstractEventLoop,
        *,
        bytes_sent: Callable[[], int],
    ) -> None:
        self.client = client
        self.loop = loop
        self.bytes_sent = bytes_sent

    def observe(
        self, step: int, phase: Phase, grad_norms: torch.Tensor, report: StepReport
    ) -> None:
        if report.theta_local is None or phase.controlled:
            return  # no gossip, or consensus control already reports every round
        stats = Stats(
            peer=self.client.peer_id,
            step=step,
            round=report.rounds,
            theta=float(report.theta_local[0]),
            grad_norm=float(grad_norms[0]),
            bytes_sent=self.bytes_sent(),
            stage="train",
        )
        self.loop.call_soon_threadsafe(self.client.send, "stats", stats)
