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

``bench/_ddp.py`` slows the DDP baseline's rank the same way, so both sides of a comparison
carry the same straggler.
"""

from __future__ import annotations

import time
from dataclasses import replace

from concord.core.config import RunConfig
from concord.core.records import StepRecord
from concord.runtime.driver import RunHooks

__all__ = ["StepTime", "Straggler", "pace_hooks"]


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


def pace_hooks(cfg: RunConfig, peer_id: int) -> list[RunHooks]:
    """The hooks of peer ``peer_id``: `StepTime`, and `Straggler` when it is the slow one."""
    hooks: list[RunHooks] = [StepTime()]
    s = cfg.network.straggler
    if s is not None and s.peer == peer_id and s.factor > 1.0:
        hooks.append(Straggler(s.factor))
    return hooks
