"""Loading mTLS credentials for the data plane (config ``[network.tls]``, paths with ``{id}``)."""

from __future__ import annotations

from pathlib import Path

import grpc

from peer.certs import CertError, verify_chain


def expand(template: str, peer_id: int) -> Path:
    return Path(template.replace("{id}", str(peer_id)))


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CertError(f"cannot read the {what} {path}: {exc.strerror}") from None


def load_credentials(
    ca: str, cert: str, key: str, peer_id: int
) -> tuple[grpc.ServerCredentials, grpc.ChannelCredentials]:
    """Server credentials that require a client certificate from the run CA, and channel
    credentials presenting this peer's certificate and trusting only the run CA."""
    ca_path, cert_path, key_path = (expand(t, peer_id) for t in (ca, cert, key))
    ca_pem = _read(ca_path, "CA certificate")
    cert_pem = _read(cert_path, "peer certificate")
    key_pem = _read(key_path, "peer key")
    verify_chain(ca_path, cert_path)
    server = grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
    )
    channel = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)
    return server, channel
