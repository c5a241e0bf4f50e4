"""The ``concord`` command.

Sub-commands import their heavy dependencies lazily: ``concord topology`` and (later) the
orchestrator never import torch.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from concord.core.config import ConfigError, RunConfig
from concord.lab.config_cmd import config as config_group
from concord.lab.deploy_cli import compose_cmd, k8s_cmd
from concord.lab.topology_cmd import show_topology, topology_help


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# what a finished run leaves in its directory: found there, the directory is "reused"
_RUN_FILES = (
    "orchestrator.json",
    "orchestrator-summary.json",
    "summary.json",
    "error.json",
    "manifest.json",
    "metrics.jsonl",
    "control.jsonl",
    "schedules.jsonl",
    "graphs.jsonl",
    "calibration.json",
    "partition.json",
    "edges.json",
    "log.jsonl",
    "checkpoint.pt",
    "accuracy.png",
    "consensus.png",
    "rounds.png",
    "bytes.png",
)
_RUN_DIRS = ("peers", "logs", "reference")


def _prepare_out(out: Path, force: bool, *, dirs: bool = False) -> None:
    """Refuse a run directory that holds an earlier run's files (they would be read as this
    run's), unless ``force``: then remove those files first (nothing else in it). ``dirs``: the
    launcher's sub-directories count too (``concord sim``; the orchestrator it starts shares the
    run directory with the launcher's ``logs/``)."""
    import shutil

    found = [n for n in _RUN_FILES if (out / n).exists()]
    found += [f"{n}/" for n in _RUN_DIRS if dirs and (out / n).is_dir()]
    if not found:
        return
    if not force:
        _fail(
            f"--out {out} already holds a run ({', '.join(found[:4])}"
            f"{', …' if len(found) > 4 else ''}); choose another directory or pass --force to "
            "replace it"
        )
    for name in found:
        path = out / name.rstrip("/")
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def _check_advertise(advertise: str | None) -> None:
    """``--advertise HOST:PORT``: a port in 1–65535 and a host that is an IP or resolves."""
    if advertise is None:
        return
    import ipaddress
    import socket

    host, sep, port = advertise.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        _fail(f"--advertise {advertise!r}: expected HOST:PORT with a port in 1-65535")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        socket.getaddrinfo(host, int(port))
    except (OSError, UnicodeError) as exc:
        _fail(f"--advertise {advertise!r}: host {host!r} does not resolve ({exc})")


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


# Options several commands share (one definition, one help text)
_set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a config key, e.g. --set control.factor=0.5 (repeatable)",
)
_force_option = click.option(
    "--force", is_flag=True, help="replace the earlier run in --out (default: refuse to reuse it)"
)
# the launcher's (`concord sim --resume`): every process continues after the same step
_resume_step_option = click.option(
    "--resume-step",
    type=click.IntRange(min=0),
    default=None,
    hidden=True,
    help="continue the interrupted run in --out after this checkpoint step (concord sim --resume)",
)


# the long-running processes' (`concord peer`, `concord orchestrator`): what operators see
_log_format_option = click.option(
    "--log-format",
    type=click.Choice(["text", "json", "none"]),
    default="text",
    show_default=True,
    envvar="CONCORD_LOG_FORMAT",
    help="also log to stderr (docker/kubectl logs): human-readable lines, log.jsonl's JSON "
    "lines, or nothing; log.jsonl in --out has every line either way",
)
_metrics_option = click.option(
    "--metrics-listen",
    default=None,
    metavar="HOST:PORT",
    help="serve Prometheus metrics at http://HOST:PORT/metrics (sets metrics.listen; port 0: "
    "a free one, written to telemetry.json in --out)",
)


def _accept_insecure(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """``--insecure``: network.insecure = true for this process and the ones it starts (as
    ``CONCORD_NETWORK__INSECURE``, read with the rest of the config)."""
    if value:
        os.environ["CONCORD_NETWORK__INSECURE"] = "true"


_insecure_option = click.option(
    "--insecure",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_accept_insecure,
    help="accept an open network without protection (network.insecure = true): listening "
    "beyond loopback without [network.tls], or a broker beyond loopback with neither "
    "credentials nor signing (refused otherwise; warned on stderr and in log.jsonl)",
)


def _telemetry(log_format: str, metrics_listen: str | None) -> list[str]:
    """Apply ``--log-format`` to this process (undone when the command ends: a test's
    in-process invocation leaves nothing behind) and return ``--metrics-listen`` as a config
    override."""
    from concord.runtime.logs import set_console_format

    set_console_format(log_format)
    click.get_current_context().call_on_close(lambda: set_console_format("none"))
    return [] if metrics_listen is None else [f"metrics.listen={metrics_listen}"]


def _broker_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--broker", default=None, metavar="mqtt[s]://HOST:PORT", help=help)


def _out_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--out", type=click.Path(file_okay=False, path_type=Path), default=None, help=help
    )


