"""Process hygiene for the children of ``concord sim`` (stdlib only, no torch).

`die_with_parent` asks Linux to send SIGTERM to this process when the process that started it
dies — even by SIGKILL, which gives the parent no chance to clean up — so a killed launcher never
leaves orphaned peers or orchestrators behind. The launcher passes its pid in
``CONCORD_PARENT_PID``; without it (a peer started by hand) nothing is done.

`task_stacks` / `dump_tasks` (``kill -USR1 <pid>``): where every asyncio task of a process
waits, for one that looks stuck.
"""

from __future__ import annotations

import asyncio
import ctypes
import io
import os
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(environ: dict[str, str] | None = None) -> bool:
    """Arm the parent-death signal; returns whether it was armed. If the parent is already gone
    (it died between our start and this call) exit at once."""
    env = os.environ if environ is None else environ
    parent = env.get("CONCORD_PARENT_PID")
    if not parent or not parent.isdigit():
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc/Linux: the launcher's own signal handling has to do
        return False
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return False
    if os.getppid() != int(parent):
        os._exit(143)
    return True


def task_stacks(limit: int = 12) -> str:
    """Every asyncio task of the running loop and where it waits, as text."""
    out = io.StringIO()
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} asyncio tasks ---", file=out)
    for task in tasks:
        print(f"task {task.get_name()}:", file=out)
        # the chain of awaits, innermost last (`Task.print_stack` shows the outer frame only,
        # and raises on a frame without a line number — grpc's compiled coroutines)
        coro: Any = task.get_coro()
        for _ in range(limit):
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is None:
                break
            code = frame.f_code
            print(f"  {code.co_filename}:{frame.f_lineno or '?'} in {code.co_name}", file=out)
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out.getvalue()


def dump_tasks() -> None:
    """``kill -USR1 <pid>``: `task_stacks` on stderr (for a process that looks stuck)."""
    sys.stderr.write(task_stacks())
    sys.stderr.flush()
