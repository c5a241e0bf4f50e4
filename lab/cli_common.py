"""What the ``concord`` commands share: the error exit, the options several commands take (one
definition, one help text), the run config of a command line and the run directory's guard.

Heavy imports happen inside the functions: loading a command module stays cheap and torch-free.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from concord.core.config import ConfigError, RunConfig

F = TypeVar("F", bound=Callable[..., Any])


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying ``decorators`` (as if stacked in this order): an option block
    several commands share."""

    def apply(f: F) -> F:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code`` (2: bad input)."""
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


def prepare_out(out: Path, force: bool, *, dirs: bool = False) -> None:
    """Refuse a run directory that holds an earlier run's files (they would be read as this
    run's), unless ``force``: then remove those files first (nothing else in it). ``dirs``: the
    launcher's sub-directories count too (``concord sim``; the orchestrator it starts shares the
    run directory with the launcher's ``logs/``)."""
    found = [n for n in _RUN_FILES if (out / n).exists()]
    found += [f"{n}/" for n in _RUN_DIRS if dirs and (out / n).is_dir()]
    if not found:
        return
    if not force:
        fail(
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


# Options several commands share (one definition, one help text)
set_option = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="override a config key, e.g. --set control.factor=0.5 (repeatable)",
)
force_option = click.option(
    "--force", is_flag=True, help="replace the earlier run in --out (default: refuse to reuse it)"
)
# the launcher's (`concord sim --resume`): every process continues after the same step
resume_step_option = click.option(
    "--resume-step",
    type=click.IntRange(min=0),
    default=None,
    hidden=True,
    help="continue the interrupted run in --out after this checkpoint step (concord sim --resume)",
)


# the long-running processes' (`concord peer`, `concord orchestrator`): what operators see
log_format_option = click.option(
    "--log-format",
    type=click.Choice(["text", "json", "none"]),
    default="text",
    show_default=True,
    envvar="CONCORD_LOG_FORMAT",
    help="also log to stderr (docker/kubectl logs): human-readable lines, log.jsonl's JSON "
    "lines, or nothing; log.jsonl in --out has every line either way",
)
metrics_option = click.option(
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


insecure_option = click.option(
    "--insecure",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_accept_insecure,
    help="accept an open network without protection (network.insecure = true): listening "
    "beyond loopback without [network.tls], or a broker beyond loopback with neither "
    "credentials nor signing (refused otherwise; warned on stderr and in log.jsonl)",
)


def telemetry(log_format: str, metrics_listen: str | None) -> list[str]:
    """Apply ``--log-format`` to this process (undone when the command ends: a test's
    in-process invocation leaves nothing behind) and return ``--metrics-listen`` as a config
    override."""
    from concord.runtime.logs import set_console_format

    set_console_format(log_format)
    click.get_current_context().call_on_close(lambda: set_console_format("none"))
    return [] if metrics_listen is None else [f"metrics.listen={metrics_listen}"]


def broker_option(help: str) -> Callable[[F], F]:
    return click.option("--broker", default=None, metavar="mqtt[s]://HOST:PORT", help=help)


def out_option(help: str) -> Callable[[F], F]:
    return click.option(
        "--out", type=click.Path(file_okay=False, path_type=Path), default=None, help=help
    )


def process_options(out_help: str) -> Callable[[F], F]:
    """The options of the long-running processes (``concord peer``, ``concord orchestrator``):
    --set, --out (``out_help``), --force, --resume-step, --log-format, --metrics-listen and
    --insecure."""
    return options(
        set_option,
        out_option(out_help),
        force_option,
        resume_step_option,
        log_format_option,
        metrics_option,
        insecure_option,
    )


def run_config(
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
        fail(str(exc), code)
