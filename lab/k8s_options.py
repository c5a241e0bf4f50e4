"""The options of `concord k8s`, their checks, and the names of the objects they make.

Every object name starts with ``--name`` (default ``concord``), and every object carries the
label ``app.kubernetes.io/instance: <name>`` that every selector matches, so several runs share a
namespace. docs/deployment.md#kubernetes describes the manifests.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from concord.core.config import RunConfig
from concord.lab.deploy_common import (
    METRICS_PORT,
    DeployError,
    check_metrics_port,
    check_transport,
)

APP = "concord"
UID = 1000  # the image's user (compose/Dockerfile, CONCORD_UID)
MOSQUITTO_UID = 1883  # the eclipse-mosquitto image's user
STORAGE_MODES = ("rwo", "rwx")
DEFAULT_STORAGE = "rwo"
# --storage-size without a value: a volume per process (rwo), or one shared by all (rwx)
DEFAULT_SIZE = {"rwo": "1Gi", "rwx": "10Gi"}
# a Kubernetes quantity: 500m, 2, 1.5, 512Mi, 2Gi, 10G
_QUANTITY = re.compile(r"\d+(?:\.\d+)?(?:m|k|Ki|M|Mi|G|Gi|T|Ti)?")
# an RFC 1035 label: Services, pod hostnames and Job names must be one
_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# a DNS subdomain (a storage class, a namespace is a label)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class K8sError(DeployError):
    """Options or identities that cannot make the manifests; the message lists every problem."""


@dataclass(frozen=True)
class K8sOptions:
    peers: int
    name: str = APP  # the prefix of every object name (and the run's instance label)
    image: str = "concord:local"
    tls: bool = False
    auth: bool = False
    cpu: str = "1"  # requested per peer
    memory: str = "2Gi"  # requested and the limit, per peer
    gpu: bool = False  # one nvidia.com/gpu per peer
    storage: str = DEFAULT_STORAGE  # rwo: a volume per process; rwx: one shared volume
    storage_size: str | None = None  # per volume; None: DEFAULT_SIZE[storage]
    storage_class: str | None = None
    metrics_port: int = METRICS_PORT  # each process's Prometheus endpoint; 0: none
    metrics_namespace: str | None = None  # a namespace whose pods may scrape, besides this one
    out: str = "k8s"
    config: str | None = None

    @property
    def size(self) -> str:
        return self.storage_size or DEFAULT_SIZE.get(self.storage, DEFAULT_SIZE[DEFAULT_STORAGE])


# ------------------------------------------------------------------------------------- names


def peer_job(name: str, i: int) -> str:
    """Peer ``i``'s Job, Secret, pod hostname (and, with rwo, its volume's suffix)."""
    return f"{name}-peer-{i}"


def peers_service(name: str) -> str:
    return f"{name}-peers"


def broker_name(name: str) -> str:
    return f"{name}-broker"


def peer_host(name: str, i: int) -> str:
    """The name other peers dial peer ``i`` at (its pod's hostname in the headless Service)."""
    return f"{peer_job(name, i)}.{peers_service(name)}"


def labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": APP,
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
    }


# ------------------------------------------------------------------------------------- checks


def _labels_too_long(options: K8sOptions) -> list[str]:
    n = options.name
    longest = max(
        [peer_job(n, options.peers - 1), f"{n}-orchestrator", peers_service(n), f"{n}-metrics"],
        key=len,
    )
    if len(longest) > 63:
        return [
            f"--name {n!r}: {longest!r} is {len(longest)} characters; Kubernetes allows 63 in a "
            f"Job, Service or host name: shorten --name to {len(n) - (len(longest) - 63)} or less"
        ]
    return []


