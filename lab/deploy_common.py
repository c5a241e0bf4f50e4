"""What `concord compose` and `concord k8s` share: ports, the default run config, the Mosquitto
configs, the metrics wiring and how generated files are written (private ones 0600).

docs/deployment.md#docker-compose and #kubernetes describe the two generators.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from concord.core.config import RunConfig
from concord.protos.mqtt import MOSQUITTO_CLIENT_ID_BINDING

PEER_PORT = 50051  # every peer's gRPC port in a container
METRICS_PORT = 9400  # the default of --metrics-port (0: no endpoint)
METRICS_PATH = "/metrics"
MQTT_PORT, MQTTS_PORT = 1883, 8883


class DeployError(ValueError):
    """Options that cannot make a deployment; the message lists every problem."""


def slug(text: str, *, limit: int = 63) -> str:
    """``text`` as a lowercase name of letters, digits and dashes (a DNS label, a compose
    project), or ``""`` when nothing is left."""
    name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", name)[:limit].strip("-")


def check_metrics_port(port: int) -> list[str]:
    """The problems of ``--metrics-port`` (0 turns the endpoint off)."""
    if not 0 <= port <= 65535:
        return [f"--metrics-port {port}: expected a TCP port (1-65535) or 0 for no endpoint"]
    if port in (PEER_PORT, MQTT_PORT, MQTTS_PORT):
        return [f"--metrics-port {port}: taken by the gRPC or MQTT port; pick another"]
    return []


def metrics_args(port: int) -> list[str]:
    """The command-line arguments that open a process's metrics endpoint on ``port``."""
    return ["--metrics-listen", f"0.0.0.0:{port}"] if port else []


def peer_command(i: int, *, advertise: str, out: str, metrics_port: int) -> list[str]:
    """Peer ``i``'s container command (compose and k8s alike): the run config mounted at
    /etc/concord/run.toml, the gRPC port `PEER_PORT` on every interface, the address the others
    dial (``advertise``), its output directory and its metrics endpoint (`metrics_args`)."""
    return [
        "peer",
        "--config",
        "/etc/concord/run.toml",
        "--id",
        str(i),
        "--listen",
        f"0.0.0.0:{PEER_PORT}",
        "--advertise",
        advertise,
        "--out",
        out,
        *metrics_args(metrics_port),
    ]


class Identities(Protocol):
    """What `certs_commands` reads of a generator's options (`ComposeOptions`, `K8sOptions`)."""

    @property
    def peers(self) -> int: ...
    @property
    def tls(self) -> bool: ...
    @property
    def auth(self) -> bool: ...


def certs_commands(
    options: Identities,
    run_id: str | None,
    *,
    certs: str,
    peer_host: Callable[[int], str],
    broker_host: str,
) -> list[str]:
    """The `concord certs` commands that issue a deployment's identities into ``certs``: the run
    CA (``run_id``, quoted here; None: the config's default, ``concord``), with ``options.tls`` a
    certificate per peer (``peer_host(i)``: the name the others dial), with ``options.auth`` the
    broker's certificate, passwords and ACL."""
    peers = options.peers
    run = shlex.quote(run_id or "concord")
    lines = [f"concord certs init --dir {certs} --run-id {run}"]
    if options.tls:
        lines += [
            f"concord certs issue --dir {certs} --peer {i} --host {peer_host(i)}"
            for i in range(peers)
        ]
    if options.auth:
        lines.append(
            f"concord certs broker --dir {certs} --run-id {run} --peers {peers} "
            f"--host {broker_host}"
        )
    return lines


def prometheus_annotations(port: int) -> dict[str, str]:
    """The ``prometheus.io/*`` annotations (pods) or labels (containers) a scraper reads."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(port),
        "prometheus.io/path": METRICS_PATH,
    }


def default_run_toml(peers: int, *, name: str, where: str) -> str:
    """The small run the generators ship when no --config is given. ``where``: how the
    containers get it (one comment line)."""
    return f"""\
# The run every Concord container of this deployment uses
# ({where}).
# Peers learn their neighbours' addresses from the orchestrator's schedule, so there is no
# network.addresses here. Data are generated locally (MNIST-1D); nothing is downloaded.
name = "{name}"{" " * max(1, 18 - len(name))}# the run id (the broker ACL of --auth names it)
peers = {peers:<18} # one peer process per id 0 … peers-1
topology = "ring"
algorithm = "dsgd"
epochs = 10
seed = 0

