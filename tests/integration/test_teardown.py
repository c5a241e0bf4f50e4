"""A finished peer whose teardown hangs still ends: within `TEARDOWN_LIMIT` it logs where every
asyncio task waits, writes its summary (``teardown_stuck``) and exits with the run's code —
before, such a peer hung until the launcher killed it, its summary never written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.peers import write_config
from tests.integration.test_peers import TINY

# a peer whose wait for the run's end never returns, with the limit cut to 2 s
STUCK_PEER = """
import asyncio, sys
import concord.peer.app as app
from concord.peer.coordination import StaticCoordination
from concord.lab.cli import main

async def never(self, summary):
    await asyncio.Event().wait()

app.TEARDOWN_LIMIT = 2.0
StaticCoordination.leave = never
sys.exit(main(sys.argv[1:]))
"""


def test_a_peer_stuck_after_training_writes_its_summary_and_exits(tmp_path: Path) -> None:
    config = write_config(tmp_path / "run.toml", 2, f"epochs = 1\n{TINY}")

    def command(i: int) -> list[str]:
        args = [
            "peer",
            "--config",
            str(config),
            "--id",
            str(i),
            "--out",
            str(tmp_path / f"peer-{i}"),
        ]
        return [sys.executable, "-c", STUCK_PEER, *args]

    procs = [
        subprocess.Popen(command(i), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for i in range(2)
    ]
    t0 = time.monotonic()
    try:
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0]
    assert time.monotonic() - t0 < 90  # not the 60 s "stop" wait, not forever
    for i in range(2):
        summary = json.loads((tmp_path / f"peer-{i}" / "summary.json").read_text())
        assert summary["completed"]
        assert summary["teardown_stuck"]
        lines = (tmp_path / f"peer-{i}" / "log.jsonl").read_text().splitlines()
        (stuck,) = [json.loads(x) for x in lines if "peer.teardown_stuck" in x]
        assert "never" in stuck["tasks"]  # where it waited
