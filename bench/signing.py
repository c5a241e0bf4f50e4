"""What signed control messages cost, against unsigned ones measured in the same run.

1. **Per message.** `Signer.seal` and `Verifier.open` of a heartbeat (the most frequent message),
   µs each, and the envelope's size against the bare message (the sender's certificate rides in
   every envelope: ~640 bytes).
2. **Round trip through a broker.** Heartbeat from a "peer" `Bus` → an "orchestrator" `Bus` that
   answers with a Decision → back to the peer, through one embedded amqtt broker; the median of
   ``--pings`` round trips, unsigned and signed, alternating ``--repeats`` times so neither mode
   always runs on a warmer machine. The ratio signed / unsigned is the figure to read; the broker
   and two event loops share this process, so absolute times are this machine's only.

Every message must arrive and none may be refused (checked: a failure is an exit 1, not a slow
number). Last stdout line: one JSON object (``sign_us``, ``verify_us``, ``envelope_bytes``,
``message_bytes``, ``rtt_ms_unsigned``, ``rtt_ms_signed``, ``rtt_ratio``).

    python bench/signing.py [--pings 300] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from concord.orchestrator.broker import EmbeddedBroker
from concord.peer.certs import init_ca, issue_orchestrator, issue_peer
from concord.protos.control_plane import Decision, Heartbeat, Topics, encode
from concord.protos.mqtt import Bus
from concord.protos.signing import Signer, Signing, Verifier

RUN = "bench-signing"
TOPICS = Topics(RUN)
TIMEOUT = 10.0  # seconds any one message may take before the bench fails


def make_pki(directory: Path) -> Path:
    init_ca(directory, run_id=RUN)
    issue_peer(directory, 0)
    issue_orchestrator(directory)
    return directory


def signing(pki: Path, who: str) -> Signing:
    signer = Signer.load(who, pki / f"{who}.key", pki / f"{who}.crt", RUN)
    return Signing(signer, Verifier.load(pki / "ca.crt", RUN))


def per_message(pki: Path, n: int) -> dict[str, float]:
    """µs to seal and to open one heartbeat (mean over ``n``), and the sizes."""
    s, v = signing(pki, "peer-0").signer, Verifier.load(pki / "ca.crt", RUN)
    assert s is not None
    topic, body = TOPICS.topic("heartbeat", 0), encode(Heartbeat(peer=0, step=1, ts=1.0))
    t0 = time.perf_counter()
    sealed = [s.seal(topic, body) for _ in range(n)]
    t1 = time.perf_counter()
    opened = [v.open(topic, e) for e in sealed]
    t2 = time.perf_counter()
    if opened != [body] * n:
        raise SystemExit("a sealed heartbeat did not open to itself")
    return {
        "sign_us": (t1 - t0) / n * 1e6,
        "verify_us": (t2 - t1) / n * 1e6,
        "envelope_bytes": len(sealed[0]),
        "message_bytes": len(body),
    }


async def median_rtt(url: str, pki: Path | None, pings: int) -> float:
    """Median heartbeat → decision round trip (ms) between two Buses on ``url``."""
    done: asyncio.Queue[float] = asyncio.Queue()
    orchestrator: Bus | None = None

    async def answer(kind: str, peer: int | None, message: Any) -> None:
        assert orchestrator is not None
        await orchestrator.publish("decision", Decision(step=message.step, round=1, repeat=False))

    def arrived(kind: str, peer: int | None, message: Any) -> None:
        done.put_nowait(time.perf_counter())

    who = {n: (signing(pki, n) if pki is not None else None) for n in ("orchestrator", "peer-0")}
    orchestrator = Bus(
        url, "o", TOPICS, handler=answer, subscribe=["heartbeat"], signing=who["orchestrator"]
    )
    peer = Bus(url, "p", TOPICS, handler=arrived, subscribe=["decision"], signing=who["peer-0"])
    async with orchestrator, peer:
        if not (await orchestrator.wait_connected(TIMEOUT) and await peer.wait_connected(TIMEOUT)):
            raise SystemExit("the buses did not connect to the embedded broker")
        await asyncio.sleep(0.3)  # subscriptions in place
        rtts = []
        for step in range(pings):
            sent = time.perf_counter()
            await peer.publish("heartbeat", Heartbeat(peer=0, step=step, ts=1.0), 0)
            rtts.append(await asyncio.wait_for(done.get(), TIMEOUT) - sent)
        refused = orchestrator.rejected + peer.rejected
        if refused:
            raise SystemExit(f"{refused} messages refused in the {'signed' * bool(pki)} run")
    return statistics.median(rtts) * 1e3


async def round_trips(pki: Path, pings: int, repeats: int) -> tuple[list[float], list[float]]:
    plain: list[float] = []
    signed: list[float] = []
    async with EmbeddedBroker() as broker:
        for r in range(repeats):
            order = [False, True] if r % 2 == 0 else [True, False]
            for sign in order:
                value = await median_rtt(broker.url, pki if sign else None, pings)
                (signed if sign else plain).append(value)
    return plain, signed


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pings", type=int, default=300, help="round trips per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="unsigned/signed pairs")
    parser.add_argument("--messages", type=int, default=2000, help="seal/open per-message count")
    parser.add_argument("--quick", action="store_true", help="50 pings, 1 pair, 200 messages")
    args = parser.parse_args(argv)
    if args.quick:
        args.pings, args.repeats, args.messages = 50, 1, 200
    if min(args.pings, args.repeats, args.messages) < 1:
        parser.error("--pings, --repeats and --messages must be ≥ 1")
    with tempfile.TemporaryDirectory(prefix="concord-signing-") as tmp:
        pki = make_pki(Path(tmp))
        result = per_message(pki, args.messages)
        plain, signed = asyncio.run(round_trips(pki, args.pings, args.repeats))
    rtt_plain, rtt_signed = statistics.median(plain), statistics.median(signed)
    result |= {
        "rtt_ms_unsigned": rtt_plain,
        "rtt_ms_signed": rtt_signed,
        "rtt_ratio": rtt_signed / rtt_plain,
    }
    print(
        f"sign {result['sign_us']:.0f} µs, verify {result['verify_us']:.0f} µs per message; "
        f"envelope {result['envelope_bytes']} B for a {result['message_bytes']} B heartbeat"
    )
    print(
        f"heartbeat → decision round trip (median of {args.pings}, {args.repeats} pair(s)): "
        f"unsigned {rtt_plain:.2f} ms, signed {rtt_signed:.2f} ms, "
        f"ratio {result['rtt_ratio']:.2f}"
    )
    print(json.dumps({k: round(v, 4) for k, v in result.items()}))
    return result


if __name__ == "__main__":
    main()
