"""Who tells a peer what to run: the config alone (static peers), or the orchestrator.

The peer driver (`concord.peer.app.PeerProcess.main`) is one loop over *stages*; a coordination
decides which stages run, with which neighbours and graphs, and what happens around each step.

`StaticCoordination` (no broker): the topology, the phase plan and every peer's address come from
the config (``network.addresses``); one stage, ``train``.

`OrchestratedCoordination` (``concord peer … --broker mqtt://HOST:PORT``):

1. announce, as a retained status "ready", the address the others reach us at, the steps per
   epoch of our partition and the model fingerprint; take the neighbours' addresses from the
   orchestrator's schedule;
2. run each stage the orchestrator starts: ``calibrate`` (the controlled phases, uncontrolled,
   reporting θ_i) and ``train`` (rounds decided by the orchestrator, or with ``control.mode =
   "fixed"`` by the config alone, `concord.peer.control`);
   data-plane step numbers of a stage start at its ``step_base`` so stages never share a frame key;
3. apply a repaired schedule (a peer left) at its ``effective_step``; frames for a step are checked
   against the schedule in force at that step (`Membership`). Each phase's topology is taken from
   the published schedule (adaptive graphs, `concord.core.graphs.adagraph`), not from this peer's
   config. In an ada-feedback run the peer publishes θ_i and ‖g_i‖ after every step
   (`concord.peer.control.GraphStats`) and, at a decision's effective step, waits (at most
   ``orchestrator.decision_timeout``) until it holds that decision's schedule, so every peer
   switches graphs at the same step as the vectorized engine; on a timeout it keeps its graph and
   records a fallback;
4. report "done", wait for the run's "stop" (not when the orchestrator is gone).

Every wait has an end (`concord.peer.control.ControlClient.give_up`): reaching the broker and
receiving the first schedule at most ``network.startup_timeout``; from entering the coordination
to leaving it, a watchdog gives up when the orchestrator has been absent for
``orchestrator.absent_timeout`` (before start, between stages, mid-stage) or the broker lost for
``orchestrator.broker_lost_timeout``; waiting for the run's "stop" after the last stage at most
60 s. Giving up sets ``error`` (why) and ``exit_code`` 1 and the peer's stop event: a stage in
progress ends at the next step boundary, the peer writes its error record and exits 1
(`concord.peer.app`).

A received schedule is applied only if `concord.peer.schedules.ScheduleCheck` accepts it;
`concord.peer.schedules.Membership` says which is in force at a step.

Per-step metrics go, as `Metrics` messages, to the orchestrator too.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Protocol, Self

import structlog

from concord.core.config import RunConfig
from concord.core.graphs.adagraph import feedback_config, initial_topologies
from concord.core.loop import ControlHook, FixedRounds, StepRunner
from concord.core.records import JSON, EvalRecord, PeerSummary, StepRecord
from concord.core.task import ClassificationTask
from concord.peer.comm import RoundComm
from concord.peer.control import ControlClient, GraphStats, OrchestratedControl
from concord.peer.schedules import Membership, ScheduleCheck, phase_topologies
from concord.peer.serde import TENSOR_ALLREDUCE
from concord.peer.transport import Transport
from concord.protos.control_plane import Schedule
from concord.protos.mqtt import BrokerAuth
from concord.protos.signing import signing_for
from concord.runtime.driver import RunHooks

__all__ = [
    "Coordination",
    "FetchPeers",
    "OrchestratedCoordination",
    "Stage",
    "StaticCoordination",
    "graph_neighbours",
]

STOP_WAIT = 60.0  # seconds a finished peer keeps serving until the run's "stop"
# seconds an "offline" orchestrator may take to come back after this peer (re)connected: its
# reconnect backoff is at most 5 s (`concord.protos.mqtt.Bus`)
_RECONNECT_SETTLE = 6.0


@dataclass(frozen=True)
class Stage:
    """One pass of training the peer runs: ``train`` (the run) or ``calibrate`` (the uncontrolled
    pass of constant targets)."""

    name: str
    steps: int | None  # None: the whole plan
    step_base: int  # data-plane step numbers of this stage start here

    @property
    def final(self) -> bool:
        return self.name == "train"


class Coordination(Protocol):
    """What the peer driver (`concord.peer.app`) asks of whoever tells it what to run — the only
    view it has of `StaticCoordination` and `OrchestratedCoordination`. Entered (``async with``)
    for the peer's whole run; ``error`` and ``exit_code`` say whether it gave up (1, with why)."""

    exit_code: int
    error: str | None
    addresses: list[str]  # every peer's address known at the start ("" for not known yet)

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def join(self, task: ClassificationTask, transport: Transport, advertise: str) -> bool:
        """Join the run as ``advertise``; False: this peer cannot (it gave up, ``error``)."""

    async def next_stage(self) -> Stage | None:
        """The next stage to run; None: no more (a stop came, or the last one is done)."""

    async def torch_store(self, timeout: float) -> str | None:
        """The torch.distributed store to rendezvous at (None: env:// or tcp://)."""

    def round_hooks(
        self, stage: Stage, comm: RoundComm, loop: asyncio.AbstractEventLoop
    ) -> tuple[ControlHook | None, GraphStats | None]:
        """Who decides the rounds of ``stage``'s steps, and who publishes graph statistics."""

    def begin(self, stage: Stage, runner: StepRunner) -> None:
        """``stage`` starts with ``runner``: put the graphs in force."""

    async def training(self, stage: Stage, transport: Transport) -> None:
        """Training is about to begin: who may Fetch, and (orchestrated) the status."""

    def step_hooks(self, stage: Stage) -> list[RunHooks]:
        """Hooks around each step of ``stage``."""

    def rejoin_at(self, stage: Stage) -> int | None:
        """The step of ``stage`` this peer joins at, re-admitted into it (None: from the start)."""

    def neighbours(self) -> list[int]:
        """The peers a rejoining peer may fetch parameters from."""

    def is_neighbour(self, sender: int, step: int, round: int, tensor_id: int) -> bool:
        """Whether a frame's ``sender`` is this peer's neighbour at wire ``step``, ``round``."""

    async def stage_done(self, stage: Stage, summary: PeerSummary) -> PeerSummary:
        """``stage`` is done: its ``summary`` with what the coordination adds to it."""

    async def leave(self, summary: PeerSummary) -> None:
        """Training is over: leave the run (orchestrated: wait for its "stop")."""

    def counters(self) -> dict[str, JSON]:
        """Counters of the coordination for the summary (its ``extra``)."""


