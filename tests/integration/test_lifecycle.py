"""``concord sim`` (processes engine) as a user runs it, in a subprocess: stopping it leaves no
orphans, a peer killed mid-run is dropped and the others finish on a repaired schedule, and
malformed control-plane payloads are rejected with a log line while the run goes on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiomqtt
import msgpack
import pytest

from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
from concord.protos.control_plane import SCHEMA_VERSION, Topics
from concord.protos.mqtt import client
from tests.records import orchestrator_summary

pytestmark = pytest.mark.slow  # ~30 s: the separate CI step (.ci/run)

BASE = [
    "dataset.samples=3000",
    "eval.every=1",
    "orchestrator.heartbeat=0.2",
    "orchestrator.liveness_timeout=3",
    "network.deadline=3",
]


def _launch(out: Path, *sets: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "concord.lab.cli", "sim", "--engine", "processes", "--quiet"]
    args += ["--reference", "none", "--out", str(out)]
    for item in (*BASE, *sets):
        args += ["--set", item]
    log = open(out.parent / f"{out.name}.launcher.out", "wb")  # noqa: SIM115 - child owns it
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)


def _children(parent: int) -> dict[int, str]:
    """pid → command line of every process started by ``parent`` (CONCORD_PARENT_PID)."""
    found = {}
    mark = f"CONCORD_PARENT_PID={parent}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().split()[2]
                if state != "Z":
                    found[int(entry.name)] = cmd
        except OSError:
            continue
    return found


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _step_lines(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"kind": "step"') if path.is_file() else 0


def _training(run: Path, n: int = 5) -> Callable[[], bool]:
    return lambda: _step_lines(run) >= n


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=str)
def test_stopping_the_launcher_stops_every_child(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "run"
    proc = _launch(out, "peers=3", "epochs=200")
    try:
        _wait(lambda: len(_children(proc.pid)) == 4, 60, "orchestrator + 3 peers")
        _wait(_training(out), 90, "training to start")
        children = _children(proc.pid)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
        _wait(lambda: not _children(proc.pid), 45, f"children {sorted(children)} to exit")
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _children(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert code == (-sig if sig == signal.SIGKILL else 2)
    if sig != signal.SIGKILL:
        text = (tmp_path / "run.launcher.out").read_text()
        assert f"stopped by {sig.name}" in text
        record = json.loads((out / "error.json").read_text())  # the run says why it ended
        assert record["role"] == "launcher"
        assert record["completed"] is False
        assert f"stopped by {sig.name}" in record["error"]


def test_a_killed_peer_is_dropped_and_the_others_finish_on_a_repaired_schedule(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    proc = _launch(out, "peers=4", "epochs=5", "control.max_rounds=3")
    try:
        _wait(_training(out, 20), 120, "20 steps")
        victim = next(pid for pid, cmd in _children(proc.pid).items() if "--id 2 " in cmd + " ")
        os.kill(victim, signal.SIGKILL)
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, (tmp_path / "run.launcher.out").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peers_completed"] == [0, 1, 3]
    assert summary["peers_dropped"] == [2]
    schedules = [json.loads(x) for x in (out / "schedules.jsonl").read_text().splitlines()]
    assert schedules[-1]["peers"] == [0, 1, 3]
    assert schedules[-1]["version"] == 2
    effective = schedules[-1]["effective_step"]
    for i in (1, 3):  # peer 2's ring neighbours: missing it for a while, then not any more
        rows = [json.loads(x) for x in (out / "peers" / f"peer-{i}" / "metrics.jsonl").open()]
        steps = [r for r in rows if r["kind"] == "step"]
        assert any(2 in r["missing"] for r in steps)
        assert not any(r["missing"] for r in steps if r["step"] >= effective + 1)
    assert summary["accuracy_avg_model"] > 0.3  # trained on (MNIST-1D, 10 classes: chance 0.1)


def test_malformed_control_payloads_are_rejected_and_logged(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _launch(out, "peers=3", "epochs=2")
    try:
        _wait(lambda: (out / "orchestrator.json").is_file(), 60, "the orchestrator")
        info = json.loads((out / "orchestrator.json").read_text())
        asyncio.run(_inject(info["broker"], Topics(info["run"]), proc))
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, (tmp_path / "run.launcher.out").read_text()[-3000:]
    orch_log = [json.loads(x) for x in (out / "log.jsonl").open()]
    rejected = {e["topic"].split("/")[3] for e in orch_log if e["event"] == "control.rejected"}
    assert {"stats", "metrics", "status"} <= rejected
    for i in range(3):
        peer = out / "peers" / f"peer-{i}"
        events = [json.loads(x) for x in (peer / "log.jsonl").open()]
        kinds = {e["topic"].split("/")[3] for e in events if e["event"] == "control.rejected"}
        assert {"decision", "control"} <= kinds, f"peer {i}: {kinds}"
        assert json.loads((peer / "summary.json").read_text())["completed"]


async def _inject(url: str, topics: Topics, proc: subprocess.Popen[bytes]) -> None:
    """Publish garbage (never retained) on every topic until the run is over."""

    def pack(d: dict[str, object]) -> bytes:
        return bytes(msgpack.packb(d))

    V = SCHEMA_VERSION  # all but the wrong-version payload fail on their fields

    garbage = [
        (topics.topic("stats", 0), b"\x00 not msgpack"),
        (topics.topic("stats", 1), pack({"v": V, "kind": "stats", "peer": 1, "step": -5})),
        (topics.topic("metrics", 0), pack({"v": V + 1, "kind": "metrics", "peer": 0, "step": 1})),
        (topics.topic("status", 2), pack({"v": V, "kind": "heartbeat", "peer": 2})),
        (topics.topic("decision"), pack({"v": 99, "kind": "decision", "step": 0})),
        (topics.topic("decision"), pack({"v": V, "kind": "decision", "repeat": "yes"})),
        (topics.topic("control"), pack({"v": V, "kind": "control", "action": "explode"})),
        (topics.topic("schedule"), pack({"v": V, "kind": "schedule", "version": 7})),
    ]
    with contextlib.suppress(aiomqtt.MqttError):  # the embedded broker ends with the run
        async with client(url, "rogue") as rogue:
            end = time.monotonic() + 150
            while proc.poll() is None and time.monotonic() < end:
                for topic, payload in garbage:
                    await rogue.publish(topic, payload, qos=0, retain=False)
                await asyncio.sleep(0.05)


def test_lagged_peers_keep_going_while_the_broker_is_away_and_control_resumes(
    tmp_path: Path,
) -> None:
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed; scripts/bootstrap installs it (root, Debian)")
    broker = MosquittoBroker()
    broker.start()
    out = tmp_path / "run"
    sets = ["peers=3", "epochs=20", "optim.milestones=[]", "control.lagged=true"]
    sets += ["control.factor=0.1"]  # one controlled phase over the whole run
    sets += ["orchestrator.liveness_timeout=10", f"orchestrator.broker={broker.url}"]
    proc = _launch(out, *sets)
    try:
        _wait(_training(out, 30), 120, "30 steps")
        broker.stop()  # the broker goes away mid-run …
        time.sleep(1.5)
        restarted = MosquittoBroker(port=broker.port)  # … and comes back on the same port
        restarted.start()
        code = proc.wait(timeout=240)
        restarted.stop()
    finally:
        if proc.poll() is None:
            proc.kill()
        broker.stop()
    assert code == 0, (tmp_path / "run.launcher.out").read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["peers_completed"] == [0, 1, 2]
    assert summary["peers_dropped"] == []
    for i in range(3):
        peer = out / "peers" / f"peer-{i}"
        rows = [json.loads(x) for x in (peer / "metrics.jsonl").open()]
        how = [r["control"] for r in rows if r["kind"] == "step" and r["phase"] == 1]
        first_fallback = how.index("fallback")  # the broker was away: on the last plan
        assert "lagged-plan" in how[:first_fallback]
        assert "lagged-plan" in how[first_fallback:], f"peer {i}: control never resumed"
        assert json.loads((peer / "summary.json").read_text())["broker_connects"] >= 2
    orch = [json.loads(x) for x in (out / "log.jsonl").open()]
    assert sum(e["event"] == "mqtt.connected" for e in orch) >= 2


def _orchestrator_summary(**fields: Any) -> str:
    """An ``orchestrator-summary.json`` document as the orchestrator writes it."""
    return json.dumps(orchestrator_summary(**fields).to_json())


def test_an_orchestrator_stuck_after_its_work_is_stopped_and_not_counted_failed(
    tmp_path: Path,
) -> None:
    """The launcher's answer to an orchestrator that hangs in teardown (amqtt 0.12 once kept one
    waiting for a lost PUBACK): once every peer exited and the orchestrator's summary exists,
    it is stopped — SIGKILL if it ignores SIGTERM — and its exit status is no failure."""
    from concord.core.config import load_config
    from concord.sim import processes

    cfg = load_config(None, ["peers=2"], environ={})
    (tmp_path / "logs").mkdir()
    children = processes.Children(tmp_path, cfg)
    ignores_term = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    )
    children.procs["orchestrator"] = subprocess.Popen([sys.executable, "-c", ignores_term])
    time.sleep(0.5)  # the child installed its handler
    now = time.monotonic()
    gone = now - processes._TEARDOWN - 1
    assert children.orchestrator_stuck(gone, now) is None  # no summary: it may still work
    summary = tmp_path / "orchestrator-summary.json"
    summary.write_text(_orchestrator_summary(completed=True))
    assert children.orchestrator_stuck(now - 1, now) is None  # peers left only a moment ago
    assert children.orchestrator_stuck(gone, now) is True
    t0 = time.monotonic()
    children.abandon("orchestrator")
    assert children.procs["orchestrator"].returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 15
    assert children.failed() == {}
    assert children.running() == []


def test_an_orchestrator_stuck_after_an_error_summary_counts_as_failed(tmp_path: Path) -> None:
    """An orchestrator that recorded an error (``completed: false``) and then hangs is stopped
    too, but its failure stands: the launcher must not report the run as finished."""
    from concord.core.config import load_config
    from concord.sim import processes

    cfg = load_config(None, ["peers=2"], environ={})
    (tmp_path / "logs").mkdir()
    children = processes.Children(tmp_path, cfg)
    children.procs["orchestrator"] = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"]
    )
    now = time.monotonic()
    gone = now - processes._TEARDOWN - 1
    (tmp_path / "orchestrator-summary.json").write_text("{")  # half-written: not yet judged
    assert children.orchestrator_stuck(gone, now) is None
    (tmp_path / "orchestrator-summary.json").write_text(
        _orchestrator_summary(completed=False, error="broker lost for 120 s")
    )
    done = children.orchestrator_stuck(gone, now)
    assert done is False
    children.abandon("orchestrator", done=done)
    assert children.failed() == {"orchestrator": -signal.SIGTERM}
    assert children.hopeless()


@pytest.mark.parametrize("lagged", [False, True], ids=["barrier", "lagged"])
def test_peers_stop_waiting_for_a_crashed_orchestrator_and_finish(
    tmp_path: Path, lagged: bool
) -> None:
    """Peers on their own machines, an external Mosquitto, the orchestrator killed (SIGKILL)
    mid-run: its Last-Will tells the peers at once, so they finish on plain gossip (barrier:
    one round per step; lagged: the last plan) instead of waiting out the decision timeout
    (30 s here) at every round or step."""
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed; scripts/bootstrap installs it (root, Debian)")
    broker = MosquittoBroker()
    broker.start()
    config = tmp_path / "run.toml"
    config.write_text(
        'name = "orphaned"\npeers = 3\nepochs = 2\n'
        "[dataset]\nsamples = 3000\n[eval]\nevery = 4\n[optim]\nmilestones = []\n"
        f'[control]\nmode = "adaptive"\nfactor = 0.1\nlagged = {str(lagged).lower()}\n'
        "[orchestrator]\nheartbeat = 0.2\nliveness_timeout = 3\ndecision_timeout = 30\n"
        "[network]\ndeadline = 5\n"
    )
    common = ["--config", str(config), "--broker", broker.url]
    commands = {"orchestrator": ["orchestrator", "--out", str(tmp_path / "orchestrator")]}
    for i in range(3):
        out = str(tmp_path / f"peer-{i}")
        commands[f"peer-{i}"] = ["peer", "--id", str(i), "--listen", "127.0.0.1:0", "--out", out]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = []
    try:
        for name, args in commands.items():
            log = open(tmp_path / f"{name}.out", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "concord.lab.cli", *args, *common],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        _wait(_training(tmp_path / "peer-0", 20), 120, "20 training steps")
        procs["orchestrator"].send_signal(signal.SIGKILL)
        killed_at = time.time()
        codes = {n: p.wait(timeout=150) for n, p in procs.items() if n != "orchestrator"}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
        broker.stop()
    assert codes == {f"peer-{i}": 0 for i in range(3)}, (tmp_path / "peer-0.out").read_text()[
        -3000:
    ]
    for i in range(3):
        peer = tmp_path / f"peer-{i}"
        assert json.loads((peer / "summary.json").read_text())["completed"]
        events = [json.loads(x) for x in (peer / "log.jsonl").open()]
        offline = [e for e in events if e["event"] == "orchestrator.offline"]
        assert offline, f"peer {i} never heard that the orchestrator left"
        rows = [json.loads(x) for x in (peer / "metrics.jsonl").open()]
        steps = [r for r in rows if r["kind"] == "step"]
        decided = [r for r in steps if r["control"] != "fallback"]
        after = steps[len(decided) :]
        assert decided, f"peer {i}: control never worked"
        assert len(after) >= 20, f"peer {i}: the kill came too late to test anything"
        assert all(r["control"] == "fallback" for r in after), f"peer {i}: control came back?"
        # no step waited for the decision timeout (30 s); the slowest is far below it
        slowest = max(r["step_ms"] for r in after)
        assert slowest < 10_000, f"peer {i}: a step took {slowest:.0f} ms"
        if not lagged:  # barrier fallback: plain gossip (the step of the kill may have more)
            assert {r["rounds"] for r in after[1:]} == {1}
    assert time.time() - killed_at < 150


def test_peers_hung_long_after_the_orchestrator_exited_are_stopped(tmp_path: Path) -> None:
    """A peer still running `_PEERS_AFTER` seconds after the orchestrator exited is hung in its
    teardown (it waits at most 60 s for "stop" plus its transport's bound): the launcher stops it;
    one whose summary says it completed is no failure, one without a summary is."""
    from concord.core.config import load_config
    from concord.sim import processes

    cfg = load_config(None, ["peers=2"], environ={})
    (tmp_path / "logs").mkdir()
    children = processes.Children(tmp_path, cfg)
    for i in range(2):
        children.procs[f"peer-{i}"] = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"]
        )
    (tmp_path / "peers" / "peer-0").mkdir(parents=True)
    (tmp_path / "peers" / "peer-0" / "summary.json").write_text('{"completed": true}')
    now = time.monotonic()
    assert children.peers_stuck(None, now) == {}
    assert children.peers_stuck(now - 10, now) == {}  # the orchestrator left a moment ago
    stuck = children.peers_stuck(now - processes._PEERS_AFTER - 1, now)
    assert stuck == {"peer-0": True, "peer-1": False}
    for name, done in stuck.items():
        children.abandon(name, done=done)
    assert children.running() == []
    assert children.failed() == {"peer-1": -signal.SIGTERM}
