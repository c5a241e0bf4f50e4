"""``concord sim --engine processes --net`` and ``concord net``: a small run behind emulated
links (every process in a namespace of its own) finishes and leaves no namespace; a launcher
killed with SIGKILL leaves its namespaces, which ``concord net cleanup`` removes with every process
inside; Ctrl-C tears everything down; without CAP_NET_ADMIN one line says so before anything is
made; ``concord net check`` measures a profile within its fidelity targets. Real namespaces,
links, broker and processes; skipped where namespaces are not permitted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from concord.lab.net import PREFIX, available, namespaces

_ok, _why = available()
pytestmark = pytest.mark.skipif(not _ok, reason=f"emulated network unavailable: {_why}")

CONCORD = [sys.executable, "-m", "concord.lab.cli"]
SMALL = "[network.emulation]\ndelay_ms = 5\nrate_mbit = 100\n"  # 20 ms RTT between two peers
TINY = ["peers=2", "epochs=1", "dataset.samples=1000"]


def _sim(out: Path, net: Path, *sets: str) -> list[str]:
    args = [*CONCORD, "sim", "--engine", "processes", "--net", str(net), "--quiet"]
    args += ["--reference", "none", "--out", str(out)]
    for item in (*TINY, *sets):
        args += ["--set", item]
    return args


def _owned(pid: int) -> list[str]:
    """The namespaces of the run launched as process ``pid``."""
    return [n for n in namespaces() if n.startswith(f"{PREFIX}{pid}-")]


def test_a_run_behind_emulated_links_finishes_and_leaves_nothing(tmp_path: Path) -> None:
    net = tmp_path / "net.toml"
    net.write_text(SMALL + "[network.emulation.peers.1]\ndelay_ms = 10\n")
    out = tmp_path / "run"
    launcher = subprocess.Popen(_sim(out, net), stderr=subprocess.PIPE, text=True)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peers_completed"] == [0, 1]
    config = (out / "config.toml").read_text()  # the run records the links it ran on
    assert "[network.emulation]" in config
    assert "[network.emulation.peers.1]" in config
    orchestrator = json.loads((out / "orchestrator.json").read_text())
    assert orchestrator["broker"].startswith("mqtt://10.")  # Mosquitto in its own namespace
    assert not _owned(launcher.pid)


def test_the_torch_data_plane_runs_behind_emulated_links(tmp_path: Path) -> None:
    """The orchestrator's rendezvous store is announced at its emulated address (its host name
    means nothing in a peer's namespace) and gloo binds the emulated link: without either the
    peers wait for the store until the launcher gives up."""
    net = tmp_path / "net.toml"
    net.write_text(SMALL)
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        _sim(out, net, "network.transport=torch"), stderr=subprocess.PIPE, text=True
    )
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peers_completed"] == [0, 1]
    stores = [
        json.loads(line)
        for line in (out / "log.jsonl").read_text().splitlines()
        if "orchestrator.torch_store" in line
    ]
    assert [s["address"].startswith("10.") for s in stores] == [True], stores
    assert 'store_host = "10.' in (out / "config.toml").read_text()
    assert not _owned(launcher.pid)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _pids(names: list[str]) -> set[int]:
    out: set[int] = set()
    for name in names:
        listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        out |= {int(p) for p in listed.stdout.split()}
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _launch_and_train(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A long run behind emulated links, returned once its peers have taken two steps."""
    net = tmp_path / "net.toml"
    net.write_text(SMALL)
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        _sim(out, net, "epochs=50"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    metrics = out / "metrics.jsonl"
    try:
        _wait(lambda: metrics.is_file() and metrics.read_text().count('"step"') >= 2, 90, "steps")
    except BaseException:
        launcher.kill()
        raise
    return launcher


def test_ctrl_c_of_the_launcher_tears_everything_down(tmp_path: Path) -> None:
    launcher = _launch_and_train(tmp_path)
    try:
        owned = _owned(launcher.pid)
        inside = _pids(owned)
        launcher.send_signal(signal.SIGINT)
        code = launcher.wait(60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert code == 2  # "stopped by SIGINT"
    assert len(owned) == 6  # switch, 2 peers, broker, orchestrator, launcher
    assert not _owned(launcher.pid)
    assert not [p for p in inside if _alive(p)]


def test_kill_9_of_the_launcher_then_net_cleanup_leaves_nothing(tmp_path: Path) -> None:
    launcher = _launch_and_train(tmp_path)
    try:
        owned = _owned(launcher.pid)
        inside = _pids(owned)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert len(owned) == 6
    assert inside  # mosquitto, the emulator, the orchestrator, the peers
    assert set(_owned(launcher.pid)) == set(owned)  # a killed launcher tears nothing down
    done = subprocess.run([*CONCORD, "net", "cleanup"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in owned)
    assert not _owned(launcher.pid)
    _wait(lambda: not [p for p in inside if _alive(p)], 15, "the processes inside to end")


def test_net_check_measures_a_profile_within_the_targets(tmp_path: Path) -> None:
    """5 ms one way per link (20 ms RTT), 3 % loss per link direction (5.9 % a → b: 5 000
    datagrams lose ≈ 295, binomial σ ≈ 6 % of the loss, the target ±20 % is 3.5 σ), 100 Mbit/s."""
    net = tmp_path / "net.toml"
    net.write_text(SMALL + "loss = 0.03\n")
    done = subprocess.run(
        [*CONCORD, "net", "check", str(net), "--seconds", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    header, *lines = done.stdout.splitlines()
    assert header.split() == ["configured", "measured", "error", "target"]
    rows = {line.split()[0]: line.split()[1:] for line in lines}
    assert list(rows) == ["rtt_p50", "rtt_p99", "rate_a_to_b", "rate_b_to_a", "loss"]
    assert rows["rtt_p50"][:2] == ["20.00", "ms"]
    assert abs(float(rows["rtt_p50"][2]) - 20.0) <= 2.0  # measured, ms
    assert rows["rate_a_to_b"][:2] == ["100.00", "Mbit/s"]
    assert rows["loss"][:2] == ["5.910", "%"]  # 1 - 0.97²
    assert not any("OUTSIDE" in line for line in lines)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
def test_without_cap_net_admin_one_line_says_what_is_missing_and_nothing_is_made(
    tmp_path: Path,
) -> None:
    """As user nobody (no CAP_NET_ADMIN): exit 2, one line naming root / CAP_NET_ADMIN and
    the step refused, before the run directory or any namespace exists."""
    out = tmp_path / "run"
    before = set(namespaces())
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run(
        [*nobody, *CONCORD, "sim", "--net", "edge", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: --net needs network namespaces (root or CAP_NET_ADMIN)")
    assert "not permitted" in done.stderr
    assert not out.exists()
    assert set(namespaces()) <= before
