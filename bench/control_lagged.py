"""Part 2 of ``bench/control.py`` (its docstring describes the method): lagged consensus control
against none, in alternating blocks of one real run (orchestrator + peer processes), with an
optional passive observer of the control plane for the wait diagnostics."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt

from bench.control_barrier import TIMEOUT, ms
from concord.protos.control_plane import ROOT as TOPIC_ROOT
from concord.protos.control_plane import (
    Decision,
    Metrics,
    PayloadError,
    Stats,
    decode,
)
from concord.protos.mqtt import client

HIDDEN = [1024, 1024]  # 40·1024 + 1024·1024 + 1024·10 + biases ≈ 1.09 M parameters
SAMPLES = 8000
SKIP = 3  # steps at the start of every block of the overhead run left out (the transition)


def lagged_config(
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
        wait_median_ms=ms(list(waits.values())),
        wait_p90_ms=ms(list(waits.values()), 0.9),
        rounds_per_step=summary["gossip_rounds_total"] / summary["steps"],
        fallbacks=int(summary["control_fallbacks"]),
        blocks=blocks,
        spread=observer.spread(cfg.peers, on),
        spread_uncontrolled=observer.spread(cfg.peers, off),
        decide=observer.decide(cfg.peers),
        wait_peers=wait_peers,
        wait_orchestrator=wait_orchestrator,
    )
