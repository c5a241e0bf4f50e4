"""`concord.orchestrator.admission.Admission`, sans-io: who is ready, who is alive, who is dropped
— fed messages and clock values, no broker, and observed only through its interface
(`PeerAdmission`: immutable answers, snapshots of its peers)."""

from __future__ import annotations

import dataclasses

import pytest

from concord.errors import OrchestratorError
from concord.orchestrator.admission import (
    PACE_WINDOW,
    REJOIN_LEAD,
    Admission,
    Dropped,
    Readmitted,
    RollCall,
)
from concord.orchestrator.options import AdmissionOptions
from concord.orchestrator.schedules import REPAIR_AHEAD
from concord.protos.control_plane import Heartbeat, Metrics, Stats, Status

TIMEOUT = 3.0
HEARTBEAT = 0.5  # a Last-Will stands after 2 × 0.5 + 0.2 = 1.2 s of silence
T = "train"


def table(n: int = 3, *, deadline: float = 10.0, incarnation: str = "") -> Admission:
    options = AdmissionOptions(n, TIMEOUT, HEARTBEAT, step_deadline=deadline)
    return Admission(options, incarnation=incarnation)


def ready(a: Admission, peer: int, now: float = 0.0, *, spe: int = 10, fp: str = "f") -> None:
    address = f"127.0.0.1:{5000 + peer}"
    status = Status(peer=peer, state="ready", address=address, steps_per_epoch=spe, fingerprint=fp)
    assert a.heard(peer, status, now, "").changed


def test_gathering_waits_for_every_peer_and_checks_agreement() -> None:
    a = table()
    assert not a.roll_call().ready
    ready(a, 0)
    ready(a, 2)
    assert a.roll_call() == RollCall(ready=False, missing=(1,))
    ready(a, 1)
    assert a.roll_call() == RollCall(ready=True, missing=())
    assert a.agreed_steps_per_epoch() == 10
    roster = a.roster()
    assert roster.peers == (0, 1, 2)
    assert roster.addresses == ("127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002")


@pytest.mark.parametrize("odd", [{"spe": 11}, {"fp": "other"}])
def test_peers_that_disagree_are_refused(odd: dict[str, object]) -> None:
    a = table(2)
    ready(a, 0)
    ready(a, 1, **odd)  # type: ignore[arg-type]
    with pytest.raises(OrchestratorError, match="disagree"):
        a.agreed_steps_per_epoch()


def test_a_status_for_another_peer_is_rejected() -> None:
    a = table()
    out = a.heard(1, Status(peer=2, state="ready", address="h:1"), 0.0, "")
    assert not out.changed
    assert out.refused is None  # logged by admission itself: a status topic
    assert a.peers[1].address is None
    assert a.peers[2].address is None


def test_failed_drops_only_once_a_stage_runs() -> None:
    a = table()
    assert a.heard(0, Status(peer=0, state="failed"), 0.0, "").drop is None
    out = a.heard(1, Status(peer=1, state="failed", reason="oom"), 0.0, T)
    assert out.changed
    assert out.drop == "status failed: oom"
    assert a.drop(1, out.drop, T) == Dropped(owed=True)
    assert a.drop(1, "again", T) is None  # not news
    assert a.roster().peers == (0, 2)
    assert a.tally(T).dropped == (1,)
    assert a.heard(1, Status(peer=1, state="failed"), 0.0, T).drop is None
    assert a.heard(1, Stats(peer=1, step=0, round=1, theta=1.0, grad_norm=1.0), 0.1, T).gone


def test_done_peers_are_no_longer_expected() -> None:
    a = table()
    assert a.expected(T) == {0, 1, 2}
    a.heard(2, Status(peer=2, state="done", stage="calibrate"), 1.0, "calibrate")
    assert a.expected("calibrate") == {0, 1}
    assert a.expected(T) == {0, 1, 2}
    a.heard(2, Status(peer=2, state="done", stage="train"), 2.0, T)
    assert a.tally(T).done == (2,)
    assert a.drop(2, "Last-Will", T) == Dropped(owed=False)  # done: nothing to repair


