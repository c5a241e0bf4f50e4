"""Part 1 of ``bench/control.py`` (its docstring describes the method): the barrier decision's
round trip — the real orchestrator against synthetic peers that use the real peer's control
client — and its baseline, an MQTT ping-pong between two processes through the same broker.
Also the helpers both parts share (`TIMEOUT`, `ms`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from concord.peer.control import ControlClient
from concord.protos.control_plane import (
    TOPICS,
    Decision,
    Stats,
)
from concord.protos.mqtt import client

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 30.0  # seconds any single network wait may take before the bench gives up
# the baseline's two hops at the QoS the contract sends stats and decisions with
PING_QOS, PONG_QOS = TOPICS["stats"].qos, TOPICS["decision"].qos


def _quiet_logs() -> None:
    """Bus sessions log through structlog: warnings and worse to stderr, nothing else."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def ms(values: list[float], q: float = 0.5) -> float:
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
