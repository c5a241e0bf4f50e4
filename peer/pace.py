"""The pace of a peer's steps: when each step ended, and an emulated slow peer.

* `StepTime` stamps every step record with ``time`` (in its ``extra``), the Unix time (seconds)
  at which the step's parameters existed: benchmarks line the evaluations of several processes up
  on one wall clock with it (``bench/time_to_accuracy.py``).
* `Straggler` (``network.straggler = {peer = P, factor = F}``, `concord.core.config`) makes peer P
  a machine F times slower: before each step it sleeps (F − 1) × the CPU time its training thread
  spent on the previous step — the forward/backward pass, the optimizer and the codec work, all
  of which a slower processor would take F times as long for; time blocked on the network or the
  orchestrator costs no CPU and is not stretched. The sleep lies inside the step's clock (after
  `concord.peer.app`'s step clock starts), so the record's ``step_ms`` includes it, and the record
  says how long it was (``straggler_sleep_ms``). The first step is not slowed (nothing measured
  yet). The vectorized engine has no per-peer clock and ignores the setting.

* `DeviceTime` (``network.device = {step_ms = D, factors = [F0, F1, …]}``) runs peer i as if on
  a device of its own that takes F_i × D wall seconds per step: before each step it sleeps
  max(0, F_i·D − c), c the CPU time its training thread spent since its previous sleep ended
  (the previous step, the evaluation after it, the codec work; time blocked on the network
  costs none). A cycle whose c exceeds F_i·D — the host too slow or too loaded to emulate that
  device — is an *overrun*: it is not slept for, and the record says so (``device_overrun`` 1,
  ``device_sleep_ms``, ``device_cpu_ms``). Unlike `Straggler`'s stretch of the CPU time, the
  pace does not depend on the host's: on a host of C cores, n peers stepping at once need n·c
  CPU, so a stretch of c bounds every peer by C cores, while device time stays F_i·D whenever
  n·c ÷ (F_i·D) stays well under C. The sleep lies inside the step's clock; the first step is
  not slowed (nothing measured yet). Evaluations cost no device time unless they overrun.

``bench/_ddp.py`` slows the DDP baseline's rank the same ways (``--slow-factors``,
``--device-ms``), so both sides of a comparison carry the same straggler or devices.
"""

from __future__ import annotations

import time
from dataclasses import replace

from concord.core.config import RunConfig
from concord.core.records import StepRecord
from concord.runtime.driver import RunHooks

__all__ = ["DeviceTime", "StepTime", "Straggler", "device_sleep", "pace_hooks"]


class StepTime(RunHooks):
    """Adds ``time`` (Unix seconds at the step's end) to every step record."""

    def after(self, step: int, record: StepRecord) -> StepRecord:
        return replace(record, extra={**record.extra, "time": time.time()})


class Straggler(RunHooks):
    """Stretches this peer's computation by ``factor`` (module docstring)."""

    def __init__(self, factor: float) -> None:
        if not factor >= 1.0:
            raise ValueError(f"straggler factor must be ≥ 1; got {factor!r}")
        self.factor = factor
        self._cpu0 = 0.0
        self._owed = 0.0  # seconds to sleep before the next step
        self._slept = 0.0

    def before(self, step: int) -> None:
        self._slept = 0.0
        if self._owed > 0:
            t0 = time.perf_counter()
            time.sleep(self._owed)
            self._slept = time.perf_counter() - t0
        self._cpu0 = time.thread_time()

    def after(self, step: int, record: StepRecord) -> StepRecord:
        cpu = time.thread_time() - self._cpu0
        self._owed = (self.factor - 1.0) * cpu
        return replace(record, extra={**record.extra, "straggler_sleep_ms": self._slept * 1e3})


def device_sleep(device_s: float, cpu_s: float) -> tuple[float, bool]:
    """How long to sleep so that a cycle of ``cpu_s`` CPU seconds takes ``device_s`` of wall
    time, and whether it overran (``cpu_s`` > ``device_s``: no sleep)."""
    if not device_s > 0:
        raise ValueError(f"device time must be > 0; got {device_s!r}")
    if cpu_s < 0:
        raise ValueError(f"CPU time must be ≥ 0; got {cpu_s!r}")
    return max(0.0, device_s - cpu_s), cpu_s > device_s


class DeviceTime(RunHooks):
    """Runs this peer as a device taking ``factor`` × ``step_ms`` per step (module docstring)."""

    def __init__(self, step_ms: float, factor: float) -> None:
        if not step_ms > 0:
            raise ValueError(f"device step_ms must be > 0; got {step_ms!r}")
        if not factor >= 1.0:
            raise ValueError(f"device factor must be ≥ 1; got {factor!r}")
        self.device_s = factor * step_ms / 1e3
        self._mark: float | None = None  # thread CPU time when the last sleep ended
        self._slept = self._cpu = 0.0
        self._overrun = False
        self.cycles = self.overruns = 0

    def before(self, step: int) -> None:
        self._slept = self._cpu = 0.0
        self._overrun = False
        if self._mark is not None:
            self._cpu = time.thread_time() - self._mark
            owed, self._overrun = device_sleep(self.device_s, self._cpu)
            self.cycles += 1
            self.overruns += self._overrun
            if owed > 0:
                t0 = time.perf_counter()
                time.sleep(owed)
                self._slept = time.perf_counter() - t0
        self._mark = time.thread_time()

    def after(self, step: int, record: StepRecord) -> StepRecord:
        extra = {
            "device_sleep_ms": self._slept * 1e3,
            "device_cpu_ms": self._cpu * 1e3,
            "device_overrun": float(self._overrun),
        }
        return replace(record, extra={**record.extra, **extra})


def pace_hooks(cfg: RunConfig, peer_id: int) -> list[RunHooks]:
    """The hooks of peer ``peer_id``: `DeviceTime` with ``network.device``, `StepTime`, and
    `Straggler` when it is the slow one."""
    hooks: list[RunHooks] = []
    d = cfg.network.device
    if d is not None:
        if peer_id >= len(d.factors):
            raise ValueError(f"network.device.factors has no factor for peer {peer_id}")
        hooks.append(DeviceTime(d.step_ms, d.factors[peer_id]))
    hooks.append(StepTime())
    s = cfg.network.straggler
    if s is not None and s.peer == peer_id and s.factor > 1.0:
        hooks.append(Straggler(s.factor))
    return hooks
