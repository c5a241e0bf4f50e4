"""``concord sim --engine processes``: the real system on this host.

One orchestrator process (embedding an MQTT broker unless ``--broker`` names one) and n
``concord peer`` processes on loopback, each started as a fresh interpreter (never forked from
this torch process), one torch thread each by default, ``cuda:(i mod G)`` when G GPUs are present.
Every child arms a parent-death signal (`concord.runtime.lifecycle`), and Ctrl-C / SIGTERM here stop
them all (SIGTERM, then SIGKILL after a grace period): no orphans.

While the run goes, a progress view follows the control plane like any other MQTT client:
step, loss, accuracy of the latest evaluation, Θ against its target, rounds and the peers' states.

At the end the run directory looks like the vectorized engine's: the orchestrator's
``manifest.json``, ``metrics.jsonl`` (aggregated over peers), ``control.jsonl`` (every decided
round) and ``calibration.json``; each peer's own directory under ``peers/``; and here
``partition.json``, ``edges.json``, the final evaluation — the averaged model of the peers'
final parameters and every peer on the whole test set, exact Ξ — ``summary.json`` and the plots.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any, Protocol

import structlog
import torch

from concord.core.config import RunConfig, apply_overrides, to_toml
from concord.core.control.consensus import consensus_distance
from concord.core.loop import check_algorithm
from concord.core.records import (
    JSON,
    EvalRecord,
    MetricsRecord,
    RunSummary,
    StepRecord,
    peer_accuracy,
)
from concord.core.task import ClassificationTask, load_task_data, make_partition
from concord.errors import ConfigError
from concord.errors import ProcessesError as ProcessesError
from concord.orchestrator.broker import embedded_broker_secured
from concord.orchestrator.metrics import eval_record, step_record
from concord.protos.control_plane import Decision, Message, Metrics, Plan, Status, Topics
from concord.protos.exposure import check_exposure, exposure_of
from concord.protos.mqtt import BrokerAuth, Bus
from concord.protos.reach import BrokerUnreachableError, probe_broker
from concord.protos.signing import Signing, signing_for
from concord.runtime.lock import holder
from concord.runtime.logs import open_log
from concord.runtime.progress import step_progress
from concord.runtime.records import (
    read_manifest,
    read_metrics,
    read_orchestrator_summary,
    read_peer_summary,
    truncate_metrics,
)
from concord.runtime.rundir import checkpoint_steps, load_checkpoint

_GRACE = 15.0  # seconds children get to stop cleanly after SIGTERM
_PEERS_AFTER = 90.0  # seconds peers may outlive the orchestrator (60 s "stop" wait + teardown)
# seconds the orchestrator may take to exit once every peer has and its summary is written (its
# teardown is bounded by 5 s publish and 3 s broker-shutdown timeouts; this catches the rest)
_TEARDOWN = 30.0


# files this launcher reads back (waits for, or sums up): never an earlier run's
STALE_FILES = ("orchestrator.json", "orchestrator-summary.json", "manifest.json", "summary.json")


def make_run_id(cfg: RunConfig) -> str:
    """A fresh ``<name>-<8 hex>``; with broker credentials exactly the config's ``name``: the
    broker's ACL (`concord certs broker --run-id`) names the run's topics, so the run id is
    fixed in advance (ConfigError when ``name`` is unset or no valid run id)."""
    o = cfg.orchestrator
    if o.broker_username or o.broker_password_file or o.broker_password_env:
        problem = None if cfg.name else "is unset"
        if cfg.name:
            try:
                Topics(cfg.name)
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            raise ConfigError(
                [
                    (
                        "name",
                        f"{problem}: with broker credentials the run id is the config's name, "
                        "the --run-id given to `concord certs broker` (its ACL names the topics)",
                    )
                ]
            )
        return str(cfg.name)
    base = "".join(c if c.isalnum() or c in "_.-" else "-" for c in (cfg.name or "sim"))[:48]
    return f"{base.strip('-_.') or 'sim'}-{uuid.uuid4().hex[:8]}"


class Placement(Protocol):
    """Where the children of a run live and talk. By default (`Loopback`) this host's loopback;
    ``concord sim --net`` passes one that starts each child in a network namespace of its own
    behind an emulated link (`concord.lab.net.placement`)."""

    @property
    def broker(self) -> str | None:
        """The URL of the MQTT broker it runs for the run (None: the orchestrator embeds one)."""

    def start(self, name: str, argv: Sequence[str], **popen_kw: Any) -> subprocess.Popen[bytes]:
        """Start child ``name`` ("orchestrator", "peer-<i>") running ``argv``."""

    def address(self, name: str) -> str:
        """The IP address child ``name`` listens on and announces to the others."""

    def monitor(self) -> AbstractContextManager[object]:
        """While entered, the launcher's own MQTT client (the progress view) can reach the
        broker."""


class Loopback:
    """Every child a plain process of this host, on 127.0.0.1 (the default `Placement`)."""

    broker: str | None = None

    def start(self, name: str, argv: Sequence[str], **popen_kw: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, **popen_kw)

    def address(self, name: str) -> str:
        return "127.0.0.1"

    def monitor(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()


def _store_on_placement(cfg: RunConfig, placement: Placement) -> RunConfig:
    """The torch data plane's rendezvous store, hosted by the orchestrator, is announced by
    the orchestrator's host name unless ``network.torch.store_host`` says otherwise; behind
    emulated links that name means nothing to a peer's namespace, so the store is announced at
    the orchestrator's address there (the config the run records says so)."""
    t = cfg.network.torch
    if (
        isinstance(placement, Loopback)
        or cfg.network.transport != "torch"
        or t.init not in ("auto", "orchestrator")
        or t.store_host is not None
    ):
        return cfg
    return apply_overrides(cfg, {"network.torch.store_host": placement.address("orchestrator")})


