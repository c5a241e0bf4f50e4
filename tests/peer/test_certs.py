"""Run CA and peer certificates: SANs, usages, permissions, chain checks."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from peer.certs import CertError, init_ca, issue_peer, verify_chain
from peer.tls import expand, load_credentials


def test_ca_and_peer_certificates(tmp_path: Path) -> None:
    ca = init_ca(tmp_path, run_id="r1")
    files = issue_peer(tmp_path, 3, hosts=["127.0.0.1", "node3.lab", "::1"])
    for key in (ca.key, files.key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert san.get_values_for_type(x509.DNSName) == ["node3.lab"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    verify_chain(ca.cert, files.cert)
    load_credentials(
        str(ca.cert), str(tmp_path / "peer-{id}.crt"), str(tmp_path / "peer-{id}.key"), 3
    )


def test_errors_are_specific(tmp_path: Path) -> None:
    with pytest.raises(CertError, match="no run CA"):
        issue_peer(tmp_path, 0)
    init_ca(tmp_path, run_id="r")
    with pytest.raises(CertError, match="--force"):
        init_ca(tmp_path, run_id="r")
    other = tmp_path / "other"
    init_ca(other, run_id="x")
    stranger = issue_peer(other, 1)
    with pytest.raises(CertError, match="not issued by the run CA"):
        verify_chain(tmp_path / "ca.crt", stranger.cert)
    with pytest.raises(CertError, match="cannot read the peer key"):
        load_credentials(
            str(tmp_path / "ca.crt"), str(stranger.cert), str(tmp_path / "nope-{id}.key"), 1
        )
    assert expand("certs/peer-{id}.key", 7) == Path("certs/peer-7.key")
