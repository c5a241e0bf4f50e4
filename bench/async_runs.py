"""One contender's run of ``bench/async.py`` on this host's loopback: 8 processes computing at
different speeds (`Settings.factors`), optionally with churn (`Churn`).

* Concord: 8 static ``concord peer`` processes (``network.addresses``, no orchestrator and no
  broker), each with a config of its own: with `Settings.device_ms` the same
  ``network.device`` in every one (`concord.peer.pace.DeviceTime`: peer i's step takes
  factors[i] × device_ms), else differing only in ``network.straggler``
  (`concord.peer.pace.Straggler`: one slow peer per config). A killed
  static peer restarted with the same command resumes from its checkpoint and, when its
  neighbours went far past it, adopts a neighbour's parameters and step
  (`concord.peer.rejoin`, ``network.rejoin_fetch_after``).
* DDP: 8 ranks of ``bench/_ddp.py`` (gloo on 127.0.0.1) with ``--slow-factors`` (and
  ``--device-ms``); under churn
  the killed ranks break the collective and the others stop with an error: reported as it is
  (no torchrun elastic restart is set up).

Read from a run (`Run` of ``bench/time_to_accuracy.py``): the worst-peer accuracy curve on the
wall clock (`worst_curve`), the mean staleness of mixed neighbour information (the step
records' ``staleness_mean``; 0 for the synchronous contenders, which never mix stale
information), the idle fraction (`Run.detail` ``idle_fraction``) and, with emulated devices,
``overrun_fraction`` (the cycles whose CPU exceeded the device time ÷ the cycles measured);
Concord also ``local_steps`` and ``final_acc_per_peer`` (rank order).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._procs import ROOT, concord, jsonl, reap, spawn, steps, tail, wait_for
from bench.chaos_runs import write_config
from bench.time_to_accuracy import Contender, Run, _float, _wait
from concord.core.records import EvalRecord, StepRecord
from concord.runtime.records import read_metrics

RUN_TIMEOUT = 900.0  # seconds one run may take
Popen = subprocess.Popen[bytes]


@dataclass(frozen=True)
class Churn:
    """``victims`` are SIGKILLed when the reference peer (``ref``, a fast peer that is no
    victim) has done ``kill_at`` of its steps, and started again with the same command at
    ``restart_at``."""

    victims: tuple[int, ...] = (2, 5)
    kill_at: float = 0.3
    restart_at: float = 0.6
    ref: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.kill_at < self.restart_at < 1:
            raise ValueError(
                f"churn: need 0 < kill_at < restart_at < 1; got {self.kill_at}, {self.restart_at}"
            )
        if self.ref in self.victims:
            raise ValueError(f"churn: the reference peer {self.ref} cannot be a victim")

    def schedule(self, total_steps: int) -> tuple[int, int]:
        """The reference peer's step counts at which the victims are killed and restarted."""
        kill = max(1, round(self.kill_at * total_steps))
        return kill, max(kill + 1, round(self.restart_at * total_steps))


@dataclass(frozen=True)
class Settings:
    """What every run of the matrix shares: the config overrides ``sets`` (peers, data, model,
    schedule, seed), the per-peer slowdowns ``factors``, and ``churn`` (None: none).
    ``device_ms``: the factors are emulated devices (peer i's step takes factors[i] ×
    ``device_ms``: ``network.device``, ``bench/_ddp.py --device-ms``), else CPU stretches
    (``network.straggler``, ``--slow-factors``)."""

    out: Path
    sets: tuple[str, ...]
    factors: tuple[float, ...]
    total_steps: int
    churn: Churn | None = None
    device_ms: float | None = None  # emulated devices (``network.device``), else stragglers


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 just now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


Curve = list[tuple[int, float, float]]  # (step, seconds, accuracy), as `Run.curve`


