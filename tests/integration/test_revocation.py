"""Certificate revocation: `concord certs revoke` lists a certificate in revoked.txt beside the
run CA; a running peer then refuses its Hello (mTLS), every receiver refuses control messages
signed with it, and a process holding it refuses to start; a re-issued certificate works."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from concord.core.config import load_config
from concord.core.models import FlatParams, build_model
from concord.errors import ConfigError
from concord.peer import serde
from concord.peer.certs import init_ca, issue_orchestrator, issue_peer
from concord.protos import data_plane_pb2_grpc as pb_grpc
from concord.protos import revocation
from concord.protos.control_plane import Heartbeat, Topics, encode
from concord.protos.revocation import REVOKED_FILE, RevocationError, read_revoked
from concord.protos.signing import SignatureError, Signer, Verifier, signing_for
from tests.integration.peers import Peers
from tests.integration.test_mtls import _tls_config

RUN = "revrun"


def _revoke(certs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "concord.lab.cli", "certs", "revoke", "--dir", str(certs), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_certs_revoke_lists_a_certificate_once_and_says_what_is_wrong(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    init_ca(certs, run_id=RUN)
    issue_peer(certs, 1)
    done = _revoke(certs, "--peer", "1", "--reason", "laptop stolen")
    assert done.returncode == 0, done.stderr
    assert "revoked peer-1" in done.stdout
    assert "issue a replacement with `concord certs issue`" in done.stdout
    listed = read_revoked(certs / REVOKED_FILE)
    assert len(listed) == 1
    assert "reason=laptop stolen" in (certs / REVOKED_FILE).read_text()
    assert _revoke(certs, "--peer", "1").returncode == 0  # again: nothing added
    assert read_revoked(certs / REVOKED_FILE) == listed
    for args, problem in [
        (["--peer", "7"], "cannot read the certificate"),
        (["--peer", "1", "--orchestrator"], "exactly one of"),
        ([], "exactly one of"),
    ]:
        bad = _revoke(certs, *args)
        assert bad.returncode == 2
        assert problem in bad.stderr
    nothing = _revoke(tmp_path / "elsewhere", "--peer", "1")
    assert "holds no ca.crt" in nothing.stderr
    (certs / REVOKED_FILE).write_text("not a fingerprint\n")
    with pytest.raises(RevocationError, match=r"revoked.txt:1: expected the SHA-256"):
        read_revoked(certs / REVOKED_FILE)


def test_signed_messages_of_a_revoked_certificate_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver already running honours the list as soon as it changes; a process whose own
    certificate is revoked refuses to start, saying so."""
    monkeypatch.setattr(revocation, "RECHECK", 0.0)
    certs = tmp_path / "certs"
    init_ca(certs, run_id=RUN)
    issue_orchestrator(certs)
    issue_peer(certs, 0)
    topic = Topics(RUN).topic("heartbeat", 0)
    signer = Signer.load("peer-0", certs / "peer-0.key", certs / "peer-0.crt", RUN)
    verifier = Verifier.load(certs / "ca.crt", RUN)
    body = encode(Heartbeat(peer=0, step=1, ts=1.0))
    assert verifier.open(topic, signer.seal(topic, body)) == body
    assert _revoke(certs, "--peer", "0").returncode == 0
    time.sleep(0.02)  # a new mtime
    with pytest.raises(SignatureError) as err:
        verifier.open(topic, signer.seal(topic, body))
    assert err.value.reason == "revoked"
    cfg = load_config(
        None,
        [
            f"network.tls.ca={certs}/ca.crt",
            f"network.tls.cert={certs}/peer-{{id}}.crt",
            f"network.tls.key={certs}/peer-{{id}}.key",
        ],
        environ={},
    )
    with pytest.raises(ConfigError, match="is revoked"):
        signing_for(cfg, "peer-0", RUN)
    signing_for(cfg, "orchestrator", RUN)  # the others are unaffected
    issue_peer(certs, 0)  # re-issued: a new certificate, not on the list
    fresh = signing_for(cfg, "peer-0", RUN)
    assert fresh.signer is not None
    assert verifier.open(topic, fresh.signer.seal(topic, body)) == body


def _hello(address: str, certs: Path, fingerprint: str) -> grpc.RpcError | bool:
    creds = grpc.ssl_channel_credentials(
        (certs / "ca.crt").read_bytes(),
        (certs / "peer-1.key").read_bytes(),
        (certs / "peer-1.crt").read_bytes(),
    )
    with grpc.secure_channel(address, creds) as channel:
        stub = pb_grpc.GossipStub(channel)
        try:
            reply = stub.Hello(serde.hello_request("itest", 1, fingerprint, "none"), timeout=5)
        except grpc.RpcError as exc:
            return exc
        return bool(reply.accepted)


def test_a_running_peer_refuses_a_certificate_revoked_meanwhile(tmp_path: Path) -> None:
    """Peer 0 runs under mTLS; peer 1's certificate says Hello, is revoked (the running peer
    re-reads the list), is refused (PERMISSION_DENIED, counted as "identity"); a re-issued
    certificate of peer 1 gets in again."""
    config = _tls_config(tmp_path, epochs=500, startup=1.0)
    cfg = load_config(config, environ={})
    fingerprint = FlatParams(
        build_model("mlp", 1, input_shape=(40,), num_classes=10, hidden=[8])
    ).fingerprint()
    address = cfg.network.addresses[0]  # type: ignore[index]
    certs = tmp_path / "certs"
    peers = Peers(config, tmp_path, [0])
    try:
        metrics = tmp_path / "peer-0" / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (metrics.is_file() and metrics.stat().st_size):
            time.sleep(0.1)
        assert _hello(address, certs, fingerprint) is True
        assert _revoke(certs, "--peer", "1").returncode == 0
        deadline = time.monotonic() + 10
        while True:  # within a second or so (the list is looked at once a second)
            result = _hello(address, certs, fingerprint)
            if result is not True or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert isinstance(result, grpc.RpcError)
        assert result.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "revoked" in (result.details() or "")
        issue_peer(certs, 1)
        assert _hello(address, certs, fingerprint) is True
        peers.procs[0].send_signal(signal.SIGTERM)
        assert peers.wait(timeout=60) == {0: 0}
        summary = json.loads((tmp_path / "peer-0" / "summary.json").read_text())
        assert summary["frames_rejected"].get("identity") == 1
    finally:
        peers.kill_all()
