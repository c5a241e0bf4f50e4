"""Helpers to run real `concord peer` processes on loopback for tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def write_config(path: Path, peers: int, extra: str = "", *, deadline: float = 5.0) -> Path:
    addresses = ", ".join(f'"127.0.0.1:{p}"' for p in free_ports(peers))
    path.write_text(
        f'name = "itest"\npeers = {peers}\n{extra}\n'
        f"[network]\naddresses = [{addresses}]\ndeadline = {deadline}\n"
    )
    return path


def lifecycle(run_dir: Path) -> list[str]:
    """The states a peer process went through after ``starting`` (its ``peer.state`` log lines,
    `concord.peer.lifecycle`), in order."""
    lines = (run_dir / "log.jsonl").read_text().splitlines()
    return [e["to"] for e in map(json.loads, lines) if e.get("event") == "peer.state"]


class Peers:
    """n peer processes (spawned with subprocess, never forked from a torch process)."""

    def __init__(
        self,
        config: Path,
        out: Path,
        ids: list[int],
        *,
        launcher: Mapping[int, dict[str, str]] | None = None,
    ) -> None:
        """``launcher``: per id, the environment a launcher would set (RANK, …) in place of
        ``--id``."""
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.out = out
        self._logs: list[IO[bytes]] = []
        for i in ids:
            log = open(out / f"peer-{i}.stderr", "wb")  # noqa: SIM115 - closed in kill_all()
            self._logs.append(log)
            by_launcher = launcher is not None and i in launcher
            ident = [] if by_launcher else ["--id", str(i)]
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            if launcher is not None and by_launcher:
                env.update(launcher[i])
            self.procs[i] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "concord.lab.cli",
                    "peer",
                    "--config",
                    str(config),
                    *ident,
                    "--out",
                    str(out / f"peer-{i}"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def wait(self, timeout: float = 120) -> dict[int, int]:
        codes = {}
        for i, p in self.procs.items():
            codes[i] = p.wait(timeout=timeout)
        return codes

    def kill_all(self) -> None:
        """SIGKILL whatever still runs (teardown), then close the output files."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=10)
        for log in self._logs:
            log.close()

    def __enter__(self) -> Peers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()
