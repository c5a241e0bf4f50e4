"""``concord compose``: a docker compose stack for N peers, a base file and overlays.

`render` returns every file as text (path relative to the output directory → content); the CLI
writes them. The stack:

* ``compose.yaml``: Mosquitto, the orchestrator and ``peer-0`` … ``peer-<N-1>``, each peer
  labelled with its neighbours in the run's topology, healthchecks on every service;
* ``compose.tls.yaml`` (mTLS and signed control messages), ``compose.auth.yaml`` (a password
  per identity, a TLS listener and the run's ACL at the broker), ``compose.shape.yaml`` (a ``tc``
  token bucket on each peer's egress), ``compose.limits.yaml`` (CPU and memory per peer) and
  ``compose.gpu.yaml`` (one GPU per peer, round-robin), each only when asked for;
* ``run.toml``, ``Dockerfile`` (+ ``.dockerignore``), the Mosquitto configs, ``certs.sh``.

Overlays add ``CONCORD_*`` environment variables (the run config's keys, read by every Concord
process) and mounts; no overlay repeats a command. Each private key (and password) is mounted
into the one container that owns it, file by file. docs/deployment.md#docker-compose explains
the stack.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from concord.core.config import RunConfig
from concord.lab.compose_image import GENERATED, TORCH_CUDA_INDEX, dockerfile, dockerignore
from concord.lab.deploy_common import (
    METRICS_PORT,
    MQTT_PORT,
    PEER_PORT,
    DeployError,
    certs_commands,
    check_metrics_port,
    check_transport,
    metrics_args,
    mosquitto_conf,
    peer_command,
    prometheus_annotations,
    slug,
)
from concord.lab.deploy_common import default_run_toml as _default_run_toml
from concord.lab.yamltext import Anchored, Node, Raw, dump

CERTS = "certs"  # beside the compose files; git-ignored
_PROJECT = re.compile(r"[a-z0-9][a-z0-9_-]*")  # compose's rule for a project name

_RATE = re.compile(r"(?P<value>\d+(?:\.\d+)?)(?P<unit>[a-z]+)")
_RATE_UNITS = {  # tc's units → bits per second
    "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
}  # fmt: skip
_MEMORY = re.compile(r"\d+(?:\.\d+)?[kmg]?b?")
# restart policies: a crashed peer comes back and rejoins (a few times: one that cannot start
# stops trying); the orchestrator cannot reuse its run directory, and the run ends when it
# exits; the broker is the control plane, back after a crash (clients reconnect)
PEER_RESTART, ORCHESTRATOR_RESTART, BROKER_RESTART = "on-failure:3", "no", "unless-stopped"


class ComposeError(DeployError):
    """Options that cannot make a stack; the message lists every problem."""


@dataclass(frozen=True)
class ComposeOptions:
    peers: int
    tls: bool = False
    auth: bool = False
    shape: str | None = None  # a tc rate, e.g. "100mbit"
    cpus: float | None = None
    memory: str | None = None  # compose's mem_limit, e.g. "2g"
    gpus: int = 0  # devices on the host; peer i gets device i % gpus
    out: str = "compose"  # the output directory as the user named it (for the comments)
    context: str = ".."  # the build context (the repository root), relative to the output dir
    dockerfile: str = "compose/Dockerfile"  # relative to the context
    config: str | None = None  # the --config given (for the header), or None: the default
    project: str | None = None  # the compose project (top-level name); None: from the run
    metrics_port: int = METRICS_PORT  # each process's Prometheus endpoint; 0: none


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate (``100mbit``, ``1gbit``, ``500kbit``, ``10mbps`` …)."""
    m = _RATE.fullmatch(rate.strip().lower())
    if m is None or m["unit"] not in _RATE_UNITS or float(m["value"]) <= 0:
        raise ComposeError(
            f"--shape {rate!r}: expected a positive tc rate such as 100mbit, 1gbit or 500kbit "
            f"(units: {', '.join(_RATE_UNITS)})"
        )
    return float(m["value"]) * _RATE_UNITS[m["unit"]]


