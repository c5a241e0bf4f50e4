"""`concord compose`: compose/ is its output for 4 peers, and what it writes for 32 peers passes
the checks of test_compose_files.py, with a healthcheck on every service and each private key
mounted only into the container that owns it."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from concord.lab.cli import main
from concord.lab.compose_gen import ComposeError, ComposeOptions, rate_bits, render, shape_burst
from concord.lab.yamltext import dump
from tests.compose.test_compose_files import (
    BASE,
    COMPOSE,
    ROOT,
    Stack,
    _load,
    _stack,
    test_yaml_file_is_a_compose_file,
)

OVERLAY_NAMES = ("tls", "auth", "shape", "limits", "gpu")


def _options_of_header() -> tuple[ComposeOptions, str]:
    """The options of the command line in compose/compose.yaml's header (its second line)."""
    from concord.lab.deploy_cli import compose_options

    line = (COMPOSE / BASE).read_text(encoding="utf-8").splitlines()[1]
    argv = shlex.split(line.lstrip("# "))
    assert argv[:2] == ["concord", "compose"], line
    ctx = main.commands["compose"].make_context("compose", argv[2:])
    assert ctx.params["config"] is None, "compose/ uses the built-in run config"
    options = compose_options({**ctx.params, "context": ROOT})
    # the files name the context and Dockerfile relative to compose/ (the command's defaults)
    return replace(options, context="..", dockerfile="compose/Dockerfile"), line


def test_compose_folder_is_the_output_of_concord_compose() -> None:
    """Regenerate with the command in the header and compare every file (fix: run it again from
    the repository root with --force)."""
    import tomllib

    from concord.core.config import build_config
    from concord.lab.compose_gen import default_run_toml

    options, line = _options_of_header()
    assert options.out == "compose", line
    assert options.peers == 4, line
    text = default_run_toml(options.peers)
    files = render(options, build_config(tomllib.loads(text)), text)
    assert {f"compose.{n}.yaml" for n in OVERLAY_NAMES} <= set(files), (
        f"compose/ should show every overlay; {line} writes {sorted(files)}"
    )
    stale = []
    for name, expected in files.items():
        actual = (COMPOSE / name).read_text(encoding="utf-8") if (COMPOSE / name).exists() else ""
        if actual != expected:
            stale.append(name)
    assert not stale, f"compose/{stale} differ from `{line.lstrip('# ')} --force`"
    extra = {p.name for p in COMPOSE.glob("compose.*.yaml")} - set(files)
    assert not extra, f"compose/ has overlays the command does not write: {extra}"