# ---------------------------------------------------------------------------------------------
# Who may Fetch this peer's parameters: its neighbours in the run's schedule


def graph_neighbours(
    runner: StepRunner,
    peer_id: int,
    members: Sequence[int] | None = None,
    topologies: Mapping[int, str | None] | None = None,
    extra: Sequence[str] = (),
) -> frozenset[int] | None:
    """The peers adjacent to ``peer_id`` (either direction) in any round of any gossip phase of
    the plan, over ``members`` (None: the schedules' current members) with per-phase
    ``topologies`` overrides (and the ``extra`` topologies, e.g. the densest an adaptive graph
    may pick); None when a phase's graph is random (any member may become a neighbour)."""
    out: set[int] = set()
    for phase in runner.plan.phases:
        if phase.mode != "gossip":
            continue
        names: list[str | None] = [(topologies or {}).get(phase.index), *extra]
        for name in names:
            schedule = runner.schedules.get(phase, members, name)
            if schedule.period is None:
                return None
            for k in range(schedule.period):
                W = schedule.matrix(k)
                row, col = W[peer_id], W[:, peer_id]
                out.update(int(j) for j in range(len(row)) if j != peer_id and row[j] > 0)
                out.update(int(j) for j in range(len(col)) if j != peer_id and col[j] > 0)
    return frozenset(out)