def check(options: ComposeOptions) -> None:
    """ComposeError listing every unusable option."""
    problems = []
    if options.peers < 2:
        problems.append(f"--peers {options.peers}: a run needs at least 2 peers")
    if options.shape is not None:
        try:
            rate_bits(options.shape)
        except ComposeError as exc:
            problems.append(str(exc))
    if options.cpus is not None and options.cpus <= 0:
        problems.append(f"--cpus {options.cpus}: must be > 0")
    if options.memory is not None and not _MEMORY.fullmatch(options.memory.lower()):
        problems.append(f"--memory {options.memory!r}: expected a size such as 512m or 2g")
    if options.gpus < 0:
        problems.append(f"--gpus {options.gpus}: must be ≥ 0")
    if options.project is not None and not _PROJECT.fullmatch(options.project):
        problems.append(
            f"--project {options.project!r}: a compose project name is lowercase letters, "
            "digits, '-' and '_', starting with a letter or digit"
        )
    problems += check_metrics_port(options.metrics_port)
    if problems:
        raise ComposeError("; ".join(problems))


def project_name(options: ComposeOptions, cfg: RunConfig) -> str:
    """The compose project (containers, network and volume are named after it): --project, or
    the run's name made a project name (two stacks of one run config on a host need
    --project)."""
    return options.project or slug(cfg.name or "") or "concord"


def command_line(options: ComposeOptions) -> str:
    """The ``concord compose`` command that writes these files."""
    args = ["concord", "compose", "--peers", str(options.peers)]
    if options.config is not None:
        args += ["--config", options.config]
    args += ["--tls"] * options.tls + ["--auth"] * options.auth
    if options.shape is not None:
        args += ["--shape", options.shape]
    if options.cpus is not None:
        args += ["--cpus", f"{options.cpus:g}"]
    if options.memory is not None:
        args += ["--memory", options.memory]
    if options.gpus:
        args += ["--gpus", str(options.gpus)]
    if options.project is not None:
        args += ["--project", options.project]
    if options.metrics_port != METRICS_PORT:
        args += ["--metrics-port", str(options.metrics_port)]
    return shlex.join([*args, "--out", options.out])


def workflow(options: ComposeOptions, files: list[str], project: str) -> list[str]:
    """The commands of a run, from the repository root: build and start in the background, wait
    for the orchestrator (the run's end and its exit status; Mosquitto keeps running, so a
    plain `up` never returns), copy the results off the volume, remove the stack."""
    compose = "docker compose " + " ".join(f"-f {options.out}/{f}" for f in files)
    return [
        f"CONCORD_UID=$(id -u) {compose} up --build -d",
        f"{compose} wait orchestrator",
        f"{compose} cp orchestrator:/runs ./runs/{project}",
        f"{compose} down -v",
    ]


def neighbours(cfg: RunConfig) -> list[tuple[int, ...]]:
    """Each peer's neighbours in the run's topology (for a time-varying one, the union over a
    period). ComposeError when the topology does not exist for this many peers."""
    from concord.core.graphs.topology import make_schedule

    try:
        graph = make_schedule(cfg.topology, cfg.peers, seed=cfg.seed).union_graph()
    except (ValueError, OSError) as exc:
        raise ComposeError(f"topology {cfg.topology!r} for {cfg.peers} peers: {exc}") from None
    return [graph.neighbors(i) for i in range(cfg.peers)]


# ------------------------------------------------------------------------------------- helpers


def _peer(i: int) -> str:
    return f"peer-{i}"


def _secret(source: str, target: str) -> dict[str, Node]:
    """A read-only bind mount of one file made by ``concord certs`` (certs.sh): compose fails
    rather than create a directory in its place when the file is missing."""
    return {
        "type": "bind",
        "source": f"./{CERTS}/{source}",
        "target": target,
        "read_only": True,
        "bind": {"create_host_path": False},
    }


