"""Benchmark: replica-batched training vs a Python loop over n separate models.

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

Usage: ``python bench/vectorized.py [--threads T] [--repeats R] [--sizes 4 16 64] [--json-only]``.
The last line of output is always a JSON object with ``speedup_n<k>`` keys.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's universal alias)
from torch import Tensor, nn

from concord.core.models import FlatParams, ReplicaModel, build_model, loss_and_grad

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
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()

    results = {n: bench_size(n, args.repeats, args.seconds) for n in args.sizes}

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
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
