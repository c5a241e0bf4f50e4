"""A stalled or restarted peer and its neighbours (issue 13, item 4): real `concord peer` processes
on loopback.

Static peers: a neighbour that misses ``network.skip_after`` rounds in a row is skipped (not
waited for) and taken back when its tensors are in time again — SIGSTOP one peer of a ring for
several deadlines, SIGCONT it, and check from the step records that its neighbours stopped paying
the deadline per step and mix it again, and that every peer finishes.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from concord.core.records import PeerSummary
from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
from concord.runtime.records import read_peer_summary
from tests.integration.peers import Peers, write_config
from tests.integration.tiny_ring import DEADLINE, records, tiny_ring, wait_steps

pytestmark = pytest.mark.slow  # ~35 s: the separate CI step (.ci/run)

SKIP_AFTER = 3


def _summary(peer_dir: Path) -> PeerSummary:
    """The peer's summary.json (`read_peer_summary`: typed, old names read too)."""
    summary = read_peer_summary(peer_dir)
    assert summary is not None, f"{peer_dir} has no summary.json"
    return summary


def _counter(summary: PeerSummary, name: str) -> int:
    """A count in the summary's ``extra`` (transport and rejoin counters)."""
    value = summary.extra.get(name)
    assert isinstance(value, int), f"peer {summary.peer}'s summary has no count {name!r}: {value!r}"
    return value


def _accuracy(summary: PeerSummary) -> float:
    """The peer's final test accuracy (``accuracy_mean_peer``)."""
    value = summary.accuracy_mean_peer
    assert value is not None, f"peer {summary.peer} finished without an evaluation"
    return value


def test_a_stalled_peer_is_skipped_after_skip_after_deadlines_and_mixed_again_after_sigcont(
    tmp_path: Path, started: list[Peers]
) -> None:
    # 10 steps per epoch per peer; long enough that peer 3 is stopped well inside the run
    extra = tiny_ring("dsgd", 150)
    config = write_config(tmp_path / "run.toml", 4, extra, deadline=DEADLINE)
    with config.open("a") as f:
        f.write(f"skip_after = {SKIP_AFTER}\n")  # appended to [network]
    peers = Peers(config, tmp_path, [0, 1, 2, 3])
    started.append(peers)
    wait_steps(tmp_path / "peer-3" / "metrics.jsonl", 40, timeout=120)
    stopped_at = time.time()
    peers.procs[3].send_signal(signal.SIGSTOP)
    # eight deadlines stalled — or less, once its neighbours (skipping it after SKIP_AFTER
    # deadlines, then fast) are half-way through the run: peer 3 must come back well inside it
    # on a fast, idle machine too (there 1460 skipped steps take ~7 s, less than 8 deadlines)
    end = time.monotonic() + 8 * DEADLINE
    peer0 = tmp_path / "peer-0" / "metrics.jsonl"
    while time.monotonic() < end and len(peer0.read_text().splitlines()) < 750:
        time.sleep(0.05)
    peers.procs[3].send_signal(signal.SIGCONT)
    resumed_at = time.time()
    assert peers.wait(timeout=600) == {0: 0, 1: 0, 2: 0, 3: 0}
    for i in (0, 2):  # peer 3's ring neighbours
        summary = _summary(tmp_path / f"peer-{i}")
        assert summary.completed
        assert _counter(summary, "neighbours_skipped") >= 1
        assert _counter(summary, "neighbours_back") >= 1
        assert _counter(summary, "rounds_not_waited") >= 1
        steps = records(tmp_path / f"peer-{i}" / "metrics.jsonl")
        assert len(steps) == 1500
        without = [r for r in steps if 3 in r["missing"]]
        slow = [r for r in without if r["step_ms"] >= 0.9 * DEADLINE * 1e3]
        # without skipping, every step without peer 3 costs the deadline; with it, the first
        # skip_after do (and a few around SIGCONT, while peer 3 is far behind, at most)
        assert len(without) >= 4 * len(slow), (len(without), len(slow))
        assert len(slow) <= 3 * SKIP_AFTER, [r["step"] for r in slow]
        assert any(3 in r["skipped"] for r in steps)
        # mixed again after SIGCONT: the last steps all have peer 3's tensor
        last = max(r["step"] for r in without)
        assert last < 1500 - 100, last
        assert all(3 not in r["missing"] and r["skipped"] == [] for r in steps[last + 1 :])
        normal = statistics.median(r["step_ms"] for r in steps[:40])
        skipping = statistics.median(r["step_ms"] for r in without)
        print(
            f"peer {i}: median step {normal:.1f} ms before, {skipping:.1f} ms while peer 3 "
            f"was skipped ({len(without)} steps without it, {len(slow)} costing the deadline); "
            f"stopped {resumed_at - stopped_at:.1f} s"
        )
        assert skipping < 0.5 * DEADLINE * 1e3
    summary3 = _summary(tmp_path / "peer-3")
    assert summary3.completed
    # far behind all its neighbours after SIGCONT, it jumped to their step
    assert _counter(summary3, "jumps") >= 1
    jumped = [r for r in records(tmp_path / "peer-3" / "metrics.jsonl") if "jumped_from" in r]
    assert jumped
    assert jumped[0]["step"] > jumped[0]["jumped_from"] + 2


