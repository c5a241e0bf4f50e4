"""One writer per run directory (`concord.runtime.lock`): a second writer is refused with the
holder named, and a holder killed with SIGKILL leaves nothing that blocks the next one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from concord.core.config import load_config
from concord.errors import RunDirBusyError
from concord.runtime.lock import DirLock, holder
from concord.runtime.rundir import RunWriter

HOLD = """
import sys, time
from pathlib import Path
from concord.runtime.lock import DirLock
lock = DirLock(Path(sys.argv[1]), "peer 3")
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_writer_is_refused_naming_the_holder(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        assert holder(tmp_path) == f"peer 3, pid {proc.pid}"
        cfg = load_config(None, [], environ={})
        with pytest.raises(
            RunDirBusyError, match=rf"another live process \(peer 3, pid {proc.pid}"
        ):
            RunWriter(tmp_path, cfg)
        assert not (tmp_path / "metrics.jsonl").exists()  # refused before writing anything
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        end = time.monotonic() + 5
        while holder(tmp_path) is not None and time.monotonic() < end:
            time.sleep(0.01)
        assert holder(tmp_path) is None  # the kernel released it with the process
        writer = RunWriter(tmp_path, cfg)  # the lock file left behind blocks nobody
        writer.close()
        assert holder(tmp_path) is None
    finally:
        proc.kill()
        proc.wait(10)


def test_release_lets_the_next_writer_in(tmp_path: Path) -> None:
    lock = DirLock(tmp_path, "launcher")
    with pytest.raises(RunDirBusyError):
        DirLock(tmp_path, "another")
    lock.release()
    DirLock(tmp_path, "another").release()
