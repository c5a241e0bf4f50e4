"""Per-step time of 4 Concord peer processes on a ring (D-SGD, ~1M-parameter MLP), against the
same steps with no communication and against what a user would pick instead on torch.distributed
(gloo) with 4 processes on the same model — all measured in one run, on this machine.

* peers: ``concord peer`` × 4 on loopback gRPC (static config) with ``overlap = true`` (each
  step's gossip of x_t runs on the peer's event loop while its gradient is computed,
  docs/algorithms.md#overlap), fp32 wire and bf16 wire (``compression.codec = "bf16"``), and fp32
  without overlap ("local step, then gossip": the exchange after the computation); time per step
  from each peer's step records — the training loop's pace from the end of step 5 to the end of
  the last step (record ``time``), as the baselines below time their steps after 5 warm-up
  steps — median over peers (``whole_run_ms`` in each breakdown: the peer process's whole wall
  time over its steps, start-up handshake, rendezvous, final evaluation and shutdown included); and
  where a step's communication time went, from the peers' step records
  (`concord.peer.comm.Breakdown`: encode, wait — blocked on the round: sending, the wire, the
  neighbours — mix, and overlap — the round in flight while the gradient was computed), medians
  over steps and peers;
* the same peers (fp32, overlap) with ``network.transport = "torch"``: the tensors over a gloo
  process group (`concord.peer.torch_plane`, rendezvous at tcp://), the control and the
  arithmetic unchanged;
* compute only: 4 processes running the identical local work (`concord.core.task.ClassificationTask`
  forward/backward + the local Nesterov step), no communication;
* gloo DDP: ``torch.nn.parallel.DistributedDataParallel`` over gloo (default bucketing, its
  overlap of all-reduce with backward), plain nn.Module MLP of the same shape, same local batch,
  SGD with Nesterov momentum; and the same with PyTorch's ``fp16_compress_hook``;
* gloo ring gossip: the same model and step, then one exchange with both ring neighbours
  (``batch_isend_irecv`` of the flat parameters) and the average of the three — D-SGD written
  directly on torch.distributed; its exchange alone is timed too.

Every process uses 1 torch thread. Last line: a JSON object with the per-step milliseconds,
``ratio_vs_gloo``, ``ratio_bf16_vs_gloo``, ``ratio_vs_compute_only`` and
``ratio_vs_ddp_fp16_hook`` (Concord with overlap), ``ratio_no_overlap_vs_gloo`` (without), and
``ratio_torch_plane_vs_gloo`` and ``ratio_torch_plane_vs_grpc`` (the gloo data plane), and
``exchange_ratio_vs_gloo_gossip``: Concord's exchange alone — encode + wait + mix per step of the
run without overlap, where nothing hides it — over gloo gossip's. ``exposed_comm_ms`` is what
communication still costs the training thread with overlap on (encode + wait + mix).

Framework overhead (`TARGETS`): ``ratio_torch_plane_vs_gloo_gossip`` (target ≤ 1.15) and
``ratio_grpc_vs_gloo_gossip`` (≤ 1.6), Concord's step — torch plane and gRPC plane, both with
overlap — over the hand-written gloo ring gossip of the same run: the same algorithm on the same
transport, so what is left is what the framework costs; ``targets_met`` says which hold. On a
shared machine the load moves between contenders: ``--repeat R`` measures these two ratios R
times (after the full set, gloo gossip, torch plane and gRPC peers back to back), each
repetition's in ``overhead_repeats``, and reports and judges their medians.

    python bench/step_overhead.py [--steps 200] [--peers 4] [--repeat 1]
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


def _config_text(
    n: int,
    epochs: float,
    addresses: list[str],
    codec: str = "none",
    overlap: bool = False,
    transport: str = "grpc",
) -> str:
    addr = ", ".join(f'"{a}"' for a in addresses)
    torch_plane = (
        f'transport = "torch"\n[network.torch]\ninit = "tcp://127.0.0.1:{_free_port()}"\n'
        if transport == "torch"
        else ""
    )
    return (
        f'name = "bench"\npeers = {n}\ntopology = "ring"\nalgorithm = "dsgd"\nepochs = {epochs}\n'
        f"overlap = {str(overlap).lower()}\n"
        f'threads = 1\n[dataset]\nsamples = {SAMPLES}\n[model]\nname = "mlp"\n'
        f'hidden = {HIDDEN}\n[control]\nmode = "none"\n[eval]\nevery = 1000.0\n'
        f'[compression]\ncodec = "{codec}"\n'
        f"[network]\naddresses = [{addr}]\ndeadline = 30.0\n{torch_plane}"
    )


def _epochs_for(steps: int, n: int) -> float:
    per_epoch = max(1, round(SAMPLES * 0.8 / n / 16))
    return steps / per_epoch


BREAKDOWN = ("encode_ms", "wait_ms", "mix_ms")  # communication the training thread pays
WARM_UP = 5  # steps every contender runs before its clock starts
TARGETS = {"ratio_torch_plane_vs_gloo_gossip": 1.15, "ratio_grpc_vs_gloo_gossip": 1.6}
"""Upper bounds of the framework-overhead ratios (module docstring)."""


def ratios(seconds: dict[str, float]) -> dict[str, float]:
    """The bench's ratios from its per-step (or per-exchange) times in seconds, keyed
    ``peers`` (gRPC, overlap), ``bf16``, ``serial`` (no overlap), ``torch_plane``, ``compute``,
    ``gloo`` (DDP), ``gloo_fp16``, ``gossip`` (gloo ring gossip), ``exchange`` (Concord's,
    without overlap) and ``gossip_exchange`` (gloo ring gossip's)."""
    t = seconds
    out = {
        "ratio_vs_compute_only": t["peers"] / t["compute"],
        "ratio_vs_gloo": t["peers"] / t["gloo"],
        "ratio_no_overlap_vs_gloo": t["serial"] / t["gloo"],
        "ratio_bf16_vs_gloo": t["bf16"] / t["gloo"],
        "ratio_torch_plane_vs_gloo": t["torch_plane"] / t["gloo"],
        "ratio_torch_plane_vs_grpc": t["torch_plane"] / t["peers"],
        "ratio_vs_ddp_fp16_hook": t["peers"] / t["gloo_fp16"],
        "exchange_ratio_vs_gloo_gossip": t["exchange"] / t["gossip_exchange"],
        "ratio_torch_plane_vs_gloo_gossip": t["torch_plane"] / t["gossip"],
        "ratio_grpc_vs_gloo_gossip": t["peers"] / t["gossip"],
    }
    return {k: round(v, 3) for k, v in out.items()}


def targets_met(measured: dict[str, float]) -> dict[str, bool]:
    """Whether each ratio of `TARGETS` is within its bound."""
    return {k: measured[k] <= bound for k, bound in TARGETS.items()}


def steady_seconds_per_step(records: list[dict[str, Any]]) -> float:
    """A peer's training-loop pace from its step records: seconds from the end of step
    `WARM_UP` to the end of the last step (each record's ``time``), per step."""
    steady = records[WARM_UP:]
    if len(steady) < 2:
        raise ValueError(f"{len(records)} step records; the pace needs at least {WARM_UP + 2}")
    return float(steady[-1]["time"] - steady[0]["time"]) / (len(steady) - 1)


def run_peers(
    n: int,
    steps: int,
    workdir: Path,
    codec: str = "none",
    *,
    overlap: bool = True,
    transport: str = "grpc",
) -> tuple[float, dict[str, float]]:
    """Median seconds per step over the peers, and the median `Breakdown` fields (ms)."""
    workdir.mkdir(parents=True, exist_ok=True)
    addresses = [f"127.0.0.1:{_free_port()}" for _ in range(n)]
    config = workdir / "run.toml"
    epochs = _epochs_for(steps, n)
    config.write_text(_config_text(n, epochs, addresses, codec, overlap, transport))
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
    per_step, whole_run = [], []
    parts: dict[str, list[float]] = {k: [] for k in (*BREAKDOWN, "overlap_ms", "step_ms")}
    for i in range(n):
        s = json.loads((workdir / f"peer-{i}" / "summary.json").read_text())
        whole_run.append(s["wall_seconds"] / s["steps"])
        lines = (workdir / f"peer-{i}" / "metrics.jsonl").read_text().splitlines()
        records = [r for r in map(json.loads, lines) if r.get("kind") == "step"]
        per_step.append(steady_seconds_per_step(records))
        for r in records[WARM_UP:]:  # past the first steps (connections, allocator warm-up)
            for k in parts:
                parts[k].append(float(r.get(k, 0.0)))
    breakdown = {k: round(statistics.median(v), 3) for k, v in parts.items() if v}
    breakdown["whole_run_ms"] = round(statistics.median(whole_run) * 1e3, 3)
    return statistics.median(per_step), breakdown


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
    for step in range(WARM_UP):
        opt.step(task.x, task.loss_and_grad(step).grad, 0.01)
    t0 = time.perf_counter()
    for step in range(steps):
        opt.step(task.x, task.loss_and_grad(step).grad, 0.01)
    out.put((time.perf_counter() - t0) / steps)


def _mlp() -> Any:
    from torch import nn

    dims = [40, *HIDDEN, 10]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _workload(model: Any, rank: int) -> tuple[Any, Any, Any, Any]:
    """The baselines' optimizer (Concord's defaults) and this rank's 64 fixed batches."""
    import torch
    from torch import nn

    opt = torch.optim.SGD(
        model.parameters(), lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4
    )
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 16, 40, generator=gen)
    y = torch.randint(0, 10, (64, 16), generator=gen)
    return opt, x, y, nn.CrossEntropyLoss()