def _run_config(
    config: Path | None,
    overrides: Sequence[str],
    *,
    broker: str | None = None,
    extra: Sequence[str] = (),
    code: int = 2,
) -> RunConfig:
    """The run's config: ``config`` (None: defaults), the ``CONCORD_*`` environment, then
    ``overrides``, ``extra`` and ``--broker`` as ``orchestrator.broker``; a `ConfigError` is the
    command's error (exit ``code``)."""
    from concord.core.config import load_config

    items = [*overrides, *extra]
    if broker is not None:
        items.append(f"orchestrator.broker={broker}")
    try:
        return load_config(config, items)
    except ConfigError as exc:
        _fail(str(exc), code)


def _add_plugin_path(dirs: Sequence[Path]) -> None:
    """Prepend ``dirs`` (absolute) to ``CONCORD_PLUGIN_PATH`` in this process's environment, which
    the processes it starts (peers, orchestrator) inherit; `concord.core.plugins` reads it."""
    from concord.core.plugins import PLUGIN_PATH_ENV

    old = [d for d in os.environ.get(PLUGIN_PATH_ENV, "").split(os.pathsep) if d]
    new = [str(d.resolve()) for d in dirs]
    os.environ[PLUGIN_PATH_ENV] = os.pathsep.join(dict.fromkeys([*new, *old]))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option("0.1.0", prog_name="concord")
@click.option(
    "--plugin-path",
    "plugin_paths",
    multiple=True,
    metavar="DIR",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a directory holding your 'module:callable' code (datasets, partition schemes, "
    "models), searched after the working directory and before installed packages; sets "
    "CONCORD_PLUGIN_PATH, which the peer and orchestrator processes inherit (repeatable)",
)
def main(plugin_paths: Sequence[Path]) -> None:
    """Concord: decentralized (gossip) training with consensus control."""
    if plugin_paths:
        _add_plugin_path(plugin_paths)


@main.command(help=topology_help())
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
        _fail(str(exc))


@main.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--engine",
    type=click.Choice(["vectorized", "processes"]),
    default=None,
    help="vectorized: n replicas in one process; processes: orchestrator + n peers",
)
@_set_option
@_out_option("run directory (default: runs/<time>-<name>)")
@click.option("--quiet", is_flag=True, help="no progress bar")
@_broker_option("processes engine: use this MQTT broker instead of the orchestrator's embedded one")
@click.option(
    "--reference",
    type=click.Choice(["allreduce", "none"]),
    default="allreduce",
    show_default=True,
    help="also run an all-reduce reference with the same budget and compare",
)
@_force_option
@click.option(
    "--resume",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    metavar="RUN_DIR",
    help="continue the interrupted run in RUN_DIR from its last checkpoint (either engine)",
)
@_insecure_option
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
) -> None:
    """Run n peers on this host and print the final table (next to an all-reduce reference).

    The default engine, processes, runs the real system: an orchestrator (with an embedded MQTT
    broker unless --broker is given) and n peer processes exchanging tensors over gRPC on
    loopback. The vectorized engine trains all n replicas batched in this process."""
    from concord.core.config import load_config, reference_config

    if resume is not None and (config is not None or overrides or out is not None or force):
        _fail("--resume continues RUN_DIR with its own config.toml: give no CONFIG, --set, --out")
    if resume is not None:
        try:
            cfg = load_config(resume / "config.toml", [], environ={})
        except (ConfigError, FileNotFoundError) as exc:
            _fail(str(exc))
    else:
        cfg = _run_config(config, overrides, extra=[f"engine={engine}"] if engine else [])
    if resume is not None and engine is not None and engine != cfg.engine:
        _fail(f"--resume continues RUN_DIR in its own engine ({cfg.engine}); drop --engine")
    from rich.console import Console

    from concord.lab.report import compare_table, final_table
    from concord.runtime.rundir import default_run_dir

    def run(c: RunConfig, d: Path) -> dict[str, Any]:
        if c.engine == "processes":
            from concord.sim.processes import run_processes

            if resume is not None and d != resume:  # the reference run of a resumed run
                if (d / "summary.json").is_file():
                    return dict(json.loads((d / "summary.json").read_text(encoding="utf-8")))
                shutil.rmtree(d, ignore_errors=True)  # interrupted too: run it again
            resuming = resume is not None and d == resume
            return run_processes(c, d, progress=not quiet, broker=broker, resume=resuming)
        from concord.sim.engine import run as run_vectorized

        if resume is not None and (d == resume or (d / "summary.json").is_file()):
            return run_vectorized(c, d, progress=not quiet, resume=True)
        return run_vectorized(c, d, progress=not quiet)

    run_dir = resume or out or default_run_dir(cfg)
    if resume is None:
        _prepare_out(run_dir, force, dirs=True)
    try:
        summary = run(cfg, run_dir)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        _fail(str(exc))
    console = Console()
    if not console.is_terminal:  # pipes and CI logs: wide enough for the comparison table
        console = Console(width=120)
    console.print(final_table(summary))
    if reference != "none" and cfg.algorithm != reference:
        try:
            ref_cfg = reference_config(cfg, reference)
        except ConfigError as exc:
            _fail(f"reference run ({reference}): {exc}")
        if not quiet:
            console.print(f"reference run: {reference}, same data, model, seed and steps")
        try:
            ref = run(ref_cfg, run_dir / "reference")
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            _fail(f"reference run: {exc}")
        console.print(
            compare_table(
                [{**ref, "label": reference}, {**summary, "label": _label(cfg)}],
                title="Final accuracy next to the reference (Δ vs the first row)",
            )
        )
    console.print(f"run directory: {summary['run_dir']}")


