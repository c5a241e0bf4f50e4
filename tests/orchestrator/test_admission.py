"""`concord.orchestrator.admission.Admission`, sans-io: who is ready, who is alive, who is dropped
— fed messages and clock values, no broker."""

from __future__ import annotations

import pytest

from concord.errors import OrchestratorError
from concord.orchestrator.admission import Admission
from concord.protos.control_plane import Heartbeat, Metrics, Stats, Status

TIMEOUT = 3.0
HEARTBEAT = 0.5  # a Last-Will stands after 2 × 0.5 + 0.2 = 1.2 s of silence


def table(n: int = 3) -> Admission:
    return Admission(n, liveness_timeout=TIMEOUT, heartbeat=HEARTBEAT)


def ready(a: Admission, peer: int, now: float = 0.0, *, spe: int = 10, fp: str = "f") -> None:
    address = f"127.0.0.1:{5000 + peer}"
    status = Status(peer=peer, state="ready", address=address, steps_per_epoch=spe, fingerprint=fp)
    a.heard(peer, status, now)
    assert a.on_status(peer, status, now, "").changed


def test_gathering_waits_for_every_peer_and_checks_agreement() -> None:
    a = table()
    assert not a.ready()
    ready(a, 0)
    ready(a, 2)
    assert not a.ready()
    assert a.missing() == [1]
    ready(a, 1)
    assert a.ready()
    assert a.missing() == []
    assert a.agreed_steps_per_epoch() == 10
    assert a.addresses([0, 2]) == ["127.0.0.1:5000", "127.0.0.1:5002"]


@pytest.mark.parametrize("odd", [{"spe": 11}, {"fp": "other"}])
def test_peers_that_disagree_are_refused(odd: dict[str, object]) -> None:
    a = table(2)
    ready(a, 0)
    ready(a, 1, **odd)  # type: ignore[arg-type]
    with pytest.raises(OrchestratorError, match="disagree"):
        a.agreed_steps_per_epoch()


def test_a_status_for_another_peer_is_rejected() -> None:
    a = table()
    out = a.on_status(1, Status(peer=2, state="ready", address="h:1"), 0.0, "")
    assert not out.changed
    assert a.peers[1].address is None
    assert a.peers[2].address is None


def test_failed_drops_only_once_a_stage_runs() -> None:
    a = table()
    assert a.on_status(0, Status(peer=0, state="failed"), 0.0, "").drop is None
    out = a.on_status(1, Status(peer=1, state="failed", reason="oom"), 0.0, "train")
    assert out.changed
    assert out.drop == "status failed: oom"
    assert a.drop(1, out.drop)
    assert not a.drop(1, "again")  # not news
    assert a.live() == {0, 2}
    assert a.dropped() == [1]
    assert a.on_status(1, Status(peer=1, state="failed"), 0.0, "train").drop is None


def test_done_peers_are_no_longer_expected() -> None:
    a = table()
    assert a.expected("train") == {0, 1, 2}
    a.on_status(2, Status(peer=2, state="done", stage="calibrate"), 1.0, "calibrate")
    assert a.expected("calibrate") == {0, 1}
    assert a.expected("train") == {0, 1, 2}
    a.on_status(2, Status(peer=2, state="done", stage="train"), 2.0, "train")
    assert a.finished("train") == [2]


def test_silence_drops_busy_peers_after_the_timeout() -> None:
    a = table()
    assert a.sweep(100.0, "") == []  # nobody is dropped before the first stage
    a.begin_stage(10.0)
    a.heard(0, Heartbeat(peer=0, step=4, ts=0.0), 12.0)
    a.heard(1, Stats(peer=1, step=4, round=1, theta=1.0, grad_norm=1.0), 12.5)
    a.on_status(2, Status(peer=2, state="done", stage="train"), 10.5, "train")
    assert a.newest_step([0, 1]) == 4
    assert a.sweep(13.0, "train") == []
    assert a.sweep(15.5, "train") == [(0, "silent for 3.5 s")]  # 2 is done: not owed
    a.drop(0, "silent")
    a.heard(1, Metrics(peer=1, step=5), 15.0)
    assert a.sweep(18.0, "train") == []
    assert a.sweep(18.1, "train") == [(1, "silent for 3.1 s")]


