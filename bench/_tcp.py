"""Raw-TCP baselines for ``bench/transport.py`` (docs/transport.md#benchmarks) and the process
plumbing.

Wire format of one exchange: an 8-byte big-endian length, then the payload; the receiver answers
one byte once the whole payload has arrived. The sender's clock runs from its first write to that
byte. Two contenders:

* ``naive``: asyncio streams as an application would write them without tuning — one
  ``writer.write(payload)`` + ``drain``; the receiver ``readexactly(n)`` (default stream limit);
* ``best``: the fastest asyncio variant measured (docs/transport.md#benchmarks) — the sender writes
  1 MiB memoryview slices, each followed by ``drain``; the receiver is an `asyncio.BufferedProtocol`
  whose ``get_buffer`` hands out the rest of a buffer preallocated before the receiver reports
  ready.

Every process calls `tune_malloc` first. Receivers bind 127.0.0.1:0 and put their port on the
ready queue; they serve one connection and exit when the sender closes it.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import queue
import struct
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
CHUNK = MiB  # sender write size of the best raw variant (docs/transport.md#benchmarks)
HEADER = struct.Struct("!Q")
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>


def tune_malloc() -> bool:
    """Serve blocks below 256 MiB from the heap and keep freed heap memory
    (docs/transport.md#memory): otherwise every fresh buffer above 32 MiB is a new mmap costing one
    page fault per 4 KiB page (~16k faults, ~35 ms per 64 MiB). Both settings are needed. Call once
    at process start, before big allocations. Cost: RSS stays at its peak. Returns False where there
    is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok_mmap = libc.mallopt(M_MMAP_THRESHOLD, 256 << 20)
    ok_trim = libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    return bool(ok_mmap and ok_trim)


def payload_of(size: int) -> bytearray:
    """``size`` bytes of a repeating non-zero pattern (untouched zero pages would flatter reads)."""
    pattern = bytes(range(1, 256))
    buf = bytearray(size)
    mv = memoryview(buf)
    step = len(pattern)
    mv[: min(step, size)] = pattern[: min(step, size)]
    filled = min(step, size)
    while filled < size:  # doubling copies: log2(size) memmoves
        n = min(filled, size - filled)
        mv[filled : filled + n] = mv[:n]
        filled += n
    return buf


# ------------------------------------------------------------------------------------- receivers


def naive_receiver(size: int, ready: Any) -> None:
    """asyncio streams: ``readexactly`` of the header, then of the payload; ack one byte."""
    tune_malloc()

    async def main() -> None:
        done = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    try:
                        (n,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                    except asyncio.IncompleteReadError:
                        return  # the sender closed the connection: finished
                    await reader.readexactly(n)
                    writer.write(b"k")
                    await writer.drain()
            finally:
                writer.close()
                done.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.put(server.sockets[0].getsockname()[1])
        async with server:
            await done.wait()

    del size  # the naive receiver allocates per message, as readexactly does
    asyncio.run(main())


class _IntoBuffer(asyncio.BufferedProtocol):
    """Receives the header into 8 bytes and the payload straight into ``buf`` (preallocated)."""

    def __init__(self, buf: bytearray, closed: asyncio.Future[None]) -> None:
        self.buf = buf
        self.header = bytearray(HEADER.size)
        self.need = -1  # payload bytes expected; -1 while reading the header
        self.got = 0
        self.closed = closed
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not isinstance(transport, asyncio.WriteTransport):
            raise TypeError(f"expected a stream transport, got {type(transport).__name__}")
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.need < 0:
            return memoryview(self.header)[self.got :]
        return memoryview(self.buf)[self.got : self.need]

    def buffer_updated(self, nbytes: int) -> None:
        self.got += nbytes
        if self.need < 0:
            if self.got == HEADER.size:
                (need,) = HEADER.unpack(self.header)
                if need > len(self.buf):
                    raise ValueError(f"payload of {need} B exceeds the {len(self.buf)} B buffer")
                self.need, self.got = need, 0
        elif self.got == self.need:
            self.need, self.got = -1, 0
            if self.transport is not None:
                self.transport.write(b"k")

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def best_receiver(size: int, ready: Any) -> None:
    """`asyncio.BufferedProtocol` filling a ``size``-byte buffer allocated (and touched) before
    the receiver reports ready."""
    tune_malloc()
    buf = payload_of(size)  # preallocated and every page touched once

    async def main() -> None:
        loop = asyncio.get_running_loop()
        closed: asyncio.Future[None] = loop.create_future()
        server = await loop.create_server(lambda: _IntoBuffer(buf, closed), "127.0.0.1", 0)
        ready.put(server.sockets[0].getsockname()[1])
        async with server:
            await closed

    asyncio.run(main())


# --------------------------------------------------------------------------------------- sender


def tcp_sender(port: int, size: int, repeats: int, warmup: int, chunked: bool, out: Any) -> None:
    """``warmup`` + ``repeats`` exchanges of ``size`` bytes; puts the ``repeats`` timed seconds
    on ``out``. chunked: 1 MiB slices each followed by ``drain`` (else one write + ``drain``)."""
    tune_malloc()
    payload = payload_of(size)

    async def main() -> list[float]:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
        times = []
        mv = memoryview(payload)
        for _ in range(warmup + repeats):
            t0 = time.perf_counter()
            writer.write(HEADER.pack(size))
            if chunked:
                for off in range(0, size, CHUNK):
                    writer.write(mv[off : off + CHUNK])
                    await writer.drain()
            else:
                writer.write(payload)
                await writer.drain()
            await asyncio.wait_for(reader.readexactly(1), 300)
            times.append(time.perf_counter() - t0)
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), 30)
        return times[warmup:]

    out.put(asyncio.run(main()))


# ------------------------------------------------------------------------------------- plumbing


def _get(q: Any, procs: list[Any], timeout: float, what: str) -> Any:
    """``q.get()`` that gives up when any of ``procs`` died or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return q.get(timeout=0.5)
        except queue.Empty:
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed or all(p.exitcode is not None for p in procs):
                try:  # whatever a process put before exiting is in the pipe by now
                    return q.get(timeout=2)
                except queue.Empty:
                    p = (failed or procs)[0]
                    raise RuntimeError(
                        f"{what}: process {p.name} exited with code {p.exitcode}"
                    ) from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: nothing after {timeout:.0f} s") from None


def run_pair(
    receiver: Callable[..., None],
    rargs: tuple[Any, ...],
    sender: Callable[..., None],
    sargs: tuple[Any, ...],
    timeout: float = 900.0,
) -> Any:
    """Start ``receiver(*rargs, ready)`` in a spawned process, wait for the port it puts on
    ``ready``, run ``sender(port, *sargs, out)`` in another, and return what it puts on ``out``.
    Both processes are joined (or killed) before returning."""
    ctx = mp.get_context("spawn")  # never fork (docs/transport.md#spawn-never-fork)
    ready, out = ctx.Queue(), ctx.Queue()
    rp = ctx.Process(target=receiver, args=(*rargs, ready), name=receiver.__name__, daemon=True)
    procs = [rp]
    rp.start()
    try:
        port = _get(ready, procs, 60, "receiver start")
        sp = ctx.Process(target=sender, args=(port, *sargs, out), name=sender.__name__, daemon=True)
        procs.append(sp)
        sp.start()
        result = _get(out, procs, timeout, "exchange")
        sp.join(timeout=30)
        rp.join(timeout=5)  # raw-TCP receivers exit when the sender hangs up; others are killed
        return result
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
