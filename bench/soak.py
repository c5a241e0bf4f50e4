"""Soak: a long real run (orchestrator + n peer processes on loopback) with the memory and the open
descriptors of every process sampled at a fixed interval; prints each process's slopes.

The run is ``concord sim --engine processes`` on a small model (MLP, MNIST-1D, D-SGD on a ring,
adaptive consensus control — the control plane busy every step, 1 torch thread per process), set to
far more epochs than the soak lasts; after ``--minutes`` the launcher gets SIGTERM and stops every
child the way Ctrl-C does. Every ``--interval`` seconds the launcher's process tree is sampled
(psutil): RSS and the number of open file descriptors per process, keyed by role (launcher,
orchestrator, peer-i). Slopes are least-squares fits over the samples after ``--warmup`` minutes
(allocators and caches fill during the first minutes), in MiB per minute and descriptors per
minute.

Targets (printed, never asserted): RSS slope ≤ 1 MiB/min for every process after the first two
minutes, and a flat descriptor count. Last line: a JSON object with ``rss_slope_mib_per_min_max``,
``fd_slope_per_min_max``, the per-process slopes, samples and the run's exit code.

    python bench/soak.py [--minutes 20] [--interval 10] [--peers 8] [--warmup 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _role(proc: psutil.Process, launcher: int) -> str:
    if proc.pid == launcher:
        return "launcher"
    try:
        argv = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid-{proc.pid}"
    if "orchestrator" in argv:
        return "orchestrator"
    if "peer" in argv and "--id" in argv:
        return f"peer-{argv[argv.index('--id') + 1]}"
    return f"pid-{proc.pid}"


def sample(launcher: psutil.Process) -> dict[str, tuple[float, int]]:
    """Role → (RSS in MiB, open descriptors) for the launcher and every descendant."""
    out: dict[str, tuple[float, int]] = {}
    try:
        procs = [launcher, *launcher.children(recursive=True)]
    except psutil.NoSuchProcess:
        return out
    for proc in procs:
        try:
            with proc.oneshot():
                out[_role(proc, launcher.pid)] = (proc.memory_info().rss / MIB, proc.num_fds())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def slope(ts: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over ts (None with fewer than 3 points)."""
    if len(ts) < 3:
        return None
    fit = statistics.linear_regression(ts, ys)
    return float(fit.slope)


def _command(peers: int, out: Path) -> list[str]:
    sets = [
        f"peers={peers}",
        "epochs=100000",  # far longer than the soak: the launcher is stopped by SIGTERM
        "threads=1",
        "model.name=mlp",
        "dataset.samples=4000",
        "control.mode=adaptive",
        "eval.every=50.0",
        "name=soak",
    ]
    argv = [sys.executable, "-m", "concord.lab.cli", "sim", "--engine", "processes", "--quiet"]
    argv += ["--reference", "none", "--out", str(out)]
    for item in sets:
        argv += ["--set", item]
    return argv


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--minutes", type=float, default=20.0, help="soak length")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--peers", type=int, default=8)
    parser.add_argument("--warmup", type=float, default=2.0, help="minutes left out of the fits")
    parser.add_argument(
        "--quick", action="store_true", help="3 minutes, 5 s samples, 1 min warm-up"
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directory here")
    args = parser.parse_args(argv)
    if args.quick:
        args.minutes, args.interval, args.warmup = 3.0, 5.0, 1.0
    tmp = None if args.keep else tempfile.TemporaryDirectory(prefix="concord-soak-")
    out = args.keep or Path(tmp.name if tmp else ".") / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(Path(tempfile.gettempdir()) / f"concord-soak-{os.getpid()}.log", "wb") as log:
        proc = subprocess.Popen(
            _command(args.peers, out), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    launcher = psutil.Process(proc.pid)
    series: dict[str, list[tuple[float, float, int]]] = {}
    started = time.monotonic()
    end = started + 60.0 * args.minutes
    print(f"soak: {args.peers} peers for {args.minutes:g} min, a sample every {args.interval:g} s")
    try:
        while time.monotonic() < end and proc.poll() is None:
            minute = (time.monotonic() - started) / 60.0
            for role, (rss, fds) in sample(launcher).items():
                series.setdefault(role, []).append((minute, rss, fds))
            time.sleep(args.interval)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=30)
    rows: dict[str, dict[str, Any]] = {}
    for role, points in sorted(series.items()):
        kept = [p for p in points if p[0] >= args.warmup]
        ts = [p[0] for p in kept]
        rows[role] = {
            "samples": len(points),
            "rss_mib_first": round(points[0][1], 1),
            "rss_mib_last": round(points[-1][1], 1),
            "rss_slope_mib_per_min": slope(ts, [p[1] for p in kept]),
            "fds_first": points[0][2],
            "fds_last": points[-1][2],
            "fd_slope_per_min": slope(ts, [float(p[2]) for p in kept]),
        }
    print(f"{'process':14} {'samples':>7} {'RSS MiB first→last':>20} {'MiB/min':>9} "
          f"{'fds first→last':>15} {'fds/min':>8}")  # fmt: skip
    for role, r in rows.items():
        rss_s, fd_s = r["rss_slope_mib_per_min"], r["fd_slope_per_min"]
        rss_txt = "-" if rss_s is None else f"{rss_s:+.3f}"
        fd_txt = "-" if fd_s is None else f"{fd_s:+.2f}"
        print(
            f"{role:14} {r['samples']:7d} {r['rss_mib_first']:>9.1f} → {r['rss_mib_last']:<8.1f} "
            f"{rss_txt:>9} {r['fds_first']:>6d} → {r['fds_last']:<6d} {fd_txt:>8}"
        )
    rss_slopes = [r["rss_slope_mib_per_min"] for r in rows.values()]
    fd_slopes = [r["fd_slope_per_min"] for r in rows.values()]
    rss_max = max((s for s in rss_slopes if s is not None), default=None)
    fd_max = max((abs(s) for s in fd_slopes if s is not None), default=None)
    print(
        f"targets: RSS slope ≤ 1 MiB/min (max {rss_max}), flat descriptors (max |slope| {fd_max})"
    )
    print(
        json.dumps(
            {
                "benchmark": "soak",
                "peers": args.peers,
                "minutes": args.minutes,
                "interval_s": args.interval,
                "warmup_min": args.warmup,
                "exit_code": code,
                "rss_slope_mib_per_min_max": rss_max,
                "fd_slope_per_min_max": fd_max,
                "processes": rows,
            }
        )
    )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