def worst_curve(per_peer: Mapping[int, Sequence[tuple[int, float, float]]]) -> Curve:
    """The worst peer's accuracy over wall time: at each evaluation (step, seconds, accuracy) of
    any peer, in time order, the lowest of every peer's latest accuracy — once every peer has
    evaluated. Asynchronous peers evaluate at different times; this is what a user polling all
    of them would see as the worst model at that moment."""
    events = sorted((t, step, i, acc) for i, rows in per_peer.items() for step, t, acc in rows)
    latest: dict[int, float] = {}
    out = []
    for t, step, i, acc in events:
        latest[i] = acc
        if len(latest) == len(per_peer):
            out.append((step, t, min(latest.values())))
    return out


def _kill(procs: Mapping[int, Popen], victims: Sequence[int]) -> None:
    for i in victims:
        if procs[i].poll() is None:
            os.kill(procs[i].pid, signal.SIGKILL)
            procs[i].wait(30)


def apply_churn(
    s: Settings,
    progress: Callable[[], int],
    procs: dict[int, Popen],
    restart: Callable[[int], Popen] | None,
) -> dict[str, Any]:
    """Run `Settings.churn` against ``procs`` (``progress()``: the reference's steps so far;
    ``restart(i)``: a new process for victim i, or None when the contender cannot restart)."""
    churn = s.churn
    if churn is None:
        raise ValueError("apply_churn: these settings have no churn")
    kill, back = churn.schedule(s.total_steps)
    events: dict[str, Any] = {"kill_step": kill, "restart_step": back}

    def due() -> bool:  # the kill step reached, or a process ended first (then no churn)
        return progress() >= kill or any(p.poll() is not None for p in procs.values())

    if not wait_for(due, RUN_TIMEOUT, poll=0.1) or progress() < kill:
        return events
    _kill(procs, churn.victims)
    events["killed_at"] = time.time()
    if restart is None:
        return events
    wait_for(lambda: progress() >= back or procs[churn.ref].poll() is not None,
             RUN_TIMEOUT, poll=0.1)  # fmt: skip
    for i in churn.victims:
        procs[i] = restart(i)
    events["restarted_at"] = time.time()
    return events


def _peer_eval_curve(peer_dir: Path) -> tuple[list[tuple[int, float, float]], dict[str, float]]:
    """A peer's own evaluations (step, Unix time of its step's end, accuracy) and its totals:
    ``start`` (Unix time its first step began), ``end``, ``wait_s`` (blocked on rounds and on
    control), ``steps`` (its step records), ``staleness`` (mean of ``staleness_mean``, when
    its records have it)."""
    records = read_metrics(peer_dir)
    times: dict[int, float] = {}
    wait = 0.0
    steps = 0
    stale: list[float] = []
    cycles = overruns = 0.0
    start = end = None
    for r in records:
        if isinstance(r, StepRecord) and "time" in r.extra:
            t = _float(r.extra["time"])
            times[r.step] = t
            t0 = t - _float(r.extra.get("step_ms", 0.0)) / 1e3
            start = t0 if start is None else min(start, t0)
            end = t if end is None else max(end, t)
            wait += sum(_float(r.extra.get(k, 0.0)) for k in ("wait_ms", "control_wait_ms")) / 1e3
            wait += r.wait_s or 0.0
            steps += 1
            if r.staleness_mean is not None:
                stale.append(r.staleness_mean)
            if "device_overrun" in r.extra and _float(r.extra.get("device_cpu_ms", 0.0)) > 0:
                cycles += 1  # the first step has no measured cycle
                overruns += _float(r.extra["device_overrun"])
    curve = [
        (r.step, times[r.step], r.accuracy_mean_peer)
        for r in records
        if isinstance(r, EvalRecord) and r.step in times and r.accuracy_mean_peer is not None
    ]
    totals = {"start": start or 0.0, "end": end or 0.0, "wait_s": wait, "steps": float(steps),
              "device_cycles": cycles, "device_overruns": overruns}  # fmt: skip
    if curve:
        totals["final_acc"] = curve[-1][2]
    if stale:
        totals["staleness"] = statistics.fmean(stale)
    return curve, totals


