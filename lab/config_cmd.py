"""``concord config``: show the resolved configuration, its JSON Schema, or its reference.

* ``concord config show [--set key=value …] [CONFIG_FILE]`` — defaults → file → ``CONCORD_*``
  environment → ``--set``, resolved and printed as TOML (the file a run directory keeps as
  ``config.toml``);
* ``concord config schema`` — the JSON Schema of `concord.core.config.RunConfig`;
* ``concord config doc`` — the Markdown reference committed as ``docs/configuration.md``.

Torch-free, like the config itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from concord.core.config import ConfigError, RunConfig, load_config, to_toml
from concord.lab.configdoc import render_markdown


@click.group("config")
def config() -> None:
    """Inspect the run configuration: resolved values, JSON Schema, reference."""


@config.command("show")
@click.argument("config_file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="config override")
def show(config_file: Path | None, overrides: Sequence[str]) -> None:
    """Print the resolved configuration as TOML (every key, defaults filled in)."""
    try:
        cfg = load_config(config_file, list(overrides))
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(to_toml(cfg), nl=False)


@config.command("schema")
def schema() -> None:
    """Print the JSON Schema of the run configuration."""
    click.echo(json.dumps(RunConfig.model_json_schema(), indent=2, ensure_ascii=False))


@config.command("doc")
def doc() -> None:
    """Print the configuration reference (Markdown, as in docs/configuration.md)."""
    click.echo(render_markdown(), nl=False)
