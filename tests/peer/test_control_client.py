"""A peer's control-plane bookkeeping (`concord.peer.control.ControlClient`) without a broker, and
the parent-death hygiene of `concord.runtime.lifecycle`.

The client is built inside a running loop but never entered (no connection); messages are fed to
its handler `_on_message` directly, as the `Bus` would after validating them. ``bus.connected``
is set by hand where a test needs the client to believe it is connected."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from concord.core.records import EvalRecord
from concord.peer.control import PRESENCE_SILENT, ControlClient
from concord.protos.control_plane import Decision, Plan, Presence, RunControl, Schedule
from concord.runtime.lifecycle import die_with_parent
from tests.records import step_record

ROOT = Path(__file__).resolve().parents[2]
T = 5.0  # seconds: upper bound on any await that must not block (loaded 2-core machine)


def run(test: Callable[[ControlClient], Awaitable[None]]) -> None:
    async def main() -> None:
        client = ControlClient("mqtt://127.0.0.1:1", "t1", 0, heartbeat=1.0, step=lambda: 0)
        client.incarnation = ""  # following an orchestrator without a run nonce (no presence)
        await asyncio.wait_for(test(client), 2 * T)

    asyncio.run(main())


def decision(
    step: int,
    rnd: int,
    *,
    repeat: bool = False,
    target: float | None = None,
    statistic: float | None = None,
    rounds_next: int | None = None,
    reason: str = "",
) -> Decision:
    return Decision(
        step=step,
        round=rnd,
        repeat=repeat,
        target=target,
        statistic=statistic,
        rounds_next=rounds_next,
        reason=reason,
    )


def schedule(version: int, topology: str = "ring") -> Schedule:
    return Schedule(
        version=version,
        peers=[0, 1],
        topology=topology,
        weights=None,
        kappa=1.0,
        seed=0,
        phases=[],
    )


# -- decisions -----------------------------------------------------------------------------------


def test_a_decision_wakes_its_waiter() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        waiter = asyncio.create_task(c.decision((3, 1), timeout=T), name="waiter")
        await asyncio.sleep(0.01)
        assert not waiter.done()  # waiting: nothing filed yet
        other = decision(3, 2, repeat=True)
        c._on_message("decision", None, other)  # another round's decision does not wake it
        await asyncio.sleep(0.01)
        assert not waiter.done()
        d = decision(3, 1, repeat=True, target=0.5, statistic=0.75, reason="above-target")
        t0 = time.monotonic()
        c._on_message("decision", None, d)
        got = await asyncio.wait_for(waiter, T)
        assert got == d
        assert time.monotonic() - t0 < T / 2  # woken, not timed out
        # filed: later calls return it at once, connected or not
        assert await c.decision((3, 1), timeout=T) == d
        c.bus.connected.clear()
        assert await c.decision((3, 2), timeout=T) == other

    run(body)


def test_two_waiters_of_the_same_round_both_get_it() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        a = asyncio.create_task(c.decision((5, 2), timeout=T), name="a")
        b = asyncio.create_task(c.decision((5, 2), timeout=T), name="b")
        await asyncio.sleep(0.01)
        d = decision(5, 2, repeat=False, reason="at-target")
        c._on_message("decision", None, d)
        assert await asyncio.wait_for(asyncio.gather(a, b), T) == [d, d]

    run(body)


def test_a_decision_with_rounds_next_is_found_by_step() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        waiter = asyncio.create_task(c.decision(4, timeout=T), name="by-step")
        await asyncio.sleep(0.01)
        mid = decision(4, 1, repeat=True, reason="lagged-plan")  # no rounds_next: not the last
        c._on_message("decision", None, mid)
        await asyncio.sleep(0.01)
        assert not waiter.done()
        last = decision(4, 2, target=1.0, statistic=0.5, rounds_next=3, reason="lagged-plan")
        c._on_message("decision", None, last)
        assert await asyncio.wait_for(waiter, T) == last
        assert c.last_of_step[4] == last
        assert await c.decision(4, timeout=T) == last
        assert await c.decision((4, 2), timeout=T) == last  # filed by (step, round) too
        assert await c.decision((4, 1), timeout=T) == mid

    run(body)


def test_a_step_without_its_last_decision_times_out() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        c._on_message("decision", None, decision(6, 1, repeat=True, reason="lagged-plan"))
        t0 = time.monotonic()
        assert await c.decision(6, timeout=0.05) is None
        assert await c.decision((6, 2), timeout=0.05) is None
        elapsed = time.monotonic() - t0
        assert 0.1 <= elapsed < T  # waited (twice 0.05 s), then gave up

    run(body)


def test_an_offline_orchestrator_ends_every_wait_at_once_and_online_restores_them() -> None:
    """Its Last-Will ("offline") arrives while peers wait for a decision: they get None now,
    not after the decision timeout; further asks return at once; once it is online again,
    peers wait for decisions as before."""
    from concord.protos.control_plane import Presence

    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        c._on_message("orchestrator", None, Presence(state="online"))
        waiting = [
            asyncio.create_task(c.decision((7, 1), timeout=30.0), name="barrier"),
            asyncio.create_task(c.decision(6, timeout=30.0), name="lagged"),
        ]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waiting)
        t0 = time.monotonic()
        c._on_message("orchestrator", None, Presence(state="offline", reason="connection lost"))
        assert await asyncio.wait_for(asyncio.gather(*waiting), T) == [None, None]
        assert c.orchestrator_gone
        assert await c.decision((8, 1), timeout=30.0) is None
        assert time.monotonic() - t0 < T / 2  # at once, not after the 30 s timeout
        c._on_message("orchestrator", None, Presence(state="online"))
        assert not c.orchestrator_gone
        again = asyncio.create_task(c.decision((8, 1), timeout=T), name="again")
        await asyncio.sleep(0.05)
        assert not again.done()  # waits again
        d = decision(8, 1, reason="at-target")
        c._on_message("decision", None, d)
        assert await asyncio.wait_for(again, T) == d

    run(body)


def test_no_wait_when_not_connected() -> None:
    async def body(c: ControlClient) -> None:
        assert not c.connected
        t0 = time.monotonic()
        assert await c.decision((1, 1), timeout=T) is None
        assert await c.decision(1, timeout=T) is None
        assert time.monotonic() - t0 < T / 2  # at once, not after the timeout
        assert c._waiters == {}  # nothing left waiting

    run(body)


def test_old_decisions_are_pruned() -> None:
    async def body(c: ControlClient) -> None:
        for step in range(200):
            for rnd in (1, 2, 3):
                c._on_message("decision", None, decision(step, rnd, repeat=rnd < 3))
            c._on_message("decision", None, decision(step, 4, rounds_next=2))
        # only the last few steps are kept: memory stays bounded in a long run
        assert {s for s, _ in c.decisions} == set(range(195, 200))
        assert len(c.decisions) == 5 * 4
        assert set(c.last_of_step) == set(range(195, 200))
        assert await c.decision((199, 3), timeout=T) == decision(199, 3)
        assert await c.decision((10, 1), timeout=0.01) is None  # pruned (and not connected)

    run(body)


def test_decisions_do_not_touch_the_changed_event() -> None:
    async def body(c: ControlClient) -> None:
        c._on_message("decision", None, decision(0, 1))
        assert not c.changed.is_set()  # the training thread waits on decisions, not on this
        c._on_message("control", None, RunControl(action="start", stage="train"))
        assert c.changed.is_set()
        assert c.control == RunControl(action="start", stage="train")

    run(body)


# -- retained state ------------------------------------------------------------------------------


def test_schedules_with_lower_versions_do_not_replace_newer_ones() -> None:
    async def body(c: ControlClient) -> None:
        c._on_message("schedule", None, schedule(3))
        assert c.schedule == schedule(3)
        assert c.changed.is_set()
        c.changed.clear()
        c._on_message("schedule", None, schedule(2, "complete"))  # a stale retained copy
        assert c.schedule == schedule(3)
        c._on_message("schedule", None, schedule(3, "chain"))  # re-publication of version 3
        assert c.schedule == schedule(3, "chain")
        c._on_message("schedule", None, schedule(7))
        assert c.schedule == schedule(7)
        c._on_message("schedule", None, schedule(0))
        assert c.schedule == schedule(7)

    run(body)


def test_wait_for_sees_a_plan_arriving() -> None:
    async def body(c: ControlClient) -> None:
        plan = Plan(total_steps=10, phases={}, lr={}, control={})

        async def later() -> None:
            await asyncio.sleep(0.05)
            c._on_message("plan", None, plan)

        task = asyncio.create_task(later(), name="plan-later")
        assert await c.wait_for(lambda: c.plan is not None, timeout=T)
        await task
        assert c.plan == plan
        assert not await c.wait_for(lambda: c.schedule is not None, timeout=0.05)

    run(body)


# -- concord.runtime.lifecycle.die_with_parent
# -------------------------------------------------------------


def test_die_with_parent_does_nothing_without_the_variable() -> None:
    assert die_with_parent({}) is False
    assert die_with_parent({"CONCORD_PARENT_PID": ""}) is False
    assert die_with_parent({"CONCORD_PARENT_PID": "not-a-pid"}) is False


def _child(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_die_with_parent_arms_with_the_real_parent_pid() -> None:
    out = _child(
        """
        import os
        from concord.runtime.lifecycle import die_with_parent
        print(die_with_parent({}))
        print(die_with_parent({"CONCORD_PARENT_PID": str(os.getppid())}))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_die_with_parent_exits_when_the_parent_is_already_gone() -> None:
    # a pid that is not our parent: as if the launcher died before the child armed the signal
    out = _child(
        """
        import os
        from concord.runtime.lifecycle import die_with_parent
        die_with_parent({"CONCORD_PARENT_PID": str(os.getppid() + 1)})
        print("still alive")
        """
    )
    assert out.returncode == 143
    assert "still alive" not in out.stdout


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_child_dies_with_its_sigkilled_parent() -> None:
    """launcher (killed with SIGKILL) → child that armed die_with_parent: the child goes too."""
    launcher_code = textwrap.dedent(
        """
        import os, subprocess, sys, time
        child = subprocess.Popen(
            [sys.executable, "-c",
             "import os, sys, time\\n"
             "from concord.runtime.lifecycle import die_with_parent\\n"
             "ok = die_with_parent()\\n"
             "print(os.getpid(), ok, flush=True)\\n"
             "time.sleep(60)\\n"],
            env={**os.environ, "CONCORD_PARENT_PID": str(os.getpid())},
            stdout=sys.stdout,
        )
        time.sleep(60)
        """
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", launcher_code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    child_pid = None
    try:
        assert launcher.stdout is not None
        ready, _, _ = select.select([launcher.stdout], [], [], 60)  # the child's start-up
        assert ready, "the child did not report within 60 s"
        line = launcher.stdout.readline()  # "<pid> True"
        pid_text, armed = line.split()
        child_pid = int(pid_text)
        assert armed == "True"
        assert not _gone(child_pid)
        launcher.kill()  # SIGKILL: the launcher cannot clean up
        launcher.wait(timeout=T)
        deadline = time.monotonic() + T
        while not _gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(child_pid), "the child outlived its SIGKILLed parent"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=T)
        if child_pid is not None and not _gone(child_pid):
            os.kill(child_pid, 9)
        if launcher.stdout is not None:
            launcher.stdout.close()


