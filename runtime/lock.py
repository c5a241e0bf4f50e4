"""One writer per run directory: ``.concord.lock``, held with ``flock`` for the writer's life.

Two processes appending to one ``metrics.jsonl`` or replacing one ``summary.json`` corrupt each
other's record without an error: a peer started twice with the same ``--out``, or a resumed run
(``concord sim --resume``) while a process of the interrupted one still lives. The kernel
releases the lock when its holder exits, however it exits (SIGKILL included), so a stale lock
file never blocks anyone. No torch here: the orchestrator's side imports this.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from concord.errors import RunDirBusyError

LOCK_FILE = ".concord.lock"


class DirLock:
    """Holds ``run_dir``'s lock (raises `RunDirBusyError` naming the holder if another has it)."""

    def __init__(self, run_dir: Path, role: str) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / LOCK_FILE
        self._file: IO[str] | None = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            self._file = None
            raise RunDirBusyError(
                f"{run_dir} is being written by another live process ({holder}); stop it, or "
                "use another directory"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{role}, pid {os.getpid()}\n")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the descriptor releases the lock
            self._file = None


def holder(run_dir: Path) -> str | None:
    """Who holds ``run_dir``'s lock now (its role and pid), None when nobody does."""
    path = run_dir / LOCK_FILE
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return f.read().strip() or "unknown"
    return None
