"""Package boundaries (DESIGN.md): core is sans-io; the orchestrator's core modules are
torch-free."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_CORE = ("grpc", "aiomqtt", "amqtt", "protos", "peer", "orchestrator", "sim")


def _imports_of(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "core").rglob("*.py")), ids=lambda p: p.name)
def test_core_never_imports_io_packages(path: Path) -> None:
    bad = _imports_of(path) & set(FORBIDDEN_IN_CORE)
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize(
    "module",
    [
        "core.topology",
        "core.mixing",
        "core.plan",
        "core.control",
        "core.config",
        "protos.control_plane",
        "orchestrator.broker",
        "protos.mqtt",
    ],
)
def test_orchestrator_side_core_modules_do_not_import_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} pulls in torch"


def test_cli_topology_does_not_import_torch() -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom sim.cli import main\n"
        "r = CliRunner().invoke(main, ['topology', 'ring', '--peers', '8', '--json'])\n"
        "assert r.exit_code == 0, r.output\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