def test_silence_drops_busy_peers_after_the_timeout() -> None:
    a = table()
    assert a.sweep(100.0, "") == []  # nobody is dropped before the first stage
    a.begin_stage(10.0)
    a.heard(0, Heartbeat(peer=0, step=4, ts=0.0), 12.0, T)
    a.heard(1, Stats(peer=1, step=4, round=1, theta=1.0, grad_norm=1.0), 12.5, T)
    a.heard(2, Status(peer=2, state="done", stage="train"), 10.5, T)
    assert a.roster().newest_step == 4
    assert a.sweep(13.0, "train") == []
    assert a.sweep(15.5, "train") == [(0, "silent for 3.5 s")]  # 2 is done: not owed
    a.drop(0, "silent", T)
    a.heard(1, Metrics(peer=1, step=5), 15.0, T)
    assert a.sweep(18.0, "train") == []
    assert a.sweep(18.1, "train") == [(1, "silent for 3.1 s")]


def test_a_last_will_stands_only_after_two_silent_heartbeats() -> None:
    a = table()
    a.begin_stage(0.0)
    a.heard(0, Status(peer=0, state="offline"), 1.0, T)
    a.heard(1, Status(peer=1, state="offline"), 1.0, T)
    a.heard(1, Heartbeat(peer=1, step=1, ts=0.0), 1.5, T)  # alive after all
    assert a.sweep(2.1, "train") == []
    assert a.sweep(2.3, "train") == [(0, "Last-Will (offline) and silent since")]
    assert a.sweep(2.4, "train") == []  # said once


def test_a_broker_outage_grants_grace() -> None:
    a = table()
    a.begin_stage(0.0)
    a.heard(0, Status(peer=0, state="offline"), 1.0, T)  # the broker shut down
    a.cut_off(2.0, backoff=5.0)  # silence counts from 7.0; the Last-Will does not stand
    assert a.sweep(6.0, "train") == []
    assert a.sweep(9.9, "train") == []
    assert [p for p, _ in a.sweep(10.1, "train")] == [0, 1, 2]


def test_a_dropped_peer_announcing_ready_again_is_readmitted_from_a_later_step() -> None:
    a = table()
    for i in range(3):
        ready(a, i)
    a.begin_stage(0.0)
    for i in range(3):
        a.heard(i, Heartbeat(peer=i, step=20, ts=1.0), 1.0, T)
    assert a.drop(2, "Last-Will", T) is not None
    assert a.readmit(1, 2.0) is None  # not dropped
    back = Status(peer=2, state="ready", address="127.0.0.1:7002", steps_per_epoch=10)
    outcome = a.heard(2, back, 3.0, T)
    assert outcome.readmit
    assert a.peers[2].address == "127.0.0.1:7002"  # a new incarnation may move
    # no pace known (one report each): REPAIR_AHEAD past the live peers' newest step
    assert a.readmit(2, 3.0) == Readmitted(joins_at=20 + REPAIR_AHEAD, address="127.0.0.1:7002")
    assert a.roster().peers == (0, 1, 2)
    assert a.peers[2].readmissions == 1
    a.heard(2, Heartbeat(peer=2, step=22, ts=2.0), 3.5, T)  # it trains: at its joining step
    assert a.expected("train") == {0, 1}  # the others have not reached step 22 yet
    for i in (0, 1):
        a.heard(i, Heartbeat(peer=i, step=22, ts=2.0), 4.0, T)
    assert a.expected("train") == {0, 1, 2}
    assert a.peers[2].joins_at is None
    # a "training" status that moves an admitted peer is still refused
    moved = Status(peer=2, state="training", address="127.0.0.1:7999")
    assert not a.heard(2, moved, 5.0, T).changed
    assert a.peers[2].address == "127.0.0.1:7002"
    # outside the train stage a "ready" is no restart
    assert not a.heard(0, Status(peer=0, state="ready"), 6.0, "calibrate").readmit


