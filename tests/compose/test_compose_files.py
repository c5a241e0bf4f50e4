"""The docker compose files in ``compose/`` agree with each other, the run config and the CLI.

They are the output of ``concord compose`` for 4 peers (tests/compose/test_compose_gen.py checks
that, and runs the checks below on larger generated stacks).

There is no Docker engine in CI, so the files are checked statically: every YAML file parses;
each stack (``compose.yaml`` alone and with each overlay ``compose.*.yaml``, merged the way
compose merges them) is checked for images and builds, the Dockerfile and its build context, peer
ids against ``compose/run.toml``, service names behind ``--advertise`` and the broker URL, the
Mosquitto config, the mTLS material (made with the commands of ``compose/certs.sh`` into a
temporary directory and checked like a peer checks it) and, with the real click CLI, every
``concord`` command line. Settings the overlays add are ``CONCORD_*`` environment variables.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml  # PyYAML (an amqtt dependency)
from click.testing import CliRunner

from concord.core.config import load_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"  # the project directory: relative paths in every file resolve here
BASE = "compose.yaml"
OVERLAYS = sorted(p.name for p in COMPOSE.glob("compose.*.yaml"))
STACKS = [(BASE,), *((BASE, overlay) for overlay in OVERLAYS), (BASE, *OVERLAYS)]
YAML_FILES = sorted(p for p in COMPOSE.rglob("*") if p.suffix in (".yaml", ".yml"))
RUN_TOML = COMPOSE / "run.toml"
DOCKERFILE = COMPOSE / "Dockerfile"
MOSQUITTO_CONF = COMPOSE / "mosquitto" / "mosquitto.conf"
TLS_PREFIX = "CONCORD_NETWORK__TLS__"
BROKER_ENV = "CONCORD_ORCHESTRATOR__BROKER"
# the entrypoint of compose.shape.yaml: cap the link with tc, then `concord <command>`
SHAPE_ENTRYPOINT_END = 'exec concord "$@"'

TOP_LEVEL_KEYS = {"name", "services", "volumes", "networks", "configs", "secrets", "include"}
# the service keys a typo would most likely imitate (the compose spec has more; add when used)
SERVICE_KEYS = {
    "build", "cap_add", "cap_drop", "command", "configs", "container_name", "cpus", "depends_on",
    "deploy", "entrypoint", "env_file", "environment", "expose", "extra_hosts", "healthcheck",
    "hostname", "image", "init", "labels", "logging", "mem_limit", "networks", "platform",
    "ports", "profiles", "pull_policy", "read_only", "restart", "secrets", "security_opt",
    "shm_size", "stop_grace_period", "stop_signal", "tmpfs", "ulimits", "user", "volumes",
    "working_dir",
}  # fmt: skip

# $$ (a literal $), ${VAR}, ${VAR:-default}, ${VAR-default} and $VAR, as compose interpolates
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_]\w*)(?::?-(?P<default>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_]\w*))"
)


def _interpolate(value: Any, where: str) -> Any:
    """``value`` with every variable replaced by its default, as compose does with an empty
    environment; a variable without a default or a stray ``$`` fails."""
    if isinstance(value, dict):
        return {k: _interpolate(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    if "$" in _VARIABLE.sub("", value):
        pytest.fail(f"{where}: {value!r} has a '$' compose cannot interpolate (write '$$')")

    def default(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        if m["default"] is None:
            pytest.fail(f"{where}: {m[0]} needs a default (${{VAR:-default}})")
        return m["default"]

    return _VARIABLE.sub(default, value)


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.name}: not a mapping"
    return data


@dataclass(frozen=True)
class Mount:
    source: str | None  # a host path (resolved) or a named volume; None for an anonymous volume
    target: str
    read_only: bool


def _mount(volume: str | Mapping[str, Any], root: Path = COMPOSE) -> Mount:
    """A volume entry, short (``src:target[:ro]``) or long syntax; host paths resolved."""
    source: str | None
    if isinstance(volume, str):
        parts = volume.split(":")
        if len(parts) == 1:
            return Mount(None, parts[0], False)
        source, target, *mode = parts
        read_only = bool(mode) and "ro" in mode[0].split(",")
    else:
        source, target = volume.get("source"), volume["target"]
        read_only = bool(volume.get("read_only", False))
    if source is not None and source.startswith((".", "/", "~")):
        source = str((root / Path(source).expanduser()).resolve())
    return Mount(source, target, read_only)


def _merge(
    base: dict[str, Any], overlay: Mapping[str, Any], root: Path = COMPOSE
) -> dict[str, Any]:
    """Compose's merge for the keys used here: `volumes` by target, `cap_add` as a set,
    mappings key by key, every other key (`command`, `entrypoint`, `image` …) replaced."""
    out = dict(base)
    for key, value in overlay.items():
        if key == "volumes" and key in out:
            by_target = {_mount(v, root).target: v for v in out[key]}
            by_target.update({_mount(v, root).target: v for v in value})
            out[key] = list(by_target.values())
        elif key == "cap_add" and key in out:
            out[key] = sorted({*out[key], *value})
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Stack:
    files: tuple[str, ...]
    services: dict[str, dict[str, Any]]
    volumes: dict[str, Any]
    root: Path = COMPOSE

    def concord(self) -> Iterator[tuple[str, list[str]]]:
        """(service, argv after `concord`) of every service running the Concord image."""
        for name, service in self.services.items():
            if "build" in service:
                entrypoint = service.get("entrypoint")
                assert entrypoint is None or entrypoint[-2].endswith(SHAPE_ENTRYPOINT_END), (
                    f"{name}: keep the image's ENTRYPOINT (or end with {SHAPE_ENTRYPOINT_END})"
                )
                command = service.get("command")
                assert isinstance(command, list), f"{name}: command must be a list (exec form)"
                assert all(isinstance(a, str) for a in command), f"{name}: {command}"
                yield name, command

    def env(self, name: str) -> dict[str, str]:
        environment = self.services[name].get("environment", {})
        assert isinstance(environment, dict), f"{name}: environment as a mapping"
        return {k: str(v) for k, v in environment.items()}

    def mounts(self, name: str) -> dict[str, Mount]:
        return {m.target: m for m in (_mount(v, self.root) for v in self.services[name]["volumes"])}

    def mosquitto(self) -> str:
        names = [n for n, s in self.services.items() if s.get("image", "").startswith("eclipse-")]
        assert len(names) == 1, f"{self.files}: one eclipse-mosquitto service, found {names}"
        return names[0]


def _stack(files: tuple[str, ...], root: Path = COMPOSE) -> Stack:
    services: dict[str, dict[str, Any]] = {}
    volumes: dict[str, Any] = {}
    for file in files:
        data = _interpolate(_load(root / file), file)
        for name, service in data["services"].items():
            services[name] = _merge(services.get(name, {}), service, root)
        volumes.update(data.get("volumes") or {})
    return Stack(files, services, volumes, root)


def _options(argv: list[str]) -> dict[str, list[str]]:
    """``--key value`` pairs after the sub-command (every Concord option here takes a value)."""
    out: dict[str, list[str]] = {}
    args = iter(argv[1:])
    for arg in args:
        assert arg.startswith("--"), f"unexpected argument {arg!r} in {argv}"
        key, sep, value = arg.partition("=")
        out.setdefault(key, []).append(value if sep else next(args))
    return out


def _one(options: dict[str, list[str]], key: str, service: str) -> str:
    values = options.get(key, [])
    assert len(values) == 1, f"{service}: expected one {key}, got {values}"
    return values[0]


def _peers(stack: Stack) -> dict[str, dict[str, list[str]]]:
    return {name: _options(argv) for name, argv in stack.concord() if argv[0] == "peer"}


def _host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    assert sep, f"{address!r} is not host:port"
    assert host, f"{address!r} has no host"
    assert port.isdigit(), f"{address!r} has no port"
    return host, int(port)


def _stack_id(files: tuple[str, ...]) -> str:
    return "+".join(files)


def _cli_cases() -> list[Any]:
    """(stack, service) pairs, read at collection; a stack that does not load gives one case,
    which then fails with the reason (instead of a collection error hiding every other test)."""
    cases = []
    for files in STACKS:
        try:
            names = [name for name, _ in _stack(files).concord()]
        except (Exception, pytest.fail.Exception):
            names = ["<unloadable>"]
        cases += [pytest.param(files, n, id=f"{_stack_id(files)}:{n}") for n in names]
    return cases


# ------------------------------------------------------------------------------------ the files


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(COMPOSE)))
def test_yaml_file_is_a_compose_file(path: Path) -> None:
    data = _load(path)
    unknown = {k for k in data if k not in TOP_LEVEL_KEYS and not k.startswith("x-")}
    assert not unknown, f"{path.name}: unknown top-level keys {unknown}"
    assert isinstance(data.get("services"), dict), f"{path.name}: no services"
    assert data["services"], f"{path.name}: no services"
    for name, service in data["services"].items():
        unknown = {k for k in service if k not in SERVICE_KEYS and not k.startswith("x-")}
        assert not unknown, f"{path.name}: service {name}: unknown keys {unknown}"
    _interpolate(data, path.name)


def test_base_and_overlays_exist() -> None:
    assert (COMPOSE / BASE).is_file()
    assert "compose.tls.yaml" in OVERLAYS


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_every_service_has_image_or_build(files: tuple[str, ...]) -> None:
    stack = _stack(files)
    for name, service in stack.services.items():
        assert "image" in service or "build" in service, f"{name}: neither image nor build"


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_build_context_is_the_repository_root(files: tuple[str, ...]) -> None:
    stack = _stack(files)
    builds = {name: s["build"] for name, s in stack.services.items() if "build" in s}
    assert builds, "no service builds the Concord image"
    for name, build in builds.items():
        context = (COMPOSE / build["context"]).resolve()
        assert context == ROOT, f"{name}: build context {context} is not the repository root"
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE, name
        image = stack.services[name].get("image")
        assert image in ("concord:local", "concord:cuda"), f"{name}: image {image}"


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_mounts_are_declared_volumes_or_repository_files(files: tuple[str, ...]) -> None:
    stack = _stack(files)
    ignored = (COMPOSE / ".gitignore").read_text(encoding="utf-8").split()
    for name, service in stack.services.items():
        for mount in map(_mount, service.get("volumes", [])):
            if mount.source is None:
                continue
            if not mount.source.startswith("/"):
                assert mount.source in stack.volumes, f"{name}: volume {mount.source!r} undeclared"
                continue
            path = Path(mount.source)
            assert path.is_relative_to(ROOT), f"{name}: mounts {path}, outside the repository"
            # made before the run (compose/certs by `concord certs`) and kept out of git
            generated = path.is_relative_to(COMPOSE) and any(
                f"{parent.relative_to(COMPOSE)}/" in ignored
                for parent in path.parents
                if parent.is_relative_to(COMPOSE) and parent != COMPOSE
            )
            assert path.exists() or generated, f"{name}: mounts {path}, which does not exist"


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_dockerfile_installs_cpu_torch_first_and_runs_concord_unprivileged() -> None:
    steps = _dockerfile()
    assert steps[0] == ("FROM", "python:3.11-slim")
    runs = [args for ins, args in steps if ins == "RUN"]
    torch = next(i for i, r in enumerate(runs) if "pip install torch" in r)
    assert 'pip install torch==2.13.0 --index-url "${TORCH_INDEX}"' in runs[torch]
    assert ("ARG", "TORCH_INDEX=https://download.pytorch.org/whl/cpu") in steps, "CPU by default"
    bootstrap = (ROOT / "scripts" / "bootstrap").read_text(encoding="utf-8")
    assert "${CONCORD_TORCH:-torch==2.13.0}" in bootstrap, "the same pin as scripts/bootstrap"
    deps = next(i for i, r in enumerate(runs) if "['project']['dependencies']" in r)
    project = next(i for i, r in enumerate(runs) if re.search(r"pip install .*\s\.(\s|$)", r))
    assert torch < deps < project, "torch, then the dependencies, then the project"
    assert "--no-deps" in runs[project], "the source layer installs no dependencies"
    copies = [i for i, (ins, _) in enumerate(steps) if ins == "COPY"]
    deps_step = next(i for i, (ins, a) in enumerate(steps) if ins == "RUN" and a == runs[deps])
    assert [steps[i][1] for i in copies if i < deps_step] == ["pyproject.toml README.md ./"], (
        "only pyproject.toml (and the readme it names) before the dependencies: a source "
        "change must not invalidate their layer"
    )
    assert all("--mount=type=cache,target=/root/.cache/pip" in r for r in runs if "pip " in r)
    users = [args for ins, args in steps if ins == "USER"]
    assert users, "the image must not run as root"
    assert users[-1] not in ("root", "0"), "the image must not run as root"
    entrypoint = [args for ins, args in steps if ins == "ENTRYPOINT"]
    assert entrypoint == ['["concord"]']


def test_dockerfile_copies_every_package_and_the_ignore_file_lets_them_through() -> None:
    sources = []
    for ins, args in _dockerfile():
        if ins == "COPY" and "--from" not in args:
            *srcs, _dest = shlex.split(args)
            sources += [s.rstrip("/") for s in srcs]
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: not in the build context (repo root)"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = list(project["tool"]["setuptools"]["package-dir"].values())  # folder per package
    needed = {"pyproject.toml", project["project"]["readme"], *packages}
    assert needed <= set(sources), f"the Dockerfile does not copy {needed - set(sources)}"
    ignore = (COMPOSE / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    assert "*" in ignore, "the context is the whole repository: ignore everything by default"
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    assert set(sources) <= allowed, f"ignored but copied: {set(sources) - allowed}"


# ---------------------------------------------------------------------------- peers and config


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_peer_ids_match_the_run_config(files: tuple[str, ...]) -> None:
    cfg = load_config(RUN_TOML, environ={})
    peers = _peers(_stack(files))
    ids = {name: int(_one(opts, "--id", name)) for name, opts in peers.items()}
    assert sorted(ids.values()) == list(range(cfg.peers)), f"ids {ids} vs peers = {cfg.peers}"
    outs = [_one(opts, "--out", name) for name, opts in peers.items()]
    assert len(set(outs)) == len(outs), f"peers share an output directory: {outs}"
    for name, peer_id in ids.items():
        assert name == f"peer-{peer_id}", f"service {name} runs peer {peer_id}"
        _, listen_port = _host_port(_one(peers[name], "--listen", name))
        assert _one(peers[name], "--advertise", name) == f"{name}:{listen_port}"


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_one_orchestrator_and_every_container_reads_the_mounted_run_config(
    files: tuple[str, ...],
) -> None:
    stack = _stack(files)
    commands = dict(stack.concord())
    assert [n for n, argv in commands.items() if argv[0] == "orchestrator"] == ["orchestrator"]
    outs = [_one(_options(argv), "--out", name) for name, argv in commands.items()]
    assert len(set(outs)) == len(outs), f"services share an output directory: {outs}"
    for name, argv in commands.items():
        config = _one(_options(argv), "--config", name)
        mounts = {m.target: m for m in map(_mount, stack.services[name]["volumes"])}
        assert config in mounts, f"{name}: --config {config} is not mounted"
        assert mounts[config].source == str(RUN_TOML), f"{name}: {mounts[config]}"
        assert mounts[config].read_only, f"{name}: mount the run config read-only"
        out = PurePosixPath(_one(_options(argv), "--out", name))
        assert any(out.is_relative_to(t) and m.source for t, m in mounts.items()), (
            f"{name}: --out {out} is not on a volume (results would vanish with the container)"
        )


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_advertised_hosts_are_services(files: tuple[str, ...]) -> None:
    stack = _stack(files)
    for name, opts in _peers(stack).items():
        host, _ = _host_port(_one(opts, "--advertise", name))
        assert host in stack.services, f"{name}: --advertise host {host!r} is not a service"


# ------------------------------------------------------------------------------------- the broker


def _mosquitto_conf() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in MOSQUITTO_CONF.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            assert "#" not in line, f"mosquitto.conf has no inline comments: {line!r}"
            key, _, value = line.strip().partition(" ")
            out.setdefault(key, []).append(value.strip())
    return out


def test_mosquitto_conf() -> None:
    conf = _mosquitto_conf()
    assert conf.get("set_tcp_nodelay") == ["true"], "without it every QoS 1 hop costs ~44 ms"
    assert conf.get("persistence") == ["false"]
    listeners = [v.split() for v in conf.get("listener", [])]
    assert ["1883"] in listeners, "a listener on 1883 on every interface (other containers)"
    assert conf.get("allow_anonymous") == ["true"] or "password_file" in conf, (
        "anonymous access off needs a password_file, or no client can connect"
    )


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_every_concord_container_uses_the_mosquitto_service(files: tuple[str, ...]) -> None:
    stack = _stack(files)
    broker = stack.mosquitto()
    service = stack.services[broker]
    conf = stack.mounts(broker).get("/mosquitto/config/mosquitto.conf")
    assert conf is not None, f"{broker}: mosquitto.conf is not mounted"
    auth = "compose.auth.yaml" in files
    name = "mosquitto.auth.conf" if auth else "mosquitto.conf"
    assert conf.source == str(MOSQUITTO_CONF.with_name(name)), conf
    assert conf.read_only, conf
    expected = ("mqtts", broker, 8883) if auth else ("mqtt", broker, 1883)
    for name, argv in stack.concord():
        assert "--broker" not in argv, f"{name}: the broker comes from {BROKER_ENV}"
        url = urlsplit(stack.env(name)[BROKER_ENV])
        assert (url.scheme, url.hostname, url.port) == expected, f"{name}: {url}"
        depends_on = stack.services[name].get("depends_on", {})
        assert broker in depends_on, f"{name}: does not depend on {broker}"
        if isinstance(depends_on, dict) and depends_on[broker].get("condition") == (
            "service_healthy"
        ):
            assert "healthcheck" in service, f"{name} waits for a {broker} healthcheck"


# ------------------------------------------------------------------------------------------- mTLS


def _certs_commands(text: str) -> list[list[str]]:
    return [
        shlex.split(m[1]) for m in re.finditer(r"^[#\s]*concord (certs .+)$", text, re.MULTILINE)
    ]


TLS_STACKS = [f for f in STACKS if "compose.tls.yaml" in f]


def test_only_the_tls_overlay_enables_tls() -> None:
    tls = [
        f
        for f in STACKS
        if any(k.startswith(TLS_PREFIX) for n, _ in _stack(f).concord() for k in _stack(f).env(n))
    ]
    assert tls == TLS_STACKS
    assert "certs/" in (COMPOSE / ".gitignore").read_text(encoding="utf-8").split(), (
        "compose/certs holds private keys: it must be git-ignored"
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_repeat_no_command(overlay: str) -> None:
    """Overlays add settings as environment variables: a command repeated per overlay drifts."""
    for name, service in _load(COMPOSE / overlay)["services"].items():
        assert "command" not in (service if isinstance(service, dict) else {}), (
            f"{overlay}: {name} repeats its command"
        )
    base = dict(_stack((BASE,)).concord())
    assert dict(_stack((BASE, overlay)).concord()) == base


@pytest.mark.parametrize("files", TLS_STACKS, ids=_stack_id)
def test_tls_material_from_certs_sh_works_for_every_peer(
    files: tuple[str, ...], tmp_path: Path
) -> None:
    """Run certs.sh's `concord certs` commands into tmp_path, then check each peer's files as
    the peer does (chain, key pair, usage) and that its certificate names its advertised host."""
    from cryptography import x509

    from concord.lab.cli import main
    from concord.peer.tls import expand, load_material

    script = _certs_commands((COMPOSE / "certs.sh").read_text(encoding="utf-8"))
    assert script, "compose/certs.sh has no `concord certs` commands"
    cfg = load_config(RUN_TOML, environ={})
    for args in script:
        assert args[args.index("--dir") + 1] == "certs", "certs.sh runs in its own folder"
        if "--run-id" in args:
            assert args[args.index("--run-id") + 1] == cfg.name
        args[args.index("--dir") + 1] = str(tmp_path)
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, f"concord {shlex.join(args)}: {result.output}"

    stack = _stack(files)
    for name, opts in _peers(stack).items():
        peer_id = int(_one(opts, "--id", name))
        tls = load_config(RUN_TOML, environ=stack.env(name)).network.tls
        assert tls is not None, name
        mounts = stack.mounts(name)
        paths = []
        for template in (tls.ca, tls.cert, tls.key):
            path = expand(template, peer_id).as_posix()
            assert path in mounts, f"{name}: {path} is not mounted (one file per mount)"
            source = Path(mounts[path].source or "")
            assert source.parent == COMPOSE / "certs", mounts[path]
            assert mounts[path].read_only, mounts[path]
            paths.append(tmp_path / source.name)
        load_material(*paths)
        cert = x509.load_pem_x509_certificate(paths[1].read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        host, _ = _host_port(_one(opts, "--advertise", name))
        assert host in names.get_values_for_type(x509.DNSName), f"{name}: {host} not in SANs"


# -------------------------------------------------------------------------------- the real CLI


@pytest.mark.parametrize(("files", "service"), _cli_cases())
def test_command_parses_with_the_concord_cli(files: tuple[str, ...], service: str) -> None:
    """Option names, types and required options of each command, checked by click itself
    (`make_context` parses and validates without running the command)."""
    from concord.lab.cli import main

    name, *args = dict(_stack(files).concord())[service]
    command = main.commands.get(name)
    assert command is not None, f"`concord {name}` does not exist (have {sorted(main.commands)})"
    problem: str | None
    try:
        command.make_context(name, list(args))
    except click.UsageError as exc:
        problem = exc.format_message()
    else:
        problem = None
    assert problem is None, f"{service}: concord {name}: {problem}"


@pytest.mark.parametrize("files", TLS_STACKS, ids=_stack_id)
def test_every_concord_container_of_a_tls_stack_signs_and_verifies(
    files: tuple[str, ...], tmp_path: Path
) -> None:
    """With network.tls the control plane is signed: a container without the settings would
    refuse (or send) unsigned messages, so every Concord service carries the same ones, and the
    orchestrator's signing material from certs.sh's commands loads from its mount."""
    from concord.lab.cli import main
    from concord.protos.signing import signing_for

    stack = _stack(files)
    settings = {
        name: {k: v for k, v in stack.env(name).items() if k.startswith(TLS_PREFIX)}
        for name, _ in stack.concord()
    }
    assert len({tuple(sorted(v.items())) for v in settings.values()}) == 1, settings
    assert "orchestrator" in settings
    for args in _certs_commands((COMPOSE / "certs.sh").read_text(encoding="utf-8")):
        args[args.index("--dir") + 1] = str(tmp_path)
        assert CliRunner().invoke(main, args).exit_code == 0, args
    mounts = stack.mounts("orchestrator")
    for own in ("/certs/ca.crt", "/certs/orchestrator.crt", "/certs/orchestrator.key"):
        assert own in mounts, f"orchestrator: {own} is not mounted"
    env = {k: v.replace("/certs/", f"{tmp_path}/") for k, v in settings["orchestrator"].items()}
    cfg = load_config(RUN_TOML, environ=env)
    signing = signing_for(cfg, "orchestrator", cfg.name or "run")
    assert signing.signer is not None
    assert signing.verifier is not None


@pytest.mark.parametrize("files", STACKS, ids=_stack_id)
def test_every_process_starts_under_secure_by_default(files: tuple[str, ...]) -> None:
    """Each Concord container, configured as compose configures it, passes the check that
    refuses an open network (`concord.protos.exposure`): the base stack accepts plaintext on its
    private network out loud (network.insecure), the tls overlay protects it and accepts
    nothing."""
    from concord.protos.exposure import check_exposure, exposure_of

    stack = _stack(files)
    tls = "compose.tls.yaml" in files
    for name, argv in stack.concord():
        cfg = load_config(RUN_TOML, environ=stack.env(name))
        listen = _options(argv).get("--listen", [None])[0]
        exposure = exposure_of(cfg, listen=listen, broker=cfg.orchestrator.broker)
        assert cfg.network.insecure is not tls, f"{name}: network.insecure"
        check_exposure(exposure, insecure=cfg.network.insecure, role=name, warn=False)
        if tls:
            assert exposure.problems() == [], name
