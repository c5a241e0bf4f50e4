"""The control plane's cost, with Mosquitto and with the orchestrator's embedded amqtt broker, all
measured in one run on this machine.

1. **Barrier decision round trip.** The real orchestrator (``python -m concord.lab.cli
   orchestrator``, a separate process; with ``--broker`` pointing at a private Mosquitto, or
   without it so that it embeds amqtt in its own event loop) runs a one-phase plan under adaptive
   control with a tiny factor (1e-9): every round is above target, so the orchestrator answers
   "repeat" after every round up to ``max_rounds`` — every round needs a decision. ``--peers``
   synthetic peers in this process play the peer side with the real peer's control client
   (`concord.peer.control.ControlClient`: retained status "ready" with address, steps per epoch
   and fingerprint, heartbeats, the schedule and the "train" start, decisions); per round every
   synthetic peer publishes its `Stats` at the same instant and waits for the `Decision` of that
   (step, round), following repeat/stop; at the end status "done" and the orchestrator exits.
   RTT sample = from the *last* stats publish of the round to the decision's arrival at a peer
   (its message handler); median and p90 over peers and rounds, the first step discarded (warm-up).
   "To the first peer" is the same from the round's first arrival (the synthetic peers share
   this process's event loop, so decisions reach them one after another).
   Baseline through the same broker (taken while the orchestrator waits for its peers): plain
   MQTT ping-pong between two NODELAY clients in two processes, one broker pass each way at the
   QoS the contract gives stats and decisions (0) — the same two hops as stats → orchestrator →
   decision.
2. **Lagged-control overhead.** ``concord.sim.processes.run_processes``: orchestrator + 4 peer
   processes, ring, D-SGD, ~1.09M-parameter MLP on mnist1d, 1 torch thread each, evaluation only
   at the end.
   The run's plan has ``--blocks`` phases (LR milestones at i/blocks): phase 1 warms up (not timed),
   then controlled (adaptive, ``lagged = true``, factor 1e6) and uncontrolled blocks alternate
   *within one run*, starting with a controlled block in odd repeats and with an uncontrolled one in
   even repeats (so neither side always comes first). The factor keeps exactly one round per step,
   so communication is identical; in a controlled step the peers' per-step metrics message
   carries their statistics (`concord.protos.control_plane.Metrics`) and they take
   the rounds from the decision that closed step t − lag, in an uncontrolled step the control hook
   is not called at all (`concord.core.loop`), which is what ``control.mode = "none"`` runs.
   Comparing blocks of one run removes the between-run variance of this shared 2-CPU machine
   (separate runs of the same config differ by up to ±8 % in step time, more than the 3 % to
   resolve). Step time = the peers' own ``step_ms`` (wall time of the step, control waits included;
   the arrival times of the metrics over MQTT are no clock: publishing is deferred to the peer's
   event loop); the first ``SKIP`` steps of every block are left out;
   overhead fraction = mean over controlled steps / mean over uncontrolled steps − 1, per run,
   median over ``--repeats`` runs. One run per ``control.lag`` in ``--lags`` and repeat (default
   lags 1 and 2; the headline ``lagged_overhead_fraction`` is the largest lag's): with lag 1 a
   step needs every peer's previous step, a global barrier a peer meets after its step's first
   round, with lag 2 the decision a peer needs is published long before it asks
   (`concord.core.control.controller`).
   Also: the mean ``control_wait_ms`` per controlled step (time peers blocked on the
   orchestrator), and with ``--observe`` (a passive MQTT client on a
   thread of this process; it receives every statistic and decision and so takes CPU from the peers:
   off by default) how far apart the peers finish a step, how long the orchestrator takes from the
   last peer's stats of a step to its decision while the peers compute, and the split of each wait
   into "for the slowest peer's stats" and "for the decision after them" (a wait ends with the
   decision's arrival, so it began at decision − wait).

Targets (printed, never asserted): barrier RTT ≤ 5 ms median with Mosquitto; lagged overhead
≤ 0.03. Last line: a JSON object with ``barrier_rtt_ms_mosquitto`` and ``lagged_overhead_fraction``
(the Mosquitto one), the same for the embedded broker and the baselines.

    python bench/control.py [--peers 8] [--steps 50] [--max-rounds 20] [--lagged-peers 4]
                            [--lagged-steps 280] [--blocks 7] [--repeats 5] [--lags 1,2]
                            [--quick] [--keep DIR] [--run-timeout 600]

The numbers are only comparable within one run: on a shared 2-vCPU machine they move by ±20 %.
The table's header prints the 1-minute load average before and after (this bench alone takes it
to about 6 on 2 CPUs); a high "before" means other work shared the CPUs and the run says little.
An overhead run that does not finish within ``--run-timeout`` is stopped (children terminated).
One overhead run differs from the next by about ±0.02 even when both block kinds are uncontrolled
(an A/A check), hence the median over 5 repeats by default; the whole bench takes ~15 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiomqtt  # noqa: E402
import structlog  # noqa: E402

from concord.orchestrator.broker import MosquittoBroker  # noqa: E402
from concord.peer.control import ControlClient  # noqa: E402
from concord.protos.control_plane import ROOT as TOPIC_ROOT  # noqa: E402
from concord.protos.control_plane import (  # noqa: E402
    TOPICS,
    Decision,
    Metrics,
    PayloadError,
    Stats,
    decode,
)
from concord.protos.mqtt import client  # noqa: E402

HIDDEN = [1024, 1024]  # 40·1024 + 1024·1024 + 1024·10 + biases ≈ 1.09 M parameters
SAMPLES = 8000
TIMEOUT = 30.0  # seconds any single network wait may take before the bench gives up
SKIP = 3  # steps at the start of every block of the overhead run left out (the transition)
# the baseline's two hops at the QoS the contract sends stats and decisions with
PING_QOS, PONG_QOS = TOPICS["stats"].qos, TOPICS["decision"].qos


def _quiet_logs() -> None:
    """Bus sessions log through structlog: warnings and worse to stderr, nothing else."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _ms(values: list[float], q: float = 0.5) -> float:
    """Quantile ``q`` of seconds, in ms (inclusive method; the median for q = 0.5)."""
    if len(values) == 1:
        return values[0] * 1e3
    if q == 0.5:
        return statistics.median(values) * 1e3
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] * 1e3


