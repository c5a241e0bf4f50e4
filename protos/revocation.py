"""Certificate revocation: the run's list of revoked certificates, honoured by the data plane
(mTLS: a client certificate on the list may not say Hello, send or Fetch) and by the signature
check of control messages (an envelope carrying a revoked certificate is refused, reason
``revoked``).

The list is ``revoked.txt`` beside the run CA certificate (``network.tls.ca``'s directory):
one certificate per line, the SHA-256 of its DER encoding in hex first, then what
`concord certs revoke` notes about it (CN, serial, when); ``#`` starts a comment. Copy it with
``ca.crt`` to every host of the run. A running process re-reads the file when it changes
(looked at most once a second), so a revocation takes effect without a restart; a file that
cannot be parsed keeps the last list that could (logged), an absent file is an empty list.
gRPC's Python TLS has no revocation check of its own, so a peer checks the certificate of whoever
connects to it; a client does not check its server's (grpc exposes no server certificate on a
channel): a revoked peer may still accept connections, never send or fetch.

torch-free and broker-free: the orchestrator, the peers and the CLI import it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import time
from pathlib import Path

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = structlog.get_logger("concord.protos.revocation")

REVOKED_FILE = "revoked.txt"
_LINE = re.compile(r"^([0-9a-f]{64})(\s.*)?$")
RECHECK = 1.0  # seconds between looks at the file


class RevocationError(ValueError):
    """The revocation list or a certificate to revoke cannot be used; the message says why."""


def fingerprint(der: bytes) -> str:
    """The SHA-256 (hex) of a certificate's DER encoding: how the list names it."""
    return hashlib.sha256(der).hexdigest()


def fingerprint_pem(pem: bytes) -> str:
    return fingerprint(x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER))


def revoked_path(ca: str | Path) -> Path:
    """Where the list of the run whose CA certificate is ``ca`` lives."""
    return Path(ca).parent / REVOKED_FILE


def read_revoked(path: Path) -> set[str]:
    """The fingerprints in ``path`` (absent: none); `RevocationError` naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return set()
    except OSError as exc:
        raise RevocationError(f"cannot read {path}: {exc.strerror or exc}") from None
    out: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line.lower())
        if m is None:
            raise RevocationError(
                f"{path}:{n}: expected the SHA-256 of a certificate (64 hex digits) first; "
                f"got {line[:80]!r}"
            )
        out.add(m[1])
    return out


class Revocations:
    """The revoked fingerprints of ``path``, kept current (module docstring). ``in`` checks a
    fingerprint (hex SHA-256 of the DER)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._revoked: set[str] = set()
        self._stamp: tuple[int, int] | None = None  # (mtime ns, size) of the file read
        self._looked = -float("inf")
        self.refresh(force=True)

    @classmethod
    def for_ca(cls, ca: str | Path | None) -> Revocations:
        return cls(None if ca is None else revoked_path(ca))

    def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.path is None or (not force and now - self._looked < RECHECK):
            return
        self._looked = now
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp == self._stamp and not force:
            return
        try:
            revoked = read_revoked(self.path)
        except RevocationError as exc:
            if force:
                raise
            log.error("revocation.unreadable", path=str(self.path), problem=str(exc))
            return
        if revoked != self._revoked:
            log.warning("revocation.list", path=str(self.path), revoked=len(revoked))
        self._revoked, self._stamp = revoked, stamp

    def __contains__(self, fp: object) -> bool:
        self.refresh()
        return isinstance(fp, str) and fp in self._revoked

    def __len__(self) -> int:
        return len(self._revoked)


def revoke(directory: Path, cert: Path, *, reason: str = "") -> tuple[Path, str, str]:
    """Add ``cert`` to ``directory``'s list (created 0644 if absent); returns (the list, the
    fingerprint, the certificate's CN). Revoking one twice is a no-op. `RevocationError` when
    ``cert`` is not a readable certificate."""
    try:
        loaded = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except OSError as exc:
        problem = exc.strerror or exc
        raise RevocationError(f"cannot read the certificate {cert}: {problem}") from None
    except ValueError as exc:
        raise RevocationError(f"{cert} is not a PEM certificate: {exc}") from None
    fp = fingerprint(loaded.public_bytes(serialization.Encoding.DER))
    names = loaded.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)
    cn = str(names[0].value) if names else "?"
    path = Path(directory) / REVOKED_FILE
    if fp in read_revoked(path):
        return path, fp, cn
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    note = f"{fp}  CN={cn} serial={loaded.serial_number:x} revoked={when}"
    if reason:
        note += f" reason={' '.join(reason.split())}"
    old = (
        path.read_text(encoding="utf-8")
        if path.is_file()
        else (
            "# revoked certificates of this run (`concord certs revoke`): SHA-256 of DER, notes\n"
        )
    )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(old + note + "\n", encoding="utf-8")
    os.chmod(tmp, 0o644)
    tmp.replace(path)
    return path, fp, cn