def _generate(tmp_path: Path, *flags: str) -> Path:
    out = tmp_path / "stack"
    args = ["compose", "--peers", "32", *flags, "--context", str(ROOT), "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return out


def _private_mounts_are_owned(stack: Stack) -> None:
    """Every file under certs/ that is secret (a key, a password, the password file) is mounted
    only into its owner, one file per mount (a directory mount would expose its neighbours)."""
    certs = stack.root / "certs"
    owners = {"orchestrator": {"orchestrator.key", "broker/orchestrator.password"}}
    owners["mosquitto"] = {"broker.key", "broker/passwd"}
    for name in stack.services:
        if name.startswith("peer-"):
            owners[name] = {f"{name}.key", f"broker/{name}.password"}
    for name in stack.services:
        for mount in stack.mounts(name).values():
            if mount.source is None or not Path(mount.source).is_relative_to(stack.root):
                continue
            source = Path(mount.source)
            assert not certs.is_relative_to(source), f"{name} mounts {source}, which holds keys"
            if not source.is_relative_to(certs):
                continue
            rel = source.relative_to(certs).as_posix()
            secret = rel.endswith((".key", ".password")) or rel == "broker/passwd"
            assert rel != "ca.key", f"{name} mounts the CA key"
            assert not secret or rel in owners.get(name, set()), f"{name} mounts {rel}"
            assert mount.read_only, f"{name}: {rel} read-write"


@pytest.mark.parametrize(
    "flags", [(), ("--tls", "--auth", "--shape", "100mbit")], ids=["plain", "tls-auth-shape"]
)
def test_32_peers(tmp_path: Path, flags: tuple[str, ...]) -> None:
    out = _generate(tmp_path, *flags)
    files = sorted(p.name for p in out.glob("compose*.yaml"))
    expected = [BASE] + [f"compose.{n}.yaml" for n in ("tls", "auth", "shape") if flags]
    assert files == sorted(expected)
    for name in files:
        test_yaml_file_is_a_compose_file(out / name)  # the schema check of compose/
    stack = _stack(tuple(files), out)
    peers = sorted(n for n in stack.services if n.startswith("peer-"))
    assert peers == sorted(f"peer-{i}" for i in range(32))
    for name, service in stack.services.items():
        assert "test" in service.get("healthcheck", {}), f"{name}: no healthcheck"
    _private_mounts_are_owned(stack)
    if flags:
        assert all(stack.services[p]["cap_add"] == ["NET_ADMIN"] for p in peers)
        assert stack.env("peer-31")["CONCORD_SHAPE_RATE"] == "100mbit"
        assert stack.env("peer-31")["CONCORD_NETWORK__TLS__KEY"] == "/certs/peer-{id}.key"
        assert "/certs/peer-31.key" in stack.mounts("peer-31")
        script = (out / "certs.sh").read_text(encoding="utf-8")
        assert "--peer 31 --host peer-31" in script
        assert "--peers 32 --host mosquitto" in script


@pytest.mark.parametrize(
    "files", [(BASE,), tuple(sorted(p.name for p in COMPOSE.glob("compose*.yaml")))]
)
def test_repository_stack_mounts_private_keys_only_into_their_owner(
    files: tuple[str, ...],
) -> None:
    _private_mounts_are_owned(_stack(files))


def test_a_directory_mount_of_the_keys_is_caught(tmp_path: Path) -> None:
    """The ownership check fails on today's old layout (certs/ mounted into every peer)."""
    out = _generate(tmp_path, "--tls")
    stack = _stack((BASE, "compose.tls.yaml"), out)
    stack.services["peer-3"]["volumes"].append("./certs:/all-certs:ro")
    with pytest.raises(AssertionError, match=r"peer-3 mounts .*certs, which holds keys"):
        _private_mounts_are_owned(stack)


def test_gpu_overlay_assigns_devices_round_robin(tmp_path: Path) -> None:
    out = _generate(tmp_path, "--gpus", "3", "--cpus", "1.5", "--memory", "2g")
    stack = _stack((BASE, "compose.gpu.yaml", "compose.limits.yaml"), out)
    devices = [
        stack.services[f"peer-{i}"]["deploy"]["resources"]["reservations"]["devices"][0]
        for i in range(5)
    ]
    assert [d["device_ids"] for d in devices] == [["0"], ["1"], ["2"], ["0"], ["1"]]
    assert stack.services["peer-4"]["image"] == "concord:cuda"
    assert stack.services["orchestrator"]["image"] == "concord:local"
    assert (stack.services["peer-0"]["cpus"], stack.services["peer-0"]["mem_limit"]) == (1.5, "2g")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--peers", "1"], "1 is not in the range x>=2"),
        (["--peers", "4", "--shape", "100mb"], "--shape '100mb': expected a positive tc rate"),
        (["--peers", "4", "--shape", "0mbit"], "--shape '0mbit'"),
        (["--peers", "4", "--memory", "lots"], "--memory 'lots': expected a size"),
        (["--peers", "4", "--replicas", "2"], "No such option '--replicas'"),
        (["--peers", "4", "--gpus", "0"], "0 is not in the range x>=1"),
    ],
)
def test_bad_input_is_refused_with_a_reason(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "stack"
    result = CliRunner().invoke(main, ["compose", *args, "--context", str(ROOT), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists(), "nothing is written for bad input"


def test_existing_files_are_kept_without_force(tmp_path: Path) -> None:
    out = _generate(tmp_path)
    args = ["compose", "--peers", "3", "--context", str(ROOT), "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "pass --force" in result.output
    assert "peer-31" in (out / BASE).read_text(encoding="utf-8")
    assert CliRunner().invoke(main, [*args, "--force"]).exit_code == 0
    assert "peer-3:" not in (out / BASE).read_text(encoding="utf-8")


def test_config_peers_must_match(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('name = "x"\npeers = 8\n', encoding="utf-8")
    args = ["compose", "--peers", "4", "--config", str(config), "--context", str(ROOT)]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "s")])
    assert result.exit_code == 2
    assert "peers = 8 but --peers 4" in result.output


def test_rates() -> None:
    assert rate_bits("100mbit") == 100e6
    assert rate_bits("10mbps") == 80e6
    assert shape_burst("100mbit") == 50_000  # 4 ms at 12.5 MB/s
    assert shape_burst("1mbit") == 32 * 1024  # the floor
    with pytest.raises(ComposeError, match="units"):
        rate_bits("fast")


def test_yaml_writer_round_trips_awkward_strings() -> None:
    strings = ["yes", "no", "on", "null", "~", "", "1", "0.0.0.0:50051", "1:20", "-", "--id",
               "a: b", "#x", "$(X)", "${A:-b}", "it's", 'q"q', "*peer", "&a", "x\ny", "tab\t",
               "peer-0", "/runs/peer-0", "-1", "1e3", "0x10", "@x", "`x`", "[a]"]  # fmt: skip
    # (a key starting with "#" is the writer's comment line)
    keys = [k for k in strings if k and not k.startswith("#")]
    data = {"s": strings, "m": {k: k for k in keys}, "n": [1, 2.5, True, None]}
    assert yaml.safe_load(dump(data)) == data
    assert _load(COMPOSE / BASE)["services"]  # and the generated files parse


# ------------------------------------------------------------ restarts, project, run's end, uid


def _base(out: Path) -> dict[str, Any]:
    """compose.yaml as compose reads it (PyYAML resolves the `<<` merge keys)."""
    return _load(out / BASE)


def test_restart_policies(tmp_path: Path) -> None:
    services = _base(_generate(tmp_path, "--tls"))["services"]
    for i in range(32):
        assert services[f"peer-{i}"]["restart"] == "on-failure:3", "a crashed peer rejoins"
    assert services["orchestrator"]["restart"] == "no", "its run directory cannot be reused"
    assert services["mosquitto"]["restart"] == "unless-stopped"
    # the repository's stack too
    assert _base(COMPOSE)["services"]["peer-3"]["restart"] == "on-failure:3"


def test_project_name_from_the_run_or_the_option(tmp_path: Path) -> None:
    assert _base(_generate(tmp_path))["name"] == "compose-run", "the default run's name"
    config = tmp_path / "run.toml"
    config.write_text('name = "My Study_2"\npeers = 32\n', encoding="utf-8")
    out = _generate(tmp_path, "--config", str(config), "--force")
    assert _base(out)["name"] == "my-study-2", "made a valid compose project name"
    out = _generate(tmp_path, "--project", "lab_b", "--force")
    assert _base(out)["name"] == "lab_b"
    assert "--project lab_b" in (out / BASE).read_text(encoding="utf-8").splitlines()[1]


def _hint(tmp_path: Path, *flags: str) -> str:
    out = tmp_path / "hinted"
    args = ["compose", "--peers", "4", *flags, "--context", str(ROOT), "--out", str(out)]
    result = CliRunner().invoke(main, [*args, "--force"])
    assert result.exit_code == 0, result.output
    return result.output


def test_the_hint_says_uid_how_the_run_ends_and_where_results_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    output = _hint(tmp_path, "--tls", "--project", "lab-a")
    out = tmp_path / "hinted"
    files = f"-f {out}/compose.yaml -f {out}/compose.tls.yaml"
    lines = output.splitlines()
    assert f"first: sh {out}/certs.sh   (the identities; keys 0600)" in lines
    steps = lines[lines.index("then, from this directory (the compose project 'lab-a'):") + 1 :]
    assert steps[:4] == [
        f"  CONCORD_UID=$(id -u) docker compose {files} up --build -d",
        f"  docker compose {files} wait orchestrator",
        f"  docker compose {files} cp orchestrator:/runs ./runs/lab-a",
        f"  docker compose {files} down -v",
    ]
    assert "containers can read the 0600 keys" in output
    assert "with the orchestrator's exit status" in output
    # the compose file's header says the same
    header = (out / BASE).read_text(encoding="utf-8")
    assert f"#   CONCORD_UID=$(id -u) docker compose {files} up --build -d" in header
    assert f"#   docker compose {files} wait orchestrator" in header


def test_the_hint_as_root_hands_the_keys_to_a_user(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    output = _hint(tmp_path, "--auth")
    out = tmp_path / "hinted"
    assert f"first: sh {out}/certs.sh && chown -R 1000 {out}/certs" in output
    assert "CONCORD_UID=1000 docker compose" in output
    assert "$(id -u)" not in output
    assert "the image never runs as root" in output


def _user_step() -> str:
    """The Dockerfile's RUN that makes the user, as sh runs it (continuations joined)."""
    text = (COMPOSE / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    runs = [line.strip()[4:] for line in text.splitlines() if line.strip().startswith("RUN ")]
    (step,) = [r for r in runs if "useradd" in r]
    return step


@pytest.mark.parametrize(("uid", "code"), [("0", 1), ("4242", 0)])
def test_dockerfile_refuses_uid_0_with_what_to_do(tmp_path: Path, uid: str, code: int) -> None:
    """useradd --uid 0 fails obscurely (uid 0 exists): the build says what to do instead. The
    step runs in sh with useradd, mkdir and chown replaced by echo (no Docker engine here)."""
    from concord.lab.compose_image import UID0_MESSAGE

    script = _user_step()
    for tool in ("useradd", "mkdir", "chown"):
        script = script.replace(f"&& {tool} ", f"&& echo {tool} ")
    env = {"PATH": os.environ["PATH"], "CONCORD_UID": uid}
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == code, done
    if code:
        assert done.stderr.strip() == UID0_MESSAGE
        assert "chown -R 1000 certs/" in done.stderr
    else:
        assert f"useradd --create-home --uid {uid}" in done.stdout


def test_metrics_port_on_every_concord_service_and_no_host_port(tmp_path: Path) -> None:
    out = _generate(tmp_path, "--tls", "--metrics-port", "9500")
    stack = _stack((BASE, "compose.tls.yaml"), out)
    concord = dict(stack.concord())
    assert len(concord) == 33
    for name, argv in concord.items():
        assert argv[argv.index("--metrics-listen") + 1] == "0.0.0.0:9500", name
        service = stack.services[name]
        assert "9500" in service["expose"], name
        labels = service["labels"]
        assert labels["prometheus.io/scrape"] == "true", name
        assert (labels["prometheus.io/port"], labels["prometheus.io/path"]) == ("9500", "/metrics")
    for name, service in stack.services.items():
        assert "ports" not in service, f"{name} publishes a host port"
    quiet = _generate(tmp_path, "--metrics-port", "0", "--force")
    for name, argv in _stack((BASE,), quiet).concord():
        assert "--metrics-listen" not in argv, name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--project", "Lab A"], "--project 'Lab A': a compose project name is lowercase"),
        (["--metrics-port", "1883"], "--metrics-port 1883: taken by the gRPC or MQTT port"),
        (["--metrics-port", "70000"], "70000 is not in the range 0<=x<=65535"),
    ],
)
def test_bad_project_or_metrics_port(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "stack"
    argv = ["compose", "--peers", "4", *args, "--context", str(ROOT), "--out", str(out)]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not out.exists()
