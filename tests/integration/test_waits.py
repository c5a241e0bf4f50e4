"""Every wait has an end (`concord.peer.control.ControlClient.give_up`, the orchestrator's
``broker_lost_timeout``): real processes, a real Mosquitto, small timeouts set with ``--set``.

Time bounds: a process must end within its timeout plus ``SLACK`` seconds. The slack covers what
the timeout does not count — a peer's start-up (importing torch, building its data: 5-15 s on the
loaded 2-core CI machine), the watchdog's 0.25 s polling, the stage's current step finishing
(a step is ~0.1 s here), the transport's and the MQTT session's closing (≤ 5 s each) — with a
margin for the shared machine. The peer's start-up is excluded where the test can measure from an
event after it (the kill, the broker's end).

(d) a broker restart shorter than the timeout is survived:
``tests/integration/test_lifecycle.py::test_lagged_peers_keep_going_while_the_broker_is_away_and_control_resumes``
(lagged) and the barrier runs of
``test_peers_stop_waiting_for_a_crashed_orchestrator_and_finish`` use the default timeouts.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
from tests.integration.peers import lifecycle
from tests.integration.test_lifecycle import _training, _wait

SLACK = 30.0  # seconds (module docstring)
ABSENT = 4.0  # orchestrator.absent_timeout of these tests
LOST = 5.0  # orchestrator.broker_lost_timeout of these tests


@pytest.fixture
def broker() -> Iterator[MosquittoBroker]:
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed; scripts/bootstrap installs it (root, Debian)")
    b = MosquittoBroker()
    b.start()
    yield b
    b.stop()


def _config(path: Path, peers: int, extra: str = "") -> Path:
    path.write_text(
        f'name = "waits"\npeers = {peers}\nepochs = 50\n'
        "[dataset]\nsamples = 3000\n[optim]\nmilestones = []\n"
        "[orchestrator]\nheartbeat = 0.2\nliveness_timeout = 3\n"
        f"absent_timeout = {ABSENT}\nbroker_lost_timeout = {LOST}\n"
        "[network]\ndeadline = 3\nstartup_timeout = 300\n" + extra
    )
    return path


def _start(tmp: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    log = open(tmp / f"{name}.out", "wb")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [sys.executable, "-m", "concord.lab.cli", *args], stdout=log, stderr=subprocess.STDOUT
    )


def _peer(tmp: Path, config: Path, i: int, url: str) -> subprocess.Popen[bytes]:
    out = tmp / f"peer-{i}"
    args = ["peer", "--config", str(config), "--id", str(i), "--broker", url]
    return _start(tmp, f"peer-{i}", [*args, "--listen", "127.0.0.1:0", "--out", str(out)])


def _error(run_dir: Path) -> str:
    record = json.loads((run_dir / "error.json").read_text())
    assert record["completed"] is False
    return str(record["error"])


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def test_a_peer_with_no_orchestrator_gives_up_after_absent_timeout(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    """(a) bound: ABSENT + SLACK from launch (start-up included); startup_timeout is 300 s, so
    only the absence ends it."""
    config = _config(tmp_path / "run.toml", 2)
    t0 = time.monotonic()
    peer = _peer(tmp_path, config, 0, broker.url)
    try:
        code = peer.wait(timeout=ABSENT + SLACK)
    finally:
        _reap([peer])
    took = time.monotonic() - t0
    print(f"peer exited {code} after {took:.1f} s")
    assert code == 1, (tmp_path / "peer-0.out").read_text()[-3000:]
    why = _error(tmp_path / "peer-0")
    assert "never seen" in why
    assert "absent_timeout" in why
    assert not (tmp_path / "peer-0" / "error.json.tmp").exists()
    assert lifecycle(tmp_path / "peer-0") == ["joining", "failed"]  # no schedule ever came


def test_peers_give_up_on_an_orchestrator_killed_before_training(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    """(b) the orchestrator SIGKILLed once every peer is admitted (manifest written: the peers
    wait for a stage or have just begun calibrating): its Last-Will says "offline" and every peer
    exits 1 with its record within ABSENT + SLACK of the kill."""
    extra = '[control]\nmode = "constant"\nfactor = 0.5\n'
    config = _config(tmp_path / "run.toml", 2, extra)
    orch = _start(
        tmp_path,
        "orchestrator",
        [
            "orchestrator",
            "--config",
            str(config),
            "--broker",
            broker.url,
            "--out",
            str(tmp_path / "orch"),
        ],
    )
    peers = [_peer(tmp_path, config, i, broker.url) for i in range(2)]
    try:
        _wait(lambda: (tmp_path / "orch" / "manifest.json").is_file(), 120, "the manifest")
        orch.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        codes = [p.wait(timeout=ABSENT + SLACK) for p in peers]
        took = time.monotonic() - killed
    finally:
        _reap([orch, *peers])
    print(f"peers exited {codes} {took:.1f} s after the kill")
    assert codes == [1, 1], (tmp_path / "peer-0.out").read_text()[-3000:]
    for i in range(2):
        why = _error(tmp_path / f"peer-{i}")
        assert "offline" in why


def test_a_broker_gone_for_good_ends_the_run_with_error_records(
    tmp_path: Path, broker: MosquittoBroker
) -> None:
    """(c) orchestrator + 2 peers on an external Mosquitto killed mid-run for good: every one
    exits 1 with its record within LOST + SLACK of the broker's end, and none is left (psutil)."""
    config = _config(tmp_path / "run.toml", 2)
    args = ["orchestrator", "--config", str(config), "--broker", broker.url]
    orch = _start(tmp_path, "orchestrator", [*args, "--out", str(tmp_path / "orch")])
    peers = [_peer(tmp_path, config, i, broker.url) for i in range(2)]
    procs = [orch, *peers]
    try:
        _wait(_training(tmp_path / "peer-0", 10), 180, "10 training steps")
        broker.stop()
        lost = time.monotonic()
        codes = [p.wait(timeout=LOST + SLACK) for p in procs]
        took = time.monotonic() - lost
        _, alive = psutil.wait_procs([psutil.Process(p.pid) for p in procs if p.poll() is None], 1)
    finally:
        _reap(procs)
    print(f"orchestrator, peers exited {codes} {took:.1f} s after the broker's end")
    assert alive == []
    assert codes == [1, 1, 1], (tmp_path / "orchestrator.out").read_text()[-3000:]
    summary = json.loads((tmp_path / "orch" / "orchestrator-summary.json").read_text())
    assert summary["completed"] is False
    assert "broker_lost_timeout" in summary["error"]
    for i in range(2):
        assert "broker_lost_timeout" in _error(tmp_path / f"peer-{i}")
