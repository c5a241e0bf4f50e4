"""The peer process: ``concord peer --config RUN.toml --id I [--broker mqtt://HOST:PORT]``.

One asyncio event loop runs the gRPC server and the neighbour links; ONE worker thread runs the
training loop — `concord.core.loop.StepRunner` over `concord.core.task.ClassificationTask` for this
peer's replica, the very code the vectorized engine runs for all replicas at once, driven by
`concord.runtime.driver.drive` — and communicates only through its `concord.peer.comm.RoundComm`:
`PeerComm` over the loop's gRPC transport, or `concord.peer.torch_plane.TorchComm` over
torch.distributed (``network.transport = "torch"``: a fixed world, no rejoin).

One driver (`PeerProcess.main`) for both kinds of peer; a coordination says what to run
(`concord.peer.coordination`): static peers take topology, plan and addresses from the config,
orchestrated peers follow the orchestrator's stages and schedules over MQTT.

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
neighbour's step + 1 (`PeerProcess._rejoin`). Its neighbours skip it after
``network.skip_after`` missed rounds and take it back when it says Hello again
(`concord.peer.transport`). An orchestrated peer restarted with the same command is re-admitted
by the orchestrator at a later schedule version; it fetches a neighbour's parameters and
momentum and starts at that version's effective step (`PeerProcess._join_late`).
A peer that finds itself more than its step window behind all its neighbours (it was stalled)
jumps to their step (``jump`` in `PeerProcess.train`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
import torch

from concord.core.config import RunConfig, run_identity
from concord.core.data import partition_digest
from concord.core.graphs.topology import exponential_name, max_exponential_k
from concord.core.loop import ControlHook, StepRunner
from concord.core.task import ClassificationTask
from concord.errors import PeerConfigError as PeerConfigError
from concord.peer.certs import CertError
from concord.peer.comm import PeerComm, RoundComm
from concord.peer.coordination import STOP_WAIT, OrchestratedCoordination, StaticCoordination
from concord.peer.launcher import Identity
from concord.peer.memory import tune_malloc
from concord.peer.pace import pace_hooks
from concord.peer.telemetry import PeerMetrics, peer_registry, watch_refusals
from concord.peer.torch_plane import AgreedControl, TorchComm, TorchPlane, TorchPlaneError
from concord.peer.transport import Fetched, Transport, TransportOptions
from concord.peer.validate import STEP_WINDOW
from concord.protos.exposure import check_exposure, exposure_of
from concord.runtime.driver import StepHooks, drive
from concord.runtime.lifecycle import dump_tasks, task_stacks
from concord.runtime.rundir import (
    RunWriter,
    checkpoint_steps,
    counters_state,
    load_checkpoint,
    load_counters,
    restore_checkpoint,
)
from concord.runtime.telemetry import metrics_server

Coordination = StaticCoordination | OrchestratedCoordination
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


class PeerProcess:
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
        self.advertise = advertise
        self.out = out
        self.stop = threading.Event()
        self.left_tasks = False  # the transport's stop left a task behind: exit hard
        self._signalled = asyncio.Event()  # a SIGTERM/SIGINT arrived
        self._teardown: asyncio.Task[None] | None = None  # `_arm_teardown`'s deadline
        self.step = 0
        # a static peer restarted on its own run directory continues from its checkpoint
        self.resume: dict[str, Any] | None = None
        if self.broker is None:
            self.resume = resumable(out, cfg, peer_id)
        if resume_step is not None:  # `concord sim --resume`: every peer from the same step
            self.resume = resumable(out, cfg, peer_id, step=resume_step)
            if self.resume is None:
                raise PeerConfigError(f"{out} holds no checkpoint of step {resume_step}")
        # started before on this run directory (killed, with or without a checkpoint): rejoin
        self.restarted = self.broker is None and (
            self.resume is not None or (out / "metrics.jsonl").is_file()
        )
        self.rejoined: dict[str, int] = {}
        self.plane: TorchPlane | None = None  # network.transport = "torch", once connected
        after = None if self.resume is None else int(self.resume["run"]["next_step"]) - 1
        # an orchestrated peer restarted on its run directory (`concord peer` refuses one of a
        # completed run): it rejoins at the step the orchestrator gives it
        self.rejoining = (
            self.broker is not None and resume_step is None and (out / "metrics.jsonl").is_file()
        )
        if self.rejoining:  # its earlier records stay and the new ones follow them
            after = sys.maxsize
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
        """The peer: serve, join the run, train its stages, leave, write the summary."""
        cfg = self.cfg
        task = await self.prepare()
        coord = self.coordination()
        transport = self.make_transport(task, coord.addresses, coord.is_neighbour)
        port = await transport.start(self.listen)
        if self.resume is not None:  # neighbours resume at this step too: file their tensors
            run = self.resume["run"]
            transport.mailbox.advance(int(run.get("step_base", 0)) + int(run["next_step"]))
        advertise = self.advertise or f"{self.listen.rpartition(':')[0]}:{port}"
        self.log.info("peer.listening", address=self.listen, port=port, advertise=advertise)
        summary: dict[str, Any] = {}
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
                joined = await coord.join(task, transport, advertise)
                if joined:
                    try:
                        summary, code = await self._stages(coord, transport, task)
                    except TorchPlaneError as exc:  # a fixed world lost a peer: the run ends
                        self.log.error("peer.torch_plane_failed", error=str(exc))
                        plane_error, code = str(exc), 1
                        summary = {"completed": False, "error": plane_error}
                        if self.plane is not None:  # the neighbours' operations fail now
                            self.plane.close()
                    await coord.leave(summary)
        finally:
            if self.plane is not None:
                self.plane.close()
            await transport.stop(grace=min(5.0, cfg.network.deadline))
            if metrics is not None:
                await metrics.__aexit__()
        # the peer gave up waiting (concord.peer.coordination) or its torch plane failed: exit 1
        error = coord.error or plane_error
        if error is not None:
            record = {"role": "peer", "peer": self.peer_id, "completed": False, "error": error}
            self.writer.write_json("error.json", {**record, "ts": time.time()})
            summary.update(completed=False, error=error)
        if not joined:  # no broker or no schedule: nothing ran, no summary
            self.writer.close()
            return 1
        summary.update(
            wall_seconds=time.perf_counter() - started,
            frames_rejected=dict(transport.counters.rejected),
            tensors_received=transport.counters.received,
            tensors_late=transport.counters.late,
            send_failures=transport.counters.send_failures,
            missed_deadlines=transport.counters.missed_deadlines,
            neighbours_skipped=transport.counters.skipped,
            neighbours_back=transport.counters.back,
            rounds_not_waited=transport.counters.not_waited,
            **coord.counters(),
        )
        if self._teardown is not None:
            self._teardown.cancel()  # in time: the summary below is the one
        self.log.info("peer.finish", **{k: v for k, v in summary.items() if k != "run_dir"})
        self.writer.finish(summary, plots=False)
        self.left_tasks = transport.stop_timed_out
        return code

    async def _stages(
        self, coord: Coordination, transport: Transport, task: ClassificationTask
    ) -> tuple[dict[str, Any], int]:
        """Run the stages of the coordination until the final one is done or a stop comes."""
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
            runner = StepRunner(cfg, task, comm, control=hook, graphs=graphs)
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
            if stage.final or self.stop.is_set():  # training is over: the exit has a deadline
                self._arm_teardown(result, coord.exit_code)
            result.update(await coord.stage_done(stage))
            if stage.final or self.stop.is_set():
                return result, coord.exit_code  # 0 unless the coordination gave up
        return {"completed": False}, coord.exit_code

    async def _connect_plane(self, coord: Coordination) -> None:
        """Join the torch.distributed process group (``network.transport = "torch"``) once,
        before the first stage: every peer of the run is there (the orchestrator starts a run
        when all are ready); a peer that restarted into a run in progress cannot join it."""
        rejoining = self.broker is not None and self.rejoining
        if rejoining or (self.restarted and self.broker is None and self.resume is None):
            raise TorchPlaneError(
                f"peer {self.peer_id} restarted into a run whose data plane is "
                "torch.distributed (network.transport = 'torch'): a fixed world, it cannot "
                "rejoin (use transport = 'grpc' for runs that survive restarts)"
            )
        store = None
        if isinstance(coord, OrchestratedCoordination):  # the plan carries the store
            timeout = self.cfg.network.startup_timeout
            await coord.client.wait_for(lambda: coord.client.plan is not None, timeout)
            store = coord.torch_store()
        plane = TorchPlane(self.cfg, self.peer_id, self._device(), self.run_id)
        await asyncio.to_thread(plane.connect, store)
        self.plane = plane

    def _request_stop(self, sig: signal.Signals) -> None:
        self.log.info("peer.signal", signal=sig.name)
        self.stop.set()
        self._signalled.set()

    def _arm_teardown(self, summary: dict[str, Any], code: int) -> None:
        """Training is over: whatever the teardown waits for, this process ends within
        `TEARDOWN_LIMIT` seconds (`_TEARDOWN_AFTER_SIGNAL` after a SIGTERM) — a finished peer
        once hung there until the launcher killed it, its summary unwritten. Past the limit it
        logs where every task waits, writes its summary (``teardown_stuck``) and exits."""

        async def deadline() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._signalled.wait(), TEARDOWN_LIMIT)
            if self._signalled.is_set():
                await asyncio.sleep(_TEARDOWN_AFTER_SIGNAL)
            try:
                self.log.error("peer.teardown_stuck", tasks=task_stacks())
                self.writer.finish({**summary, "teardown_stuck": True}, plots=False)
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
        hooks: Sequence[StepHooks] = (),
        evaluate: bool = True,
        join_at: int | None = None,
        fetch_from: Sequence[int] = (),
    ) -> dict[str, Any]:
        """Train ``steps`` steps (default: the whole plan) in this thread; ``hooks`` see every
        step (an orchestrated stage applies schedules before and publishes metrics after one).
        ``evaluate``: evaluate (and checkpoint) at the run's evaluation interval. ``join_at``: a
        restarted orchestrated peer re-admitted at that step; it fetches its parameters from
        one of ``fetch_from`` and starts there (`_join_late`)."""
        i = self.peer_id
        total = runner.total_steps if steps is None else min(steps, runner.total_steps)
        clock = _StepClock(self)
        t0 = time.perf_counter()
        comm = runner.comm if isinstance(runner.comm, PeerComm) else None
        transport = comm.transport if comm is not None else None
        jumps: list[tuple[int, int]] = []  # (from, to): steps this peer jumped over
        neighbours = self.neighbours_ever(runner) if transport is not None else []

        def jump(step: int) -> int:
            """Behind its neighbours by more than the step window (they skipped it while it was
            stalled, or it restarted from an old checkpoint), this peer can mix with nobody:
            it jumps to their step — the round counter too, so frame keys match — and gossip
            pulls its stale parameters back in (`concord.peer.transport.Transport.behind`)."""
            if comm is None or transport is None:
                return step
            ahead = transport.behind(comm.step_base + step, neighbours)
            if ahead is None:
                return step
            to = ahead[0] - comm.step_base
            if to >= total:
                return step  # no step of this stage (a bogus claim): stay
            self.log.warning("peer.jump", from_step=step, to_step=to, round=ahead[1])
            comm.loop.call_soon_threadsafe(transport.jumped)  # before the next round's coroutine
            runner.rounds_total = ahead[1]
            jumps.append((step, to))
            return to

        def one(step: int) -> dict[str, Any]:
            record, report = runner.step(step)
            record["step_ms"] = (time.perf_counter() - clock.started) * 1e3  # incl. control waits
            if isinstance(runner.comm, RoundComm):  # where communication went (`Breakdown`)
                record.update(runner.comm.take_breakdown())
            record["peer"] = i
            if jumps and jumps[-1][1] == step:
                record["jumped_from"] = jumps[-1][0]
            record["missing"] = sorted({j for o in report.outcomes for m in o.missing for j in m})
            record["rejected"] = sorted(
                {j for o in report.outcomes for r in o.rejected for j, _ in r}
            )
            if transport is not None:  # neighbours not waited for after this step
                record["skipped"] = list(transport.suspected)
            if record["missing"]:
                self.log.warning(
                    "round.missing",
                    step=step,
                    round=record["rounds_total"],
                    neighbours=record["missing"],
                )
            return record

        def evaluation(step: int, record: dict[str, Any], final: bool) -> dict[str, Any]:
            ev = task.evaluate(peers=True)
            return {
                "kind": "eval",
                "step": step,
                "peer": i,
                "accuracy": ev["acc_mean_peer"],
                "loss": ev["loss_mean_peer"],
                "epoch": record["epoch"],
            }

        start = 0
        if self.resume is not None:  # a restarted static peer: continue from its checkpoint
            start = self._restore(self.resume, runner, task)
            self.resume = None
        if self.restarted and comm is not None and transport is not None:
            self.restarted = False
            start = self._rejoin(runner, task, comm, transport, start, neighbours, total)
        if join_at is not None and comm is not None and transport is not None:
            peers = [j for j in fetch_from if j in neighbours] or list(fetch_from)
            start = self._join_late(runner, task, comm, transport, join_at, peers, total)
        serve = _Serve(runner, task, comm, transport)
        try:
            result = drive(
                steps=total,
                interval=runner.eval_interval(),
                last_step=runner.total_steps - 1,
                train=one,
                evaluate=evaluation if evaluate else None,
                sink=self.writer,
                hooks=[
                    clock,
                    *pace_hooks(self.cfg, i),
                    *hooks,
                    serve,
                    _Checkpoints(self, runner, task),
                    PeerMetrics(self.telemetry, runner.total_steps),
                ],
                stop=self.stop.is_set,
                start=start,
                skip=jump,
            )
        finally:
            serve.close()  # Fetches are refused from now on
        resumed: dict[str, Any] = {"resumed_from_step": start} if start else {}
        if self.rejoined:
            resumed["rejoined"] = dict(self.rejoined)
        return {
            **resumed,
            "engine": "processes",
            "peer": i,
            "steps": result.steps,
            "completed": result.steps == runner.total_steps,
            "accuracy": result.last_eval.get("accuracy"),
            "gossip_rounds_total": runner.rounds_total,
            "jumps": len(jumps),
            "steps_jumped": sum(to - at for at, to in jumps),
            "bytes_sent_total": runner.comm.counters.bytes_wire,
            "bytes_raw_total": runner.comm.counters.bytes_raw,
            "bytes_per_edge": runner.comm.counters.edge_table(),
            "partition_sha256": partition_digest(task.parts),
            "train_seconds": time.perf_counter() - t0,  # the training loop only (incl. evals)
            "cpu_seconds": time.process_time(),  # this process so far, every thread
            "run_dir": str(self.out),
        }

    def _rejoin(
        self,
        runner: StepRunner,
        task: ClassificationTask,
        comm: PeerComm,
        transport: Transport,
        start: int,
        neighbours: list[int],
        total: int,
    ) -> int:
        """A restarted static peer asks its neighbours for their parameters (Fetch); when the
        most advanced answer is more than ``network.rejoin_fetch_after`` steps ahead of its
        checkpoint (or it has none), it adopts those parameters and continues at that
        neighbour's step + 1 — with the round counter to match (one round per step), so its
        frames carry the keys its neighbours expect and land inside their step window. With the
        parameters it takes the neighbour's portable algorithm state (the momentum: `_adopt`);
        the rest (trackers, error feedback) stays its own, the checkpoint's or the fresh one.
        Returns the step to start at. Only a restarted peer fetches: at a fresh start the
        neighbours' first round waits for this peer, whose Fetch would wait for their step
        boundary."""
        cfg = self.cfg
        timeout = 2 * cfg.network.deadline + 5.0  # a neighbour's step boundary, at worst
        future = asyncio.run_coroutine_threadsafe(
            transport.fetch_any(neighbours, timeout), comm.loop
        )
        got = future.result(timeout + 10.0)
        if got is None:
            self.log.info("peer.rejoin", fetched=False, step=start)
            return start
        behind = got.step - comm.step_base - start
        to = got.step - comm.step_base + 1
        if behind <= cfg.network.rejoin_fetch_after or to >= total:
            self.log.info("peer.rejoin", fetched=False, step=start, neighbour_step=got.step)
            return start
        self._adopt(runner, task, got)
        runner.rounds_total = got.round + 1
        self.rejoined = {"from_peer": got.sender, "at_step": to, "checkpoint_step": start}
        self.log.warning("peer.rejoin", fetched=True, **self.rejoined)
        return to

    def _join_late(
        self,
        runner: StepRunner,
        task: ClassificationTask,
        comm: PeerComm,
        transport: Transport,
        join_at: int,
        peers: list[int],
        total: int,
    ) -> int:
        """A restarted orchestrated peer, re-admitted at step ``join_at``: it adopts the
        parameters of the most advanced of ``peers`` that answers a Fetch and starts at
        ``join_at`` — with that neighbour's round counter when answered at the boundary of
        ``join_at`` (`Transport.joins_at`) — or, if that neighbour is already past it, at its
        step + 1 (the round counter to match, one round per step; `jump` corrects the rest).
        Without an answer it starts at ``join_at`` from its initial parameters, and gossip
        pulls them in."""
        timeout = 2 * self.cfg.network.deadline + 5.0
        future = asyncio.run_coroutine_threadsafe(transport.fetch_any(peers, timeout), comm.loop)
        got = future.result(timeout + 10.0)
        start = min(join_at, total - 1)
        if got is None:
            runner.rounds_total = start
            self.rejoined = {"at_step": start, "readmitted_at": join_at}
            self.log.warning("peer.rejoin", fetched=False, **self.rejoined)
            return start
        local = got.step - comm.step_base
        start = min(join_at if local <= join_at else local + 1, total - 1)
        self._adopt(runner, task, got)
        runner.rounds_total = got.round + (start - local)
        self.rejoined = {"from_peer": got.sender, "at_step": start, "readmitted_at": join_at}
        self.log.warning("peer.rejoin", fetched=True, **self.rejoined)
        return start

    def _adopt(self, runner: StepRunner, task: ClassificationTask, got: Fetched) -> None:
        """Take over a Fetch answer: the neighbour's parameters and the algorithm state it sent
        (`Algorithm.portable_state`, e.g. the momentum, as hivemind's ``load_state_from_peers``
        takes the optimizer's); the rest of the state stays this peer's."""
        with torch.no_grad():
            task.x[0].copy_(got.x.to(task.x.device, task.x.dtype))
        if not got.state:
            return
        state = runner.algorithm.state_dict()
        for name, v in got.state.items():
            state[name] = v.to(task.x.device, task.x.dtype).reshape(1, -1)
        runner.algorithm.load_state_dict(state)
        self.log.info("peer.rejoin_state", from_peer=got.sender, parts=sorted(got.state))

    def run_state(self, runner: StepRunner, step: int) -> dict[str, Any]:
        """The peer's state beyond tensors after ``step`` (a checkpoint's ``run``)."""
        return {
            "engine": "peer",
            "peer": self.peer_id,
            "next_step": step + 1,
            "step_base": runner.comm.step_base if isinstance(runner.comm, RoundComm) else 0,
            "total_steps": runner.total_steps,
            "rounds_total": runner.rounds_total,
            "counters": counters_state(runner.comm.counters),
            "config": run_identity(self.cfg),
        }

    def _restore(self, state: dict[str, Any], runner: StepRunner, task: ClassificationTask) -> int:
        """Load a checkpoint into the task, algorithm and counters; the step to continue from."""
        run = state["run"]
        if run["total_steps"] != runner.total_steps:
            raise PeerConfigError(
                f"the checkpoint in {self.out} is of a {run['total_steps']}-step run; this run "
                f"has {runner.total_steps} steps (pass --force to start over)"
            )
        restore_checkpoint(state, task, runner.algorithm)
        runner.rounds_total = int(run["rounds_total"])
        load_counters(runner.comm.counters, run["counters"])
        self.log.info("peer.resume", step=int(run["next_step"]))
        return int(run["next_step"])


def resumable(
    out: Path, cfg: RunConfig, peer_id: int, *, step: int | None = None
) -> dict[str, Any] | None:
    """The checkpoint a static peer restarted on ``out`` continues from: one with run state of
    this peer and config, of a run that did not complete (None: start afresh). ``step``: the
    one of that step (``checkpoint.pt`` or ``checkpoint.prev.pt``), for a resumed run."""
    path = out / "checkpoint.pt" if step is None else checkpoint_steps(out).get(step)
    if path is None or not path.is_file():
        return None
    summary = out / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("completed"):
        return None
    state = load_checkpoint(path)
    run = state.get("run")
    if not isinstance(run, dict) or run.get("engine") != "peer" or run.get("peer") != peer_id:
        return None
    if run.get("config") != run_identity(cfg):
        raise PeerConfigError(
            f"{out} holds a checkpoint of another config; use the same --config to resume, or "
            "--force to start over"
        )
    return state


class _StepClock(StepHooks):
    """Binds the step to this thread's log lines and starts the step's clock, first of all hooks
    (a step's ``step_ms`` includes the waits of the hooks before it)."""

    def __init__(self, process: PeerProcess) -> None:
        self.process = process
        self.started = time.perf_counter()

    def before(self, step: int) -> None:
        self.process.step = step
        structlog.contextvars.bind_contextvars(step=step)
        self.started = time.perf_counter()


class _Serve(StepHooks):
    """Fetch answers (`concord.peer.transport.Transport.snapshot`): at each step boundary, a copy
    of the parameters for the neighbours waiting — never a torn read of a step in progress."""

    def __init__(
        self,
        runner: StepRunner,
        task: ClassificationTask,
        comm: PeerComm | None,
        transport: Transport | None,
    ) -> None:
        self.runner, self.task, self.comm, self.transport = runner, task, comm, transport
        if transport is not None:
            transport.training = True

    def before(self, step: int) -> None:
        t, comm = self.transport, self.comm
        if t is not None and comm is not None and t.wanted:
            algorithm = self.runner.algorithm
            state = {
                k: v[0]
                for k, v in algorithm.state_dict().items()
                if k in algorithm.portable_state and v.dim() == 2
            }
            t.fulfil(self.task.x[0], comm.step_base + step, self.runner.rounds_total, state)

    def close(self) -> None:
        if self.transport is not None and self.comm is not None:
            self.comm.loop.call_soon_threadsafe(self.transport.stop_serving)


class _Checkpoints(StepHooks):
    """``checkpoint.pt`` after every evaluation, and of the last complete step on a stop."""

    def __init__(self, process: PeerProcess, runner: StepRunner, task: ClassificationTask) -> None:
        self.process = process
        self.runner = runner
        self.task = task

    def _save(self, step: int) -> None:
        state = self.process.run_state(self.runner, step)
        self.process.writer.save_checkpoint(
            self.task, self.runner.algorithm, step, run_state=state, keep_previous=True
        )

    def evaluated(self, step: int, record: dict[str, Any]) -> None:
        self._save(step)

    def stopping(self, step: int) -> None:
        self.process.log.info("peer.stopping", step=step)
        if step > 0:  # keep the last completed step for a restart
            self._save(step - 1)


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
