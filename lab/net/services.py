"""Services a test or benchmark starts on a host of a `Net` (for now: the MQTT broker)."""

from __future__ import annotations

import getpass
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from concord.lab.net.topology import Host


def mosquitto(host: Host, directory: Path, *, port: int = 1883, timeout: float = 15.0) -> Any:
    """Start Mosquitto (anonymous, TCP_NODELAY, no persistence) on ``host``'s address inside
    its namespace, its config and output (``mosquitto.out``) in ``directory``; return the
    process once the port answers from inside the namespace. Raises RuntimeError (with the
    output's tail) when mosquitto is missing or does not answer within ``timeout`` seconds."""
    from concord.orchestrator.broker import mosquitto_binary

    binary = mosquitto_binary()
    if binary is None:
        raise RuntimeError("mosquitto is not installed")
    directory.mkdir(parents=True, exist_ok=True)
    conf, log = directory / "mosquitto.conf", directory / "mosquitto.out"
    conf.write_text(
        f"listener {port} {host.ip}\nallow_anonymous true\nset_tcp_nodelay true\n"
        f"persistence false\nlog_type error\nuser {getpass.getuser()}\n"
    )
    with open(log, "ab") as out:
        proc = host.run(
            [binary, "-c", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    probe = f"import socket; socket.create_connection(('{host.ip}', {port}), 1).close()"
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if host.call([sys.executable, "-c", probe], timeout=10).returncode == 0:
            return proc
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"mosquitto did not start on {host.ip}:{port}: {log.read_text()[-800:]}")
