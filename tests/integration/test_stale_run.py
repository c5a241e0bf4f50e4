"""Per-run freshness against real brokers (Mosquitto and the embedded one, both anonymous with
signed control: the documented "External Mosquitto" set-up). A validly signed, retained
``control: stop`` and ``online`` presence of an earlier run under the same run id, re-published
after the new orchestrator came up, are obeyed by no peer — neither one that was already
following the new orchestrator nor one that starts after the replay (a peer that has heard
nothing yet accepts the first validly signed message it sees, so signatures alone did not stop
it: 4 of 4 peers exited "stopped before the end of training" in the field)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import structlog

from concord.orchestrator.broker import EmbeddedBroker, MosquittoBroker, mosquitto_binary
from concord.peer.certs import init_ca, issue_orchestrator, issue_peer
from concord.peer.control import ControlClient
from concord.protos.control_plane import Presence, RunControl, Schedule, Topics
from concord.protos.mqtt import Bus, client
from concord.protos.signing import Signer, Signing, Verifier

T = 10.0
RUN = "stalerun"
TOPICS = Topics(RUN)
SCHEDULE = Schedule(
    version=1, peers=[0, 1], topology="ring", weights=None, kappa=1.0, seed=0, phases=[]
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    init_ca(d, run_id=RUN)
    for i in range(2):
        issue_peer(d, i)
    issue_orchestrator(d)
    return d


def signing(pki: Path, who: str) -> Signing:
    verifier = Verifier.load(pki / "ca.crt", RUN)
    return Signing(Signer.load(who, pki / f"{who}.key", pki / f"{who}.crt", RUN), verifier)


@asynccontextmanager
async def _broker(kind: str) -> AsyncIterator[str]:
    if kind == "mosquitto":
        if mosquitto_binary() is None:
            pytest.skip("mosquitto missing")
        async with MosquittoBroker() as m:
            yield m.url
    else:
        async with EmbeddedBroker() as b:
            yield b.url


async def _until(predicate: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + T
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _online(*peers: ControlClient) -> Presence:
    return Presence(state="online", ts=time.time(), acks=[p.nonce for p in peers])


def _orchestrator(url: str, pki: Path, incarnation: str) -> Bus:
    return Bus(
        url,
        f"orchestrator-{RUN}",
        TOPICS,
        subscribe=[],
        handler=lambda *_: None,
        signing=signing(pki, "orchestrator"),
        incarnation=incarnation,
    )


async def _recorded(url: str, kinds: list[str]) -> dict[str, bytes]:
    """The retained bytes on ``kinds``' topics, as an eavesdropper records them."""
    got: dict[str, bytes] = {}
    async with client(url, "recorder") as c:
        for kind in kinds:
            await c.subscribe(TOPICS.topic(kind), qos=1)
        async with asyncio.timeout(T):
            async for m in c.messages:
                assert isinstance(m.payload, bytes | bytearray)
                got[str(m.topic).rsplit("/", 1)[-1]] = bytes(m.payload)
                if len(got) == len(kinds):
                    break
    return got


@pytest.mark.parametrize("kind", ["mosquitto", "embedded"])
def test_a_signed_stop_of_an_earlier_run_is_obeyed_by_no_peer(kind: str, pki: Path) -> None:
    async def main() -> None:
        async with _broker(kind) as url:
            # the earlier run: its presence and its final stop, a moment ago (its peers'
            # nonces acknowledged: any recent presence is a valid one)
            old = _orchestrator(url, pki, "a" * 16)
            then = time.time() - 1.0
            async with old:
                assert await old.wait_connected(T)
                await old.publish(
                    "orchestrator", Presence(state="online", ts=then, acks=["0123456789abcdef"])
                )
                await old.publish("control", RunControl(action="stop", ts=then, reason="end"))
                recorded = await _recorded(url, ["orchestrator", "control"])
            # the new run under the same id: online, a schedule, no control yet
            new = _orchestrator(url, pki, "b" * 16)
            async with new:
                assert await new.wait_connected(T)
                await new.publish("schedule", SCHEDULE)
                await new.publish("control", RunControl(action="start", ts=time.time()))
                early = ControlClient(
                    url, RUN, 0, heartbeat=1.0, step=lambda: 0, signing=signing(pki, "peer-0")
                )
                async with early:
                    assert await early.bus.wait_connected(T)
                    await early.status("ready")
                    # the live orchestrator acknowledges the peer's status in its presence
                    await new.publish("orchestrator", _online(early))
                    await _until(lambda: early.control is not None, "the real start")
                    # the attacker re-publishes the recorded messages, retained
                    async with client(url, "replayer") as rogue:
                        for k in ("orchestrator", "control"):
                            await rogue.publish(TOPICS.topic(k), recorded[k], qos=1, retain=True)
                    late = ControlClient(
                        url, RUN, 1, heartbeat=1.0, step=lambda: 0, signing=signing(pki, "peer-1")
                    )
                    async with late:
                        assert await late.bus.wait_connected(T)
                        await late.status("ready")
                        await asyncio.sleep(1.0)  # the retained leftovers are in
                        # the recorded presence does not acknowledge this peer: not followed
                        assert late.incarnation is None
                        assert late.control is None
                        # the live orchestrator re-stamps its presence on the peer's status
                        await new.publish("orchestrator", _online(early, late))
                        await _until(lambda: late.incarnation == "b" * 16, "the live presence")
                        await _until(lambda: late.schedule is not None, "the schedule")
                        await asyncio.sleep(0.5)
                        for peer in (early, late):
                            assert peer.incarnation == "b" * 16
                            assert peer.control is None or peer.control.action == "start"
                            assert peer.stale_refused + peer.bus.rejected >= 1

    with structlog.testing.capture_logs() as logs:
        asyncio.run(asyncio.wait_for(main(), 60))
    events = {e["event"] for e in logs}
    assert "orchestrator.presence_unconfirmed" in events
