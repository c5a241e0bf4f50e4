"""One tensor exchange between two processes on loopback: Concord's gRPC data plane against two
raw-TCP baselines measured in the same run (method: docs/transport.md#benchmarks).

Contenders (each a sender and a receiver in two spawned processes, glibc malloc tuned in every
process (docs/transport.md#memory), all on 127.0.0.1):

* ``naive_streams``: asyncio streams, one ``writer.write(payload)`` + ``drain``; the receiver
  ``readexactly`` (see `bench._tcp`);
* ``best_raw_tcp``: 1 MiB ``write`` + ``drain`` slices; the receiver an `asyncio.BufferedProtocol`
  filling a preallocated buffer — the fastest asyncio variant (docs/transport.md#benchmarks);
* ``grpc``: ``grpc_exchange(size_bytes, repeats) -> list[float]`` (seconds per exchange, its
  own spawned processes and warm-up, the real `concord.peer.transport.Transport`), imported
  lazily from ``bench/_grpc.py``. If that fails, the run prints ``grpc contender unavailable:
  <reason>`` and the baselines alone.

Time per exchange = from the first byte sent to the receiver's acknowledgement; ``--warmup``
discarded exchanges, then the median of ``--repeats`` (halved, at least 3, for sizes > 64 MiB).
MB/s = 10^6 payload bytes per second. Last line: a JSON object with MB/s per contender and size
(MiB) and ``ratio_vs_naive_streams`` / ``ratio_vs_best_raw_tcp`` = gRPC MB/s ÷ baseline MB/s at
64 MiB (null without the gRPC contender or without 64 in ``--sizes``).

    python bench/transport.py [--sizes 1,16,64,256] [--repeats 7] [--json-only] [--no-grpc]

The numbers are only comparable within one run: on a shared 2-vCPU machine they move by ±20 %.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._tcp import (
    MiB,
    best_receiver,
    naive_receiver,
    run_pair,
    tcp_sender,
    tune_malloc,
)

GrpcExchange = Callable[[int, int], list[float]]
RATIO_AT_MIB = 64


def load_grpc_contender() -> tuple[GrpcExchange | None, str]:
    """``(bench._grpc.grpc_exchange, "bench._grpc")``, or ``(None, why not)``."""
    try:
        from bench._grpc import grpc_exchange
    except Exception as exc:  # ImportError, or anything the module raises while importing
        return None, f"{type(exc).__name__}: {exc}"
    return grpc_exchange, "bench._grpc"


def _repeats(size_mib: int, repeats: int) -> int:
    return repeats if size_mib <= 64 else max(3, repeats // 2)


def _mbps(size: int, seconds: list[float]) -> float:
    return size / statistics.median(seconds) / 1e6


def _table(sizes: list[int], mbps: dict[str, dict[int, float]]) -> str:
    names = [n for n in mbps if mbps[n]]
    lines = ["size      " + "".join(f"{n:>16}" for n in names) + "   (MB/s, median)"]
    for mib in sizes:
        cells = "".join(f"{mbps[n][mib]:>16.0f}" if mib in mbps[n] else f"{'-':>16}" for n in names)
        lines.append(f"{mib:>4} MiB  {cells}")
    return "\n".join(lines)


def _ratio(mbps: dict[str, dict[int, float]], baseline: str) -> float | None:
    grpc, base = mbps["grpc"].get(RATIO_AT_MIB), mbps[baseline].get(RATIO_AT_MIB)
    return None if grpc is None or base is None else round(grpc / base, 3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1,16,64,256", help="MiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=7, help="timed exchanges per size (≥ 1)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="discarded baseline exchanges (≥ 0); the grpc contender warms up itself",
    )
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    parser.add_argument("--no-grpc", action="store_true", help="baselines only")
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers (MiB); got {args.sizes!r}")
    if not sizes or min(sizes) < 1:
        parser.error(f"--sizes must list sizes ≥ 1 MiB; got {args.sizes!r}")
    if args.repeats < 1 or args.warmup < 0:
        parser.error(f"--repeats ≥ 1 and --warmup ≥ 0; got {args.repeats}, {args.warmup}")

    def say(text: str) -> None:
        if not args.json_only:
            print(text, flush=True)

    tune_malloc()
    grpc_exchange: GrpcExchange | None = None
    if args.no_grpc:
        source = "disabled by --no-grpc"
    else:
        grpc_exchange, source = load_grpc_contender()
    say(f"grpc contender: {source}" if grpc_exchange else f"grpc contender unavailable: {source}")

    mbps: dict[str, dict[int, float]] = {"naive_streams": {}, "best_raw_tcp": {}, "grpc": {}}
    for mib in sizes:
        size, reps = mib * MiB, _repeats(mib, args.repeats)
        naive = run_pair(naive_receiver, (size,), tcp_sender, (size, reps, args.warmup, False))
        mbps["naive_streams"][mib] = _mbps(size, naive)
        best = run_pair(best_receiver, (size,), tcp_sender, (size, reps, args.warmup, True))
        mbps["best_raw_tcp"][mib] = _mbps(size, best)
        if grpc_exchange is not None:
            try:
                mbps["grpc"][mib] = _mbps(size, grpc_exchange(size, reps))
            except Exception as exc:  # report and keep the baselines
                say(f"grpc contender unavailable: failed at {mib} MiB: {type(exc).__name__}: {exc}")
                source, grpc_exchange = f"failed at {mib} MiB: {exc}", None
        row = "  ".join(f"{n} {v[mib]:.0f}" for n, v in mbps.items() if mib in v)
        say(f"{mib:>4} MiB ({reps} repeats): {row} MB/s")
    say(_table(sizes, mbps))
    result: dict[str, Any] = {
        "benchmark": "transport",
        "unit": "MB/s (1e6 B/s of payload), median; sizes in MiB",
        "repeats": {str(m): _repeats(m, args.repeats) for m in sizes},
        "warmup": args.warmup,
        "grpc_contender": source if grpc_exchange else f"unavailable: {source}",
        "naive_streams": {str(m): round(v, 1) for m, v in mbps["naive_streams"].items()},
        "best_raw_tcp": {str(m): round(v, 1) for m, v in mbps["best_raw_tcp"].items()},
        "grpc": {str(m): round(v, 1) for m, v in mbps["grpc"].items()} or None,
        "ratio_vs_naive_streams": _ratio(mbps, "naive_streams"),
        "ratio_vs_best_raw_tcp": _ratio(mbps, "best_raw_tcp"),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