def check(options: K8sOptions, cfg: RunConfig) -> None:
    """K8sError listing every unusable option (``cfg``: the run config the ConfigMap carries)."""
    problems = []
    if cfg.peers != options.peers:
        problems.append(f"the run config has peers = {cfg.peers} but --peers {options.peers}")
    if not cfg.name:
        problems.append("the run config needs a name: the run id every pod shares")
    if options.peers < 2:
        problems.append(f"--peers {options.peers}: a run needs at least 2 peers")
    if not _LABEL.fullmatch(options.name):
        problems.append(
            f"--name {options.name!r}: expected lowercase letters, digits and '-', starting "
            "with a letter and ending with a letter or digit (an RFC 1035 label)"
        )
    else:
        problems += _labels_too_long(options)
    for flag, value in (("--cpu", options.cpu), ("--memory", options.memory)):
        if not _QUANTITY.fullmatch(value):
            problems.append(f"{flag} {value!r}: expected a Kubernetes quantity (500m, 2, 2Gi)")
    if options.storage not in STORAGE_MODES:
        problems.append(
            f"--storage {options.storage!r}: expected one of {', '.join(STORAGE_MODES)}"
        )
    if options.storage_size is not None and not _QUANTITY.fullmatch(options.storage_size):
        problems.append(f"--storage-size {options.storage_size!r}: expected a size such as 10Gi")
    if options.storage_class is not None and not _SUBDOMAIN.fullmatch(options.storage_class):
        problems.append(f"--storage-class {options.storage_class!r}: not a storage class name")
    if options.metrics_namespace is not None and not _LABEL.fullmatch(options.metrics_namespace):
        problems.append(f"--metrics-namespace {options.metrics_namespace!r}: not a namespace name")
    if options.metrics_namespace is not None and not options.metrics_port:
        problems.append("--metrics-namespace needs a metrics endpoint (--metrics-port is 0)")
    problems += check_metrics_port(options.metrics_port)
    problems += check_transport(cfg)
    if not options.image or any(c.isspace() for c in options.image):
        problems.append(f"--image {options.image!r}: expected an image reference")
    if problems:
        raise K8sError("; ".join(problems))


def command_line(options: K8sOptions) -> str:
    args = ["concord", "k8s", "--peers", str(options.peers)]
    if options.config is not None:
        args += ["--config", options.config]
    if options.name != APP:
        args += ["--name", options.name]
    args += ["--image", options.image]
    args += ["--tls"] * options.tls + ["--auth"] * options.auth + ["--gpu"] * options.gpu
    args += ["--cpu", options.cpu, "--memory", options.memory, "--storage", options.storage]
    if options.storage_size is not None:
        args += ["--storage-size", options.storage_size]
    if options.storage_class is not None:
        args += ["--storage-class", options.storage_class]
    if options.metrics_port != METRICS_PORT:
        args += ["--metrics-port", str(options.metrics_port)]
    if options.metrics_namespace is not None:
        args += ["--metrics-namespace", options.metrics_namespace]
    return shlex.join([*args, "--out", options.out])


def secret_files(options: K8sOptions) -> dict[str, dict[str, str]]:
    """Secret name → {key in the Secret: file in the certs directory}: one Secret per peer with
    that peer's files only, the orchestrator's, the broker's. The public CA certificate is in a
    ConfigMap (`CA_FILES`); ca.key is in none."""
    n = options.name
    orchestrator: dict[str, str] = {}
    peers: list[dict[str, str]] = [{} for _ in range(options.peers)]
    if options.tls:
        orchestrator |= {f"orchestrator.{e}": f"orchestrator.{e}" for e in ("crt", "key")}
        for i, files in enumerate(peers):
            files |= {f"peer-{i}.crt": f"peer-{i}.crt", f"peer-{i}.key": f"peer-{i}.key"}
    if options.auth:
        orchestrator["orchestrator.password"] = "broker/orchestrator.password"
        for i, files in enumerate(peers):
            files[f"peer-{i}.password"] = f"broker/peer-{i}.password"
    out = {f"{n}-orchestrator": orchestrator}
    out |= {peer_job(n, i): files for i, files in enumerate(peers)}
    if options.auth:
        out[broker_name(n)] = {
            "broker.crt": "broker.crt",
            "broker.key": "broker.key",
            "passwd": "broker/passwd",
            "acl": "broker/acl",
        }
    return out


CA_FILES = {"ca.crt": "ca.crt"}  # the ConfigMap <name>-ca: public, mounted beside each Secret
