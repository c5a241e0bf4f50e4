"""One tensor exchange between two peer transports in two processes, for ``bench/transport.py``.

`grpc_exchange` spawns (never forks) a receiver and a sender process on loopback. Both run the
real `concord.peer.transport.Transport`: handshake, one long-lived ExchangeRaw stream, ≤ 1 MiB
chunks (`concord.peer.serde`) built as they are written (`Transport.round_`), receiver-side
validation (header checks, part table, finiteness), the mailbox, and one Ack per tensor. Time per
exchange = from the sender packing the tensor to the receiver's Ack arriving back. glibc malloc is
tuned in both processes (docs/transport.md#memory).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue
import time
from typing import Any

CHUNK = 1 << 20
_TIMEOUT = 300.0  # per exchange; a 256 MiB tensor on a loaded 2-vCPU box takes a few seconds


def _transport(peer_id: int, addresses: list[str], dim: int) -> Any:
    from concord.peer.transport import Transport, TransportOptions

    options = TransportOptions(
        run_id="bench",
        peer_id=peer_id,
        world_size=2,
        fingerprint="b" * 64,
        dim=dim,
        codec="none",
        chunk_bytes=CHUNK,
        max_tensor_bytes=max(1 << 31, 4 * dim),
        deadline=_TIMEOUT,
    )
    return Transport(options, addresses, lambda *_: True)


def _receiver(dim: int, total: int, ports: Any) -> None:
    import torch

    from concord.peer.memory import tune_malloc

    tune_malloc()
    torch.set_num_threads(1)  # as in a peer (threads = 1): the finiteness check runs on the loop

    async def main() -> None:
        t = _transport(1, ["127.0.0.1:1", "127.0.0.1:0"], dim)  # id 0 is never dialled
        ports.put(await t.start("127.0.0.1:0"))
        for k in range(total):  # keep one tensor in memory, not all of them
            await asyncio.wait_for(t.mailbox.slot((0, k, k, 0)), _TIMEOUT)
            t.mailbox.advance(k + 1)
        await asyncio.sleep(1.0)  # let the last Ack leave before the server stops
        await t.stop(1.0)

    asyncio.run(main())


def _sender(port: int, dim: int, repeats: int, warmup: int, out: Any) -> None:
    import torch

    from concord.peer.memory import tune_malloc

    tune_malloc()
    torch.set_num_threads(1)

    async def main() -> list[float]:
        t = _transport(0, ["127.0.0.1:1", f"127.0.0.1:{port}"], dim)
        if await t.connect([1], timeout=30):
            raise RuntimeError("the gRPC receiver did not answer the handshake")
        link = t.links[1]
        values = torch.ones(dim)
        times = []
        for k in range(warmup + repeats):
            t0 = time.perf_counter()
            frames = t.frames(step=k, round=k, tensor_id=0, codec="none", parts={"values": values})
            await t.round_(
                step=k, round=k, tensor_id=0, frames=frames, send_to=[1], receive_from=[]
            )
            if t.counters.send_failures:
                raise RuntimeError(f"sending tensor {k} failed")
            await asyncio.wait_for(link.acks[(k, k, 0)], _TIMEOUT)
            times.append(time.perf_counter() - t0)
        await t.stop(1.0)
        return times[warmup:]

    out.put(asyncio.run(main()))


def _get(q: Any, proc: Any, timeout: float) -> Any:
    """The next item of ``q``; RuntimeError when ``proc`` dies first or ``timeout`` passes."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            return q.get(timeout=0.2)
        except queue.Empty:
            if proc.exitcode is not None and q.empty():
                raise RuntimeError(
                    f"bench process {proc.name} exited with {proc.exitcode}"
                ) from None
    raise RuntimeError(f"no answer from bench process {proc.name} within {timeout:.0f} s")


def grpc_exchange(size_bytes: int, repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per exchange of one float32 tensor of ``size_bytes`` (a positive multiple of 4)
    between two Concord transports on loopback: ``repeats`` (≥ 1) timed after ``warmup`` (≥ 0)
    discarded."""
    if size_bytes <= 0 or size_bytes % 4:
        raise ValueError(f"size_bytes must be a positive multiple of 4; got {size_bytes}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be ≥ 1 and warmup ≥ 0; got {repeats}, {warmup}")
    dim = size_bytes // 4
    ctx = mp.get_context("spawn")
    ports, out = ctx.Queue(), ctx.Queue()
    recv = ctx.Process(target=_receiver, args=(dim, warmup + repeats, ports), daemon=True)
    procs = [recv]
    try:
        recv.start()
        port = _get(ports, recv, 120.0)
        send = ctx.Process(target=_sender, args=(port, dim, repeats, warmup, out), daemon=True)
        procs.append(send)
        send.start()
        budget = 120 + (warmup + repeats) * max(10.0, size_bytes / 50e6)
        return [float(x) for x in _get(out, send, budget)]
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
