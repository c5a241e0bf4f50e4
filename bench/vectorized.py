"""Benchmark: replica-batched training vs a Python loop over n separate models, and the vectorized
engine's step at scale.

Workload (both sides, per training step and per replica): forward + backward of Greydanus' MNIST-1D
CNN (``cnn1d``, input shape (40,), 10 classes) on a local batch of 16, then an SGD step with
Nesterov momentum 0.9 (lr 0.01, no weight decay).

* **vectorized**: one ``ReplicaModel`` with k = n, ``FlatParams``, ``loss_and_grad``, and one
  Nesterov update on the ``[n, d]`` tensors (what the vectorized simulator engine does);
* **loop**: n standard ``nn.Module`` copies, each with its own ``torch.optim.SGD(nesterov=True)``,
  stepped one after the other in Python.

Both start from the same weights and see the same random batches; a one-step check at start-up
reports how far apart their parameters end up (float rounding only). Each repetition times both
sides back to back (interleaved, so load changes on a shared machine hit both); the table reports
the median of the repetitions (min–max in the JSON). Throughput = n × 16 / seconds per step.

**Engine at scale** (``--engine-n``, default 1024; 0 skips it): the step ``concord sim --engine
vectorized --set peers=N --set model.name=mlp --set epochs=40`` runs — `Trainer.train_step` of
`concord.sim.engine`, the defaults otherwise (mnist1d, ring, D-SGD, adaptive consensus control,
so 1–2 gossip rounds a step): the whole step with its exact Ξ. After warm-up steps, it reports
wall seconds per step (total / steps), user and system CPU seconds per step
(``resource.getrusage`` deltas; the system time is mostly the kernel handing out fresh pages)
and minor page faults per step. Run it on an idle machine: other load shows up in the wall time.

**Asynchronous step** (``--async-steps``, default 12; 0 skips it): at n = 64 (mlp, mnist1d,
control off), the engine step of the asynchronous algorithms — ``ad-psgd`` and ``async-sgp``
simulated on the virtual clock (`concord.sim.asynchronous`) with speeds ``uniform:1:4``, a
one-way delay of 0.1 × the fastest step and ``async.budget = "per-peer"`` — against the
synchronous step of D-SGD on the same ``bipartite-exponential`` topology. An asynchronous
engine step is a window of virtual time as long as the fastest peer's step, in which the peers
complete ``local_steps`` local steps (≈ n / mean speed; pinned: the global budget's windows are
of n local steps). The three trainers are timed interleaved, repetition by repetition; the ratio
reported, ``async_step_ratio_n64``, is the larger median of the two algorithms over D-SGD's.

Usage: ``python bench/vectorized.py [--quick] [--threads T] [--repeats R] [--sizes 4 16 64]
[--engine-n N] [--engine-steps S] [--async-steps S] [--json-only]``. ``--quick``: 3 repetitions
of 0.2 s and 4 timed engine steps (about a minute at n = 1024 on 2 cores). The last line of output
is always a JSON object with ``speedup_n<k>`` keys and, with the engine row, ``n<N>_s_per_step``
and ``n<N>_sys_over_user``, and with the asynchronous row ``async_step_ratio_n64``.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's universal alias)
from torch import Tensor, nn

from concord.core.config import load_config
from concord.core.models import FlatParams, ReplicaModel, build_model, loss_and_grad
from concord.sim.engine import Trainer

INPUT_SHAPE = (40,)
NUM_CLASSES = 10
BATCH = 16
LR, MOMENTUM = 0.01, 0.9
POOL = 4  # distinct pre-generated batches, cycled


class ConvBase(nn.Module):
    """Greydanus (2020) MNIST-1D ``ConvBase`` as a standard module (same layers as ``cnn1d``)."""

    def __init__(self, width: int = 25) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            [
                nn.Conv1d(1, width, 5, stride=2, padding=1),
                nn.Conv1d(width, width, 3, stride=2, padding=1),
                nn.Conv1d(width, width, 3, stride=2, padding=1),
            ]
        )
        self.head = nn.Linear(width * 5, NUM_CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        h = x.view(x.shape[0], 1, x.shape[-1])
        for conv in self.convs:
            h = conv(h).relu()
        return self.head(h.flatten(1))


class Vectorized:
    """All n replicas in one ReplicaModel; Nesterov SGD as vector ops on ``[n, d]``."""

    def __init__(self, n: int) -> None:
        self.model: ReplicaModel = build_model(
            "cnn1d", n, input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES, seed=0
        )
        self.flat = FlatParams(self.model)
        self.momentum = torch.zeros_like(self.flat.data)

    def step(self, x: Tensor, y: Tensor) -> None:
        _, grad, _ = loss_and_grad(self.model, self.flat, x, y)
        with torch.no_grad():  # torch.optim.SGD's Nesterov rule: b ← μb + g; x ← x − η(g + μb)
            self.momentum.mul_(MOMENTUM).add_(grad)
            grad.add_(self.momentum, alpha=MOMENTUM)
            self.flat.data.add_(grad, alpha=-LR)


class Loop:
    """n standard models with their own torch.optim.SGD(nesterov=True), stepped in a Python loop."""

    def __init__(self, source: Vectorized) -> None:
        n = source.model.k
        self.models = [ConvBase() for _ in range(n)]
        with torch.no_grad():  # start from the vectorized side's weights
            for i, model in enumerate(self.models):
                for dst, src in zip(model.parameters(), source.model.parameters(), strict=True):
                    dst.copy_(src[i])
        self.optimizers = [
            torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
            for m in self.models
        ]

    def step(self, x: Tensor, y: Tensor) -> None:
        for i, (model, opt) in enumerate(zip(self.models, self.optimizers, strict=True)):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[i]), y[i]).backward()
            opt.step()


def max_param_gap(vec: Vectorized, loop: Loop) -> float:
    gaps = [
        float((src[i] - dst).detach().abs().max())
        for i, model in enumerate(loop.models)
        for dst, src in zip(model.parameters(), vec.model.parameters(), strict=True)
    ]
    return max(gaps)


def time_steps(
    step: Callable[[Tensor, Tensor], None], data: list[tuple[Tensor, Tensor]], steps: int
) -> float:
    start = time.perf_counter()
    for s in range(steps):
        step(*data[s % len(data)])
    return time.perf_counter() - start


def bench_size(n: int, repeats: int, target_seconds: float) -> dict[str, float]:
    gen = torch.Generator().manual_seed(n)
    data = [
        (
            torch.randn(n, BATCH, *INPUT_SHAPE, generator=gen),
            torch.randint(0, NUM_CLASSES, (n, BATCH), generator=gen),
        )
        for _ in range(POOL)
    ]
    vec = Vectorized(n)
    loop = Loop(vec)
    vec.step(*data[0])  # one identical step on both sides: same work, same result
    loop.step(*data[0])
    gap = max_param_gap(vec, loop)
    # Warm-up (allocator, kernels) and calibration: steps per repetition ≈ target_seconds.
    per_step = {
        name: time_steps(side.step, data, 3) / 3
        for name, side in (("vectorized", vec), ("loop", loop))
    }
    steps = {name: max(3, math.ceil(target_seconds / t)) for name, t in per_step.items()}
    rates: dict[str, list[float]] = {"vectorized": [], "loop": []}
    for _ in range(repeats):
        for name, side in (("vectorized", vec), ("loop", loop)):
            seconds = time_steps(side.step, data, steps[name])
            rates[name].append(n * BATCH * steps[name] / seconds)
    med = {name: statistics.median(r) for name, r in rates.items()}
    return {
        "vectorized": med["vectorized"],
        "loop": med["loop"],
        "speedup": med["vectorized"] / med["loop"],
        "vectorized_min": min(rates["vectorized"]),
        "vectorized_max": max(rates["vectorized"]),
        "loop_min": min(rates["loop"]),
        "loop_max": max(rates["loop"]),
        "param_gap_after_one_step": gap,
    }


def engine_config(n: int) -> list[str]:
    """``--set`` overrides of the engine row: the issue's ``concord sim`` command."""
    return [f"peers={n}", "model.name=mlp", "epochs=40", "eval.every=40", "engine=vectorized"]