class FetchPeers:
    """Which peers may Fetch this peer's parameters (`concord.peer.transport.Transport.may_fetch`):
    those that are, were or will be its neighbours — the run's graph over every phase and round
    of each schedule this peer has held or holds pending (a re-admitted peer is in the schedule
    that adds it back, which its neighbours hold before it fetches), remembered once seen.
    ``graphs()`` lists the (members, topologies) to look at now."""

    def __init__(
        self,
        peer_id: int,
        graphs: Callable[[], list[tuple[Sequence[int] | None, Mapping[int, str | None] | None]]],
        extra: Sequence[str] = (),
    ) -> None:
        self.peer_id = peer_id
        self.graphs = graphs
        self.extra = tuple(extra)
        self.runner: StepRunner | None = None
        self.seen: set[int] = set()  # neighbours at some time (kept: "were")
        self.anyone = False  # a random graph: any peer of the run may be a neighbour
        self._looked: set[tuple[object, ...]] = set()

    def __call__(self, j: int) -> bool:
        runner = self.runner
        if runner is None:
            return True  # not training: the Fetch is refused as such ("not training")
        for members, topologies in self.graphs():
            key = (
                None if members is None else tuple(sorted(members)),
                None if topologies is None else tuple(sorted(topologies.items())),
                tuple(sorted(runner.schedules.members)) if members is None else (),
                tuple(sorted(runner.schedules.topologies.items())) if topologies is None else (),
            )
            if key in self._looked:
                continue
            self._looked.add(key)
            got = graph_neighbours(runner, self.peer_id, members, topologies, self.extra)
            if got is None:
                self.anyone = True
            else:
                self.seen |= got
        return j != self.peer_id and (self.anyone or j in self.seen)


# ---------------------------------------------------------------------------------------------
# Static peers


class StaticCoordination:
    """No orchestrator: one ``train`` stage over the config's topology and addresses."""

    exit_code = 0
    error: str | None = None  # static peers never give up waiting (they wait for nobody)

    def __init__(self, cfg: RunConfig, peer_id: int, addresses: list[str]) -> None:
        self.cfg = cfg
        self.peer_id = peer_id
        self.addresses = addresses
        self.runner: StepRunner | None = None
        self._started = False
        # the config's graph: a restarted static peer fetches from exactly these neighbours
        self.may_fetch = FetchPeers(peer_id, lambda: [(None, None)])

    async def __aenter__(self) -> StaticCoordination:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    async def join(self, task: ClassificationTask, transport: Transport, advertise: str) -> bool:
        return True

    async def next_stage(self) -> Stage | None:
        if self._started:
            return None
        self._started = True
        return Stage("train", None, 0)

    def round_hooks(
        self, stage: Stage, comm: RoundComm, loop: asyncio.AbstractEventLoop
    ) -> tuple[ControlHook | None, GraphStats | None]:
        # control.mode = "fixed" needs nobody's decision: the config fixes the rounds
        fixed = self.cfg.control.mode == "fixed" and self.cfg.controlled_phases()
        return (FixedRounds(self.cfg.control.rounds) if fixed else None), None

    def begin(self, stage: Stage, runner: StepRunner) -> None:
        # ada-schedule's per-phase graphs: from the config here (no orchestrator publishes them)
        phases = len(runner.plan.phases)
        cfg = self.cfg
        runner.schedules.set_topologies(
            initial_topologies(cfg.algorithm, cfg.hyper, cfg.peers, phases)
        )
        self.runner = self.may_fetch.runner = runner

    def step_hooks(self, stage: Stage) -> list[RunHooks]:
        return []

    def rejoin_at(self, stage: Stage) -> int | None:
        return None  # a restarted static peer rejoins from its checkpoint (`concord.peer.app`)

    async def torch_store(self, timeout: float) -> str | None:
        """No orchestrator, no store: static peers rendezvous by env:// or tcp://."""
        return None

    def neighbours(self) -> list[int]:
        return [j for j in range(self.cfg.peers) if j != self.peer_id]

    async def training(self, stage: Stage, transport: Transport) -> None:
        transport.may_fetch = self.may_fetch

    async def stage_done(self, stage: Stage, summary: PeerSummary) -> PeerSummary:
        return summary

    async def leave(self, summary: PeerSummary) -> None:
        return None

    def counters(self) -> dict[str, JSON]:
        return {}

    def is_neighbour(self, sender: int, step: int, round: int, tensor_id: int) -> bool:
        if tensor_id == TENSOR_ALLREDUCE:
            return sender != self.peer_id
        runner = self.runner
        if runner is None:
            return False
        phase = runner.plan.phase_at(min(step, runner.total_steps - 1))
        if phase.mode != "gossip":
            return False
        W = runner.schedules.get(phase).matrix(round)
        return bool(W[self.peer_id, sender] > 0 or W[sender, self.peer_id] > 0)


# ---------------------------------------------------------------------------------------------
# Peers that follow the orchestrator