def _header(options: ComposeOptions, *lines: str) -> str:
    head = [
        f"{GENERATED}: regenerate rather than edit.",
        f"#   {command_line(options)}",
        *(f"# {line}".rstrip() for line in lines),
    ]
    return "\n".join(head) + "\n"


def _overlay_names(options: ComposeOptions) -> list[str]:
    names = ["tls"] * options.tls + ["auth"] * options.auth + ["shape"] * bool(options.shape)
    names += ["limits"] * (options.cpus is not None or options.memory is not None)
    return names + ["gpu"] * bool(options.gpus)


# -------------------------------------------------------------------------------------- files


def base(options: ComposeOptions, cfg: RunConfig) -> str:
    n = options.peers
    build: dict[str, Node] = {
        "context": options.context,
        "dockerfile": options.dockerfile,
        "args": {"CONCORD_UID": "${CONCORD_UID:-1000}"},
    }
    concord: dict[str, Node] = {
        "image": "concord:local",
        "build": build,
        "init": True,  # tini as PID 1: forwards SIGTERM (a peer stops at the next step)
        "# the broker of every Concord process; CONCORD_BROKER names an external one.": None,
        "# Without the tls overlay the stack runs plaintext and unsigned on its own network": None,
        "# (no host port): network.insecure says so; the tls overlay turns it off": None,
        "environment": {
            "CONCORD_ORCHESTRATOR__BROKER": "${CONCORD_BROKER:-mqtt://mosquitto:1883}",
            "CONCORD_NETWORK__INSECURE": "true",
        },
        "volumes": ["./run.toml:/etc/concord/run.toml:ro", "runs:/runs"],
        "depends_on": {"mosquitto": {"condition": "service_healthy"}},
    }
    probe = f"import socket; socket.create_connection(('127.0.0.1', {PEER_PORT}), 2).close()"
    peer: dict[str, Node] = {
        "<<": Raw("*concord"),
        "# a crashed peer comes back and rejoins (3 tries: one that cannot start gives up)": None,
        "restart": PEER_RESTART,
        "expose": [str(PEER_PORT)],
        "# a TCP connect to the gRPC port: plaintext and mTLS alike": None,
        "healthcheck": {
            "test": ["CMD", "python", "-c", probe],
            "interval": "5s",
            "timeout": "3s",
            "retries": 5,
            "start_period": "120s",  # dataset generation before the server starts
        },
    }
    metrics = options.metrics_port
    if metrics:
        # reachable from the stack's network only: nothing is published on the host
        concord["expose"] = [str(metrics)]
        peer["expose"] = [str(PEER_PORT), str(metrics)]
    scrape: dict[str, Node] = dict(prometheus_annotations(metrics)) if metrics else {}
    services: dict[str, Node] = {
        "mosquitto": {
            "image": "eclipse-mosquitto:2",
            "restart": BROKER_RESTART,
            "volumes": ["./mosquitto/mosquitto.conf:/mosquitto/config/mosquitto.conf:ro"],
            "healthcheck": {
                "test": [
                    "CMD",
                    "mosquitto_pub",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(MQTT_PORT),
                    "-t",
                    "healthcheck",
                    "-n",
                ],
                "interval": "2s",
                "timeout": "5s",
                "retries": 15,
            },
        },
        "orchestrator": {
            "<<": Raw("*concord"),
            "# the run ends when it exits; a restart would find its run directory used": None,
            "restart": ORCHESTRATOR_RESTART,
            "command": [
                "orchestrator",
                "--config",
                "/etc/concord/run.toml",
                "--out",
                "/runs/orchestrator",
                *metrics_args(metrics),
            ],
            **({"labels": scrape} if scrape else {}),
            "# written once it has started": None,
            "healthcheck": {
                "test": ["CMD", "test", "-s", "/runs/orchestrator/orchestrator.json"],
                "interval": "2s",
                "timeout": "5s",
                "retries": 30,
            },
        },
    }
    for i, near in enumerate(neighbours(cfg)):
        services[_peer(i)] = {
            "<<": Raw("*peer"),
            "command": peer_command(
                i,
                advertise=f"{_peer(i)}:{PEER_PORT}",
                out=f"/runs/{_peer(i)}",
                metrics_port=metrics,
            ),
            "labels": {
                "concord.peer": str(i),
                "concord.neighbours": " ".join(_peer(j) for j in near),
                **scrape,
            },
        }
    project = project_name(options, cfg)
    files = ["compose.yaml", *(f"compose.{o}.yaml" for o in _overlay_names(options))]
    header = _header(
        options,
        f"A Concord run in containers: a Mosquitto broker, the orchestrator and {n} peers "
        f"({cfg.topology}), the compose project {project!r}. From the repository root:",
        *(f"  {line}" for line in workflow(options, files, project)),
        "(the uid: containers read the 0600 keys of certs.sh; `wait` returns when the run ends,",
        "with the orchestrator's exit status; the results are on the volume, under /runs)",
        "Relative paths resolve from this folder. Settings reach the containers as CONCORD_*",
        "environment variables (run config keys); the overlays add variables and mounts.",
        *(
            [f"Metrics: port {metrics} of every Concord container, on the stack's network only."]
            if metrics
            else []
        ),
    )
    body: dict[str, Node] = {
        "name": project,
        "x-concord": Anchored("concord", concord),
        "x-peer": Anchored("peer", peer),
        "services": services,
        "volumes": {"runs": {}},
    }
    return header + "\n" + dump(body)


