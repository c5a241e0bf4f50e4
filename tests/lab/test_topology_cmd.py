"""``concord topology --help`` lists every topology name and the ``file:PATH`` format, and the
help's example edge list is one the loader accepts."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from concord.core.graphs.topology import TOPOLOGY_NAMES
from concord.lab.cli import main


def _help() -> str:
    result = CliRunner().invoke(main, ["topology", "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_help_lists_every_topology_and_the_file_format() -> None:
    text = _help()
    flat = " ".join(text.split())  # names may wrap onto the next line
    for name in (*TOPOLOGY_NAMES, "exponential:K", "file:PATH"):
        assert name in flat, name
    assert "i j w" in text
    assert "W[i,j] = W[j,i] = w in (0, 1]" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_helps_example_edge_list_loads(tmp_path: Path) -> None:
    lines = _help().splitlines()
    start = next(i for i, line in enumerate(lines) if "Example" in line) + 1
    example = []
    for line in lines[start:]:
        if not line.strip() or not line.strip()[0].isdigit():
            break
        example.append(line.strip())
    assert len(example) == 5
    path = tmp_path / "ring-chord.txt"
    path.write_text("\n".join(example) + "\n")
    result = CliRunner().invoke(main, ["topology", f"file:{path}", "--peers", "4", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["edges"] == 5
    assert info["max_degree"] == 3
    weighted = tmp_path / "weighted.txt"  # the 'i j w' form, commas and a comment
    weighted.write_text("0,1,0.5  # half\n1 2 0.5\n2 3 0.5\n3 0 0.5\n")
    result = CliRunner().invoke(main, ["topology", f"file:{weighted}", "-n", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["weights"] == "file"
