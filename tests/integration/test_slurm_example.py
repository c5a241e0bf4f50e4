"""``examples/slurm/concord.sbatch`` run the way Slurm runs it: a copy of the script in a spool
directory, started in the submit directory with the ``SLURM_*`` variables set, and stub
``srun``, ``scontrol``, ``hostname``, ``mosquitto`` and ``concord`` on ``PATH`` that record what
they were asked to do (the stub ``srun`` then runs its command, as each task would)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "concord.sbatch"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")

# Each stub writes its arguments, NUL-separated, to a file of its own, $STUB_LOG/<name>-*.args
# (mktemp: the broker's, the orchestrator's and the peers' stubs run at the same time).
_RECORD = """#!/bin/bash
printf '%s\\0' "$@" > "$(mktemp "$STUB_LOG/$(basename "$0")-XXXXXX.args")"
"""
STUBS = {
    "scontrol": _RECORD + "echo node0; echo node1\n",
    # srun: skip its own options, then run the command once per task of this step
    "srun": _RECORD
    + """while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
tasks=1
case " $* " in *" concord peer "*|*"bash -c"*) tasks=2 ;; esac
code=0
for ((t = 0; t < tasks; t++)); do SLURM_PROCID=$t SLURM_LOCALID=$t "$@" || code=$?; done
exit $code
""",
    # Debian-style /etc/hosts: the host name resolves to 127.0.1.1
    "hostname": """#!/bin/bash
case "${1:-}" in
  -i) echo 127.0.1.1 ;;
  -I) echo "$STUB_ADDRESSES" ;;
  *) echo node0 ;;
esac
""",
    "mosquitto": _RECORD + '[ -f "$2" ] || { echo "mosquitto: $2 not found" >&2; exit 1; }\n',
    "concord": _RECORD + 'echo "SLURM_PROCID=${SLURM_PROCID:-}" >> "$STUB_LOG/concord-env"\n',
}


def _calls(log: Path, name: str) -> list[list[str]]:
    return [f.read_bytes().decode().split("\0")[:-1] for f in sorted(log.glob(f"{name}-*.args"))]


def _submit(
    tmp_path: Path, addresses: str, *, conf: bool = True
) -> tuple[subprocess.CompletedProcess[str], Path]:
    submit = tmp_path / "submit"  # the shared directory sbatch is run in (here: a repository)
    (submit / "examples" / "slurm").mkdir(parents=True)
    if conf:
        shutil.copy(ROOT / "examples" / "slurm" / "mosquitto.conf", submit / "examples" / "slurm")
    (submit / "run.toml").write_text("peers = 2\n")
    spool = tmp_path / "spool" / "job00042"  # where slurmd keeps its copy of the script
    spool.mkdir(parents=True)
    script = spool / "slurm_script"
    shutil.copy(SBATCH, script)
    script.chmod(0o700)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in STUBS.items():
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(stat.S_IRWXU)
    log = tmp_path / "log"
    log.mkdir()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CONFIG", "OUT"))}
    env = {
        **keep,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "STUB_ADDRESSES": addresses,
        "SLURM_SUBMIT_DIR": str(submit),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node[0-1]",
    }
    done = subprocess.run(
        ["bash", str(script)], cwd=submit, env=env, capture_output=True, text=True, timeout=60
    )
    return done, log


def test_the_sbatch_script_finds_its_files_and_peers_announce_a_routable_address(
    tmp_path: Path,
) -> None:
    # several addresses, as on a node with an interconnect and a container bridge
    done, log = _submit(tmp_path, "10.1.2.3 172.17.0.1 fd00::5 ")
    assert done.returncode == 0, done.stderr
    submit = tmp_path / "submit"
    (mosquitto,) = _calls(log, "mosquitto")
    assert mosquitto == ["-c", str(submit / "examples" / "slurm" / "mosquitto.conf")]
    concord = _calls(log, "concord")
    roles = sorted(c[0] for c in concord)
    assert roles == ["orchestrator", "peer", "peer"]
    (orchestrator,) = [c for c in concord if c[0] == "orchestrator"]
    assert orchestrator[orchestrator.index("--broker") + 1] == "mqtt://node0:1883"
    assert orchestrator[orchestrator.index("--run-id") + 1] == "concord-42"
    peers = [c for c in concord if c[0] == "peer"]
    for p in peers:
        assert p[p.index("--listen") + 1] == "10.1.2.3:0"  # one address, not loopback
        assert p[p.index("--config") + 1] == "run.toml"
        assert p[p.index("--broker") + 1] == "mqtt://node0:1883"
    # no [network.tls] in run.toml: plaintext on the cluster network, said with --insecure
    assert "--insecure" in orchestrator
    assert all("--insecure" in p for p in peers)
    outs = sorted(p[p.index("--out") + 1] for p in peers)
    assert outs == ["runs/concord-42/peer-0", "runs/concord-42/peer-1"]


def test_a_node_with_only_loopback_addresses_stops_its_peers_with_a_reason(
    tmp_path: Path,
) -> None:
    done, log = _submit(tmp_path, "")
    assert done.returncode != 0
    assert "no routable IPv4 address on node0" in done.stderr
    assert all(c[0] != "peer" for c in _calls(log, "concord"))


def test_the_sbatch_script_says_which_file_is_missing(tmp_path: Path) -> None:
    done, log = _submit(tmp_path, "10.1.2.3", conf=False)
    assert done.returncode == 2
    assert "no mosquitto.conf in " + str(tmp_path / "submit") in done.stderr
    assert _calls(log, "srun") == []