def _tls_env() -> dict[str, Node]:
    return {
        "CONCORD_NETWORK__INSECURE": "false",  # mTLS and signed control: nothing to accept
        "CONCORD_NETWORK__TLS__CA": "/certs/ca.crt",
        "CONCORD_NETWORK__TLS__CERT": "/certs/peer-{id}.crt",
        "CONCORD_NETWORK__TLS__KEY": "/certs/peer-{id}.key",
    }


def tls_overlay(options: ComposeOptions) -> str:
    services: dict[str, Node] = {
        "orchestrator": {
            "environment": Raw("*tls"),
            "volumes": [
                _secret("ca.crt", "/certs/ca.crt"),
                _secret("orchestrator.crt", "/certs/orchestrator.crt"),
                _secret("orchestrator.key", "/certs/orchestrator.key"),
            ],
        }
    }
    for i in range(options.peers):
        services[_peer(i)] = {
            "environment": Raw("*tls"),
            "volumes": [
                _secret("ca.crt", "/certs/ca.crt"),
                _secret(f"{_peer(i)}.crt", f"/certs/{_peer(i)}.crt"),
                _secret(f"{_peer(i)}.key", f"/certs/{_peer(i)}.key"),
            ],
        }
    header = _header(
        options,
        "Overlay: mTLS between the peers and signed control messages (network.tls).",
        f"  sh {options.out}/certs.sh      (once: the run CA and every identity, into certs/)",
        f"  CONCORD_UID=$(id -u) docker compose -f {options.out}/compose.yaml \\",
        f"      -f {options.out}/compose.tls.yaml up --build -d",
        "Keys are 0600: the image's user must have your uid (CONCORD_UID). Each container",
        "mounts its own key only; {id} in the settings becomes the peer's id.",
    )
    return header + "\n" + dump({"x-tls": Anchored("tls", _tls_env()), "services": services})


def _auth_env() -> dict[str, Node]:
    return {
        "CONCORD_ORCHESTRATOR__BROKER": "${CONCORD_BROKER:-mqtts://mosquitto:8883}",
        "CONCORD_ORCHESTRATOR__BROKER_USERNAME": "{identity}",
        "CONCORD_ORCHESTRATOR__BROKER_PASSWORD_FILE": "/certs/broker/{identity}.password",
        "CONCORD_ORCHESTRATOR__BROKER_CA": "/certs/ca.crt",
    }