def test_a_last_will_stands_only_after_two_silent_heartbeats() -> None:
    a = table()
    a.begin_stage(0.0)
    a.on_status(0, Status(peer=0, state="offline"), 1.0, "train")
    a.on_status(1, Status(peer=1, state="offline"), 1.0, "train")
    a.heard(1, Heartbeat(peer=1, step=1, ts=0.0), 1.5)  # alive after all
    assert a.sweep(2.1, "train") == []
    assert a.sweep(2.3, "train") == [(0, "Last-Will (offline) and silent since")]
    assert a.peers[0].offline_at is None  # said once


def test_a_broker_outage_grants_grace() -> None:
    a = table()
    a.begin_stage(0.0)
    a.on_status(0, Status(peer=0, state="offline"), 1.0, "train")  # the broker shut down
    a.cut_off(2.0, backoff=5.0)  # silence counts from 7.0
    assert a.peers[0].offline_at is None
    assert a.sweep(6.0, "train") == []
    assert a.sweep(9.9, "train") == []
    assert [p for p, _ in a.sweep(10.1, "train")] == [0, 1, 2]


def test_a_dropped_peer_announcing_ready_again_is_readmitted_from_a_later_step() -> None:
    a = table()
    for i in range(3):
        ready(a, i)
    a.begin_stage(0.0)
    for i in range(3):
        a.heard(i, Heartbeat(peer=i, step=20, ts=1.0), 1.0)
    assert a.drop(2, "Last-Will")
    assert not a.readmit(1, 25, 2.0)  # not dropped
    back = Status(peer=2, state="ready", address="127.0.0.1:7002", steps_per_epoch=10)
    outcome = a.on_status(2, back, 3.0, "train")
    assert outcome.readmit
    assert a.peers[2].address == "127.0.0.1:7002"  # a new incarnation may move
    assert a.readmit(2, 22, 3.0)
    assert a.live() == {0, 1, 2}
    assert a.expected("train") == {0, 1}  # the others have not reached step 22 yet
    for i in (0, 1):
        a.heard(i, Heartbeat(peer=i, step=22, ts=2.0), 4.0)
    assert a.expected("train") == {0, 1, 2}
    assert a.peers[2].joins_at is None
    # a "training" status that moves an admitted peer is still refused
    moved = Status(peer=2, state="training", address="127.0.0.1:7999")
    assert not a.on_status(2, moved, 5.0, "train").changed
    assert a.peers[2].address == "127.0.0.1:7002"
    # outside the train stage a "ready" is no restart
    assert not a.on_status(0, Status(peer=0, state="ready"), 6.0, "calibrate").readmit


def test_a_ready_left_over_from_an_earlier_run_is_refused_as_stale() -> None:
    a = Admission(2, liveness_timeout=TIMEOUT, heartbeat=HEARTBEAT, started_at=1000.0,
                  stale_after=90.0)  # fmt: skip
    old = Status(peer=0, state="ready", address="127.0.0.1:5000", steps_per_epoch=10, ts=900.0)
    outcome = a.on_status(0, old, 0.0, "")
    assert outcome.stale
    assert not outcome.changed
    assert a.peers[0].address is None
    fresh = Status(peer=0, state="ready", address="127.0.0.1:5000", steps_per_epoch=10, ts=950.0)
    assert a.on_status(0, fresh, 0.0, "").changed  # a peer started before the orchestrator
    unstamped = Status(peer=1, state="ready", address="127.0.0.1:5001", steps_per_epoch=10)
    assert a.on_status(1, unstamped, 0.0, "").changed  # no ts: not judged
    assert a.ready()
