"""``concord sim``, ``concord peer`` and ``concord orchestrator``: running a run, on this host or
one process at a time."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import click

from concord.core.config import ConfigError, RunConfig
from concord.core.records import RunSummary
from concord.lab.cli_common import (
    F,
    broker_option,
    fail,
    force_option,
    insecure_option,
    out_option,
    prepare_out,
    process_options,
    run_config,
    set_option,
    telemetry,
)
from concord.runtime.records import read_peer_summary, read_summary


def config_option(help: str) -> Callable[[F], F]:
    """--config, the run's TOML file, required (a process of a run: peer, orchestrator)."""
    return click.option(
        "--config",
        "config",
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help=help,
    )


def _check_advertise(advertise: str | None) -> None:
    """``--advertise HOST:PORT``: a port in 1–65535 and a host that is an IP or resolves."""
    if advertise is None:
        return
    import ipaddress

    host, sep, port = advertise.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        fail(f"--advertise {advertise!r}: expected HOST:PORT with a port in 1-65535")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, int(port))
    except (OSError, UnicodeError) as exc:
        fail(f"--advertise {advertise!r}: host {host!r} does not resolve ({exc})")


def _fresh_run_id(cfg: RunConfig) -> str:
    """A run id of its own: ``<name or concord>-<8 hex>``."""
    import uuid

    base = "".join(c if c.isalnum() or c in "_.-" else "-" for c in (cfg.name or "concord"))
    return f"{base[:48].strip('-_.') or 'concord'}-{uuid.uuid4().hex[:8]}"


def _label(cfg: RunConfig) -> str:
    control = cfg.control.mode if cfg.controlled_phases() else "none"
    extra = f" {control}×{cfg.control.factor:g}" if control != "none" else ""
    if control == "fixed":  # no target: the rounds per controlled step
        extra = f" fixed {cfg.control.rounds} rounds"
    return f"{cfg.algorithm} {cfg.topology}{extra}"