def bench_engine(n: int, warmup: int, steps: int) -> dict[str, Any]:
    """``steps`` steps of the real vectorized engine after ``warmup`` ones (buffers allocated,
    allocator warm), timed as a whole; per-step wall/user/system seconds and minor faults."""
    trainer = Trainer(load_config(None, engine_config(n), environ={}))
    if warmup + steps > trainer.total_steps:
        raise ValueError(f"{warmup} + {steps} steps: the run has {trainer.total_steps}")
    for step in range(warmup):
        trainer.train_step(step)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    rounds, walls = 0, []
    for step in range(warmup, warmup + steps):
        t0 = time.perf_counter()
        rounds += trainer.train_step(step)["rounds"]
        walls.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {
        "n": n,
        "parameters": int(trainer.task.x.shape[1]),
        "steps": steps,
        "rounds_per_step": rounds / steps,
        "s_per_step": wall / steps,
        "s_per_step_min": min(walls),
        "s_per_step_max": max(walls),
        "user_s_per_step": user / steps,
        "sys_s_per_step": system / steps,
        "sys_over_user": system / user if user > 0 else math.inf,
        "minflt_per_step": (after.ru_minflt - before.ru_minflt) / steps,
        "maxrss_mb": after.ru_maxrss / 1024,
    }