def test_a_readmitted_peer_is_awaited_only_once_it_reported_its_first_step() -> None:
    """Until it trains it cannot report; a round waiting for it would hold its neighbours inside
    a step, where nobody answers the Fetch it waits for (its neighbours' step boundary)."""
    a = table()
    for i in range(3):
        ready(a, i)
    a.begin_stage(0.0)
    for i in (0, 1):
        a.heard(i, Heartbeat(peer=i, step=20, ts=0.5), 0.5, T)
    a.drop(2, "Last-Will", T)
    readmitted = a.readmit(2, 1.0)
    assert readmitted is not None
    assert readmitted.joins_at == 22
    a.heard(2, Heartbeat(peer=2, step=0, ts=1.0), 1.5, T)  # fetching: its step clock is not set
    a.heard(2, Stats(peer=2, step=21, round=1, theta=1.0, grad_norm=1.0), 1.6, T)  # not yet
    for i in (0, 1):
        a.heard(i, Heartbeat(peer=i, step=30, ts=2.0), 2.0, T)
    assert a.expected("train") == {0, 1}  # the others are past step 22: still not awaited
    a.heard(2, Metrics(peer=2, step=31), 2.5, T)  # it started past its joining step, at 31
    assert a.expected("train") == {0, 1}  # the others' rounds of step 30 are not its
    for i in (0, 1):
        a.heard(i, Heartbeat(peer=i, step=31, ts=3.0), 3.0, T)
    assert a.expected("train") == {0, 1, 2}


def _reporting(a: Admission, steps: dict[int, int], pace: float, until: float) -> None:
    """Each peer of ``steps`` reports its step records (`Metrics`) at ``pace`` steps per second
    from time 0 to ``until``, ending at the given step."""
    for peer, last in steps.items():
        n = round(pace * until)
        for k in range(n + 1):
            a.heard(peer, Metrics(peer=peer, step=last - n + k), k / pace, T)


def _dropped_fourth(deadline: float, steps: dict[int, int], pace: float, until: float) -> Admission:
    """Four ready peers, peer 3 dropped, the others `_reporting`."""
    a = table(4, deadline=deadline)
    for i in range(4):
        ready(a, i)
    a.begin_stage(0.0)
    a.drop(3, "Last-Will", T)
    _reporting(a, steps, pace=pace, until=until)
    return a


def test_a_readmitted_peer_joins_where_the_others_will_be_shortly() -> None:
    # 16 steps/s, at 100 (after 99)
    a = _dropped_fourth(2.0, {0: 99, 1: 97, 2: 98}, pace=16.0, until=3.0)
    # the most advanced peer's last report (at 100 at 3.0) moved on at 16 steps/s to REJOIN_LEAD
    # seconds after now (3.25)
    assert a.rejoin_step(3.25) == 100 + 16 * (0.25 + REJOIN_LEAD)
    # a short step deadline bounds the wait of the joining peer in its first round: half of it
    short = _dropped_fourth(0.5, {0: 99, 1: 97, 2: 98}, pace=16.0, until=3.0)
    assert short.rejoin_step(3.25) == 100 + 16 * (0.25 + 0.25)
    # what `readmit` takes it back at
    readmitted = a.readmit(3, 3.25)
    assert readmitted is not None
    assert readmitted.joins_at == 100 + 16 * (0.25 + REJOIN_LEAD)
    # heartbeats only (steps in progress, no pace known yet): REPAIR_AHEAD past the newest
    b = table(deadline=2.0)
    b.begin_stage(0.0)
    b.heard(0, Heartbeat(peer=0, step=7, ts=1.0), 1.0, T)
    assert b.rejoin_step(1.0) == 7 + REPAIR_AHEAD