@click.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--engine",
    type=click.Choice(["vectorized", "processes"]),
    default=None,
    help="vectorized: n replicas in one process; processes: orchestrator + n peers",
)
@set_option
@out_option("run directory (default: runs/<time>-<name>)")
@click.option("--quiet", is_flag=True, help="no progress bar")
@broker_option("processes engine: use this MQTT broker instead of the orchestrator's embedded one")
@click.option(
    "--reference",
    type=click.Choice(["allreduce", "none"]),
    default="allreduce",
    show_default=True,
    help="also run an all-reduce reference with the same budget and compare",
)
@force_option
@click.option(
    "--resume",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    metavar="RUN_DIR",
    help="continue the interrupted run in RUN_DIR from its last checkpoint (either engine)",
)
@insecure_option
@click.option(
    "--net",
    default=None,
    metavar="PROFILE|FILE",
    help="processes engine: run the broker, the orchestrator and every peer in a network "
    "namespace of its own behind emulated links — a named profile (lan, wan, edge, edge-mixed, "
    "edge-4g, edge-satellite) or a TOML file with a [network.emulation] table; sets "
    "network.emulation (root or CAP_NET_ADMIN; docs/network-emulation.md)",
)
def sim(
    config: Path | None,
    engine: str | None,
    overrides: Sequence[str],
    out: Path | None,
    quiet: bool,
    broker: str | None,
    reference: str,
    force: bool,
    resume: Path | None,
    net: str | None,
) -> None:
    """Run n peers on this host and print the final table (next to an all-reduce reference).

    The default engine, processes, runs the real system: an orchestrator (with an embedded MQTT
    broker unless --broker is given) and n peer processes exchanging tensors over gRPC on
    loopback. The vectorized engine trains all n replicas batched in this process. With --net
    (or a [network.emulation] table in the config) every process of the processes engine runs
    behind emulated links (delay, jitter, loss, rate)."""
    from concord.core.config import load_config, reference_config

    if resume is not None and (
        config is not None or overrides or out is not None or force or net is not None
    ):
        fail(
            "--resume continues RUN_DIR with its own config.toml: give no CONFIG, --set, --out, "
            "--net"
        )
    if resume is not None:
        try:
            cfg = load_config(resume / "config.toml", [], environ={})
        except (ConfigError, FileNotFoundError) as exc:
            fail(str(exc))
    else:
        cfg = run_config(config, overrides, extra=[f"engine={engine}"] if engine else [])
    if resume is not None and engine is not None and engine != cfg.engine:
        fail(f"--resume continues RUN_DIR in its own engine ({cfg.engine}); drop --engine")
    if net is not None:
        cfg = _with_net(cfg, net)
    if cfg.engine == "processes" and cfg.network.emulation is not None:
        _check_emulated(broker)
    from rich.console import Console

    from concord.lab.report import compare_table, final_table
    from concord.runtime.rundir import default_run_dir

    def run(c: RunConfig, d: Path) -> RunSummary:
        where = str(d / "summary.json")
        if c.engine == "processes":
            from concord.sim.processes import run_processes

            if resume is not None and d != resume:  # the reference run of a resumed run
                if (done := read_summary(d)) is not None:
                    return done
                shutil.rmtree(d, ignore_errors=True)  # interrupted too: run it again
            resuming = resume is not None and d == resume
            emulation = c.network.link_emulation()
            if emulation is None:
                doc = run_processes(c, d, progress=not quiet, broker=broker, resume=resuming)
                return RunSummary.from_json(doc, where=where)
            from concord.core.config import apply_overrides
            from concord.lab.net.placement import NetPlacement

            # the namespaces form a closed network: plaintext there exposes nothing
            c = apply_overrides(c, {"network.insecure": True})
            with NetPlacement(emulation, c.peers, d / "broker") as placement:
                doc = run_processes(c, d, progress=not quiet, resume=resuming, placement=placement)
            return RunSummary.from_json(doc, where=where)
        from concord.sim.engine import run as run_vectorized

        if resume is not None and (d == resume or (d / "summary.json").is_file()):
            return RunSummary.from_json(
                run_vectorized(c, d, progress=not quiet, resume=True), where=where
            )
        return RunSummary.from_json(run_vectorized(c, d, progress=not quiet), where=where)

    run_dir = resume or out or default_run_dir(cfg)
    if resume is None:
        prepare_out(run_dir, force, dirs=True)
    try:
        summary = run(cfg, run_dir)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        fail(str(exc))
    console = Console()
    if not console.is_terminal:  # pipes and CI logs: wide enough for the comparison table
        console = Console(width=120)
    console.print(final_table(summary))
    if reference != "none" and cfg.algorithm != reference:
        try:
            ref_cfg = reference_config(cfg, reference)
        except ConfigError as exc:
            fail(f"reference run ({reference}): {exc}")
        if not quiet:
            console.print(f"reference run: {reference}, same data, model, seed and steps")
        try:
            ref = run(ref_cfg, run_dir / "reference")
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            fail(f"reference run: {exc}")
        console.print(
            compare_table(
                [replace(ref, label=reference), replace(summary, label=_label(cfg))],
                title="Final accuracy next to the reference (Δ vs the first row)",
            )
        )
    console.print(f"run directory: {summary.run_dir}")


def _with_net(cfg: RunConfig, net: str) -> RunConfig:
    """``cfg`` with ``network.emulation`` the table of ``--net PROFILE|FILE``."""
    from concord.core.config import apply_overrides
    from concord.core.emulation import spec_table

    if cfg.engine != "processes":
        fail("--net emulates the links between processes: use --engine processes")
    try:
        return apply_overrides(cfg, {"network.emulation": spec_table(net)})
    except ConfigError as exc:
        fail(f"--net {net}: {exc}")


def _check_emulated(broker: str | None) -> None:
    """Before anything is created: an emulated run needs network namespaces here, and runs its
    own broker."""
    from concord.lab.net import available

    if broker is not None:
        fail("--net runs its own broker in the emulated network: drop --broker")
    ok, why = available()
    if not ok:
        fail(f"--net needs network namespaces (root or CAP_NET_ADMIN): {why}")


