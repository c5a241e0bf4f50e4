"""Run CA and peer certificates (SANs, usages, permissions, chain checks, clear errors) and a real
grpc.aio mTLS server built from them: a peer certificate from the run CA is accepted; no
certificate, another CA's certificate and plaintext are refused with UNAVAILABLE
(docs/deployment.md#mtls-certificates) and the server keeps serving."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from concord.peer.certs import (
    CertError,
    check_key_pair,
    init_ca,
    issue_peer,
    verify_chain,
)
from concord.peer.tls import (
    expand,
    load_channel_credentials,
    load_credentials,
    load_server_credentials,
)

TIMEOUT = 5.0  # seconds per await: a loopback handshake takes milliseconds
SERVING = health_pb2.HealthCheckResponse.SERVING


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


# ------------------------------------------------------------------------------------ the files


def test_ca_certificate(tmp_path: Path) -> None:
    ca = init_ca(tmp_path / "certs", run_id="r1", days=30)
    assert stat.S_IMODE(ca.key.stat().st_mode) == 0o600
    cert = _cert(ca.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "concord run r1 CA"
    assert cert.issuer == cert.subject
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert usage.crl_sign
    assert not usage.digital_signature
    # 30 days minus the 5-minute backdate; one minute of slack for a slow test machine
    lifetime = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=30) - dt.timedelta(minutes=1) < lifetime <= dt.timedelta(days=30)


def test_peer_certificate(tmp_path: Path) -> None:
    ca = init_ca(tmp_path, run_id="r1")
    files = issue_peer(tmp_path, 3, hosts=["127.0.0.1", "node3.lab", "::1", "127.0.0.1"])
    assert (files.key, files.cert, files.ca) == (
        tmp_path / "peer-3.key",
        tmp_path / "peer-3.crt",
        ca.cert,
    )
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    cert = _cert(files.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "peer-3"
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),  # once: duplicates are dropped
        ipaddress.ip_address("::1"),
    ]
    assert san.get_values_for_type(x509.DNSName) == ["node3.lab"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    verify_chain(ca.cert, files.cert)
    check_key_pair(files.cert, files.key)


def test_default_hosts_are_an_ip_san_and_a_dns_san(tmp_path: Path) -> None:
    init_ca(tmp_path, run_id="r")
    san = (
        _cert(issue_peer(tmp_path, 0).cert)
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_overwrite_is_refused_unless_asked(tmp_path: Path) -> None:
    first = init_ca(tmp_path, run_id="r")
    before = first.cert.read_bytes()
    with pytest.raises(CertError, match=r"ca\.key exists.*--force"):
        init_ca(tmp_path, run_id="r")
    assert first.cert.read_bytes() == before  # nothing was touched
    second = init_ca(tmp_path, run_id="r", overwrite=True)
    assert second.cert.read_bytes() != before
    assert stat.S_IMODE(second.key.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary files left behind


def test_issue_errors_are_specific(tmp_path: Path) -> None:
    with pytest.raises(CertError, match="concord certs init"):
        issue_peer(tmp_path / "none", 0)
    init_ca(tmp_path, run_id="r")
    with pytest.raises(CertError, match=r"'10\.0\.0\.1:5000' is neither"):
        issue_peer(tmp_path, 0, hosts=["10.0.0.1:5000"])
    with pytest.raises(CertError, match="hosts is empty"):
        issue_peer(tmp_path, 0, hosts=[])
    with pytest.raises(CertError, match="peer_id must be an integer ≥ 0; got -1"):
        issue_peer(tmp_path, -1)
    with pytest.raises(CertError, match="days must be an integer ≥ 1; got 0"):
        issue_peer(tmp_path, 0, days=0)
    with pytest.raises(CertError, match="run_id must be a non-empty string"):
        init_ca(tmp_path / "x", run_id=" ")


def test_chain_and_key_checks(tmp_path: Path) -> None:
    ca = init_ca(tmp_path, run_id="r")
    mine = issue_peer(tmp_path, 1)
    other_dir = tmp_path / "other"
    init_ca(other_dir, run_id="x")
    stranger = issue_peer(other_dir, 1)
    with pytest.raises(CertError, match=r"not issued by the run CA.*issuer is 'CN=concord run x"):
        verify_chain(ca.cert, stranger.cert)
    twin_dir = tmp_path / "twin"  # same CA name, different key: only the signature tells
    init_ca(twin_dir, run_id="r")
    with pytest.raises(CertError, match="signature does not verify"):
        verify_chain(ca.cert, issue_peer(twin_dir, 1).cert)
    with pytest.raises(CertError, match="is not a CA certificate"):
        verify_chain(mine.cert, mine.cert)
    with pytest.raises(CertError, match="expired on"):
        verify_chain(ca.cert, mine.cert, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=400))
    with pytest.raises(CertError, match="does not belong to the certificate"):
        check_key_pair(mine.cert, stranger.key)


def test_credential_loading_errors(tmp_path: Path) -> None:
    ca = init_ca(tmp_path, run_id="r")
    mine = issue_peer(tmp_path, 1)
    other_dir = tmp_path / "other"
    init_ca(other_dir, run_id="x")
    stranger = issue_peer(other_dir, 1)
    (tmp_path / "garbage.crt").write_text("not a certificate\n")
    template = str(tmp_path / "peer-{id}")
    server, channel = load_credentials(str(ca.cert), template + ".crt", template + ".key", 1)
    assert isinstance(server, grpc.ServerCredentials)
    assert isinstance(channel, grpc.ChannelCredentials)
    with pytest.raises(CertError, match=r"peer certificate .*peer-2\.crt does not exist"):
        load_credentials(str(ca.cert), template + ".crt", template + ".key", 2)
    with pytest.raises(CertError, match="cannot read the peer key"):
        load_server_credentials(ca.cert, mine.cert, tmp_path)  # a directory: unreadable
    with pytest.raises(CertError, match=r"garbage\.crt is not a PEM certificate"):
        load_channel_credentials(ca.cert, tmp_path / "garbage.crt", mine.key)
    with pytest.raises(CertError, match="not issued by the run CA"):
        load_server_credentials(ca.cert, stranger.cert, stranger.key)
    with pytest.raises(CertError, match="does not belong"):
        load_channel_credentials(ca.cert, mine.cert, stranger.key)
    assert expand("certs/peer-{id}.key", 7) == Path("certs/peer-7.key")
    assert expand(Path("certs/ca.crt"), 7) == Path("certs/ca.crt")
    with pytest.raises(CertError, match="peer_id must be an integer ≥ 0"):
        expand("x-{id}", -1)


# ------------------------------------------------------------------------- a real grpc.aio server


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # from another CA, same CN as a legitimate peer
    stranger_key: Path
    ip_less_cert: Path  # run CA, but only a DNS SAN (localhost)
    ip_less_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    run = tmp_path_factory.mktemp("run")
    other = tmp_path_factory.mktemp("other")
    ca = init_ca(run, run_id="test")
    init_ca(other, run_id="stranger")
    server, client = issue_peer(run, 0), issue_peer(run, 1)
    ip_less = issue_peer(run, 2, hosts=["localhost"])
    stranger = issue_peer(other, 1)
    return Pki(
        ca.cert,
        server.cert,
        server.key,
        client.cert,
        client.key,
        stranger.cert,
        stranger.key,
        ip_less.cert,
        ip_less.key,
    )


async def _serve(cert: Path, key: Path, ca: Path, body: Callable[[int], Awaitable[None]]) -> None:
    """A grpc.aio server on 127.0.0.1:0 with mTLS and the standard grpc.health.v1 service."""
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    await asyncio.wait_for(servicer.set("", SERVING), TIMEOUT)
    port = server.add_secure_port("127.0.0.1:0", load_server_credentials(ca, cert, key))
    assert port > 0
    await asyncio.wait_for(server.start(), TIMEOUT)
    try:
        await body(port)
    finally:
        await asyncio.wait_for(server.stop(None), TIMEOUT)


async def _check(
    port: int,
    credentials: grpc.ChannelCredentials | None,
    options: list[tuple[str, str]] | None = None,
) -> int | grpc.StatusCode:
    """The health status the server reports, or the status code the call failed with."""
    target = f"127.0.0.1:{port}"
    if credentials is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        channel = grpc.aio.secure_channel(target, credentials, options=options)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        call = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
        reply = await asyncio.wait_for(call, TIMEOUT + 1)
        return int(reply.status)
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await asyncio.wait_for(channel.close(), TIMEOUT)


def _client_credentials(pki: Pki, who: str) -> grpc.ChannelCredentials | None:
    ca = pki.ca.read_bytes()
    if who == "no-cert":  # trusts the run CA but presents nothing
        return grpc.ssl_channel_credentials(root_certificates=ca)
    if who == "other-ca":  # trusts the run CA, presents a certificate from another CA
        return grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=pki.stranger_key.read_bytes(),
            certificate_chain=pki.stranger_cert.read_bytes(),
        )
    return None  # plaintext


def test_mtls_server_accepts_a_peer_of_the_run(pki: Pki) -> None:
    async def body(port: int) -> None:
        creds = load_channel_credentials(pki.ca, pki.client_cert, pki.client_key)
        assert await _check(port, creds) == SERVING

    asyncio.run(_serve(pki.server_cert, pki.server_key, pki.ca, body))


@pytest.mark.parametrize("who", ["no-cert", "other-ca", "plaintext"])
def test_mtls_server_refuses_and_keeps_serving(pki: Pki, who: str) -> None:
    async def body(port: int) -> None:
        assert await _check(port, _client_credentials(pki, who)) == grpc.StatusCode.UNAVAILABLE
        creds = load_channel_credentials(pki.ca, pki.client_cert, pki.client_key)
        assert await _check(port, creds) == SERVING  # still serving after the refusal

    asyncio.run(_serve(pki.server_cert, pki.server_key, pki.ca, body))


def test_dialling_an_ip_needs_an_ip_san(pki: Pki) -> None:
    """A server certificate naming only "localhost" is refused by a client dialling 127.0.0.1,
    and accepted when the client checks the name "localhost" instead."""

    async def body(port: int) -> None:
        creds = load_channel_credentials(pki.ca, pki.client_cert, pki.client_key)
        assert await _check(port, creds) == grpc.StatusCode.UNAVAILABLE
        override = [("grpc.ssl_target_name_override", "localhost")]
        assert await _check(port, creds, override) == SERVING

    asyncio.run(_serve(pki.ip_less_cert, pki.ip_less_key, pki.ca, body))


# --------------------------------------------------------------------- broker identities


def test_broker_files(tmp_path: Path) -> None:
    from concord.peer.broker_creds import (
        acl_rules,
        issue_broker,
        mosquitto_verify,
        read_acl,
        read_passwd,
    )

    init_ca(tmp_path, run_id="r1")
    files = issue_broker(tmp_path, run_id="r1", peers=2, hosts=["10.0.0.9", "broker.lab"])
    verify_chain(files.ca, files.cert)
    check_key_pair(files.cert, files.key)
    cert = _cert(files.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "broker"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.9")]
    assert san.get_values_for_type(x509.DNSName) == ["broker.lab"]
    assert set(files.passwords) == {"orchestrator", "peer-0", "peer-1", "monitor", "observer"}
    hashes = read_passwd(files.passwd)
    assert set(hashes) == set(files.passwords)
    secrets_seen = set()
    for who, path in files.passwords.items():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        password = path.read_text().strip()
        assert len(password) >= 24
        secrets_seen.add(password)
        assert mosquitto_verify(password, hashes[who])
        assert not mosquitto_verify(password + "x", hashes[who])
        assert password not in files.acl.read_text() + files.conf.read_text()
    assert len(secrets_seen) == 5  # one random password per identity
    assert stat.S_IMODE(files.passwd.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    # the ACL: peers write only their own per-peer topics, the orchestrator the run-wide ones
    rules = read_acl(files.acl)
    assert rules == acl_rules("r1", 2)
    base = "concord/v1/r1"
    assert sorted(rules["peer-1"]["write"]) == sorted(
        f"{base}/{k}/1" for k in ("status", "heartbeat", "stats", "metrics")
    )
    assert f"{base}/decision" in rules["orchestrator"]["write"]
    assert f"{base}/status/+" in rules["orchestrator"]["write"]  # clears retained status
    assert not any("/stats" in t for t in rules["orchestrator"]["write"])
    assert rules["monitor"]["write"] == []
    assert rules["observer"]["write"] == []  # read-only too (`concord status`)
    assert all(r["read"] == [f"{base}/#"] for r in rules.values())
    with pytest.raises(CertError, match="exists"):
        issue_broker(tmp_path, run_id="r1", peers=2)
    again = issue_broker(tmp_path, run_id="r1", peers=3, overwrite=True)
    assert "peer-2" in read_passwd(again.passwd)


def test_broker_files_errors(tmp_path: Path) -> None:
    from concord.peer.broker_creds import issue_broker

    with pytest.raises(CertError, match="certs init"):
        issue_broker(tmp_path, run_id="r1", peers=1)
    init_ca(tmp_path, run_id="r1")
    with pytest.raises(CertError, match="peers"):
        issue_broker(tmp_path, run_id="r1", peers=0)
    with pytest.raises(ValueError, match="run id"):
        issue_broker(tmp_path, run_id="a/b", peers=1)
    with pytest.raises(CertError, match="neither an IP"):
        issue_broker(tmp_path, run_id="r1", peers=1, hosts=["mqtt://x:1"])


def test_mosquitto_reads_our_password_hashes_and_we_read_its(tmp_path: Path) -> None:
    """The $7$ format both ways: a mosquitto_passwd hash verifies here, and Mosquitto itself
    accepts a password file we wrote (the broker tests connect through it)."""
    import shutil
    import subprocess

    from concord.peer.broker_creds import mosquitto_hash, mosquitto_verify, read_passwd

    tool = shutil.which("mosquitto_passwd")
    if tool is None:
        pytest.skip("mosquitto_passwd missing")
    path = tmp_path / "passwd"
    path.write_text(f"ours:{mosquitto_hash('pw-ours')}\n")
    subprocess.run([tool, "-b", str(path), "theirs", "pw-theirs"], check=True, timeout=30)
    users = read_passwd(path)
    assert mosquitto_verify("pw-theirs", users["theirs"])
    assert mosquitto_verify("pw-ours", users["ours"])  # mosquitto_passwd kept our line as is
    assert not mosquitto_verify("pw-ours", "$6$rounds=5000$salt$hash")


def test_certs_broker_command(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from concord.lab.cli import main

    d = str(tmp_path / "certs")
    runner = CliRunner()
    assert runner.invoke(main, ["certs", "init", "--dir", d, "--run-id", "r1"]).exit_code == 0
    args = ["certs", "broker", "--dir", d, "--run-id", "r1", "--peers", "2"]
    r = runner.invoke(main, [*args, "--host", "127.0.0.1"])
    assert r.exit_code == 0, r.output
    assert "broker_password_file" in r.output
    assert (tmp_path / "certs" / "broker" / "peer-1.password").is_file()
    r = runner.invoke(main, args)
    assert r.exit_code != 0
    assert "--force" in r.output
    assert runner.invoke(main, [*args, "--force"]).exit_code == 0