class Children:
    """The orchestrator and peer processes of one run (owned: `stop` ends every one), started
    where ``placement`` puts them."""

    def __init__(self, run_dir: Path, cfg: RunConfig, placement: Placement | None = None) -> None:
        self.run_dir = run_dir
        self.cfg = cfg
        self.placement: Placement = placement or Loopback()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.abandoned: set[str] = set()  # stopped by us after their work was done
        self._logs: list[IO[bytes]] = []
        threads = str(cfg.threads or 1)
        self.env = {
            **os.environ,
            "CONCORD_PARENT_PID": str(os.getpid()),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": threads,
            "MKL_NUM_THREADS": threads,
        }

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.run_dir / "logs" / f"{name}.out", "wb")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        proc = self.placement.start(
            name,
            [sys.executable, "-m", "concord.lab.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the children in order
        )
        self.procs[name] = proc
        return proc

    def failed(self) -> dict[str, int]:
        return {
            n: p.returncode
            for n, p in self.procs.items()
            if p.poll() not in (None, 0) and n not in self.abandoned
        }

    def orchestrator_stuck(self, since: float | None, now: float) -> bool | None:
        """Every peer exited ``since`` more than `_TEARDOWN` seconds ago and the orchestrator,
        its summary written, is still there: it is stuck in teardown. True when that summary
        says the run completed (its work is done), False when it records an error (the run
        failed: stopping it must not hide that), None when it is not stuck."""
        if since is None or now - since <= _TEARDOWN:
            return None
        try:
            record = read_orchestrator_summary(self.run_dir)
        except (OSError, ValueError):  # being written
            return None
        return None if record is None else record.completed is True

    def peers_stuck(self, since: float | None, now: float) -> dict[str, bool]:
        """Peers still running `_PEERS_AFTER` seconds after the orchestrator exited (``since``):
        a peer waits at most 60 s for the run's "stop" and 15 s for its transport, so these are
        hung in teardown. name → whether its summary says it completed."""
        if since is None or now - since <= _PEERS_AFTER:
            return {}
        stuck = {}
        for name in self.running():
            if name.startswith("peer-"):
                try:
                    summary = read_peer_summary(self.run_dir / "peers" / name)
                except (OSError, ValueError):  # being written
                    summary = None
                stuck[name] = summary is not None and summary.completed
        return stuck

    def abandon(self, name: str, *, done: bool = True) -> None:
        """Stop a child; when its work is ``done`` its exit status is then no failure."""
        if done:
            self.abandoned.add(name)
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def hopeless(self) -> bool:
        """The run cannot finish: the orchestrator failed, or every peer did (a lost peer is
        the orchestrator's business: it repairs the schedule and the others go on)."""
        failed = self.failed()
        peers = [n for n in self.procs if n.startswith("peer-")]
        return "orchestrator" in failed or all(n in failed for n in peers)

    def running(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def stop(self, grace: float = _GRACE) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, end - time.monotonic()))
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for log in self._logs:
            log.close()
        self._logs.clear()


