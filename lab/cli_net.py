"""``concord net``: the emulated networks of ``concord sim --net`` — ``check`` measures a
profile's links beside their configured values, ``cleanup`` removes what a killed run left
(docs/network-emulation.md)."""

from __future__ import annotations

import json

import click

from concord.lab.cli_common import fail


@click.group("net")
def net_group() -> None:
    """Emulated networks: measure a link profile, clean up after a killed run."""


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.3f} %" if unit == "" else f"{value:.2f} {unit}"


@net_group.command("check")
@click.argument("spec", metavar="PROFILE|FILE")
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.5),
    default=3.0,
    show_default=True,
    help="seconds of TCP throughput measured each way",
)
def check_cmd(spec: str, as_json: bool, seconds: float) -> None:
    """Measure a profile's links: two hosts, each behind the profile's common link (per-peer
    overrides and spreads aside), round-trip time (p50, p99) of UDP probes, TCP throughput each
    way as the link's frame rate, and the loss of UDP datagrams; each beside its configured
    value with the relative error. Exit 1 when one is outside its fidelity target (RTT p50 and
    rate ±10 %, loss ±20 %). Needs root or CAP_NET_ADMIN."""
    from concord.core.emulation import resolve
    from concord.errors import ConfigError
    from concord.lab.net import NetError, available
    from concord.lab.net.check import check

    try:
        emulation = resolve(spec)
    except ConfigError as exc:
        fail(str(exc))
    ok, why = available()
    if not ok:
        fail(f"concord net check needs network namespaces (root or CAP_NET_ADMIN): {why}")
    try:
        rows = check(emulation, seconds=seconds)
    except NetError as exc:
        fail(str(exc), 1)
    missed = [r for r in rows if not r.ok]
    if as_json:
        doc = {"profile": spec, "rows": [r.to_json() for r in rows], "ok": not missed}
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(f"{'':12} {'configured':>14} {'measured':>14} {'error':>8}  target")
        for r in rows:
            err = "—" if r.rel_err is None else f"{100 * r.rel_err:.1f} %"
            target = "—" if r.target is None else f"±{100 * r.target:.0f} %"
            mark = "" if r.ok else "  OUTSIDE"
            click.echo(
                f"{r.quantity:12} {_cell(r.configured, r.unit):>14} "
                f"{_cell(r.measured, r.unit):>14} {err:>8}  {target}{mark}"
            )
    if missed:
        names = ", ".join(f"{r.quantity} ({100 * (r.rel_err or 0):.1f} %)" for r in missed)
        click.echo(f"outside the fidelity targets: {names}", err=True)
        raise SystemExit(1)


@net_group.command("cleanup")
def cleanup_cmd() -> None:
    """Remove what runs killed without their teardown (kill -9) left: every namespace of
    `concord sim --net` or `concord net check` whose owning process is gone, with the processes
    still inside (the link emulator, the broker, orphaned children). Those of live runs stay."""
    from concord.lab.net import cleanup

    removed = cleanup()
    if removed:
        click.echo(f"removed {len(removed)} namespace(s): {' '.join(removed)}")
    else:
        click.echo("nothing to clean up")
