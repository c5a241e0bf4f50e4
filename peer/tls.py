"""gRPC mTLS credentials for the data plane (config ``[network.tls]``, paths with ``{id}``).

Every loader checks the material with `cryptography` before handing it to gRPC — files exist and
are readable PEM, the key belongs to the certificate, the certificate chains to the run CA, is in
its validity window and allows serverAuth + clientAuth — because a bad file otherwise surfaces
only as an opaque ``UNAVAILABLE`` handshake failure on the *other* peer
(docs/deployment.md#mtls-certificates).

Server credentials require a client certificate (``require_client_auth=True``): a client without
one, with one from another CA, or in plaintext gets ``UNAVAILABLE``. Channel credentials trust only
the run CA. gRPC checks the server's subjectAltNames against the dialled host: dialling
127.0.0.1 needs an IP SAN, localhost a DNS SAN (`concord.peer.certs.issue_peer` writes both by
default).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from concord.peer.certs import (
    CertError,
    check_key_pair,
    check_usage,
    read_file,
    verify_chain,
)

PathLike = str | os.PathLike[str]

__all__ = [
    "CertError",
    "TLSMaterial",
    "expand",
    "load_channel_credentials",
    "load_credentials",
    "load_material",
    "load_server_credentials",
    "peer_id_of",
]

# the subject CN `concord.peer.certs.issue_peer` writes
_PEER_CN = re.compile(r"^peer-(\d{1,9})$")


@dataclass(frozen=True)
class TLSMaterial:
    """Checked PEM bytes of the run CA certificate, this peer's certificate and its key."""

    ca: bytes
    cert: bytes
    key: bytes


def expand(path_template: PathLike, peer_id: int) -> Path:
    """``path_template`` with every ``{id}`` replaced by ``peer_id`` (≥ 0); other text is kept
    verbatim (no other ``{…}`` fields are interpreted)."""
    if isinstance(peer_id, bool) or not isinstance(peer_id, int) or peer_id < 0:
        raise CertError(f"peer_id must be an integer ≥ 0; got {peer_id!r}")
    return Path(os.fspath(path_template).replace("{id}", str(peer_id)))


def load_material(ca: PathLike, cert: PathLike, key: PathLike) -> TLSMaterial:
    """Read and check the three files (paths already expanded); CertError says what is wrong."""
    ca_path, cert_path, key_path = Path(ca), Path(cert), Path(key)
    material = TLSMaterial(
        ca=read_file(ca_path, "CA certificate", "; create it with `concord certs init`"),
        cert=read_file(cert_path, "peer certificate", "; create it with `concord certs issue`"),
        key=read_file(key_path, "peer key", "; create it with `concord certs issue`"),
    )
    check_key_pair(cert_path, key_path)
    verify_chain(ca_path, cert_path)
    check_usage(cert_path, server=True, client=True)
    return material


def load_server_credentials(ca: PathLike, cert: PathLike, key: PathLike) -> grpc.ServerCredentials:
    """Server credentials presenting ``cert``/``key`` and requiring a client certificate signed
    by the CA in ``ca``."""
    m = load_material(ca, cert, key)
    return grpc.ssl_server_credentials(
        [(m.key, m.cert)], root_certificates=m.ca, require_client_auth=True
    )


def load_channel_credentials(
    ca: PathLike, cert: PathLike, key: PathLike
) -> grpc.ChannelCredentials:
    """Channel credentials presenting ``cert``/``key`` as the client certificate and trusting only
    the CA in ``ca``."""
    m = load_material(ca, cert, key)
    return grpc.ssl_channel_credentials(
        root_certificates=m.ca, private_key=m.key, certificate_chain=m.cert
    )


def load_credentials(
    ca: str, cert: str, key: str, peer_id: int
) -> tuple[grpc.ServerCredentials, grpc.ChannelCredentials]:
    """Both credentials of peer ``peer_id`` from config templates (``network.tls.ca/cert/key``,
    ``{id}`` expanded), checked once."""
    paths = [expand(t, peer_id) for t in (ca, cert, key)]
    m = load_material(*paths)
    server = grpc.ssl_server_credentials(
        [(m.key, m.cert)], root_certificates=m.ca, require_client_auth=True
    )
    channel = grpc.ssl_channel_credentials(
        root_certificates=m.ca, private_key=m.key, certificate_chain=m.cert
    )
    return server, channel


def peer_id_of(auth: Mapping[str, Sequence[bytes]]) -> int | None:
    """The peer id a verified client certificate names (its subject CN ``peer-<id>``, as
    `concord.peer.certs.issue_peer` issues it), from a gRPC ``context.auth_context()``; None
    when there is no certificate or its CN names no peer. gRPC has verified the chain to the run
    CA before a handler runs (``require_client_auth``), so the CN can be trusted."""
    names = auth.get("x509_common_name") or []
    ids = set()
    for raw in names:
        m = _PEER_CN.match(raw.decode("utf-8", "replace"))
        if m is None:
            return None
        ids.add(int(m.group(1)))
    return ids.pop() if len(ids) == 1 else None
