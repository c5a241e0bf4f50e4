"""The house's rules, read from the code's own imports (every ``import`` statement of every file of
the production packages, including those inside functions and under ``TYPE_CHECKING``).

* Layers import only downwards (docs/architecture.md): ``core`` is sans-io and imports no other
  layer; ``protos`` imports nothing of ours but ``core``'s torch-free config; the orchestrator never
  imports torch (one module on demand, inside a function: `TORCH_ON_DEMAND`); ``sim`` holds no
  harness code.
* No import circles between files: a cycle would make two modules one unit in disguise.
* Modules the orchestrator loads do not pull in torch (checked in a fresh interpreter).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# installed name -> folder of the repository (pyproject.toml's package-dir)
LAYERS = {
    "concord": "concord",
    "concord.core": "core",
    "concord.protos": "protos",
    "concord.runtime": "runtime",
    "concord.peer": "peer",
    "concord.orchestrator": "orchestrator",
    "concord.sim": "sim",
    "concord.lab": "lab",
}
# which layers each layer may import (besides itself)
ALLOWED = {
    "concord.core": set(),
    "concord.protos": {"concord.core"},
    "concord.runtime": {"concord.core"},
    "concord.peer": {"concord.core", "concord.protos", "concord.runtime"},
    "concord.orchestrator": {"concord.core", "concord.protos", "concord.runtime"},
    "concord.sim": {
        "concord.core",
        "concord.protos",
        "concord.runtime",
        "concord.peer",
        "concord.orchestrator",
    },
    "concord.lab": set(LAYERS) - {"concord", "concord.lab"},
    # the root package: the public API (lazy re-exports of the layers below)
    "concord": set(LAYERS) - {"concord"},
}
IO_PACKAGES = {"grpc", "aiomqtt", "amqtt", "msgpack", "google"}
HARNESS_WORDS = ("cli", "sweep", "preset", "report", "plot")


def modules() -> dict[str, Path]:
    """Every production module by its installed dotted name."""
    found: dict[str, Path] = {}
    for package, folder in LAYERS.items():
        base = ROOT / folder
        paths = base.glob("*.py") if package == "concord" else base.rglob("*.py")
        for path in paths:
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = path.relative_to(base).with_suffix("").parts
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            found[".".join((package, *parts))] = path
    return found


MODULES = modules()


def imports_of(path: Path, name: str) -> Iterator[str]:
    """Dotted names imported by the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                # `from pkg import mod` imports the module pkg.mod when there is one
                sub = f"{module}.{alias.name}"
                yield sub if sub in MODULES else module


def resolve(imported: str) -> str | None:
    """The production module a dotted import lands in (the longest known prefix)."""
    parts = imported.split(".")
    for k in range(len(parts), 0, -1):
        candidate = ".".join(parts[:k])
        if candidate in MODULES:
            return candidate
    return None


# leaf modules of the root package (version, exceptions): every layer may import them and they
# import nothing of ours
BASE = {"concord.version", "concord.errors"}


def layer_of(module: str) -> str:
    if module in BASE:
        return "base"
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = {resolve(i) for i in imports_of(path, name)}
        edges[name] = {t for t in targets if t is not None and t != name}
    return edges


def test_the_walker_sees_the_packages() -> None:
    # guards the test itself: a walker that finds nothing would pass everything below
    assert len(MODULES) > 80
    assert "concord.core.graphs.topology" in MODULES
    assert "concord.core.config" in graph()["concord.core.control.runplan"]


@pytest.mark.parametrize("layer", sorted(set(ALLOWED) - {"concord"}))
def test_layers_import_only_downwards(layer: str) -> None:
    bad = []
    for name, targets in graph().items():
        if layer_of(name) != layer:
            continue
        for target in targets:
            other = layer_of(target)
            if other not in (layer, "base") and other not in ALLOWED[layer]:
                bad.append(f"{name} -> {target}")
    assert not bad, f"{layer} imports layers above it: {sorted(bad)}"


def test_base_modules_are_leaves() -> None:
    for name in BASE & set(MODULES):
        ours = [i for i in imports_of(MODULES[name], name) if i.split(".")[0] == "concord"]
        assert not ours, f"{name} imports {ours}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if layer_of(n) == "concord.core"))
def test_core_is_sans_io(name: str) -> None:
    roots = {i.split(".")[0] for i in imports_of(MODULES[name], name)}
    assert not roots & IO_PACKAGES, f"{name} imports {sorted(roots & IO_PACKAGES)}"


# orchestrator modules that import torch inside a function, on demand, with the reason; never at
# module level (so loading them stays torch-free; the fresh-interpreter test checks it too)
TORCH_ON_DEMAND = {
    "concord.orchestrator.store": "hosts the torch.distributed rendezvous store, only when "
    "network.transport = 'torch'",
}


def _module_level_imports(path: Path) -> Iterator[str]:
    """Modules imported by statements outside every function body."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    inside = {id(n) for f in ast.walk(tree) if isinstance(f, functions) for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.module or ""


def test_orchestrator_never_imports_torch_statically() -> None:
    bad = [
        name
        for name, path in MODULES.items()
        if layer_of(name) == "concord.orchestrator"
        and name not in TORCH_ON_DEMAND
        and any(i.split(".")[0] == "torch" for i in imports_of(path, name))
    ]
    assert not bad
    for name in TORCH_ON_DEMAND:
        top = [i for i in _module_level_imports(MODULES[name]) if i.split(".")[0] == "torch"]
        assert not top, f"{name} imports torch at module level: {top}"
        assert any(i.split(".")[0] == "torch" for i in imports_of(MODULES[name], name)), (
            f"{name} no longer imports torch: drop it from TORCH_ON_DEMAND"
        )


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path that returns to its start), or None."""
    white, grey, black = 0, 1, 2
    color = dict.fromkeys(edges, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = grey
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if color.get(nxt, black) == grey:
                return [*stack[stack.index(nxt) :], nxt]
            if color.get(nxt) == white and (found := visit(nxt)):
                return found
        stack.pop()
        color[node] = black
        return None

    for start in sorted(edges):
        if color[start] == white and (found := visit(start)):
            return found
    return None


def test_cycle_finder_finds_a_planted_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circles_between_files() -> None:
    edges = graph()
    # a package's __init__ that re-exports its modules is the package's face, not a participant:
    # the cycle `pkg/__init__ -> pkg.mod -> pkg/__init__` is the module importing its own package.
    cycle = find_cycle(edges)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_sim_holds_only_simulators() -> None:
    names = [p.stem for p in (ROOT / "sim").glob("*.py")]
    harness = [n for n in names if any(w in n for w in HARNESS_WORDS)]
    assert not harness, f"sim/ holds harness modules: {harness} (they belong in lab/)"


@pytest.mark.parametrize(
    "module",
    [
        "concord",
        "concord.core.graphs.topology",
        "concord.core.graphs.mixing",
        "concord.core.control.plan",
        "concord.core.control.controller",
        "concord.core.config",
        "concord.protos.control_plane",
        "concord.orchestrator.app",
        "concord.orchestrator.broker",
        "concord.protos.mqtt",
    ],
)
def test_orchestrator_side_modules_do_not_import_torch(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} pulls in torch"


def test_cli_topology_does_not_import_torch() -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom concord.lab.cli import main\n"
        "r = CliRunner().invoke(main, ['topology', 'ring', '--peers', '8', '--json'])\n"
        "assert r.exit_code == 0, r.output\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
