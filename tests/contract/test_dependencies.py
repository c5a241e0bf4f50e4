"""Every import is of a declared dependency (pyproject.toml), read from the code itself.

Each ``import`` statement (including those inside functions) of every file is mapped to the
distribution that provides it (`importlib.metadata.packages_distributions`) and must be declared:

* production code (the folders that install as ``concord.*``): a main dependency; a package of a
  user-facing extra (``broker``, ``sklearn``) only behind a lazy import — inside a function or under
  ``TYPE_CHECKING`` — so that ``import concord.…`` works without the extra;
* tests, benchmarks and scripts: a main dependency or any extra (``dev`` included).

Standard-library modules (`sys.stdlib_module_names`) and our own (``concord``, ``tests``, ``bench``)
need nothing. A package that is installed only because something else depends on it is undeclared:
it can vanish with the next release of that something else.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
PRODUCTION = tuple(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
DEVELOPMENT = ("tests", "bench", "scripts")
FIRST_PARTY = {"concord", "tests", "bench"}
DEV_EXTRAS = {"dev"}  # extras for working on Concord, not for using it


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> tuple[str, set[str]]:
    """(normalised name, extras) of a PEP 508 requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?", requirement)
    assert match, f"unparseable requirement {requirement!r}"
    extras = {e.strip() for e in (match[2] or "").split(",") if e.strip()}
    return normalize(match[1]), extras


@dataclass(frozen=True)
class Declared:
    main: frozenset[str]
    extras: dict[str, frozenset[str]]

    @classmethod
    def from_project(cls, project: dict[str, object]) -> Declared:
        me = normalize(str(project["name"]))
        raw_extras = project.get("optional-dependencies", {})
        assert isinstance(raw_extras, dict)

        def names(requirements: Iterable[str], seen: frozenset[str] = frozenset()) -> set[str]:
            out: set[str] = set()
            for req in requirements:
                name, extras = requirement_name(req)
                if name != me:
                    out.add(name)
                    continue
                for extra in extras - seen:  # a self-reference: concord[broker]
                    out |= names(raw_extras[extra], seen | {extra})
            return out

        deps = project.get("dependencies", [])
        assert isinstance(deps, list)
        return cls(
            main=frozenset(names(deps)),
            extras={k: frozenset(names(v, frozenset({k}))) for k, v in raw_extras.items()},
        )

    def allowed(self, scope: str, lazy: bool) -> frozenset[str]:
        if scope == "development":
            return self.main.union(*self.extras.values())
        if lazy:
            return self.main.union(*(v for k, v in self.extras.items() if k not in DEV_EXTRAS))
        return self.main


DECLARED = Declared.from_project(PROJECT)


@cache
def distributions_of(top: str) -> tuple[str, ...]:
    return tuple(normalize(d) for d in importlib.metadata.packages_distributions().get(top, ()))