@main.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--plans",
    default="dec-phase-1",
    show_default=True,
    help="comma-separated plans (rows), e.g. dec-phase-1,dec-phase-2",
)
@click.option(
    "--factors",
    default="none,0.5,0.25",
    show_default=True,
    help="comma-separated target factors (columns); 'none' = uncontrolled",
)
@click.option("--topologies", default=None, help="comma-separated topologies (default: config's)")
@click.option("--seeds", default=None, help="comma-separated seeds (default: 0; a preset's own)")
@click.option("--baseline", "baselines", multiple=True, help="baseline rows, e.g. allreduce")
@click.option(
    "--control-mode",
    type=click.Choice(["constant", "adaptive"]),
    default="constant",
    show_default=True,
    help="how numeric factors set targets",
)
@click.option("--jobs", type=click.IntRange(min=1), default=None, help="parallel runs")
@click.option(
    "--metric",
    type=click.Choice(["avg", "worst", "mean"]),
    default="avg",
    show_default=True,
    help="accuracy reported in the table",
)
@_set_option
@_out_option("directory of the sweep's runs, table and report")
@click.option(
    "--preset",
    default=None,
    metavar="NAME",
    help="a named reproduction grid with its own report (see --list-presets); --jobs default 1",
)
@click.option("--list-presets", is_flag=True, help="list the presets and exit")
@click.option("--tune", is_flag=True, help="preset: run each row's lr grid at the tune seed")
@click.option(
    "--report-only", is_flag=True, help="preset: rewrite the report of a finished --out sweep"
)
@click.option("--resume", is_flag=True, help="preset: reuse the finished runs in --out")
@click.option("--rows", "preset_rows", default=None, help="preset: only these row keys (a,b)")
@click.option("--columns", "preset_columns", default=None, help="preset: only these column keys")
def sweep(
    config: Path | None,
    plans: str,
    factors: str,
    topologies: str | None,
    seeds: str | None,
    baselines: Sequence[str],
    control_mode: str,
    jobs: int | None,
    metric: str,
    overrides: Sequence[str],
    out: Path | None,
    preset: str | None,
    list_presets: bool,
    tune: bool,
    report_only: bool,
    resume: bool,
    preset_rows: str | None,
    preset_columns: str | None,
) -> None:
    """Run a grid (plans × factors × topologies × seeds) and print a Table-2-shaped summary.

    With --preset NAME: run a named grid of algorithm setups × data settings × seeds and write
    report.md, table.csv and PNG plots into --out.

    Exit 0: every run succeeded; 1: one run or more failed (the tables are written all the same,
    each run's error in table.csv and its error.txt); 2: bad input, nothing ran."""
    from concord.core.config import load_config
    from concord.lab.sweep import sweep_main

    if list_presets or preset is not None:
        _sweep_preset(
            preset,
            list_presets,
            config,
            seeds,
            jobs,
            overrides,
            out,
            (tune, report_only, resume),
            (_keys(preset_rows), _keys(preset_columns)),
        )
        return
    seeds = "0" if seeds is None else seeds
    try:
        cfg = load_config(config, list(overrides))
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ConfigError as exc:
        _fail(str(exc))
    except ValueError:
        _fail(f"--seeds must be comma-separated integers; got {seeds!r}")
    topo_list = [t.strip() for t in topologies.split(",")] if topologies else [cfg.topology]
    try:
        swept = sweep_main(
            config_path=config,
            overrides=list(overrides),
            plans=[p.strip() for p in plans.split(",") if p.strip()],
            factors=[f.strip() for f in factors.split(",") if f.strip()],
            topologies=topo_list,
            seeds=seed_list,
            baselines=list(baselines),
            jobs=jobs,
            out_dir=out,
            metric=metric,
            control_mode=control_mode,
        )
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    _exit_if_runs_failed(swept)


