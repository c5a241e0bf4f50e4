"""``concord certs revoke``: add a certificate to the run's revocation list
(`concord.protos.revocation`); the click declaration is in `concord.lab.cli_certs`."""

from __future__ import annotations

from pathlib import Path

from concord.protos.revocation import RevocationError, revoke


def run_revoke(
    directory: Path,
    *,
    peer_id: int | None,
    orchestrator: bool,
    cert: Path | None,
    reason: str,
) -> list[str]:
    """Revoke peer ``peer_id``'s, the orchestrator's or the ``cert`` certificate (exactly one)
    of the run CA in ``directory``; the lines to print. `RevocationError` says what is wrong."""
    if sum((peer_id is not None, orchestrator, cert is not None)) != 1:
        raise RevocationError("give exactly one of --peer ID, --orchestrator and --cert FILE")
    if not (directory / "ca.crt").is_file():
        raise RevocationError(
            f"{directory} holds no ca.crt: give the run CA's directory (--dir, as for "
            "`concord certs init`)"
        )
    if cert is None:
        cert = directory / ("orchestrator.crt" if orchestrator else f"peer-{peer_id}.crt")
    path, fp, cn = revoke(directory, cert, reason=reason)
    return [
        f"revoked {cn} ({cert}, sha256 {fp}) in {path}",
        f"copy {path.name} beside ca.crt on every host of the run: running peers and the "
        "orchestrator honour it within a second (mTLS and signed control messages); issue a "
        "replacement with `concord certs issue`",
    ]