def auth_overlay(options: ComposeOptions) -> str:
    conf = "/mosquitto/config"
    services: dict[str, Node] = {
        "mosquitto": {
            "# runs as your uid: it reads the 0600 broker key and password file": None,
            "user": "${CONCORD_UID:-1000}",
            "volumes": [
                f"./mosquitto/mosquitto.auth.conf:{conf}/mosquitto.conf:ro",
                f"./mosquitto/healthcheck.acl:{conf}/healthcheck.acl:ro",
                _secret("ca.crt", "/mosquitto/certs/ca.crt"),
                _secret("broker.crt", "/mosquitto/certs/broker.crt"),
                _secret("broker.key", "/mosquitto/certs/broker.key"),
                _secret("broker/passwd", "/mosquitto/certs/passwd"),
                _secret("broker/acl", "/mosquitto/certs/acl"),
            ],
        }
    }
    identities = [("orchestrator", "orchestrator")]
    identities += [(_peer(i), _peer(i)) for i in range(options.peers)]
    for service, identity in identities:
        services[service] = {
            "environment": Raw("*auth"),
            "volumes": [
                _secret("ca.crt", "/certs/ca.crt"),
                _secret(f"broker/{identity}.password", f"/certs/broker/{identity}.password"),
            ],
        }
    header = _header(
        options,
        "Overlay: broker authentication: a TLS listener (8883), one password per identity",
        "(orchestrator, peer-<id>) and the run's ACL (each identity publishes only its topics).",
        f"  sh {options.out}/certs.sh      (once, as for compose.tls.yaml)",
        f"  CONCORD_UID=$(id -u) docker compose -f {options.out}/compose.yaml \\",
        f"      -f {options.out}/compose.auth.yaml up --build -d",
        "{identity} in the settings becomes each process's identity.",
    )
    return header + "\n" + dump({"x-auth": Anchored("auth", _auth_env()), "services": services})


def shape_burst(rate: str) -> int:
    """The token bucket in bytes: 4 ms at the rate, at least 32 KiB (as bench/netns.py)."""
    return max(32 * 1024, int(rate_bits(rate) / 8 * 0.004))


SHAPE_SCRIPT = (
    'tc qdisc replace dev eth0 root tbf rate "$$CONCORD_SHAPE_RATE" '
    'burst "$$CONCORD_SHAPE_BURST" latency 50ms && exec concord "$$@"'
)


def shape_overlay(options: ComposeOptions) -> str:
    assert options.shape is not None
    shaped: dict[str, Node] = {
        "cap_add": ["NET_ADMIN"],
        "environment": {
            "CONCORD_SHAPE_RATE": options.shape,
            "CONCORD_SHAPE_BURST": str(shape_burst(options.shape)),
        },
        "# cap eth0's egress, then run the service's command as before": None,
        "entrypoint": ["/bin/sh", "-c", SHAPE_SCRIPT, "concord"],
    }
    services = {_peer(i): Raw("*shaped") for i in range(options.peers)}
    header = _header(
        options,
        f"Overlay: each peer's link capped at {options.shape} with a tc token bucket on its",
        "egress (every peer is capped, so what it receives is capped by its senders too).",
        "tc needs NET_ADMIN; the image gives /usr/sbin/tc that one file capability, so the",
        "peer still runs as the unprivileged user.",
    )
    return header + "\n" + dump({"x-shaped": Anchored("shaped", shaped), "services": services})


def limits_overlay(options: ComposeOptions) -> str:
    limits: dict[str, Node] = {}
    if options.cpus is not None:
        limits["cpus"] = options.cpus
    if options.memory is not None:
        limits["mem_limit"] = options.memory
    services = {_peer(i): Raw("*limits") for i in range(options.peers)}
    header = _header(
        options,
        "Overlay: CPU and memory limits per peer (the orchestrator and broker are light).",
    )
    return header + "\n" + dump({"x-limits": Anchored("limits", limits), "services": services})