# ---------------------------------------------------------------------------------------------
# 1a. Baseline: MQTT ping-pong between two processes


def _echo_child(url: str, ping: str, pong: str) -> None:
    asyncio.run(_echo(url, ping, pong))


async def _echo(url: str, ping: str, pong: str) -> None:
    tasks: set[asyncio.Task[None]] = set()
    async with asyncio.timeout(600), client(url, f"bench-echo-{uuid.uuid4().hex[:8]}") as c:
        await c.subscribe(ping, qos=1)
        async for m in c.messages:
            if m.payload == b"stop":
                break
            task = asyncio.create_task(c.publish(pong, m.payload, qos=PONG_QOS, timeout=5.0))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)


async def pingpong(url: str, count: int, warmup: int = 20) -> list[float]:
    """Seconds per ping → echo process → pong through the broker at ``url``, each hop at the
    QoS of the hop it stands for (stats, decision)."""
    base = f"bench/{uuid.uuid4().hex[:12]}"
    ping, pong = f"{base}/ping", f"{base}/pong"
    child = mp.get_context("spawn").Process(target=_echo_child, args=(url, ping, pong))
    child.start()
    samples: list[float] = []
    probe = b"probe".ljust(96, b".")  # about the size of an encoded Stats
    try:
        async with client(url, f"bench-ping-{uuid.uuid4().hex[:8]}") as c:
            await c.subscribe(pong, qos=1)  # deliveries at the publisher's QoS (≤ 1)
            messages = c.messages
            deadline = time.monotonic() + TIMEOUT
            while True:  # until the echo process is subscribed
                await c.publish(ping, probe, qos=1, timeout=5.0)
                try:
                    await asyncio.wait_for(anext(messages), 0.5)
                    break
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("the echo process never answered") from None
            pending: set[asyncio.Task[None]] = set()
            for i in range(warmup + count):
                payload = f"ping {i}".encode().ljust(96, b".")  # late probe answers never match
                t0 = time.perf_counter()
                task = asyncio.create_task(c.publish(ping, payload, qos=PING_QOS, timeout=5.0))
                pending.add(task)
                task.add_done_callback(pending.discard)
                while True:
                    m = await asyncio.wait_for(anext(messages), TIMEOUT)
                    if m.payload == payload:
                        break
                if i >= warmup:
                    samples.append(time.perf_counter() - t0)
            await c.publish(ping, b"stop", qos=1, timeout=5.0)
            if pending:
                await asyncio.wait(pending, timeout=5.0)
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.terminate()
            child.join(timeout=5)
    return samples


# ---------------------------------------------------------------------------------------------
# 1b. Barrier decision round trip: the real orchestrator, synthetic peers


def _barrier_config(n: int, max_rounds: int) -> str:
    return (
        f'name = "bench-control"\npeers = {n}\ntopology = "ring"\nalgorithm = "dsgd"\n'
        "epochs = 1\n[optim]\nmilestones = []\n"
        f'[control]\nmode = "adaptive"\nfactor = 1e-9\nphases = [1]\nmax_rounds = {max_rounds}\n'
    )


