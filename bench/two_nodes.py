"""Two hosts, emulated: a run spread over two "nodes" joined by a capped link, launched the way
Slurm launches it, against the same run on one host.

The nodes are network namespaces of `concord.lab.net` (``node0``, ``node1``, each with its own IP on
one bridge; every host's link capped with ``tc tbf`` at ``--cap-mbit`` both ways). ``node0`` runs
Mosquitto, ``concord orchestrator`` and its share of the peers; ``node1`` the rest. Each node's
peers are started by **one** command, ``scripts/srun-local TASKS FIRST NODE -- concord peer
--config … --broker mqtt://<node0>:1883 --run-id … --listen <node ip>:0`` — no ``--id``: each peer
takes its id from ``SLURM_PROCID`` and advertises its own address to the orchestrator, which
passes the addresses on in its schedules, so no address list is written anywhere.

The reference is ``concord sim --engine processes`` of the same config on one host (loopback).
Both runs are deterministic for a seed (barrier-mode consensus control: decisions follow the
statistics, not the timing), so the final parameters of every peer (``checkpoint.pt``) must
agree; ``max_abs_diff`` is the largest difference over all peers and parameters (the test's
tolerance is 1e-5: float32 arithmetic in the same order on both sides, so in practice 0).

    python bench/two_nodes.py [--peers-per-node 4] [--cap-mbit 200] [--set key=value ...]

Last line: one JSON object with ``max_abs_diff``, both runs' wall seconds, the cap and the
peers per node. Needs root (or CAP_NET_ADMIN) and Mosquitto; says why not and exits 2 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import concord.lab.net as netns
from bench._procs import ROOT, concord, reap, spawn, tail, wait_exit
from bench.chaos_runs import write_config as chaos_write_config

SRUN_LOCAL = ROOT / "scripts" / "srun-local"
DEFAULT_SETS = [
    "dataset.samples=1200",
    "model.name=mlp",
    "epochs=2",
    "eval.every=1",
    "seed=0",
    "threads=1",
    "control.mode=adaptive",
    "control.max_rounds=4",
    "network.deadline=5",
]
TIMEOUT = 600.0


def write_config(path: Path, peers: int, sets: list[str]) -> Path:
    """A run config: ``peers`` peers and the ``key=value`` settings, validated and resolved as
    ``concord sim --set`` would (`bench.chaos_runs.write_config`)."""
    return chaos_write_config(path, [f"peers={peers}", *sets])


def final_params(run_peers: Path, n: int) -> list[Any]:
    """Every peer's final parameters (its ``checkpoint.pt``), in id order."""
    from concord.runtime.rundir import load_checkpoint

    return [load_checkpoint(run_peers / f"peer-{i}" / "checkpoint.pt")["params"] for i in range(n)]


def run_one_host(out: Path, config: Path) -> float:
    """``concord sim --engine processes`` of ``config`` into ``out``; its wall seconds."""
    start = time.monotonic()
    argv = concord("sim", str(config), "--engine", "processes", "--quiet", "--reference", "none")
    argv += ["--out", str(out)]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    if p.returncode:
        raise RuntimeError(f"the one-host run failed ({p.returncode}): {p.stderr[-1500:]}")
    return time.monotonic() - start


def run_two_nodes(out: Path, config: Path, per_node: int, cap_mbit: float | None) -> float:
    """The run of ``config`` over two emulated nodes (module docstring) into ``out``; its wall
    seconds. Raises RuntimeError naming the process that failed, with its output's tail."""
    run_id = f"two-nodes-{os.getpid()}"
    logs = out / "logs"
    start = time.monotonic()
    with netns.Net(["node0", "node1"]) as net:
        if cap_mbit is not None:
            for host in net:
                net.cap(host, cap_mbit)
        head = net["node0"]
        procs = {"mosquitto": netns.mosquitto(head, logs)}
        try:
            common = ["--config", str(config), "--broker", f"mqtt://{head.ip}:1883"]
            # the emulated nodes' bridge is this machine's own: plaintext, said out loud
            common += ["--run-id", run_id, "--insecure"]
            procs["orchestrator"] = spawn(
                concord("orchestrator", *common, "--out", str(out)),
                logs / "orchestrator.out",
                popen=head.run,
            )
            for node, host in enumerate(net):
                peers_dir = out / "peers"
                peers_dir.mkdir(parents=True, exist_ok=True)
                # no --id and no --out: each task is peer SLURM_PROCID, in runs/peer-<id>
                argv = [
                    "bash",
                    str(SRUN_LOCAL),
                    str(per_node),
                    str(node * per_node),
                    str(node),
                    "--",
                    *concord("peer", *common, "--listen", f"{host.ip}:0"),
                ]
                procs[f"node{node}"] = spawn(
                    argv, logs / f"node{node}.out", cwd=peers_dir, popen=host.run
                )
            end = time.monotonic() + TIMEOUT
            for name in ("orchestrator", "node0", "node1"):
                code = wait_exit(procs[name], max(0.1, end - time.monotonic()))
                if code != 0:
                    raise RuntimeError(f"{name} exited with {code}: {tail(logs / f'{name}.out')}")
        finally:
            reap([p.pid for p in procs.values() if p.poll() is None], grace=2.0)
    for i in range(2 * per_node):  # srun-local's tasks wrote runs/peer-<id> in peers/
        src = out / "peers" / "runs" / f"peer-{i}"
        if src.is_dir():
            src.rename(out / "peers" / f"peer-{i}")
    return time.monotonic() - start


def compare(one_host: Path, two_nodes: Path, n: int) -> float:
    """The largest absolute difference of the final parameters of any peer."""
    a, b = final_params(one_host / "peers", n), final_params(two_nodes / "peers", n)
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--peers-per-node", type=int, default=4)
    parser.add_argument("--cap-mbit", type=float, default=200.0, help="0: no cap")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    args = parser.parse_args(argv)
    if args.peers_per_node < 1:
        parser.error(f"--peers-per-node must be ≥ 1; got {args.peers_per_node}")
    ok, why = netns.available()
    if not ok:
        print(f"two_nodes: network namespaces unavailable: {why}", file=sys.stderr)
        return 2
    n = 2 * args.peers_per_node
    with tempfile.TemporaryDirectory(prefix="concord-two-nodes-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        config = write_config(out / "run.toml", n, [*DEFAULT_SETS, *args.sets])
        cap = args.cap_mbit or None
        two = run_two_nodes(out / "two-nodes", config, args.peers_per_node, cap)
        one = run_one_host(out / "one-host", config)
        diff = compare(out / "one-host", out / "two-nodes", n)
        print(f"two nodes × {args.peers_per_node} peers, link cap {cap} Mbit/s: {two:.1f} s")
        print(f"one host (concord sim --engine processes): {one:.1f} s")
        print(f"max |Δ| of the final parameters over {n} peers: {diff:.3g}")
        print(
            json.dumps(
                {
                    "max_abs_diff": diff,
                    "two_nodes_s": round(two, 1),
                    "one_host_s": round(one, 1),
                    "cap_mbit": cap,
                    "peers_per_node": args.peers_per_node,
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
