"""The tiny ring that the restart tests share (``test_rejoin.py``, ``test_async_restart.py``):
4 `concord peer` processes on loopback training a small MLP on 800 samples (10 steps an epoch
a peer), the deadline they use, and reading and awaiting a peer's step records. The fixture that
kills what a test started, ``started``, is in ``conftest.py``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

DEADLINE = 1.0  # network.deadline: short, so that a missing peer costs little


def tiny_ring(algorithm: str, epochs: int, *, engine: str | None = None) -> str:
    """The run's top-level keys and tables (a TOML fragment; more tables may follow)."""
    engine_line = f'engine = "{engine}"\n' if engine else ""
    return (
        f'topology = "ring"\nalgorithm = "{algorithm}"\n{engine_line}seed = 3\n'
        f"epochs = {epochs}\n"
        '[dataset]\nsamples = 800\n[model]\nname = "mlp"\nhidden = [32]\n'
        '[control]\nmode = "none"\n'
    )


def records(path: Path, kind: str = "step") -> list[dict[str, Any]]:
    """The records of ``kind`` in a peer's ``metrics.jsonl`` (none before it exists)."""
    lines = path.read_text().splitlines() if path.is_file() else []
    return [r for r in map(json.loads, filter(str.strip, lines)) if r.get("kind") == kind]


def wait_steps(path: Path, steps: int, timeout: float) -> None:
    """Wait until the peer's ``metrics.jsonl`` holds ``steps`` step records."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if len(records(path)) >= steps:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} has fewer than {steps} steps after {timeout} s")
