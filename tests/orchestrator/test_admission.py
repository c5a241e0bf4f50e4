"""`concord.orchestrator.admission.Admission`, sans-io: who is ready, who is alive, who is dropped
— fed messages and clock values, no broker."""

from __future__ import annotations

import pytest

from concord.errors import OrchestratorError
from concord.orchestrator.admission import PACE_WINDOW, REJOIN_LEAD, Admission
from concord.orchestrator.schedules import REPAIR_AHEAD
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
    a.heard(2, Heartbeat(peer=2, step=22, ts=2.0), 3.5)  # it trains: at its joining step
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


def test_a_readmitted_peer_is_awaited_only_once_it_reported_its_first_step() -> None:
    """Until it trains it cannot report; a round waiting for it would hold its neighbours inside
    a step, where nobody answers the Fetch it waits for (its neighbours' step boundary)."""
    a = table()
    for i in range(3):
        ready(a, i)
    a.begin_stage(0.0)
    a.drop(2, "Last-Will")
    assert a.readmit(2, 22, 1.0)
    a.heard(2, Heartbeat(peer=2, step=0, ts=1.0), 1.5)  # fetching: its step clock is not set
    a.heard(2, Stats(peer=2, step=21, round=1, theta=1.0, grad_norm=1.0), 1.6)  # not yet
    for i in (0, 1):
        a.heard(i, Heartbeat(peer=i, step=30, ts=2.0), 2.0)
    assert a.expected("train") == {0, 1}  # the others are past step 22: still not awaited
    a.heard(2, Metrics(peer=2, step=31), 2.5)  # it started past its joining step, at 31
    assert a.peers[2].starts_at == 31
    assert a.expected("train") == {0, 1}  # the others' rounds of step 30 are not its
    for i in (0, 1):
        a.heard(i, Heartbeat(peer=i, step=31, ts=3.0), 3.0)
    assert a.expected("train") == {0, 1, 2}


def _reporting(a: Admission, steps: dict[int, int], pace: float, until: float) -> None:
    """Each peer of ``steps`` reports its step records (`Metrics`) at ``pace`` steps per second
    from time 0 to ``until``, ending at the given step."""
    for peer, last in steps.items():
        n = round(pace * until)
        for k in range(n + 1):
            a.heard(peer, Metrics(peer=peer, step=last - n + k), k / pace)


def test_a_readmitted_peer_joins_where_the_others_will_be_shortly() -> None:
    a = table(4)
    for i in range(4):
        ready(a, i)
    a.begin_stage(0.0)
    a.drop(3, "Last-Will")
    _reporting(a, {0: 99, 1: 97, 2: 98}, pace=16.0, until=3.0)  # 16 steps/s, at 100 (after 99)
    # the most advanced peer's last report (at 100 at 3.0) moved on at 16 steps/s to REJOIN_LEAD
    # seconds after now (3.25)
    assert a.rejoin_step(3.25, deadline=2.0) == 100 + 16 * (0.25 + REJOIN_LEAD)
    # a short step deadline bounds the wait of the joining peer in its first round: half of it
    assert a.rejoin_step(3.25, deadline=0.5) == 100 + 16 * (0.25 + 0.25)
    # heartbeats only (steps in progress, no pace known yet): REPAIR_AHEAD past the newest
    b = table()
    b.begin_stage(0.0)
    b.heard(0, Heartbeat(peer=0, step=7, ts=1.0), 1.0)
    assert b.rejoin_step(1.0, deadline=2.0) == 7 + REPAIR_AHEAD


def test_the_joining_step_is_not_moved_by_one_peer_that_leapt_or_stalled() -> None:
    a = table(4)
    for i in range(4):
        ready(a, i)
    a.begin_stage(0.0)
    a.drop(3, "Last-Will")
    _reporting(a, {0: 99, 1: 99}, pace=8.0, until=3.0)
    a.heard(2, Metrics(peer=2, step=10), 1.5)
    a.heard(2, Metrics(peer=2, step=99), 3.0)  # it jumped: 89 steps in 1.5 s, not its pace
    assert a.rejoin_step(3.0, deadline=2.0) == 100 + 8 * REJOIN_LEAD  # the median pace
    # silent since 3.0: moved on at most `PACE_WINDOW` past its last report
    assert a.rejoin_step(30.0, deadline=2.0) == 100 + 8 * (PACE_WINDOW + REJOIN_LEAD)


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
