"""``concord topology``, ``concord partition show`` and ``concord status``: looking at a
topology, a run's data partition and a running run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import click

from concord.lab.cli_common import fail, run_config, set_option
from concord.lab.topology_cmd import show_topology, topology_help


@click.command(help=topology_help())
@click.argument("name")
@click.option("--peers", "-n", type=click.IntRange(min=1), required=True, help="number of peers")
@click.option(
    "--weights",
    type=click.Choice(["metropolis", "uniform", "pairwise"]),
    default=None,
    help="mixing-weight rule (default: the topology's natural rule)",
)
@click.option(
    "--kappa",
    type=click.FloatRange(0, 1, min_open=True),
    default=1.0,
    help="lazy mixing κ·W + (1−κ)·I",
)
@click.option("--seed", type=int, default=0, help="seed of random (time-varying) topologies")
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
def topology(
    name: str, peers: int, weights: str | None, kappa: float, seed: int, as_json: bool
) -> None:
    try:
        show_topology(name, peers, weights, kappa, seed, as_json)
    except ValueError as exc:
        fail(str(exc))


@click.group()
def partition() -> None:
    """Inspect a run's data partition (which samples each peer trains on)."""


@partition.command("show")
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@set_option
@click.option(
    "--png",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("partition.png"),
    show_default=True,
    help="where to write the peer × class heat map",
)
def partition_show(config: Path | None, overrides: Sequence[str], png: Path) -> None:
    """Build the run's partition as a run does and print, per peer: samples, share of the mean
    size, distinct labels, TV distance from the global label distribution and per-class counts;
    then the totals and the partition's SHA-256 digest (equal on two machines exactly when they
    built the same partition). Writes a peer × class heat map to --png."""
    cfg = run_config(config, overrides)
    from concord.core.plugins import PluginError
    from concord.errors import ConcordError
    from concord.lab.partition_show import build_view, table_lines, write_heatmap

    try:
        view = build_view(cfg)
    except (ConcordError, PluginError, ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    for line in table_lines(view):
        click.echo(line)
    try:
        write_heatmap(view, png)
    except OSError as exc:
        fail(f"--png {png}: {exc}")
    click.echo(f"heat map: {png}")


@click.command()
@click.argument("target", metavar="RUN_DIR|mqtt[s]://HOST:PORT")
@click.option("--run-id", default=None, help="with a broker URL: the run to show")
@click.option(
    "--config",
    "config",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="the run's TOML config: broker credentials (as 'monitor') and signing; a RUN_DIR's "
    "own config.toml is used by default",
)
@click.option("--watch", "-w", is_flag=True, help="keep the view live until Ctrl-C or the run ends")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="--watch: seconds between redraws",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0.1),
    default=2.5,
    show_default=True,
    help="without --watch: seconds to listen before printing (heartbeats come every second)",
)
@click.option("--json", "as_json", is_flag=True, help="print the view as JSON")
@click.option(
    "--identity",
    default="observer",
    show_default=True,
    help="the read-only broker login when the run's config sets credentials (`concord certs "
    "broker` issues observer and monitor; concord sim's own view holds monitor)",
)
def status(
    target: str,
    run_id: str | None,
    config: Path | None,
    watch: bool,
    interval: float,
    wait: float,
    as_json: bool,
    identity: str,
) -> None:
    """Show a running run live: every peer's state, step, phase, rounds, θ, loss and last
    heartbeat, stragglers flagged, Θ against its target and the orchestrator's presence."""
    import asyncio

    from rich.console import Console

    from concord.lab.status import resolve_target
    from concord.lab.status import watch as follow
    from concord.protos.reach import BrokerUnreachableError

    try:
        # --watch on a run being started: wait for its orchestrator to say where it is
        where = resolve_target(target, run_id, config, wait=60.0 if watch else 0.0)
        view = asyncio.run(
            follow(
                where,
                seconds=None if watch else wait,
                interval=interval,
                live=watch,
                as_json=as_json,
                identity=identity,
            )
        )
    except BrokerUnreachableError as exc:
        ended = Path(target) / "orchestrator-summary.json"
        if "://" not in target and ended.is_file():
            fail(f"the run in {target} has ended (its broker is gone): see {ended}", 1)
        fail(str(exc), 1)
    except ValueError as exc:
        fail(str(exc), 1)
    except KeyboardInterrupt:
        return
    if watch:
        return
    if as_json:
        click.echo(json.dumps(view.snapshot(), indent=2))
    else:
        Console().print(view.render())
    if not view.messages:
        fail(f"nothing heard from run {where.run!r} at {where.broker} in {wait:g} s", 1)
