"""One rank of the gloo DDP contenders of ``bench/time_to_accuracy.py`` and ``bench/edge.py``,
trained on exactly what a Concord peer of the same config trains on: the same data partition
and batches (`concord.core.task.ClassificationTask` of the rank), the same initial parameters
(copied from the task's replica-batched ReLU MLP, of any width, into a plain ``nn.Sequential``),
the same LR schedule (`concord.core.control.runplan.make_lr_schedule`: warm-up and milestones),
SGD with the config's momentum, Nesterov and weight decay (weights only, as
`concord.core.models.flat.FlatParams.decay_mask`), one torch thread.

``torch.nn.parallel.DistributedDataParallel`` over gloo with its defaults (25 MiB buckets,
all-reduce overlapped with the backward pass); ``--hook fp16``: PyTorch's
``fp16_compress_hook``. ``--slow-ranks 3,6 --slow-factor F``: each of those ranks sleeps, before
each step, (F − 1) × the CPU time its main thread spent on the previous step — as a Concord
straggler does (`concord.peer.pace.Straggler`'s emulation of a processor F times slower);
``--slow-factors 1,1,1.5,…``: one factor per rank instead (``bench/async.py``). ``--device-ms D``:
the factors are emulated devices instead (`concord.peer.pace.DeviceTime`, a Concord peer's
``network.device``): before each step rank r sleeps F_r·D less the CPU time its main thread spent
since its previous sleep ended (the step, rank 0's evaluation), an overrun when that CPU time
exceeds F_r·D (counted in the summary: ``device_cycles``, ``device_overruns``).

Rank 0 evaluates the model (every rank holds the same one) on the whole test set every
``eval.every`` epochs and after the last step, and writes JSON lines to ``--out``: one
``{"kind": "start", "time"}`` after the first barrier, ``{"kind": "step", "step", "time"}``
after every step (``time``: Unix seconds at its end: ``bench/edge.py --map`` takes the time per
step from them), ``{"kind": "eval", "step", "time", "accuracy"}`` (``time``: the end of the step,
before the evaluation), and a final ``{"kind": "summary", ...}``. Every rank prints its own
summary as the last line of its stdout (``compute_cpu_s``: its main thread's CPU time in the
steps; ``slow_sleep_s``: the emulation's sleeps — the rest of ``train_seconds`` it spent waiting
for the others or for a CPU). Run inside a network
namespace by the benches:

    python bench/_ddp.py --config run.toml --rank R --world N --master IP:PORT --out rank-R.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def model_from_task(task: Any) -> Any:
    """A plain ReLU MLP holding the task's initial replica-0 parameters."""
    import torch
    from torch import nn
    from torch.nn import functional

    if task.cfg.model.name != "mlp" or task.model.activation is not functional.relu:
        raise ValueError("the DDP contender is a ReLU MLP (model.name = 'mlp')")
    reps = list(task.model.layers)
    dims = [reps[0].weight.shape[2], *(r.weight.shape[1] for r in reps)]
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    linears = [m for m in model if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for lin, rep in zip(linears, reps, strict=True):
            lin.weight.copy_(rep.weight[0])
            lin.bias.copy_(rep.bias[0])
    return model


def _optimizer(model: Any, cfg: Any) -> Any:
    import torch

    o = cfg.optim
    params = list(model.parameters())
    return torch.optim.SGD(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": o.weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=o.lr,
        momentum=o.momentum,
        nesterov=o.nesterov and o.momentum > 0,
    )


class _Log:
    """Rank 0's JSON lines (other ranks write nothing)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.write_text("", encoding="utf-8")

    def __call__(self, record: dict[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


def train(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from concord.core.config import load_config
    from concord.core.control.runplan import make_lr_schedule
    from concord.core.task import ClassificationTask
    from concord.peer.pace import device_sleep

    torch.set_num_threads(1)
    cfg = load_config(args.config, environ={})
    rank, world = args.rank, args.world
    task = ClassificationTask(cfg, [rank], device=torch.device("cpu"))
    host, _, port = args.master.rpartition(":")
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = nn.parallel.DistributedDataParallel(model_from_task(task))
    if args.hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = _optimizer(model, cfg)
    schedule = make_lr_schedule(cfg, task.steps_per_epoch)
    total = schedule.total_steps
    interval = max(1, round(cfg.eval.every * task.steps_per_epoch))
    loss_fn = nn.CrossEntropyLoss()
    slow = slow_factor(args, rank, world)
    device_s = slow * args.device_ms / 1e3 if args.device_ms else None
    mark: float | None = None  # --device-ms: main-thread CPU time when the last sleep ended
    cycles = overruns = 0
    owed = slept = cpu = 0.0
    write = _Log(Path(args.out) if rank == 0 else None)
    dist.barrier()
    t_start = time.time()
    write({"kind": "start", "time": t_start})
    accuracy = None
    for step in range(total):
        if device_s is not None and mark is not None:
            owed, over = device_sleep(device_s, time.thread_time() - mark)
            cycles, overruns = cycles + 1, overruns + over
        if owed > 0:
            t0 = time.perf_counter()
            time.sleep(owed)
            slept += time.perf_counter() - t0
            owed = 0.0
        cpu0 = mark = time.thread_time()
        for group in opt.param_groups:
            group["lr"] = schedule.lr(step)
        idx = task.sampler.batch_indices(step)[0]
        opt.zero_grad(set_to_none=True)
        loss_fn(model(task.x_train[idx]), task.y_train[idx]).backward()
        opt.step()
        spent = time.thread_time() - cpu0
        cpu += spent
        if device_s is None:
            owed = (slow - 1.0) * spent
        now = time.time()
        write({"kind": "step", "step": step, "time": now})
        if rank == 0 and ((step + 1) % interval == 0 or step == total - 1):
            with torch.no_grad():
                pred = model.module(task.x_test).argmax(dim=1)
            accuracy = float((pred == task.y_test).float().mean())
            write({"kind": "eval", "step": step, "time": now, "accuracy": accuracy})
    dist.barrier()
    summary = {
        "kind": "summary",
        "rank": rank,
        "steps": total,
        "accuracy": accuracy,
        "train_seconds": time.time() - t_start,
        "slow_sleep_s": slept,
        "slow_factor": slow,
        "compute_cpu_s": cpu,
        "device_ms": args.device_ms,
        "device_cycles": cycles,
        "device_overruns": overruns,
    }
    write(summary)
    try:
        dist.destroy_process_group()
    except RuntimeError as e:  # the run is complete and recorded: a teardown race is not a failure
        # (rank 0 hosts the TCPStore; a rank still tearing down when it exits loses the store)
        print(f"rank {rank}: destroy_process_group after the run: {e}", file=sys.stderr)
    return summary


def slow_factor(args: argparse.Namespace, rank: int, world: int) -> float:
    """How many times slower rank ``rank`` computes: ``--slow-factors`` (one per rank) when
    given, else ``--slow-factor`` for the ``--slow-ranks``, else 1."""
    if args.slow_factors:
        try:
            factors = [float(x) for x in args.slow_factors.split(",")]
        except ValueError:
            factors = []
        if len(factors) != world or not all(f >= 1.0 for f in factors):
            raise SystemExit(
                f"--slow-factors: expected {world} comma-separated factors ≥ 1, "
                f"got {args.slow_factors!r}"
            )
        return factors[rank]
    slow_ranks = {int(r) for r in args.slow_ranks.split(",") if r}
    return float(args.slow_factor) if rank in slow_ranks else 1.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", required=True, help="IP:PORT of rank 0's store")
    p.add_argument("--out", required=True)
    p.add_argument("--hook", choices=("none", "fp16"), default="none")
    p.add_argument("--slow-ranks", default="", help="comma-separated ranks computing slower")
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--slow-factors", default="", help="one factor per rank, comma-separated")
    p.add_argument("--device-ms", type=float, default=0.0,
                   help="emulate devices: rank r's step takes factor_r × this many ms")  # fmt: skip
    args = p.parse_args(argv)
    if not args.device_ms >= 0:
        raise SystemExit(f"--device-ms: expected milliseconds ≥ 0, got {args.device_ms}")
    print(json.dumps(train(args)), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # skip the interpreter's teardown: torch's C++ static destructors at exit sometimes find a
    # gloo thread still joinable after a complete run and abort ("terminate called without an
    # active exception", exit −6: one rank of 8 on CI), failing a run whose records are written
    os._exit(code)
