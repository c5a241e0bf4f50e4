"""The peer process: ``concord peer --config RUN.toml --id I``.

One asyncio event loop runs the gRPC server and the neighbour links; ONE worker thread runs the
training loop — `concord.core.loop.StepRunner` over `concord.core.task.ClassificationTask` for this
peer's replica, the very code the vectorized engine runs for all replicas at once — and talks to the
loop only through `concord.peer.comm.PeerComm`. Static mode (no orchestrator yet): the topology, the
phase plan and every peer's address come from the config (``network.addresses``).

Run directory (``--out``, default ``runs/peer-<id>``): ``metrics.jsonl`` (the step records of the
vectorized engine plus this peer's round outcomes, and evaluations of its replica), ``log.jsonl``
(structlog JSON, bound with run, peer, step and round), ``checkpoint.pt`` (load with
``weights_only=True``), ``summary.json``, ``config.toml`` (the resolved config). SIGTERM /
SIGINT stop at the next step boundary (checkpointed), close streams and server, exit 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import IO, Any

import structlog
import torch

from concord.core.config import RunConfig, to_toml
from concord.core.graphs.adagraph import initial_topologies
from concord.core.graphs.topology import exponential_name, max_exponential_k
from concord.core.loop import StepRunner
from concord.core.task import ClassificationTask
from concord.errors import PeerConfigError as PeerConfigError
from concord.peer.certs import CertError
from concord.peer.comm import PeerComm
from concord.peer.memory import tune_malloc
from concord.peer.serde import TENSOR_ALLREDUCE
from concord.peer.tls import load_credentials
from concord.peer.transport import Transport
from concord.peer.validate import STEP_WINDOW


class StepHooks:
    """What a training loop does around each step besides training (no-ops by default)."""

    evaluate = True  # evaluate and checkpoint at eval intervals

    def before(self, step: int) -> None:
        """Called before ``step`` runs."""

    def after(self, step: int, record: dict[str, Any]) -> None:
        """Called with the step's metrics record."""

    def evaluated(self, step: int, record: dict[str, Any]) -> None:
        """Called with an evaluation record."""


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
    if cfg.controlled_phases():
        raise PeerConfigError(
            f"consensus control (control.mode = {cfg.control.mode!r}, phases "
            f"{cfg.controlled_phases()}) needs the orchestrator; set control.mode = 'none' "
            "for static peers"
        )
    if cfg.algorithm == "ada-feedback":
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