@click.command()
@config_option("the run's TOML config")
@click.option(
    "--id",
    "peer_id",
    default=None,
    type=click.IntRange(min=0),
    help="this peer's id (default: from the launcher: CONCORD_PEER_ID, RANK, SLURM_PROCID, "
    "JOB_COMPLETION_INDEX or a StatefulSet hostname's ordinal)",
)
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    help="bind address (default: network.addresses[id])",
)
@click.option(
    "--advertise",
    default=None,
    metavar="HOST:PORT",
    help="address other peers reach this one at (default: the listen address)",
)
@broker_option(
    "follow the orchestrator on this MQTT broker (default: orchestrator.broker; "
    "unset: static mode, network.addresses)"
)
@click.option(
    "--run-id",
    default=None,
    help="control-plane run id, the orchestrator's (default: the config's name; with a broker "
    "one of the two is required)",
)
@process_options("run directory (default: runs/peer-<id>)")
def peer(
    config: Path,
    peer_id: int | None,
    listen: str | None,
    advertise: str | None,
    broker: str | None,
    run_id: str | None,
    overrides: Sequence[str],
    out: Path | None,
    force: bool,
    resume_step: int | None,
    log_format: str,
    metrics_listen: str | None,
) -> None:
    """Run one peer: its replica, a gRPC server, and links to its graph neighbours."""
    from concord.peer.app import CertError, PeerConfigError, run_peer
    from concord.peer.launcher import LauncherError, resolve_identity

    _check_advertise(advertise)
    extra = telemetry(log_format, metrics_listen)
    cfg = run_config(config, overrides, broker=broker, extra=extra)
    try:
        identity = resolve_identity(peer_id, os.environ, socket.gethostname(), cfg.peers)
    except LauncherError as exc:
        fail(str(exc))
    peer_id = identity.peer_id
    if cfg.orchestrator.broker is not None and run_id is None and not cfg.name:
        fail(
            "a peer that follows an orchestrator needs the run's id: set 'name' in the config "
            "(the same file the orchestrator runs) or pass --run-id (the orchestrator logs its "
            "id and writes it to orchestrator.json)"
        )
    run_dir = out or Path("runs") / f"peer-{peer_id}"
    # a peer started again with the same command on its interrupted run rejoins it: a static
    # peer from its checkpoint (or a neighbour's parameters), an orchestrated one where the
    # orchestrator re-admits it; a completed run's directory is refused as before
    started = (run_dir / "checkpoint.pt").is_file() or (run_dir / "metrics.jsonl").is_file()
    try:
        summary = read_peer_summary(run_dir)
    except ValueError as exc:
        fail(str(exc))
    resuming = not force and started and not (summary is not None and summary.completed)
    if resume_step is not None and force:
        fail("--resume-step continues the run in --out: --force would delete it")
    if not resuming and resume_step is None:
        prepare_out(run_dir, force)
    try:
        code = run_peer(
            cfg,
            peer_id,
            listen=listen,
            out=run_dir,
            advertise=advertise,
            run_id=run_id,
            resume_step=resume_step,
            identity=identity,
        )
    except (ConfigError, PeerConfigError, CertError) as exc:
        fail(str(exc))
    sys.exit(code)


@click.command()
@config_option("the run's TOML config (the same file the peers run)")
@broker_option("MQTT broker (default: orchestrator.broker; unset: embed one on 127.0.0.1)")
@click.option(
    "--run-id",
    default=None,
    help="control-plane run id (default: the config's name; neither: a fresh <concord>-<8 hex>)",
)
@process_options("directory for the manifest, metrics and logs (default: runs/orchestrator)")
def orchestrator(
    config: Path,
    broker: str | None,
    run_id: str | None,
    overrides: Sequence[str],
    out: Path | None,
    force: bool,
    resume_step: int | None,
    log_format: str,
    metrics_listen: str | None,
) -> None:
    """Coordinate the peers of a run over MQTT: schedules, plan, consensus control, liveness."""
    from concord.orchestrator.app import OrchestratorError, run_orchestrator
    from concord.protos.control_plane import Topics

    extra = telemetry(log_format, metrics_listen)
    cfg = run_config(config, overrides, broker=broker, extra=extra, code=1)
    try:
        rid = run_id or cfg.name or _fresh_run_id(cfg)
        Topics(rid)
        if run_id is None and not cfg.name:
            click.echo(f"run id: {rid} (peers join with --run-id {rid})", err=True)
        run_dir = out or Path("runs") / "orchestrator"
        if resume_step is None:
            prepare_out(run_dir, force)
        code = run_orchestrator(cfg, run_dir, broker=None, run_id=rid, resume_step=resume_step)
    except (ConfigError, OrchestratorError, ValueError, OSError) as exc:
        fail(str(exc), 1)
    sys.exit(code)
