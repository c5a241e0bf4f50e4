"""``concord certs``: the run's identities — its CA, the peers' and the orchestrator's
certificates, their revocation, and the broker's credentials."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from concord.lab.cli_common import fail

# the options of several `concord certs` commands (one definition, one help text)
dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
    help="the directory of the run CA and the identities it signs",
)
days_option = click.option(
    "--days",
    type=click.IntRange(min=1),
    default=365,
    show_default=True,
    help="days the certificates are valid",
)


@click.group()
def certs() -> None:
    """mTLS material: a run CA and per-peer certificates (network.tls in the run config)."""


@certs.command("init")
@dir_option
@click.option("--run-id", default="concord", show_default=True)
@days_option
@click.option("--force", is_flag=True, help="replace an existing CA")
def certs_init(directory: Path, run_id: str, days: int, force: bool) -> None:
    """Create the run CA (ca.key 0600, ca.crt) and the orchestrator's signing key and
    certificate (orchestrator.key 0600, orchestrator.crt)."""
    from concord.peer.certs import CertError, init_ca, issue_orchestrator

    try:
        files = init_ca(directory, run_id=run_id, days=days, overwrite=force)
        orchestrator = issue_orchestrator(directory, days=days)
    except CertError as exc:
        fail(str(exc))
    click.echo(f"wrote {files.key} and {files.cert}")
    click.echo(f"wrote {orchestrator.key} and {orchestrator.cert} (the orchestrator signs with it)")


@certs.command("issue")
@click.option("--peer", "peer_id", type=click.IntRange(min=0), default=None, help="a peer's id")
@click.option(
    "--orchestrator",
    "for_orchestrator",
    is_flag=True,
    help="the orchestrator's signing certificate instead (certs init also writes it)",
)
@dir_option
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="IP or DNS name the peer is reached at (repeatable; default 127.0.0.1, localhost)",
)
@days_option
def certs_issue(
    peer_id: int | None,
    for_orchestrator: bool,
    directory: Path,
    hosts: Sequence[str],
    days: int,
) -> None:
    """Issue peer-<id>.key (0600) and peer-<id>.crt signed by the run CA; with --orchestrator,
    orchestrator.key (0600) and orchestrator.crt (no hosts: it serves nothing)."""
    from concord.peer.certs import CertError, issue_orchestrator, issue_peer

    if (peer_id is not None) == for_orchestrator:
        fail("give exactly one of --peer ID and --orchestrator")
    if for_orchestrator and hosts:
        fail("--host is for peers: the orchestrator's certificate names no host")
    try:
        if peer_id is not None:
            files = issue_peer(
                directory, peer_id, hosts=list(hosts) or ["127.0.0.1", "localhost"], days=days
            )
            written = (files.key, files.cert)
        else:
            orchestrator = issue_orchestrator(directory, days=days)
            written = (orchestrator.key, orchestrator.cert)
    except CertError as exc:
        fail(str(exc))
    click.echo(f"wrote {written[0]} and {written[1]}")


@certs.command("revoke")
@click.option("--peer", "peer_id", type=click.IntRange(min=0), default=None, help="a peer's id")
@click.option("--orchestrator", is_flag=True, help="the orchestrator's signing certificate")
@click.option(
    "--cert",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="any certificate file of the run CA (e.g. a copy of one already re-issued)",
)
@dir_option
@click.option("--reason", default="", help="a note kept with the entry")
def certs_revoke(
    peer_id: int | None, orchestrator: bool, cert: Path | None, directory: Path, reason: str
) -> None:
    """Revoke a certificate: add it to revoked.txt beside ca.crt, which the data plane (mTLS)
    and the signature check honour. Revoke before re-issuing (the old file names it)."""
    from concord.lab.revoke_cmd import run_revoke
    from concord.protos.revocation import RevocationError

    try:
        lines = run_revoke(
            directory, peer_id=peer_id, orchestrator=orchestrator, cert=cert, reason=reason
        )
    except RevocationError as exc:
        fail(str(exc))
    for line in lines:
        click.echo(line)


@certs.command("broker")
@dir_option
@click.option("--run-id", required=True, help="the run whose topics the ACL covers")
@click.option("--peers", type=click.IntRange(min=1), required=True)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="IP or DNS name the broker is reached at (repeatable; default 127.0.0.1, localhost)",
)
@days_option
@click.option("--force", is_flag=True, help="replace existing broker files (new passwords)")
def certs_broker(
    directory: Path, run_id: str, peers: int, hosts: Sequence[str], days: int, force: bool
) -> None:
    """Broker identities: its TLS certificate (signed by the run CA), one password file per
    identity (orchestrator, peer-<id>, monitor; 0600), a Mosquitto password file and an ACL
    letting each identity publish only its own topics."""
    from concord.peer.broker_creds import issue_broker
    from concord.peer.certs import CertError

    try:
        files = issue_broker(
            directory,
            run_id=run_id,
            peers=peers,
            hosts=list(hosts) or ["127.0.0.1", "localhost"],
            days=days,
            overwrite=force,
        )
    except (CertError, ValueError) as exc:
        fail(str(exc))
    click.echo(f"wrote {files.key}, {files.cert}, {files.passwd}, {files.acl}, {files.conf}")
    click.echo(f"and {len(files.passwords)} password files in {files.passwd.parent}")
    click.echo(
        "run config: [orchestrator] broker = 'mqtts://HOST:8883', broker_username = "
        f"'{{identity}}', broker_password_file = '{files.passwd.parent}/{{identity}}.password', "
        f"broker_ca = '{files.ca}'"
    )
    click.echo(
        "embedded broker (no orchestrator.broker): [orchestrator] embedded_broker_passwd = "
        f"'{files.passwd}', embedded_broker_acl = '{files.acl}', embedded_broker_cert = "
        f"'{files.cert}', embedded_broker_key = '{files.key}', and name = '{run_id}'"
    )