class SyntheticPeer(ControlClient):
    """One peer's control plane: the real peer's `concord.peer.control.ControlClient` (status,
    heartbeats, schedule, run control, decisions), stamping when each decision arrives."""

    def __init__(self, url: str, run_id: str, peer: int) -> None:
        self.step = 0
        super().__init__(url, run_id, peer, heartbeat=1.0, step=lambda: self.step)
        self.arrived: dict[tuple[int, int], float] = {}

    def _on_decision(self, d: Decision) -> None:
        self.arrived[(d.step, d.round)] = time.perf_counter()
        super()._on_decision(d)


Key = tuple[int, int]  # (step, round)


@dataclass
class RoundTimes:
    key: Key
    last_publish: float  # perf_counter of the round's last stats publish
    arrivals: list[float]  # perf_counter of the decision's arrival at each peer, sorted


@dataclass
class BarrierResult:
    url: str
    rounds: list[RoundTimes] = field(default_factory=list)  # the first step excluded
    pingpong: list[float] = field(default_factory=list)
    steps: int = 0
    rounds_total: int = 0
    orchestrator_exit: int | None = None

    @property
    def rtt(self) -> list[float]:
        return [t - r.last_publish for r in self.rounds for t in r.arrivals]

    @property
    def first(self) -> list[float]:
        return [r.arrivals[0] - r.last_publish for r in self.rounds]


