"""The objects of `concord k8s`: ConfigMaps, Secrets, the broker, the orchestrator and peer Jobs,
the volumes, the NetworkPolicies and the metrics Service, as mappings for `yamltext.dump_all`.

Every pod meets the Pod Security "restricted" level (a non-root uid, no privilege escalation,
no capabilities, the runtime's default seccomp profile). docs/deployment.md#kubernetes.
"""

from __future__ import annotations

import base64
from pathlib import Path

from concord.lab.deploy_common import (
    MQTT_PORT,
    MQTTS_PORT,
    PEER_PORT,
    metrics_args,
    mosquitto_conf,
    peer_command,
    prometheus_annotations,
)
from concord.lab.k8s_options import (
    CA_FILES,
    MOSQUITTO_UID,
    UID,
    K8sError,
    K8sOptions,
    broker_name,
    labels,
    peer_job,
    peers_service,
    secret_files,
)
from concord.lab.yamltext import Node

Doc = dict[str, Node]
METRICS_LABEL = "concord-metrics"  # on the pods the metrics Service selects


def _meta(name: str, options: K8sOptions, component: str) -> Doc:
    return {"name": name, "labels": labels(options.name, component)}


def _secured(options: K8sOptions) -> bool:
    return options.tls or options.auth


def env(options: K8sOptions) -> Doc:
    """The ``CONCORD_*`` settings of every Concord container (the ConfigMap <name>-env)."""
    broker = broker_name(options.name)
    out: Doc = {
        "CONCORD_ORCHESTRATOR__BROKER": (
            f"mqtts://{broker}:{MQTTS_PORT}" if options.auth else f"mqtt://{broker}:{MQTT_PORT}"
        )
    }
    if not options.tls:
        # plaintext gRPC on the pod network (NetworkPolicies admit only the run's pods): said
        # out loud (network.insecure), refused otherwise; --tls turns protection on instead
        out["CONCORD_NETWORK__INSECURE"] = "true"
    if options.tls:
        out |= {
            "CONCORD_NETWORK__TLS__CA": "/certs/ca.crt",
            "CONCORD_NETWORK__TLS__CERT": "/certs/peer-{id}.crt",
            "CONCORD_NETWORK__TLS__KEY": "/certs/peer-{id}.key",
        }
    if options.auth:
        out |= {
            "CONCORD_ORCHESTRATOR__BROKER_USERNAME": "{identity}",
            "CONCORD_ORCHESTRATOR__BROKER_PASSWORD_FILE": "/certs/{identity}.password",
            "CONCORD_ORCHESTRATOR__BROKER_CA": "/certs/ca.crt",
        }
    return out


def config_maps(options: K8sOptions, run_toml: str, certs: Path | None) -> list[Doc]:
    n = options.name
    where = f"`concord k8s` (reached through the Service {broker_name(n)})"
    out: list[Doc] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(f"{n}-run", options, "config"),
            "data": {
                "run.toml": run_toml,
                "mosquitto.conf": mosquitto_conf(auth=options.auth, where=where),
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(f"{n}-env", options, "config"),
            "data": env(options),
        },
    ]
    if _secured(options):
        assert certs is not None
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(f"{n}-ca", options, "config"),
                "data": {k: (certs / f).read_text(encoding="utf-8") for k, f in CA_FILES.items()},
            }
        )
    return out


def present_files(certs: Path) -> set[str]:
    if not certs.is_dir():
        return set()
    return {p.relative_to(certs).as_posix() for p in certs.rglob("*") if p.is_file()}


def secrets(options: K8sOptions, certs: Path) -> list[Doc]:
    """One Secret per identity, read from ``certs`` (K8sError naming every missing file)."""
    wanted = secret_files(options)
    needed = {f for files in wanted.values() for f in files.values()} | set(CA_FILES.values())
    missing = sorted(needed - present_files(certs))
    if missing:
        raise K8sError(
            f"{certs} lacks {', '.join(missing[:6])}{', …' if len(missing) > 6 else ''}: issue "
            "them with `concord certs` (see certs.sh) or use a fresh --certs directory"
        )
    out: list[Doc] = []
    for name, files in wanted.items():
        data: Doc = {
            key: base64.b64encode((certs / f).read_bytes()).decode() for key, f in files.items()
        }
        component = name.removeprefix(f"{options.name}-").split("-")[0]
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": _meta(name, options, component),
                "type": "Opaque",
                "data": data,
            }
        )
    return out


# ----------------------------------------------------------------------------------- the pods


def pod_security(uid: int) -> Doc:
    """The pod's part of Pod Security "restricted": a non-root uid and the default seccomp
    profile (fsGroup: the mounted keys, 0440, are readable by the group)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> Doc:
    """The container's part of Pod Security "restricted"."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _certs_volume(options: K8sOptions, secret: str) -> Doc:
    """The public CA (ConfigMap) and one identity's Secret, as one directory (0440, readable by
    the pod's fsGroup)."""
    return {
        "name": "certs",
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {"configMap": {"name": f"{options.name}-ca"}},
                {"secret": {"name": secret}},
            ],
        },
    }