class _Writer:
    """This peer's run directory. Not `concord.runtime.rundir.RunWriter`: peer may not import sim
    (layering),
    and a peer flushes every metrics line, so a killed peer leaves every completed step behind."""

    def __init__(self, out: Path, cfg: RunConfig, peer_id: int, run: str) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        (out / "config.toml").write_text(to_toml(cfg), encoding="utf-8")  # the resolved config
        self._metrics: IO[str] = open(out / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self._log: IO[str] = open(out / "log.jsonl", "a", encoding="utf-8")  # noqa: SIM115

        def identity(_: Any, __: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
            event.setdefault("run", run)
            event.setdefault("peer", peer_id)
            return event

        # one JSON log per process: every module logger (structlog.get_logger) writes here
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                identity,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(),
            ],
            logger_factory=structlog.WriteLoggerFactory(file=self._log),
            cache_logger_on_first_use=False,
        )
        self.log = structlog.get_logger("concord.peer.app")

    def metric(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()

    def close(self, summary: dict[str, Any]) -> None:
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self._metrics.close()
        self._log.close()


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
    ) -> None:
        self.cfg = cfg
        self.peer_id = peer_id
        self.broker = broker or cfg.orchestrator.broker
        self.run_id = run_id or cfg.name or ("concord" if self.broker else "static")
        if self.broker is None:
            self.addresses = check_static(cfg, peer_id)
            self.listen = listen or self.addresses[peer_id]
        else:
            self.addresses = [""] * cfg.peers
            self.listen = check_orchestrated(cfg, peer_id, listen, advertise, self.run_id)
        self.advertise = advertise
        self.out = out
        self.stop = threading.Event()
        self.step = 0
        self.writer = _Writer(out, cfg, peer_id, self.run_id)
        self.log = self.writer.log

    def _device(self) -> torch.device:
        gpus = torch.cuda.device_count() if self.cfg.device in ("auto", "cuda") else 0
        if self.cfg.device.startswith("cuda:"):
            return torch.device(self.cfg.device)
        return torch.device(f"cuda:{self.peer_id % gpus}") if gpus else torch.device("cpu")

    def _neighbours_ever(self, runner: StepRunner) -> list[int]:
        n, i = self.cfg.peers, self.peer_id
        if self.cfg.algorithm == "allreduce" or any(p.mode == "exact" for p in runner.plan.phases):
            return [j for j in range(n) if j != i]
        found: set[int] = set()
        names: list[str | None] = [None]  # each phase's topology
        if self.cfg.algorithm == "ada-feedback":  # and the densest K it may move to
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
        cfg, i = self.cfg, self.peer_id
        server_creds = channel_creds = None
        if cfg.network.tls is not None:
            t = cfg.network.tls
            server_creds, channel_creds = load_credentials(t.ca, t.cert, t.key, i)
        return Transport(
            run_id=self.run_id,
            peer_id=i,
            world_size=cfg.peers,
            addresses=addresses,
            fingerprint=task.flat.fingerprint(),
            dim=int(task.x.shape[1]),
            codec=cfg.compression.codec,
            ratio=cfg.compression.ratio,
            levels=cfg.compression.levels,
            chunk_bytes=cfg.network.chunk_bytes,
            max_tensor_bytes=cfg.network.max_tensor_bytes,
            deadline=cfg.network.deadline,
            is_neighbour=is_neighbour,
            server_credentials=server_creds,
            channel_credentials=channel_creds,
        )

    async def main(self) -> int:
        if self.broker is not None:
            from concord.peer.follow import follow

            return await follow(self)
        cfg, i = self.cfg, self.peer_id
        task = await self.prepare()
        transport = self.make_transport(
            task,
            self.addresses,
            lambda s, st, r, t: self._is_neighbour(runner, s, st, r, t),
        )
        loop = asyncio.get_running_loop()
        comm = PeerComm(i, cfg.peers, transport, loop)
        runner = StepRunner(cfg, task, comm)
        transport.step_window = STEP_WINDOW + runner.algorithm.silent_steps
        # ada-schedule's per-phase graphs: from the config here (no orchestrator publishes them)
        phases = len(runner.plan.phases)
        runner.schedules.set_topologies(
            initial_topologies(cfg.algorithm, cfg.hyper, cfg.peers, phases)
        )
        port = await transport.start(self.listen)
        self.log.info("peer.listening", address=self.listen, port=port)
        missing = await transport.connect(
            self._neighbours_ever(runner), timeout=cfg.network.startup_timeout
        )
        if missing:
            self.log.warning("peer.start_without", missing=missing)
        started = time.perf_counter()
        try:
            summary = await asyncio.to_thread(self._train, runner, task)
        finally:
            await transport.stop(grace=min(5.0, cfg.network.deadline))
        summary.update(
            wall_seconds=time.perf_counter() - started,
            frames_rejected=dict(transport.counters.rejected),
            tensors_received=transport.counters.received,
            tensors_late=transport.counters.late,
            send_failures=transport.counters.send_failures,
        )
        self.log.info("peer.finish", **{k: v for k, v in summary.items() if k != "run_dir"})
        self.writer.close(summary)
        return 0

    def _request_stop(self, sig: signal.Signals) -> None:
        self.log.info("peer.signal", signal=sig.name)
        self.stop.set()

    def _is_neighbour(
        self, runner: StepRunner, sender: int, step: int, round: int, tensor_id: int
    ) -> bool:
        if tensor_id == TENSOR_ALLREDUCE:
            return sender != self.peer_id
        phase = runner.plan.phase_at(min(step, runner.total_steps - 1))
        if phase.mode != "gossip":
            return False
        W = runner.schedules.get(phase).matrix(round)
        return bool(W[self.peer_id, sender] > 0 or W[sender, self.peer_id] > 0)

    def _train(
        self,
        runner: StepRunner,
        task: ClassificationTask,
        *,
        steps: int | None = None,
        hooks: StepHooks | None = None,
    ) -> dict[str, Any]:
        """Train ``steps`` steps (default: the whole plan); ``hooks`` see every step (the
        orchestrated mode applies schedules before and publishes metrics after a step)."""
        log, i = self.log, self.peer_id
        interval = runner.eval_interval()
        total = runner.total_steps if steps is None else min(steps, runner.total_steps)
        last_eval: dict[str, float] = {}
        step = 0
        t0 = time.perf_counter()
        for step in range(total):
            if self.stop.is_set():
                log.info("peer.stopping", step=step)
                if step > 0:  # keep the last completed step for a restart
                    self._checkpoint(task, runner, step - 1)
                break
            self.step = step
            structlog.contextvars.bind_contextvars(step=step)  # this thread's log lines
            started = time.perf_counter()
            if hooks is not None:
                hooks.before(step)
            record, report = runner.step(step)
            record["step_ms"] = (time.perf_counter() - started) * 1e3  # incl. control waits
            record["peer"] = i
            record["missing"] = sorted({j for o in report.outcomes for m in o.missing for j in m})
            record["rejected"] = sorted(
                {j for o in report.outcomes for r in o.rejected for j, _ in r}
            )
            if record["missing"]:
                log.warning(
                    "round.missing",
                    step=step,
                    round=record["rounds_total"],
                    neighbours=record["missing"],
                )
            if hooks is not None:
                hooks.after(step, record)
            self.writer.metric(record)
            final = step == runner.total_steps - 1
            if hooks is not None and not hooks.evaluate:
                continue
            if (step + 1) % interval == 0 or final:
                ev = task.evaluate(peers=True)
                last_eval = {"accuracy": ev["acc_mean_peer"], "loss": ev["loss_mean_peer"]}
                eval_record = {"kind": "eval", "step": step, "peer": i, **last_eval}
                eval_record["epoch"] = record["epoch"]
                self.writer.metric(eval_record)
                if hooks is not None:
                    hooks.evaluated(step, eval_record)
                self._checkpoint(task, runner, step)
        else:
            step = total
        return {
            "engine": "processes",
            "peer": i,
            "steps": step,
            "completed": step == runner.total_steps,
            "accuracy": last_eval.get("accuracy"),
            "gossip_rounds_total": runner.rounds_total,
            "bytes_sent_total": runner.comm.counters.bytes_wire,
            "bytes_raw_total": runner.comm.counters.bytes_raw,
            "bytes_per_edge": runner.comm.counters.edge_table(),
            "train_seconds": time.perf_counter() - t0,  # the training loop only (incl. evals)
            "cpu_seconds": time.process_time(),  # this process so far, every thread
            "run_dir": str(self.out),
        }

    def _checkpoint(self, task: ClassificationTask, runner: StepRunner, step: int) -> None:
        state: dict[str, Any] = {
            "step": torch.tensor(step),
            "params": task.x.detach().cpu(),
            "algorithm": {k: v.detach().cpu() for k, v in runner.algorithm.state_dict().items()},
        }
        buffers = task.flat.buffers_flat()
        if buffers is not None:
            state["buffers"] = buffers.detach().cpu()
        tmp = self.out / "checkpoint.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(self.out / "checkpoint.pt")


def run_peer(
    cfg: RunConfig,
    peer_id: int,
    *,
    listen: str | None,
    out: Path,
    broker: str | None = None,
    advertise: str | None = None,
    run_id: str | None = None,
) -> int:
    from concord.runtime.lifecycle import die_with_parent

    die_with_parent()
    process = PeerProcess(
        cfg, peer_id, listen=listen, out=out, broker=broker, advertise=advertise, run_id=run_id
    )
    return asyncio.run(process.main())