def test_the_joining_step_is_not_moved_by_one_peer_that_leapt_or_stalled() -> None:
    a = _dropped_fourth(2.0, {0: 99, 1: 99}, pace=8.0, until=3.0)
    a.heard(2, Metrics(peer=2, step=10), 1.5, T)
    a.heard(2, Metrics(peer=2, step=99), 3.0, T)  # it jumped: 89 steps in 1.5 s, not its pace
    assert a.rejoin_step(3.0) == 100 + 8 * REJOIN_LEAD  # the median pace
    # silent since 3.0: moved on at most `PACE_WINDOW` past its last report
    assert a.rejoin_step(30.0) == 100 + 8 * (PACE_WINDOW + REJOIN_LEAD)


def test_a_ready_left_over_from_an_earlier_run_is_refused_as_stale() -> None:
    options = AdmissionOptions(2, TIMEOUT, HEARTBEAT, stale_after=90.0)
    a = Admission(options, started_at=1000.0)
    old = Status(peer=0, state="ready", address="127.0.0.1:5000", steps_per_epoch=10, ts=900.0)
    outcome = a.heard(0, old, 0.0, "")
    assert outcome.stale
    assert not outcome.changed
    assert a.peers[0].address is None
    fresh = Status(peer=0, state="ready", address="127.0.0.1:5000", steps_per_epoch=10, ts=950.0)
    assert a.heard(0, fresh, 0.0, "").changed  # a peer started before the orchestrator
    unstamped = Status(peer=1, state="ready", address="127.0.0.1:5001", steps_per_epoch=10)
    assert a.heard(1, unstamped, 0.0, "").changed  # no ts: not judged
    assert a.roll_call().ready


def test_unknown_peers_and_other_incarnations_are_refused_for_the_caller_to_count() -> None:
    a = table(2, incarnation="abc")
    assert a.heard(2, Heartbeat(peer=2, step=0, ts=0.0), 0.0, "").refused == "unknown peer id"
    assert a.heard(-1, Heartbeat(peer=0, step=0, ts=0.0), 0.0, "").refused == "unknown peer id"
    other = Status(peer=0, state="ready", address="127.0.0.1:5000", incarnation="xyz")
    out = a.heard(0, other, 0.0, "")
    assert out.refused == "a status of another orchestrator incarnation (stale)"
    assert a.peers[0].address is None  # not filed
    for incarnation in ("abc", ""):  # this one's, or none yet
        status = Status(peer=0, state="ready", address="127.0.0.1:5000", incarnation=incarnation)
        assert a.heard(0, status, 0.0, "").refused is None
    assert a.peers[0].address == "127.0.0.1:5000"


def test_a_dropped_peer_heard_again_is_taken_back_only_in_training() -> None:
    a = table()
    for i in range(3):
        ready(a, i)
    a.drop(2, "silent for 6.1 s", "calibrate")
    beat = Heartbeat(peer=2, step=3, ts=1.0)
    assert not a.heard(2, beat, 1.0, "calibrate").readmit
    back = a.heard(2, beat, 2.0, T)
    assert back.readmit
    assert back.gone  # until the caller re-admits it
    a.heard(1, Status(peer=1, state="done", stage="train"), 2.0, T)
    a.drop(1, "Last-Will", T)
    assert not a.heard(1, Heartbeat(peer=1, step=9, ts=1.0), 3.0, T).readmit  # it had finished


def test_the_peers_are_read_as_snapshots() -> None:
    """Nobody but admission changes its table: a snapshot stays as it was taken."""
    a = table()
    ready(a, 0)
    before = a.peers
    a.begin_stage(1.0)
    a.heard(0, Heartbeat(peer=0, step=5, ts=1.0), 2.0, T)
    assert before[0].step == 0
    assert a.peers[0].step == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.peers[0].step = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        a.peers[1] = a.peers[0]  # type: ignore[index]
