"""The attacks of issue 26 as chaos cases (``bench/chaos.py`` registers `CASES`). Each is a real
run under attack, checked afterwards:

* ``takeover``: an authenticated, signed ``concord sim`` (the embedded broker with
  `concord certs broker`'s password and ACL files on mqtts://); from the first training step to
  the end, peer 0's and the read-only monitor's logins connect every 0.3 s with the client ids of
  other identities (the orchestrator's and peer 1's, predictable and by username) —
  ``takeover_accepted``: such connections the broker accepted + reconnections of the
  orchestrator + peers that did not complete;
* ``stale_run``: ``concord orchestrator`` + ``concord peer`` under one fixed run id on an
  anonymous Mosquitto with signed control (the documented "External Mosquitto" set-up); a first,
  short run's signed ``online`` presence and ``control: stop`` are recorded off the broker, and
  re-published retained every 0.5 s during a second run under the same id —
  ``stale_run_accepted``: peers of the second run that did not complete (a peer obeying the old
  stop exits 1 "stopped before the end of training") + a failed orchestrator;
* ``fetch_flood``: a ``concord sim`` run; a client reads peer 0's address and model fingerprint
  off the broker, says Hello as peer 4 (not a neighbour of 0 on the ring of 8) and asks peer 0
  for Fetches as fast as it is answered for 5 s, then as peer 1 (a neighbour) —
  ``fetch_non_neighbour_accepted``: Fetches answered to peer 4; the neighbour's answers are
  bounded by the rate limit (details).

Every case also requires the attacked run to finish (exit 0, every peer completed); ``takeover``
and ``stale_run`` record ``param_max_abs_diff`` against the baseline run of the same seed when
it ran (the final parameters, peer by peer: the attack changed nothing; ``fetch_flood`` runs
longer than the baseline).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._procs import ROOT, concord, jsonl, read_json, steps, tail, wait_for
from bench.chaos_runs import (
    RUN_TIMEOUT,
    Ctx,
    Deployment,
    SimRun,
    Skip,
    base_sets,
    final_params,
    finished,
    max_abs_diff,
    peer_extra,
    write_config,
)

TAKEOVER_EVERY = 0.3  # seconds between two takeover attempts of each login
REPLAY_EVERY = 0.5  # seconds between two re-publications of the recorded messages
FLOOD_SECONDS = 5.0  # each Fetch flood
FLOOD_EPOCHS = 40  # the fetch_flood run's length (a --quick run of 4 epochs lasts about 10 s)


def _certs(certs: Path, run_id: str, *, broker: bool) -> str | None:
    """`concord certs` material for 8 peers (and the broker's); None, or what failed."""
    commands = [("init", "--run-id", run_id), *(("issue", "--peer", str(i)) for i in range(8))]
    if broker:
        commands.append(("broker", "--run-id", run_id, "--peers", "8"))
    for args in commands:
        p = subprocess.run(concord("certs", args[0], "--dir", str(certs), *args[1:]),
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        if p.returncode:
            return f"concord certs {args[0]}: {p.stderr[-500:]}"
    return None


def _tls_sets(certs: Path) -> list[str]:
    return [
        f"network.tls.ca={certs}/ca.crt",
        f"network.tls.cert={certs}/peer-{{id}}.crt",
        f"network.tls.key={certs}/peer-{{id}}.key",
    ]


def _param_diff(ctx: Ctx, peer_dirs: list[Path]) -> float | None:
    """Max |Δ| of the final parameters against the baseline's, peer by peer (None: no baseline
    or a checkpoint missing)."""
    base = None if ctx.baseline is None else ctx.baseline.run_dir
    if not base:
        return None
    try:
        return max(
            max_abs_diff(final_params(ROOT / base / "peers" / f"peer-{i}" / "checkpoint.pt")[0],
                        final_params(p / "checkpoint.pt")[0])
            for i, p in enumerate(peer_dirs)
        )  # fmt: skip
    except (OSError, KeyError, RuntimeError):
        return None


# -- takeover ------------------------------------------------------------------------------------


async def _takeovers(
    url: str, run: str, certs: Path, running: Callable[[], bool], seen: dict[str, Any]
) -> None:
    import aiomqtt

    from concord.protos.mqtt import BrokerAuth, client, client_id_allowed

    folder = certs / "broker"
    logins = {
        who: BrokerAuth.resolve(
            who, username=who, password_file=folder / f"{who}.password", ca=certs / "ca.crt"
        )
        for who in ("peer-0", "monitor")
    }
    victims = [f"orchestrator-{run}", "orchestrator", f"peer-{run}-1", "peer-1"]
    while running():
        for who, auth in logins.items():
            for victim in victims:
                seen["attempts"] = seen.get("attempts", 0) + 1
                try:
                    async with client(url, victim, auth=auth, timeout=5):
                        if not client_id_allowed(who, victim):
                            seen["accepted"] = seen.get("accepted", 0) + 1
                except (aiomqtt.MqttError, OSError):
                    seen["refused"] = seen.get("refused", 0) + 1
        await asyncio.sleep(TAKEOVER_EVERY)


def case_takeover(ctx: Ctx, d: dict[str, Any]) -> bool:
    name = "takeover"
    run_id = f"chaos-takeover-{os.getpid()}"
    work = ctx.out / f"{name}.certs"
    certs = work / "certs"
    why = _certs(certs, run_id, broker=True)
    if why:
        d["error"] = why
        return False
    sets = [
        *base_sets(ctx),
        f"name={run_id}",
        *_tls_sets(certs),
        f"orchestrator.embedded_broker_passwd={certs}/broker/passwd",
        f"orchestrator.embedded_broker_acl={certs}/broker/acl",
        f"orchestrator.embedded_broker_cert={certs}/broker.crt",
        f"orchestrator.embedded_broker_key={certs}/broker.key",
        "orchestrator.broker_username={identity}",
        f"orchestrator.broker_password_file={certs}/broker/{{identity}}.password",
        f"orchestrator.broker_ca={certs}/ca.crt",
    ]
    run = SimRun(ctx, name, sets)
    seen: dict[str, Any] = {}
    try:
        if not run.until_steps(1) or run.proc.poll() is not None:
            d["error"] = "training never started"
            d["launcher_tail"] = tail(run.log, 800)
            return False
        info = read_json(run.dir / "orchestrator.json") or {}
        asyncio.run(_takeovers(str(info["broker"]), run_id, certs,
                               lambda: run.proc.poll() is None, seen))  # fmt: skip
        run.wait()
    finally:
        run.stop()
    ok = finished(run, d, dropped=[])
    log = jsonl(run.dir / "log.jsonl")
    connects = sum(
        1 for r in log
        if r.get("event") == "mqtt.connected" and str(r.get("client", "")).startswith("orch")
    )  # fmt: skip
    refused_logged = sum(1 for r in log if r.get("event") == "broker.takeover_refused")
    s = run.summary()
    not_completed = 8 - len((s.peers_completed if s is not None else None) or [])
    accepted = int(seen.get("accepted", 0)) + max(0, connects - 1) + not_completed
    d.update(attempts=seen.get("attempts", 0), refused=seen.get("refused", 0),
             accepted_connections=seen.get("accepted", 0), orchestrator_connects=connects,
             takeover_refused_logged=refused_logged, peers_not_completed=not_completed,
             param_max_abs_diff=_param_diff(ctx, [run.dir / "peers" / f"peer-{i}"
                                                     for i in range(8)]))  # fmt: skip
    ctx.metrics["takeover_accepted"] = accepted
    return ok and accepted == 0 and int(seen.get("attempts", 0)) > 0


# -- stale run -----------------------------------------------------------------------------------


async def _record(url: str, run: str, done: threading.Event, got: dict[str, bytes]) -> None:
    """Keep the newest signed "stop" and "online" presence published under ``run``."""
    import aiomqtt
    import msgpack

    from concord.protos.control_plane import Topics
    from concord.protos.mqtt import client

    topics = Topics(run)
    with contextlib.suppress(aiomqtt.MqttError, OSError):
        async with client(url, f"chaos-recorder-{os.getpid()}", timeout=5) as c:
            await c.subscribe(topics.topic("control"), qos=1)
            await c.subscribe(topics.topic("orchestrator"), qos=1)
            while not done.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        async for m in c.messages:
                            raw = bytes(m.payload) if isinstance(m.payload, bytes) else b""
                            with contextlib.suppress(Exception):
                                env = msgpack.unpackb(raw, raw=False)
                                body = msgpack.unpackb(env["body"], raw=False)
                                if body.get("action") == "stop":
                                    got["control"] = raw
                                elif body.get("state") == "online":
                                    got["orchestrator"] = raw


async def _replay(
    url: str, run: str, got: dict[str, bytes], running: Callable[[], bool], seen: dict[str, int]
) -> None:
    import aiomqtt

    from concord.protos.control_plane import Topics
    from concord.protos.mqtt import client

    topics = Topics(run)
    with contextlib.suppress(aiomqtt.MqttError, OSError):
        async with client(url, f"chaos-replayer-{os.getpid()}", timeout=5) as c:
            while running():
                for kind in ("orchestrator", "control"):
                    await c.publish(topics.topic(kind), got[kind], qos=1, retain=True)
                    seen["replayed"] = seen.get("replayed", 0) + 1
                await asyncio.sleep(REPLAY_EVERY)


def case_stale_run(ctx: Ctx, d: dict[str, Any]) -> bool:
    from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary

    if mosquitto_binary() is None:
        raise Skip("mosquitto is not installed")
    name = "stale_run"
    run_id = f"chaos-stale-{os.getpid()}"
    root = ctx.dir(name)  # the run under attack; the first run and the certificates beside it
    before = ctx.out / f"{name}.first"
    if before.exists():
        shutil.rmtree(before)
    certs = ctx.out / f"{name}.certs" / "certs"
    if certs.parent.exists():
        shutil.rmtree(certs.parent)
    why = _certs(certs, run_id, broker=False)
    if why:
        d["error"] = why
        return False
    sets = [*base_sets(ctx), *_tls_sets(certs)]
    broker = MosquittoBroker()  # anonymous: the signatures alone protect the control plane
    broker.start()
    got: dict[str, bytes] = {}
    seen: dict[str, int] = {}
    try:
        # the earlier run: short, recorded off the broker
        first_sets = [s for s in sets if not s.startswith("epochs=")] + ["epochs=1"]
        first = Deployment(before, write_config(before / "run.toml", first_sets),
                             broker.url, run_id, 8)  # fmt: skip
        done = threading.Event()
        recorder = threading.Thread(
            target=lambda: asyncio.run(_record(broker.url, run_id, done, got)), daemon=True
        )
        recorder.start()
        try:
            first_codes = first.wait()
        finally:
            first.stop()
            done.set()
            recorder.join(10)
        d["first_exit_codes"] = first_codes
        if set(got) != {"control", "orchestrator"}:
            d["error"] = f"recorded only {sorted(got)} of the first run"
            return False
        # the run under attack: same run id, same CA
        dep = Deployment(root, write_config(root / "run.toml", sets), broker.url, run_id, 8)
        try:
            # "after the new orchestrator came up": its peers train (a presence replayed while
            # it starts makes it refuse to start, as another live orchestrator would)
            if not wait_for(lambda: dep.steps() >= 1 or dep.procs["orchestrator"].poll()
                              is not None, RUN_TIMEOUT, 0.1):  # fmt: skip
                d["error"] = "the second run never started training"
                return False

            def running() -> bool:
                return bool(dep.procs["orchestrator"].poll() is None)

            asyncio.run(_replay(broker.url, run_id, got, running, seen))
            codes = dep.wait()
        finally:
            dep.stop()
    finally:
        broker.stop()
    ok = dep.check(d, codes, set())
    peers = [root / "peers" / f"peer-{i}" for i in range(8)]
    not_completed = len(d.get("not_completed") or [])
    stale_logged = sum(
        1 for p in peers for r in jsonl(p / "log.jsonl")
        if r.get("event") in ("control.stale_run", "orchestrator.presence_unconfirmed",
                              "control.rejected")
    )  # fmt: skip
    accepted = not_completed + int(codes.get("orchestrator") != 0)
    d.update(replayed=seen.get("replayed", 0), peers_not_completed=not_completed,
             refusals_logged=stale_logged,
             param_max_abs_diff=_param_diff(ctx, peers))  # fmt: skip
    ctx.metrics["stale_run_accepted"] = accepted
    return ok and accepted == 0 and seen.get("replayed", 0) > 0


# -- fetch flood ---------------------------------------------------------------------------------


async def _status_of(url: str, run: str, peer: int) -> dict[str, Any]:
    """Peer ``peer``'s "ready" status (its address and model fingerprint), off the broker."""
    import msgpack

    from concord.protos.control_plane import Topics
    from concord.protos.mqtt import client

    async with client(url, f"chaos-fetcher-{os.getpid()}", timeout=5) as c:
        await c.subscribe(Topics(run).topic("status", peer), qos=1)
        async with asyncio.timeout(30):
            async for m in c.messages:
                raw = bytes(m.payload) if isinstance(m.payload, bytes) else b""
                with contextlib.suppress(Exception):
                    body = msgpack.unpackb(raw, raw=False)
                    if body.get("address") and body.get("fingerprint"):
                        return dict(body)
    return {}


def _flood(address: str, run: str, claim: int, fingerprint: str, seconds: float) -> dict[str, int]:
    """Hello as ``claim``, then Fetch for ``seconds``: answers and refusals by status code."""
    import grpc

    from concord.peer import serde
    from concord.protos import data_plane_pb2 as pb
    from concord.protos import data_plane_pb2_grpc as pb_grpc

    out: dict[str, int] = {"answered": 0}
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GossipStub(channel)
        try:
            reply = stub.Hello(serde.hello_request(run, claim, fingerprint, "none"), timeout=10)
        except grpc.RpcError as exc:  # the peer is gone (its run ended): nothing to flood
            out["hello_failed"] = 1
            out["hello_error"] = f"{exc.code().name}: {exc.details()}"  # type: ignore[assignment]
            return out
        out["hello_accepted"] = int(bool(reply.accepted))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                frames = list(stub.Fetch(pb.FetchRequest(run_id=run, peer_id=claim), timeout=10))
                out["answered"] += int(bool(frames))
            except grpc.RpcError as exc:
                key = str(exc.code().name)
                out[key] = out.get(key, 0) + 1
    return out


def case_fetch_flood(ctx: Ctx, d: dict[str, Any]) -> bool:
    # long enough for both floods (a --quick run trains for about 10 s)
    sets = [s for s in base_sets(ctx) if not s.startswith("epochs=")]
    run = SimRun(ctx, "fetch_flood", [*sets, f"epochs={FLOOD_EPOCHS}"])
    try:
        if not wait_for(lambda: (run.dir / "orchestrator.json").is_file(), 120, 0.05):
            d["error"] = "the orchestrator never started"
            return False
        info = read_json(run.dir / "orchestrator.json") or {}
        url, run_id = str(info["broker"]), str(info["run"])
        # peer 0's "ready" (its address and model fingerprint), as anyone on the broker sees it
        status = asyncio.run(_status_of(url, run_id, 0))
        if not status:
            d["error"] = "peer 0's ready status (address, fingerprint) never came"
            return False
        peer0 = run.dir / "peers" / "peer-0" / "metrics.jsonl"
        started = wait_for(lambda: steps(peer0) >= 1 or run.proc.poll() is not None,
                             RUN_TIMEOUT, 0.05)  # fmt: skip
        if not started or run.proc.poll() is not None:
            d["error"] = "training never started"
            return False
        address, fingerprint = str(status["address"]), str(status["fingerprint"])
        d["peer0_address"] = address
        d["non_neighbour"] = _flood(address, run_id, 4, fingerprint, FLOOD_SECONDS)
        if run.proc.poll() is None:
            d["neighbour"] = _flood(address, run_id, 1, fingerprint, FLOOD_SECONDS)
        run.wait()
    finally:
        run.stop()
    ok = finished(run, d, dropped=[])
    accepted = int(d["non_neighbour"].get("answered", 0))
    d["peer0_frames_rejected"] = peer_extra(run.dir / "peers" / "peer-0", "frames_rejected")
    ctx.metrics["fetch_non_neighbour_accepted"] = accepted
    refused = int(d["non_neighbour"].get("PERMISSION_DENIED", 0))
    if not refused:
        d.setdefault("error", "the flood never reached peer 0 (its run ended first?)")
    return ok and accepted == 0 and refused > 0


# the cases, by name (`bench/chaos.py` registers them after its own)
CASES: dict[str, Callable[[Ctx, dict[str, Any]], bool]] = {
    "takeover": case_takeover,
    "stale_run": case_stale_run,
    "fetch_flood": case_fetch_flood,
}