def runs_claim(options: K8sOptions, who: str) -> str:
    """The PersistentVolumeClaim process ``who`` (orchestrator, peer-<i>) writes to."""
    return f"{options.name}-runs" + (f"-{who}" if options.storage == "rwo" else "")


def _concord_volumes(options: K8sOptions, who: str, secret: str) -> tuple[list[Node], list[Node]]:
    mounts: list[Node] = [
        {"name": "run", "mountPath": "/etc/concord/run.toml", "subPath": "run.toml",
         "readOnly": True},
        {"name": "runs", "mountPath": "/runs"},
    ]  # fmt: skip
    volumes: list[Node] = [
        {"name": "run", "configMap": {"name": f"{options.name}-run"}},
        {"name": "runs", "persistentVolumeClaim": {"claimName": runs_claim(options, who)}},
    ]
    if _secured(options):
        mounts.append({"name": "certs", "mountPath": "/certs", "readOnly": True})
        volumes.append(_certs_volume(options, secret))
    return mounts, volumes


def _template_meta(options: K8sOptions, component: str) -> Doc:
    """A Concord pod's labels, and the scrape annotations when it serves metrics."""
    meta: Doc = {"labels": dict(labels(options.name, component))}
    if options.metrics_port:
        meta["labels"] = {**labels(options.name, component), METRICS_LABEL: "true"}
        meta["annotations"] = dict(prometheus_annotations(options.metrics_port))
    return meta


def _ports(options: K8sOptions, *ports: Doc) -> list[Node]:
    """Container ports; ``metrics`` is the name a Prometheus Operator ServiceMonitor selects."""
    out: list[Node] = list(ports)
    if options.metrics_port:
        out.append({"name": "metrics", "containerPort": options.metrics_port})
    return out


def broker(options: K8sOptions) -> list[Doc]:
    name = broker_name(options.name)
    port = MQTTS_PORT if options.auth else MQTT_PORT
    mounts: list[Node] = [
        {"name": "config", "mountPath": "/mosquitto/config/mosquitto.conf",
         "subPath": "mosquitto.conf", "readOnly": True},
    ]  # fmt: skip
    volumes: list[Node] = [{"name": "config", "configMap": {"name": f"{options.name}-run"}}]
    if options.auth:
        mounts.append({"name": "certs", "mountPath": "/mosquitto/certs", "readOnly": True})
        volumes.append(_certs_volume(options, name))
    probe: Doc = {"tcpSocket": {"port": "mqtt"}, "periodSeconds": 2, "failureThreshold": 15}
    pod: Doc = {
        "securityContext": pod_security(MOSQUITTO_UID),
        "containers": [
            {
                "name": "mosquitto",
                "image": "eclipse-mosquitto:2",
                "ports": [{"name": "mqtt", "containerPort": port}],
                "readinessProbe": probe,
                "livenessProbe": probe,
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                "securityContext": container_security(),
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    selector = labels(options.name, "broker")
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(name, options, "broker"),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": dict(selector)},
                "template": {"metadata": {"labels": dict(selector)}, "spec": pod},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(name, options, "broker"),
            "spec": {
                "selector": dict(selector),
                "ports": [{"name": "mqtt", "port": port, "targetPort": "mqtt"}],
            },
        },
    ]


def orchestrator(options: K8sOptions) -> list[Doc]:
    name = f"{options.name}-orchestrator"
    mounts, volumes = _concord_volumes(options, "orchestrator", name)
    container: Doc = {
        "name": "orchestrator",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "orchestrator",
            "--config",
            "/etc/concord/run.toml",
            "--out",
            "/runs/orchestrator",
            *metrics_args(options.metrics_port),
        ],
        "envFrom": [{"configMapRef": {"name": f"{options.name}-env"}}],
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": container_security(),
        "volumeMounts": mounts,
    }
    ports = _ports(options)
    if ports:
        container["ports"] = ports
    return [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": _meta(name, options, "orchestrator"),
            "spec": {
                "backoffLimit": 0,  # a restart would find its run directory used
                "template": {
                    "metadata": _template_meta(options, "orchestrator"),
                    "spec": {
                        "restartPolicy": "Never",
                        "securityContext": pod_security(UID),
                        "containers": [container],
                        "volumes": volumes,
                    },
                },
            },
        }
    ]


