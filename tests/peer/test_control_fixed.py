"""A peer under ``control.mode = "fixed"`` (`concord.peer.control.OrchestratedControl`): every
controlled step runs exactly ``control.rounds`` rounds without asking the orchestrator — no wait,
no fallback — and the step's statistics ride on its metrics record, for the orchestrator's books.

The client is built inside a running loop but never entered (no broker): had the hook asked for
a decision, the client would answer None at once and the step would fall back to one round."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from concord.core.control.plan import Phase
from concord.peer.control import ControlClient, OrchestratedControl
from concord.protos.control_plane import Message, Metrics, Stats
from tests.records import step_record

T = 5.0  # seconds: upper bound on any wait that must not block (loaded 2-core machine)


async def _make_client() -> ControlClient:
    c = ControlClient("mqtt://127.0.0.1:1", "t1", 0, heartbeat=1.0, step=lambda: 0)
    c.incarnation = ""  # following an orchestrator without a run nonce (no presence)
    return c


@pytest.mark.parametrize("lagged", [False, True])
def test_fixed_rounds_run_without_decisions_and_report_with_the_step(lagged: bool) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = asyncio.run_coroutine_threadsafe(_make_client(), loop).result(T)
        sent: list[tuple[str, list[Message]]] = []
        client.send_all = lambda kind, messages: sent.append((kind, list(messages)))  # type: ignore[method-assign]
        client.send = lambda kind, message, peer=True: sent.append((kind, [message]))  # type: ignore[method-assign]
        hook = OrchestratedControl(
            client,
            loop,
            stage="train",
            lagged=lagged,
            timeout=T,
            bytes_sent=lambda: 9,
            max_rounds=5,
            fixed_rounds=3,
        )
        phase = Phase(index=1, start=0, end=100, mode="gossip", topology=None, controlled=True)
        theta = torch.tensor([0.5])
        for step in (0, 1, 2):  # from the phase's first step on (lagged or not)
            assert hook.begin(step, phase, torch.tensor([2.0])).planned == 3
            ran = 1
            while hook.after_round(ran, torch.zeros(1, 2), theta):
                ran += 1
            assert ran == 3
            assert (hook.how, hook.target, hook.end(step)) == ("fixed", None, None)
            hook.publish_metrics(step_record(step))
        assert (hook.fallbacks, hook.clamped, hook.wait_s) == (0, 0, 0.0)
        deadline = time.monotonic() + T
        while len(sent) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [kind for kind, _ in sent] == ["metrics"] * 3  # no stats of their own
        for step, (_, (record,)) in enumerate(sent):
            assert isinstance(record, Metrics)
            assert [
                (s.step, s.round, s.theta, s.grad_norm, s.bytes_sent) for s in record.stats
            ] == [(step, r, 0.5, 2.0, 9) for r in (1, 2, 3)]
            assert all(isinstance(s, Stats) for s in record.stats)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(T)
        loop.close()


def test_fixed_rounds_are_bounded_by_max_rounds_and_ignored_outside_training() -> None:
    loop = asyncio.new_event_loop()
    try:
        client = loop.run_until_complete(_make_client())
        common = {"lagged": False, "timeout": T, "bytes_sent": lambda: 0, "max_rounds": 2}
        hook = OrchestratedControl(client, loop, stage="train", fixed_rounds=4, **common)  # type: ignore[arg-type]
        assert hook.fixed == 2
        calibrating = OrchestratedControl(client, loop, stage="calibrate", fixed_rounds=4, **common)  # type: ignore[arg-type]
        assert calibrating.fixed is None
    finally:
        loop.close()
