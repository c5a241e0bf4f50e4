"""Forged control-plane messages, published through a real (embedded) broker by a rogue client
that speaks the protocol: the peer's control client and the orchestrator check what they receive
— rounds clamped to ``control.max_rounds``, schedules refused unless they name the expected peers
with their addresses and valid mixing matrices, statistics refused unless plausible and for an
open step — and no message can crash either (a handler exception is logged and counted)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
from click.testing import CliRunner

from concord.core.config import load_config
from concord.core.control.plan import Phase
from concord.errors import OrchestratorError
from concord.lab.cli import main
from concord.orchestrator.app import Orchestrator
from concord.orchestrator.broker import EmbeddedBroker
from concord.peer.control import ControlClient, OrchestratedControl
from concord.peer.schedules import ScheduleCheck
from concord.protos.control_plane import (
    SCHEMA_VERSION,
    TOPICS,
    Decision,
    Message,
    Presence,
    Schedule,
    Stats,
    Status,
    Topics,
    encode,
)
from concord.protos.mqtt import client

DIRECTED = "exponential-one-peer-directed"
T = 10.0  # seconds: upper bound on anything that must happen (loaded 2-core machine)
RUN = "forged"
ADDRESSES = ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002", "127.0.0.1:5003"]
ALL = ADDRESSES[:3]


async def _until(predicate: Callable[[], bool], what: str, timeout: float = T) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _rogue(url: str) -> AsyncIterator[Callable[..., Awaitable[None]]]:
    """A client that publishes whatever it is given on this run's topics."""
    topics = Topics(RUN)
    async with client(url, "rogue") as c:

        async def send(
            kind: str, message: Message | dict[str, Any], peer: int | None = None, **kw: Any
        ) -> None:
            payload = (
                encode(message)
                if isinstance(message, Message)
                else bytes(msgpack.packb({"v": SCHEMA_VERSION, "kind": kind, **message}))
            )
            retain = kw.get("retain", TOPICS[kind].retain)
            await c.publish(topics.topic(kind, peer), payload, qos=1, retain=retain)

        yield send


def _schedule(version: int, peers: list[int], **changes: Any) -> Schedule:
    fields: dict[str, Any] = {
        "version": version,
        "peers": peers,
        "topology": "ring",
        "weights": None,
        "kappa": 1.0,
        "seed": 0,
        "phases": [{"index": 1, "topology": None}],
        "addresses": [ADDRESSES[p] for p in peers],
        "effective_step": 0,
    }
    fields.update(changes)
    return Schedule(**fields)


# -- the peer ------------------------------------------------------------------------------------


