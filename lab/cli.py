"""The ``concord`` command: the group, its global options, and where every command is
registered (`COMMANDS`; each command's module holds its declaration and its work).

Sub-commands import their heavy dependencies lazily: ``concord topology`` and (later) the
orchestrator never import torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import click

from concord.lab.cli_certs import certs
from concord.lab.cli_inspect import partition, status, topology
from concord.lab.cli_net import net_group
from concord.lab.cli_run import orchestrator, peer, sim
from concord.lab.cli_sweep import report_group, sweep
from concord.lab.config_cmd import config as config_group
from concord.lab.deploy_cli import compose_cmd, k8s_cmd
from concord.lab.records_cmd import records


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


# every command and command group of `concord` (its help lists them alphabetically)
COMMANDS: tuple[click.Command, ...] = (
    # runs
    sim,
    peer,
    orchestrator,
    sweep,
    report_group,
    # looking at things
    topology,
    partition,
    status,
    config_group,
    records,
    # emulated networks
    net_group,
    # deployment
    certs,
    compose_cmd,
    k8s_cmd,
)
for command in COMMANDS:
    main.add_command(command)

if __name__ == "__main__":
    main()
