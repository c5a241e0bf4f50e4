"""The orchestrator process: ``concord orchestrator --config RUN.toml [--broker URL] [--out DIR]``.

One asyncio loop, no torch. With no broker given it embeds one (amqtt on 127.0.0.1, a free port).
The run, as seen from here:

1. clear the run's stale retained ``control``/``schedule``; wait for every peer's retained
   ``status`` "ready" (its gRPC address, steps per epoch and model fingerprint — all peers must
   agree) within ``network.startup_timeout``;
2. publish the phase plan and schedule v1 (retained: topology per phase, live peers and their
   addresses) and the manifest;
3. constant targets: a ``calibrate`` stage — peers run the controlled phases uncontrolled, the
   max Θ per phase becomes the calibration (``calibration.json``);
4. the ``train`` stage: statistics in, decisions out (`concord.orchestrator.rounds.RoundBook`),
barrier
   or lagged; per-step metrics aggregated into ``metrics.jsonl``, every decided round into
   ``control.jsonl``. Adaptive graphs (`concord.core.graphs.adagraph`): the schedule's per-phase
   topologies are ada-schedule's graphs, or ada-feedback's ``exponential:K``; in an ada-feedback run
   the statistics of uncontrolled steps go to `concord.orchestrator.graphs.GraphBook` instead, and
   every decision point publishes a schedule version effective at its step + lag (``graphs.jsonl``);
5. liveness: a peer whose Last-Will ("offline") arrives, that reports "failed", or that is
   silent for ``orchestrator.liveness_timeout`` is dropped: pending rounds stop waiting for it
   and a repaired schedule (version + 1, the live peers, effective a couple of steps ahead) is
   published;
6. when every live peer is done: ``control`` "stop", ``summary.json``, exit 0 (1 if no peer
   finished).

SIGTERM/SIGINT publish "stop" and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

import structlog

from concord.core.config import RunConfig, to_toml
from concord.core.control.controller import CalibrationRecorder, ConsensusController
from concord.core.control.plan import PhasePlan
from concord.core.control.runplan import (
    calibration_steps,
    control_config,
    make_lr_schedule,
    make_plan,
)
from concord.core.graphs.adagraph import (
    FeedbackDecision,
    GraphFeedback,
    feedback_config,
    initial_topologies,
)
from concord.core.graphs.topology import describe, exponential_name, max_exponential_k
from concord.errors import OrchestratorError as OrchestratorError
from concord.orchestrator.broker import EmbeddedBroker
from concord.orchestrator.graphs import GraphBook
from concord.orchestrator.metrics import MetricsTable
from concord.orchestrator.rounds import RoundBook
from concord.protos.control_plane import (
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
from concord.protos.mqtt import Bus

log = structlog.get_logger("concord.orchestrator.app")


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
    offline_at: float | None = None  # its Last-Will arrived (confirmed by silence, see _liveness)


def configure_logging(path: Path, run: str) -> TextIO:
    """JSON lines, one per event, bound with run and role (the orchestrator's log.jsonl)."""
    f: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by the caller

    def identity(_: Any, __: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
        event.setdefault("run", run)
        event.setdefault("role", "orchestrator")
        return event

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            identity,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=f),
        cache_logger_on_first_use=False,
    )
    return f