def test_a_peer_refuses_forged_schedules_and_clamps_forged_rounds() -> None:
    cfg = load_config(None, ["peers=3", "control.max_rounds=4"], environ={})

    async def scenario() -> None:
        async with EmbeddedBroker() as broker:
            check = ScheduleCheck(cfg, 0)
            check.advertise = ADDRESSES[0]
            ctl = ControlClient(
                broker.url, RUN, 0, heartbeat=1.0, step=lambda: 0, schedule_check=check
            )
            async with ctl, _rogue(broker.url) as send:
                assert await ctl.bus.wait_connected(T)
                # without security anyone may pose as the orchestrator: presence, then messages
                # (acknowledging this peer process, as the real orchestrator does)
                online = Presence(state="online", ts=time.time(), acks=[ctl.nonce])
                await send("orchestrator", online)
                await send("schedule", _schedule(1, [0, 1, 2]))
                await _until(lambda: ctl.schedule is not None, "the real schedule")
                forged = [
                    _schedule(2, [1, 2], addresses=ALL[1:]),  # without this peer
                    _schedule(3, [0, 1, 2, 3], addresses=ADDRESSES),
                    _schedule(4, [0, 1, 2], addresses=["10.9.9.9:1", *ALL[1:]]),
                    _schedule(5, [0, 1, 2], addresses=[ADDRESSES[0], "10.9.9.9:1", ADDRESSES[2]]),
                    _schedule(6, [0, 1, 2], weights="uniform"),  # not this run's weights
                    # a directed (column-stochastic) graph for D-SGD: not symmetric
                    _schedule(
                        7,
                        [0, 1, 2],
                        phases=[{"index": 1, "topology": "exponential-one-peer-directed"}],
                    ),
                    _schedule(8, [0, 1, 2], phases=[{"index": 1, "topology": "no-such-graph"}]),
                    _schedule(9, [0, 1, 2], phases=[{"index": 1, "topology": "file:/etc/passwd"}]),
                    _schedule(10, [0, 1, 2], phases=[{"index": 0, "topology": None}]),
                ]
                for s in forged:
                    await send("schedule", s)  # retained, like the real one
                await _until(lambda: ctl.schedules_refused >= len(forged), "the refusals")
                assert ctl.schedule is not None
                assert ctl.schedule.version == 1  # kept
                # a real repair (peer 2 left) is still taken
                await send("schedule", _schedule(11, [0, 1], effective_step=5))
                await _until(lambda: ctl.schedule is not None and ctl.schedule.version == 11, "v11")

                # rounds: lagged, a forged plan of 10 000 rounds for step 6
                await send("decision", Decision(step=5, round=1, repeat=False, rounds_next=10_000))
                await _until(lambda: 5 in ctl.last_of_step, "the forged plan")
                loop = asyncio.get_running_loop()
                phase = Phase(1, 0, 100, "gossip", None, True)
                lagged = OrchestratedControl(
                    ctl, loop, stage="train", lagged=True, timeout=2.0,
                    bytes_sent=lambda: 0, max_rounds=cfg.control.max_rounds,
                )  # fmt: skip
                rounds = await asyncio.to_thread(_rounds, lagged, 6, phase)
                assert rounds == cfg.control.max_rounds
                assert lagged.clamped == 1
                # barrier: "repeat" after every round of step 7, also past max_rounds
                for r in range(1, 10):
                    await send("decision", Decision(step=7, round=r, repeat=True))
                await _until(lambda: (7, 9) in ctl.decisions, "the forged repeats")
                barrier = OrchestratedControl(
                    ctl, loop, stage="train", lagged=False, timeout=2.0,
                    bytes_sent=lambda: 0, max_rounds=cfg.control.max_rounds,
                )  # fmt: skip
                rounds = await asyncio.to_thread(_rounds, barrier, 7, phase)
                assert rounds == cfg.control.max_rounds
                assert barrier.clamped == 1

                # a handler that raises: logged, counted, the client keeps working
                def broken(s: Schedule, current: Schedule | None) -> str | None:
                    raise RuntimeError("boom")

                ctl.schedule_check = broken
                await send("schedule", _schedule(12, [0, 1]))
                await _until(lambda: ctl.handler_errors == 1, "the handler error")
                await send("decision", Decision(step=9, round=1, repeat=False))
                await _until(lambda: (9, 1) in ctl.decisions, "a decision after the error")
                assert ctl.schedule is not None
                assert ctl.schedule.version == 11

    asyncio.run(scenario())


def _rounds(ctl: OrchestratedControl, step: int, phase: Phase) -> int:
    """Run one step's rounds as the training thread would; the number of rounds run."""
    import torch

    ctl.begin(step, phase, torch.ones(1))
    r = 1
    while ctl.after_round(r, torch.zeros(1), torch.ones(1)):
        r += 1
        assert r <= 100, "no end of rounds"
    ctl.end(step)
    return r


def _ready(peer: int, address: str) -> Status:
    return Status(peer=peer, state="ready", address=address, steps_per_epoch=10, fingerprint="f")


# -- the orchestrator ----------------------------------------------------------------------------