async def _wait_until(predicate: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def _stamped(peer: SyntheticPeer, stats: Stats) -> float:
    t = time.perf_counter()
    await peer.bus.publish("stats", stats, peer.peer_id)
    return t


def barrier_rtt(
    broker: str | None, out: Path, n: int, max_rounds: int, steps: int, pings: int
) -> BarrierResult:
    """Run the orchestrator against ``n`` synthetic peers (module docstring, part 1)."""
    out.mkdir(parents=True, exist_ok=True)
    info = out / "orchestrator.json"
    config = out / "run.toml"
    config.write_text(_barrier_config(n, max_rounds))
    run_id = f"bench-control-{uuid.uuid4().hex[:8]}"
    args = [sys.executable, "-m", "concord.lab.cli", "orchestrator", "--config", str(config)]
    args += ["--out", str(out), "--run-id", run_id] + (["--broker", broker] if broker else [])
    env = {**os.environ, "CONCORD_PARENT_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    with open(out / "orchestrator.out", "wb") as log:
        orch = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
        end = time.monotonic() + 60
        while not info.is_file() and orch.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        if not info.is_file():
            raise RuntimeError(f"the orchestrator did not start; see {out / 'orchestrator.out'}")
        result = BarrierResult(str(json.loads(info.read_text())["broker"]))
        asyncio.run(_barrier(result, orch, run_id, n, steps, pings))
        return result
    finally:
        if orch.poll() is None:
            orch.terminate()
            try:
                orch.wait(timeout=10)
            except subprocess.TimeoutExpired:
                orch.kill()
                orch.wait(timeout=10)


async def _barrier(
    result: BarrierResult,
    orch: subprocess.Popen[bytes],
    run_id: str,
    n: int,
    steps: int,
    pings: int,
) -> None:
    _quiet_logs()
    result.pingpong = await pingpong(result.url, pings)
    await _play_peers(result.url, run_id, n, steps, result)
    await _wait_until(lambda: orch.poll() is not None, 60, "the orchestrator to exit")
    result.orchestrator_exit = orch.returncode


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, TIMEOUT)


async def _play_peers(url: str, run_id: str, n: int, steps: int, result: BarrierResult) -> None:
    peers = [SyntheticPeer(url, run_id, i) for i in range(n)]
    async with contextlib.AsyncExitStack() as stack:
        for p in peers:
            await stack.enter_async_context(p)
            if not await p.bus.wait_connected(TIMEOUT):
                raise TimeoutError(f"synthetic peer {p.peer_id} could not connect to {url}")
        for p in peers:
            address = f"127.0.0.1:{20000 + p.peer_id}"
            await p.status("ready", address=address, steps_per_epoch=steps, fingerprint="bench")
        await _wait_until(
            lambda: all(
                p.schedule is not None
                and p.control is not None
                and p.control.action == "start"
                and p.control.stage == "train"
                for p in peers
            ),
            60,
            "the schedule and the train start",
        )
        control, plan = peers[0].control, peers[0].plan
        total = (control.steps if control is not None else 0) or (
            plan.total_steps if plan is not None else steps
        )
        for p in peers:
            await p.status("training", stage="train", address=f"127.0.0.1:{20000 + p.peer_id}")
        for step in range(total):
            round_ = 1
            while True:
                times, decision = await _one_round(peers, step, round_)
                if step > 0:  # the first step warms up
                    result.rounds.append(times)
                result.rounds_total += 1
                if not decision.repeat:
                    break
                round_ += 1
            for p in peers:
                p.step = step + 1
        result.steps = total
        for p in peers:
            await p.status("done", stage="train")


async def _one_round(
    peers: list[SyntheticPeer], step: int, round_: int
) -> tuple[RoundTimes, Decision]:
    """Every synthetic peer publishes its stats at once, then all wait for the decision."""
    pubs = [
        asyncio.create_task(
            _stamped(p, Stats(peer=p.peer_id, step=step, round=round_, theta=1.0, grad_norm=1.0))
        )
        for p in peers
    ]
    got = await asyncio.gather(*(p.decision((step, round_), TIMEOUT) for p in peers))
    last = max(await asyncio.wait_for(asyncio.gather(*pubs), TIMEOUT))
    decisions = [d for d in got if d is not None]
    if len(decisions) != len(peers):
        raise TimeoutError(f"no decision for step {step} round {round_} within {TIMEOUT} s")
    if len({d.repeat for d in decisions}) != 1:
        raise RuntimeError(f"peers got different decisions for step {step} round {round_}")
    arrived = sorted(p.arrived.pop((step, round_)) for p in peers)
    return RoundTimes((step, round_), last, arrived), decisions[0]


# ---------------------------------------------------------------------------------------------
# 2. Lagged control against no control: real peer processes


def _lagged_config(
    n: int, steps: int, blocks: int, lag: int, first: int, hidden: list[int], samples: int
) -> Any:
    """``blocks`` phases; phases first, first + 2, … (first ∈ {2, 3}) under lagged control with
    ``control.lag = lag``; phase 1 is the warm-up."""
    from concord.core.config import build_config

    per_epoch = max(1, round(samples * 0.8 / n / 16))
    phases = list(range(first, blocks + 1, 2))
    control = {"mode": "adaptive", "lagged": True, "lag": lag, "factor": 1e6, "phases": phases}
    return build_config(
        {
            "name": f"bench-control-lag{lag}",
            "peers": n,
            "topology": "ring",
            "algorithm": "dsgd",
            "epochs": steps / per_epoch,
            "threads": 1,
            "dataset": {"samples": samples},
            "model": {"name": "mlp", "hidden": hidden},
            "optim": {"milestones": [i / blocks for i in range(1, blocks)], "warmup": 0.0},
            "control": control,
            "eval": {"every": 1000.0, "peers": False},
            "network": {"deadline": 30.0},
        }
    )


class RunObserver:
    """A passive MQTT client on its own thread and loop during a `run_processes` run (whose run
    id is made inside it, hence the ``+`` level): when each peer's per-step metrics and stats, and
    the orchestrator's decision of each step got here (`time.perf_counter`)."""

    def __init__(self, url: str | None, run_dir: Path, enabled: bool = True) -> None:
        self.enabled = enabled  # False: observes nothing (its figures stay empty)
        self.url = url
        self.run_dir = run_dir
        self.metrics: dict[int, list[float]] = {}
        self.stats: dict[int, list[float]] = {}
        self.decisions: dict[int, float] = {}
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-observer", daemon=True)

    def __enter__(self) -> RunObserver:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join(timeout=TIMEOUT)

    def _run(self) -> None:
        info = self.run_dir / "orchestrator.json"
        end = time.monotonic() + 120
        while self.url is None and not self._stop.is_set() and time.monotonic() < end:
            if info.is_file():
                self.url = str(json.loads(info.read_text())["broker"])
            else:
                time.sleep(0.02)
        try:
            if self.url is not None:
                asyncio.run(self._observe(self.url))
        except aiomqtt.MqttError as exc:  # an embedded broker ends with its run
            if not self.metrics:
                self.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # the run goes on; only these figures are missing
            self.error = f"{type(exc).__name__}: {exc}"

    async def _observe(self, url: str) -> None:
        async with client(url, f"bench-observer-{uuid.uuid4().hex[:8]}") as c:
            for kind in ("stats/+", "decision", "metrics/+"):
                await c.subscribe(f"{TOPIC_ROOT}/+/{kind}", qos=1)
            messages = c.messages
            while not self._stop.is_set():
                try:
                    m = await asyncio.wait_for(anext(messages), 0.2)
                except TimeoutError:
                    continue
                now = time.perf_counter()
                if not isinstance(m.payload, bytes) or not m.payload:
                    continue
                try:
                    message = decode(str(m.topic), m.payload)
                except PayloadError:
                    continue
                if isinstance(message, Stats) and message.stage == "train":
                    self.stats.setdefault(message.step, []).append(now)
                elif isinstance(message, Decision):
                    self.decisions[message.step] = now
                elif isinstance(message, Metrics) and message.event == "step":
                    self.metrics.setdefault(message.step, []).append(now)
                    if message.stats:  # lagged control: the step's statistics ride here
                        self.stats.setdefault(message.step, []).append(now)

    def spread(self, n: int, steps: set[int]) -> list[float]:
        """Per step of ``steps``: last − first peer's metrics arrival (how far apart peers finish
        a step)."""
        return [max(v) - min(v) for k, v in self.metrics.items() if k in steps and len(v) == n]

    def decide(self, n: int, warmup: int = 5) -> list[float]:
        """Per step: the last peer's stats → the decision (the orchestrator under load + hops)."""
        return [
            self.decisions[k] - max(v)
            for k, v in self.stats.items()
            if k >= warmup and len(v) == n and k in self.decisions
        ]

    def split_waits(
        self, waits: dict[tuple[int, int], float], n: int, lag: int, warmup: int = 5
    ) -> tuple[list[float], list[float]]:
        """Split each peer's wait at the start of step t (for the decision of step t − lag) into
        the part before the last peer's stats of t − lag arrived (waiting for the slowest peer)
        and the part after (waiting for the orchestrator's decision); seconds, per (peer, step).
        The wait ended with the decision (or the peer found it there), so it began at
        decision − wait; a wait that ended before the decision was published is all "peers"."""
        peers: list[float] = []
        orchestrator: list[float] = []
        for (_, t), wait in waits.items():
            seen, decided = self.stats.get(t - lag, []), self.decisions.get(t - lag)
            if t - lag < warmup or len(seen) != n or decided is None:
                continue
            after = min(wait, max(0.0, decided - max(seen)))
            peers.append(wait - after)
            orchestrator.append(after)
        return peers, orchestrator


@dataclass
class StepRun:
    step_s: float  # mean step time over controlled steps (RunObserver.durations)
    step_s_uncontrolled: float  # the same over uncontrolled steps
    steps_timed: tuple[int, int]  # (peer, step) samples: controlled, uncontrolled
    wait_ms: float  # mean control_wait_ms per controlled step over peers and steps
    wait_median_ms: float
    wait_p90_ms: float
    rounds_per_step: float
    fallbacks: int
    blocks: list[tuple[int, bool, float]]  # (phase, controlled, mean step seconds) per block
    spread: list[float]  # seconds, per controlled step (RunObserver.spread)
    spread_uncontrolled: list[float]
    decide: list[float]  # seconds, per step (RunObserver.decide); empty without control
    wait_peers: list[float]  # seconds, per (peer, step) (RunObserver.split_waits)
    wait_orchestrator: list[float]

    @property
    def overhead(self) -> float:
        return self.step_s / self.step_s_uncontrolled - 1.0


def lagged_run(
    cfg: Any, run_dir: Path, broker: str | None, timeout: float, observe: bool
) -> StepRun:
    """One `run_processes` run; after ``timeout`` seconds a SIGTERM to this process makes
    `run_processes` stop every child (its own Ctrl-C path) and this raises. ``observe``: run
    the `RunObserver` (its MQTT client takes CPU from the peers, so only for diagnosis)."""
    from concord.sim.processes import ProcessesError, run_processes

    fired = threading.Event()

    def expire() -> None:
        fired.set()
        os.kill(os.getpid(), signal.SIGTERM)

    watchdog = threading.Timer(timeout, expire)
    watchdog.daemon = True
    with RunObserver(broker, run_dir, enabled=observe) as observer:
        watchdog.start()
        try:
            summary = run_processes(cfg, run_dir, progress=False, broker=broker)
        except ProcessesError as exc:
            if fired.is_set():
                raise RuntimeError(f"{run_dir} did not finish within {timeout} s: {exc}") from None
            raise
        finally:
            watchdog.cancel()
    if observer.error:
        print(f"observer failed: {observer.error}", file=sys.stderr)
    phase: dict[int, int] = {}  # step → phase index
    took: dict[tuple[int, int], float] = {}  # (peer, step) → seconds (the peer's step_ms)
    waits: dict[tuple[int, int], float] = {}  # (peer, controlled step) → seconds
    controlled = set(cfg.control.phases)
    for i in range(cfg.peers):
        with open(run_dir / "peers" / f"peer-{i}" / "metrics.jsonl", encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("kind") == "step":
                    phase[rec["step"]] = rec["phase"]
                    took[(i, rec["step"])] = float(rec["step_ms"]) / 1e3
                    if rec["phase"] in controlled:
                        waits[(i, rec["step"])] = float(rec.get("control_wait_ms") or 0.0) / 1e3
    first = {p: min(k for k, q in phase.items() if q == p) for p in set(phase.values())}
    timed = {k for k, p in phase.items() if p > 1 and k >= first[p] + SKIP}  # 1: warm-up

    def durations(steps: set[int]) -> list[float]:
        return [t for (_, k), t in took.items() if k in steps]

    on = {k for k in timed if phase[k] in controlled}
    off = timed - on
    d_on, d_off = durations(on), durations(off)
    blocks = [
        (p, p in controlled, statistics.fmean(d))
        for p in sorted(first)
        if p > 1 and (d := durations({k for k in timed if phase[k] == p}))
    ]
    if not d_on or not d_off:
        raise RuntimeError(f"{run_dir}: no step times in the peers' metrics")
    wait_peers, wait_orchestrator = observer.split_waits(waits, cfg.peers, cfg.control.lag)
    return StepRun(
        step_s=statistics.fmean(d_on),
        step_s_uncontrolled=statistics.fmean(d_off),
        steps_timed=(len(d_on), len(d_off)),
        wait_ms=statistics.fmean(waits.values()) * 1e3,
        wait_median_ms=_ms(list(waits.values())),
        wait_p90_ms=_ms(list(waits.values()), 0.9),
        rounds_per_step=summary["gossip_rounds_total"] / summary["steps"],
        fallbacks=int(summary["control_fallbacks"]),
        blocks=blocks,
        spread=observer.spread(cfg.peers, on),
        spread_uncontrolled=observer.spread(cfg.peers, off),
        decide=observer.decide(cfg.peers),
        wait_peers=wait_peers,
        wait_orchestrator=wait_orchestrator,
    )


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--peers", type=int, default=8, help="synthetic peers (barrier RTT)")
    parser.add_argument("--steps", type=int, default=50, help="steps of the barrier run")
    parser.add_argument("--max-rounds", type=int, default=20, help="rounds per barrier step")
    parser.add_argument("--pings", type=int, default=300, help="timed MQTT ping-pongs")
    parser.add_argument("--lagged-peers", type=int, default=4, help="peer processes (overhead)")
    parser.add_argument("--lagged-steps", type=int, default=280, help="steps per overhead run")
    parser.add_argument(
        "--blocks", type=int, default=7, help="phases per run: a warm-up, then alternating blocks"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs of each overhead config (A/A noise ±0.02 each)"
    )
    parser.add_argument(
        "--lags",
        default="1,2",
        help="control.lag values measured (comma-separated); the headline is the largest",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--observe",
        action="store_true",
        help="watch the overhead runs over MQTT for the wait diagnostics (costs the peers CPU)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep run directories under DIR")
    parser.add_argument(
        "--run-timeout", type=float, default=600.0, help="seconds one overhead run may take"
    )
    args = parser.parse_args(argv)
    hidden, samples = HIDDEN, SAMPLES
    if args.quick:
        args.peers, args.steps, args.max_rounds, args.pings = 3, 4, 3, 30
        args.lagged_peers, args.lagged_steps, args.repeats, args.blocks = 2, 48, 1, 3
        hidden, samples = [64], 2000
    if min(args.peers, args.max_rounds, args.pings, args.repeats) < 1 or args.steps < 2:
        parser.error("--peers, --max-rounds, --pings, --repeats must be ≥ 1 and --steps ≥ 2")
    if args.lagged_peers < 2 or args.lagged_steps < 2:
        parser.error("--lagged-peers and --lagged-steps must be ≥ 2")
    if args.blocks < 3 or args.lagged_steps < args.blocks * (SKIP + 5):
        parser.error(
            f"--blocks must be ≥ 3 and each block needs ≥ {SKIP + 5} steps "
            f"(--lagged-steps ≥ {SKIP + 5} × --blocks)"
        )
    try:
        args.lag_list = sorted({int(x) for x in args.lags.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--lags must be comma-separated integers; got {args.lags!r}")
    if not args.lag_list or args.lag_list[0] < 1:
        parser.error(f"--lags must name at least one lag ≥ 1; got {args.lags!r}")
    barrier: dict[str, BarrierResult] = {}
    steps: dict[str, dict[str, list[StepRun]]] = {}
    args.load_before = os.getloadavg()[0]  # other work on the host shows here
    with contextlib.ExitStack() as stack:
        if args.keep is not None:  # a fresh directory per invocation: never stale files
            work = args.keep / time.strftime("control-%Y%m%d-%H%M%S")
            work.mkdir(parents=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-control-")))
        mosquitto = MosquittoBroker()
        mosquitto.start()
        stack.callback(mosquitto.stop)
        for name, url in (("mosquitto", mosquitto.url), ("embedded", None)):
            out = work / f"barrier-{name}"
            res = barrier[name] = barrier_rtt(
                url, out, args.peers, args.max_rounds, args.steps, args.pings
            )
            print(
                f"{name:>9}: barrier RTT median {_ms(res.rtt):.2f} ms, p90 "
                f"{_ms(res.rtt, 0.9):.2f} ms, {len(res.rtt)} samples ({res.rounds_total} "
                f"rounds, {res.steps} steps); MQTT ping-pong {_ms(res.pingpong):.2f} ms; "
                f"orchestrator exit {res.orchestrator_exit}",
                flush=True,
            )
            steps[name] = {_label(lag): [] for lag in args.lag_list}
            for rep in range(args.repeats):
                for lag in args.lag_list:
                    label = _label(lag)
                    cfg = _lagged_config(
                        args.lagged_peers,
                        args.lagged_steps,
                        args.blocks,
                        lag,
                        2 + rep % 2,
                        hidden,
                        samples,
                    )
                    run = lagged_run(
                        cfg,
                        work / f"steps-{name}-{label}-{rep}",
                        url,
                        args.run_timeout,
                        args.observe,
                    )
                    steps[name][label].append(run)
                    _say_run(name, label, rep, run)
    _report(args, barrier, steps)


def _label(lag: int) -> str:
    return f"lag{lag}"


def _say_run(name: str, label: str, rep: int, run: StepRun) -> None:
    head = f"{name:>9}: {label} run {rep + 1}:"
    print(
        f"{head} {run.step_s * 1e3:.2f} ms/step controlled, {run.step_s_uncontrolled * 1e3:.2f} "
        f"uncontrolled (overhead {run.overhead:+.4f}; {run.steps_timed[0]}/"
        f"{run.steps_timed[1]} peer-steps timed), {run.rounds_per_step:.2f} rounds/step, "
        f"{run.fallbacks} fallbacks; control wait mean {run.wait_ms:.2f} / median "
        f"{run.wait_median_ms:.2f} / p90 {run.wait_p90_ms:.2f} ms per controlled step",
        flush=True,
    )
    print(
        f"{head} block means "
        + " ".join(f"{'C' if c else 'U'}{t * 1e3:.1f}" for _, c, t in run.blocks)
        + " ms/step (C controlled, U uncontrolled)",
        flush=True,
    )
    if run.spread:
        print(
            f"{head} peers finish a step {_ms(run.spread):.2f} ms apart controlled, "
            f"{_ms(run.spread_uncontrolled):.2f} uncontrolled (medians)",
            flush=True,
        )
    if run.wait_peers:
        print(
            f"{head} last stats → decision {_ms(run.decide):.2f} ms (median); of the wait, "
            f"{statistics.fmean(run.wait_peers) * 1e3:.2f} ms for the slowest peer's stats, "
            f"{statistics.fmean(run.wait_orchestrator) * 1e3:.2f} ms for the decision after "
            "them (means per peer and step)",
            flush=True,
        )


def _report(
    args: argparse.Namespace,
    barrier: dict[str, BarrierResult],
    steps: dict[str, dict[str, list[StepRun]]],
) -> None:
    names = list(barrier)
    b = barrier
    lagged = [_label(lag) for lag in args.lag_list]
    head = lagged[-1]  # the headline: the largest lag measured

    def med(n: str, k: str, what: str) -> float:
        return statistics.median(getattr(r, what) for r in steps[n][k])

    def pooled(n: str, k: str, what: str) -> list[float]:
        return [x for r in steps[n][k] for x in getattr(r, what)]

    def mean_ms(n: str, k: str, what: str) -> float | None:
        values = pooled(n, k, what)
        return statistics.fmean(values) * 1e3 if values else None

    def row(label: str, cells: list[str]) -> None:
        print(f"  {label:<52}" + "".join(f"{c:>12}" for c in cells))

    def ms(values: list[float], q: float = 0.5) -> str:
        return f"{_ms(values, q):.2f}" if values else "-"

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print()
    print(
        f"barrier: {args.peers} synthetic peers, {args.steps} steps × {args.max_rounds} rounds; "
        f"overhead: {args.lagged_peers} peer processes, {args.lagged_steps} steps in "
        f"{args.blocks} alternating blocks, {args.repeats} run(s) per lag, 1 torch thread; "
        f"{os.cpu_count()} CPUs, load average {args.load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    row("", names)
    row("barrier decision RTT, median ms (target ≤ 5)", [ms(b[n].rtt) for n in names])
    row("barrier decision RTT, p90 ms", [ms(b[n].rtt, 0.9) for n in names])
    row("  to the first synthetic peer, median ms", [ms(b[n].first) for n in names])
    row(
        f"MQTT ping-pong QoS {PING_QOS}/{PONG_QOS}, median ms (baseline)",
        [ms(b[n].pingpong) for n in names],
    )
    row("barrier RTT ÷ ping-pong", [f"{_ms(b[n].rtt) / _ms(b[n].pingpong):.2f}" for n in names])
    for k in lagged:
        target = " (target ≤ 0.03)" if k == head else ""
        row(
            f"[{k}] step, uncontrolled blocks, ms",
            [f"{med(n, k, 'step_s_uncontrolled') * 1e3:.2f}" for n in names],
        )
        row(
            f"[{k}] step, lagged-control blocks, ms",
            [f"{med(n, k, 'step_s') * 1e3:.2f}" for n in names],
        )
        row(
            f"[{k}] lagged overhead fraction{target}",
            [f"{med(n, k, 'overhead'):+.4f}" for n in names],
        )
        row(
            f"[{k}]   … per run",
            ["/".join(f"{r.overhead:+.3f}" for r in steps[n][k]) for n in names],
        )
        row(
            f"[{k}] control_wait_ms per controlled step, mean",
            [f"{med(n, k, 'wait_ms'):.2f}" for n in names],
        )
        row(
            f"[{k}]   … for the slowest peer's stats, mean ms",
            [fmt(mean_ms(n, k, "wait_peers")) for n in names],
        )
        row(
            f"[{k}]   … for the decision after them, mean ms",
            [fmt(mean_ms(n, k, "wait_orchestrator")) for n in names],
        )
        row(
            f"[{k}] peers finish a step … ms apart, controlled",
            [ms(pooled(n, k, "spread")) for n in names],
        )
        row(f"[{k}]   … uncontrolled", [ms(pooled(n, k, "spread_uncontrolled")) for n in names])
        row(f"[{k}] last stats → decision, median ms", [ms(pooled(n, k, "decide")) for n in names])
        row(f"[{k}] gossip rounds per step", [f"{med(n, k, 'rounds_per_step'):.2f}" for n in names])
        row(f"[{k}] control fallbacks", [str(sum(r.fallbacks for r in steps[n][k])) for n in names])
    result: dict[str, Any] = {"benchmark": "control", "peers_barrier": args.peers}
    for n in names:
        result[f"barrier_rtt_ms_{n}"] = round(_ms(b[n].rtt), 3)
        result[f"barrier_rtt_p90_ms_{n}"] = round(_ms(b[n].rtt, 0.9), 3)
    for n in names:
        result[f"mqtt_pingpong_ms_{n}"] = round(_ms(b[n].pingpong), 3)
    for n in names:
        for k in lagged:
            result[f"step_ms_uncontrolled_{k}_{n}"] = round(
                med(n, k, "step_s_uncontrolled") * 1e3, 3
            )
            result[f"step_ms_{k}_{n}"] = round(med(n, k, "step_s") * 1e3, 3)
            result[f"lagged_overhead_fraction_{k}_{n}"] = round(med(n, k, "overhead"), 4)
            result[f"control_wait_ms_{k}_{n}"] = round(med(n, k, "wait_ms"), 3)
            for key, what in (("peers", "wait_peers"), ("decision", "wait_orchestrator")):
                v = mean_ms(n, k, what)
                result[f"control_wait_{key}_ms_{k}_{n}"] = None if v is None else round(v, 3)
            decide = pooled(n, k, "decide")
            result[f"lagged_decision_ms_{k}_{n}"] = round(_ms(decide), 3) if decide else None
        result[f"lagged_overhead_fraction_{n}"] = result[f"lagged_overhead_fraction_{head}_{n}"]
    result["lagged_overhead_fraction"] = result["lagged_overhead_fraction_mosquitto"]
    result.update(
        lagged_overhead_lag=args.lag_list[-1],
        lags=args.lag_list,
        steps_barrier=args.steps,
        max_rounds=args.max_rounds,
        peers_lagged=args.lagged_peers,
        steps_lagged=args.lagged_steps,
        blocks=args.blocks,
        repeats=args.repeats,
        quick=args.quick,
        load_average_before=round(args.load_before, 2),
        load_average_after=round(os.getloadavg()[0], 2),
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
