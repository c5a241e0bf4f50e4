"""Signals to a process and its descendants: freeze (`stall`), thaw (`resume`), `kill`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any


def _procs_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _pid(proc: subprocess.Popen[Any] | int) -> int:
    return proc if isinstance(proc, int) else proc.pid


def send_signal(proc: subprocess.Popen[Any] | int, sig: int, tree: bool) -> None:
    """Send ``sig`` to ``proc`` and, with ``tree``, to all its descendants."""
    for pid in _procs_tree(_pid(proc)) if tree else [_pid(proc)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def stall(proc: subprocess.Popen[Any] | int, *, tree: bool = True) -> None:
    """Freeze ``proc`` (and, with ``tree``, its descendants) with SIGSTOP: its sockets stay open
    and the kernel still accepts connections and buffers data for it, but it answers nothing."""
    send_signal(proc, signal.SIGSTOP, tree)


def resume(proc: subprocess.Popen[Any] | int, *, tree: bool = True) -> None:
    """Undo `stall` (SIGCONT)."""
    send_signal(proc, signal.SIGCONT, tree)


def kill(proc: subprocess.Popen[Any] | int, *, tree: bool = True, timeout: float = 10.0) -> None:
    """SIGKILL ``proc`` (and its descendants); a `subprocess.Popen` is also reaped."""
    send_signal(proc, signal.SIGKILL, tree)
    if isinstance(proc, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout)
