"""The training budget and model size of ``bench/edge.py``, searched in the vectorized engine
(``concord sim --engine vectorized``: the 8 replicas batched in one process, no network, seconds
per run): for each model width, budget and seed, D-SGD with one gossip round per step (no
consensus control) next to the all-reduce reference of the same budget (``concord sim``'s
``--reference allreduce``: same data, batches, initial parameters and schedule), and the steps
each needs to reach the all-reduce run's final accuracy − `TARGET_MARGIN_PP` (its worst peer's
accuracy for gossip, evaluated every ``eval.every`` epochs).

Printed: one row per (hidden, epochs, graph, seed) — final accuracies, whether the gossip run's
worst peer reaches the target, and the step ratio (gossip ÷ all-reduce steps to the target: the
factor by which a gossip step must be cheaper than an all-reduce step to win on the clock).
Last line: JSON of the rows.

    python bench/edge_budget.py [--hidden 64x64,128x128] [--epochs 4,8,12] [--seeds 0,1]
        [--graphs exponential-one-peer,ring]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._procs import ROOT, concord
from concord.core.records import EvalRecord
from concord.runtime.records import read_metrics

TARGET_MARGIN_PP = 0.5  # the target: all-reduce's final accuracy − this (bench/time_to_accuracy)
SAMPLES = 5000
EVAL_EVERY = 0.25  # epochs between evaluations (the bench's TTA resolution)


def base_sets(hidden: list[int], epochs: float, seed: int, samples: int = SAMPLES) -> list[str]:
    """The run's config overrides shared by every contender of ``bench/edge.py``."""
    return [
        "peers=8",
        "dataset=mnist1d",
        f"dataset.samples={samples}",
        "model.name=mlp",
        f"model.hidden={hidden}",
        f"epochs={epochs}",
        f"eval.every={EVAL_EVERY}",
        f"seed={seed}",
        "threads=1",
    ]


def _curve(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """(step, accuracy ``key``) of every evaluation of the run in ``run_dir``."""
    out = []
    for r in read_metrics(run_dir):
        value = getattr(r, key, None) if isinstance(r, EvalRecord) else None
        if isinstance(r, EvalRecord) and value is not None:
            out.append((r.step, float(value)))
    return out


def _first(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((step + 1 for step, acc in curve if acc >= target - 1e-9), None)


def one(out: Path, hidden: list[int], epochs: float, graph: str, seed: int) -> dict[str, Any]:
    """Gossip (one round per step on ``graph``) and its all-reduce reference, compared."""
    run = out / f"h{'x'.join(map(str, hidden))}-e{epochs:g}-{graph}-s{seed}"
    sets = [*base_sets(hidden, epochs, seed), f"topology={graph}", "control.mode=none"]
    argv = concord("sim", "--engine", "vectorized", "--quiet", "--force", "--out", str(run))
    for s in sets:
        argv += ["--set", s]
    subprocess.run(argv, check=True, cwd=ROOT, capture_output=True)
    ref = _curve(run / "reference", "accuracy_avg_model")
    gossip = _curve(run, "accuracy_worst_peer")
    target = ref[-1][1] - TARGET_MARGIN_PP / 100
    steps_ref, steps_gossip = _first(ref, target), _first(gossip, target)
    return {
        "hidden": hidden,
        "epochs": epochs,
        "graph": graph,
        "seed": seed,
        "allreduce_final": round(ref[-1][1], 4),
        "gossip_worst_final": round(gossip[-1][1], 4),
        "reached": steps_gossip is not None,
        "steps_allreduce": steps_ref,
        "steps_gossip": steps_gossip,
        "step_ratio": round(steps_gossip / steps_ref, 3) if steps_gossip and steps_ref else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", default="64x64,128x128,256x256")
    p.add_argument("--epochs", default="4,8,12")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--graphs", default="exponential-one-peer")
    args = p.parse_args(argv)
    out = Path(tempfile.mkdtemp(prefix="concord-edge-budget-"))
    rows = []
    for h in args.hidden.split(","):
        for e in args.epochs.split(","):
            for g in args.graphs.split(","):
                for s in args.seeds.split(","):
                    r = one(out, [int(x) for x in h.split("x")], float(e), g, int(s))
                    rows.append(r)
                    print(f"{h:>9s} {float(e):5g} ep {g:22s} seed {s}: all-reduce "
                          f"{r['allreduce_final']:.4f}  gossip worst "
                          f"{r['gossip_worst_final']:.4f}  steps {r['steps_allreduce']} / "
                          f"{r['steps_gossip']}", flush=True)  # fmt: skip
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