# -- the training thread's side (OrchestratedControl) ----------------------------------------------


def test_lagged_control_plans_from_step_minus_lag_and_its_stats_ride_on_the_metrics() -> None:
    """Lagged, lag 2: step t runs the rounds of the decision that closed t − 2, read without a
    hop to the event loop when it is already there; the step's statistics leave with its
    metrics record (one message), none before; statistics whose record never came leave on the
    stats topic at the next step's start, or when the stage ends."""
    import threading

    import torch

    from concord.core.control.plan import Phase
    from concord.peer.control import OrchestratedControl
    from concord.protos.control_plane import Message, Metrics, Stats

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = asyncio.run_coroutine_threadsafe(_make_client(), loop).result(T)
        sent: list[tuple[str, list[Message]]] = []
        client.send_all = lambda kind, messages: sent.append((kind, list(messages)))  # type: ignore[method-assign]
        client.send = lambda kind, message, peer=True: sent.append((kind, [message]))  # type: ignore[method-assign]

        def wait_sent(count: int) -> None:
            deadline = time.monotonic() + T
            while len(sent) < count and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)  # nothing more may follow
            assert len(sent) == count, sent

        hook = OrchestratedControl(
            client, loop, stage="train", lagged=True, lag=2, timeout=T, bytes_sent=lambda: 7
        )
        phase = Phase(index=1, start=0, end=100, mode="gossip", topology=None, controlled=True)
        norms = torch.tensor([0.5])
        assert hook.begin(1, phase, norms).planned == 1  # 1 − 2 < the phase's start
        loop.call_soon_threadsafe(client._on_decision, decision(3, 2, rounds_next=3, target=1.0))
        deadline = time.monotonic() + T
        while 3 not in client.last_of_step and time.monotonic() < deadline:
            time.sleep(0.01)
        hook._held = []  # step 1 ran no rounds here
        hook.wait_s = 0.0
        assert hook.begin(5, phase, norms).planned == 3
        assert (hook.how, hook.target, hook.wait_s) == ("lagged-plan", 1.0, 0.0)  # no hop
        theta = torch.tensor([0.25])
        assert hook.after_round(1, torch.zeros(1, 2), theta)
        assert hook.after_round(2, torch.zeros(1, 2), theta)
        assert not hook.after_round(3, torch.zeros(1, 2), theta)
        wait_sent(0)  # nothing of its own: the statistics wait for the step's record
        hook.publish_metrics(step_record(5, loss=0.5, extra={"stage": "train", "ok": True}))
        wait_sent(1)
        ((kind, (metrics,)),) = sent
        assert kind == "metrics"
        assert isinstance(metrics, Metrics)
        assert metrics.values["loss"] == 0.5
        assert {"stage", "ok"}.isdisjoint(metrics.values)  # numbers only
        assert "theta" not in metrics.values  # absent values are left out
        assert [(s.step, s.round, s.theta, s.grad_norm, s.bytes_sent) for s in metrics.stats] == [
            (5, r, 0.25, 0.5, 7) for r in (1, 2, 3)
        ]
        hook.publish_metrics(EvalRecord(step=5, epoch=0.1, peer=0, accuracy_mean_peer=0.9))
        wait_sent(2)
        eval_record = sent[1][1][0]
        assert isinstance(eval_record, Metrics)
        assert eval_record.stats == []
        assert (eval_record.event, eval_record.values["accuracy_mean_peer"]) == ("eval", 0.9)
        # a step whose record is not published: its statistics go out when the next begins
        sent.clear()

        def rounds() -> int:
            r = 1
            while hook.after_round(r, torch.zeros(1, 2), theta):
                r += 1
            return r

        hook.begin(6, phase, norms)
        taken = rounds()
        assert (hook.how, taken) == ("fallback", 3)  # no decision: the last plan holds
        hook.begin(7, phase, norms)
        wait_sent(1)
        ((kind, stats),) = sent
        assert kind == "stats"
        assert [(s.step, s.round) for s in stats if isinstance(s, Stats)] == [
            (6, 1),
            (6, 2),
            (6, 3),
        ]
        rounds()
        hook.close()  # the stage ends before step 7's record
        wait_sent(2)
        kind, held = sent[1]
        assert kind == "stats"
        assert [(s.step, s.round) for s in held if isinstance(s, Stats)] == [(7, 1), (7, 2), (7, 3)]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(T)
        loop.close()


