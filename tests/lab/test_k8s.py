"""`concord k8s`: manifests that the Kubernetes schemas of 1.28 … 1.34 accept (checked offline with
kubernetes-validate, strict), pods that meet Pod Security "restricted", one Secret per identity
mounted by its owner only, network policies that let each port be reached by whom it serves,
object names and selectors of one run that leave another run's alone, and private files 0600 and
git-ignored."""

from __future__ import annotations

import base64
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner
from kubernetes_validate.utils import all_versions

from concord.lab.cli import main
from concord.lab.k8s import K8S_VERSIONS, MIN_VERSION, K8sOptions, peer_host

Docs = dict[str, list[dict[str, Any]]]
ROOT = Path(__file__).resolve().parents[2]
# the versions the brief promises and the installed kubernetes-validate knows
VERSIONS = sorted(set(K8S_VERSIONS) & set(all_versions()), key=lambda v: int(v.split(".")[1]))


def _render(tmp_path: Path, *flags: str, peers: int = 64, out: str = "k8s") -> Docs:
    target = tmp_path / out
    args = ["k8s", "--peers", str(peers), *flags, "--out", str(target)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return {
        p.name: list(yaml.safe_load_all(p.read_text(encoding="utf-8")))
        for p in sorted(target.glob("*.yaml"))
    }


def _all(docs: Docs) -> list[dict[str, Any]]:
    return [d for ds in docs.values() for d in ds]


def _find(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    found = [d for d in _all(docs) if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _pods(docs: Docs) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod template metadata, pod spec) of every workload."""
    for doc in _all(docs):
        if doc["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            template = doc["spec"]["template"]
            yield doc["metadata"]["name"], template["metadata"], template["spec"]


def test_versions_cover_the_promised_range() -> None:
    assert MIN_VERSION == "1.28"
    assert VERSIONS[0] == "1.28.0", f"kubernetes-validate knows {all_versions()}"
    assert "1.34.0" in VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_validates_strictly(tmp_path: Path, version: str) -> None:
    plain = _render(tmp_path, peers=3, out="plain")
    secured = _render(
        tmp_path, "--tls", "--auth", "--gpu", "--storage", "rwx", "--storage-class", "nfs",
        "--metrics-namespace", "monitoring", "--name", "run-b", peers=3, out="secured",
    )  # fmt: skip
    quiet = _render(tmp_path, "--metrics-port", "0", peers=2, out="quiet")
    for docs in (plain, secured, quiet):
        for doc in _all(docs):
            # strict: unknown fields are errors too
            kubernetes_validate.validate(doc, version, strict=True)
    kinds = sorted(d["kind"] for d in _all(plain))
    expected = ["ConfigMap"] * 2 + ["Deployment"] + ["Job"] * 4 + ["NetworkPolicy"] * 3
    expected += ["PersistentVolumeClaim"] * 4 + ["Service"] * 3  # broker, peers, metrics
    assert kinds == sorted(expected)
    assert "metrics.yaml" not in quiet


def test_the_kubernetes_validate_command_passes(tmp_path: Path) -> None:
    """The command users run (`kubernetes-validate --strict`), on the files as written, for the
    oldest and newest version; it fails on a file with an unknown field."""
    import sys

    _render(tmp_path, "--tls", "--auth", peers=2)
    files = sorted(str(p) for p in (tmp_path / "k8s").glob("*.yaml"))
    command = [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "--quiet"]
    for version in (VERSIONS[0], VERSIONS[-1]):
        done = subprocess.run([*command, "-k", version, *files], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        (tmp_path / "k8s" / "peers.yaml").read_text(encoding="utf-8").replace(
            "backoffLimit: 1", "backoffLimitt: 1"), encoding="utf-8"
    )  # fmt: skip
    done = subprocess.run([*command, "-k", VERSIONS[0], str(broken)], capture_output=True)
    assert done.returncode != 0


def test_a_broken_manifest_is_refused(tmp_path: Path) -> None:
    job = _find(_render(tmp_path, peers=2), "Job", "concord-peer-1")
    job["spec"]["backoffLimitt"] = 1  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)


# --------------------------------------------------------------------- Pod Security "restricted"

# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (restricted, v1.28+)
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip


def _restricted_problems(name: str, spec: dict[str, Any]) -> list[str]:
    """What keeps a pod spec from the "restricted" level (and the baseline it includes)."""
    pod = spec.get("securityContext", {})
    problems = [f"{name}: {key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"{name}: volume {volume['name']} of type {kinds}")
    containers = spec.get("containers", []) + spec.get("initContainers", [])
    for c in containers:
        where = f"{name}/{c['name']}"
        ctx = c.get("securityContext", {})
        if ctx.get("privileged"):
            problems.append(f"{where}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{where}: capabilities.drop lacks ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {caps['add']}")
        non_root = ctx.get("runAsNonRoot", pod.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        uid = ctx.get("runAsUser", pod.get("runAsUser"))
        if not isinstance(uid, int) or uid == 0:
            problems.append(f"{where}: runAsUser {uid!r} (a non-zero uid)")
        seccomp = ctx.get("seccompProfile", pod.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile {seccomp!r}")
        if any("hostPort" in p for p in c.get("ports", [])):
            problems.append(f"{where}: hostPort")
    return problems


@pytest.mark.parametrize(
    "flags", [(), ("--tls", "--auth", "--gpu", "--storage", "rwx")], ids=["plain", "secured"]
)
def test_every_pod_meets_pod_security_restricted(tmp_path: Path, flags: tuple[str, ...]) -> None:
    docs = _render(tmp_path, *flags, peers=4)
    pods = list(_pods(docs))
    assert len(pods) == 1 + 1 + 4, [n for n, _, _ in pods]  # broker, orchestrator, peers
    for name, _, spec in pods:
        assert _restricted_problems(name, spec) == []


def test_the_restricted_check_catches_each_field(tmp_path: Path) -> None:
    """Without each field, the walk above fails (the check is not vacuous)."""
    docs = _render(tmp_path, peers=2)
    spec = _find(docs, "Job", "concord-peer-0")["spec"]["template"]["spec"]
    removals = {
        "allowPrivilegeEscalation": lambda s: s["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation"),
        "capabilities.drop": lambda s: s["containers"][0]["securityContext"].pop("capabilities"),
        "seccompProfile": lambda s: s["securityContext"].pop("seccompProfile"),
        "runAsNonRoot": lambda s: s["securityContext"].pop("runAsNonRoot"),
        "runAsUser": lambda s: s["securityContext"].update(runAsUser=0),
    }  # fmt: skip
    for field, remove in removals.items():
        broken = yaml.safe_load(yaml.safe_dump(spec))
        remove(broken)
        problems = _restricted_problems("peer-0", broken)
        assert any(field in p for p in problems), f"{field}: {problems}"


# --------------------------------------------------------------------------------- identities


def _mounted_secrets(spec: dict[str, Any]) -> set[str]:
    names = set()
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            names.add(volume["secret"]["secretName"])
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                names.add(source["secret"]["name"])
    return names


def test_each_peer_pod_mounts_only_its_own_secret(tmp_path: Path) -> None:
    from cryptography import x509

    docs = _render(tmp_path, "--tls", "--auth")
    secrets = {d["metadata"]["name"]: d["data"] for d in _all(docs) if d["kind"] == "Secret"}
    assert len(secrets) == 64 + 2, sorted(secrets)  # a peer each, the orchestrator, the broker
    mounted: dict[str, set[str]] = {name: _mounted_secrets(spec) for name, _, spec in _pods(docs)}
    for i in range(64):
        own = f"concord-peer-{i}"
        assert mounted[own] == {own}, f"{own} mounts {mounted[own]}"
        assert sorted(secrets[own]) == [f"peer-{i}.crt", f"peer-{i}.key", f"peer-{i}.password"]
    assert mounted["concord-orchestrator"] == {"concord-orchestrator"}
    assert mounted["concord-broker"] == {"concord-broker"}
    users = [s for names in mounted.values() for s in names]
    assert sorted(users) == sorted(secrets), "each Secret has exactly one pod that mounts it"
    for name, data in secrets.items():
        assert "ca.key" not in data, f"{name} carries the CA key"
    orchestrator = secrets["concord-orchestrator"]
    assert sorted(orchestrator) == ["orchestrator.crt", "orchestrator.key", "orchestrator.password"]
    assert sorted(secrets["concord-broker"]) == ["acl", "broker.crt", "broker.key", "passwd"]
    # the public CA certificate comes from a ConfigMap, beside each Secret in /certs
    ca = _find(docs, "ConfigMap", "concord-ca")["data"]
    assert sorted(ca) == ["ca.crt"]
    pem = base64.b64decode(secrets["concord-peer-63"]["peer-63.crt"])
    cert = x509.load_pem_x509_certificate(pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [peer_host("concord", 63)]


def test_a_peer_pod_is_its_dns_name_and_parses_with_the_cli(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--tls", peers=4)
    job = _find(docs, "Job", "concord-peer-3")
    pod = job["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--id") + 1] == "3"
    advertise = args[args.index("--advertise") + 1]
    assert (
        advertise
        == f"{pod['hostname']}.{pod['subdomain']}:50051"
        == (f"{peer_host('concord', 3)}:50051")
    )
    service = _find(docs, "Service", pod["subdomain"])
    assert service["spec"]["clusterIP"] == "None", "a headless Service names each pod"
    assert _matches(service["spec"]["selector"], job["spec"]["template"]["metadata"]["labels"])
    assert job["spec"]["backoffLimit"] == 1, "a failed peer is retried once and rejoins"
    main.commands["peer"].make_context("peer", list(args[1:]))  # today's `concord peer` takes it
    orchestrator = _find(docs, "Job", "concord-orchestrator")["spec"]["template"]["spec"]
    argv = orchestrator["containers"][0]["args"]
    main.commands["orchestrator"].make_context("orchestrator", list(argv[1:]))


def test_reused_certificates_for_other_names_are_refused(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    _render(tmp_path, "--tls", "--certs", str(certs), peers=2, out="a")
    args = ["k8s", "--peers", "2", "--tls", "--name", "other", "--certs", str(certs)]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "b")])
    assert result.exit_code == 2, result.output
    assert "peer-0.crt names concord-peer-0.concord-peers, not other-peer-0.other-peers" in (
        result.output
    )


# ---------------------------------------------------------------------------- private files


def test_secrets_are_0600_and_git_ignored(tmp_path: Path) -> None:
    _render(tmp_path, "--tls", "--auth", peers=2)
    out = tmp_path / "k8s"
    assert stat.S_IMODE((out / "secrets.yaml").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "certs" / "peer-1.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "peers.yaml").stat().st_mode) & 0o044, "the rest is not private"
    subprocess.run(["git", "init", "-q", str(out)], check=True)
    ignored = subprocess.run(
        ["git", "-C", str(out), "check-ignore", "secrets.yaml", "certs/peer-1.key",
         "certs/broker/peer-1.password", "peers.yaml"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ignored.stdout.split() == ["secrets.yaml", "certs/peer-1.key",
                                      "certs/broker/peer-1.password"]  # fmt: skip
    # regenerated with --force over a world-readable file: 0600 again
    (out / "secrets.yaml").chmod(0o644)
    args = ["k8s", "--peers", "2", "--tls", "--auth", "--force", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert stat.S_IMODE((out / "secrets.yaml").stat().st_mode) == 0o600


def test_no_secrets_and_no_stale_files_without_tls(tmp_path: Path) -> None:
    _render(tmp_path, "--tls", peers=2)
    out = tmp_path / "k8s"
    args = ["k8s", "--peers", "2", "--metrics-port", "0", "--force", "--out", str(out)]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert not (out / "secrets.yaml").exists(), "a stale secrets.yaml would still be applied"
    assert not (out / "metrics.yaml").exists()


# ------------------------------------------------------------------------ names and selectors


def _matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (a Service's map, or matchLabels + matchExpressions) against labels."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        value, op = labels.get(e["key"]), e["operator"]
        ok = {
            "In": value in e.get("values", []),
            "NotIn": value not in e.get("values", []),
            "Exists": e["key"] in labels,
            "DoesNotExist": e["key"] not in labels,
        }[op]
        if not ok:
            return False
    return True


def _selectors(docs: Docs) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in _all(docs):
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] in ("Service", "Deployment"):
            yield name, d["spec"]["selector"]
        elif d["kind"] == "NetworkPolicy":
            yield name, d["spec"]["podSelector"]
            for rule in d["spec"].get("ingress", []):
                for source in rule.get("from", []):
                    if source.get("podSelector") and "namespaceSelector" not in source:
                        yield f"{name} ingress", source["podSelector"]


def test_two_runs_share_a_namespace(tmp_path: Path) -> None:
    a = _render(tmp_path, "--name", "run-a", "--tls", "--auth", peers=3, out="a")
    b = _render(tmp_path, "--name", "run-b", "--tls", "--auth", peers=3, out="b")
    names_a = {(d["kind"], d["metadata"]["name"]) for d in _all(a)}
    names_b = {(d["kind"], d["metadata"]["name"]) for d in _all(b)}
    assert not names_a & names_b
    assert all(name.startswith("run-a-") for _, name in names_a), sorted(names_a)
    pods_b = [meta["labels"] for _, meta, _ in _pods(b)]
    for where, selector in _selectors(a):
        assert not any(_matches(selector, labels) for labels in pods_b), f"{where} selects run-b"
    own = {name: _mounted_secrets(spec) for name, _, spec in _pods(a)}
    assert own["run-a-peer-2"] == {"run-a-peer-2"}
    env = _find(a, "ConfigMap", "run-a-env")["data"]
    assert env["CONCORD_ORCHESTRATOR__BROKER"] == "mqtts://run-a-broker:8883"


def test_network_policies_admit_whom_each_port_serves(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--auth", "--metrics-namespace", "monitoring", peers=3)
    pods = {name: meta["labels"] for name, meta, _ in _pods(docs)}
    stranger = {"app": "something-else"}  # another pod of the namespace
    policies = [d for d in _all(docs) if d["kind"] == "NetworkPolicy"]

    def admitted(target: str, source: dict[str, str], port: int) -> bool:
        """Whether a pod labelled ``source`` of the namespace reaches ``target``'s ``port``."""
        relevant = [p for p in policies if _matches(p["spec"]["podSelector"], pods[target])]
        assert relevant, f"no NetworkPolicy selects {target}: it accepts everything"
        for policy in relevant:
            for rule in policy["spec"].get("ingress", []):
                ports = [p["port"] for p in rule.get("ports", [])]
                sources = rule.get("from", [])
                if ports and port not in ports:
                    continue
                if any("podSelector" in s and "namespaceSelector" not in s
                       and _matches(s["podSelector"], source) for s in sources):  # fmt: skip
                    return True
        return False

    peers = [n for n in pods if "-peer-" in n]
    for target in peers:
        assert all(admitted(target, pods[p], 50051) for p in peers)
        assert not admitted(target, pods["concord-broker"], 50051)
        assert not admitted(target, stranger, 50051)
        assert admitted(target, stranger, 9400), "metrics from anywhere in the namespace"
    broker = "concord-broker"
    assert all(admitted(broker, pods[p], 8883) for p in [*peers, "concord-orchestrator"])
    assert not admitted(broker, stranger, 8883)
    assert not admitted("concord-orchestrator", pods[peers[0]], 50051)
    assert admitted("concord-orchestrator", stranger, 9400)
    metrics_rules = [
        s for p in policies for r in p["spec"]["ingress"] for s in r["from"]
        if "namespaceSelector" in s
    ]  # fmt: skip
    assert metrics_rules, "--metrics-namespace admits the monitoring namespace"
    assert all(
        s["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
        for s in metrics_rules
    )


# -------------------------------------------------------------------------- storage, metrics


def test_storage_rwo_default_gives_each_process_its_own_claim(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--storage-class", "standard-rwo", peers=3)
    claims = {d["metadata"]["name"]: d["spec"] for d in _all(docs) if d["kind"] ==
              "PersistentVolumeClaim"}  # fmt: skip
    assert sorted(claims) == sorted(["concord-runs-orchestrator"] + [
        f"concord-runs-peer-{i}" for i in range(3)])  # fmt: skip
    for spec in claims.values():
        assert spec["accessModes"] == ["ReadWriteOnce"]
        assert spec["storageClassName"] == "standard-rwo"
        assert spec["resources"]["requests"]["storage"] == "1Gi"
    used = [
        v["persistentVolumeClaim"]["claimName"]
        for _, _, spec in _pods(docs)
        for v in spec["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert sorted(used) == sorted(claims), "each claim is used by one pod"


def test_storage_rwx_is_one_shared_claim(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--storage", "rwx", "--storage-size", "50Gi", peers=3)
    claims = [d for d in _all(docs) if d["kind"] == "PersistentVolumeClaim"]
    assert [c["metadata"]["name"] for c in claims] == ["concord-runs"]
    spec = claims[0]["spec"]
    assert spec["accessModes"] == ["ReadWriteMany"]
    assert "storageClassName" not in spec, "the cluster's default class"
    assert spec["resources"]["requests"]["storage"] == "50Gi"


def test_metrics_port_on_every_concord_pod(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--metrics-port", "9500", peers=3)
    service = _find(docs, "Service", "concord-metrics")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9500, "targetPort": "metrics"}]
    scraped = []
    for name, meta, spec in _pods(docs):
        container = spec["containers"][0]
        if not _matches(service["spec"]["selector"], meta["labels"]):
            assert name == "concord-broker"
            continue
        scraped.append(name)
        assert {"name": "metrics", "containerPort": 9500} in container["ports"]
        args = container["args"]
        assert args[args.index("--metrics-listen") + 1] == "0.0.0.0:9500"
        assert meta["annotations"] == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9500",
            "prometheus.io/path": "/metrics",
        }
    assert sorted(scraped) == sorted(["concord-orchestrator"] + [
        f"concord-peer-{i}" for i in range(3)])  # fmt: skip

    quiet = _render(tmp_path, "--metrics-port", "0", peers=2, out="quiet")
    for _, meta, spec in _pods(quiet):
        assert "annotations" not in meta
        assert "--metrics-listen" not in spec["containers"][0].get("args", [])
        assert all(p["name"] != "metrics" for p in spec["containers"][0].get("ports", []))


def test_gpu_and_resources(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--gpu", "--cpu", "500m", "--memory", "3Gi", peers=2)
    container = _find(docs, "Job", "concord-peer-1")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "3Gi"}
    assert container["env"] == [{"name": "CONCORD_DEVICE", "value": "cuda"}]


@pytest.mark.parametrize("flags", [(), ("--tls",), ("--auth",), ("--tls", "--auth")])
def test_every_process_starts_under_secure_by_default(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    """Each Concord pod, configured as the manifests configure it (the run.toml ConfigMap and
    the env ConfigMap), passes the check that refuses an open network
    (`concord.protos.exposure`): without --tls the run accepts plaintext on the pod network out
    loud (network.insecure), with --tls nothing is left to accept."""
    import tomllib

    from concord.core.config import build_config, env_overrides
    from concord.protos.exposure import check_exposure, exposure_of

    docs = _render(tmp_path, *flags, peers=2)
    run_toml = _find(docs, "ConfigMap", "concord-run")["data"]["run.toml"]
    env = _find(docs, "ConfigMap", "concord-env")["data"]
    cfg = build_config(tomllib.loads(run_toml), env_overrides(env))
    assert cfg.network.insecure is ("--tls" not in flags)
    for name, _, spec in _pods(docs):
        args = spec["containers"][0].get("args", [])
        if args[:1] not in (["peer"], ["orchestrator"]):
            continue  # the broker
        listen = args[args.index("--listen") + 1] if "--listen" in args else None
        exposure = exposure_of(cfg, listen=listen, broker=cfg.orchestrator.broker)
        check_exposure(exposure, insecure=cfg.network.insecure, role=name, warn=False)
        if "--tls" in flags:
            assert exposure.problems() == [], name


def test_config_map_speaks_of_kubernetes(tmp_path: Path) -> None:
    text = (tmp_path / "k8s" / "config.yaml").read_text(encoding="utf-8") if _render(
        tmp_path, "--auth", "--name", "lab", peers=2) else ""  # fmt: skip
    assert "compose" not in text.lower()
    run = yaml.safe_load_all(text).__next__()["data"]["run.toml"]
    assert 'name = "lab"' in run, "the run id is --name"
    assert "the ConfigMap lab-run" in run


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--peers", "1"], "1 is not in the range x>=2"),
        (["--peers", "4", "--memory", "2GB"], "--memory '2GB': expected a Kubernetes quantity"),
        (["--peers", "4", "--statefulset"], "No such option '--statefulset'"),
        (["--peers", "4", "--name", "Run_A"], "--name 'Run_A': expected lowercase letters"),
        (["--peers", "4", "--name", "r" * 60], "Kubernetes allows 63 in a Job, Service or host"),
        (["--peers", "4", "--storage", "10Gi"], "the size is --storage-size 10Gi"),
        (["--peers", "4", "--storage", "nfs"], "expected rwo (a volume per process) or rwx"),
        (["--peers", "4", "--storage-size", "lots"], "--storage-size 'lots': expected a size"),
        (["--peers", "4", "--metrics-port", "50051"], "--metrics-port 50051: taken by the gRPC"),
        (["--peers", "4", "--metrics-port", "0", "--metrics-namespace", "mon"],
         "--metrics-namespace needs a metrics endpoint"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_a_reason(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, ["k8s", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()


def test_torch_transport_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('name = "t"\npeers = 2\n[network]\ntransport = "torch"\n', encoding="utf-8")
    args = ["k8s", "--peers", "2", "--config", str(config), "--out", str(tmp_path / "k8s")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "network.transport = 'torch'" in result.output


def test_compose_and_k8s_share_the_peer_command_and_the_certs_script(tmp_path: Path) -> None:
    """Both generators take a peer's command and the `concord certs` commands from
    concord.lab.deploy_common: the same words, only the names the others dial differ."""
    from concord.lab.deploy_common import PEER_PORT, certs_commands, peer_command

    docs = _render(tmp_path, "--tls", "--auth", "--metrics-port", "9500", peers=3)
    job = _find(docs, "Job", "concord-peer-1")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    dialled = f"{peer_host('concord', 1)}:{PEER_PORT}"
    assert container["args"] == peer_command(
        1, advertise=dialled, out="/runs/peer-1", metrics_port=9500
    )
    assert container["args"][-2:] == ["--metrics-listen", "0.0.0.0:9500"]
    stack = tmp_path / "stack"
    args = ["compose", "--peers", "3", "--tls", "--auth", "--metrics-port", "9500",
            "--context", str(ROOT), "--out", str(stack)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    services = yaml.safe_load((stack / "compose.yaml").read_text(encoding="utf-8"))["services"]
    peer1 = services["peer-1"]["command"]
    assert peer1 == peer_command(
        1, advertise=f"peer-1:{PEER_PORT}", out="/runs/peer-1", metrics_port=9500
    )
    for script, host in (((tmp_path / "k8s" / "certs.sh"), "concord-broker"),
                         ((stack / "certs.sh"), "mosquitto")):  # fmt: skip
        text = script.read_text(encoding="utf-8")
        issued = [ln for ln in text.splitlines() if ln.startswith("concord certs ")]
        assert len(issued) == 1 + 3 + 1  # the CA, a certificate per peer, the broker's
        assert issued[-1].endswith(f"--peers 3 --host {host}"), issued[-1]
    bare = certs_commands(K8sOptions(peers=1), "r'x", certs="c", peer_host=str, broker_host="b")
    assert bare == ["concord certs init --dir c --run-id 'r'\"'\"'x'"]  # the run id quoted


def test_the_authenticated_broker_binds_client_ids_to_logins(tmp_path: Path) -> None:
    """No login may take over another identity's MQTT session: Mosquitto makes each
    authenticated client's id its username (compose's committed config says the same)."""
    from concord.protos.mqtt import MOSQUITTO_CLIENT_ID_BINDING

    docs = _render(tmp_path, "--auth", peers=2)
    conf = next(
        d["data"]["mosquitto.conf"]
        for d in _all(docs)
        if d["kind"] == "ConfigMap" and "mosquitto.conf" in d.get("data", {})
    )
    listener = conf[conf.index("listener 8883") :]
    assert MOSQUITTO_CLIENT_ID_BINDING in listener.splitlines()
    compose = (ROOT / "compose" / "mosquitto" / "mosquitto.auth.conf").read_text()
    assert MOSQUITTO_CLIENT_ID_BINDING in compose[compose.index("listener 8883") :].splitlines()