class Monitor:
    """Follows the run on the control plane for the progress view (an ordinary MQTT client)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.total = 0
        self.states: dict[int, str] = {}
        self.steps: dict[int, int] = {}
        self.latest: dict[int, dict[str, float]] = {}
        self.evals: dict[int, float] = {}
        self.decision: Decision | None = None

    def on_message(self, kind: str, peer: int | None, message: Message) -> None:
        if isinstance(message, Status) and peer is not None:
            self.states[peer] = message.state
        elif isinstance(message, Metrics) and peer is not None:
            if message.event == "eval":
                accuracy = peer_accuracy(message.values)
                self.evals[peer] = float("nan") if accuracy is None else accuracy
            else:
                self.steps[peer] = message.step
                self.latest[peer] = message.values
        elif isinstance(message, Plan):
            self.total = message.total_steps
        elif isinstance(message, Decision):
            self.decision = message

    def line(self) -> str:
        parts = []
        if self.latest:
            loss = [v["loss"] for v in self.latest.values() if "loss" in v]
            epoch = max(v.get("epoch", 0.0) for v in self.latest.values())
            parts.append(f"ep {epoch:.1f}")
            if loss:
                parts.append(f"loss {sum(loss) / len(loss):.3f}")
        if self.evals:
            acc = list(self.evals.values())
            parts.append(f"acc {100 * sum(acc) / len(acc):.1f}% (worst {100 * min(acc):.1f}%)")
        d = self.decision
        if d is not None and d.statistic is not None and d.target is not None:
            parts.append(f"Θ {d.statistic:.3g}/{d.target:.3g}")
        rounds = [int(v.get("rounds", 0)) for v in self.latest.values()]
        if rounds:
            parts.append(f"rounds {max(rounds)}")
        counts: dict[str, int] = {}
        for i in range(self.n):
            state = self.states.get(i, "starting")
            counts[state] = counts.get(state, 0) + 1
        parts.append("peers " + " ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        return "  ".join(parts)

    @property
    def step(self) -> int:
        return min(self.steps.values()) + 1 if len(self.steps) == self.n else 0


async def _follow(
    children: Children,
    url: str,
    run_id: str,
    monitor: Monitor,
    progress: bool,
    stop: list[str],
    auth: BrokerAuth | None = None,
    signing: Signing | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.append, signal.Signals(sig).name)
    bar = step_progress(enabled=progress)  # "starting" until the plan gives the total
    topics = Topics(run_id)
    # decisions only feed the live view's Θ/target; without the view, not receiving one per
    # step saves this process (on the peers' CPUs) the work
    kinds = ["status", "metrics", "plan"] + (["decision"] if progress else [])
    async with Bus(
        url,
        f"monitor-{run_id}",
        topics,
        subscribe=kinds,
        handler=monitor.on_message,
        auth=auth,
        signing=signing,
    ):
        with bar:
            task = bar.add_task("run", total=None, info="starting peers")
            peers_gone: float | None = None
            orchestrator_gone: float | None = None
            while children.running() and not stop:
                if children.hopeless():
                    break
                await asyncio.sleep(0.25)
                now = time.monotonic()
                if "orchestrator" not in children.running():
                    orchestrator_gone = orchestrator_gone or now
                    for name, completed in children.peers_stuck(orchestrator_gone, now).items():
                        structlog.get_logger("concord.sim.processes").warning(
                            "peer.teardown_stuck", peer=name, completed=completed
                        )
                        children.abandon(name, done=completed)
                if children.running() != ["orchestrator"]:
                    peers_gone = None
                elif peers_gone is None:
                    peers_gone = now
                elif (done := children.orchestrator_stuck(peers_gone, now)) is not None:
                    structlog.get_logger("concord.sim.processes").warning(
                        "orchestrator.teardown_stuck",
                        seconds=round(now - peers_gone, 1),
                        completed=done,
                    )
                    children.abandon("orchestrator", done=done)
                    break
                bar.update(
                    task, total=monitor.total or None, completed=monitor.step, info=monitor.line()
                )


def run_processes(
    cfg: RunConfig,
    run_dir: Path,
    *,
    progress: bool = True,
    broker: str | None = None,
    resume: bool = False,
    placement: Placement | None = None,
) -> dict[str, JSON]:
    """Run orchestrator + n peers; returns the summary (`RunSummary` as its JSON document,
    written to ``run_dir/summary.json``) and writes the run directory. A run
    that fails leaves ``error.json`` in ``run_dir`` (what failed and why, each child's exit
    status and recorded error), so no run directory is left without a summary or a reason.
    ``resume``: continue the interrupted run in ``run_dir`` (`resume_step`). ``placement``:
    where the children run (default `Loopback`); its broker, if it runs one, is the run's."""
    after = resume_step(cfg, run_dir) if resume else None
    run_id = make_run_id(cfg)
    preflight(cfg, broker, run_id)  # before the run directory exists: nothing to clean up
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.json").unlink(missing_ok=True)
    try:
        summary = _run_processes(
            cfg, run_dir, run_id, progress=progress, broker=broker, after=after, placement=placement
        )
        return summary.to_json()
    except ProcessesError as exc:
        record = {
            "role": "launcher",
            "completed": False,
            "error": str(exc).split("\n", 1)[0],
            "children": child_errors(run_dir, cfg),
            "ts": time.time(),
        }
        tmp = run_dir / "error.json.tmp"
        tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        tmp.replace(run_dir / "error.json")
        raise


