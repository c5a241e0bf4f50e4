"""The peer process: ``concord peer --config RUN.toml --id I [--broker mqtt://HOST:PORT]``.

One asyncio event loop runs the gRPC server and the neighbour links; ONE worker thread runs the
training loop — `concord.core.loop.StepRunner` over `concord.core.task.ClassificationTask` for this
peer's replica, the very code the vectorized engine runs for all replicas at once, driven by
`concord.runtime.driver.drive` — and communicates only through its `concord.peer.comm.RoundComm`:
`PeerComm` over the loop's gRPC transport, or `concord.peer.torch_plane.TorchComm` over
torch.distributed (``network.transport = "torch"``: a fixed world, no rejoin).

One driver (`PeerProcess.main`) for both kinds of peer; a coordination says what to run
(`concord.peer.coordination.Coordination`): static peers take topology, plan and addresses from
the config, orchestrated peers follow the orchestrator's stages and schedules over MQTT. The
driver moves along the peer's lifecycle (`concord.peer.lifecycle`: starting → joining → waiting
→ [resuming →] [rejoining →] training ⇄ rejoining → leaving → done | failed), each state's work
in its own module: `concord.peer.checkpoints` (resuming), `concord.peer.rejoin` (rejoining),
`concord.peer.training` (training).

Run directory (``--out``, default ``runs/peer-<id>``, `concord.runtime.rundir.RunWriter`):
``metrics.jsonl`` (the step records of the vectorized engine plus this peer's round outcomes, and
evaluations of its replica; flushed every line), ``log.jsonl`` (JSON lines bound with run, peer,
step and round), ``checkpoint.pt`` (load with ``weights_only=True``), ``summary.json``,
``config.toml`` (the resolved config). SIGTERM / SIGINT stop at the next step boundary
(checkpointed), close streams and server, exit 0.

A static peer started again with the same ``--config`` and ``--out`` after it was killed (or
stopped) continues from its last checkpoint (parameters, algorithm and RNG state, the gossip-round
counter and byte counters): metrics lines after the checkpoint's step are dropped — unless its
neighbours are more than ``network.rejoin_fetch_after`` steps further (or it has no checkpoint):
then it adopts a neighbour's parameters and momentum (``Fetch``) and goes on from that
neighbour's step + 1 (`concord.peer.rejoin.Restart`). Its neighbours skip it after
``network.skip_after`` missed rounds and take it back when it says Hello again
(`concord.peer.transport`). An orchestrated peer restarted with the same command is re-admitted
by the orchestrator at a later schedule version; it fetches a neighbour's parameters and
momentum through the same path and starts at that version's effective step
(`concord.peer.rejoin.Readmission`). A peer that finds itself more than its step window behind
all its neighbours (it was stalled) jumps to their step (`concord.peer.rejoin.Jumps`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog
import torch

from concord.core.algorithms.catalog import CATALOG
from concord.core.config import RunConfig
from concord.core.config_run import async_process_problems
from concord.core.graphs.topology import exponential_name, max_exponential_k
from concord.core.loop import ControlHook, StepRunner
from concord.core.records import JSON, PeerSummary
from concord.core.task import ClassificationTask
from concord.errors import PeerConfigError as PeerConfigError
from concord.peer.async_wire import run_key
from concord.peer.asynchronous import AsyncInbox, AsyncStepRunner
from concord.peer.certs import CertError
from concord.peer.checkpoints import Checkpoint, Checkpoints, restore, resumable
from concord.peer.comm import PeerComm, RoundComm
from concord.peer.coordination import (
    STOP_WAIT,
    Coordination,
    OrchestratedCoordination,
    StaticCoordination,
)
from concord.peer.launcher import Identity
from concord.peer.lifecycle import Lifecycle, State
from concord.peer.memory import tune_malloc
from concord.peer.pace import pace_hooks
from concord.peer.rejoin import Jumps, Readmission, Restart, rejoin
from concord.peer.telemetry import PeerMetrics, peer_registry, watch_refusals
from concord.peer.torch_plane import AgreedControl, TorchComm, TorchPlane, TorchPlaneError
from concord.peer.training import Serve, StageSteps, StepClock, stage_summary
from concord.peer.transport import Transport, TransportOptions
from concord.peer.validate import STEP_WINDOW
from concord.protos.exposure import check_exposure, exposure_of
from concord.runtime.driver import RunHooks, drive
from concord.runtime.lifecycle import dump_tasks, task_stacks
from concord.runtime.rundir import RunWriter
from concord.runtime.telemetry import metrics_server

# seconds from the end of training to the exit: the wait for the run's "stop", the transport's
# bounded stop, and slack — below the launcher's 90 s for peers outliving the orchestrator
TEARDOWN_LIMIT = STOP_WAIT + 25.0
_TEARDOWN_AFTER_SIGNAL = 5.0  # … and after a SIGTERM once training is over


__all__ = ["CertError", "PeerConfigError", "PeerProcess", "run_peer"]


def check_static(cfg: RunConfig, peer_id: int) -> list[str]:
    """Addresses of all peers, or a PeerConfigError saying what to change."""
    addresses = cfg.network.addresses
    if addresses is None:
        raise PeerConfigError(
            "network.addresses is not set: static peers need every peer's host:port "
            "(one per peer, in id order)"
        )
    if not 0 <= peer_id < cfg.peers:
        raise PeerConfigError(f"--id {peer_id} is not a peer of this run (0..{cfg.peers - 1})")
    if cfg.controlled_phases() and cfg.control.mode != "fixed":  # fixed: the config decides
        raise PeerConfigError(
            f"consensus control (control.mode = {cfg.control.mode!r}, phases "
            f"{cfg.controlled_phases()}) needs the orchestrator; set control.mode = 'none' "
            "for static peers"
        )
    if cfg.spec.adaptive_graph == "feedback":
        raise PeerConfigError(
            "algorithm 'ada-feedback' moves its graph by the orchestrator's decisions; static "
            "peers have none (run with --broker, or use ada-schedule)"
        )
    if cfg.dataset.augment:
        raise PeerConfigError("dataset.augment is not supported by static peers yet")
    return list(addresses)


def check_orchestrated(
    cfg: RunConfig, peer_id: int, listen: str | None, advertise: str | None, run_id: str
) -> str:
    """The listen address of a peer that follows an orchestrator, or a PeerConfigError."""
    from concord.protos.control_plane import Topics

    if not 0 <= peer_id < cfg.peers:
        raise PeerConfigError(f"--id {peer_id} is not a peer of this run (0..{cfg.peers - 1})")
    if cfg.dataset.augment:
        raise PeerConfigError("dataset.augment is not supported by peer processes yet")
    try:
        Topics(run_id)
    except ValueError as exc:
        raise PeerConfigError(f"config 'name' is the run id on the control plane: {exc}") from None
    addresses = cfg.network.addresses
    address = listen or (addresses[peer_id] if addresses else "127.0.0.1:0")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise PeerConfigError(f"--listen {address!r}: expected HOST:PORT (port 0: any free port)")
    if host in ("0.0.0.0", "[::]", "::") and advertise is None:
        raise PeerConfigError(
            f"--listen {address} binds every interface: give --advertise HOST:PORT, the address "
            "the other peers reach this one at"
        )
    return address


class Origin(enum.Enum):
    """How a peer process began its run — data, not a lifecycle state: it picks the path from
    ``waiting`` to ``training`` (`concord.peer.lifecycle`)."""

    FRESH = "fresh"  # a new run directory
    RESUMED = "resumed"  # `concord sim --resume`: every peer from a checkpoint of the same step
    # started again on its run directory after it was killed or stopped: a static peer continues
    # from its checkpoint (if any) and asks its neighbours how far they are; an orchestrated one
    # is re-admitted by the orchestrator and fetches a neighbour's parameters (late join)
    RESTARTED = "restarted"


class PeerProcess:
    """One peer process: its lifecycle (`Lifecycle`, `concord.peer.lifecycle`) from ``starting``
    through joining, stages of training and leaving to ``done`` or ``failed``."""

    def __init__(
        self,
        cfg: RunConfig,
        peer_id: int,
        *,
        listen: str | None,
        out: Path,
        broker: str | None = None,
        advertise: str | None = None,
        run_id: str | None = None,
        resume_step: int | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.cfg = cfg
        self.peer_id = peer_id
        # where the id (and GPU index) came from: --id or the launcher (`concord.peer.launcher`)
        self.identity = identity or Identity(peer_id, "--id")
        self.broker = broker or cfg.orchestrator.broker
        self.run_id = run_id or cfg.name or ("concord" if self.broker else "static")
        if self.broker is None:
            self.addresses = check_static(cfg, peer_id)
            self.listen = listen or self.addresses[peer_id]
        else:
            self.addresses = [""] * cfg.peers
            self.listen = check_orchestrated(cfg, peer_id, listen, advertise, self.run_id)
        # secure by default: an open address without TLS (or broker without protection) is
        # refused here, before anything is written, unless network.insecure
        self.exposure = exposure_of(cfg, listen=self.listen, broker=self.broker)
        check_exposure(self.exposure, insecure=cfg.network.insecure, role="peer", warn=False)
        if cfg.spec.asynchronous and (problems := async_process_problems(cfg)):
            raise PeerConfigError("; ".join(problems))
        self.advertise = advertise
        self.out = out
        self.life = Lifecycle()
        self.stop = threading.Event()
        self.left_tasks = False  # the transport's stop left a task behind: exit hard
        self._signalled = asyncio.Event()  # a SIGTERM/SIGINT arrived
        self._teardown: asyncio.Task[None] | None = None  # `_arm_teardown`'s deadline
        self._summary = PeerSummary(completed=False)  # what a stuck teardown writes
        self.step = 0
        self.origin, self.checkpoint = self._origin(resume_step)
        after = None if self.checkpoint is None else self.checkpoint.run.next_step - 1
        if self.broker is not None and self.origin is Origin.RESTARTED:
            after = sys.maxsize  # its earlier records stay and the new ones follow them
        self.plane: TorchPlane | None = None  # network.transport = "torch", once connected
        self.inbox: AsyncInbox | None = None  # asynchronous algorithms' messages, once serving
        self.writer = RunWriter(
            out, cfg, run=self.run_id, flush_every=1, resume_after=after, peer=peer_id
        )
        self.log = structlog.get_logger(__name__)
        check_exposure(self.exposure, insecure=cfg.network.insecure, role="peer")  # warned
        self.telemetry = peer_registry(self.run_id, peer_id)  # `metrics.listen` serves it
        if self.identity.source != "--id" or self.identity.local_source is not None:
            self.log.info(
                "peer.identity",
                source=self.identity.source,
                local_index=self.identity.local_index,
                local_source=self.identity.local_source,
            )

    def _origin(self, resume_step: int | None) -> tuple[Origin, Checkpoint | None]:
        """How this process begins (`Origin`) and the checkpoint it continues from, if any: a
        static peer's own on its run directory, or the one of ``resume_step``. An orchestrated
        peer started on a run directory it wrote before (`concord peer` refuses one of a
        completed run) is restarted."""
        out, cfg, i = self.out, self.cfg, self.peer_id
        if resume_step is not None:
            checkpoint = resumable(out, cfg, i, step=resume_step)
            if checkpoint is None:
                raise PeerConfigError(f"{out} holds no checkpoint of step {resume_step}")
            return Origin.RESUMED, checkpoint
        checkpoint = resumable(out, cfg, i) if self.broker is None else None
        if checkpoint is not None or (out / "metrics.jsonl").is_file():
            return Origin.RESTARTED, checkpoint
        return Origin.FRESH, None

    def _device(self) -> torch.device:
        gpus = torch.cuda.device_count() if self.cfg.device in ("auto", "cuda") else 0
        if self.cfg.device.startswith("cuda:"):
            return torch.device(self.cfg.device)
        local = self.identity.local_index  # LOCAL_RANK / SLURM_LOCALID, when a launcher set it
        index = self.peer_id if local is None else local
        return torch.device(f"cuda:{index % gpus}") if gpus else torch.device("cpu")

    def neighbours_ever(self, runner: StepRunner) -> list[int]:
        n, i = self.cfg.peers, self.peer_id
        # exact averaging (all-reduce, local SGD's average) reaches every peer
        if not self.cfg.spec.gossip or any(p.mode == "exact" for p in runner.plan.phases):
            return [j for j in range(n) if j != i]
        found: set[int] = set()
        names: list[str | None] = [None]  # each phase's topology
        if self.cfg.spec.adaptive_graph == "feedback":  # and the densest K it may move to
            names.append(exponential_name(max_exponential_k(n)))
        for phase in runner.plan.phases:
            for name in names:
                sched = runner.schedules.get(phase, topology=name)
                period = sched.period or 64  # random schedules: the first 64 rounds
                for k in range(period):
                    W = sched.matrix(k)
                    found.update(j for j in range(n) if j != i and (W[i, j] > 0 or W[j, i] > 0))
        return sorted(found)

    async def prepare(self) -> ClassificationTask:
        """Process set-up shared by static and orchestrated peers: torch threads, malloc tuning,
        SIGTERM/SIGINT → stop at the next step, and this peer's task (data, replica)."""
        torch.set_num_threads(self.cfg.threads or 1)
        tune_malloc()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._request_stop, sig)
        loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
        return await asyncio.to_thread(
            ClassificationTask, self.cfg, [self.peer_id], device=self._device()
        )

    def make_transport(
        self,
        task: ClassificationTask,
        addresses: list[str],
        is_neighbour: Callable[[int, int, int, int], bool],
    ) -> Transport:
        """The gRPC data plane of this peer (mTLS credentials when ``network.tls`` is set)."""
        options = TransportOptions.from_config(
            self.cfg,
            run_id=self.run_id,
            peer_id=self.peer_id,
            fingerprint=task.flat.fingerprint(),
            dim=int(task.x.shape[1]),
        )
        return Transport(options, addresses, is_neighbour)

    def coordination(self) -> Coordination:
        if self.broker is None:
            return StaticCoordination(self.cfg, self.peer_id, self.addresses)
        return OrchestratedCoordination(
            self.cfg,
            self.peer_id,
            broker=self.broker,
            run_id=self.run_id,
            stop=self.stop,
            step=lambda: self.step,
        )

    async def main(self) -> int:
        """The peer, from ``starting`` to ``done`` or ``failed``: serve, join the run, train its
        stages, leave, write the summary. An unexpected error fails it (and propagates)."""
        try:
            return await self._run()
        except Exception as exc:
            self.life.fail(error=repr(exc))
            raise

    def _end(self, code: int, **details: Any) -> None:
        """``done`` (exit code 0) or ``failed``: before the run directory's log is closed."""
        self.life.to(State.DONE if code == 0 else State.FAILED, code=code, **details)

    async def _run(self) -> int:
        cfg = self.cfg
        task = await self.prepare()
        coord = self.coordination()
        transport = self.make_transport(task, coord.addresses, coord.is_neighbour)
        if cfg.spec.asynchronous:
            key = run_key(self.run_id, task.flat.fingerprint())
            self.inbox = AsyncInbox(transport, int(task.x.shape[1]), key)
            transport.extra_handlers.append(self.inbox.servicer.generic_handler())
        port = await transport.start(self.listen)
        if self.checkpoint is not None:  # neighbours resume at this step too: file their tensors
            run = self.checkpoint.run
            transport.mailbox.advance(run.step_base + run.next_step)
        advertise = self.advertise or f"{self.listen.rpartition(':')[0]}:{port}"
        self.log.info("peer.listening", address=self.listen, port=port, advertise=advertise)
        summary = PeerSummary(completed=False)
        code = 0
        joined = False
        started = time.perf_counter()
        plane_error: str | None = None
        watch_refusals(self.telemetry, transport.counters.rejected)
        metrics = metrics_server(cfg.metrics.listen, self.telemetry, self.out)
        try:
            if metrics is not None:
                await metrics.__aenter__()
            async with coord:
                self.life.to(State.JOINING, origin=self.origin.value)
                joined = await coord.join(task, transport, advertise)
                if joined:
                    self.life.to(State.WAITING)
                    try:
                        summary, code = await self._stages(coord, transport, task)
                    except TorchPlaneError as exc:  # a fixed world lost a peer: the run ends
                        self.log.error("peer.torch_plane_failed", error=str(exc))
                        plane_error, code = str(exc), 1
                        summary = PeerSummary(completed=False, error=plane_error)
                        if self.plane is not None:  # the neighbours' operations fail now
                            self.plane.close()
                        self.life.to(State.LEAVING, error=plane_error)
                    await coord.leave(summary)
        finally:
            if self.plane is not None:
                self.plane.close()
            if self.inbox is not None:
                await self.inbox.channels.close()
            await transport.stop(grace=min(5.0, cfg.network.deadline))
            if metrics is not None:
                await metrics.__aexit__()
        # the peer gave up waiting (concord.peer.coordination) or its torch plane failed: exit 1
        error = coord.error or plane_error
        if error is not None:
            record = {"role": "peer", "peer": self.peer_id, "completed": False, "error": error}
            self.writer.write_json("error.json", {**record, "ts": time.time()})
            summary = replace(summary, completed=False, error=error)
        if not joined:  # no broker or no schedule: nothing ran, no summary
            self._end(1, error=error)
            self.writer.close()
            return 1
        summary = replace(
            summary,
            wall_seconds=time.perf_counter() - started,
            extra={**summary.extra, **transport_counters(transport), **coord.counters()},
        )
        if self._teardown is not None:
            self._teardown.cancel()  # in time: the summary below is the one
        finished = {k: v for k, v in summary.to_json().items() if k != "run_dir"}
        self.log.info("peer.finish", **finished)
        self._end(code)
        self.writer.finish(summary, plots=False)
        self.left_tasks = transport.stop_timed_out
        return code

    async def _stages(
        self, coord: Coordination, transport: Transport, task: ClassificationTask
    ) -> tuple[PeerSummary, int]:
        """From ``waiting``: run the coordination's stages until the final one is done or a stop
        comes; ends ``leaving``."""
        cfg, i = self.cfg, self.peer_id
        loop = asyncio.get_running_loop()
        connected = False
        fresh = True  # task.x is still x⁰
        if cfg.network.transport == "torch":
            await self._connect_plane(coord)
        while (stage := await coord.next_stage()) is not None:
            if not fresh:  # the calibration pass moved the model: start over from x⁰
                task = await asyncio.to_thread(ClassificationTask, cfg, [i], device=self._device())
            fresh = False
            comm: RoundComm = (
                PeerComm(i, cfg.peers, transport, loop)
                if self.plane is None
                else TorchComm(self.plane)
            )
            comm.step_base = stage.step_base
            control, graphs = coord.round_hooks(stage, comm, loop)
            hook: ControlHook | None = control
            if control is not None and self.plane is not None:  # every peer, the same rounds
                hook = AgreedControl(control, self.plane)
            make_runner = AsyncStepRunner if self.inbox is not None else StepRunner
            runner = make_runner(cfg, task, comm, control=hook, graphs=graphs)
            if isinstance(runner, AsyncStepRunner) and self.inbox is not None:
                runner.attach(transport, self.inbox, loop)
            transport.step_window = STEP_WINDOW + runner.algorithm.silent_steps
            transport.fetch_state = runner.algorithm.portable_state
            coord.begin(stage, runner)
            if not connected:
                missing = await transport.connect(
                    self.neighbours_ever(runner), timeout=cfg.network.startup_timeout
                )
                if missing:
                    self.log.warning("peer.start_without", missing=missing)
                connected = True
            await coord.training(stage, transport)
            late = coord.rejoin_at(stage)
            if late is not None and self.plane is not None:
                raise TorchPlaneError(
                    f"peer {i} was re-admitted at step {late} of a run in progress, but "
                    "network.transport = 'torch' has a fixed world: a peer cannot rejoin it "
                    "(use transport = 'grpc' for runs that survive restarts)"
                )
            result = await asyncio.to_thread(
                self.train,
                runner,
                task,
                steps=stage.steps,
                hooks=coord.step_hooks(stage),
                evaluate=stage.final,
                join_at=late,
                fetch_from=coord.neighbours(),
            )
            self._summary = result
            over = stage.final or self.stop.is_set()
            if over:  # training is over: the exit has a deadline
                self.life.to(State.LEAVING, stage=stage.name)
                self._arm_teardown(coord.exit_code)
            result = self._summary = await coord.stage_done(stage, result)
            if over:
                return result, coord.exit_code  # 0 unless the coordination gave up
            self.life.to(State.WAITING, stage_done=stage.name)
        self.life.to(State.LEAVING, stage=None)
        return PeerSummary(completed=False), coord.exit_code

    async def _connect_plane(self, coord: Coordination) -> None:
        """Join the torch.distributed process group (``network.transport = "torch"``) once,
        before the first stage: every peer of the run is there (the orchestrator starts a run
        when all are ready); a peer that restarted into a run in progress cannot join it (a
        static one with a checkpoint can: its neighbours restart from theirs)."""
        if self.origin is Origin.RESTARTED and (self.broker is not None or self.checkpoint is None):
            raise TorchPlaneError(
                f"peer {self.peer_id} restarted into a run whose data plane is "
                "torch.distributed (network.transport = 'torch'): a fixed world, it cannot "
                "rejoin (use transport = 'grpc' for runs that survive restarts)"
            )
        store = await coord.torch_store(self.cfg.network.startup_timeout)
        plane = TorchPlane(self.cfg, self.peer_id, self._device(), self.run_id)
        await asyncio.to_thread(plane.connect, store)
        self.plane = plane

    def _request_stop(self, sig: signal.Signals) -> None:
        self.log.info("peer.signal", signal=sig.name)
        self.stop.set()
        self._signalled.set()

    def _arm_teardown(self, code: int) -> None:
        """Training is over: whatever the teardown waits for, this process ends within
        `TEARDOWN_LIMIT` seconds (`_TEARDOWN_AFTER_SIGNAL` after a SIGTERM) — a finished peer
        once hung there until the launcher killed it, its summary unwritten. Past the limit it
        logs where every task waits, writes its summary as it stands (``teardown_stuck`` in its
        ``extra``) and exits."""

        async def deadline() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._signalled.wait(), TEARDOWN_LIMIT)
            if self._signalled.is_set():
                await asyncio.sleep(_TEARDOWN_AFTER_SIGNAL)
            try:
                self.log.error("peer.teardown_stuck", tasks=task_stacks())
                self._end(code, teardown_stuck=True)
                summary = self._summary
                stuck = replace(summary, extra={**summary.extra, "teardown_stuck": True})
                self.writer.finish(stuck, plots=False)
            finally:  # whatever failed above, the process ends
                sys.stdout.flush()
                sys.stderr.flush()
                logging.shutdown()
                os._exit(code)

        self._teardown = asyncio.create_task(deadline(), name="teardown-deadline")

    def train(
        self,
        runner: StepRunner,
        task: ClassificationTask,
        *,
        steps: int | None = None,
        hooks: Sequence[RunHooks] = (),
        evaluate: bool = True,
        join_at: int | None = None,
        fetch_from: Sequence[int] = (),
    ) -> PeerSummary:
        """One stage, in this thread, from ``waiting`` to ``training`` (through ``resuming``
        and ``rejoining`` when this peer starts behind, `_catch_up`), ``steps`` steps (default:
        the whole plan); ``hooks`` see every step (an orchestrated stage applies schedules
        before and publishes metrics after one). ``evaluate``: evaluate (and checkpoint) at the
        run's evaluation interval. ``join_at``: a restarted orchestrated peer re-admitted at that
        step, which fetches its parameters from one of ``fetch_from`` and starts there. Returns
        the stage's summary."""
        i = self.peer_id
        total = runner.total_steps if steps is None else min(steps, runner.total_steps)
        t0 = time.perf_counter()
        comm = runner.comm if isinstance(runner.comm, PeerComm) else None
        neighbours = self.neighbours_ever(runner) if comm is not None else []
        start, rejoined = self._catch_up(runner, task, comm, total, neighbours, join_at, fetch_from)
        self.life.to(State.TRAINING, step=start)
        clock = StepClock(self._at_step)
        jumps = Jumps(runner, comm, neighbours, total) if comm is not None else None
        steps_of = StageSteps(i, runner, task, clock, jumps)
        serve = Serve(runner, task, comm)
        budget = runner.budget() if isinstance(runner, AsyncStepRunner) else None  # global
        try:
            result = drive(
                steps=total if budget is None else budget.limit,
                interval=runner.eval_interval(),
                last_step=runner.total_steps - 1,
                train=steps_of.step,
                evaluate=steps_of.evaluate if evaluate else None,
                sink=self.writer,
                hooks=[
                    clock,
                    *pace_hooks(self.cfg, i),
                    *hooks,
                    serve,
                    Checkpoints(self.writer, self.cfg, i, runner, task),
                    PeerMetrics(self.telemetry, runner.total_steps),
                ],
                stop=self.stop.is_set,
                start=start,
                skip=None if jumps is None else lambda step: self._jump(jumps, step),
                budget=budget,
            )
        finally:
            serve.close()  # Fetches are refused from now on
        return stage_summary(
            i,
            runner,
            task,
            result,
            start=start,
            rejoined=rejoined,
            jumps=jumps,
            seconds=time.perf_counter() - t0,
            run_dir=self.out,
        )

    def _catch_up(
        self,
        runner: StepRunner,
        task: ClassificationTask,
        comm: PeerComm | None,
        total: int,
        neighbours: list[int],
        join_at: int | None,
        fetch_from: Sequence[int],
    ) -> tuple[int, dict[str, int]]:
        """``resuming`` from the checkpoint (consumed: only the first stage has one) and
        ``rejoining`` — one fetch path (`concord.peer.rejoin`) for a restarted static peer and a
        re-admitted orchestrated one; the step to start at, and the summary's ``rejoined``."""
        start = 0
        if self.checkpoint is not None:
            self.life.to(State.RESUMING)
            start = restore(self.checkpoint, runner, task, self.out)
            self.checkpoint = None
        if comm is None:  # torch.distributed: a fixed world, nobody to fetch from
            return start, {}
        how: Restart | Readmission | None = None
        peers = neighbours
        if join_at is not None:
            how = Readmission(join_at)
            peers = [j for j in fetch_from if j in neighbours] or list(fetch_from)
        elif self.broker is None and self.origin is not Origin.FRESH:
            spec = CATALOG[self.cfg.algorithm]
            keep = spec.asynchronous and not spec.steps_align and self.cfg.asynchrony.global_budget
            how = Restart(start, self.cfg.network.rejoin_fetch_after, keep_step=keep)
        if how is None:
            return start, {}
        self.life.to(State.REJOINING, start=start, readmitted_at=join_at)
        placed = rejoin(runner, task, comm, peers, how, total)
        return placed.step, placed.record

    def _jump(self, jumps: Jumps, step: int) -> int:
        """Drive's ``skip``: ``training`` → ``rejoining`` → ``training`` when this peer is behind
        all its neighbours (`concord.peer.rejoin.Jumps`); the step to run."""
        target = jumps.target(step)
        if target is None:
            return step
        to, round = target
        self.life.to(State.REJOINING, from_step=step, to_step=to)
        jumps.take(step, to, round)
        self.life.to(State.TRAINING, step=to)
        return to

    def _at_step(self, step: int) -> None:
        self.step = step


