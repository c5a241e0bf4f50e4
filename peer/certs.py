"""mTLS material for a run: a run CA and one key + certificate per peer (``concord certs``).

Built on `cryptography` (EC P-256, ECDSA-SHA256). Layout of a certificate directory::

    ca.key   (0600)  the run CA's private key — keep it off the peers' hosts if you can
    ca.crt           self-signed, basicConstraints CA:true (pathlen 0), keyCertSign + cRLSign,
                     CN "concord run <run_id> CA"
    peer-<id>.key (0600), peer-<id>.crt
                     CN "peer-<id>", signed by the run CA; extendedKeyUsage serverAuth +
                     clientAuth (a peer is both a gRPC server and a client); one subjectAltName
                     per host: an IP SAN when the host parses as an IP address (gRPC checks it
                     when dialling 127.0.0.1 or a LAN address), otherwise a DNS SAN
                     (docs/deployment.md#mtls-certificates)
    orchestrator.key (0600), orchestrator.crt
                     CN "orchestrator", signed by the run CA; extendedKeyUsage clientAuth, no
                     subjectAltName: the key the orchestrator signs its control messages with
                     (`concord.protos.signing`; ``concord certs init`` issues it with the CA)

Private keys are created 0600 through a temporary file and an atomic rename, so a key is never
readable by others, not even briefly, and a crash never leaves half a file. The CA is never
overwritten silently. Checks used before handing material to gRPC (`verify_chain`,
`check_key_pair`) live here so that users get a sentence, not an opaque handshake failure.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from concord.errors import CertError as CertError

CA_KEY, CA_CERT = "ca.key", "ca.crt"
ORCHESTRATOR_KEY, ORCHESTRATOR_CERT = "orchestrator.key", "orchestrator.crt"
DEFAULT_HOSTS = ("127.0.0.1", "localhost")
# RFC 1123 labels (letters, digits, inner hyphens; underscores too, as container names use them),
# optionally a leading "*." wildcard.
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_DNS_NAME = re.compile(rf"^(\*\.)?{_LABEL}(\.{_LABEL})*\.?$")
_BACKDATE = dt.timedelta(minutes=5)  # tolerate small clock skew between hosts


@dataclass(frozen=True)
class CAFiles:
    """The run CA: ``key`` (0600) and the self-signed ``cert``."""

    key: Path
    cert: Path


@dataclass(frozen=True)
class LeafFiles:
    """A key (0600) and certificate signed by the run CA, and that CA's certificate."""

    key: Path
    cert: Path
    ca: Path


@dataclass(frozen=True)
class PeerFiles:
    """One peer's ``key`` (0600) and ``cert``, and the ``ca`` certificate that signed it."""

    peer_id: int
    key: Path
    cert: Path
    ca: Path


