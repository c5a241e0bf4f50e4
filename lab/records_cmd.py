"""``concord records``: the JSON Schema of a run's records, for tools that read run directories.

* ``concord records schema [KIND] [--out FILE]`` — the JSON Schema of one record kind
  (`concord.core.records.RECORD_KINDS`: step, eval, summary, peer-summary, checkpoint, manifest,
  orchestrator, control-checkpoint, calibration), or of every kind (``{"kind": schema, …}``)
  without KIND. Generated from the declared record types; docs/records.md describes the fields.

Torch-free, like the records themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from concord.core.records import JSON, RECORD_KINDS, record_schema


@click.group("records")
def records() -> None:
    """Run records (metrics lines, summaries, manifests, checkpoints): their JSON Schema."""


@records.command("schema")
@click.argument("kind", required=False, type=click.Choice(sorted(RECORD_KINDS)))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="write the schema to this file instead of standard output",
)
def records_schema(kind: str | None, out: Path | None) -> None:
    """Print the JSON Schema of record KIND (every kind, by name, without KIND)."""
    schema: dict[str, JSON] = (
        record_schema(kind) if kind else {name: record_schema(name) for name in RECORD_KINDS}
    )
    text = json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
    if out is None:
        click.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