def monitor_auth(cfg: RunConfig, broker: str | None) -> BrokerAuth | None:
    """The launcher's broker login: with an external broker, or an embedded one with
    credentials, the read-only "monitor" identity; else anonymous (None)."""
    secured = broker or cfg.orchestrator.broker or embedded_broker_secured(cfg.orchestrator)
    return BrokerAuth.from_config(cfg.orchestrator, "monitor") if secured else None


def preflight(cfg: RunConfig, broker: str | None, run_id: str) -> None:
    """What n children would each find out after seconds of start-up, found here in about a
    second: the algorithm's ``[hyper]``, the dataset, partition and model (user plug-ins
    included: imported and called once, on this process's CPU), the run's signing material and
    an external broker that is down or refuses the monitor's login. Raises `ConfigError`,
    `PluginError` (a ValueError) or `ProcessesError`."""
    check_algorithm(cfg)
    data = load_task_data(cfg)
    ClassificationTask(
        cfg, [0], device=torch.device("cpu"), data=data, parts=make_partition(cfg, data)
    )
    for who in ["monitor", "orchestrator", *(f"peer-{i}" for i in range(cfg.peers))]:
        signing_for(cfg, who, run_id)
    external = broker or cfg.orchestrator.broker
    # secure by default: an open broker without protection (the children would refuse it)
    check_exposure(
        exposure_of(cfg, listen=None, broker=external),
        insecure=cfg.network.insecure,
        role="sim",
        warn=False,
    )
    if external:  # down, wrong port or refused login: one sentence now, before any child
        try:
            probe_broker(external, monitor_auth(cfg, broker), identifier=f"probe-{run_id}")
        except BrokerUnreachableError as exc:
            raise ProcessesError(str(exc)) from None