def read_concord(run: Run, peers_dir: Path, n: int) -> None:
    """Fill ``run`` from the peers' records: the worst-peer curve (seconds since the earliest
    peer's first step), ``train_s``, and in ``detail`` ``idle_fraction`` (mean over peers of
    the time blocked on gossip ÷ its wall time), ``staleness`` and ``local_steps`` (every
    peer's step records, in rank order)."""
    curves: dict[int, Curve] = {}
    totals: list[dict[str, float]] = []
    for i in range(n):
        curve, tot = _peer_eval_curve(peers_dir / f"peer-{i}")
        if not curve:
            run.detail.setdefault("no_evaluations", []).append(i)
            continue
        curves[i], totals = curve, [*totals, tot]
    if not totals:
        return
    t0 = min(t["start"] for t in totals)
    run.train_s = max(t["end"] for t in totals) - t0
    shifted = {i: [(s, t - t0, a) for s, t, a in c] for i, c in curves.items()}
    run.curve = worst_curve(shifted) if len(curves) == n else []
    run.detail["idle_fraction"] = round(
        statistics.fmean(t["wait_s"] / max(t["end"] - t["start"], 1e-9) for t in totals), 4
    )
    run.detail["local_steps"] = [int(t["steps"]) for t in totals]
    run.detail["final_acc_per_peer"] = [round(t.get("final_acc", float("nan")), 4)
                                        for t in totals]  # fmt: skip
    cycles = sum(t["device_cycles"] for t in totals)
    if cycles:
        run.detail["overrun_fraction"] = round(
            sum(t["device_overruns"] for t in totals) / cycles, 4
        )
    stale = [t["staleness"] for t in totals if "staleness" in t]
    if stale:  # synchronous peers mix no stale information and record none
        run.detail["staleness"] = round(statistics.fmean(stale), 3)


def _straggler(peer: int, factor: float) -> list[str]:
    if factor <= 1.0:
        return []
    return [f"network.straggler.peer={peer}", f"network.straggler.factor={factor}"]


def _device(s: Settings) -> list[str]:
    """Every peer's ``network.device`` overrides (the same in every peer's config)."""
    if s.device_ms is None:
        return []
    return [f"network.device.step_ms={s.device_ms:g}",
            f"network.device.factors={json.dumps(list(s.factors))}"]  # fmt: skip


def run_concord(s: Settings, c: Contender) -> Run:
    """Concord contender ``c``: 8 static peers on loopback, peer i computing ``s.factors[i]``
    times slower; `Churn` when ``s.churn``."""
    run = Run(c.name, True)
    d = s.out / c.name
    n = len(s.factors)
    addresses = [f"127.0.0.1:{p}" for p in free_ports(n)]
    sets = [*s.sets, *c.sets, f"network.addresses={json.dumps(addresses)}"]
    argv = {}
    for i, f in enumerate(s.factors):
        slow = _device(s) if s.device_ms is not None else _straggler(i, f)
        config = write_config(d / f"peer-{i}.toml", [*sets, *slow])
        argv[i] = concord("peer", "--config", str(config), "--id", str(i),
                          "--out", str(d / "peers" / f"peer-{i}"))  # fmt: skip

    def start(i: int) -> Popen:
        return spawn(argv[i], d / "logs" / f"peer-{i}.out")

    procs = {i: start(i) for i in range(n)}
    try:
        if s.churn is not None:
            ref = d / "peers" / f"peer-{s.churn.ref}" / "metrics.jsonl"
            run.detail["churn"] = apply_churn(s, lambda: steps(ref), procs, start)
        end = time.monotonic() + RUN_TIMEOUT
        codes = {i: _wait(p, end) for i, p in procs.items()}
    finally:
        reap([p.pid for p in procs.values() if p.poll() is None], grace=2.0)
    read_concord(run, d / "peers", n)
    done = run.detail.get("local_steps")
    if isinstance(done, list) and done:  # ÷ n·T: the global budget's overshoot (or per-peer: 1)
        run.detail["budget_used"] = round(sum(done) / (n * s.total_steps), 3)
    run.ok = all(v == 0 for v in codes.values()) and bool(run.curve)
    if not run.ok:
        bad = next((i for i, v in codes.items() if v != 0), 0)
        run.detail.update(exit_codes=codes, tail=tail(d / "logs" / f"peer-{bad}.out", 800))
    return run


