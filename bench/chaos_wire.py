"""``bench/chaos.py``'s data-plane cases (its docstring says what each checks): an impersonating
client, stalled streams, a mailbox flood, and the wire fuzzers of ``bench/fuzz.py``."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from bench._procs import (
    wait_for,
)
from bench.chaos_runs import (
    MIB,
    Ctx,
    peer_extra,
)

# -- the data plane ------------------------------------------------------------------------------


def case_impersonation(ctx: Ctx, d: dict[str, Any]) -> bool:
    """tests/integration/test_mtls.py's set-up: peer 0 under mTLS; a client with peer 0's own
    valid certificate claims to be peer 1 (Hello, then a tensor stream)."""
    import grpc
    import torch

    from concord.core.config import load_config
    from concord.core.models import FlatParams, build_model
    from concord.peer import serde
    from concord.protos import data_plane_pb2 as pb
    from tests.integration.peers import Peers
    from tests.integration.test_mtls import _hello, _tls_config

    run_dir = ctx.dir("impersonation")
    run_dir.mkdir(parents=True)
    config = _tls_config(run_dir, epochs=500, startup=1.0)
    cfg = load_config(config, environ={})
    flat = FlatParams(build_model("mlp", 1, input_shape=(40,), num_classes=10, hidden=[8]))
    address = cfg.network.addresses[0]  # type: ignore[index]
    certs = run_dir / "certs"
    accepted = 0
    peers = Peers(config, run_dir, [0])
    try:
        metrics = run_dir / "peer-0" / "metrics.jsonl"
        wait_for(lambda: metrics.is_file() and metrics.stat().st_size > 0, 120, 0.1)
        stolen = grpc.ssl_channel_credentials(
            (certs / "ca.crt").read_bytes(),
            (certs / "peer-0.key").read_bytes(),
            (certs / "peer-0.crt").read_bytes(),
        )
        with grpc.secure_channel(address, stolen) as channel:
            hello = _hello(channel, flat.fingerprint())
            d["hello"] = hello if isinstance(hello, bool) else str(hello.code())
            accepted += hello is True
            frames = serde.frames(
                run_id="itest", sender=1, step=0, round=0, tensor_id=0, codec="none",
                dim=flat.d, parts={"values": torch.zeros(flat.d)}, chunk_bytes=1 << 20,
            )  # fmt: skip
            raw = channel.stream_stream(
                "/concord.v1.Gossip/ExchangeRaw", response_deserializer=pb.Ack.FromString
            )
            try:
                acks = list(raw(iter([serde.raw_message(f.header, f.body) for f in frames]),
                                timeout=10))  # fmt: skip
                d["stream"] = f"not refused: {len(acks)} acks"
                accepted += 1
            except grpc.RpcError as e:
                d["stream"] = str(e.code())
        peers.procs[0].send_signal(signal.SIGTERM)
        d["exit_code"] = peers.wait(timeout=60)[0]
    finally:
        peers.kill_all()
    d["frames_rejected"] = peer_extra(run_dir / "peer-0", "frames_rejected")
    d["accepted"] = accepted
    ctx.metrics["impersonation_accepted"] = accepted
    return accepted == 0 and d["exit_code"] == 0


def case_stalled_streams(ctx: Ctx, d: dict[str, Any]) -> bool:
    """tests/peer/test_bounds.py's measurement: 40 stalled streams at a receiving process."""
    from tests.peer import test_bounds as tb

    growth, counts = tb._stall("default")
    bound = 2 * tb.RSS_DIM * 4 + 50 * MIB  # two tensors per neighbour (one here) + 50 MiB
    d.update(streams=tb.STREAMS, tensor_mib=tb.RSS_DIM * 4 / MIB, rejections=counts.strip())
    ctx.metrics["rss_growth_mib_stalled"] = round(growth / MIB, 1)
    ctx.metrics["rss_bound_mib"] = round(bound / MIB, 1)
    return growth <= bound


def case_mailbox_flood(ctx: Ctx, d: dict[str, Any]) -> bool:
    """One neighbour sends 12 tensors for rounds nobody collects (test_bounds' helpers)."""
    import grpc

    from concord.protos import data_plane_pb2 as pb
    from tests.peer import test_bounds as tb

    async def body() -> bool:
        addresses = [f"127.0.0.1:{tb._free_port()}", f"127.0.0.1:{tb._free_port()}"]
        t1 = tb._transport(1, addresses)
        await t1.start(addresses[1])
        ch = grpc.aio.insecure_channel(addresses[1], options=tb.OWN_CONNECTION)
        try:
            if not (await tb._hello(ch, 0)).accepted:
                d["error"] = "hello refused"
                return False
            results = [await tb._send(ch, tb._messages(0, round=r)) for r in range(1, 13)]
            refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
            d["accepted"] = len(results) - len(refused)
            d["refused"] = len(refused)
            d["refusal_codes"] = sorted({str(e.code()) for e in refused})
            d["refusal_details"] = sorted({f"{e.code()}: {e.details()}"[:160] for e in refused})
            d["held_bytes"] = t1.mailbox.held(0)
            d["rejected"] = dict(t1.counters.rejected)
            arrived, _ = await t1.round_(
                step=0, round=1, tensor_id=0, frames=None, send_to=[], receive_from=[0]
            )
            fits = await tb._send(ch, tb._messages(0, step=1, round=1))
            d["serves_after"] = isinstance(fits, list) and fits[0].status == pb.ACK_OK
            tensor = tb.DIM * 4
            # every refusal is the server's "overload" (its counter), whatever grpcio's client
            # reports when it loses the status to its own write race (`tb._refused_with`)
            exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
            return (
                d["accepted"] <= 2
                and d["held_bytes"] <= 2 * tensor
                and all(tb._refused_with(e, exhausted) for e in refused)
                and d["rejected"] == {"overload": len(refused)}
                and 0 in arrived
                and bool(d["serves_after"])
            )
        finally:
            await ch.close()
            await t1.stop(1.0)

    return asyncio.run(asyncio.wait_for(body(), 120))


# -- fuzz ----------------------------------------------------------------------------------------


def case_fuzz(ctx: Ctx, d: dict[str, Any]) -> bool:
    import random

    from bench.fuzz import run_target
    from tests.fuzz.targets import TARGETS

    seed = random.randrange(2**32)
    by_target, crashes = {}, 0
    for name in TARGETS:
        r = run_target(name, ctx.fuzz_examples, 10.0, seed)
        by_target[name] = r.cases
        crashes += r.crash_count
        for c in r.crashes.values():
            d.setdefault("crashes", []).append(
                f"{name}: {c.kind} at {c.where} ({c.count}x): {c.message[:200]}; "
                f"smallest input {c.example[:300]}"
            )
        print(f"  fuzz {name}: {r.cases} cases, {r.crash_count} crashes, {r.seconds:.1f} s",
              flush=True)  # fmt: skip
    d.update(seed=seed, cases_by_target=by_target)
    ctx.metrics.update(
        fuzz_cases=sum(by_target.values()), fuzz_cases_by_target=by_target, fuzz_crashes=crashes
    )
    return crashes == 0 and min(by_target.values()) >= ctx.fuzz_examples
