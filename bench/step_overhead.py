"""Per-step time of 4 Concord peer processes on a ring (D-SGD, ~1M-parameter MLP), against the
same steps with no communication and against torch.distributed (gloo) all-reduce data-parallel
training with 4 processes on the same model — all measured in one run, on this machine.

* peers: ``concord peer`` × 4 on loopback gRPC (static config), time per step from each peer's
  training wall time (after the start-up handshake), median over peers;
* compute only: 4 processes running the identical local work (`concord.core.task.ClassificationTask`
  forward/backward + the local Nesterov step), no communication;
* gloo: 4 processes, ``torch.nn.parallel.DistributedDataParallel`` over gloo, plain nn.Module MLP
  of the same shape, same local batch, SGD with Nesterov momentum.

Every process uses 1 torch thread. Last line: a JSON object with the per-step milliseconds and
``ratio_vs_compute_only`` and ``ratio_vs_gloo`` (peers ÷ baseline; targets ≤ 1.25 and ≤ 1.0).

    python bench/step_overhead.py [--steps 200] [--peers 4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN = [1024, 1024]  # 40·1024 + 1024·1024 + 1024·10 + biases ≈ 1.09 M parameters
SAMPLES = 8000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config_text(n: int, epochs: float, addresses: list[str]) -> str:
    addr = ", ".join(f'"{a}"' for a in addresses)
    return (
        f'name = "bench"\npeers = {n}\ntopology = "ring"\nalgorithm = "dsgd"\nepochs = {epochs}\n'
        f'threads = 1\n[dataset]\nsamples = {SAMPLES}\n[model]\nname = "mlp"\n'
        f'hidden = {HIDDEN}\n[control]\nmode = "none"\n[eval]\nevery = 1000.0\n'
        f"[network]\naddresses = [{addr}]\ndeadline = 30.0\n"
    )


def _epochs_for(steps: int, n: int) -> float:
    per_epoch = max(1, round(SAMPLES * 0.8 / n / 16))
    return steps / per_epoch


def run_peers(n: int, steps: int, workdir: Path) -> float:
    addresses = [f"127.0.0.1:{_free_port()}" for _ in range(n)]
    config = workdir / "run.toml"
    config.write_text(_config_text(n, _epochs_for(steps, n), addresses))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "concord.lab.cli",
                "peer",
                "--config",
                str(config),
                "--id",
                str(i),
                "--out",
                str(workdir / f"peer-{i}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        for i in range(n)
    ]
    for p in procs:
        if p.wait(timeout=1800) != 0:
            raise RuntimeError("a peer failed")
    per_step = []
    for i in range(n):
        s = json.loads((workdir / f"peer-{i}" / "summary.json").read_text())
        per_step.append(s["wall_seconds"] / s["steps"])
    return statistics.median(per_step)


def _compute_worker(rank: int, n: int, steps: int, epochs: float, out: Any) -> None:
    import torch

    torch.set_num_threads(1)
    from concord.core.config import load_config
    from concord.core.loop import make_local_optimizer
    from concord.core.task import ClassificationTask

    with tempfile.TemporaryDirectory() as d:
        cfg_path = Path(d) / "run.toml"
        cfg_path.write_text(_config_text(n, epochs, [f"127.0.0.1:{1000 + i}" for i in range(n)]))
        cfg = load_config(cfg_path, environ={})
    task = ClassificationTask(cfg, [rank], device=torch.device("cpu"))
    opt = make_local_optimizer(cfg, task.flat.decay_mask)
    for step in range(5):  # warm-up
        opt.step(task.x, task.loss_and_grad(step).grad, 0.01)
    t0 = time.perf_counter()
    for step in range(steps):
        opt.step(task.x, task.loss_and_grad(step).grad, 0.01)
    out.put((time.perf_counter() - t0) / steps)


def _gloo_worker(rank: int, n: int, steps: int, port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=n)
    torch.manual_seed(0)
    dims = [40, *HIDDEN, 10]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers[:-1]))
    opt = torch.optim.SGD(
        model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4
    )
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 16, 40, generator=gen)
    y = torch.randint(0, 10, (64, 16), generator=gen)
    loss_fn = nn.CrossEntropyLoss()

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[i % 64]), y[i % 64]).backward()
        opt.step()

    for i in range(5):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    out.put((time.perf_counter() - t0) / steps)
    dist.destroy_process_group()


def _spawn_all(target: Any, n: int, extra: tuple[Any, ...]) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(i, n, *extra, out)) for i in range(n)]
    for p in procs:
        p.start()
    times = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--peers", type=int, default=4)
    args = parser.parse_args()
    n, steps = args.peers, args.steps
    with tempfile.TemporaryDirectory() as d:
        peers = run_peers(n, steps, Path(d))
    compute = _spawn_all(_compute_worker, n, (steps, _epochs_for(steps, n)))
    gloo = _spawn_all(_gloo_worker, n, (steps, _free_port()))
    print(
        f"{n} processes, ~1.09M-parameter MLP, local batch 16, 1 torch thread each, {steps} steps"
    )
    print(f"  Concord peers (ring, D-SGD, gRPC)  {peers * 1e3:8.2f} ms/step")
    print(f"  compute only (no communication)    {compute * 1e3:8.2f} ms/step")
    print(f"  torch.distributed gloo DDP         {gloo * 1e3:8.2f} ms/step")
    print(
        json.dumps(
            {
                "benchmark": "step_overhead",
                "processes": n,
                "steps": steps,
                "peers_ms": round(peers * 1e3, 3),
                "compute_only_ms": round(compute * 1e3, 3),
                "gloo_ms": round(gloo * 1e3, 3),
                "ratio_vs_compute_only": round(peers / compute, 3),
                "ratio_vs_gloo": round(peers / gloo, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