def _gloo_worker(rank: int, n: int, steps: int, port: int, hook: str, out: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=n)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(_mlp())
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt, x, y, loss_fn = _workload(model, rank)

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[i % 64]), y[i % 64]).backward()
        opt.step()

    for i in range(WARM_UP):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    out.put((time.perf_counter() - t0) / steps)
    dist.destroy_process_group()


def _gossip_worker(rank: int, n: int, steps: int, port: int, out: Any) -> None:
    """D-SGD on the ring written directly on torch.distributed: local step, then the flat
    parameters to both neighbours and back (`batch_isend_irecv`), average of the three."""
    import torch
    import torch.distributed as dist
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=n)
    torch.manual_seed(0)
    model = _mlp()
    opt, x, y, loss_fn = _workload(model, rank)
    left, right = (rank - 1) % n, (rank + 1) % n
    flat = parameters_to_vector(model.parameters()).detach()
    got_l, got_r = torch.empty_like(flat), torch.empty_like(flat)
    exchange: list[float] = []

    def step(i: int) -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[i % 64]), y[i % 64]).backward()
        opt.step()
        with torch.no_grad():
            flat.copy_(parameters_to_vector(model.parameters()))
            t0 = time.perf_counter()
            ops = [
                dist.P2POp(dist.isend, flat, left),
                dist.P2POp(dist.isend, flat, right),
                dist.P2POp(dist.irecv, got_l, left),
                dist.P2POp(dist.irecv, got_r, right),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            exchange.append(time.perf_counter() - t0)
            vector_to_parameters((flat + got_l + got_r) / 3.0, model.parameters())

    for i in range(WARM_UP):
        step(i)
    dist.barrier()
    exchange.clear()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    out.put(((time.perf_counter() - t0) / steps, statistics.median(exchange)))
    dist.destroy_process_group()


def _spawn_all(target: Any, n: int, extra: tuple[Any, ...]) -> Any:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(i, n, *extra, out)) for i in range(n)]
    for p in procs:
        p.start()
    times = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    if isinstance(times[0], tuple):
        return tuple(statistics.median(t[k] for t in times) for k in range(len(times[0])))
    return statistics.median(times)


