"""`concord compose`: compose/ is its output for 4 peers, and what it writes for 32 peers passes
the checks of test_compose_files.py, with a healthcheck on every service and each private key
mounted only into the container that owns it."""

from __future__ import annotations

import shlex
from pathlib import Path

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
    line = (COMPOSE / BASE).read_text(encoding="utf-8").splitlines()[1]
    argv = shlex.split(line.lstrip("# "))
    assert argv[:2] == ["concord", "compose"], line
    ctx = main.commands["compose"].make_context("compose", argv[2:])
    p = ctx.params
    assert p["config"] is None, "compose/ uses the built-in run config"
    options = ComposeOptions(
        peers=p["peers"], tls=p["tls"], auth=p["auth"], shape=p["shape"], cpus=p["cpus"],
        memory=p["memory"], gpus=p["gpus"] or 0, out=str(p["out"]),
    )  # fmt: skip
    return options, line


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