class OrchestratorHooks(RunHooks):
    """Around each step of an orchestrated stage: schedules in force before it, how its rounds
    were decided and its metrics (to the orchestrator) after it. ``addresses`` is told every
    newer schedule as soon as it is seen, before the schedules are applied (a re-admitted peer's
    new address: connect early; its joining step: answer its Fetch there)."""

    def __init__(
        self,
        control: OrchestratedControl,
        membership: Membership,
        log: Any,
        train: bool,
        addresses: Callable[[Schedule], None] | None = None,
    ) -> None:
        self.control = control
        self.membership = membership
        self.log = log
        self.train = train
        self.graph_fallback = False  # this step ran on its old graph (decision not received)
        self.addresses = addresses
        self.addressed = 0  # the newest schedule version whose addresses were passed on

    def before(self, step: int) -> None:
        self.graph_fallback = False
        pending = self.membership._pending()
        if pending is not None and pending.version > self.addressed and self.addresses:
            self.addressed = pending.version
            self.addresses(pending)
        decision = self.membership.awaited(step)
        if decision is not None and not self.control.wait_for_schedule(
            lambda: self.membership.holds(decision)
        ):
            self.graph_fallback = True  # keep the current graph (concord.peer.control docstring)
            self.log.warning("graph.fallback", step=step, decision=decision)
        s = self.membership.before_step(step)
        if s is not None:
            self.log.info(
                "schedule.applied",
                version=s.version,
                peers=s.peers,
                step=step,
                topologies=[ph["topology"] for ph in s.phases],
            )

    def after(self, step: int, record: StepRecord) -> StepRecord:
        """The record with how its rounds were decided (``extra``: ``stage``, ``control``,
        ``control_wait_ms``, ``graph_fallback``), published to the orchestrator (train stage)."""
        extra: dict[str, JSON] = {
            "stage": self.control.stage,
            "control": self.control.how or None,
            "control_wait_ms": 1000.0 * self.control.wait_s,
        }
        if self.graph_fallback:
            extra["graph_fallback"] = True
        record = replace(record, extra={**record.extra, **extra})
        self.control.how, self.control.wait_s = "", 0.0
        if self.train:
            self.control.publish_metrics(record)
        return record

    def evaluated(self, step: int, record: EvalRecord) -> None:
        self.control.publish_metrics(record)


