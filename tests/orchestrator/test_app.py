"""`concord.orchestrator.app.Orchestrator`'s wiring, with a stand-in for the broker session: a
dropped peer releases pending rounds and yields a repaired schedule, published and recorded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from concord.core.config import load_config
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
    assert orch.admission.live() == {0, 1}
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