class Orchestrator:
    def __init__(self, cfg: RunConfig, out: Path, *, broker: str | None, run_id: str) -> None:
        self.cfg = cfg
        self.out = out
        self.broker_url = broker or cfg.orchestrator.broker
        self.run_id = run_id
        self.topics = Topics(run_id)
        self.n = cfg.peers
        self.peers = {i: PeerInfo() for i in range(self.n)}
        self.book: RoundBook | None = None
        self.graphs: GraphBook | None = None  # ada-feedback: per-step statistics → graphs
        self.topologies: dict[int, str] = {}  # phase index → topology published (adaptive)
        self.decided_at: int | None = None  # ada-feedback: the decision they reflect
        self.stage = ""
        self.plan: PhasePlan | None = None
        self.schedule_version = 0
        self.changed = asyncio.Event()  # any peer state change (waiters re-check)
        self.stop_requested = False
        self.started = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()
        out.mkdir(parents=True, exist_ok=True)
        self._metrics_file: IO[str] = open(out / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self._control_file: IO[str] = open(out / "control.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self._schedules_file: IO[str] = open(out / "schedules.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self._graphs_file: IO[str] | None = None  # ada-feedback: every decision point
        if cfg.algorithm == "ada-feedback":
            self._graphs_file = open(out / "graphs.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self.metrics = MetricsTable(self._write_metric)
        self.bus: Bus | None = None

    # -- files ---------------------------------------------------------------------------------

    def _write_metric(self, record: dict[str, Any]) -> None:
        self._metrics_file.write(json.dumps(record) + "\n")

    def _write_json(self, name: str, data: Any) -> None:
        tmp = self.out / f"{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(self.out / name)

    # -- peers ---------------------------------------------------------------------------------

    def live(self) -> set[int]:
        return {i for i, p in self.peers.items() if not p.gone}

    def expected(self) -> set[int]:
        """Peers whose statistics a round of the current stage waits for."""
        return {i for i in self.live() if self.peers[i].stage_done != self.stage}

    async def on_message(self, kind: str, peer: int | None, message: Message) -> None:
        now = time.monotonic()
        if peer is not None and not 0 <= peer < self.n:
            log.warning("control.rejected", topic=kind, peer=peer, problem="unknown peer id")
            return
        if peer is not None and not (isinstance(message, Status) and message.state == "offline"):
            self.peers[peer].offline_at = None  # alive after all
        if isinstance(message, Status) and peer is not None:
            self._on_status(peer, message, now)
        elif isinstance(message, Heartbeat) and peer is not None:
            info = self.peers[peer]
            info.last_seen, info.step = now, message.step
        elif isinstance(message, Stats) and peer is not None:
            self.peers[peer].last_seen = now
            self._on_stats(kind, peer, [message], now)
        elif isinstance(message, Metrics) and peer is not None:
            self.peers[peer].last_seen = now
            if message.stats:  # a lagged step's statistics: decide first, then bookkeeping
                self._on_stats(kind, peer, message.stats, now)
            self.metrics.add(peer, message.step, message.event, message.values)
            self.metrics.emit(self.expected() if self.stage == "train" else self.live())

    def _on_stats(self, kind: str, peer: int, stats: list[Stats], now: float) -> None:
        if any(s.peer != peer for s in stats):
            log.warning("control.rejected", topic=kind, peer=peer, problem="peer mismatch")
            return
        for s in stats:
            if self.graphs is not None and self._graph_statistic(s):
                self._publish_graphs(self.graphs.add(s, self.expected(), now))
            elif self.book is not None:
                self._publish_all(self.book.add(s, self.expected(), now))

    def _on_status(self, peer: int, status: Status, now: float) -> None:
        info = self.peers[peer]
        if status.peer != peer:
            log.warning("control.rejected", topic="status", peer=peer, problem="peer mismatch")
            return
        if status.state == "offline":  # a Last-Will: confirmed by silence in _liveness
            info.state, info.offline_at = status.state, now
            return
        info.state, info.last_seen, info.step = status.state, now, status.step
        if status.state in ("ready", "training"):
            if status.address:
                info.address = status.address
            if status.steps_per_epoch:
                info.steps_per_epoch = status.steps_per_epoch
            if status.fingerprint:
                info.fingerprint = status.fingerprint
        elif status.state == "done":
            info.stage_done = status.stage
        elif status.state == "failed" and self.stage and not info.gone:
            self._drop(
                peer, f"status {status.state}" + (f": {status.reason}" if status.reason else "")
            )
        self.changed.set()

    def _drop(self, peer: int, reason: str) -> None:
        info = self.peers[peer]
        if info.gone:
            return
        info.gone = True
        log.warning("peer.dropped", peer=peer, reason=reason, live=sorted(self.live()))
        if self.book is not None:
            self._publish_all(self.book.expire(self.expected(), time.monotonic()))
        if self.stage and self.live() and info.stage_done != self.stage:
            self._spawn(self._publish_schedule(reason=f"peer {peer} left ({reason})"))
        self.changed.set()

    async def _liveness(self) -> None:
        """Owned task: drop silent peers, decide stale rounds (10 Hz). While we are cut off from
        the broker nobody is silent by their own fault; after a reconnect peers get the longest
        reconnect backoff (5 s) on top of the liveness timeout to come back.

        A Last-Will ("offline") drops a peer once two heartbeats pass without a word from it:
        a broker that shuts down publishes every client's will, though the peers are fine."""
        timeout = self.cfg.orchestrator.liveness_timeout
        confirm = 2 * self.cfg.orchestrator.heartbeat + 0.2
        grace_until = 0.0
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            assert self.bus is not None
            if not self.bus.connected.is_set():
                grace_until = now + self.bus.backoff[1]
                for info in self.peers.values():
                    info.offline_at = None
                continue
            for i, info in self.peers.items():
                if info.offline_at is not None and now - info.offline_at > confirm and self.stage:
                    info.offline_at = None
                    self._drop(i, "Last-Will (offline) and silent since")
            if self.stage and now >= grace_until:
                for i, info in self.peers.items():
                    busy = info.stage_done != self.stage
                    silent = now - max(info.last_seen, grace_until)
                    if not info.gone and busy and silent > timeout:
                        self._drop(i, f"silent for {silent:.1f} s")
            if self.book is not None and self.book.pending:
                self._publish_all(self.book.expire(self.expected(), now))
            if self.graphs is not None and self.graphs.pending:
                self._publish_graphs(self.graphs.expire(self.expected(), now))

    # -- publishing ----------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro, name="orchestrator-publish")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _publish_all(self, decisions: list[Decision]) -> None:
        for d in decisions:
            assert self.bus is not None
            self._spawn(self.bus.publish("decision", d))
        if self.book is not None:
            for rec in self.book.records:
                self._control_file.write(json.dumps(rec.to_json()) + "\n")
            self.book.records.clear()

    def _schedule(self, reason: str, effective_step: int | None = None) -> Schedule:
        live = sorted(self.live())
        ahead = max((self.peers[i].step for i in live), default=0) + 2
        assert self.plan is not None
        self.schedule_version += 1
        if effective_step is None:
            effective_step = ahead if self.schedule_version > 1 else 0
        phases = [
            {"index": p.index, "topology": self.topologies.get(p.index, p.topology)}
            for p in self.plan.phases
        ]
        return Schedule(
            version=self.schedule_version,
            peers=live,
            topology=self.cfg.topology,
            weights=self.cfg.weights,
            kappa=self.cfg.kappa,
            seed=self.cfg.seed,
            phases=phases,
            reason=reason,
            addresses=[self.peers[i].address or "" for i in live],
            effective_step=effective_step,
            decided_at=self.decided_at,
        )

    async def _publish_schedule(self, reason: str, effective_step: int | None = None) -> None:
        schedule = self._schedule(reason, effective_step)
        assert self.bus is not None
        await self.bus.publish("schedule", schedule)
        log.info(
            "schedule.published", version=schedule.version, peers=schedule.peers, reason=reason
        )
        row = {"version": schedule.version, "peers": schedule.peers, "reason": reason}
        row["effective_step"] = schedule.effective_step
        row["topologies"] = [p["topology"] for p in schedule.phases]
        row["decided_at"] = schedule.decided_at
        self._schedules_file.write(json.dumps(row) + "\n")
        self._schedules_file.flush()

    def _graph_statistic(self, stats: Stats) -> bool:
        """An ada-feedback statistic: a train-stage step that consensus control does not run
        (those go to the graph book, never to the round book)."""
        assert self.plan is not None
        if stats.stage != "train" or not 0 <= stats.step < self.plan.total_steps:
            return False
        return not self.plan.phase_at(stats.step).controlled

    def _publish_graphs(self, decisions: list[FeedbackDecision]) -> None:
        """Every decision point becomes a schedule version effective at its step + lag (the
        graph may be unchanged: peers wait for the decision, not for a change)."""
        assert self.plan is not None
        for d in decisions:
            self.topologies = {p.index: exponential_name(d.k_to) for p in self.plan.phases}
            self.decided_at = d.step
            if self._graphs_file is not None:
                self._graphs_file.write(json.dumps(d.to_json()) + "\n")
                self._graphs_file.flush()
            reason = f"ada-feedback step {d.step}: K {d.k_from} -> {d.k_to} ({d.reason})"
            self._spawn(self._publish_schedule(reason, effective_step=d.effective))

    # -- the run -------------------------------------------------------------------------------

    async def _wait(self, predicate: Any, timeout: float | None, what: str) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        while not predicate():
            if self.stop_requested:
                raise OrchestratorError(f"stopped while waiting for {what}")
            self.changed.clear()
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise OrchestratorError(f"timed out after {timeout} s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0 if left is None else min(left, 1.0))

    async def _gather_peers(self) -> int:
        def ready() -> bool:
            return all(p.address and p.steps_per_epoch for p in self.peers.values())

        missing = lambda: sorted(i for i, p in self.peers.items() if not p.address)  # noqa: E731
        try:
            await self._wait(ready, self.cfg.network.startup_timeout, "peers to be ready")
        except OrchestratorError as exc:
            raise OrchestratorError(f"{exc}; missing peers {missing()}") from None
        spe = {p.steps_per_epoch for p in self.peers.values()}
        fps = {p.fingerprint for p in self.peers.values()}
        if len(spe) != 1 or len(fps) != 1:
            raise OrchestratorError(
                f"peers disagree on steps per epoch {sorted(spe)} or model fingerprint "
                f"({len(fps)} different): are they running the same config?"
            )
        return spe.pop()

    async def _run_stage(self, stage: str, steps: int, step_base: int, book: RoundBook) -> None:
        self.stage, self.book = stage, book
        for info in self.peers.values():
            info.last_seen = time.monotonic()
        assert self.bus is not None
        await self.bus.publish(
            "control",
            RunControl(
                action="start", stage=stage, steps=steps, step_base=step_base, ts=time.time()
            ),
        )
        log.info("stage.start", stage=stage, steps=steps, live=sorted(self.live()))
        await self._wait(lambda: not self.expected(), None, f"peers to finish stage {stage!r}")
        self._publish_all(book.expire(set(), time.monotonic()))
        log.info("stage.done", stage=stage, ignored=book.ignored)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        async with contextlib.AsyncExitStack() as stack:
            url = self.broker_url
            if url is None:
                url = (await stack.enter_async_context(EmbeddedBroker())).url
            self.bus = await stack.enter_async_context(
                Bus(
                    url,
                    f"orchestrator-{self.run_id}",
                    self.topics,
                    subscribe=["status", "heartbeat", "stats", "metrics"],
                    handler=self.on_message,
                    will=(
                        "orchestrator",
                        None,
                        Presence(state="offline", reason="connection lost"),
                    ),
                )
            )
            self._write_json(
                "orchestrator.json", {"broker": url, "run": self.run_id, "pid": os.getpid()}
            )
            if not await self.bus.wait_connected(self.cfg.network.startup_timeout):
                raise OrchestratorError(f"cannot reach the MQTT broker at {url}")
            for kind in ("control", "schedule", "plan"):
                await self.bus.clear(kind)
            # retained, and re-published by the Bus after every reconnect
            await self.bus.publish("orchestrator", Presence(state="online", ts=time.time()))
            watchdog = asyncio.create_task(self._liveness(), name="orchestrator-liveness")
            try:
                return await self._run_inner()
            finally:
                watchdog.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watchdog
                await self.bus.publish(
                    "control", RunControl(action="stop", ts=time.time(), reason="run finished")
                )
                await self.bus.publish(
                    "orchestrator", Presence(state="offline", ts=time.time(), reason="run finished")
                )
                if self._tasks:
                    await asyncio.wait(list(self._tasks), timeout=5)
                self.metrics.flush()
                self._metrics_file.close()
                self._control_file.close()
                self._schedules_file.close()
                if self._graphs_file is not None:
                    self._graphs_file.close()

    async def _run_inner(self) -> int:
        cfg = self.cfg
        spe = await self._gather_peers()
        schedule = make_lr_schedule(cfg, spe)
        self.plan = plan = make_plan(cfg, schedule)
        # adaptive graphs: the schedule carries each phase's topology (peers take it from there)
        self.topologies = initial_topologies(cfg.algorithm, cfg.hyper, cfg.peers, len(plan.phases))
        assert self.bus is not None
        c = cfg.control
        await self.bus.publish(
            "plan",
            Plan(
                total_steps=plan.total_steps,
                phases=plan.to_dict(),
                lr=schedule.to_dict(),
                control={
                    "mode": c.mode,
                    "factor": c.factor,
                    "max_rounds": c.max_rounds,
                    "lagged": c.lagged,
                    "lag": c.lag,
                    "phases": cfg.controlled_phases(),
                },
            ),
        )
        self.stage = "setup"
        await self._publish_schedule("initial")
        self._write_json("manifest.json", self._manifest(plan, spe))
        calibration = None
        step_base = 0
        timeout = cfg.orchestrator.decision_timeout
        if c.mode == "constant" and cfg.controlled_phases():
            steps = calibration_steps(plan)
            recorder = CalibrationRecorder(c.statistic)
            book = RoundBook("calibrate", plan, recorder=recorder, timeout=timeout)
            await self._run_stage("calibrate", steps, 0, book)
            calibration = book.calibration()
            self._write_json("calibration.json", calibration.to_json())
            step_base = steps
        controller = ConsensusController(control_config(cfg), plan, calibration)
        book = RoundBook("train", plan, controller=controller, timeout=timeout)
        if cfg.algorithm == "ada-feedback":
            feedback = GraphFeedback(feedback_config(cfg.hyper), cfg.peers)
            self.graphs = GraphBook(plan, feedback, timeout=timeout)
        await self._run_stage("train", plan.total_steps, step_base, book)
        if self.graphs is not None:
            self._publish_graphs(self.graphs.expire(set(), time.monotonic()))
        done = [i for i, p in self.peers.items() if p.stage_done == "train"]
        self._write_json(
            "orchestrator-summary.json",
            {
                "run": self.run_id,
                "peers_done": done,
                "peers_dropped": sorted(i for i, p in self.peers.items() if p.gone),
                "schedule_versions": self.schedule_version,
                "rejected_payloads": self.bus.rejected,
                "stats_ignored": book.ignored + (self.graphs.ignored if self.graphs else 0),
                "graph_decisions": len(self.graphs.feedback.decisions) if self.graphs else None,
                "graph_steps_partial": self.graphs.partial if self.graphs else None,
                "wall_seconds": time.monotonic() - self.started,
                "cpu_seconds": time.process_time(),  # incl. an embedded broker's routing
            },
        )
        return 0 if done else 1

    def _manifest(self, plan: PhasePlan, steps_per_epoch: int) -> dict[str, Any]:
        cfg = self.cfg
        names = {
            self.topologies.get(p.index) or p.topology or cfg.topology
            for p in plan.phases
            if p.mode == "gossip"
        }
        if cfg.algorithm == "ada-feedback":  # every graph K may move to
            names |= {exponential_name(k) for k in range(1, max_exponential_k(cfg.peers) + 1)}
        topologies = {
            name: describe(name, cfg.peers, weights=cfg.weights, kappa=cfg.kappa, seed=cfg.seed)
            for name in sorted(names)
        }
        return {
            "run": self.run_id,
            "engine": "processes",
            "created": time.time(),
            "peers": cfg.peers,
            "steps": plan.total_steps,
            "steps_per_epoch": steps_per_epoch,
            "plan": plan.to_dict(),
            "topologies": topologies,
            "addresses": {i: p.address for i, p in self.peers.items()},
            "fingerprint": self.peers[0].fingerprint,
            "config": cfg.to_dict(),
        }

    def _request_stop(self, sig: signal.Signals) -> None:
        log.info("orchestrator.signal", signal=sig.name)
        self.stop_requested = True
        self.changed.set()


def dump_tasks() -> None:
    """``kill -USR1 <pid>``: every asyncio task of this process and where it waits, on stderr
    (for a process that looks stuck)."""
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} asyncio tasks (SIGUSR1) ---", file=sys.stderr)
    for task in tasks:
        task.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


def run_orchestrator(cfg: RunConfig, out: Path, *, broker: str | None, run_id: str | None) -> int:
    from concord.runtime.lifecycle import die_with_parent

    die_with_parent()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.toml").write_text(to_toml(cfg), encoding="utf-8")
    rid = run_id or cfg.name or "concord"
    log_file = configure_logging(out / "log.jsonl", rid)
    try:
        return asyncio.run(Orchestrator(cfg, out, broker=broker, run_id=rid).run())
    except OrchestratorError as exc:
        log.error("orchestrator.failed", error=str(exc))
        raise
    finally:
        log_file.close()
