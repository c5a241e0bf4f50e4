"""A peer that follows the orchestrator (``concord peer … --broker mqtt://HOST:PORT``).

The same training loop as a static peer (`concord.peer.app.PeerProcess`), driven by the control
plane:

1. start the gRPC server (``--listen``, port 0 = any free port) and announce, as a retained
   status "ready": the address the others reach us at, the steps per epoch of our partition and
   the model fingerprint;
2. take the neighbours' addresses from the orchestrator's schedule and connect;
3. run each stage the orchestrator starts: ``calibrate`` (the controlled phases, uncontrolled,
   reporting θ_i) and ``train`` (rounds decided by the orchestrator, `concord.peer.control`);
   data-plane step numbers of a stage start at its ``step_base`` so stages never share a frame key;
4. apply a repaired schedule (a peer left) at its ``effective_step``; frames for a step are checked
   against the schedule in force at that step. Each phase's topology is taken from the published
   schedule (adaptive graphs, `concord.core.graphs.adagraph`), not from this peer's config. In an
   ada-feedback run the peer publishes θ_i and ‖g_i‖ after every step
   (`concord.peer.control.GraphStats`) and, at a
   decision's effective step, waits (at most ``orchestrator.decision_timeout``) until it holds
   that decision's schedule, so every peer switches graphs at the same step as the vectorized
   engine; on a timeout it keeps its graph and records a fallback;
5. report "done", wait for the run's "stop", close streams and server, write the summary.

Per-step metrics go to ``metrics.jsonl`` (with ``control``: how the step's rounds were decided)
and, as `Metrics` messages, to the orchestrator.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from concord.core.control.plan import Phase
from concord.core.graphs.adagraph import FeedbackConfig, feedback_config
from concord.core.graphs.topology import exponential_name, max_exponential_k
from concord.core.loop import StepRunner
from concord.core.task import ClassificationTask
from concord.peer.app import StepHooks
from concord.peer.comm import PeerComm
from concord.peer.control import ControlClient, GraphStats, OrchestratedControl
from concord.peer.serde import TENSOR_ALLREDUCE
from concord.peer.transport import Transport
from concord.peer.validate import STEP_WINDOW
from concord.protos.control_plane import Schedule

if TYPE_CHECKING:
    from concord.peer.app import PeerProcess

_STOP_WAIT = 60.0  # seconds a finished peer keeps serving until the run's "stop"


def phase_topologies(schedule: Schedule) -> dict[int, str | None]:
    """Phase index → the topology the schedule gives it (None: the run's topology)."""
    return {int(p["index"]): p["topology"] for p in schedule.phases}


class Membership:
    """Which peers gossip at which step, over which graph: the applied schedule and a pending
    newer one (a repaired schedule, or an ada-feedback decision)."""

    def __init__(self, peer_id: int, feedback: FeedbackConfig | None = None, n: int = 2) -> None:
        self.peer_id = peer_id
        self.client: ControlClient | None = None
        self.runner: StepRunner | None = None
        self.step_base = 0
        self.applied = 0  # version of the schedule in force
        self.feedback = feedback  # ada-feedback: when decisions take effect
        self.densest = exponential_name(max_exponential_k(n))  # contains every exponential:K

    def _pending(self) -> Schedule | None:
        s = self.client.schedule if self.client is not None else None
        return s if s is not None and s.version > self.applied else None

    def apply(self, s: Schedule) -> None:
        """Put ``s`` in force: its members and each phase's topology."""
        if self.runner is not None:
            self.runner.schedules.set_members(s.peers)
            self.runner.schedules.set_topologies(phase_topologies(s))
        self.applied = s.version

    def before_step(self, step: int) -> Schedule | None:
        """Apply a newer schedule whose effective step has come; returns it if applied."""
        s = self._pending()
        if s is None or step < s.effective_step or self.runner is None:
            return None
        self.apply(s)
        return s

    def holds(self, decision: int) -> bool:
        """This peer holds a schedule reflecting ada-feedback decision point ``decision``."""
        s = self.client.schedule if self.client is not None else None
        return s is not None and s.decided_at is not None and s.decided_at >= decision

    def awaited(self, step: int) -> int | None:
        """ada-feedback: the decision point taking effect at ``step`` whose schedule this peer
        does not hold yet (None: nothing to wait for)."""
        if self.feedback is None:
            return None
        s = self.feedback.decided_for(step)
        return s if s is not None and not self.holds(s) else None

    def _topology_at(self, step: int, phase: Phase, in_force: Schedule | None) -> str | None:
        """The topology of ``phase`` at ``step`` (None: the applied one)."""
        if self.feedback is not None:
            s = self.feedback.in_force(step)
            if s is not None and not self.holds(s):
                return self.densest  # a decision not received yet: any K it may pick
        if in_force is None or self.runner is None:
            return None
        name = phase_topologies(in_force).get(phase.index)
        return name or phase.topology or self.runner.cfg.topology

    def is_neighbour(self, sender: int, wire_step: int, round: int, tensor_id: int) -> bool:
        if tensor_id == TENSOR_ALLREDUCE:
            return sender != self.peer_id
        runner = self.runner
        step = wire_step - self.step_base
        if runner is None or step < 0:
            return True  # a straggler of the previous stage: filed and never read
        phase = runner.plan.phase_at(min(step, runner.total_steps - 1))
        if phase.mode != "gossip":
            return False
        pending = self._pending()
        in_force = pending if pending is not None and step >= pending.effective_step else None
        members = in_force.peers if in_force is not None else None
        topology = self._topology_at(step, phase, in_force)
        W = runner.schedules.get(phase, members, topology).matrix(round)
        return bool(W[self.peer_id, sender] > 0 or W[sender, self.peer_id] > 0)


class FollowHooks(StepHooks):
    def __init__(self, p: PeerProcess, control: OrchestratedControl, membership: Membership):
        self.p = p
        self.control = control
        self.membership = membership
        self.evaluate = control.stage == "train"
        self.graph_fallback = False  # this step ran on its old graph (decision not received)

    def before(self, step: int) -> None:
        self.graph_fallback = False
        decision = self.membership.awaited(step)
        if decision is not None and not self.control.wait_for_schedule(
            lambda: self.membership.holds(decision)
        ):
            self.graph_fallback = True  # keep the current graph (concord.peer.control docstring)
            self.p.log.warning("graph.fallback", step=step, decision=decision)
        s = self.membership.before_step(step)
        if s is not None:
            self.p.log.info(
                "schedule.applied",
                version=s.version,
                peers=s.peers,
                step=step,
                topologies=[ph["topology"] for ph in s.phases],
            )

    def after(self, step: int, record: dict[str, Any]) -> None:
        if self.graph_fallback:
            record["graph_fallback"] = True
        record["stage"] = self.control.stage
        record["control"] = self.control.how or None
        record["control_wait_ms"] = 1000.0 * self.control.wait_s
        self.control.how, self.control.wait_s = "", 0.0
        if self.control.stage == "train":
            self.control.publish_metrics(step, "step", record)

    def evaluated(self, step: int, record: dict[str, Any]) -> None:
        self.control.publish_metrics(step, "eval", record)


async def follow(p: PeerProcess) -> int:
    cfg, i = p.cfg, p.peer_id
    assert p.broker is not None
    task = await p.prepare()
    feedback = feedback_config(cfg.hyper) if cfg.algorithm == "ada-feedback" else None
    membership = Membership(i, feedback, cfg.peers)
    transport = p.make_transport(task, [""] * cfg.peers, membership.is_neighbour)
    port = await transport.start(p.listen)
    host = p.listen.rpartition(":")[0]
    advertise = p.advertise or f"{host}:{port}"
    p.log.info("peer.listening", address=p.listen, port=port, advertise=advertise)
    timeout = cfg.network.startup_timeout
    ctl = ControlClient(
        p.broker, p.run_id, i, heartbeat=cfg.orchestrator.heartbeat, step=lambda: p.step
    )
    membership.client = ctl
    summary: dict[str, Any] = {}
    started = time.perf_counter()
    code = 0
    try:
        async with ctl:
            if not await ctl.bus.wait_connected(timeout):
                p.log.error("peer.no_broker", broker=p.broker)
                return 1
            await ctl.status(
                "ready",
                address=advertise,
                steps_per_epoch=task.steps_per_epoch,
                fingerprint=task.flat.fingerprint(),
            )
            if not await ctl.wait_for(lambda: ctl.schedule is not None or p.stop.is_set(), timeout):
                p.log.error("peer.no_schedule", waited=timeout)
                return 1
            summary, code = await _stages(p, ctl, transport, membership, task)
            if not p.stop.is_set():
                await ctl.wait_for(  # (nobody will say stop when the orchestrator is gone)
                    lambda: (
                        p.stop.is_set()
                        or (ctl.control is not None and ctl.control.action == "stop")
                        or ctl.orchestrator_gone
                    ),
                    _STOP_WAIT,
                )
            if not summary.get("completed"):
                await ctl.status("failed", reason="stopped before the end of training")
    finally:
        await transport.stop(grace=min(5.0, cfg.network.deadline))
    summary.update(
        wall_seconds=time.perf_counter() - started,
        frames_rejected=dict(transport.counters.rejected),
        tensors_received=transport.counters.received,
        tensors_late=transport.counters.late,
        send_failures=transport.counters.send_failures,
        broker_connects=ctl.bus.connects,
        control_payloads_rejected=ctl.bus.rejected,
    )
    p.log.info("peer.finish", **{k: v for k, v in summary.items() if k != "run_dir"})
    p.writer.close(summary)
    return code


async def _stages(
    p: PeerProcess,
    ctl: ControlClient,
    transport: Transport,
    membership: Membership,
    task: ClassificationTask,
) -> tuple[dict[str, Any], int]:
    """Run the stages the orchestrator starts until "train" is done or a stop comes."""
    cfg, i = p.cfg, p.peer_id
    loop = asyncio.get_running_loop()
    schedule = ctl.schedule
    assert schedule is not None
    transport.set_addresses(dict(zip(schedule.peers, schedule.addresses, strict=True)))
    handled: list[float] = []  # ts of the run controls already acted on
    connected = False
    fresh = True  # task.x is still x⁰

    def news() -> bool:
        return p.stop.is_set() or (ctl.control is not None and ctl.control.ts not in handled)

    while True:
        await ctl.wait_for(news, None)
        control = ctl.control
        if p.stop.is_set() or control is None:
            return {"completed": False}, 0
        handled.append(control.ts)
        if control.action == "stop":
            return {"completed": False}, 1
        if not fresh:  # the calibration pass moved the model: start over from x⁰
            task = await asyncio.to_thread(ClassificationTask, cfg, [i], device=p._device())
        fresh = False
        comm = PeerComm(i, cfg.peers, transport, loop)
        comm.step_base = control.step_base
        hook = OrchestratedControl(
            ctl,
            loop,
            stage=control.stage,
            lagged=cfg.control.lagged,
            lag=cfg.control.lag,
            timeout=cfg.orchestrator.decision_timeout,
            bytes_sent=_bytes_of(comm),
        )
        graphs = None
        if cfg.algorithm == "ada-feedback" and control.stage == "train":
            graphs = GraphStats(ctl, loop, bytes_sent=_bytes_of(comm))
        runner = StepRunner(cfg, task, comm, control=hook, graphs=graphs)
        transport.step_window = STEP_WINDOW + runner.algorithm.silent_steps
        membership.runner, membership.step_base = runner, control.step_base
        if ctl.schedule is not None:  # a stage starts everyone at once: the newest schedule
            membership.apply(ctl.schedule)
        if not connected:
            missing = await transport.connect(
                p._neighbours_ever(runner), cfg.network.startup_timeout
            )
            if missing:
                p.log.warning("peer.start_without", missing=missing)
            connected = True
        await ctl.status("training", stage=control.stage, address=transport_address(p, transport))
        hooks = FollowHooks(p, hook, membership)
        result = await asyncio.to_thread(
            p._train, runner, task, steps=control.steps or None, hooks=hooks
        )
        hook.close()  # statistics still held (a stop between a step and its record)
        result["control_fallbacks"] = hook.fallbacks
        await ctl.status("done", stage=control.stage)
        if control.stage == "train" or p.stop.is_set():
            return result, 0


def _bytes_of(comm: PeerComm) -> Callable[[], int]:
    return lambda: comm.counters.bytes_wire


def transport_address(p: PeerProcess, transport: Transport) -> str:
    host = p.listen.rpartition(":")[0]
    return p.advertise or f"{host}:{transport.port}"