def peer(options: K8sOptions, i: int) -> Doc:
    """Peer ``i``'s Job: its own pod spec, so that it mounts its own Secret and volume only."""
    name = peer_job(options.name, i)
    mounts, volumes = _concord_volumes(options, f"peer-{i}", name)
    limits: Doc = {"memory": options.memory}
    if options.gpu:
        limits["nvidia.com/gpu"] = 1
    container: Doc = {
        "name": "peer",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": peer_command(
            i,
            advertise=f"{name}.{peers_service(options.name)}:{PEER_PORT}",
            out=f"/runs/peer-{i}",
            metrics_port=options.metrics_port,
        ),
        **({"env": [{"name": "CONCORD_DEVICE", "value": "cuda"}]} if options.gpu else {}),
        "envFrom": [{"configMapRef": {"name": f"{options.name}-env"}}],
        "ports": _ports(options, {"name": "grpc", "containerPort": PEER_PORT}),
        "readinessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": options.cpu, "memory": options.memory}, "limits": limits},
        "securityContext": container_security(),
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(name, options, "peer"),
        "spec": {
            # one retry (the same command rejoins the run from its run directory); a failed
            # peer does not stop the others
            "backoffLimit": 1,
            # an eviction or a node drain is not the peer's failure: re-created without using
            # its retry (and, with a pod failure policy, only once the old pod is gone)
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    }
                ]
            },
            "template": {
                "metadata": _template_meta(options, "peer"),
                "spec": {
                    "hostname": name,
                    "subdomain": peers_service(options.name),
                    "restartPolicy": "Never",
                    "securityContext": pod_security(UID),
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def peers(options: K8sOptions) -> list[Doc]:
    service: Doc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(peers_service(options.name), options, "peer"),
        "spec": {
            "clusterIP": "None",  # headless: one DNS name per pod
            "publishNotReadyAddresses": True,  # a peer resolves its own name before serving
            "selector": labels(options.name, "peer"),
            "ports": [{"name": "grpc", "port": PEER_PORT, "targetPort": "grpc"}],
        },
    }
    return [service, *(peer(options, i) for i in range(options.peers))]


def metrics_service(options: K8sOptions) -> list[Doc]:
    """A headless Service over the orchestrator and every peer, port ``metrics``: what a
    ServiceMonitor (or any Prometheus endpoints discovery) selects."""
    if not options.metrics_port:
        return []
    selector = {"app.kubernetes.io/instance": options.name, METRICS_LABEL: "true"}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(f"{options.name}-metrics", options, "metrics"),
            "spec": {
                "clusterIP": "None",
                "selector": selector,
                "ports": [
                    {"name": "metrics", "port": options.metrics_port, "targetPort": "metrics"}
                ],
            },
        }
    ]


def storage(options: K8sOptions) -> list[Doc]:
    """rwx: one ReadWriteMany claim every pod writes its own directory of; rwo: a
    ReadWriteOnce claim per process (any storage class can serve it)."""
    who = ["orchestrator", *(f"peer-{i}" for i in range(options.peers))]
    shared = options.storage != "rwo"
    names = [runs_claim(options, "")] if shared else [runs_claim(options, w) for w in who]
    mode = "ReadWriteOnce" if options.storage == "rwo" else "ReadWriteMany"
    out: list[Doc] = []
    for name in names:
        spec: Doc = {"accessModes": [mode], "resources": {"requests": {"storage": options.size}}}
        if options.storage_class is not None:
            spec["storageClassName"] = options.storage_class
        out.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": _meta(name, options, "storage"),
                "spec": spec,
            }
        )
    return out


# ------------------------------------------------------------------------------ network policy


def _pods(options: K8sOptions, *components: str) -> Doc:
    """A podSelector for this run's pods of ``components``."""
    return {
        "matchLabels": {"app.kubernetes.io/name": "concord", "app.kubernetes.io/instance":
                        options.name},
        "matchExpressions": [
            {"key": "app.kubernetes.io/component", "operator": "In", "values": list(components)}
        ],
    }  # fmt: skip


def _metrics_rule(options: K8sOptions) -> list[Node]:
    """Ingress to the metrics port: from any pod of the namespace (and of --metrics-namespace)."""
    if not options.metrics_port:
        return []
    sources: list[Node] = [{"podSelector": {}}]
    if options.metrics_namespace is not None:
        ns = {"kubernetes.io/metadata.name": options.metrics_namespace}
        sources.append({"namespaceSelector": {"matchLabels": ns}})
    return [{"from": sources, "ports": [{"protocol": "TCP", "port": options.metrics_port}]}]


def network_policies(options: K8sOptions) -> list[Doc]:
    """Ingress only (egress is open: DNS, the image registry): peers take gRPC from this run's
    peers, the broker MQTT from this run's orchestrator and peers, the orchestrator nothing;
    each its metrics port from the namespace."""
    mqtt = MQTTS_PORT if options.auth else MQTT_PORT
    rules: dict[str, list[Node]] = {
        "peer": [
            {
                "from": [{"podSelector": _pods(options, "peer")}],
                "ports": [{"protocol": "TCP", "port": PEER_PORT}],
            },
            *_metrics_rule(options),
        ],
        "broker": [
            {
                "from": [{"podSelector": _pods(options, "orchestrator", "peer")}],
                "ports": [{"protocol": "TCP", "port": mqtt}],
            }
        ],
        "orchestrator": _metrics_rule(options),
    }
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _meta(f"{options.name}-{component}", options, component),
            "spec": {
                "podSelector": {"matchLabels": labels(options.name, component)},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }
        for component, ingress in rules.items()
    ]
