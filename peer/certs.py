"""mTLS material for a run: a run CA and one key + certificate per peer (``concord certs``).

Built on `cryptography` (EC P-256, SHA-256). A peer certificate is valid for both ends of a gRPC
connection (extendedKeyUsage serverAuth + clientAuth) and names its hosts as subjectAltNames:
IP addresses as IP SANs (gRPC checks them when dialling 127.0.0.1 or a LAN address), names as DNS
SANs. Private keys are written 0600 and never overwritten silently.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_KEY, CA_CERT = "ca.key", "ca.crt"


class CertError(ValueError):
    """Missing, unreadable or mismatching certificate material."""


@dataclass(frozen=True)
class CertFiles:
    key: Path
    cert: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _refuse_overwrite(paths: Sequence[Path], overwrite: bool) -> None:
    for p in paths:
        if p.exists() and not overwrite:
            raise CertError(
                f"{p} exists; pass --force to replace it (peers holding "
                "certificates from the old CA will be refused)"
            )


def init_ca(directory: Path, *, run_id: str, days: int = 365, overwrite: bool = False) -> CertFiles:
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(directory / CA_KEY, directory / CA_CERT)
    _refuse_overwrite([files.key, files.cert], overwrite)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"concord run {run_id} CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(files.key, key)
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def _load_ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key_path, cert_path = directory / CA_KEY, directory / CA_CERT
    if not key_path.is_file() or not cert_path.is_file():
        raise CertError(
            f"no run CA in {directory} (expected {CA_KEY} and {CA_CERT}); "
            "run `concord certs init` first"
        )
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{key_path} is not an EC private key")
    return key, x509.load_pem_x509_certificate(cert_path.read_bytes())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue_peer(
    directory: Path,
    peer_id: int,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    days: int = 365,
    overwrite: bool = True,
) -> CertFiles:
    if peer_id < 0:
        raise CertError(f"peer id must be ≥ 0; got {peer_id}")
    if not hosts:
        raise CertError("a peer certificate needs at least one host (IP or DNS name)")
    ca_key, ca_cert = _load_ca(directory)
    files = CertFiles(directory / f"peer-{peer_id}.key", directory / f"peer-{peer_id}.crt")
    _refuse_overwrite([files.key, files.cert], overwrite)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"peer-{peer_id}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(files.key, key)
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def verify_chain(ca_path: Path, cert_path: Path) -> None:
    """CertError unless ``cert_path`` is signed by the CA in ``ca_path`` (a clear message before
    gRPC's opaque handshake failure)."""
    try:
        ca = x509.load_pem_x509_certificate(ca_path.read_bytes())
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except OSError as exc:
        raise CertError(f"cannot read certificate: {exc}") from None
    except ValueError as exc:
        raise CertError(f"not a PEM certificate: {exc}") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception) as exc:  # InvalidSignature is not a ValueError
        raise CertError(f"{cert_path} is not issued by the run CA {ca_path} ({exc!r})") from None
