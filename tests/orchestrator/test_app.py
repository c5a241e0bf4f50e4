"""`concord.orchestrator.app.Orchestrator`'s wiring, with a stand-in for the broker session: a
dropped peer releases pending rounds and yields a repaired schedule, published and recorded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from concord.core.config import RunConfig, load_config
from concord.core.control.controller import Calibration, ConsensusController
from concord.core.control.runplan import control_config, make_lr_schedule, make_plan
from concord.orchestrator.app import Orchestrator
from concord.orchestrator.rounds import RoundBook
from concord.protos.control_plane import (
    Decision,
    Heartbeat,
    Message,
    Schedule,
    Stats,
    Status,
)


class FakeBus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Message]] = []
        self.connected = asyncio.Event()
        self.connected.set()
        self.backoff = (0.2, 5.0)
        self.rejected = 0

    async def publish(self, kind: str, message: Message, peer: int | None = None) -> bool:
        self.sent.append((kind, message))
        return True


def test_a_failed_peer_is_dropped_its_round_decided_and_the_schedule_repaired(
    tmp_path: Path,
) -> None:
    cfg = load_config(
        None,
        ["peers=3", "epochs=2", "control.mode=constant", "control.phases=[1, 2]"],
        environ={},
    )

    async def scenario() -> tuple[FakeBus, Orchestrator]:
        orch = Orchestrator(cfg, tmp_path, broker="mqtt://unused:1", run_id="t")
        bus = FakeBus()
        orch.bus = bus  # type: ignore[assignment]
        plan = make_plan(cfg, make_lr_schedule(cfg, 10))
        orch.schedules.start(plan)
        for i in range(3):
            status = Status(peer=i, state="ready", address=f"127.0.0.1:{5000 + i}")
            await orch.on_message("status", i, status)
        orch.stage = "train"
        ctl = ConsensusController(control_config(cfg), plan, Calibration({1: 1.0, 2: 1.0}, "theta"))
        orch.book = RoundBook("train", plan, controller=ctl, timeout=60.0)
        step = plan.phases[1].start
        for i in range(3):  # the peers are there (a statistic for a far step is not open)
            await orch.on_message("heartbeat", i, Heartbeat(peer=i, step=step, ts=1.0))
        for i in (0, 1):
            stats = Stats(peer=i, step=step, round=1, theta=4.0, grad_norm=1.0)
            await orch.on_message("stats", i, stats)
        assert not [m for k, m in bus.sent if k == "decision"]  # waits for peer 2
        await orch.on_message("status", 2, Status(peer=2, state="failed", reason="oom"))
        await asyncio.wait(list(orch._tasks), timeout=5)
        orch.records.close()
        return bus, orch

    bus, orch = asyncio.run(scenario())
    assert orch.admission.roster().peers == (0, 1)
    (decision,) = [m for k, m in bus.sent if k == "decision"]
    assert isinstance(decision, Decision)
    (schedule,) = [m for k, m in bus.sent if k == "schedule"]
    assert isinstance(schedule, Schedule)
    assert schedule.version == 1
    assert schedule.peers == [0, 1]
    assert schedule.reason == "peer 2 left (status failed: oom)"
    rows: list[dict[str, Any]] = [
        json.loads(line) for line in (tmp_path / "schedules.jsonl").read_text().splitlines()
    ]
    assert [r["version"] for r in rows] == [1]
    control = (tmp_path / "control.jsonl").read_text().splitlines()
    assert len(control) == 1
    assert json.loads(control[0])["peers"] == 2


async def _three_ready_peers(cfg: RunConfig, out: Path) -> tuple[Orchestrator, FakeBus]:
    """An orchestrator on a `FakeBus` whose 3 peers announced "ready" at 127.0.0.1:500<i>."""
    orch = Orchestrator(cfg, out, broker="mqtt://unused:1", run_id="t")
    bus = FakeBus()
    orch.bus = bus  # type: ignore[assignment]
    orch.schedules.start(make_plan(cfg, make_lr_schedule(cfg, 10)))
    for i in range(3):
        status = Status(peer=i, state="ready", address=f"127.0.0.1:{5000 + i}")
        await orch.on_message("status", i, status)
    return orch, bus


def test_a_restarted_peer_is_readmitted_in_a_new_schedule_at_its_new_address(
    tmp_path: Path,
) -> None:
    """A peer's "ready" during training is a restart: its old incarnation is dropped (not
    noticed yet here) and one schedule version takes it back at the address it announced,
    effective REPAIR_AHEAD steps past the newest step a live peer reported (no pace known yet);
    its statistics are not awaited until it reported that step and the others reached it."""
    cfg = load_config(None, ["peers=3", "epochs=2", "control.mode=none"], environ={})

    async def scenario() -> tuple[FakeBus, Orchestrator]:
        orch, bus = await _three_ready_peers(cfg, tmp_path)
        orch.stage = "train"
        for i in range(3):
            await orch.on_message("heartbeat", i, Heartbeat(peer=i, step=7, ts=1.0))
        moved = Status(peer=1, state="training", address="127.0.0.1:6001")
        await orch.on_message("status", 1, moved)  # a live peer's address is kept
        assert orch.admission.peers[1].address == "127.0.0.1:5001"
        back = Status(peer=2, state="ready", address="127.0.0.1:6002", ts=1e10)
        await orch.on_message("status", 2, back)
        await asyncio.wait(list(orch._tasks), timeout=5)
        assert orch.expected() == {0, 1}  # peer 2 joins at step 9
        for i in (0, 1):
            await orch.on_message("heartbeat", i, Heartbeat(peer=i, step=9, ts=2.0))
        assert orch.expected() == {0, 1}  # it has not reported its step 9 yet (fetching)
        await orch.on_message("heartbeat", 2, Heartbeat(peer=2, step=9, ts=2.0))
        assert orch.expected() == {0, 1, 2}
        orch.records.close()
        return bus, orch

    bus, orch = asyncio.run(scenario())
    assert orch.admission.roster().peers == (0, 1, 2)
    assert orch.admission.peers[2].readmissions == 1
    (schedule,) = [m for k, m in bus.sent if k == "schedule"]
    assert isinstance(schedule, Schedule)
    assert schedule.peers == [0, 1, 2]
    assert schedule.addresses == ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:6002"]
    assert schedule.effective_step == 9  # newest reported step 7 + REPAIR_AHEAD
    assert schedule.reason == "peer 2 re-admitted at 127.0.0.1:6002"


def test_a_dropped_peer_heard_again_during_training_is_readmitted(tmp_path: Path) -> None:
    """A peer dropped while it was stalled (SIGSTOP) or cut off is alive after all when its
    heartbeats come back: it is re-admitted at its address in a new schedule version, as a
    restarted peer is; a peer that finished the stage, or heartbeats outside training, are not
    taken back."""
    cfg = load_config(None, ["peers=3", "epochs=2", "control.mode=none"], environ={})

    async def scenario() -> tuple[FakeBus, Orchestrator]:
        orch, bus = await _three_ready_peers(cfg, tmp_path)
        orch.stage = "calibrate"
        orch._drop(2, "silent for 6.1 s")
        await orch.on_message("heartbeat", 2, Heartbeat(peer=2, step=3, ts=1.0))
        assert orch.admission.roster().peers == (0, 1)  # not in training: stays dropped
        orch.stage = "train"
        for i in (0, 1):
            await orch.on_message("heartbeat", i, Heartbeat(peer=i, step=20, ts=2.0))
        await orch.on_message("heartbeat", 2, Heartbeat(peer=2, step=4, ts=3.0))
        await asyncio.wait(list(orch._tasks), timeout=5)
        orch.records.close()
        return bus, orch

    bus, orch = asyncio.run(scenario())
    assert orch.admission.roster().peers == (0, 1, 2)
    assert orch.admission.peers[2].readmissions == 1
    schedules = [m for k, m in bus.sent if k == "schedule"]
    assert isinstance(schedules[-1], Schedule)
    assert schedules[-1].peers == [0, 1, 2]
    assert schedules[-1].addresses[2] == "127.0.0.1:5002"
    assert schedules[-1].effective_step == 22  # the others' step 20 + REPAIR_AHEAD


class SlowBus(FakeBus):
    """A broker session whose publications take a while: what other statuses arrive during."""

    def __init__(self) -> None:
        super().__init__()
        self.publishing = asyncio.Event()

    async def publish(self, kind: str, message: Message, peer: int | None = None) -> bool:
        self.publishing.set()
        await asyncio.sleep(0.05)
        return await super().publish(kind, message, peer)


def test_a_status_heard_while_a_restamp_is_published_gets_the_next_one(tmp_path: Path) -> None:
    """The presence acknowledges every peer process's nonce soon after its status: one that
    arrives while a re-stamp (its acks already taken) is on its way is in a re-stamp that
    follows at once, not only in the periodic refresh 10 s later (its peer waits till then)."""
    from concord.protos.control_plane import Presence

    cfg = load_config(None, ["peers=3", "epochs=2", "control.mode=none"], environ={})

    async def scenario() -> list[list[str]]:
        orch = Orchestrator(cfg, tmp_path, broker="mqtt://unused:1", run_id="t")
        bus = SlowBus()
        orch.bus = bus  # type: ignore[assignment]
        await orch._presence("online")  # the first "online", no peer acknowledged yet
        bus.publishing.clear()
        await orch.on_message("status", 0, Status(peer=0, state="ready", nonce="n0"))
        await bus.publishing.wait()  # the re-stamp for n0 is being published
        await orch.on_message("status", 1, Status(peer=1, state="ready", nonce="n1"))
        await orch.on_message("status", 2, Status(peer=2, state="ready", nonce="n2"))
        for _ in range(100):  # until no re-stamp is pending (each publication takes 50 ms)
            await asyncio.sleep(0.05)
            if orch._restamp is not None and orch._restamp.done():
                break
        orch.records.close()
        return [m.acks for k, m in bus.sent if k == "orchestrator" and isinstance(m, Presence)]

    published = asyncio.run(scenario())
    assert published[0] == []
    assert published[-1] == ["n0", "n1", "n2"]
    assert len(published) <= 3  # the first, n0's, then one for both late statuses
