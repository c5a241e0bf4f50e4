"""Process hygiene for the children of ``concord sim`` (stdlib only, no torch).

`die_with_parent` asks Linux to send SIGTERM to this process when the process that started it
dies — even by SIGKILL, which gives the parent no chance to clean up — so a killed launcher never
leaves orphaned peers or orchestrators behind. The launcher passes its pid in
``CONCORD_PARENT_PID``; without it (a peer started by hand) nothing is done.
"""

from __future__ import annotations

import ctypes
import os
import signal

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