def test_the_orchestrator_refuses_forged_statistics_and_survives_handler_errors(
    tmp_path: Path,
) -> None:
    cfg = load_config(
        None,
        ["peers=2", "network.startup_timeout=60", "orchestrator.decision_timeout=60"],
        environ={},
    )

    async def scenario() -> None:
        async with EmbeddedBroker() as broker:
            orch = Orchestrator(cfg, tmp_path, broker=broker.url, run_id=RUN)
            run = asyncio.create_task(orch.run())
            async with _rogue(broker.url) as send:
                await _until(lambda: orch.bus is not None and orch.bus.connected.is_set(), "bus")
                # a malformed address is refused, not fatal
                await send("status", _ready(1, "nohost"), 1)
                for i in range(2):
                    await send("status", _ready(i, ADDRESSES[i]), i)
                await _until(lambda: orch.book is not None and orch.stage == "train", "train")
                book = orch.book
                assert book is not None
                forged: list[tuple[int, dict[str, Any]]] = [
                    (
                        0,
                        {"peer": 0, "step": 0, "round": 1, "theta": float("nan"), "grad_norm": 1.0},
                    ),
                    (0, {"peer": 0, "step": 0, "round": 1, "theta": -1.0, "grad_norm": 1.0}),
                    (0, {"peer": 0, "step": 0, "round": 1, "theta": 1e300, "grad_norm": 1.0}),
                    (
                        0,
                        {"peer": 0, "step": 0, "round": 1, "theta": 1.0, "grad_norm": float("inf")},
                    ),
                    (7, {"peer": 7, "step": 0, "round": 1, "theta": 1.0, "grad_norm": 1.0}),
                    (1, {"peer": 0, "step": 0, "round": 1, "theta": 1.0, "grad_norm": 1.0}),
                    (0, {"peer": 0, "step": 50, "round": 1, "theta": 1.0, "grad_norm": 1.0}),
                    (0, {"peer": 0, "step": 10**9, "round": 1, "theta": 1.0, "grad_norm": 1.0}),
                    (0, {"peer": 0, "step": 0, "round": 10**6, "theta": 1.0, "grad_norm": 1.0}),
                    (0, {"peer": 0, "step": 0, "round": 1, "theta": 1.0, "grad_norm": 1.0, "x": 1}),
                ]
                for peer, fields in forged:
                    await send("stats", fields, peer)
                await send("stats", {"v": 3, **forged[-1][1]}, 0)  # another schema version
                await asyncio.sleep(1.0)
                assert not book.pending
                assert not book.decided
                assert not book.records
                assert orch.stats_refused >= 4
                # the book still works: a real round of step 0 is decided
                for i in range(2):
                    await send("stats", Stats(peer=i, step=0, round=1, theta=0.5, grad_norm=1.0), i)
                await _until(lambda: (0, 1) in book.decided, "the real round")
                # a handler exception: counted, the orchestrator lives on
                real = orch.admission.heard

                def broken(*args: Any) -> None:
                    raise RuntimeError("boom")

                orch.admission.heard = broken  # type: ignore[method-assign]
                await send("heartbeat", {"peer": 0, "step": 0, "ts": 1.0}, 0)
                await _until(lambda: orch.handler_errors == 1, "the handler error")
                orch.admission.heard = real  # type: ignore[method-assign]
                assert not run.done()
                assert orch.admission.peers[1].address == ADDRESSES[1]
            orch.stop_requested = True
            orch.changed.set()
            with contextlib.suppress(OrchestratorError):
                await asyncio.wait_for(run, T)

    asyncio.run(scenario())


# -- run ids -------------------------------------------------------------------------------------


def test_an_orchestrator_refuses_a_run_id_with_a_live_orchestrator(tmp_path: Path) -> None:
    cfg = load_config(None, ["peers=2", "network.startup_timeout=30"], environ={})

    async def scenario() -> None:
        async with EmbeddedBroker() as broker:
            async with _rogue(broker.url) as send:
                await send("orchestrator", Presence(state="online", ts=time.time()))
                orch = Orchestrator(cfg, tmp_path / "a", broker=broker.url, run_id=RUN)
                with pytest.raises(OrchestratorError, match="another orchestrator is live"):
                    await asyncio.wait_for(orch.run(), T)
                # a leftover of a crashed run (stale "online") does not stop a new run
                await send("orchestrator", Presence(state="online", ts=time.time() - 3600))
                orch = Orchestrator(cfg, tmp_path / "b", broker=broker.url, run_id=RUN)
                run = asyncio.create_task(orch.run())
                await _until(lambda: orch.stage == "" and bool(orch._own_presence), "online")
                orch.stop_requested = True
                orch.changed.set()
                with contextlib.suppress(OrchestratorError):
                    await asyncio.wait_for(run, T)
            # at its end the run cleared its retained topics
            seen: list[str] = []
            async with client(broker.url, "late") as late:
                await late.subscribe(Topics(RUN).all(), qos=1)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        async for m in late.messages:
                            seen += [str(m.topic)] if m.payload else []
            assert seen == []

    asyncio.run(scenario())


# -- the commands --------------------------------------------------------------------------------


def test_commands_check_advertise_run_id_and_a_reused_out(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("peers = 2\n")
    run = CliRunner()
    base = ["peer", "--config", str(config), "--id", "0", "--broker", "mqtt://127.0.0.1:1"]
    for bad in ("nohost", "h:0", "h:70000", "no-such-host.invalid:5000"):
        r = run.invoke(main, [*base, "--run-id", "x", "--advertise", bad])
        assert r.exit_code == 2, r.output
        assert "--advertise" in r.output
    r = run.invoke(main, base)  # no name, no --run-id: peers could never meet the orchestrator
    assert r.exit_code == 2, r.output
    assert "--run-id" in r.output
    out = tmp_path / "orch"
    out.mkdir()
    (out / "orchestrator.json").write_text('{"broker": "mqtt://stale:1", "run": "old"}')
    r = run.invoke(main, ["orchestrator", "--config", str(config), "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "--force" in r.output
    r = run.invoke(main, ["sim", "--out", str(out), "--set", "peers=2"])
    assert r.exit_code == 2, r.output
    assert "--force" in r.output
    r = run.invoke(main, [*base, "--run-id", "x", "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert "--force" in r.output
    assert (out / "orchestrator.json").is_file()  # refused: nothing removed