def resume_step(cfg: RunConfig, run_dir: Path) -> int:
    """The step an interrupted processes run continues after: the newest checkpoint step that
    every peer (``checkpoint.pt`` or ``checkpoint.prev.pt``) and the orchestrator
    (`concord.orchestrator.checkpoint`) hold. Raises `ProcessesError` saying what is missing."""
    from concord.orchestrator.checkpoint import checkpoint_steps as control_steps

    if (run_dir / "summary.json").is_file():
        raise ProcessesError(f"{run_dir} holds a finished run (summary.json): nothing to resume")
    if cfg.spec.adaptive_graph == "feedback":
        raise ProcessesError(
            "--resume does not continue ada-feedback runs in the processes engine yet (the "
            "graph feedback's state is not checkpointed there); the vectorized engine does"
        )
    dirs = [run_dir, *(run_dir / "peers" / f"peer-{i}" for i in range(cfg.peers))]
    alive = {d.name: who for d in dirs if (who := holder(d)) is not None}
    if alive:
        raise ProcessesError(
            f"cannot resume {run_dir}: processes of the interrupted run still write it ("
            + "; ".join(f"{name}: {who}" for name, who in alive.items())
            + "); stop them first"
        )
    held = {"orchestrator": control_steps(run_dir)}
    for i in range(cfg.peers):
        held[f"peer-{i}"] = set(checkpoint_steps(run_dir / "peers" / f"peer-{i}"))
    common = set.intersection(*held.values())
    if not common:
        listed = ", ".join(f"{who}: {sorted(steps) or 'none'}" for who, steps in held.items())
        raise ProcessesError(
            f"cannot resume {run_dir}: no checkpoint step held by every process ({listed}); "
            "the run was interrupted before its first evaluation — start it again"
        )
    return max(common)


def refill_run_metrics(cfg: RunConfig, run_dir: Path, after: int) -> int:
    """Before a resume: the run's ``metrics.jsonl`` up to step ``after``. The orchestrator
    writes a step's record once every peer reported it (or `MetricsTable.lag` steps later), so
    the records of the last steps before an interruption may be missing there while every
    peer's own file holds them (a checkpoint flushes them first). They are rebuilt from the
    peers' records, with the orchestrator's arithmetic. Returns the records added."""
    path = run_dir / "metrics.jsonl"
    truncate_metrics(path, after)
    written = read_metrics(run_dir) if path.is_file() else []
    last = {
        kind: max((r.step for r in written if isinstance(r, kind)), default=-1)
        for kind in (StepRecord, EvalRecord)
    }
    per: dict[type, dict[int, dict[int, dict[str, float]]]] = {StepRecord: {}, EvalRecord: {}}
    for i in range(cfg.peers):
        peer_dir = run_dir / "peers" / f"peer-{i}"
        if not (peer_dir / "metrics.jsonl").is_file():
            continue
        for r in read_metrics(peer_dir):
            kind = type(r)
            if isinstance(r, StepRecord) and r.extra.get("stage", "train") != "train":
                continue
            if last[kind] < r.step <= after:
                per[kind].setdefault(r.step, {})[i] = _values(r)
    rows: list[MetricsRecord] = [step_record(s, v) for s, v in sorted(per[StepRecord].items())]
    rows += [eval_record(s, v) for s, v in sorted(per[EvalRecord].items())]
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(r.to_json()) + "\n" for r in rows)
    return len(rows)