def _log_events(path: Path, *events: str) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.is_file() else []
    return [e for e in map(json.loads, lines) if e.get("event") in events]


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


EPOCHS = 400  # 10 steps each


def test_a_killed_static_peer_restarted_fetches_its_neighbours_parameters_and_rejoins(
    tmp_path: Path, started: list[Peers]
) -> None:
    # long enough that the neighbours, unhindered while it is gone (~200 steps/s here), are not
    # near the end when it is back (~7 s: 5 deadlines, then Python and torch start again)
    extra = tiny_ring("dsgd", EPOCHS)
    config = write_config(tmp_path / "run.toml", 4, extra, deadline=DEADLINE)
    with config.open("a") as f:
        f.write(f"skip_after = {SKIP_AFTER}\nrejoin_fetch_after = 10\n")  # to [network]
    peers = Peers(config, tmp_path, [0, 1, 2, 3])
    started.append(peers)
    metrics3 = tmp_path / "peer-3" / "metrics.jsonl"
    wait_steps(metrics3, 45, timeout=120)  # past its first checkpoints (every 10 steps)
    peers.procs[3].send_signal(signal.SIGKILL)
    killed_at = time.time()
    peers.procs[3].wait(timeout=30)
    time.sleep(5 * DEADLINE)  # the others go on without it, far past its checkpoint
    restart = Peers(config, tmp_path, [3])  # the same command
    started.append(restart)
    restarted_at = time.time()
    mixed_at = None
    end = time.monotonic() + 120
    while mixed_at is None and time.monotonic() < end and restart.procs[3].poll() is None:
        rejoined = [r for r in records(metrics3) if r["step"] > 60 and r["missing"] == []]
        mixed_at = time.time() if rejoined else None
        time.sleep(0.05)
    assert restart.wait(timeout=600) == {3: 0}
    assert {i: peers.procs[i].wait(timeout=600) for i in (0, 1, 2)} == {0: 0, 1: 0, 2: 0}
    summary3 = _summary(tmp_path / "peer-3")
    assert summary3.completed
    rejoined = summary3.extra["rejoined"]
    assert isinstance(rejoined, dict), summary3.extra
    assert rejoined["at_step"] < 10 * EPOCHS - 500, rejoined  # back well before the end
    assert rejoined["from_peer"] in (0, 2)
    assert rejoined["at_step"] > rejoined["checkpoint_step"] + 10
    assert rejoined["checkpoint_step"] >= 40  # it did resume from its checkpoint first
    (adopted,) = _log_events(tmp_path / "peer-3" / "log.jsonl", "peer.rejoin_state")
    assert (adopted["from_peer"], adopted["parts"]) == (rejoined["from_peer"], ["momentum"])
    steps3 = records(metrics3)
    first = next(r for r in steps3 if r["step"] >= rejoined["at_step"])
    assert first["step"] == rejoined["at_step"]  # no step in between ran
    accuracy = {}
    detect = []
    for i in (0, 2):
        summary = _summary(tmp_path / f"peer-{i}")
        assert summary.completed
        accuracy[i] = _accuracy(summary)
        steps = records(tmp_path / f"peer-{i}" / "metrics.jsonl")
        without = [r for r in steps if 3 in r["missing"]]
        assert without  # it was gone for a while
        # … and mixed again from its return to the end
        assert max(r["step"] for r in without) < rejoined["at_step"] + SKIP_AFTER + 2
        skipped = _log_events(tmp_path / f"peer-{i}" / "log.jsonl", "neighbour.skipped")
        detect.append(_ts(skipped[0]) - killed_at)
        served = _log_events(tmp_path / f"peer-{i}" / "log.jsonl", "fetch.served")
        assert len(served) <= 1
    assert mixed_at is not None
    print(
        f"detect {min(detect):.2f}-{max(detect):.2f} s after SIGKILL; first step mixing both "
        f"neighbours {mixed_at - restarted_at:.2f} s after the restart; accuracy peer 3 "
        f"{_accuracy(summary3):.3f}, neighbours {accuracy}"
    )
    assert all(abs(_accuracy(summary3) - a) <= 0.05 for a in accuracy.values())