def test_a_lagged_plan_is_awaited_only_after_the_steps_first_round() -> None:
    """Lag 1: the decision closing step t − 1 may still be on its way when step t begins; every
    step runs one round anyway, so `begin` does not wait and `after_round(1)` takes the plan
    when it arrives."""
    import threading

    import torch

    from concord.core.control.plan import Phase
    from concord.peer.control import OrchestratedControl

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        client = asyncio.run_coroutine_threadsafe(_make_client(), loop).result(T)
        client.send_all = lambda kind, messages: None  # type: ignore[method-assign]
        loop.call_soon_threadsafe(client.bus.connected.set)  # as if the broker were there
        hook = OrchestratedControl(
            client, loop, stage="train", lagged=True, lag=1, timeout=T, bytes_sent=lambda: 0
        )
        phase = Phase(index=1, start=0, end=100, mode="gossip", topology=None, controlled=True)
        t0 = time.perf_counter()
        hook.begin(4, phase, torch.tensor([1.0]))
        assert time.perf_counter() - t0 < 0.1  # no wait in begin
        assert (hook.wait_s, hook.how) == (0.0, "orchestrator")
        late = decision(3, 1, rounds_next=2, target=0.5)
        loop.call_soon_threadsafe(loop.call_later, 0.3, client._on_decision, late)
        theta = torch.tensor([0.1])
        assert hook.after_round(1, torch.zeros(1, 2), theta)  # waited, then: 2 rounds
        assert 0.2 < hook.wait_s < T
        assert (hook.how, hook.target, hook.fallbacks) == ("lagged-plan", 0.5, 0)
        assert not hook.after_round(2, torch.zeros(1, 2), theta)
        assert hook.end(4) == 0.5
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(T)
        loop.close()