def _rank_summary(path: Path) -> dict[str, Any] | None:
    """The summary a DDP rank printed last (``bench/_ddp.py``); None if it did not finish."""
    rows = [r for r in jsonl(path) if r.get("kind") == "summary"]
    return rows[-1] if rows else None


def read_ddp(run: Run, d: Path, n: int) -> None:
    """Fill ``run`` from rank 0's records and every rank's summary: the curve (seconds since
    the first barrier), ``train_s`` and ``idle_fraction`` (mean over ranks of the wall time
    neither computing on the main thread nor in the emulated slowdown ÷ the wall time: waiting
    for the collective, and for a CPU on a shared machine)."""
    rows = jsonl(d / "rank-0.jsonl")
    t0 = next((float(r["time"]) for r in rows if r.get("kind") == "start"), None)
    if t0 is not None:
        run.curve = [(int(r["step"]), float(r["time"]) - t0, float(r["accuracy"]))
                     for r in rows if r.get("kind") == "eval"]  # fmt: skip
        done = [float(r["time"]) for r in rows if r.get("kind") == "step"]
        run.train_s = max(done) - t0 if done else None
    sums = [_rank_summary(d / f"rank-{i}.out") for i in range(n)]
    idle = [
        max(0.0, x["train_seconds"] - x["compute_cpu_s"] - x["slow_sleep_s"]) / x["train_seconds"]
        for x in sums
        if x is not None and x.get("train_seconds")
    ]
    run.detail["idle_fraction"] = round(statistics.fmean(idle), 4) if idle else None
    run.detail["staleness"] = 0.0
    cycles = sum(x.get("device_cycles", 0) for x in sums if x is not None)
    if cycles:
        over = sum(x.get("device_overruns", 0) for x in sums if x is not None)
        run.detail["overrun_fraction"] = round(over / cycles, 4)


def run_ddp(s: Settings, c: Contender) -> Run:
    """DDP contender ``c`` (``c.hook``): 8 gloo ranks on loopback with ``s.factors``."""
    run = Run(c.name, True)
    d = s.out / c.name
    n = len(s.factors)
    config = write_config(d / "run.toml", list(s.sets))
    master = f"127.0.0.1:{free_ports(1)[0]}"
    factors = ",".join(f"{f:g}" for f in s.factors)
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs = {}
    for i in range(n):
        argv = [sys.executable, str(ROOT / "bench" / "_ddp.py"), "--config", str(config),
                "--rank", str(i), "--world", str(n), "--master", master,
                "--out", str(d / "rank-0.jsonl"), "--hook", c.hook,
                "--slow-factors", factors, "--device-ms", f"{s.device_ms or 0:g}"]  # fmt: skip
        procs[i] = spawn(argv, d / f"rank-{i}.out", env=env)
    try:
        if s.churn is not None:
            ref = d / "rank-0.jsonl"
            progress = lambda: steps(ref)  # noqa: E731
            run.detail["churn"] = apply_churn(s, progress, procs, None)
        end = time.monotonic() + RUN_TIMEOUT
        codes = {i: _wait(p, end) for i, p in procs.items()}
    finally:
        reap([p.pid for p in procs.values() if p.poll() is None], grace=2.0)
    read_ddp(run, d, n)
    run.ok = all(v == 0 for v in codes.values()) and bool(run.curve)
    if not run.ok:
        run.detail.update(exit_codes=codes, tail=tail(d / "rank-0.out", 600))
    return run