def _exit_if_runs_failed(out: Path) -> None:
    """Exit 1 naming the failed runs of the sweep in ``out``, if any (`concord.lab.sweep`)."""
    from concord.lab.sweep import read_failures

    table = out / "table.csv"  # a --resume with nothing left to run may have none
    if table.is_file() and (message := read_failures(table).message()) is not None:
        _fail(message, 1)


def _keys(text: str | None) -> list[str] | None:
    return None if text is None else [k.strip() for k in text.split(",") if k.strip()]


def _sweep_preset(
    name: str | None,
    list_only: bool,
    config: Path | None,
    seeds: str | None,
    jobs: int | None,
    overrides: Sequence[str],
    out: Path | None,
    flags: tuple[bool, bool, bool],
    subset: tuple[list[str] | None, list[str] | None],
) -> None:
    from concord.lab.presets import list_presets, preset_main

    tune, report_only, resume = flags
    if list_only or name is None:
        for preset_name, title in list_presets():
            click.echo(f"{preset_name:<20}  {title}")
        return
    if config is not None:
        _fail("--preset defines its own configuration; use --set KEY=VALUE instead of a CONFIG")
    if (report_only or resume) and out is None:
        _fail("--report-only and --resume need --out, the directory of the sweep")
    try:
        seed_list = None if seeds is None else [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        _fail(f"--seeds must be comma-separated integers; got {seeds!r}")
    try:
        swept = preset_main(
            name,
            seeds=seed_list,
            jobs=jobs,
            out_dir=out,
            overrides=list(overrides),
            tune=tune,
            report_only=report_only,
            resume=resume,
            rows=subset[0],
            columns=subset[1],
        )
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    if not report_only:
        _exit_if_runs_failed(swept)


@main.command()
@click.option(
    "--config",
    "config",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="the run's TOML config",
)
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
@_broker_option(
    "follow the orchestrator on this MQTT broker (default: orchestrator.broker; "
    "unset: static mode, network.addresses)"
)
@click.option(
    "--run-id",
    default=None,
    help="control-plane run id, the orchestrator's (default: the config's name; with a broker "
    "one of the two is required)",
)
@_set_option
@_out_option("run directory (default: runs/peer-<id>)")
@_force_option
@_resume_step_option
@_log_format_option
@_metrics_option
@_insecure_option
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
    extra = _telemetry(log_format, metrics_listen)
    cfg = _run_config(config, overrides, broker=broker, extra=extra)
    try:
        identity = resolve_identity(peer_id, os.environ, socket.gethostname(), cfg.peers)
    except LauncherError as exc:
        _fail(str(exc))
    peer_id = identity.peer_id
    if cfg.orchestrator.broker is not None and run_id is None and not cfg.name:
        _fail(
            "a peer that follows an orchestrator needs the run's id: set 'name' in the config "
            "(the same file the orchestrator runs) or pass --run-id (the orchestrator logs its "
            "id and writes it to orchestrator.json)"
        )
    run_dir = out or Path("runs") / f"peer-{peer_id}"
    # a peer started again with the same command on its interrupted run rejoins it: a static
    # peer from its checkpoint (or a neighbour's parameters), an orchestrated one where the
    # orchestrator re-admits it; a completed run's directory is refused as before
    summary = run_dir / "summary.json"
    started = (run_dir / "checkpoint.pt").is_file() or (run_dir / "metrics.jsonl").is_file()
    resuming = (
        not force
        and started
        and not (summary.is_file() and json.loads(summary.read_text()).get("completed"))
    )
    if resume_step is not None and force:
        _fail("--resume-step continues the run in --out: --force would delete it")
    if not resuming and resume_step is None:
        _prepare_out(run_dir, force)
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
        _fail(str(exc))
    sys.exit(code)


@main.command()
@click.option(
    "--config",
    "config",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="the run's TOML config (the same file the peers run)",
)
@_broker_option("MQTT broker (default: orchestrator.broker; unset: embed one on 127.0.0.1)")
@click.option(
    "--run-id",
    default=None,
    help="control-plane run id (default: the config's name; neither: a fresh <concord>-<8 hex>)",
)
@_set_option
@_out_option("directory for the manifest, metrics and logs (default: runs/orchestrator)")
@_force_option
@_resume_step_option
@_log_format_option
@_metrics_option
@_insecure_option
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

    extra = _telemetry(log_format, metrics_listen)
    cfg = _run_config(config, overrides, broker=broker, extra=extra, code=1)
    try:
        rid = run_id or cfg.name or _fresh_run_id(cfg)
        Topics(rid)
        if run_id is None and not cfg.name:
            click.echo(f"run id: {rid} (peers join with --run-id {rid})", err=True)
        run_dir = out or Path("runs") / "orchestrator"
        if resume_step is None:
            _prepare_out(run_dir, force)
        code = run_orchestrator(cfg, run_dir, broker=None, run_id=rid, resume_step=resume_step)
    except (ConfigError, OrchestratorError, ValueError, OSError) as exc:
        _fail(str(exc), 1)
    sys.exit(code)


@main.group()
def partition() -> None:
    """Inspect a run's data partition (which samples each peer trains on)."""


@partition.command("show")
@click.argument("config", required=False, type=click.Path(dir_okay=False, path_type=Path))
@_set_option
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
    cfg = _run_config(config, overrides)
    from concord.core.plugins import PluginError
    from concord.errors import ConcordError
    from concord.lab.partition_show import build_view, table_lines, write_heatmap

    try:
        view = build_view(cfg)
    except (ConcordError, PluginError, ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    for line in table_lines(view):
        click.echo(line)
    try:
        write_heatmap(view, png)
    except OSError as exc:
        _fail(f"--png {png}: {exc}")
    click.echo(f"heat map: {png}")


@main.group()
def certs() -> None:
    """mTLS material: a run CA and per-peer certificates (network.tls in the run config)."""


@certs.command("init")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
)
@click.option("--run-id", default="concord", show_default=True)
@click.option("--days", type=click.IntRange(min=1), default=365, show_default=True)
@click.option("--force", is_flag=True, help="replace an existing CA")
def certs_init(directory: Path, run_id: str, days: int, force: bool) -> None:
    """Create the run CA (ca.key 0600, ca.crt) and the orchestrator's signing key and
    certificate (orchestrator.key 0600, orchestrator.crt)."""
    from concord.peer.certs import CertError, init_ca, issue_orchestrator

    try:
        files = init_ca(directory, run_id=run_id, days=days, overwrite=force)
        orchestrator = issue_orchestrator(directory, days=days)
    except CertError as exc:
        _fail(str(exc))
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
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="IP or DNS name the peer is reached at (repeatable; default 127.0.0.1, localhost)",
)
@click.option("--days", type=click.IntRange(min=1), default=365, show_default=True)
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
        _fail("give exactly one of --peer ID and --orchestrator")
    if for_orchestrator and hosts:
        _fail("--host is for peers: the orchestrator's certificate names no host")
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
        _fail(str(exc))
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
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
)
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
        _fail(str(exc))
    for line in lines:
        click.echo(line)