def overhead_repeat(n: int, steps: int, workdir: Path) -> dict[str, float]:
    """One more measurement of the framework-overhead ratios (`TARGETS`): gloo ring gossip,
    the torch plane peers and the gRPC peers (both with overlap) back to back, so that the load
    of a shared machine changes as little as possible between the three."""
    gossip, _ = _spawn_all(_gossip_worker, n, (steps, _free_port()))
    tp, _ = run_peers(n, steps, workdir / "torch", transport="torch")
    peers, _ = run_peers(n, steps, workdir / "fp32")
    return {
        "ratio_torch_plane_vs_gloo_gossip": round(tp / gossip, 3),
        "ratio_grpc_vs_gloo_gossip": round(peers / gossip, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure the framework-overhead ratios this many times (all contenders once, "
        "then gloo gossip, torch plane and gRPC back to back); the targets judge their medians",
    )
    args = parser.parse_args()
    n, steps = args.peers, args.steps
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: must be ≥ 1")
    load_start = os.getloadavg()[0]  # the machine may be shared: say how busy it was
    with tempfile.TemporaryDirectory() as d:
        peers, parts = run_peers(n, steps, Path(d) / "fp32")
        bf16, parts_bf16 = run_peers(n, steps, Path(d) / "bf16", codec="bf16")
        serial, parts_serial = run_peers(n, steps, Path(d) / "serial", overlap=False)
        tp, parts_tp = run_peers(n, steps, Path(d) / "torch", transport="torch")
    compute = _spawn_all(_compute_worker, n, (steps, _epochs_for(steps, n)))
    gloo = _spawn_all(_gloo_worker, n, (steps, _free_port(), "none"))
    gloo_fp16 = _spawn_all(_gloo_worker, n, (steps, _free_port(), "fp16"))
    gossip, gossip_exchange = _spawn_all(_gossip_worker, n, (steps, _free_port()))
    exchange = sum(parts_serial.get(k, 0.0) for k in BREAKDOWN) / 1e3  # nothing hides it
    exposed = sum(parts.get(k, 0.0) for k in BREAKDOWN) / 1e3
    measured = ratios(
        {
            "peers": peers,
            "bf16": bf16,
            "serial": serial,
            "torch_plane": tp,
            "compute": compute,
            "gloo": gloo,
            "gloo_fp16": gloo_fp16,
            "gossip": gossip,
            "exchange": exchange,
            "gossip_exchange": gossip_exchange,
        }
    )
    print(
        f"{n} processes, ~1.09M-parameter MLP, local batch 16, 1 torch thread each, {steps} steps"
    )
    print(f"  Concord peers (ring, D-SGD, gRPC, overlap)  {peers * 1e3:8.2f} ms/step")
    print("    per step (median ms): " + ", ".join(f"{k} {v}" for k, v in parts.items()))
    print(f"  Concord peers, bf16 wire, overlap           {bf16 * 1e3:8.2f} ms/step")
    print("    per step (median ms): " + ", ".join(f"{k} {v}" for k, v in parts_bf16.items()))
    print(f"  Concord peers, no overlap                   {serial * 1e3:8.2f} ms/step")
    print("    per step (median ms): " + ", ".join(f"{k} {v}" for k, v in parts_serial.items()))
    print(f"  Concord peers, torch.distributed gloo plane {tp * 1e3:8.2f} ms/step")
    print("    per step (median ms): " + ", ".join(f"{k} {v}" for k, v in parts_tp.items()))
    print(f"  compute only (no communication)    {compute * 1e3:8.2f} ms/step")
    print(f"  torch.distributed gloo DDP         {gloo * 1e3:8.2f} ms/step")
    print(f"  gloo DDP, fp16_compress_hook       {gloo_fp16 * 1e3:8.2f} ms/step")
    print(
        f"  gloo ring gossip (batch_isend_irecv) {gossip * 1e3:6.2f} ms/step, exchange "
        f"{gossip_exchange * 1e3:.2f} ms"
    )
    repeats = [{k: measured[k] for k in TARGETS}]
    for r in range(1, args.repeat):
        with tempfile.TemporaryDirectory() as d:
            repeats.append(overhead_repeat(n, steps, Path(d)))
        print(f"  repeat {r + 1}: " + ", ".join(f"{k} {v}" for k, v in repeats[-1].items()))
    for key in TARGETS:  # the median over the repeats (the first run's alone when --repeat 1)
        measured[key] = round(statistics.median(r[key] for r in repeats), 3)
    met = targets_met(measured)
    for key, bound in TARGETS.items():
        verdict = "met" if met[key] else "missed"
        print(f"  {key} {measured[key]:.3f} (target <= {bound}, {verdict})")
    print(
        json.dumps(
            {
                "benchmark": "step_overhead",
                "processes": n,
                "steps": steps,
                "overlap": True,
                "load_average": [load_start, os.getloadavg()[0]],  # 1 min, at start and end
                "peers_ms": round(peers * 1e3, 3),
                "peers_bf16_ms": round(bf16 * 1e3, 3),
                "peers_no_overlap_ms": round(serial * 1e3, 3),
                "breakdown_ms": parts,
                "breakdown_bf16_ms": parts_bf16,
                "breakdown_no_overlap_ms": parts_serial,
                "peers_torch_plane_ms": round(tp * 1e3, 3),
                "breakdown_torch_plane_ms": parts_tp,
                "compute_only_ms": round(compute * 1e3, 3),
                "gloo_ms": round(gloo * 1e3, 3),
                "gloo_fp16_hook_ms": round(gloo_fp16 * 1e3, 3),
                "gloo_gossip_ms": round(gossip * 1e3, 3),
                "gloo_gossip_exchange_ms": round(gossip_exchange * 1e3, 3),
                "concord_exchange_ms": round(exchange * 1e3, 3),
                "exposed_comm_ms": round(exposed * 1e3, 3),
                **measured,
                "overhead_repeats": repeats,
                "targets_met": met,
            }
        )
    )


if __name__ == "__main__":
    main()
