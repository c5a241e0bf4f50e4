"""Every command of the README's quick tour runs, as written, and ends with exit 0.

The commands are read from the README itself (the first ``bash`` block after "## Quick tour"),
so the tour cannot rot: a command added there without an entry in `TOUR` fails
`test_every_tour_command_has_a_check`, and an entry whose command left the README fails too.
Where a command trains, its entry appends ``--set`` options that shorten it (fewer epochs or
samples; the README's defaults take minutes each) — the command itself, its engine, peers,
topology and control are the README's. What each command needs around it is made here as a
user would: the edge-list file, an MQTT broker on 127.0.0.1:1883 (Mosquitto; a private port in
its URL when 1883 is taken by something that is not a broker), an interrupted run to resume.
The emulated-network commands are skipped where network namespaces are not permitted (no root or
CAP_NET_ADMIN). Marked slow: about 7 minutes on 2 cores.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
from concord.protos.reach import BrokerUnreachableError, probe_broker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def tour_commands() -> list[str]:
    """The quick tour's commands, continuation lines joined, comments and `.`/`source` lines
    dropped."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Quick tour") :]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for raw in block.splitlines():
        line = raw.rstrip()
        current += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        words = shlex.split(current, comments=True)
        current = ""
        if words and words[0] not in (".", "source"):
            commands.append(shlex.join(words))
    return commands


@dataclass
class Tour:
    """The directory the tour runs in (a user's working directory beside a clone)."""

    cwd: Path
    concord: list[str]
    background: subprocess.Popen[bytes] | None = None  # a run the next command watches
    metrics: str = ""  # its peer 0's metrics endpoint

    def run(self, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
        assert argv[0] == "concord", argv
        done = subprocess.run(
            [*self.concord, *argv[1:]],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"{shlex.join(argv)} exited {done.returncode}\n"
            f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
        )
        return done


# the README's own example settings are kept; these only shorten training
SHORT = ["--set", "epochs=1", "--set", "dataset.samples=4000"]
PAPER_SHORT = ["--set", "epochs=4", "--set", "dataset.samples=4000", "--set", "eval.every=2"]


def _topology_json(tour: Tour, argv: list[str]) -> None:
    info = json.loads(tour.run(argv).stdout)
    assert info["peers"] == 64
    assert 0 < info["spectral_gap"] < 0.01  # a ring of 64 mixes slowly


def _topology(tour: Tour, argv: list[str]) -> None:
    if "file:my-edges.txt" in argv:  # the user's edge list: a ring of 10 with one chord
        edges = [f"{i} {(i + 1) % 10}" for i in range(10)] + ["0 5"]
        (tour.cwd / "my-edges.txt").write_text("\n".join(edges) + "\n")
    assert "spectral_gap" in tour.run(argv).stdout


def _config_show(tour: Tour, argv: list[str]) -> None:
    assert re.search(r"^peers = 16$", tour.run(argv).stdout, re.MULTILINE)


def _sim(tour: Tour, argv: list[str]) -> None:
    out = tour.run(argv + SHORT).stdout
    assert "Final accuracy next to the reference" in out


def _sim_paper(tour: Tour, argv: list[str]) -> None:
    tour.run(argv + PAPER_SHORT)
    summary = json.loads((tour.cwd / "runs" / "mine" / "summary.json").read_text())
    assert (summary["engine"], summary["peers"]) == ("vectorized", 64)


def _sim_broker(tour: Tour, argv: list[str]) -> None:
    url = next(a for a in argv if a.startswith("mqtt://"))
    host, port = url.removeprefix("mqtt://").split(":")
    if mosquitto_binary() is None:
        pytest.fail("mosquitto is not installed; scripts/bootstrap installs it (root, Debian)")
    broker = None
    try:
        probe_broker(url)  # a broker answers there already: the command runs against it
    except BrokerUnreachableError:
        with socket.socket() as s:
            taken = s.connect_ex((host, int(port))) == 0
        broker = MosquittoBroker(host, 0 if taken else int(port))
        broker.start()
        argv = [broker.url if a == url else a for a in argv]
    try:
        out = tour.run(argv + SHORT).stdout
    finally:
        if broker is not None:
            broker.stop()
    assert "Final accuracy next to the reference" in out


def _sim_resume(tour: Tour, argv: list[str]) -> None:
    from tests.integration.test_resume_processes import _kill_all, _train_steps

    run_dir = tour.cwd / argv[argv.index("--resume") + 1]
    first = [*tour.concord, "sim", "--quiet", "--out", str(run_dir), "--set", "epochs=2",
             "--set", "dataset.samples=4000", "--set", "eval.every=0.25"]  # fmt: skip
    with (tour.cwd / "interrupted.out").open("wb") as log:
        launcher = subprocess.Popen(first, cwd=tour.cwd, stdout=log, stderr=subprocess.STDOUT)
    peer0 = run_dir / "peers" / "peer-0" / "metrics.jsonl"
    try:
        end = time.monotonic() + 240
        while _train_steps(peer0) < 25 and time.monotonic() < end:  # past two checkpoints
            assert launcher.poll() is None, (tour.cwd / "interrupted.out").read_text()[-2000:]
            time.sleep(0.05)
    finally:
        _kill_all(launcher, run_dir)
    assert not (run_dir / "summary.json").exists()
    out = tour.run(argv).stdout  # the README's command, with its all-reduce reference
    assert "Final accuracy next to the reference" in out
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] > 0