def transport_counters(transport: Transport) -> dict[str, JSON]:
    """The data plane's counters for the peer's summary (its ``extra``): frames refused by
    reason, tensors received and late, failed sends, missed deadlines, neighbours skipped and
    taken back, rounds not waited for."""
    c = transport.counters
    rejected: dict[str, JSON] = dict(c.rejected)
    return {
        "frames_rejected": rejected,
        "tensors_received": c.received,
        "tensors_late": c.late,
        "send_failures": c.send_failures,
        "missed_deadlines": c.missed_deadlines,
        "neighbours_skipped": c.skipped,
        "neighbours_back": c.back,
        "rounds_not_waited": c.not_waited,
    }


def run_peer(
    cfg: RunConfig,
    peer_id: int,
    *,
    listen: str | None,
    out: Path,
    broker: str | None = None,
    advertise: str | None = None,
    run_id: str | None = None,
    resume_step: int | None = None,
    identity: Identity | None = None,
) -> int:
    from concord.runtime.lifecycle import die_with_parent

    die_with_parent()
    process = PeerProcess(
        cfg,
        peer_id,
        listen=listen,
        out=out,
        broker=broker,
        advertise=advertise,
        run_id=run_id,
        resume_step=resume_step,
        identity=identity,
    )
    with asyncio.Runner() as runner:
        code = runner.run(process.main())
        if process.left_tasks:
            # the transport's stop gave up on a task that ignores cancellation (logged):
            # closing the loop would wait for it forever; the run directory is complete
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code