ASYNC_N = 64
# per-peer budget: an engine step is one window as long as the fastest peer's step (the
# global budget's windows hold n local steps each: not a simulated step vs a synchronous one)
ASYNC_CLOCK = ['async.speeds="uniform:1:4"', "async.delays=0.1", 'async.budget="per-peer"']


def async_configs(n: int) -> dict[str, list[str]]:
    """``--set`` overrides of the asynchronous row: the synchronous reference and both
    asynchronous algorithms, on the same data, model and topology."""
    base = [
        f"peers={n}",
        "model.name=mlp",
        "epochs=40",
        "eval.every=40",
        "engine=vectorized",
        "control.mode=none",
        "topology=bipartite-exponential",
    ]
    return {
        "dsgd": [*base, "algorithm=dsgd"],
        "ad-psgd": [*base, "algorithm=ad-psgd", *ASYNC_CLOCK],
        "async-sgp": [*base, "algorithm=async-sgp", *ASYNC_CLOCK],
    }


def bench_async(n: int, steps: int, repeats: int) -> dict[str, Any]:
    """Seconds per engine step of D-SGD, ad-psgd and async-sgp (after 2 warm-up steps), timed
    interleaved: ``repeats`` rounds of ``steps`` steps each; medians and the ratios."""
    trainers = {k: Trainer(load_config(None, v, environ={})) for k, v in async_configs(n).items()}
    step = dict.fromkeys(trainers, 0)
    local: dict[str, int] = dict.fromkeys(trainers, 0)
    times: dict[str, list[float]] = {k: [] for k in trainers}

    def run(name: str, count: int) -> float:
        trainer = trainers[name]
        start = time.perf_counter()
        for _ in range(count):
            record = trainer.train_step(step[name])
            local[name] += record.local_steps if record.local_steps is not None else n
            step[name] += 1
        return time.perf_counter() - start

    for name in trainers:
        run(name, 2)
        local[name] = 0
    if 2 + steps * repeats > min(t.total_steps for t in trainers.values()):
        raise ValueError(f"{steps} × {repeats} async steps do not fit the run")
    for _ in range(repeats):
        for name in trainers:
            times[name].append(run(name, steps) / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    sync = med["dsgd"]
    return {
        "n": n,
        "s_per_step": med,
        "local_steps_per_step": {k: local[k] / (steps * repeats) for k in trainers},
        "ratio": {k: med[k] / sync for k in ("ad-psgd", "async-sgp")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed repetitions per side (median)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 16, 64], help="values of n")
    parser.add_argument("--seconds", type=float, default=0.4, help="target seconds per repetition")
    parser.add_argument("--json-only", action="store_true", help="print only the JSON line")
    parser.add_argument(
        "--quick", action="store_true", help="3 repetitions of 0.2 s, 4 timed engine steps"
    )
    parser.add_argument(
        "--engine-n", type=int, default=1024, help="peers of the engine row (0: no engine row)"
    )
    parser.add_argument(
        "--engine-steps", type=int, default=None, help="timed engine steps (default 8; quick 4)"
    )
    parser.add_argument(
        "--async-steps",
        type=int,
        default=12,
        help=f"timed engine steps per repetition of the asynchronous row at n = {ASYNC_N} "
        "(0: no asynchronous row)",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.seconds = min(args.repeats, 3), min(args.seconds, 0.2)
    engine_steps = args.engine_steps or (4 if args.quick else 8)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    results = {n: bench_size(n, args.repeats, args.seconds) for n in args.sizes}
    # after the loop comparison: the engine tunes glibc malloc for the whole process
    engine = bench_engine(args.engine_n, 2, engine_steps) if args.engine_n > 0 else None
    asyn = bench_async(ASYNC_N, args.async_steps, args.repeats) if args.async_steps > 0 else None

    if not args.json_only:
        print(
            f"cnn1d (MNIST-1D, input {INPUT_SHAPE}, {NUM_CLASSES} classes), local batch {BATCH}, "
            f"fwd+bwd+Nesterov SGD; torch {torch.__version__}, {threads} thread(s) for both sides "
            f"({'set by --threads' if args.threads else 'torch default'}); "
            f"median of {args.repeats} repetitions"
        )
        header = (
            f"{'n':>4} | {'vectorized samples/s':>21} | {'loop samples/s':>15} | {'speedup':>7} "
            "| 1-step gap"
        )
        print(header)
        print("-" * len(header))
        for n, r in results.items():
            print(
                f"{n:>4} | {r['vectorized']:>21,.0f} | {r['loop']:>15,.0f} | {r['speedup']:>6.2f}x "
                f"| {r['param_gap_after_one_step']:.1e}"
            )
        if engine is not None:
            print(
                f"\nengine step, mlp ({engine['parameters']:,} parameters), n = {engine['n']}, "
                f"{engine['steps']} steps after 2 warm-up ({engine['rounds_per_step']:.2f} gossip "
                f"rounds/step): {engine['s_per_step']:.3f} s/step "
                f"(min {engine['s_per_step_min']:.3f}, max {engine['s_per_step_max']:.3f}); "
                f"user {engine['user_s_per_step']:.3f} s, sys {engine['sys_s_per_step']:.3f} s "
                f"(sys/user {engine['sys_over_user']:.1%}), "
                f"{engine['minflt_per_step']:,.0f} minor faults per step; "
                f"max RSS {engine['maxrss_mb']:,.0f} MB"
            )
        if asyn is not None:
            sec, loc = asyn["s_per_step"], asyn["local_steps_per_step"]
            print(
                f"\nasynchronous engine step, mlp, n = {asyn['n']}, speeds uniform:1:4, delay "
                f"0.1 (medians of {args.repeats} × {args.async_steps} steps): D-SGD "
                f"{sec['dsgd'] * 1e3:.2f} ms/step; "
                + "; ".join(
                    f"{k} {sec[k] * 1e3:.2f} ms/step ({loc[k]:.1f} local steps/step), "
                    f"ratio {asyn['ratio'][k]:.2f}"
                    for k in ("ad-psgd", "async-sgp")
                )
            )
    summary: dict[str, object] = {
        "benchmark": "vectorized-vs-loop",
        "model": "cnn1d",
        "batch": BATCH,
        "threads": threads,
        "repeats": args.repeats,
    }
    for n, r in results.items():
        summary[f"vectorized_samples_per_s_n{n}"] = round(r["vectorized"], 1)
        summary[f"loop_samples_per_s_n{n}"] = round(r["loop"], 1)
        summary[f"speedup_n{n}"] = round(r["speedup"], 3)
        summary[f"range_n{n}"] = {
            "vectorized": [round(r["vectorized_min"], 1), round(r["vectorized_max"], 1)],
            "loop": [round(r["loop_min"], 1), round(r["loop_max"], 1)],
        }
        summary[f"param_gap_n{n}"] = r["param_gap_after_one_step"]
    if engine is not None:
        n = engine["n"]
        summary[f"n{n}_s_per_step"] = round(engine["s_per_step"], 4)
        summary[f"n{n}_user_s_per_step"] = round(engine["user_s_per_step"], 4)
        summary[f"n{n}_sys_s_per_step"] = round(engine["sys_s_per_step"], 4)
        summary[f"n{n}_sys_over_user"] = round(engine["sys_over_user"], 4)
        summary[f"n{n}_minflt_per_step"] = round(engine["minflt_per_step"])
        summary[f"n{n}_rounds_per_step"] = engine["rounds_per_step"]
        summary[f"n{n}_maxrss_mb"] = round(engine["maxrss_mb"])
    if asyn is not None:
        summary[f"async_step_ratio_n{ASYNC_N}"] = round(max(asyn["ratio"].values()), 3)
        for k, v in asyn["ratio"].items():
            summary[f"async_step_ratio_{k}_n{ASYNC_N}"] = round(v, 3)
        for k, v in asyn["local_steps_per_step"].items():
            summary[f"async_local_steps_per_step_{k}_n{ASYNC_N}"] = round(v, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