def _free_base(host: str, port: int, count: int) -> int:
    """``port`` when ``port … port + count − 1`` are free on ``host``, else a base that is."""
    bases: list[int] = [port, *range(20000, 60000, 97)]
    for base in bases:
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind((host, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


def _sim_background(tour: Tour, argv: list[str]) -> None:
    """``concord sim … &``: started here, followed by the next command (`_status`)."""
    assert argv[-1] == "&"
    listen = next(a for a in argv if a.startswith("metrics.listen="))
    host, port = listen.removeprefix("metrics.listen=").rsplit(":", 1)
    base = _free_base(host, int(port), 9)  # the orchestrator and 8 peers
    argv = [f"metrics.listen={host}:{base}" if a == listen else a for a in argv[:-1]]
    args = [*tour.concord, *argv[1:], "--set", "epochs=8", "--set", "dataset.samples=4000"]
    log = (tour.cwd / "background.out").open("wb")
    tour.background = subprocess.Popen(args, cwd=tour.cwd, stdout=log, stderr=subprocess.STDOUT)
    tour.metrics = f"http://{host}:{base + 1}/metrics"  # peer 0's


def _status(tour: Tour, argv: list[str]) -> None:
    launcher = tour.background
    assert launcher is not None, "the run to watch starts in the command before"
    try:
        peer0 = tour.cwd / argv[2] / "peers" / "peer-0" / "telemetry.json"
        end = time.monotonic() + 120
        while not peer0.is_file() and time.monotonic() < end and launcher.poll() is None:
            time.sleep(0.1)
        while launcher.poll() is None and time.monotonic() < end:  # its first step
            with urllib.request.urlopen(tour.metrics, timeout=10) as answer:
                if b"concord_peer_step{" in answer.read():
                    break
            time.sleep(0.2)
        else:
            pytest.fail("peer 0's metrics never showed a step")
        shown = tour.run(argv).stdout  # --watch: until the run ends
        assert re.search(r"^\s+7\s+(training|done)\s+\d+", shown, re.MULTILINE), shown[-2000:]
        assert launcher.wait(timeout=300) == 0, (tour.cwd / "background.out").read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _need_namespaces() -> None:
    from concord.lab.net import available

    ok, why = available()
    if not ok:
        pytest.skip(f"emulated networks need network namespaces here: {why}")


def _net_check(tour: Tour, argv: list[str]) -> None:
    _need_namespaces()
    lines = tour.run(argv).stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [
        "rtt_p50", "rtt_p99", "rate_a_to_b", "rate_b_to_a", "loss"
    ]  # fmt: skip
    assert lines[1].split()[1:3] == ["60.00", "ms"]  # edge: 4 × 15 ms


def _sim_net(tour: Tour, argv: list[str]) -> None:
    _need_namespaces()
    out = tour.run(argv + SHORT).stdout
    assert "Final accuracy next to the reference" in out
    run_dir = Path(out.rsplit("run directory:", 1)[1].split()[0])
    config = (tour.cwd / run_dir / "config.toml").read_text()
    assert '[network.emulation]\nprofile = "edge"' in config  # the links it ran on


def _sweep(tour: Tour, argv: list[str]) -> None:
    out = tour.run(argv + PAPER_SHORT).stdout
    assert "dec-phase-1" in out


def _list_presets(tour: Tour, argv: list[str]) -> None:
    assert "relaysgd-dirichlet" in tour.run(argv).stdout


def _preset(tour: Tour, argv: list[str]) -> None:
    tour.run([*argv, "--set", "epochs=0.5"])
    assert (tour.cwd / "runs" / "relaysgd-dirichlet" / "report.md").is_file()


def _verify(tour: Tour, argv: list[str]) -> None:
    assert "reproduces" in tour.run(argv).stdout


# README command prefix → its check (`test_every_tour_command_has_a_check` pairs them)
TOUR: dict[str, Callable[[Tour, list[str]], None]] = {
    "concord topology ring --peers 64 --json": _topology_json,
    "concord topology exponential-one-peer": _topology,
    "concord topology file:my-edges.txt": _topology,
    "concord config show": _config_show,
    "concord sim --set peers=16": _sim,
    "concord sim --engine vectorized examples/paper-mnist1d.toml": _sim_paper,
    "concord sim --broker": _sim_broker,
    "concord sim --resume": _sim_resume,
    "concord sim --out runs/watched": _sim_background,
    "concord status runs/watched --watch": _status,
    "concord net check edge": _net_check,
    "concord sim --net edge": _sim_net,
    "concord sweep examples/paper-mnist1d.toml": _sweep,
    "concord sweep --list-presets": _list_presets,
    "concord sweep --preset relaysgd-dirichlet": _preset,
    "concord report verify": _verify,
}


def _check_of(command: str) -> Callable[[Tour, list[str]], None] | None:
    found = [prefix for prefix in TOUR if command.startswith(prefix)]
    return TOUR[max(found, key=len)] if found else None


def test_every_tour_command_has_a_check() -> None:
    commands = tour_commands()
    assert len(commands) >= 10, commands
    unchecked = [c for c in commands if _check_of(c) is None]
    assert not unchecked, f"README tour commands without a check in TOUR: {unchecked}"
    stale = [p for p in TOUR if not any(c.startswith(p) for c in commands)]
    assert not stale, f"TOUR checks of commands the README no longer shows: {stale}"


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Tour:
    cwd = tmp_path_factory.mktemp("tour")
    for name in ("examples", "docs"):  # what the tour names, from the clone, read-only
        (cwd / name).symlink_to(ROOT / name, target_is_directory=True)
    script = Path(sys.executable).parent / "concord"
    concord = [str(script)] if script.is_file() else [sys.executable, "-m", "concord.lab.cli"]
    return Tour(cwd, concord)


@pytest.mark.parametrize("command", tour_commands())
def test_the_tour_command_runs(tour: Tour, command: str) -> None:
    check = _check_of(command)
    assert check is not None, f"no check for {command!r}"
    check(tour, shlex.split(command))
