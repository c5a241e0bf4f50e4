"""What `concord sim` (processes engine) finds out before it starts n children: an unreachable
or refusing broker within `PROBE_TIMEOUT`, nothing written to --out; and, when a child fails
after all, that child's own error as the launcher's last line."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from concord.core.config import load_config
from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
from concord.protos.mqtt import mosquitto_hash
from concord.protos.reach import PROBE_TIMEOUT, BrokerUnreachableError, probe_broker
from concord.sim.processes import ProcessesError, run_processes


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "concord.lab.cli", *args],
        capture_output=True, text=True, timeout=300, check=False, cwd=cwd,
    )  # fmt: skip


def test_no_broker_fails_in_the_probe_time_before_any_child(tmp_path: Path) -> None:
    url = f"mqtt://127.0.0.1:{_closed_port()}"
    cfg = load_config(None, ["peers=8"], environ={})
    t0 = time.monotonic()
    with pytest.raises(ProcessesError, match=f"no MQTT broker answers at {url}"):
        run_processes(cfg, tmp_path / "run", progress=False, broker=url)
    took = time.monotonic() - t0
    # the probe itself is milliseconds (connection refused); the rest is loading the data
    # and building one replica, which every child would do too
    assert took <= PROBE_TIMEOUT, f"{took:.2f} s"
    assert not (tmp_path / "run").exists()  # nothing to clean up before the next attempt


def test_the_cli_says_it_and_leaves_no_out(tmp_path: Path) -> None:
    url = f"mqtt://127.0.0.1:{_closed_port()}"
    done = _cli("sim", "--broker", url, "--out", "runs/x", "--quiet", cwd=tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1].startswith(f"error: no MQTT broker answers at {url}")
    )
    assert not (tmp_path / "runs").exists()


def test_a_silent_listener_times_out_in_the_probe_time() -> None:
    """Something accepts TCP connections but never answers MQTT (a wrong port)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(BrokerUnreachableError, match=r"did not answer within 2 s"):
            probe_broker(f"mqtt://127.0.0.1:{port}")
        took = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()
    # tolerance: the timeout itself plus scheduling on a loaded 2-core machine
    assert PROBE_TIMEOUT - 0.1 <= took <= PROBE_TIMEOUT + 1.0, took


def test_a_refused_login_names_the_identity(tmp_path: Path) -> None:
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed; scripts/bootstrap installs it (root, Debian)")
    passwd = tmp_path / "passwd"
    passwd.write_text(f"monitor:{mosquitto_hash('right')}\n")
    passwd.chmod(0o600)
    (tmp_path / "monitor.password").write_text("wrong\n")
    (tmp_path / "monitor.password").chmod(0o600)
    broker = MosquittoBroker(password_file=passwd)
    broker.start()
    try:
        cfg = load_config(
            None,
            [
                "name=probe-test",
                "orchestrator.broker_username={identity}",
                f"orchestrator.broker_password_file={tmp_path}/{{identity}}.password",
            ],
            environ={},
        )
        t0 = time.monotonic()
        # Mosquitto 2 answers a wrong password with "not authorised" (CONNACK 5)
        refused = "refused the connection as 'monitor': (bad username or password|not authorised)"
        with pytest.raises(ProcessesError, match=refused):
            run_processes(cfg, tmp_path / "run", progress=False, broker=broker.url)
        assert time.monotonic() - t0 <= PROBE_TIMEOUT
    finally:
        broker.stop()
    assert not (tmp_path / "run").exists()


FLAKY = """
import os
from concord.core.data.datasets import load_dataset

def data(seed=0, **options):
    if os.environ.get("CONCORD_PARENT_PID"):  # in the children only: the launcher's check passes
        raise RuntimeError("the data disk is not mounted on this node")
    return load_dataset("mnist1d", seed=seed, num_samples=1000)
"""


def test_a_failing_child_s_own_error_is_the_last_line(tmp_path: Path) -> None:
    (tmp_path / "flaky_data.py").write_text(FLAKY)
    done = _cli(
        "sim", "--set", "peers=2", "--set", "dataset.name=flaky_data:data", "--quiet",
        "--reference", "none", "--out", "run", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:]
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("error: child processes failed (peer-0 exit 1, peer-1 exit 1)")
    assert lines[-1] == "  peer-0: RuntimeError: the data disk is not mounted on this node"
