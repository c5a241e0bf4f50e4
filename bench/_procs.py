"""Processes of real runs for benchmarks: ``concord`` commands, spawning them marked with a tag,
finding (and ending) every process that carries the tag, polling run files.

A *tag* is an environment variable (`TAG_VAR`) set to a random token in the benchmark's own
environment before anything is started: every descendant inherits it — launchers, the
orchestrators and peers they spawn, brokers — so `tagged` finds whatever is left behind, whoever
started it, and `reap` ends exactly those processes (never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TAG_VAR = "CONCORD_BENCH_TAG"


def set_tag() -> str:
    """Mark this process's environment (inherited by all it starts); returns the token."""
    token = os.environ.get(TAG_VAR) or f"{os.getpid()}-{secrets.token_hex(4)}"
    os.environ[TAG_VAR] = token
    return token


def _environ_has(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def with_env(name: str, value: str, *, exclude: Iterable[int] = ()) -> dict[int, str]:
    """pid → command line of every live (non-zombie) process whose environment holds
    ``name=value``, but those in ``exclude``."""
    entry = f"{name}={value}".encode()
    skip = {os.getpid(), *exclude}
    found = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) not in skip:
            pid = int(d.name)
            if _environ_has(pid, entry) and _alive(pid):
                found[pid] = cmdline(pid)
    return found


def tagged(token: str) -> dict[int, str]:
    """Live processes carrying this benchmark's tag (this process excluded)."""
    return with_env(TAG_VAR, token)


def launched_by(launcher: int) -> dict[int, str]:
    """Live children of a ``concord sim`` launcher (they carry CONCORD_PARENT_PID)."""
    return with_env("CONCORD_PARENT_PID", str(launcher))


def reap(pids: Iterable[int], *, grace: float = 5.0) -> None:
    """SIGTERM, then after ``grace`` seconds SIGKILL, exactly these processes."""
    pids = list(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def concord(*args: str) -> list[str]:
    """argv of a ``concord`` command run by this interpreter."""
    return [sys.executable, "-m", "concord.lab.cli", *args]


def sim_argv(
    out: Path, sets: Sequence[str], *, engine: str = "processes", broker: str | None = None
) -> list[str]:
    argv = concord("sim", "--engine", engine, "--quiet", "--reference", "none", "--out", str(out))
    if broker is not None:
        argv += ["--broker", broker]
    for item in sets:
        argv += ["--set", item]
    return argv


def spawn(
    argv: Sequence[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | str = ROOT,
    popen: Callable[..., subprocess.Popen[bytes]] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, stdout and stderr appended to ``log``;
    ``popen``: a Popen-like starter instead of `subprocess.Popen` (e.g. `netns.Host.run`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    kw: dict[str, Any] = {
        "cwd": str(cwd),
        "env": {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        "start_new_session": True,
    }
    with open(log, "ab") as f:
        return (popen or subprocess.Popen)(list(argv), stdout=f, stderr=subprocess.STDOUT, **kw)


def wait_for(predicate: Callable[[], bool], timeout: float, poll: float = 0.05) -> bool:
    """Poll until ``predicate()`` holds (True) or ``timeout`` seconds pass (False)."""
    end = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(poll)


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of ``path`` (a partly written last line is left out)."""
    rows: list[dict[str, Any]] = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return rows
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows


def steps(path: Path) -> int:
    """Step records in a metrics.jsonl so far."""
    try:
        return path.read_text(errors="replace").count('"kind": "step"')
    except OSError:
        return 0


def timestamp(row: dict[str, Any]) -> float | None:
    """A log record's ``timestamp`` (ISO 8601, UTC) as seconds since the epoch."""
    ts = row.get("timestamp")
    if not isinstance(ts, str):
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""