def _values(record: MetricsRecord) -> dict[str, float]:
    """A peer's record as the numbers it publishes (`concord.protos.control_plane.Metrics`)."""
    return {
        k: float(v)
        for k, v in record.to_json().items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _run_processes(
    cfg: RunConfig,
    run_dir: Path,
    run_id: str,
    *,
    progress: bool,
    broker: str | None,
    after: int | None,
    placement: Placement | None = None,
) -> RunSummary:
    started = time.perf_counter()
    placement = placement or Loopback()
    broker = broker or placement.broker
    cfg = _store_on_placement(cfg, placement)
    for stale in STALE_FILES:  # an earlier run's (`concord sim` refuses a reused --out first)
        (run_dir / stale).unlink(missing_ok=True)
    for i in range(cfg.peers):
        (run_dir / "peers" / f"peer-{i}" / "summary.json").unlink(missing_ok=True)
        (run_dir / "peers" / f"peer-{i}" / "error.json").unlink(missing_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    signing = signing_for(cfg, "monitor", run_id)
    auth = monitor_auth(cfg, broker)
    config_path = run_dir / "config.toml"
    config_path.write_text(to_toml(cfg), encoding="utf-8")
    children = Children(run_dir, cfg, placement)
    stop: list[str] = []
    # the monitor's MQTT client logs to the run, not to the terminal
    sink = open_log(run_dir / "logs" / "launcher.jsonl", run=run_id, role="launcher")
    try:
        if after is not None:
            added = refill_run_metrics(cfg, run_dir, after)
            log = structlog.get_logger("concord.sim.processes")
            log.info("run.resume", after_step=after, records_rebuilt=added)
        url = _start(children, cfg, run_dir, run_id, config_path, broker, after)
        monitor = Monitor(cfg.peers)
        with placement.monitor():
            asyncio.run(_follow(children, url, run_id, monitor, progress, stop, auth, signing))
        if stop:
            raise ProcessesError(f"stopped by {stop[0]}; every child process was terminated")
        end = time.monotonic() + 120
        while children.running() and not children.hopeless() and time.monotonic() < end:
            time.sleep(0.1)
        failed = children.failed()
    finally:
        children.stop()
        sink.close()
    if "orchestrator" in failed or len(failed) == cfg.peers:
        raise ProcessesError(failure_message(run_dir, cfg, failed))
    return finish(cfg, run_dir, started, failed)


def _start(
    children: Children,
    cfg: RunConfig,
    run_dir: Path,
    run_id: str,
    config_path: Path,
    broker: str | None,
    after: int | None = None,
) -> str:
    resume = [] if after is None else ["--resume-step", str(after)]
    orch_args = ["orchestrator", "--config", str(config_path), "--out", str(run_dir)]
    orch_args += ["--run-id", run_id] + (["--broker", broker] if broker else []) + resume
    orch = children.start("orchestrator", orch_args + metrics_listen(cfg, 0))
    info = run_dir / "orchestrator.json"
    end = time.monotonic() + 60
    while not info.is_file():
        if orch.poll() is not None or time.monotonic() > end:
            out = (run_dir / "logs" / "orchestrator.out").read_text(errors="replace")[-2000:]
            raise ProcessesError(f"the orchestrator did not start:\n{out}")
        time.sleep(0.05)
    url = str(json.loads(info.read_text())["broker"])
    for i in range(cfg.peers):
        args = ["peer", "--config", str(config_path), "--id", str(i), "--broker", url]
        listen = f"{children.placement.address(f'peer-{i}')}:0"
        args += ["--run-id", run_id, "--listen", listen]
        args += ["--out", str(run_dir / "peers" / f"peer-{i}"), *resume]
        children.start(f"peer-{i}", args + metrics_listen(cfg, 1 + i))
    return url


def metrics_listen(cfg: RunConfig, offset: int) -> list[str]:
    """``--metrics-listen`` of the child at ``offset`` (orchestrator 0, peer i 1 + i): on one
    host each needs its own port, ``metrics.listen``'s port + offset (port 0: a free one each,
    which every child finds by itself)."""
    if cfg.metrics.listen is None:
        return []
    host, _, port = cfg.metrics.listen.rpartition(":")
    if int(port) == 0:
        return []
    if int(port) + offset > 65535:
        raise ConfigError([("metrics.listen", f"port {port} + {offset} children exceeds 65535")])
    return ["--metrics-listen", f"{host}:{int(port) + offset}"]


def child_errors(
    run_dir: Path, cfg: RunConfig, failed: Mapping[str, int] | None = None
) -> dict[str, str]:
    """name → why, for every child that recorded giving up: the orchestrator's ``error`` in
    orchestrator-summary.json, a peer's error.json; for a ``failed`` child that recorded
    nothing (it died before it could: an exception at start-up), the last line it printed —
    a traceback's last line names the exception and its message."""
    found: dict[str, str] = {}
    with contextlib.suppress(ValueError):  # an unreadable record says nothing
        orch = read_orchestrator_summary(run_dir)
        if orch is not None and orch.error:
            found["orchestrator"] = orch.error
    for i in range(cfg.peers):
        with contextlib.suppress(OSError, ValueError):
            path = run_dir / "peers" / f"peer-{i}" / "error.json"
            why = json.loads(path.read_text()).get("error")
            if why:
                found[f"peer-{i}"] = str(why)
    for name in failed or {}:
        if name not in found and (words := last_words(run_dir / "logs" / f"{name}.out")):
            found[name] = words
    return found


def last_words(path: Path, limit: int = 400) -> str | None:
    """The last non-blank line of a child's output (at most ``limit`` characters)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [x.strip() for x in tail.splitlines() if x.strip()]
    return lines[-1][:limit] if lines else None


def failure_message(run_dir: Path, cfg: RunConfig, failed: Mapping[str, int]) -> str:
    """What `concord sim` prints when children failed: which (exit statuses), where their logs
    are, each one's own error, and — last, where a terminal leaves the eye — the error of the
    child that matters most: the orchestrator's, else the lowest failed peer's."""
    errors = child_errors(run_dir, cfg, failed)
    exits = ", ".join(f"{name} exit {code}" for name, code in failed.items())
    head = f"child processes failed ({exits}); logs: {run_dir / 'logs'} and each log.jsonl"
    order = sorted(errors, key=lambda n: (n not in failed, n != "orchestrator", _rank(n)))
    lines = [f"  {name}: {errors[name]}" for name in reversed(order)]
    return "\n".join([head, *lines])


def _rank(name: str) -> int:
    return int(name.removeprefix("peer-")) if name.startswith("peer-") else -1


def finish(cfg: RunConfig, run_dir: Path, started: float, failed: dict[str, int]) -> RunSummary:
    """Final evaluation from the peers' checkpoints, edges, partition, plots and summary."""
    peer_dirs = {i: run_dir / "peers" / f"peer-{i}" for i in range(cfg.peers)}
    summaries = {i: s for i, d in peer_dirs.items() if (s := read_peer_summary(d)) is not None}
    done = sorted(i for i, s in summaries.items() if s.completed)
    if not done:
        raise ProcessesError(
            f"no peer completed the run; see {run_dir / 'logs'}"
            + "".join(f"\n  {name}: {why}" for name, why in child_errors(run_dir, cfg).items())
        )
    data = load_task_data(cfg)
    parts = make_partition(cfg, data)
    task = ClassificationTask(cfg, done, device=torch.device("cpu"), data=data, parts=parts)
    buffers = []
    for row, i in enumerate(done):
        state = load_checkpoint(peer_dirs[i] / "checkpoint.pt")
        task.x[row].copy_(state["params"][0])
        if "buffers" in state:
            buffers.append(state["buffers"][0])
    if buffers:
        task.flat.load_buffers_flat(torch.stack(buffers))
    xi = consensus_distance(task.x)
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise ProcessesError(f"{run_dir} has no manifest.json: the orchestrator wrote none")
    final = task.eval_record(manifest.steps - 1, cfg.epochs, xi=xi, peers=True)
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(final.to_json()) + "\n")
    task_stats = task.partition_stats()
    (run_dir / "partition.json").write_text(json.dumps(task_stats, indent=2) + "\n")
    edges = [e for s in summaries.values() for e in s.bytes_per_edge]
    (run_dir / "edges.json").write_text(json.dumps(edges, indent=2) + "\n")
    orch = read_orchestrator_summary(run_dir)
    resumed = sorted({s.resumed_from_step for s in summaries.values() if s.resumed_from_step})
    summary = RunSummary(
        engine="processes",
        **cfg.summary_fields(),
        steps=manifest.steps,
        control_lagged=cfg.control.lagged,
        accuracy_avg_model=final.accuracy_avg_model,
        accuracy_worst_peer=final.accuracy_worst_peer,
        accuracy_mean_peer=final.accuracy_mean_peer,
        gossip_rounds_total=max(s.gossip_rounds_total for s in summaries.values()),
        bytes_sent_total=sum(s.bytes_sent_total for s in summaries.values()),
        bytes_raw_total=sum(s.bytes_raw_total for s in summaries.values()),
        final_consensus_distance=xi,
        # the partition this process built; every peer built its own from the same config
        partition_sha256=task_stats["sha256"],
        partition_mismatch=sorted(
            i
            for i, s in summaries.items()
            if s.partition_sha256 not in (None, task_stats["sha256"])
        ),
        peers_completed=done,
        peers_dropped=[] if orch is None else orch.peers_dropped,
        children_failed=failed,
        children_errors=child_errors(run_dir, cfg),
        control_fallbacks=sum(s.control_fallbacks for s in summaries.values()),
        wall_seconds=time.perf_counter() - started,
        run_dir=str(run_dir),
        # `concord sim --resume`: every peer from the same step
        resumed_from_step=resumed[0] if resumed else None,
    )
    (run_dir / "summary.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    from concord.runtime.plots import write_plots

    with contextlib.suppress(Exception):  # plots never lose a finished run's numbers
        write_plots(run_dir)
    return summary
