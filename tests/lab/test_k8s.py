"""`concord k8s`: manifests that the Kubernetes schemas of `K8S_VERSION` accept (checked offline
with kubernetes-validate), with one peer identity per index."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from concord.lab.cli import main
from concord.lab.k8s import K8S_VERSION, peer_host


def _render(tmp_path: Path, *flags: str, peers: int = 64) -> dict[str, list[dict[str, Any]]]:
    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, ["k8s", "--peers", str(peers), *flags, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return {
        p.name: list(yaml.safe_load_all(p.read_text(encoding="utf-8")))
        for p in sorted(out.glob("*.yaml"))
    }


def _find(docs: dict[str, list[dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    found = [d for ds in docs.values() for d in ds if (d["kind"], d["metadata"]["name"]) == (
        kind, name)]  # fmt: skip
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@pytest.mark.parametrize("flags", [(), ("--tls", "--auth", "--gpu")], ids=["plain", "secured"])
def test_every_manifest_validates_for_the_stated_version(
    tmp_path: Path, flags: tuple[str, ...]
) -> None:
    docs = _render(tmp_path, *flags)
    kinds = sorted(d["kind"] for ds in docs.values() for d in ds)
    expected = ["ConfigMap", "ConfigMap", "Deployment", "Job", "Job",
                "PersistentVolumeClaim", "Service", "Service"]  # fmt: skip
    assert kinds == sorted(expected + ["Secret"] * (3 if flags else 0))
    for documents in docs.values():
        for doc in documents:
            # strict: unknown fields are errors too
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_broken_manifest_is_refused(tmp_path: Path) -> None:
    job = _find(_render(tmp_path, peers=2), "Job", "concord-peer")
    job["spec"]["completionsMode"] = "Indexed"  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_64_peer_identities(tmp_path: Path) -> None:
    from cryptography import x509

    docs = _render(tmp_path, "--tls", "--auth")
    job = _find(docs, "Job", "concord-peer")
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 64, 64)
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    index = env["CONCORD_PEER_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert index == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    args = container["args"]
    assert args[args.index("--id") + 1] == "$(CONCORD_PEER_ID)"
    advertise = args[args.index("--advertise") + 1]
    assert advertise == "concord-peer-$(CONCORD_PEER_ID).concord-peers:50051"
    service = _find(docs, "Service", pod["subdomain"])
    assert service["spec"]["clusterIP"] == "None", "a headless Service names each pod"
    assert (
        service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    )
    # the subcommand's own options parse today's `concord peer`
    main.commands["peer"].make_context("peer", [a.replace("$(CONCORD_PEER_ID)", "7") for a in
                                                 args[1:]])  # fmt: skip

    peers = _find(docs, "Secret", "concord-peers")["data"]
    for i in range(64):
        assert {f"peer-{i}.crt", f"peer-{i}.key", f"peer-{i}.password"} <= set(peers)
    cert = x509.load_pem_x509_certificate(base64.b64decode(peers["peer-63.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [peer_host(63)]
    for name in ("concord-peers", "concord-orchestrator", "concord-broker"):
        data = _find(docs, "Secret", name)["data"]
        assert "ca.key" not in data, f"{name} carries the CA key"
    orchestrator = _find(docs, "Secret", "concord-orchestrator")["data"]
    assert not any(k.startswith("peer-") for k in orchestrator), "peer keys in the orchestrator's"
    broker = _find(docs, "Secret", "concord-broker")["data"]
    assert sorted(broker) == ["acl", "broker.crt", "broker.key", "ca.crt", "passwd"]


def test_gpu_and_resources(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--gpu", "--cpu", "500m", "--memory", "3Gi", peers=2)
    container = _find(docs, "Job", "concord-peer")["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "3Gi"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--peers", "1"], "1 is not in the range x>=2"),
        (["--peers", "4", "--memory", "2GB"], "--memory '2GB': expected a Kubernetes quantity"),
        (["--peers", "4", "--statefulset"], "No such option '--statefulset'"),
    ],
)
def test_bad_input_is_refused_with_a_reason(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "k8s"
    result = CliRunner().invoke(main, ["k8s", *args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()