@certs.command("broker")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("certs"),
    show_default=True,
)
@click.option("--run-id", required=True, help="the run whose topics the ACL covers")
@click.option("--peers", type=click.IntRange(min=1), required=True)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="IP or DNS name the broker is reached at (repeatable; default 127.0.0.1, localhost)",
)
@click.option("--days", type=click.IntRange(min=1), default=365, show_default=True)
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
        _fail(str(exc))
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


@main.command()
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
            _fail(f"the run in {target} has ended (its broker is gone): see {ended}", 1)
        _fail(str(exc), 1)
    except ValueError as exc:
        _fail(str(exc), 1)
    except KeyboardInterrupt:
        return
    if watch:
        return
    if as_json:
        click.echo(json.dumps(view.snapshot(), indent=2))
    else:
        Console().print(view.render())
    if not view.messages:
        _fail(f"nothing heard from run {where.run!r} at {where.broker} in {wait:g} s", 1)


@main.group("report")
def report_group() -> None:
    """Check the reports of preset sweeps (committed under docs/results/<preset>/)."""


@report_group.command("verify")
@click.argument("directories", nargs=-1, required=True, metavar="DIR[::RUN]...")
@click.option("--run", "run_name", default=None, metavar="NAME", help="a run name of the CSV")
@click.option("--row", default=None, metavar="KEY", help="the cell's row (key or label)")
@click.option("--column", default=None, metavar="KEY", help="the cell's column (key or label)")
@click.option("--seed", type=int, default=None, help="the cell's seed (default: its first)")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="directory of the re-runs (default: a fresh temporary directory); with several DIRs, "
    "one sub-directory <i>-<name> per DIR",
)
@click.option(
    "--tol",
    type=float,
    default=0.5,
    show_default=True,
    help="tolerance of the accuracies, in percentage points",
)
@click.option(
    "--count-tol",
    type=float,
    default=None,
    metavar="FRACTION",
    help="relative tolerance of gossip rounds and bytes (default: 0, exact, without consensus "
    "control; 0.1 with it, since its rounds follow the float trajectory)",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PATH",
    help="write the reproducibility record: one row per directory, run and metric (overwritten)",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="PATH",
    help="write a markdown report generated from the --csv rows (needs --csv; overwritten)",
)
@click.pass_context
def report_verify(
    ctx: click.Context,
    directories: tuple[str, ...],
    run_name: str | None,
    row: str | None,
    column: str | None,
    seed: int | None,
    out: str | None,
    tol: float,
    count_tol: float | None,
    csv_path: str | None,
    markdown_path: str | None,
) -> None:
    """Re-run one cell of the report in each DIR (table.csv, or consensus-control's runs.csv)
    with its recorded configuration and compare accuracy, worst peer, gossip rounds and bytes
    with the committed values; also compare the recorded torch, CPU and threads with this
    machine's (float results are machine-dependent). Default cell: the CSV's first run that
    succeeded; DIR::RUN picks the run RUN of DIR; --run, or --row/--column/--seed, only with a
    single DIR. --csv and --markdown write a reproducibility record of all the cells.
    Exit 0: every metric within tolerance; 1: a metric differs; 2: bad input."""
    from click.core import ParameterSource

    from concord.lab.verify import VerifyError, command_line, parse_directories, verify_reports

    given = [
        (option, value)
        for option, name, value in (
            ("--run", "run_name", run_name),
            ("--row", "row", row),
            ("--column", "column", column),
            ("--seed", "seed", seed),
            ("--out", "out", out),
            ("--tol", "tol", tol),
            ("--count-tol", "count_tol", count_tol),
            ("--csv", "csv_path", csv_path),
            ("--markdown", "markdown_path", markdown_path),
        )
        if value is not None and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    ]
    try:
        choices = parse_directories(directories, run=run_name, row=row, column=column, seed=seed)
        code = verify_reports(
            choices,
            out=out,
            tol=tol,
            count_tol=count_tol,
            csv_path=csv_path,
            markdown_path=markdown_path,
            command=command_line(directories, given),
            echo=click.echo,
        )
    except VerifyError as exc:
        _fail(str(exc))
    sys.exit(code)


main.add_command(config_group)
main.add_command(compose_cmd)
main.add_command(k8s_cmd)

if __name__ == "__main__":
    main()