class OrchestratedCoordination:
    """The stages, schedules and round decisions of the orchestrator, over MQTT."""

    def __init__(
        self,
        cfg: RunConfig,
        peer_id: int,
        *,
        broker: str,
        run_id: str,
        stop: threading.Event,
        step: Callable[[], int],
    ) -> None:
        self.cfg = cfg
        self.peer_id = peer_id
        self.stop = stop
        self.log = structlog.get_logger(__name__)
        self.broker = broker
        self.addresses = [""] * cfg.peers
        feedback = feedback_config(cfg.hyper) if cfg.spec.adaptive_graph == "feedback" else None
        self.membership = Membership(peer_id, feedback, cfg.peers)
        # ada-feedback may pick any exponential:K up to the densest: judged against that too
        self.may_fetch = FetchPeers(
            peer_id,
            self._fetch_graphs,
            extra=(self.membership.densest,) if feedback is not None else (),
        )
        self.check = ScheduleCheck(cfg, peer_id)
        self.client = ControlClient(
            broker,
            run_id,
            peer_id,
            heartbeat=cfg.orchestrator.heartbeat,
            step=step,
            schedule_check=self.check,
            auth=BrokerAuth.from_config(cfg.orchestrator, f"peer-{peer_id}"),
            signing=signing_for(cfg, f"peer-{peer_id}", run_id),
        )
        self.membership.client = self.client
        self.exit_code = 0
        self.error: str | None = None  # why this peer gave up (None: it did not)
        self._watchdog: asyncio.Task[None] | None = None
        self._handled: list[float] = []  # ts of the run controls already acted on
        self._advertise = ""
        self._control: OrchestratedControl | None = None
        self._transport: Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # the first schedule this peer took is a later version: it (re)joins a run in progress
        # at that schedule's effective step (`rejoin_at`)
        self.joined_version = 0

    def is_neighbour(self, sender: int, wire_step: int, round: int, tensor_id: int) -> bool:
        return self.membership.is_neighbour(sender, wire_step, round, tensor_id)

    async def __aenter__(self) -> OrchestratedCoordination:
        await self.client.__aenter__()
        self._watchdog = asyncio.create_task(self._watch(), name=f"waits-{self.peer_id}")
        return self

    async def _watch(self) -> None:
        o = self.cfg.orchestrator
        why = await self.client.watch(
            absent_timeout=o.absent_timeout, broker_lost_timeout=o.broker_lost_timeout
        )
        self.give_up(why)

    def give_up(self, why: str) -> None:
        """Stop waiting and end the run of this peer with an error (module docstring)."""
        if self.error is None:
            self.error, self.exit_code = why, 1
            self.log.error("peer.gave_up", error=why)
        self.stop.set()
        self.client.changed.set()

    async def _stop_watching(self) -> None:
        task, self._watchdog = self._watchdog, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop_watching()
        await self.client.__aexit__(exc_type, exc, tb)

    async def join(self, task: ClassificationTask, transport: Transport, advertise: str) -> bool:
        """Announce "ready" and wait for the first schedule; False: no broker or no schedule."""
        ctl, timeout = self.client, self.cfg.network.startup_timeout
        self._advertise = self.check.advertise = advertise
        ctl.recheck()  # a schedule received before our address was known (stale, forged)
        if not await ctl.bus.wait_connected(timeout):
            self.log.error("peer.no_broker", broker=self.broker)
            self.give_up(
                f"cannot reach the MQTT broker at {self.broker} "
                f"(network.startup_timeout = {timeout:g} s)"
            )
            return False
        await ctl.status(
            "ready",
            address=advertise,
            steps_per_epoch=task.steps_per_epoch,
            fingerprint=task.flat.fingerprint(),
        )
        if not await ctl.wait_for(lambda: ctl.schedule is not None or self.stop.is_set(), timeout):
            self.log.error("peer.no_schedule", waited=timeout)
            self.give_up(
                f"no schedule from the orchestrator (network.startup_timeout = {timeout:g} s)"
            )
            return False
        if self.error is not None:
            return False
        schedule = ctl.schedule
        if schedule is not None:
            transport.set_addresses(dict(zip(schedule.peers, schedule.addresses, strict=True)))
            self.joined_version = schedule.version
        self._transport, self._loop = transport, asyncio.get_running_loop()
        return True

    def rejoin_at(self, stage: Stage) -> int | None:
        """The step of ``stage`` a restarted peer starts at: the effective step of the schedule
        that re-admitted it (None: it runs the stage from the start with everyone). A peer
        whose first schedule is a later version joins a train stage in progress: at the start
        every peer takes version 1 (the run starts when all are ready). Its transport takes
        frames of that step from now on: its neighbours answer its Fetch at that step's
        boundary and send it their first tensors right after, likely before its first round."""
        s = self.client.schedule
        if stage.name != "train" or self.joined_version <= 1 or s is None:
            return None
        step = max(0, s.effective_step)
        if self._transport is not None:
            self._transport.mailbox.advance(stage.step_base + step)
        return step

    async def torch_store(self, timeout: float) -> str | None:
        """The torch.distributed store the orchestrator announces in the plan (waited for at most
        ``timeout`` seconds; ``network.transport = "torch"``; `concord.orchestrator.store`):
        ``HOST:PORT``, with ``#PREFIX`` when it gave its keys' secret prefix
        (`TorchPlane.connect`)."""
        await self.client.wait_for(lambda: self.client.plan is not None, timeout)
        plan = self.client.plan
        if plan is None or plan.store is None:
            return None
        return f"{plan.store}#{plan.store_prefix}" if plan.store_prefix else plan.store

    def neighbours(self) -> list[int]:
        """The peers of the schedule held (a rejoining peer fetches from them)."""
        s = self.client.schedule
        return [] if s is None else [j for j in s.peers if j != self.peer_id]

    def _addresses(self, s: Schedule) -> None:
        """The training thread saw a newer schedule: its addresses to the transport (loop) and,
        when it adds peers back, their joining step (`Transport.joins_at`, this thread's)."""
        t, loop = self._transport, self._loop
        if t is not None and loop is not None and len(s.addresses) == len(s.peers):
            loop.call_soon_threadsafe(t.set_addresses, dict(zip(s.peers, s.addresses, strict=True)))
        if t is not None and set(s.peers) - self.membership.members:
            t.joins_at(self.membership.step_base + s.effective_step)

    async def next_stage(self) -> Stage | None:
        """The next stage the orchestrator starts; None when a stop comes first."""
        ctl = self.client

        def news() -> bool:
            control = ctl.control
            return self.stop.is_set() or (control is not None and control.ts not in self._handled)

        await ctl.wait_for(news, None)  # bounded by the watchdog (absent/broker_lost_timeout)
        control = ctl.control
        if self.stop.is_set() or control is None:
            return None
        self._handled.append(control.ts)
        if control.action == "stop":
            self.exit_code = 1
            return None
        return Stage(control.stage, control.steps or None, control.step_base)

    def round_hooks(
        self, stage: Stage, comm: RoundComm, loop: asyncio.AbstractEventLoop
    ) -> tuple[OrchestratedControl | None, GraphStats | None]:
        cfg = self.cfg

        def bytes_sent() -> int:
            return comm.counters.bytes_wire

        self._control = OrchestratedControl(
            self.client,
            loop,
            stage=stage.name,
            lagged=cfg.control.lagged,
            lag=cfg.control.lag,
            timeout=cfg.orchestrator.decision_timeout,
            bytes_sent=bytes_sent,
            max_rounds=cfg.control.max_rounds,
            fixed_rounds=cfg.control.rounds if cfg.control.mode == "fixed" else None,
            statistic=cfg.control.statistic,
        )
        graphs = None
        if cfg.spec.adaptive_graph == "feedback" and stage.name == "train":
            graphs = GraphStats(self.client, loop, bytes_sent=bytes_sent)
        return self._control, graphs

    def begin(self, stage: Stage, runner: StepRunner) -> None:
        self.membership.runner, self.membership.step_base = runner, stage.step_base
        self.check.phases = len(runner.plan.phases)
        if self.client.schedule is not None:  # a stage starts everyone at once: the newest one
            self.membership.apply(self.client.schedule)

    def step_hooks(self, stage: Stage) -> list[RunHooks]:
        assert self._control is not None, "round_hooks() comes first"
        return [
            OrchestratorHooks(
                self._control, self.membership, self.log, stage.final, self._addresses
            )
        ]

    async def training(self, stage: Stage, transport: Transport) -> None:
        self.may_fetch.runner = self.membership.runner
        transport.may_fetch = self.may_fetch
        await self.client.status("training", stage=stage.name, address=self._advertise)

    def _fetch_graphs(
        self,
    ) -> list[tuple[Sequence[int] | None, Mapping[int, str | None] | None]]:
        """The graphs a Fetch is judged against: the schedule in force and the newest held."""
        out: list[tuple[Sequence[int] | None, Mapping[int, str | None] | None]] = [(None, None)]
        s = self.client.schedule
        if s is not None:
            out.append((s.peers, phase_topologies(s)))
        return out

    async def stage_done(self, stage: Stage, summary: PeerSummary) -> PeerSummary:
        """The summary with the stage's control fallbacks and clamped round counts."""
        control = self._control
        fallbacks = clamped = 0
        if control is not None:
            control.close()  # statistics still held (a stop between a step and its record)
            fallbacks, clamped = control.fallbacks, control.clamped
        await self.client.status("done", stage=stage.name)
        extra: dict[str, JSON] = {**summary.extra, "control_rounds_clamped": clamped}
        return replace(summary, control_fallbacks=fallbacks, extra=extra)

    async def leave(self, summary: PeerSummary) -> None:
        """Wait for the run's "stop" (nobody says it when the orchestrator is gone). A peer that
        finished while the broker was away (a restart; steps run fast on fallback) first waits,
        within the same bound, for the broker and for the orchestrator to come back: its retained
        "done" reaches the orchestrator only then (`ControlClient.gone_for`)."""
        ctl = self.client
        if summary.completed:
            await self._stop_watching()  # trained to the end: the wait below has its own bound
        if not self.stop.is_set():
            await ctl.wait_for(
                lambda: (
                    self.stop.is_set()
                    or (ctl.control is not None and ctl.control.action == "stop")
                    or ctl.gone_for(_RECONNECT_SETTLE)
                ),
                STOP_WAIT,
            )
        if not summary.completed:
            await ctl.status("failed", reason="stopped before the end of training")

    def counters(self) -> dict[str, JSON]:
        return {
            "broker_connects": self.client.bus.connects,
            "control_payloads_rejected": self.client.bus.rejected,
            "control_handler_errors": self.client.handler_errors,
            "schedules_refused": self.client.schedules_refused,
        }
