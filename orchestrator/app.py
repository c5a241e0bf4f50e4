"""The orchestrator process: ``concord orchestrator --config RUN.toml [--broker URL] [--out DIR]``.

One asyncio loop, no torch. With no broker given it embeds one (amqtt on 127.0.0.1, a free port).
This module wires the concerns together and owns the loop, the broker session and the tasks; the
logic lives, sans-io, in

* `concord.orchestrator.options` — the config, resolved once into each part's options;
* `concord.orchestrator.admission` — the peer table: ready peers, liveness, drops;
* `concord.orchestrator.schedules` — the phase plan and the schedule versions (repairs, graphs);
* `concord.orchestrator.rounds` — the round book: statistics in, repeat/stop decisions out
  (`concord.orchestrator.graphs` for ada-feedback's graph decisions);
* `concord.orchestrator.records` and `concord.orchestrator.metrics` — the run directory's files.

The parts do not reach into one another. Admission owns its peers' state, and the orchestrator
talks to it only through `concord.orchestrator.admission.PeerAdmission`: it hands over every
per-peer message (``heard``) and is told, in a frozen `Heard`, what to do about it (refuse and
count it, drop the peer, re-admit it, clear a stale status, wake the waiters); it asks who a
round waits for (``expected``), who gossips at which address (``roster``), whether every peer
is here (``roll_call``) and how the run ended (``tally``), and reads peers only as snapshots
(``peers``). Each part is given its settings (`concord.orchestrator.options`) rather than the
config; the config itself goes only to the builders that take it whole (the phase plan, the
controller's settings, the checkpoint, the manifest, the broker session's credentials).

The run, as seen from here:

1. clear the run's stale retained ``control``/``schedule``; wait for every peer's retained
   ``status`` "ready" (all must agree on steps per epoch and model) within
   ``network.startup_timeout``;
2. publish the phase plan, schedule v1 and the manifest;
3. constant targets: a ``calibrate`` stage — peers run the controlled phases uncontrolled, the
   max Θ per phase becomes the calibration (``calibration.json``);
4. the ``train`` stage: statistics in, decisions out (barrier or lagged; mode ``fixed``: none,
   every peer runs ``control.rounds`` rounds on its own), metrics and decided rounds recorded;
   in an ada-feedback run the statistics of uncontrolled steps go to the graph book, and every
   decision point publishes a schedule version effective at its step + lag;
5. liveness: a dropped peer (Last-Will, "failed", silence) is no longer waited for, and a
   repaired schedule over the live peers is published; a peer restarted with the same command
   announces "ready" again and is re-admitted: a new schedule version includes it, with its new
   address, effective a little ahead of the live peers (`Orchestrator._readmit`);
6. when every live peer is done: ``control`` "stop", ``orchestrator-summary.json``, exit 0 (1 if
   no peer finished).

SIGTERM/SIGINT publish "stop" and exit.

A lost broker is reconnected to (with backoff) for at most ``orchestrator.broker_lost_timeout``
seconds; then the run ends with an error. Whenever the run ends with an `OrchestratorError` after
the broker was reached (broker lost, peers never ready, stopped by a signal),
``orchestrator-summary.json`` is written with ``completed: false`` and the ``error`` (atomically,
like every JSON document of the run), and the process exits 1.

Nothing received is trusted to be sane, signed or not (with ``network.tls`` every message is
verified against the run CA first, `concord.protos.signing`): the Bus handles every message inside
a guard (an exception is logged with the topic and counted as ``handler_errors``, never
propagated); statistics from unknown or dropped peers, implausibly
large ones (above `MAX_STATISTIC`) and ones for steps that are not open
(`concord.orchestrator.rounds`) are refused and counted (``stats_refused``); a status with a
malformed address is refused (`concord.orchestrator.admission`).

Run ids and retained state: the run's retained topics (``control``, ``schedule``, ``plan``, the
presence and every peer's ``status``) are cleared at the end of the run, and ``control``,
``schedule`` and ``plan`` at its start. Peers' ``status`` topics are not cleared at the start —
a peer started before the orchestrator announced itself there — but a retained "ready" stamped
more than ``network.startup_timeout`` + `concord.orchestrator.options.STALE_SLACK` seconds before
this orchestrator started (a crashed run's leftover: its peer gave up long ago) is refused and
its topic cleared (`concord.orchestrator.admission`). A run refuses to start
(`OrchestratorError`) while another orchestrator's presence under the same run id is retained
"online" and fresh (refreshed every `PRESENCE_REFRESH` seconds by its owner; older than
`PRESENCE_STALE`: a crashed run's leftover).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from concord.core.config import RunConfig, to_toml
from concord.core.control.controller import CalibrationRecorder, ConsensusController
from concord.core.control.runplan import (
    calibration_steps,
    control_config,
    make_lr_schedule,
    make_plan,
)
from concord.core.graphs.adagraph import FeedbackDecision, GraphFeedback, feedback_config
from concord.core.records import OrchestratorSummary
from concord.errors import OrchestratorError as OrchestratorError
from concord.orchestrator import checkpoint
from concord.orchestrator.admission import Admission, PeerAdmission
from concord.orchestrator.broker import EmbeddedBroker, embedded_broker_secured
from concord.orchestrator.graphs import GraphBook
from concord.orchestrator.metrics import MetricsTable
from concord.orchestrator.options import OrchestratorOptions
from concord.orchestrator.records import RunRecords, manifest, summary
from concord.orchestrator.rounds import RoundBook
from concord.orchestrator.schedules import Schedules, plan_message
from concord.orchestrator.store import StoreError, TorchStore, torch_store
from concord.orchestrator.telemetry import OrchestratorMetrics
from concord.protos.control_plane import (
    Decision,
    Message,
    Metrics,
    Presence,
    RunControl,
    Stats,
    Status,
    Topics,
)
from concord.protos.exposure import check_exposure, exposure_of
from concord.protos.mqtt import BrokerAuth, Bus
from concord.protos.signing import signing_for
from concord.runtime.lifecycle import dump_tasks
from concord.runtime.logs import open_log
from concord.runtime.telemetry import metrics_server

log = structlog.get_logger("concord.orchestrator.app")

PUBLISH_DRAIN = 5.0  # seconds the last publishing tasks get at the end of the run
PRESENCE_REFRESH = 10.0  # seconds between re-publications of the retained "online" presence
PRESENCE_STALE = 3 * PRESENCE_REFRESH  # an "online" presence older than this is a leftover
RETAINED_SETTLE = 0.5  # seconds to let the retained messages arrive after (re)subscribing
MAX_STATISTIC = 1e100  # θ_i or ‖g_i‖ above this is no measurement (and would overflow sums)


class Orchestrator:
    def __init__(
        self,
        cfg: RunConfig,
        out: Path,
        *,
        broker: str | None,
        run_id: str,
        resume_step: int | None = None,
    ) -> None:
        self.cfg = cfg  # for the builders that take the whole config (plan, checkpoint, …)
        self.options = options = OrchestratorOptions.resolve(cfg, run_id=run_id, broker=broker)
        self.out = out
        # continue an interrupted run after this step (`concord.orchestrator.checkpoint`)
        self.resume_step = resume_step
        self.resumed = None if resume_step is None else checkpoint.load(out, resume_step, cfg)
        self.store: TorchStore | None = None  # network.transport = "torch": the rendezvous
        self.run_id = run_id
        self.topics = Topics(run_id)
        # this incarnation's run nonce: in the presence and every message it publishes (the
        # Bus stamps it); peers obey nothing of another incarnation (an earlier run's leftover)
        self.incarnation = secrets.token_hex(8)
        self.admission: PeerAdmission = Admission(
            options.admission, incarnation=self.incarnation, started_at=time.time()
        )
        self.schedules = Schedules(options.schedules)
        self.book: RoundBook | None = None
        self.graphs: GraphBook | None = None  # ada-feedback: per-step statistics → graphs
        self.stage = ""
        self.changed = asyncio.Event()  # any peer state change (waiters re-check)
        self.stop_requested = False
        self.started = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()  # publishing tasks, drained at the end
        self.records = RunRecords(out, graphs=options.graph_feedback, resume_after=resume_step)
        self.metrics = MetricsTable(self.records.metric)
        self.bus: Bus | None = None
        self.stats_refused = 0  # statistics refused here (the round book counts its own)
        self.rival: Presence | None = None  # another orchestrator's presence on our run id
        self._own_presence: set[float] = set()  # ts of the presences we published
        # peer → the nonce of its latest status, acknowledged in the presence (a peer follows
        # this incarnation only once it sees its own nonce there: `concord.peer.control`)
        self._acks: dict[int, str] = {}
        self._online = False  # the first "online" presence is out: re-stamping may begin
        self._restamp: asyncio.Task[None] | None = None
        self._acked: list[str] = []  # the nonces the latest presence published acknowledged
        self._lost_since: float | None = None  # monotonic time the broker was lost (liveness)
        self.broker_lost: str | None = None  # why the run gives up on the broker
        self.telemetry = OrchestratorMetrics(  # `metrics.listen` serves it
            run_id,
            self.admission,
            lambda: (self.bus.rejected if self.bus else 0, self.stats_refused),
        )

    def expected(self) -> set[int]:
        """Peers whose statistics a round of the current stage waits for."""
        return self.admission.expected(self.stage)

    # -- events in -----------------------------------------------------------------------------

    async def on_message(self, kind: str, peer: int | None, message: Message) -> None:
        """The Bus's handler. `Bus._dispatch` guards it: an exception is logged with the topic
        and counted (`handler_errors`), never propagated."""
        await self._handle(kind, peer, message)

    @property
    def handler_errors(self) -> int:
        """Messages whose handling raised (counted by the Bus's guard)."""
        return self.bus.handler_errors if self.bus is not None else 0

    def _refuse(self, kind: str, peer: int | None, problem: str) -> None:
        self.stats_refused += kind in ("stats", "metrics")
        log.warning("control.rejected", topic=kind, peer=peer, problem=problem)

    async def _handle(self, kind: str, peer: int | None, message: Message) -> None:
        if isinstance(message, Presence):
            if message.ts not in self._own_presence:  # not our own, echoed back
                self.rival = message
                if message.state == "online":
                    log.warning("orchestrator.rival", ts=message.ts, reason=message.reason)
            return
        if peer is None:
            return  # every other subscribed kind is per-peer
        now = time.monotonic()
        heard = self.admission.heard(peer, message, now, self.stage)
        if heard.refused is not None:
            self._refuse(kind, peer, heard.refused)
            return
        if isinstance(message, Status) and message.nonce:
            self._acknowledge(peer, message.nonce)
        if heard.drop is not None:
            self._drop(peer, heard.drop)
        if heard.readmit:
            self._readmit(peer, now)
        if heard.stale and self.bus is not None:  # a leftover of an earlier run: gone
            self._spawn(self.bus.clear("status", peer), "clear")
        if heard.changed:
            self.changed.set()
        if isinstance(message, Stats):
            self._on_stats(kind, peer, [message], now, dropped=heard.gone)
        elif isinstance(message, Metrics):
            if message.stats:  # a lagged step's statistics: decide first, then bookkeeping
                self._on_stats(kind, peer, message.stats, now, dropped=heard.gone)
            self.metrics.add(peer, message.step, message.event, message.values)
            live = set(self.admission.roster().peers)
            self.metrics.emit(self.expected() if self.stage == "train" else live)

    def _acknowledge(self, peer: int, nonce: str) -> None:
        """A status carrying ``nonce``: a new peer process is acknowledged in the presence."""
        if self._acks.get(peer) == nonce:
            return
        self._acks[peer] = nonce
        self._kick_restamp()

    def _kick_restamp(self) -> None:
        """Re-stamp the "online" presence while it lags the acknowledged nonces. One task at a
        time, looping until a publication carries them all: a status that arrives while a
        re-stamp is being published (its acks already taken) gets the next one, not the
        periodic refresh `PRESENCE_REFRESH` seconds later (its peer would wait that long)."""
        if not self._online or self._acked == sorted(self._acks.values()):
            return
        if self._restamp is None or self._restamp.done():
            self._restamp = asyncio.create_task(self._restamp_until_current(), name="restamp")
            self._tasks.add(self._restamp)
            self._restamp.add_done_callback(self._tasks.discard)

    async def _restamp_until_current(self) -> None:
        while self._online and self._acked != sorted(self._acks.values()):
            await self._presence("online")

    def _on_stats(
        self, kind: str, peer: int, stats: list[Stats], now: float, *, dropped: bool
    ) -> None:
        if any(s.peer != peer for s in stats):
            self._refuse(kind, peer, "peer mismatch")
            return
        if dropped:
            self._refuse(kind, peer, "statistics of a dropped peer")
            return
        if any(max(s.theta, s.grad_norm) > MAX_STATISTIC for s in stats):
            self._refuse(kind, peer, f"statistic above {MAX_STATISTIC:g}")
            return
        expected = self.expected()
        base = self.admission.known_step(expected)
        for s in stats:
            if self.graphs is not None and self.schedules.is_graph_statistic(s):
                self._publish_graphs(self.graphs.add(s, expected, now))
            elif self.book is not None:
                refused = self.book.refused
                self._publish_all(self.book.add(s, expected, now, base))
                if self.book.refused > refused:
                    self._refuse(kind, peer, f"step {s.step} is not open (peers at {base})")

    def _drop(self, peer: int, reason: str) -> None:
        """Drop ``peer``: pending rounds stop waiting for it, the schedule is repaired."""
        dropped = self.admission.drop(peer, reason, self.stage)
        if dropped is None:
            return
        if self.book is not None:
            self._publish_all(self.book.expire(self.expected(), time.monotonic()))
        if self.stage and self.admission.roster().peers and dropped.owed:
            self._spawn(self._publish_schedule(f"peer {peer} left ({reason})"), "schedule")
        self.changed.set()

    def _readmit(self, peer: int, now: float) -> None:
        """A peer restarted and announced "ready" again mid-training: drop its old incarnation
        (if that was not noticed yet) and take it back with the address it announced, in a new
        schedule version effective where the live peers will be shortly
        (`Admission.rejoin_step`); it fetches its parameters from a neighbour, answered at that
        step's boundary, and starts there (`concord.peer.app`)."""
        restarted = "restarted (announced ready during training)"
        if self.admission.drop(peer, restarted, self.stage) is not None and self.book is not None:
            self._publish_all(self.book.expire(self.expected(), now))
        back = self.admission.readmit(peer, now)
        if back is None:
            return
        reason = f"peer {peer} re-admitted at {back.address}"
        self._spawn(self._publish_schedule(reason, effective_step=back.joins_at), "schedule")
        self.changed.set()

    async def _liveness(self) -> None:
        """Owned task: drop silent peers, decide stale rounds (10 Hz); see
        `concord.orchestrator.admission.Admission.sweep`."""
        assert self.bus is not None
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            if not self.bus.connected.is_set():
                self.admission.cut_off(now, self.bus.backoff[1])
                self._check_broker_lost(now)
                continue
            self._lost_since = None
            for peer, reason in self.admission.sweep(now, self.stage):
                self._drop(peer, reason)
            if self.book is not None and self.book.pending:
                self._publish_all(self.book.expire(self.expected(), now))
            if self.graphs is not None and self.graphs.pending:
                self._publish_graphs(self.graphs.expire(self.expected(), now))

    # -- publishing ----------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> None:
        task = asyncio.create_task(coro, name=f"orchestrator-publish-{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _publish_all(self, decisions: list[Decision]) -> None:
        assert self.bus is not None
        self.telemetry.decided(decisions)
        for d in decisions:
            self._spawn(self.bus.publish("decision", d), "decision")
        if self.book is not None:
            self.records.rounds(self.book.records)
            self.book.records.clear()

    async def _publish_schedule(self, reason: str, effective_step: int | None = None) -> None:
        roster = self.admission.roster()
        if not roster.peers:  # every peer left between the drop that asked for it and now
            log.warning("schedule.skipped", reason=reason, why="no live peer left")
            return
        schedule = self.schedules.next(
            reason,
            list(roster.peers),
            list(roster.addresses),
            roster.newest_step,
            effective_step,
        )
        assert self.bus is not None
        await self.bus.publish("schedule", schedule)
        log.info(
            "schedule.published", version=schedule.version, peers=schedule.peers, reason=reason
        )
        self.records.schedule(self.schedules.row(schedule))

    def _publish_graphs(self, decisions: list[FeedbackDecision]) -> None:
        """Every decision point becomes a schedule version effective at its step + lag."""
        for d in decisions:
            reason = self.schedules.on_feedback(d)
            self.records.graph(d)
            self._spawn(self._publish_schedule(reason, effective_step=d.effective), "schedule")

    def _check_broker_lost(self, now: float) -> None:
        """The broker is away at ``now``: past ``orchestrator.broker_lost_timeout`` the run gives
        up (`_wait` raises)."""
        if self._lost_since is None:
            self._lost_since = now
            return
        lost, limit = now - self._lost_since, self.options.broker_lost_timeout
        if lost >= limit and self.broker_lost is None:
            self.broker_lost = (
                f"the MQTT broker has been unreachable for {lost:.1f} s "
                f"(orchestrator.broker_lost_timeout = {limit:g} s)"
            )
            log.error("orchestrator.broker_lost", seconds=round(lost, 1))
            self.changed.set()

    async def _presence(self, state: str, reason: str = "") -> None:
        assert self.bus is not None
        ts = time.time()
        self._own_presence.add(ts)
        acks = sorted(self._acks.values())
        await self.bus.publish(
            "orchestrator", Presence(state=state, ts=ts, reason=reason, acks=acks)
        )
        self._online = state == "online"
        self._acked = acks
        self._kick_restamp()  # statuses that arrived while this one was being published

    async def _refresh_presence(self) -> None:
        """Owned task: keep the retained "online" presence fresh (what tells a second
        orchestrator on this run id that this one is alive)."""
        while True:
            await asyncio.sleep(PRESENCE_REFRESH)
            await self._presence("online")

    def _check_no_rival(self) -> None:
        """`OrchestratorError` if another orchestrator is live under this run id."""
        p = self.rival
        if p is None or p.state != "online":
            return
        age = time.time() - p.ts
        if age < PRESENCE_STALE:
            raise OrchestratorError(
                f"another orchestrator is live under run id {self.run_id!r} (its presence is "
                f"'online', refreshed {age:.0f} s ago): give this run its own id (--run-id or "
                "the config's name) or stop the other run"
            )
        log.warning("orchestrator.stale_presence", age=round(age, 1), run=self.run_id)

    async def _clear_retained(self, *, peers: bool) -> None:
        """Publish empty retained payloads on the run's retained topics."""
        assert self.bus is not None
        for kind in ("control", "schedule", "plan"):
            await self.bus.clear(kind)
        if peers:
            for i in range(self.options.admission.peers):
                await self.bus.clear("status", i)
            await self.bus.clear("orchestrator")

    # -- the run -------------------------------------------------------------------------------

    async def _wait(self, predicate: Callable[[], bool], timeout: float | None, what: str) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            if self.broker_lost is not None:
                raise OrchestratorError(f"{self.broker_lost}, while waiting for {what}")
            if self.stop_requested:
                raise OrchestratorError(f"stopped while waiting for {what}")
            self.changed.clear()
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise OrchestratorError(f"timed out after {timeout} s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0 if left is None else min(left, 1.0))

    async def _gather_peers(self) -> int:
        try:
            await self._wait(
                lambda: self.admission.roll_call().ready,
                self.options.startup_timeout,
                "peers to be ready",
            )
        except OrchestratorError as exc:
            missing = list(self.admission.roll_call().missing)
            raise OrchestratorError(f"{exc}; missing peers {missing}") from None
        return self.admission.agreed_steps_per_epoch()

    def _lagged_plans(self, controller: ConsensusController) -> list[Decision]:
        """A resumed lagged run: the decisions that planned the rounds of the steps after the
        resumed one (made before the interruption; the peers' copies were lost with them)."""
        lag, after = self.options.lag, self.resume_step
        if after is None or lag is None:
            return []
        out = []
        for step in range(after + 1, after + 1 + lag):
            rounds = controller.planned(step)
            if rounds is not None:
                decision = Decision(
                    step=step - lag,
                    round=0,
                    repeat=False,
                    rounds_next=rounds,
                    reason="resumed",
                )
                out.append(decision)
        return out

    async def _run_stage(
        self,
        stage: str,
        steps: int,
        step_base: int,
        book: RoundBook,
        *,
        plans: Sequence[Decision] = (),
    ) -> None:
        self.stage, self.book = stage, book
        self.admission.begin_stage(time.monotonic())
        assert self.bus is not None
        start = RunControl(
            action="start", stage=stage, steps=steps, step_base=step_base, ts=time.time()
        )
        await self.bus.publish("control", start)
        for decision in plans:
            await self.bus.publish("decision", decision)
        live = list(self.admission.roster().peers)
        log.info("stage.start", stage=stage, steps=steps, live=live)
        await self._wait(lambda: not self.expected(), None, f"peers to finish stage {stage!r}")
        self._publish_all(book.expire(set(), time.monotonic()))
        log.info("stage.done", stage=stage, ignored=book.ignored)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        async with contextlib.AsyncExitStack() as stack:
            url, o = self.options.broker, self.cfg.orchestrator
            metrics = metrics_server(self.options.metrics_listen, self.telemetry.registry, self.out)
            if metrics is not None:
                await stack.enter_async_context(metrics)
            if url is None:
                url = (await stack.enter_async_context(EmbeddedBroker.from_config(o))).url
            will = ("orchestrator", None, Presence(state="offline", reason="connection lost"))
            self.bus = await stack.enter_async_context(
                Bus(
                    url,
                    f"orchestrator-{self.run_id}",
                    self.topics,
                    subscribe=["status", "heartbeat", "stats", "metrics", "orchestrator"],
                    handler=self.on_message,
                    will=will,
                    auth=(
                        BrokerAuth.from_config(o, "orchestrator")
                        if self.options.broker or embedded_broker_secured(o)
                        else None
                    ),
                    signing=signing_for(self.cfg, "orchestrator", self.run_id),
                    incarnation=self.incarnation,
                )
            )
            try:
                self.store = torch_store(self.cfg, url)
            except StoreError as exc:
                raise OrchestratorError(str(exc)) from exc
            info = {"broker": url, "run": self.run_id, "pid": os.getpid()}
            if self.store is not None:
                info["torch_store"] = self.store.address
            self.records.write_json("orchestrator.json", info)
            if not await self.bus.wait_connected(self.options.startup_timeout):
                raise OrchestratorError(f"cannot reach the MQTT broker at {url}")
            await asyncio.sleep(RETAINED_SETTLE)  # the retained presence, if any, is in
            try:
                self._check_no_rival()
            except OrchestratorError:
                self.records.close()
                raise
            await self._clear_retained(peers=False)
            # retained, and re-published by the Bus after every reconnect
            await self._presence("online")
            watchdog = asyncio.create_task(self._liveness(), name="orchestrator-liveness")
            refresh = asyncio.create_task(self._refresh_presence(), name="orchestrator-presence")
            try:
                return await self._run_inner()
            except OrchestratorError as exc:
                self._error_summary(str(exc))
                raise
            finally:
                for task in (watchdog, refresh):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                stop = RunControl(action="stop", ts=time.time(), reason="run finished")
                await self.bus.publish("control", stop)
                await self._presence("offline", "run finished")
                if self._tasks:
                    await asyncio.wait(list(self._tasks), timeout=PUBLISH_DRAIN)
                # a later run under this id must not read this one's state
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._clear_retained(peers=True), PUBLISH_DRAIN)
                self.metrics.flush()
                self.records.close()

    async def _run_inner(self) -> int:
        cfg, bus, options = self.cfg, self.bus, self.options
        assert bus is not None
        spe = await self._gather_peers()
        lr = make_lr_schedule(cfg, spe)
        plan = make_plan(cfg, lr)
        self.schedules.start(plan)
        store = None if self.store is None else self.store.address
        prefix = "" if self.store is None else self.store.prefix
        await bus.publish("plan", plan_message(cfg, plan, lr, store=store, store_prefix=prefix))
        self.stage = "setup"
        await self._publish_schedule("initial")
        self.records.write_json(
            "manifest.json",
            manifest(
                cfg,
                self.run_id,
                plan,
                spe,
                topologies=self.schedules.topologies,
                peers=self.admission.peers,
            ),
        )
        calibration = None
        step_base = 0
        timeout = options.decision_timeout
        resumed = self.resumed
        if resumed is not None:  # the calibration pass is behind us: its result is kept
            if resumed.checkpoint.steps_per_epoch != spe:
                raise OrchestratorError(
                    f"cannot resume: the peers have {spe} steps per epoch, the checkpoint "
                    f"{resumed.checkpoint.steps_per_epoch}"
                )
            calibration, step_base = resumed.calibration, resumed.checkpoint.step_base
        elif options.calibrate:
            steps = calibration_steps(plan)
            recorder = CalibrationRecorder(options.statistic)
            book = RoundBook("calibrate", plan, recorder=recorder, timeout=timeout)
            await self._run_stage("calibrate", steps, 0, book)
            calibration = book.calibration()
            self.records.write_json("calibration.json", calibration.record())
            step_base = steps
        controller = ConsensusController(control_config(cfg), plan, calibration)
        if resumed is not None:
            controller.load_state_dict(resumed.state)
        book = RoundBook("train", plan, controller=controller, timeout=timeout)
        saver = checkpoint.ControlCheckpoint(
            self.out,
            cfg,
            plan,
            spe,
            step_base=step_base,
            calibration=calibration,
            controller=controller,
            resumed=None if resumed is None else resumed.checkpoint,
        )
        book.on_end = saver.ended
        if options.graph_feedback:
            feedback = GraphFeedback(feedback_config(cfg.hyper), cfg.peers)
            self.graphs = GraphBook(plan, feedback, timeout=timeout)
        await self._run_stage(
            "train", plan.total_steps, step_base, book, plans=self._lagged_plans(controller)
        )
        if self.graphs is not None:
            self._publish_graphs(self.graphs.expire(set(), time.monotonic()))
        self.records.write_json("orchestrator-summary.json", self._summary())
        return 0 if self.admission.tally("train").done else 1

    def _summary(self) -> OrchestratorSummary:
        """``orchestrator-summary.json``'s record as the run stands."""
        book, graphs, tally = self.book, self.graphs, self.admission.tally("train")
        return summary(
            self.run_id,
            peers_done=list(tally.done),
            peers_dropped=list(tally.dropped),
            schedule_versions=self.schedules.version,
            rejected_payloads=self.bus.rejected if self.bus is not None else 0,
            stats_ignored=(book.ignored if book else 0) + (graphs.ignored if graphs else 0),
            stats_refused=self.stats_refused,
            handler_errors=self.handler_errors,
            graph_decisions=len(graphs.feedback.decisions) if graphs else None,
            graph_steps_partial=graphs.partial if graphs else None,
            wall_seconds=time.monotonic() - self.started,
        )

    def _error_summary(self, error: str) -> None:
        """``orchestrator-summary.json`` of a run that ended with ``error``."""
        record = replace(self._summary(), completed=False, error=error, stage=self.stage or None)
        self.records.write_json("orchestrator-summary.json", record)

    def _request_stop(self, sig: signal.Signals) -> None:
        log.info("orchestrator.signal", signal=sig.name)
        self.stop_requested = True
        self.changed.set()


def run_orchestrator(
    cfg: RunConfig,
    out: Path,
    *,
    broker: str | None,
    run_id: str | None,
    resume_step: int | None = None,
) -> int:
    from concord.runtime.lifecycle import die_with_parent

    die_with_parent()
    # secure by default: a broker beyond loopback without protection is refused before
    # anything is written, unless network.insecure (then warned once, in log.jsonl too)
    exposure = exposure_of(cfg, listen=None, broker=broker or cfg.orchestrator.broker)
    check_exposure(exposure, insecure=cfg.network.insecure, role="orchestrator", warn=False)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
    rid = run_id or cfg.name or "concord"
    with open_log(out / "log.jsonl", run=rid, role="orchestrator"):
        check_exposure(exposure, insecure=cfg.network.insecure, role="orchestrator")
        try:
            orchestrator = Orchestrator(
                cfg, out, broker=broker, run_id=rid, resume_step=resume_step
            )
            return asyncio.run(orchestrator.run())
        except OrchestratorError as exc:
            log.error("orchestrator.failed", error=str(exc))
            raise
