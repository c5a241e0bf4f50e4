"""``bench/chaos.py``'s forged-control cases (its docstring says what each checks): a rogue MQTT
client publishing forged decisions, schedules and statistics into an open run, into one behind
broker credentials, ACL and TLS, and into one with signed control messages."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._procs import (
    concord,
    jsonl,
    read_json,
    tail,
    wait_for,
)
from bench.chaos_runs import (
    FORGE_EVERY,
    FORGED_MAX_ROUNDS,
    MARK,
    OWN_KINDS,
    Ctx,
    Deployment,
    SimRun,
    Skip,
    base_sets,
    decisions_diverged,
    finished,
    over_max_rounds,
    peer_extra,
    step_rows,
    write_config,
)

# -- forged control messages ---------------------------------------------------------------------


def _forgeries(
    run: str, step: int, max_rounds: int, own: bool = False, own_peer: int = 0
) -> list[tuple[str, Any, int | None]]:
    """(kind, message, peer) of one burst of forged control messages around ``step``."""
    from concord.protos.control_plane import MAX_ROUNDS, Decision, Schedule, Stats, Status

    out: list[tuple[str, Any, int | None]] = []
    for s in range(step, step + 3):
        out += [
            ("decision", Decision(step=s, round=r, repeat=True, reason=MARK), None)
            for r in range(1, max_rounds + 3)
        ]
        out.append(
            ("decision", Decision(step=s, round=1, repeat=False, rounds_next=MAX_ROUNDS,
                                  reason=MARK), None)
        )  # fmt: skip
    out.append((
        "schedule",
        Schedule(
            version=1_000_000 + step, peers=list(range(7)), topology="ring", weights=None,
            kappa=1.0, seed=0, phases=[{"index": 1, "topology": None}], reason=MARK,
            addresses=[f"10.9.9.{i + 1}:1" for i in range(7)], effective_step=step + 1,
        ),
        None,
    ))  # fmt: skip
    out.append(("stats", Stats(peer=0, step=step, round=1, theta=1e9, grad_norm=1.0), 0))
    if own:  # on the rogue identity's own topics (what its broker credentials may publish)
        out.append(("status", Status(peer=own_peer, state="failed", reason=MARK), own_peer))
        out.append(("stats", Stats(peer=own_peer, step=step, round=1, theta=0.0, grad_norm=0.0),
                    own_peer))  # fmt: skip
    return out


async def _forge(
    url: str, run: str, who: str, auth: Any, running: Callable[[], bool],
    step: Callable[[], int], max_rounds: int, counts: dict[str, Any], own: bool = False,
    own_peer: int = 0,
) -> None:  # fmt: skip
    """Connect as ``who`` and publish forgery bursts every 0.2 s while ``running()``."""
    import aiomqtt

    from concord.protos.control_plane import TOPICS, Topics, encode
    from concord.protos.mqtt import client

    topics = Topics(run)
    try:
        async with client(url, who, auth=auth, timeout=5) as c:
            counts["connected"] = True
            while running():
                for kind, msg, peer in _forgeries(run, step(), max_rounds, own, own_peer):
                    spec = TOPICS[kind]
                    await c.publish(topics.topic(kind, peer), encode(msg), qos=spec.qos,
                                    retain=spec.retain)  # fmt: skip
                    counts["published"] = counts.get("published", 0) + 1
                await asyncio.sleep(FORGE_EVERY)
    except (aiomqtt.MqttError, OSError) as e:
        counts.setdefault("connected", False)
        counts["error"] = f"{type(e).__name__}: {e}"[:200]


def _current_step(metrics: Path) -> Callable[[], int]:
    def get() -> int:
        rows = [r for r in jsonl(metrics) if r.get("kind") == "step"]
        return int(rows[-1]["step"]) + 1 if rows else 0

    return get


def _forged_open(ctx: Ctx, d: dict[str, Any], name: str, who: str) -> bool:
    sets = [*base_sets(ctx), f"control.max_rounds={FORGED_MAX_ROUNDS}"]
    run = SimRun(ctx, name, sets)
    counts: dict[str, Any] = {}
    try:
        if not wait_for(lambda: (run.dir / "orchestrator.json").is_file(), 120, 0.05):
            d["error"] = "no orchestrator.json"
            return False
        info = read_json(run.dir / "orchestrator.json") or {}
        client_id = who.format(run=info.get("run"))
        asyncio.run(
            _forge(str(info.get("broker")), str(info.get("run")), client_id, None,
                   lambda: run.proc.poll() is None, _current_step(run.dir / "metrics.jsonl"),
                   FORGED_MAX_ROUNDS, counts)
        )  # fmt: skip
        run.wait()
    finally:
        run.stop()
    d["rogue"] = counts
    d["client_id"] = client_id
    ok = finished(run, d, dropped=[])
    peers = [run.dir / "peers" / f"peer-{i}" for i in range(8)]
    crashes = int(run.code != 0) + len(d.get("children_failed") or {})
    exceeded = over_max_rounds(peers, FORGED_MAX_ROUNDS)
    d.update(crashes=crashes, max_rounds_exceeded=exceeded)
    d["decisions_diverged"] = decisions_diverged(run.dir, peers)  # security off: for the record
    rows = [r for p in peers for r in step_rows(p)]
    d["mean_rounds_per_step"] = round(sum(int(r.get("rounds") or 0) for r in rows) / len(rows), 3)
    d["handler_errors"] = sum(_count(p, "control_handler_errors") for p in peers)
    d["schedules_refused"] = sum(_count(p, "schedules_refused") for p in peers)
    for key, value in (("forged_crashes", crashes), ("forged_max_rounds_exceeded", exceeded)):
        ctx.metrics[key] = (ctx.metrics.get(key) or 0) + value
    return ok and crashes == 0 and exceeded == 0 and bool(counts.get("published"))


def _count(peer_dir: Path, name: str) -> int:
    """A counter of the peer's summary (0 without one)."""
    value = peer_extra(peer_dir, name)
    return value if isinstance(value, int) else 0