async def _make_client() -> ControlClient:
    c = ControlClient("mqtt://127.0.0.1:1", "t1", 0, heartbeat=1.0, step=lambda: 0)
    c.incarnation = ""  # following an orchestrator without a run nonce (no presence)
    return c


# -- the waits' deadlines (ControlClient.give_up) ------------------------------------------------

LIMITS = {"absent_timeout": 5.0, "broker_lost_timeout": 7.0}


def presence(state: str, reason: str = "") -> Presence:
    return Presence(state=state, ts=time.time(), reason=reason)


def test_an_orchestrator_never_seen_is_absent_from_the_connection_on() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        t0 = c.started + 100.0  # connected long after the client was made
        assert c.give_up(t0, **LIMITS) is None
        assert c.give_up(t0 + 4.9, **LIMITS) is None
        why = c.give_up(t0 + 5.0, **LIMITS)
        assert why is not None
        assert "never seen" in why
        assert "absent_timeout = 5" in why

    run(body)


def test_an_offline_orchestrator_is_given_up_on_and_online_restores_it() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        c._on_message("orchestrator", None, presence("online"))
        t0 = time.monotonic()
        assert c.give_up(t0, **LIMITS) is None
        c._on_message("orchestrator", None, presence("offline", "connection lost"))
        assert c.give_up(t0 + 4.0, **LIMITS) is None
        c._on_message("orchestrator", None, presence("online"))  # back in time
        assert c.give_up(t0 + 20.0, **LIMITS) is None  # online and fresh: present
        c._on_message("orchestrator", None, presence("offline", "connection lost"))
        t1 = time.monotonic()
        why = c.give_up(t1 + 5.5, **LIMITS)
        assert why is not None
        assert "offline (connection lost)" in why

    run(body)