[dataset]
name = "mnist1d"

[model]
name = "cnn1d"

[control]
mode = "adaptive"          # factor × EMA of the mean local gradient norm
factor = 0.25
phases = [1]
max_rounds = 20

[network]
deadline = 10.0            # seconds a gossip round waits for a neighbour
startup_timeout = 120.0    # containers (and their dataset generation) start at different times
"""


def check_transport(cfg: RunConfig) -> list[str]:
    """The generators wire the gRPC data plane (ports, Services, network policies) only."""
    if cfg.network.transport != "grpc":
        return [
            f"network.transport = {cfg.network.transport!r}: the generated deployments wire the "
            "gRPC data plane only (use transport = 'grpc', or write the rendezvous ports and "
            "policies yourself; docs/deployment.md#torch-data-plane)"
        ]
    return []


def mosquitto_conf(*, auth: bool, where: str, healthcheck_listener: bool = False) -> str:
    """Mosquitto 2's config: anonymous on 1883, or (``auth``) TLS on 8883 with a password per
    identity and the run's ACL read from /mosquitto/certs; ``healthcheck_listener`` adds an
    anonymous loopback listener allowed one topic (a healthcheck's publish)."""
    if not auth:
        return f"""\
# Mosquitto 2 for {where}.
# It has no network listener unless one is configured; this one is reachable only from the
# deployment's own network (no port is published beyond it).
listener {MQTT_PORT}

# Anonymous clients on a private network (--auth turns this off).
allow_anonymous true

# Without it every QoS 1 hop costs ~44 ms (Nagle vs delayed ACK; Mosquitto defaults to false).
set_tcp_nodelay true

# A demo broker keeps nothing on disk.
persistence false

log_dest stdout
"""
    healthcheck = """
# The healthcheck only: loopback inside this container, anonymous, one topic to publish.
listener 1883 127.0.0.1
allow_anonymous true
acl_file /mosquitto/config/healthcheck.acl
"""
    return f"""\
# Mosquitto 2 for {where}, with --auth: the files of `concord certs broker`, mounted
# read-only under /mosquitto/certs. Each listener has its own authentication settings.
per_listener_settings true
set_tcp_nodelay true
persistence false
log_dest stdout

# The Concord processes: TLS, a password per identity, the run's ACL.
listener {MQTTS_PORT}
allow_anonymous false
password_file /mosquitto/certs/passwd
acl_file /mosquitto/certs/acl
# a login's client id is its username: no login can take over another identity's session
{MOSQUITTO_CLIENT_ID_BINDING}
cafile /mosquitto/certs/ca.crt
certfile /mosquitto/certs/broker.crt
keyfile /mosquitto/certs/broker.key
tls_version tlsv1.2
{healthcheck if healthcheck_listener else ""}"""


def _write_text(path: Path, text: str, mode: int | None) -> None:
    """Write ``text``; with ``mode``, the file has that mode from its creation on (a private
    file is never readable by others, not even for a moment)."""
    if mode is None:
        path.write_text(text, encoding="utf-8")
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), mode)  # an existing file keeps its old mode through os.open
        f.write(text)


def write_files(
    out: Path,
    files: Mapping[str, str],
    *,
    force: bool,
    generated: str,
    executable: Iterable[str] = (),
    private: Iterable[str] = (),
    stale_glob: str = "",
) -> list[Path]:
    """Write ``files`` under ``out``: ``executable`` ones 0755, ``private`` ones 0600. Files
    already there are a DeployError unless ``force``; with ``force``, files matching
    ``stale_glob`` that start with ``generated`` and that this set no longer has are removed, so
    that a deployment never mixes two generations."""
    existing = [name for name in files if (out / name).exists()]
    if existing and not force:
        raise DeployError(
            f"{out} already holds {', '.join(sorted(existing)[:4])}"
            f"{', …' if len(existing) > 4 else ''}; pass --force to replace them"
        )
    stale = [
        p
        for p in (sorted(out.glob(stale_glob)) if stale_glob and out.is_dir() else [])
        if p.name not in files and p.read_text(encoding="utf-8").startswith(generated)
    ]
    run_as_script, secret = set(executable), set(private)
    written = []
    for name, text in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o600 if name in secret else 0o755 if name in run_as_script else None
        _write_text(path, text, mode)
        written.append(path)
    for path in stale:
        path.unlink()
    return written