def gpu_overlay(options: ComposeOptions) -> str:
    cuda: dict[str, Node] = {
        "image": "concord:cuda",
        "build": {
            "context": options.context,
            "dockerfile": options.dockerfile,
            "args": {
                "CONCORD_UID": "${CONCORD_UID:-1000}",
                "TORCH_INDEX": f"${{CONCORD_TORCH_INDEX:-{TORCH_CUDA_INDEX}}}",
            },
        },
        "environment": {"CONCORD_DEVICE": "cuda"},
    }
    services: dict[str, Node] = {}
    for i in range(options.peers):
        device = {
            "driver": "nvidia",
            "device_ids": [str(i % options.gpus)],
            "capabilities": ["gpu"],
        }
        services[_peer(i)] = {
            "<<": Raw("*cuda"),
            "deploy": {"resources": {"reservations": {"devices": [device]}}},
        }
    header = _header(
        options,
        f"Overlay: one GPU per peer, round-robin over {options.gpus} device(s) (NVIDIA Container",
        "Toolkit). Peers run a CUDA build of torch (image concord:cuda; CONCORD_TORCH_INDEX picks",
        "the wheel index matching your driver); the orchestrator needs no torch and stays on CPU.",
    )
    return header + "\n" + dump({"x-cuda": Anchored("cuda", cuda), "services": services})


HEALTHCHECK_ACL = """\
# Anonymous clients on the broker's loopback listener (its healthcheck) may publish this only.
topic write healthcheck
"""


def certs_script(options: ComposeOptions, cfg: RunConfig) -> str:
    lines = certs_commands(options, cfg.name, certs=CERTS, peer_host=_peer, broker_host="mosquitto")
    body = "\n".join(lines)
    what = ["the run CA and the orchestrator's signing key"]
    what += ["a certificate per peer, named for its service"] * options.tls
    what += ["the broker's certificate, the passwords and the ACL"] * options.auth
    return f"""\
#!/bin/sh
{GENERATED}: regenerate rather than edit.
# The identities of this stack, into {CERTS}/ beside this script (git-ignored: private keys):
# {"; ".join(what)}. The CA key stays here: no container mounts it.
set -eu
cd "$(dirname "$0")"
{body}
"""


def gitignore() -> str:
    return (
        f"# Keys and passwords made by certs.sh (`concord certs`): never commit them.\n{CERTS}/\n"
    )


def default_run_toml(peers: int) -> str:
    """The run config of a stack made without --config."""
    return _default_run_toml(
        peers, name="compose-run", where="mounted read-only at /etc/concord/run.toml"
    )


def render(options: ComposeOptions, cfg: RunConfig, run_toml: str) -> dict[str, str]:
    """Every file of the stack: path relative to the output directory → text. ``cfg`` is the
    run config ``run_toml`` resolves to (its ``peers`` must be ``options.peers``)."""
    check(options)
    problems = check_transport(cfg)
    if cfg.peers != options.peers:
        problems.insert(
            0,
            f"the run config has peers = {cfg.peers} but --peers {options.peers}: make them agree",
        )
    if problems:
        raise ComposeError("; ".join(problems))
    where = "compose.yaml (mounted at /mosquitto/config/mosquitto.conf)"
    files = {
        "compose.yaml": base(options, cfg),
        "run.toml": run_toml,
        "Dockerfile": dockerfile(options.context),
        "Dockerfile.dockerignore": dockerignore(),
        "mosquitto/mosquitto.conf": mosquitto_conf(auth=False, where=where),
        ".gitignore": gitignore(),
    }
    makers: dict[str, Callable[[ComposeOptions], str]] = {
        "tls": tls_overlay,
        "auth": auth_overlay,
        "shape": shape_overlay,
        "limits": limits_overlay,
        "gpu": gpu_overlay,
    }
    for name in _overlay_names(options):
        files[f"compose.{name}.yaml"] = makers[name](options)
    if options.auth:
        files["mosquitto/mosquitto.auth.conf"] = mosquitto_conf(
            auth=True, where="compose.auth.yaml", healthcheck_listener=True
        )
        files["mosquitto/healthcheck.acl"] = HEALTHCHECK_ACL
    if options.tls or options.auth:
        files["certs.sh"] = certs_script(options, cfg)
    return files