def test_an_online_presence_not_refreshed_counts_as_absent() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        c._on_message("orchestrator", None, presence("online"))
        t0 = time.monotonic()
        assert c.give_up(t0, **LIMITS) is None
        assert c.give_up(t0 + PRESENCE_SILENT - 1, **LIMITS) is None
        why = c.give_up(t0 + PRESENCE_SILENT + 1, **LIMITS)
        assert why is not None
        assert "not been refreshed" in why

    run(body)


def test_a_lost_broker_is_given_up_on_after_its_timeout_and_absence_restarts_at_reconnect() -> None:
    async def body(c: ControlClient) -> None:
        t0 = time.monotonic()
        assert c.give_up(t0 + 1000.0, **LIMITS) is None  # never connected: join's business
        c.bus.connects = 1
        c.bus.connected.set()
        c._on_message("orchestrator", None, presence("online"))
        assert c.give_up(t0, **LIMITS) is None
        c.bus.connected.clear()  # lost …
        assert c.give_up(t0 + 1.0, **LIMITS) is None
        assert c.give_up(t0 + 7.9, **LIMITS) is None
        c.bus.connected.set()  # … and back within the timeout: the clocks restart
        assert c.give_up(t0 + 8.0, **LIMITS) is None
        c.bus.connected.clear()
        assert c.give_up(t0 + 9.0, **LIMITS) is None
        why = c.give_up(t0 + 16.0, **LIMITS)
        assert why is not None
        assert "broker_lost_timeout = 7" in why

    run(body)


def test_watch_returns_the_reason_to_give_up() -> None:
    async def body(c: ControlClient) -> None:
        c.bus.connected.set()
        c._on_message("orchestrator", None, presence("offline", "connection lost"))
        t0 = time.monotonic()
        why = await asyncio.wait_for(
            c.watch(absent_timeout=0.3, broker_lost_timeout=10.0, every=0.05), T
        )
        assert "offline" in why
        assert time.monotonic() - t0 >= 0.25

    run(body)