def case_forged_unauth(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _forged_open(ctx, d, "forged_unauth", "rogue")


def case_forged_peer(ctx: Ctx, d: dict[str, Any]) -> bool:
    # without security a client id is all an identity is: a peer's shape, an id not in use (the
    # real peer's own id would only take its session over)
    return _forged_open(ctx, d, "forged_peer", "peer-{run}-9")


def _signing() -> tuple[str | None, str]:
    """(the config switch for signed control messages, "") or (None, why not)."""
    import importlib.util

    if importlib.util.find_spec("concord.protos.signing") is None:
        return None, "concord.protos.signing (protos/signing.py) does not exist yet"
    from concord.core import config

    tls = getattr(config, "TLSConfig", None)
    fields = getattr(tls, "model_fields", {})
    names = [n for n in fields if "sign" in n]
    if not names:
        return None, "protos/signing.py exists but no network.tls.*sign* key switches it on"
    return f"network.tls.{names[0]}", ""


def _forged_secure(ctx: Ctx, d: dict[str, Any], name: str, signed: bool) -> bool:
    from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
    from concord.protos.mqtt import BrokerAuth

    switch = None
    if signed:
        switch, why = _signing()
        if switch is None:
            raise Skip(why)
    if mosquitto_binary() is None:
        raise Skip("mosquitto is not installed")
    run_dir = ctx.dir(name)
    run_id = f"chaos-{name}-{os.getpid()}"
    certs = run_dir / "certs"
    # broker identities for 9 peers: the rogue holds peer 8's, a valid peer login of no peer in
    # the run (Mosquitto binds client ids to logins: one holding peer 0's would close peer 0's
    # own session, an outage its owner causes, not a forgery)
    commands = [("init", "--run-id", run_id), ("broker", "--run-id", run_id, "--peers", "9")]
    if signed:  # every peer's key signs its control messages (and serves mTLS)
        commands[1:1] = [("issue", "--peer", str(i)) for i in range(8)]
    for args in commands:
        p = subprocess.run(concord("certs", args[0], "--dir", str(certs), *args[1:]),
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        if p.returncode:
            d["error"] = f"concord certs {args[0]}: {p.stderr[-500:]}"
            return False
    folder = certs / "broker"
    ca = certs / "ca.crt"
    sets = [
        *base_sets(ctx),
        f"control.max_rounds={FORGED_MAX_ROUNDS}",
        "orchestrator.broker_username={identity}",
        f"orchestrator.broker_password_file={folder}/{{identity}}.password",
        f"orchestrator.broker_ca={ca}",
    ]
    if switch is not None:
        sets += [
            f"network.tls.ca={ca}",
            f"network.tls.cert={certs}/peer-{{id}}.crt",
            f"network.tls.key={certs}/peer-{{id}}.key",
            f"{switch}=true",
        ]
    config = write_config(run_dir / "run.toml", sets)
    broker = MosquittoBroker(
        password_file=folder / "passwd", acl_file=folder / "acl",
        tls=(ca, certs / "broker.crt", certs / "broker.key"),
    )  # fmt: skip
    broker.start()

    def auth(who: str) -> BrokerAuth:
        return BrokerAuth.resolve(
            who, username=who, password_file=folder / f"{who}.password", ca=ca
        )

    dep = Deployment(run_dir, config, broker.url, run_id, 8)

    def running() -> bool:
        return dep.procs["orchestrator"].poll() is None

    anon: dict[str, Any] = {}
    as_peer: dict[str, Any] = {}
    seen: dict[str, int] = {"forged_received": 0}
    try:
        if not wait_for(lambda: dep.steps() >= 1 or not running(), 150, 0.1):
            d["error"] = "training never started within 150 s"
        if dep.steps() < 1:
            d.setdefault("error", "training never started")
            d["orchestrator_tail"] = tail(run_dir / "logs" / "orchestrator.out", 800)
            problems = [
                f"{str(r.get('topic', '')).rsplit('/', 1)[-1]}: {r.get('problem')}"
                for r in jsonl(run_dir / "peers" / "peer-0" / "log.jsonl")
                if r.get("event") == "control.rejected"
            ]
            d["peer0_rejected"] = sorted(set(problems))[:3]
            return False
        step = _current_step(run_dir / "peers" / "peer-0" / "metrics.jsonl")

        async def attack() -> None:
            await asyncio.gather(
                _monitor(broker.url, run_id, auth("monitor"), running, seen),
                _forge(broker.url, run_id, "rogue", BrokerAuth(ca=ca), running, step,
                       FORGED_MAX_ROUNDS, anon),
                _forge(broker.url, run_id, "rogue-peer-8", auth("peer-8"), running, step,
                       FORGED_MAX_ROUNDS, as_peer, own=signed, own_peer=8),
            )  # fmt: skip

        asyncio.run(attack())
        codes = dep.wait()
    finally:
        dep.stop()
        broker.stop()
    d.update(anonymous=anon, with_peer_credentials=as_peer, **seen)
    peers = [run_dir / "peers" / f"peer-{i}" for i in range(8)]
    exceeded = over_max_rounds(peers, FORGED_MAX_ROUNDS)
    diverged = decisions_diverged(run_dir, peers)
    ok = dep.check(d, codes, set())
    # signed: peer 8's own topics carried unsigned statuses and statistics, which the broker lets
    # through; one that passed the signature check would be refused next as an unknown peer
    dropped_by_forgery = sum(
        1 for r in jsonl(run_dir / "log.jsonl")
        if r.get("event") == "control.rejected" and r.get("peer") == 8
        and r.get("problem") == "unknown peer id"
    ) if signed else 0  # fmt: skip
    accepted = (
        int(bool(anon.get("connected"))) + seen["forged_received"] + exceeded + diverged
        + dropped_by_forgery
    )  # fmt: skip
    refused: dict[str, int] = {}
    for r in jsonl(run_dir / "log.jsonl"):
        if r.get("event") in ("control.rejected", "broker.topic_refused", "broker.auth_refused"):
            key = f"{r['event']}: {str(r.get('problem') or r.get('topic') or '')[:60]}"
            refused[key] = refused.get(key, 0) + 1
    d["orchestrator_refusals"] = dict(sorted(refused.items(), key=lambda kv: -kv[1])[:5])
    d.update(max_rounds_exceeded=exceeded, decisions_diverged=diverged, accepted=accepted,
             unsigned_passed_signatures=dropped_by_forgery)  # fmt: skip
    ctx.metrics["forged_accepted"] = (ctx.metrics.get("forged_accepted") or 0) + accepted
    return ok and accepted == 0 and bool(as_peer.get("published"))


async def _monitor(
    url: str, run: str, auth: Any, running: Callable[[], bool], seen: dict[str, int]
) -> None:
    """Count forged messages (reason `MARK`) that reach a subscriber of the run's topics: on the
    orchestrator's topics in ``forged_received`` (the ACL should stop them), per kind as well."""
    import aiomqtt
    import msgpack

    from concord.protos.control_plane import Topics
    from concord.protos.mqtt import client

    with contextlib.suppress(aiomqtt.MqttError, OSError):
        async with client(url, "chaos-monitor", auth=auth, timeout=5) as c:
            await c.subscribe(Topics(run).all(), qos=1)
            while running():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        async for m in c.messages:
                            with contextlib.suppress(Exception):
                                body = msgpack.unpackb(bytes(m.payload))
                                if isinstance(body, dict) and body.get("reason") == MARK:
                                    kind = str(m.topic).split("/")[3]
                                    key = f"forged_received_{kind}"
                                    seen[key] = seen.get(key, 0) + 1
                                    if kind not in OWN_KINDS:
                                        seen["forged_received"] += 1


def case_forged_secure(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _forged_secure(ctx, d, "forged_secure", signed=False)


def case_forged_signed(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _forged_secure(ctx, d, "forged_signed", signed=True)