def test_an_orchestrated_peer_killed_and_restarted_is_readmitted_and_mixed_again(
    tmp_path: Path,
) -> None:
    """Orchestrator, Mosquitto and 4 peers on a ring (uncontrolled); peer 3 SIGKILLed mid-run
    and started again with the same command: the orchestrator drops it (its Last-Will), then
    re-admits it in a later schedule version at its new address; it fetches a neighbour's
    parameters, starts at the re-admission step, its neighbours mix it again, the run
    completes, and its accuracy is within 5 points of the others'."""
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed; scripts/bootstrap installs it (root, Debian)")
    broker = MosquittoBroker()
    broker.start()
    config = tmp_path / "run.toml"
    config.write_text(
        f'name = "rejoin"\npeers = 4\n{tiny_ring("dsgd", 150)}'
        "[orchestrator]\nheartbeat = 0.5\nliveness_timeout = 6\n"
        f"[network]\ndeadline = {DEADLINE}\nskip_after = {SKIP_AFTER}\n"
    )
    common = ["--config", str(config), "--broker", broker.url]

    def command(name: str) -> list[str]:
        if name == "orchestrator":
            args = ["orchestrator", "--out", str(tmp_path / "orchestrator")]
        else:
            i, out = name.removeprefix("peer-"), str(tmp_path / name)
            args = ["peer", "--id", i, "--listen", "127.0.0.1:0", "--out", out]
        return [sys.executable, "-m", "concord.lab.cli", *args, *common]

    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: list[Any] = []

    def spawn(name: str, *more: str) -> None:
        log = open(tmp_path / f"{name}.out", "ab")  # noqa: SIM115 - closed below
        logs.append(log)
        args = [*command(name), *more]
        procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    try:
        for name in ["orchestrator", *(f"peer-{i}" for i in range(4))]:
            spawn(name)
        metrics3 = tmp_path / "peer-3" / "metrics.jsonl"
        # 45 lines: at least 41 step records (an evaluation every 10 steps), whenever it is killed
        wait_steps(metrics3, 45, timeout=180)
        procs["peer-3"].send_signal(signal.SIGKILL)
        killed_at = time.time()
        procs["peer-3"].wait(timeout=30)
        orch_log = tmp_path / "orchestrator" / "log.jsonl"
        end = time.monotonic() + 60
        while not _log_events(orch_log, "peer.dropped") and time.monotonic() < end:
            time.sleep(0.05)
        (dropped,) = _log_events(orch_log, "peer.dropped")
        spawn("peer-3")  # the same command, on the same run directory
        restarted_at = time.time()
        mixed_at = None
        end = time.monotonic() + 120
        while mixed_at is None and time.monotonic() < end and procs["peer-3"].poll() is None:
            back = [r for r in records(metrics3) if r["step"] > 60 and r["missing"] == []]
            mixed_at = time.time() if back else None
            time.sleep(0.05)
        codes = {n: p.wait(timeout=600) for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for log in logs:
            log.close()
        broker.stop()
    tails = {
        n: (tmp_path / f"{n}.out").read_text(errors="replace")[-3000:]
        for n, c in codes.items()
        if c
    }
    assert codes == {"orchestrator": 0, **{f"peer-{i}": 0 for i in range(4)}}, tails
    schedules = [
        json.loads(line)
        for line in (tmp_path / "orchestrator" / "schedules.jsonl").read_text().splitlines()
    ]
    assert [s["peers"] for s in schedules] == [[0, 1, 2, 3], [0, 1, 2], [0, 1, 2, 3]]
    readmitted = schedules[-1]
    assert "re-admitted" in readmitted["reason"]
    summary3 = _summary(tmp_path / "peer-3")
    assert summary3.completed
    rejoined = summary3.extra["rejoined"]
    assert isinstance(rejoined, dict), summary3.extra
    assert rejoined["from_peer"] in (0, 2)
    assert rejoined["readmitted_at"] == readmitted["effective_step"]
    (adopted,) = _log_events(tmp_path / "peer-3" / "log.jsonl", "peer.rejoin_state")
    assert (adopted["from_peer"], adopted["parts"]) == (
        rejoined["from_peer"],
        ["momentum"],
    )
    steps3 = [r["step"] for r in records(metrics3)]
    before = [t for t in steps3 if t < readmitted["effective_step"]]
    assert len(before) >= 40  # its records from before the kill are kept …
    after = steps3[len(before) :]
    assert after[0] >= readmitted["effective_step"]  # … and it went on from the re-admission
    assert after == sorted(set(after))
    accuracy = {}
    for i in (0, 2):
        summary = _summary(tmp_path / f"peer-{i}")
        assert summary.completed
        accuracy[i] = _accuracy(summary)
        steps = records(tmp_path / f"peer-{i}" / "metrics.jsonl")
        # On an idle machine the Last-Will drop can reach the neighbours inside one deadline, so
        # they may never have waited for it (the schedules above show it was out): if they did,
        # they mixed it again from its re-admission on
        missed = [r["step"] for r in steps if 3 in r["missing"]]
        assert max(missed, default=0) < 1500 - 100
    assert mixed_at is not None
    print(
        f"orchestrated: drop {_ts(dropped) - killed_at:.2f} s after SIGKILL; first step mixing "
        f"both neighbours {mixed_at - restarted_at:.2f} s after the restart (re-admitted at "
        f"step {readmitted['effective_step']}); accuracy peer 3 {_accuracy(summary3):.3f}, "
        f"neighbours {accuracy}"
    )
    assert all(abs(_accuracy(summary3) - a) <= 0.05 for a in accuracy.values())