# ---------------------------------------------------------------------------------- file helpers


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` with exactly ``mode``: temp file in the same directory (created
    0600 by mkstemp), chmod, fsync, rename over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_pair(
    key_path: Path, key: ec.EllipticCurvePrivateKey, cert_path: Path, cert: x509.Certificate
) -> None:
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        _atomic_write(key_path, pem_key, 0o600)
        _atomic_write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    except OSError as exc:
        raise CertError(f"cannot write to {key_path.parent}: {exc.strerror or exc}") from None


def _make_dir(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CertError(f"cannot create the certificate directory {directory}: {exc}") from None
    if not directory.is_dir():
        raise CertError(f"{directory} is not a directory")


def read_file(path: Path, what: str, hint: str = "") -> bytes:
    """The bytes of ``path``; CertError naming ``what`` when it is missing or unreadable (``hint``
    is appended to the "does not exist" message)."""
    if not path.exists():
        raise CertError(f"the {what} {path} does not exist{hint}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def load_certificate(path: Path, what: str = "certificate", hint: str = "") -> x509.Certificate:
    """The PEM certificate at ``path``, or a CertError naming ``what`` and the file."""
    data = read_file(path, what, hint)
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise CertError(f"the {what} {path} is not a PEM certificate") from None


def load_private_key(
    path: Path, what: str = "private key", hint: str = ""
) -> ec.EllipticCurvePrivateKey:
    """The unencrypted PEM EC private key at ``path``, or a CertError naming the file."""
    data = read_file(path, what, hint)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):  # TypeError: encrypted key without a password
        raise CertError(f"the {what} {path} is not an unencrypted PEM private key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"the {what} {path} is a {type(key).__name__}; expected an EC key")
    return key


# ---------------------------------------------------------------------------------------- checks


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The run CA's certificate and key in ``directory`` (`init_ca`), or a CertError naming the
    missing file and the command that creates them."""
    hint = f" (no run CA in {directory}); run `concord certs init --dir {directory}` first"
    ca_cert = load_certificate(directory / CA_CERT, "CA certificate", hint)
    return ca_cert, load_private_key(directory / CA_KEY, "CA private key", hint)


def _check_days(days: int) -> None:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise CertError(f"days must be an integer ≥ 1; got {days!r}")


def _refuse_overwrite(paths: Sequence[Path]) -> None:
    for p in paths:
        if p.exists():
            raise CertError(
                f"{p} exists; pass overwrite=True (CLI: --force) to replace it — peers holding "
                "certificates from the old CA will then be refused"
            )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _DNS_NAME.match(host) or len(host) > 253:
        raise CertError(
            f"host {host!r} is neither an IP address nor an ASCII DNS name; give the bare host "
            "(no port, no scheme), e.g. 10.0.0.5 or node3.lab (IDNA-encode non-ASCII names)"
        )
    return x509.DNSName(host)


def verify_chain(ca_path: Path, cert_path: Path, *, now: dt.datetime | None = None) -> None:
    """CertError unless the certificate at ``cert_path`` was signed by the CA at ``ca_path`` and
    both are inside their validity window at ``now`` (default: the current UTC time)."""
    ca = load_certificate(ca_path, "CA certificate", "; create it with `concord certs init`")
    cert = load_certificate(cert_path, "certificate")
    constraints = _basic_constraints(ca)
    if constraints is None or not constraints.ca:
        raise CertError(f"{ca_path} is not a CA certificate (basicConstraints CA:true missing)")
    if cert.issuer != ca.subject:
        raise CertError(
            f"{cert_path} is not issued by the run CA {ca_path}: its issuer is "
            f"{cert.issuer.rfc4514_string()!r}, the CA is {ca.subject.rfc4514_string()!r}; "
            "reissue it with `concord certs issue` from that CA"
        )
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertError(
            f"{cert_path} is not issued by the run CA {ca_path}: the signature does not verify "
            "(a CA with the same name but another key?); reissue it with `concord certs issue`"
        ) from None
    at = now or dt.datetime.now(dt.UTC)
    for path, c in ((ca_path, ca), (cert_path, cert)):
        if at < c.not_valid_before_utc:
            raise CertError(
                f"{path} is not valid before {c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
            )
        if at > c.not_valid_after_utc:
            raise CertError(
                f"{path} expired on {c.not_valid_after_utc:%Y-%m-%d %H:%M} UTC; issue a new one"
            )


def check_key_pair(cert_path: Path, key_path: Path) -> None:
    """CertError unless the private key at ``key_path`` belongs to the certificate at
    ``cert_path`` (same public key)."""
    cert = load_certificate(cert_path, "certificate")
    key = load_private_key(key_path, "private key")
    raw = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(*raw) != key.public_key().public_bytes(*raw):
        raise CertError(
            f"the private key {key_path} does not belong to the certificate {cert_path}"
        )


def check_usage(cert_path: Path, *, server: bool, client: bool) -> None:
    """CertError if the certificate restricts its extended key usage and leaves out serverAuth
    (when ``server``) or clientAuth (when ``client``). No extension means any usage."""
    cert = load_certificate(cert_path, "certificate")
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    for needed, oid, name in (
        (server, ExtendedKeyUsageOID.SERVER_AUTH, "serverAuth"),
        (client, ExtendedKeyUsageOID.CLIENT_AUTH, "clientAuth"),
    ):
        if needed and oid not in eku:
            raise CertError(
                f"{cert_path} lacks extendedKeyUsage {name}; a peer is both server and client, "
                "issue it with `concord certs issue`"
            )


def _basic_constraints(cert: x509.Certificate) -> x509.BasicConstraints | None:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return None


# -------------------------------------------------------------------------------------- issuing


def init_ca(directory: Path, *, run_id: str, days: int = 365, overwrite: bool = False) -> CAFiles:
    """Create ``directory/ca.key`` (0600) and ``directory/ca.crt`` for the run ``run_id``.

    days: validity, ≥ 1. overwrite: replace an existing CA (every peer certificate issued by it
    stops being accepted); without it an existing ``ca.key`` or ``ca.crt`` is a CertError.
    """
    if not isinstance(run_id, str) or not run_id.strip():
        raise CertError(f"run_id must be a non-empty string; got {run_id!r}")
    _check_days(days)
    directory = Path(directory)
    _make_dir(directory)
    files = CAFiles(directory / CA_KEY, directory / CA_CERT)
    if not overwrite:
        _refuse_overwrite([files.key, files.cert])
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"concord run {run_id} CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_pair(files.key, key, files.cert, cert)
    return files


def issue_peer(
    directory: Path,
    peer_id: int,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: int = 365,
) -> PeerFiles:
    """Create ``peer-<id>.key`` (0600) and ``peer-<id>.crt`` in ``directory``, signed by the run
    CA found there (see `init_ca`). Re-issuing replaces the peer's previous key and certificate.

    peer_id: ≥ 0. hosts: the IP addresses and DNS names other peers dial this one at (≥ 1; IPs
    become IP SANs, names DNS SANs; a peer dialled as 127.0.0.1 needs "127.0.0.1"). days: ≥ 1.
    """
    if isinstance(peer_id, bool) or not isinstance(peer_id, int) or peer_id < 0:
        raise CertError(f"peer_id must be an integer ≥ 0; got {peer_id!r}")
    if isinstance(hosts, str):
        raise CertError(f"hosts must be a list of hosts, not the string {hosts!r}")
    if not hosts:
        raise CertError("hosts is empty; a peer certificate needs at least one IP or DNS name")
    _check_days(days)
    directory = Path(directory)
    ca_cert, ca_key = load_ca(directory)
    key, cert = _leaf(
        ca_cert,
        ca_key,
        f"peer-{peer_id}",
        hosts,
        days,
        [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )
    files = PeerFiles(
        peer_id,
        directory / f"peer-{peer_id}.key",
        directory / f"peer-{peer_id}.crt",
        directory / CA_CERT,
    )
    _write_pair(files.key, key, files.cert, cert)
    return files


def issue_orchestrator(directory: Path, *, days: int = 365) -> LeafFiles:
    """Create ``orchestrator.key`` (0600) and ``orchestrator.crt`` in ``directory``, signed by
    the run CA found there: CN "orchestrator", clientAuth, no subjectAltName (the orchestrator
    serves nothing). Its key signs the orchestrator's control messages; re-issuing replaces it
    (receivers accept any certificate of the run CA with that CN)."""
    _check_days(days)
    directory = Path(directory)
    ca_cert, ca_key = load_ca(directory)
    key, cert = _leaf(ca_cert, ca_key, "orchestrator", [], days, [ExtendedKeyUsageOID.CLIENT_AUTH])
    files = LeafFiles(
        directory / ORCHESTRATOR_KEY, directory / ORCHESTRATOR_CERT, directory / CA_CERT
    )
    _write_pair(files.key, key, files.cert, cert)
    return files


def _leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    name: str,
    hosts: Sequence[str],
    days: int,
    usages: Sequence[x509.ObjectIdentifier],
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new key and its certificate (CN ``name``, one SAN per host — none without hosts,
    ``usages`` as extended key usage), signed by the CA and valid ``days`` (never past the CA)."""
    sans = list(dict.fromkeys(_san(h.strip()) for h in hosts))  # dedupe, keep order
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())