def distribution_of(module: str) -> str | None:
    """The distribution that installs ``module`` (None: not installed). A namespace package shared
    by several distributions (``google``) is resolved by which of them holds the module's files."""
    top = module.partition(".")[0]
    dists = distributions_of(top)
    if len(set(dists)) <= 1:
        return dists[0] if dists else None
    prefix = module.replace(".", "/")
    for dist in dict.fromkeys(dists):
        files = importlib.metadata.distribution(dist).files or ()
        if any(str(f).startswith((prefix + "/", prefix + ".")) for f in files):
            return dist
    return dists[0]


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def imports(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(absolute module name, line, lazy) for every import in the file; relative ones skipped.

    Lazy: inside a function body or an ``if TYPE_CHECKING:`` block (not run on import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

    def visit(node: ast.AST, lazy: bool) -> Iterator[tuple[str, int, bool]]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, lazy
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, node.lineno, lazy
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if _is_type_checking(node):
            assert isinstance(node, ast.If)
            for child in node.body:
                yield from visit(child, True)
            for child in node.orelse:
                yield from visit(child, inner)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(tree, False)


def undeclared(files: Iterable[Path], scope: str, declared: Declared = DECLARED) -> list[str]:
    """One line per import of a third-party module that ``declared`` does not cover."""
    problems = []
    for path in files:
        for module, line, lazy in imports(path):
            top = module.partition(".")[0]
            if top in sys.stdlib_module_names or top in FIRST_PARTY:
                continue
            where = f"{path}:{line}: import {module}"
            dist = distribution_of(module)
            if dist is None:
                problems.append(f"{where}: no installed distribution provides {top!r}")
            elif dist not in declared.allowed(scope, lazy):
                extras = sorted(k for k, v in declared.extras.items() if dist in v)
                if extras and scope == "production" and set(extras) - DEV_EXTRAS and not lazy:
                    hint = f"in extra(s) {extras}: import it lazily (inside the function using it)"
                elif extras and scope == "production":
                    hint = f"only in extra(s) {extras}; production code needs a main dependency"
                else:
                    hint = "declare it in pyproject.toml"
                problems.append(f"{where}: distribution {dist!r} is not declared ({hint})")
    return problems


def python_files(folders: Iterable[str]) -> list[Path]:
    return sorted(
        p
        for folder in folders
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
        # generated by protoc; they import only grpc and google.protobuf, both main dependencies
        and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    )


# ---------------------------------------------------------------- the contract


def test_production_imports_are_main_dependencies() -> None:
    files = python_files(PRODUCTION)
    assert len(files) > 50, "the production folders were not found"
    assert undeclared(files, "production") == []


def test_test_bench_and_script_imports_are_declared() -> None:
    files = python_files(DEVELOPMENT)
    assert len(files) > 20
    assert undeclared(files, "development") == []


def test_generated_protos_import_only_main_dependencies() -> None:
    generated = sorted((ROOT / "protos").glob("*_pb2*.py"))
    assert generated
    assert undeclared(generated, "production") == []


def test_the_all_extra_is_every_user_extra() -> None:
    users = {k: v for k, v in DECLARED.extras.items() if k not in DEV_EXTRAS | {"all"}}
    assert set(users) >= {"broker", "sklearn"}
    assert DECLARED.extras["all"] == frozenset().union(*users.values())


def test_heavy_optional_packages_are_not_main_dependencies() -> None:
    assert "amqtt" not in DECLARED.main
    assert "scikit-learn" not in DECLARED.main
    assert DECLARED.extras["broker"] == {"amqtt"}


def test_grpcio_tools_is_pinned_to_the_generator_of_the_committed_code() -> None:
    """The committed modules record the grpc version that made them; the dev extra pins that
    grpcio-tools so that scripts/gen-protos (and test_protos_fresh) reproduce them."""
    text = (ROOT / "protos" / "data_plane_pb2_grpc.py").read_text(encoding="utf-8")
    match = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", text)
    assert match
    pins = [r for r in PROJECT["optional-dependencies"]["dev"] if r.startswith("grpcio-tools")]
    assert pins == [f"grpcio-tools=={match[1]}"]
    assert importlib.metadata.version("grpcio-tools") == match[1]


# ---------------------------------------------------------------- the checker catches what it must


def _plant(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source, encoding="utf-8")
    return path


def test_checker_reports_a_planted_undeclared_import(tmp_path: Path) -> None:
    # paho-mqtt and pygments are installed (as dependencies of aiomqtt and rich) but not declared
    planted = _plant(tmp_path, "planted.py", "import os\nimport paho.mqtt.client\n")
    problems = undeclared([planted], "production")
    assert len(problems) == 1
    assert "'paho-mqtt' is not declared" in problems[0]
    assert "planted.py:2" in problems[0]
    assert len(undeclared([planted], "development")) == 1
    nested = _plant(tmp_path, "nested.py", "def f():\n    from pygments import lexers\n")
    assert len(undeclared([nested], "production")) == 1
    missing = _plant(tmp_path, "missing.py", "import concord_no_such_module_xyz\n")
    assert "no installed distribution" in undeclared([missing], "development")[0]


def test_checker_applies_the_extra_and_dev_rules(tmp_path: Path) -> None:
    eager = _plant(tmp_path, "eager.py", "import amqtt.broker\n")
    lazy = _plant(tmp_path, "lazy.py", "def f():\n    from amqtt.broker import Broker\n")
    typing_only = _plant(
        tmp_path,
        "typing_only.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import amqtt\n",
    )
    dev_only = _plant(tmp_path, "dev_only.py", "import yaml\n")
    fine = _plant(
        tmp_path,
        "fine.py",
        "from __future__ import annotations\nimport torch.nn\nfrom concord.core import config\n"
        "from . import sibling\n",
    )
    assert "import it lazily" in undeclared([eager], "production")[0]
    assert undeclared([lazy, typing_only, fine], "production") == []
    assert "only in extra(s) ['dev']" in undeclared([dev_only], "production")[0]
    assert undeclared([eager, dev_only, fine], "development") == []


def test_declared_sets_follow_self_referencing_extras() -> None:
    project = {
        "name": "concord",
        "dependencies": ["numpy>=1"],
        "optional-dependencies": {
            "a": ["Foo_Bar>=1"],
            "b": ["concord[a]", "baz; python_version>'3'"],
        },
    }
    declared = Declared.from_project(project)
    assert declared.main == {"numpy"}
    assert declared.extras["b"] == {"foo-bar", "baz"}


# ---------------------------------------------------------------- optional extras at run time


def test_embedded_broker_without_amqtt_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from concord.orchestrator.broker import BrokerUnavailableError, EmbeddedBroker

    monkeypatch.setitem(sys.modules, "amqtt", None)  # None in sys.modules: the import fails
    monkeypatch.setitem(sys.modules, "amqtt.broker", None)
    with pytest.raises(BrokerUnavailableError) as info:
        asyncio.run(EmbeddedBroker().start())
    message = str(info.value)
    assert "pip install 'concord[broker]'" in message
    assert "--broker" in message
    assert "orchestrator.broker" in message
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, RuntimeError)  # an OrchestratorError, which the CLI reports


def test_orchestrator_imports_without_the_optional_extras() -> None:
    """amqtt and scikit-learn are needed only when used: importing the orchestrator and the data
    layer must not touch them (checked in a fresh interpreter where they cannot be imported)."""
    code = (
        "import sys\n"
        "for m in ('amqtt', 'sklearn'): sys.modules[m] = None\n"
        "import concord.orchestrator.app, concord.orchestrator.broker, concord.core.data\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
