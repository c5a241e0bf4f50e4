"""One tensor exchange between two processes on loopback: Concord's gRPC data plane against two
baselines measured in the same run (TRANSPORT.md §2b):

* naive asyncio streams: one ``writer.write(payload)`` + drain, receiver ``readexactly``, default
  glibc malloc;
* best raw asyncio TCP: 1 MiB writes + drain, receiver a ``BufferedProtocol`` filling a
  preallocated buffer, glibc malloc tuned (TRANSPORT.md §4.1).

Each contender runs its sender and receiver in two spawned processes (the gRPC peers tune malloc
as `concord peer` does); time = from the first byte sent to the receiver's acknowledgement,
median of ``--repeats`` after one warm-up. The gRPC contender is the real
`peer.transport.Transport` on both sides (frames, validation, finiteness check, per-tensor Ack).
Last line: a JSON object with MB/s per size and the ratios at 64 MiB,
``ratio_vs_naive_streams`` and ``ratio_vs_best_raw_tcp``.

    python bench/transport.py [--sizes 1,16,64,256] [--repeats 5] [--json-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import socket
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1 << 20
CHUNK = MiB


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tune() -> None:
    from peer.app import tune_malloc

    tune_malloc()


# ------------------------------------------------------------------------------ raw TCP receivers


def _naive_receiver(port: int, ready: Any) -> None:
    # naive: default glibc malloc, as an application that does nothing special would run

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                (n,) = struct.unpack("!Q", await reader.readexactly(8))
            except asyncio.IncompleteReadError:
                return
            await reader.readexactly(n)
            writer.write(b"k")
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, limit=2**31 - 1)
        ready.put(True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class _Into(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.need = -1
        self.got = 0
        self.header = bytearray(8)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.need < 0:
            return memoryview(self.header)[self.got :]
        return memoryview(self.buf)[self.got : self.need]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.need < 0 and self.got == 8:
            (self.need,) = struct.unpack("!Q", self.header)
            if len(self.buf) < self.need:
                self.buf = bytearray(self.need)  # preallocated once per size
            self.got = 0
        elif self.need >= 0 and self.got == self.need:
            self.need, self.got = -1, 0
            assert self.transport is not None
            self.transport.write(b"k")


def _raw_receiver(port: int, ready: Any) -> None:
    _tune()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Into, "127.0.0.1", port)
        ready.put(True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _tcp_sender(port: int, sizes: list[int], repeats: int, chunked: bool, out: Any) -> None:
    if chunked:  # the best raw baseline gets every trick, the naive one none
        _tune()

    async def main() -> dict[int, list[float]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        result = {}
        for size in sizes:
            payload = bytearray(size)
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                writer.write(struct.pack("!Q", size))
                if chunked:
                    mv = memoryview(payload)
                    for off in range(0, size, CHUNK):
                        writer.write(mv[off : off + CHUNK])
                        await writer.drain()
                else:
                    writer.write(payload)
                    await writer.drain()
                await reader.readexactly(1)
                times.append(time.perf_counter() - t0)
            result[size] = times[1:]
        writer.close()
        return result

    out.put(asyncio.run(main()))


# ------------------------------------------------------------------------------------------ gRPC


def _grpc_transport(peer_id: int, addresses: list[str], dim: int) -> Any:
    from peer.transport import Transport

    return Transport(
        run_id="bench",
        peer_id=peer_id,
        world_size=2,
        addresses=addresses,
        fingerprint="b" * 64,
        dim=dim,
        codec="none",
        chunk_bytes=CHUNK,
        max_tensor_bytes=1 << 31,
        deadline=120.0,
        is_neighbour=lambda *a: True,
    )


def _grpc_receiver(addresses: list[str], dim: int, ready: Any) -> None:
    _tune()

    async def main() -> None:
        t = _grpc_transport(1, addresses, dim)
        original = t.mailbox.deliver

        def consume(arrival: Any) -> bool:  # keep only the newest tensor
            t.mailbox.advance(arrival.step)
            return bool(original(arrival))

        t.mailbox.deliver = consume  # type: ignore[method-assign]
        await t.start(addresses[1])
        ready.put(True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _grpc_sender(addresses: list[str], size: int, repeats: int, out: Any) -> None:
    _tune()
    import torch

    from peer import serde

    async def main() -> list[float]:
        dim = size // 4
        t = _grpc_transport(0, addresses, dim)
        if await t.connect([1], timeout=30):
            raise RuntimeError("receiver did not answer")
        link = t.links[1]
        values = torch.ones(dim)
        times = []
        for step in range(repeats + 1):
            t0 = time.perf_counter()
            frames = list(
                serde.frames(
                    run_id="bench",
                    sender=0,
                    step=step,
                    round=step,
                    tensor_id=0,
                    codec="none",
                    dim=dim,
                    parts={"values": values},
                    chunk_bytes=CHUNK,
                )
            )
            key = (step, step, 0)
            if not await link.send(frames, key, 120.0):
                raise RuntimeError("send failed")
            await asyncio.wait_for(link.acks[key], 120.0)  # kept until the next send
            times.append(time.perf_counter() - t0)
        await t.stop(1.0)
        return times[1:]

    out.put(asyncio.run(main()))


# ------------------------------------------------------------------------------------------ main


def _pair(receiver: Any, rargs: tuple[Any, ...], sender: Any, sargs: tuple[Any, ...]) -> Any:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    rp = ctx.Process(target=receiver, args=(*rargs, ready), daemon=True)
    rp.start()
    try:
        ready.get(timeout=60)
        sp = ctx.Process(target=sender, args=(*sargs, out), daemon=True)
        sp.start()
        result = out.get(timeout=1800)
        sp.join(timeout=60)
        return result
    finally:
        rp.kill()
        rp.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16,64,256", help="MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    reps = {s: max(2, args.repeats if s <= 64 * MiB else args.repeats // 2) for s in sizes}
    mbps: dict[str, dict[int, float]] = {"naive_streams": {}, "best_raw_tcp": {}, "grpc": {}}
    for size in sizes:
        port = _free_port()
        naive = _pair(_naive_receiver, (port,), _tcp_sender, (port, [size], reps[size], False))
        port = _free_port()
        raw = _pair(_raw_receiver, (port,), _tcp_sender, (port, [size], reps[size], True))
        addresses = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
        grpc_times = _pair(
            _grpc_receiver, (addresses, size // 4), _grpc_sender, (addresses, size, reps[size])
        )
        for name, times in (
            ("naive_streams", naive[size]),
            ("best_raw_tcp", raw[size]),
            ("grpc", grpc_times),
        ):
            mbps[name][size // MiB] = size / statistics.median(times) / 1e6
        if not args.json_only:
            print(
                f"{size // MiB:>4} MiB  naive streams {mbps['naive_streams'][size // MiB]:8.0f}"
                f"  best raw TCP {mbps['best_raw_tcp'][size // MiB]:8.0f}"
                f"  Concord gRPC {mbps['grpc'][size // MiB]:8.0f}  MB/s",
                flush=True,
            )
    result: dict[str, Any] = {
        "benchmark": "transport",
        "unit": "MB/s (1e6 B/s), median",
        "repeats": reps,
        **mbps,
    }
    for mib in (16, 64, 256):
        if mib in mbps["grpc"]:
            result[f"ratio_vs_naive_streams_{mib}MiB"] = round(
                mbps["grpc"][mib] / mbps["naive_streams"][mib], 3
            )
            result[f"ratio_vs_best_raw_tcp_{mib}MiB"] = round(
                mbps["grpc"][mib] / mbps["best_raw_tcp"][mib], 3
            )
    result["ratio_vs_naive_streams"] = result.get("ratio_vs_naive_streams_64MiB")
    result["ratio_vs_best_raw_tcp"] = result.get("ratio_vs_best_raw_tcp_64MiB")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
