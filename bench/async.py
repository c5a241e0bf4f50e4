"""Time to accuracy with heterogeneous compute: asynchronous gossip (AD-PSGD, asynchronous SGP)
against synchronous D-SGD and gloo DDP, 8 peers / ranks as processes on this host.

Peer / rank i runs on an emulated device `FACTORS`\\[i] times slower than the base one (1, 1,
1.5, 2, 2, 3, 4, 6): its step takes F_i × D of wall time, D = ``--device-ms`` (default
`DEVICE_MS`, 50 ms) — before each step it sleeps F_i·D less the CPU time its training thread
spent since its previous sleep ended (``network.device``, `concord.peer.pace.DeviceTime`;
``bench/_ddp.py --device-ms`` for the DDP ranks), so a synchronous step waits for the 6× device
(6 D) and an asynchronous one does not. Every process runs one torch thread; links are loopback
(no emulated network). A cycle whose CPU exceeds F_i·D is an *overrun* (the host could not keep
up: the device ran slower than emulated); each contender's ``overrun_fraction`` is in its row,
and a contender above `MAX_OVERRUN` (5 %) is listed in ``unfaithful``, warned about on stderr,
and the bench exits 3: its ratios do not measure the devices. ``cpu_cores``: the contender's
processes' CPU time ÷ its run's wall time (start-up included) — what it asked of the host.

**Evaluations** are in the device cycle: the CPU time of a peer's (or DDP rank 0's) evaluation
after step k is part of the cycle before step k + 1, so it takes no wall time of its own unless
the cycle overruns — every contender's clock excludes evaluation the same way (Concord peers
evaluate their own models, 8 × 48 evaluations of 4,000 samples, ~30 ms of CPU each; DDP rank 0
only, 48), and the curves time an evaluation at the end of its step.

**Why devices, not the CPU stretch used before** (``--device-ms 0``: peer i sleeps (F − 1) × its
step's CPU time c, `concord.peer.pace.Straggler`, ``--slow-factors``; ``--stretch S``: the sleeps
S times longer, F → 1 + S (F − 1)): on this host the 8 processes share 2 cores, so the cores, not
the emulated devices, set the pace. A synchronous step needs 8 c of CPU (≥ 4 c of wall on 2
cores) and waits for the 6× peer's 6 c; the asynchronous peers' n·T steps need 8 n·T c of CPU
on the same 2 cores, 4 c per step of the run at best — so asynchronous ≥ 4 ÷ 6 = 0.67 of the
synchronous run length whatever the algorithm, and the ≤ 0.6 target cannot be met (measured:
AD-PSGD 19.8 s against D-SGD 18.7 s, c ≈ 4.5 ms, ~17 ms of wall per step and core). Device time
decouples the pace from the host: n peers need n·c ÷ (F·D) cores, ~4.4 steps per D in all (the
sum of the speeds 1 ÷ F_i) × (c + messaging), well under 2 cores at D = 50 ms.

Same for every contender (``bench/edge.py``'s `base_sets`, with `SAMPLES` and `BATCH`):
MNIST-1D (20,000 samples: 16,000 train, 4,000 test), the MLP 40 → 512 → 512 → 10 (287,754
parameters), local batch 64, lr 0.1 with 5 % warm-up and ×0.1 at 50 % and 75 %, `EPOCHS` epochs
of 31 steps (372), seed 0: the same data, batches, initial parameters and schedule; evaluations
every 0.25 epoch. A step is mostly compute: a peer's forward/backward of 64 samples takes ~4 ms
of CPU, its bf16 message is 0.58 MB on loopback.

**Budget (checked first in the vectorized engine, seed 0):** D-SGD on the one-peer exponential
graph, one gossip round per step, against ``concord sim``'s all-reduce reference: all-reduce ends
at 0.670, so the target is 0.665; all-reduce reaches it at step 207 of 372, gossip's worst peer
at step 199 (it ends at 0.677). (With batch 16 and 5,000 samples, 12 epochs: 224 / 288 steps; 8
epochs: gossip's worst peer never reaches it.)

Contenders (`contenders`; `DEFAULT` runs all but ``async_sgp_tau16``, which diverged in the
runs measured below):

* ``ddp_fp32``, ``ddp_fp16``: ``DistributedDataParallel`` over gloo, without / with
  ``fp16_compress_hook`` (``bench/_ddp.py``);
* ``dsgd_exp_none_bf16`` and its overlapped form ``dsgd_exp_none_bf16_overlap`` (gossip
  overlapped with the gradient): synchronous D-SGD on the one-peer exponential graph, bf16 on the
  wire, no consensus control (the best synchronous set-up of ``bench/edge.py``'s search); the
  faster of the two is "sync";
* ``ad_psgd`` (on ``bipartite-exponential``: AD-PSGD needs odd peers active and even passive),
  ``async_sgp`` (on ``exponential-one-peer-directed``, SGP's graph) with the default staleness
  bound τ = 2 — its neighbours wait for a peer they are τ steps ahead of — and the default
  weight floor ``async.min_weight = 0.25`` (the figures below predate that default: 0), and
  ``async_sgp_tau16`` with τ = 16 and ``async.min_weight = 0.25`` (without the weight floor a
  peer running ahead drains its push-sum weight and diverges, docs/algorithms.md): the
  asynchronous algorithms in peer processes (``peer/asynchronous.py``), fp32 on the wire and no
  control (what they support there).

Measured per run (`bench.async_runs`): time to accuracy (wall time from the first step to the
first moment at which every peer's latest evaluation reaches the target: `async_runs.worst_curve`;
DDP: its one model), target = DDP fp32's final accuracy − `TARGET_MARGIN_PP`; final accuracy
(worst peer); mean staleness of the mixed neighbour information (records' ``staleness_mean``; 0
for synchronous contenders); idle fraction — Concord: time blocked on gossip rounds (``wait_ms``,
``control_wait_ms``) ÷ wall time, mean over peers; DDP: wall time neither computing on the main
thread nor in the emulated slowdown ÷ wall time, mean over ranks (it includes waiting for a CPU).

``--churn``: peers / ranks `async_runs.Churn.victims` (2 and 5) are SIGKILLed when peer 0 has done
30 % of its steps and started again (same command: checkpoint, then rejoin) at 60 %; DDP is not
restarted (its collective breaks: reported as it is — no torchrun elastic restart is set up), so
DDP fp32 runs once more first without churn (``ddp_fp32_no_churn``) to set the target.

**Measured with devices** (``python bench/async.py --device-ms 50``, 12 epochs, 2026-11-28, on
the 2-core machine shared with other jobs, load average 2.5–13.7 over the run, 1-minute load at
each contender's end in brackets; target 0.668 = DDP fp32's 0.673 − 0.5 pp; overruns: fraction
of device cycles whose CPU exceeded F·D; cores: the contender's CPU ÷ its wall time):

==============================  ======  =====  =======  =====  ========  =====  =================
 contender                       TTA s   final  train s  idle   overruns  cores  load
==============================  ======  =====  =======  =====  ========  =====  =================
 ddp_fp32                        69.7    .673   125.5    0.62   0         0.34   9.5
 ddp_fp16                        76.0    .672   125.9    0.62   0         0.38   8.3
 dsgd_exp_none_bf16              66.9    .677   120.4    0.54   0.031     0.46   5.9
 dsgd_exp_none_bf16_overlap      71.6    .678   129.9    0.49   0.031     0.43   9.8
 ad_psgd                         32.8    .671    49.0    0.01   0.031     1.16   7.6
 async_sgp                       63.7    .680   113.5    0.56   0.031     0.55   2.5
==============================  ======  =====  =======  =====  ========  =====  =================

``tta_ratio_async_vs_sync`` = 0.489 (≤ 0.6: met), ``tta_ratio_async_vs_ddp`` = 0.47 (≤ 0.5:
met); ``unfaithful`` empty; the whole matrix 756 s. The devices ran as emulated: median step
periods of AD-PSGD's peers 52, 54, 78, 105, 104, 156, 207, 309 ms for factors 1 … 6 (F·D = 50 …
300 ms), median step CPU 3.9–4.7 ms for every contender. AD-PSGD's local steps 666, 640, 450,
340, 344, 238, 186, 127 (``budget_used`` 1.005): the fast peers take 5× the 6× peer's steps, on
their own shards, yet every peer ended at 0.671–0.675 (worst 0.6708, against D-SGD's 0.6765 and
DDP's 0.673) — no data-sampling change was needed at these factors. async-sgp (τ = 2) waits
for the slow peer like a synchronous run (idle 0.56). The overruns (3.1 %, under `MAX_OVERRUN`)
are the two factor-1 peers' evaluations: a Concord evaluation takes 65–72 ms of CPU, more than
the 50 ms cycle (DDP's evaluation of its plain ``nn.Sequential`` fits; 0 overruns).

**Evaluation is not free for Concord.** A Concord evaluation took ~260 ms of *wall* time (median
gap between an evaluated step's end and the next step's start; 70 ms of it CPU, the rest GIL and
CPU contention with the peer's event loop and the other processes) — outside the device cycle,
so the fast peers' evaluations cost their run time: ~12 s of AD-PSGD's 49 s per peer, 8.5 s of
D-SGD's; DDP rank 0's evaluations hid in the 6× rank's slack (0.6 s of extra step time in all).
With each peer's own evaluation gaps taken off its clock (offline, from the same records; DDP:
the steps after an evaluation beyond the median period) the TTAs are DDP fp32 69.3, D-SGD 62.8,
overlap 62.7, AD-PSGD 27.2, async-sgp 61.7 s: ratios 0.43 / 0.39. The bench keeps evaluation in
every clock (what a user polling the peers sees); that counts against the asynchronous side.

**Measured with the CPU stretch** (before devices: ``--device-ms 0``; 12 epochs, on a 2-core
machine shared with other jobs: load average per run in brackets; TTA in seconds / final
worst-peer accuracy; target 0.668 = DDP fp32's 0.673 − 0.5 pp).
Rows "per-peer": before ``async.budget`` existed, every asynchronous peer took its own 372
steps; rows "global": the asynchronous contenders on ``async.budget = "global"`` (the peers take
8 × 372 local steps in all, docs/algorithms.md#the-global-budget):

===================  ===========  ===========  ===========  ===========  ===========  ===========
 run                  ddp_fp32     ddp_fp16     dsgd bf16    + overlap    ad_psgd      async_sgp
===================  ===========  ===========  ===========  ===========  ===========  ===========
 per-peer (2–12)      13.0/.673    14.8/.672    16.3/.676    16.3/.679    18.5/.670    25.0/.669
 per-peer (20–33)     28.7/.673    28.8/.672    22.4/.678    35.8/.678    25.5/.673    29.9/.676
 per-peer, S = 10     46.2/.673    66.2/.672    56.3/.677    59.0/.679    never/.642   53.0/.676
 per-peer, churn      stopped      —            47.3/.668    —            never/.641   never/.638
 global (6–18)        12.2/.673    15.2/.672    17.1/.675    17.3/.677    16.8/.680    never/.616
 global (6–17)        12.7/.673    14.8/.672    19.3/.676    18.7/.677    19.8/.674    never/.649
 global, S = 10       47.6/.673    60.1/.672    53.3/.677    52.5/.678    never/.660   49.3/.676
===================  ===========  ===========  ===========  ===========  ===========  ===========

(per-peer stretch 10 at load 6–14, churn 11–18; global stretch 10 at 6–11. The whole default
matrix: 244 s at load 2–12, 482 s at 20–33, 265–273 s for the global rows at 6–18; stretch 10:
586 s.) ``async_sgp_tau16`` diverged without the weight floor (step 45; again at steps 4–13);
with ``async.min_weight = 0.25`` it ran all 372 steps to 0.636 (per-peer, below the target).

Ratios (``tta_ratio_async_vs_sync`` / ``tta_ratio_async_vs_ddp``; targets ≤ 0.6 / ≤ 0.5):
per-peer 1.14 / 1.43 (quiet), 0.89 (loaded), 0.94 / 1.15 (stretch 10); global 0.98 / 1.38 and
1.06 / 1.55 (default), 0.94 / 1.04 (stretch 10). Neither target is met. What the global budget
changed: AD-PSGD's run is no longer as long as its slowest peer's 372 steps — the fast peers do
the slow ones' share (local steps 657, 479, 401, 353, 401, 313, 226, 178 for the factors above;
the total 1.011 × 8 × 372, ``budget_used``: the peers stop on their progress vectors' estimate,
a lower bound, so they overshoot by what the news takes to cross the graph) — and its run took
24–26 s against D-SGD's 30–33 s and DDP fp32's 22–23 s. Why the targets are still missed:

1. **Time to accuracy is set by the schedule, not by the run's end.** Every contender reaches
   0.668 only after the learning-rate drops at 50 % and 75 % of the budget, at 55–80 % of its
   run, so the TTA ratio is about the ratio of run lengths: AD-PSGD's 25 s ÷ D-SGD's 32 s ≈ 0.8
   at best, not 0.6.
2. **The compute is not where the time goes.** Wall time per step outside waits and sleeps was
   1.0–1.4 × its CPU time (4.5 ms) in these runs — so ``--stretch`` 1 is what S ≈ wall ÷ CPU
   gives, and the factors were applied as intended — yet the asynchronous peers together took
   8 × 372 steps in ~25 s on 2 cores: ~17 ms of wall per step and core against 4.5 ms of
   compute. Evaluations are one cost that DDP does not share: every Concord peer evaluates its
   own model on the 4,000 test samples every 0.25 epoch (8 × 48 evaluations of ~30 ms of CPU
   each, ~12 s of CPU; DDP: rank 0 only, 48), the event loops and gRPC messages are others
   (not measured separately). DDP's all-reduce of one 287,754-parameter model is cheap on
   loopback, so waiting for the 6× rank costs it less than Concord's overheads.
3. **async-sgp still waits** (τ = 2: its neighbours wait for the slow peer, idle 0.36–0.43)
   and, in processes without ``async.min_weight``, showed loss spikes (up to 119 at the 6×
   peer) and ended at 0.616 and 0.649 in the two global default runs against 0.669–0.676
   per-peer; whether the global budget makes the push-sum instability more likely is not
   established.
4. **With ``--stretch 10``** the sleeps were 10× the intended ones (wall ≈ CPU here, so the
   effective factors were 1–51×): AD-PSGD then ran its 8 × 372 steps in 25 s, 3.6× faster than
   D-SGD, but its fastest peers did most of them (1,465 and 773 of 3,009) on their own shards
   and it ended at 0.660 — global budget or not, data processed mostly from 2 of 8 shards.

Under churn (per-peer rows) every Concord contender finishes (each restarted peer resumed from
its checkpoint, steps 80–112, then adopted a neighbour's parameters and step, 265–361), DDP
stops with the killed ranks; async-sgp loses the push-sum mass the killed peers held.

**Churn with devices, global budget** (``python bench/async.py --device-ms 50 --churn
--contenders ddp_fp32,dsgd_exp_none_bf16,ad_psgd,async_sgp``, 2026-11-28, load 0.1–2.9; TTA s
/ final worst-peer accuracy / ``budget_used``; target 0.668 from ``ddp_fp32_no_churn``, 68.0 s
/ .673): DDP fp32 stops at the kill (.594: every rank exits, gloo "Connection closed by
peer"); D-SGD bf16 84.1 / .672 / 0.916; async-sgp 75.6 / .683 / 0.919; AD-PSGD never / .639 /
0.862 — its restarted peers had taken a neighbour's step, jumping 181 and 226 steps that then
counted as progress. With AD-PSGD's rejoiners keeping their own step (the fix, re-run with
``--contenders ad_psgd`` against the same target): 23.5 / .685 / 1.005, a ratio of 0.28 to
D-SGD's and 0.35 to DDP's run without churn.

To re-run on an idle machine: ``python bench/async.py --device-ms 50`` (the default matrix,
~13 minutes: each synchronous contender ~125 s of training, 372 steps at the 6× device's 300 ms,
plus ~15–40 s of start-up; AD-PSGD ~50 s; async-sgp ~115 s); the run is faithful when every row's
``overrun_fraction`` is ≤ 0.05 (exit status 0; 3 lists the others in ``unfaithful``). A smaller
D shortens it (D = 25 ms: ~7 minutes) but the factor-1 peers' evaluations then overrun more.

Last stdout line, JSON: ``tta_ratio_async_vs_sync`` (best asynchronous TTA ÷ best synchronous
D-SGD's; target ≤ 0.6), ``tta_ratio_async_vs_ddp`` (÷ the faster DDP's; target ≤ 0.5),
``best_async``, ``best_sync``, ``target_acc``, ``unfaithful``, ``device_ms`` and ``contenders``
(a row per run: ``tta_s``, ``final_acc``, ``overrun_fraction``, ``cpu_cores``, Concord's
``local_steps`` and ``final_acc_per_peer``); ``async.csv``
(every point of every curve) and the run directories in ``--out``. ``--quick``: 2 epochs of 4,000
samples (12 steps).

    python bench/async.py [--device-ms D | --device-ms 0 --stretch S] [--quick] [--churn]
                          [--contenders a,b] [--epochs E] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._procs import reap, set_tag, tagged
from bench.async_runs import Churn, Settings, run_concord, run_ddp
from bench.edge_budget import base_sets
from bench.time_to_accuracy import (
    Contender,
    Run,
    _dsgd,
    overlap_key,
    report_targets,
    write_curves,
)

TARGET_MARGIN_PP = 0.5
FACTORS = (1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 6.0)
HIDDEN = [512, 512]
EPOCHS = 12.0
SAMPLES = 20000
BATCH = 64
TRAIN_SHARE = 0.8  # MNIST-1D's train / test split
LOOSE_TAU = 16  # async-sgp's staleness bound in its second variant (default τ = 2)
ASYNC = ("ad_psgd", "async_sgp", f"async_sgp_tau{LOOSE_TAU}")
REFERENCE = "ddp_fp32_no_churn"  # --churn: DDP fp32 run without churn, for the target
DEFAULT = ("ddp_fp32", "ddp_fp16", "dsgd_exp_none_bf16", "dsgd_exp_none_bf16_overlap",
           "ad_psgd", "async_sgp")  # fmt: skip
RATIO_BOUNDS = {"tta_ratio_async_vs_sync": 0.6, "tta_ratio_async_vs_ddp": 0.5}
DEVICE_MS = 50.0  # the base device's step time (--device-ms)
MAX_OVERRUN = 0.05  # a contender whose steps overran more often was not emulated faithfully
# peer processes: rounds may wait for a 6× peer; a killed peer is skipped after 3 deadlines
CONCORD_SETS = ("network.deadline=3", "network.startup_timeout=180")


def contenders() -> list[Contender]:
    """Every contender (module docstring)."""
    exp = ("exp", "exponential-one-peer", "none", "bf16")
    out = [Contender("ddp_fp32", "ddp"), Contender("ddp_fp16", "ddp", hook="fp16")]
    out.append(_dsgd(*exp))
    key = overlap_key()
    if key is not None:
        out.append(_dsgd(*exp, f"{key}=true"))
    # what peer processes support; the global budget: the peers together take n·T local steps
    raw = ("compression.codec=none", "control.mode=none", "async.budget=global")
    out.append(Contender("ad_psgd", "concord", ("algorithm=ad-psgd", *raw,
                                                "topology=bipartite-exponential")))  # fmt: skip
    sgp = ("algorithm=async-sgp", *raw, "topology=exponential-one-peer-directed")
    out.append(Contender("async_sgp", "concord", sgp))
    out.append(Contender(f"async_sgp_tau{LOOSE_TAU}", "concord",
                         (*sgp, f"async.max_staleness={LOOSE_TAU}",
                          "async.min_weight=0.25")))  # fmt: skip
    return out


def stretched(factors: Sequence[float], stretch: float) -> tuple[float, ...]:
    """The slowdown factors with their sleeps ``stretch`` times longer: 1 + S (F − 1)."""
    return tuple(round(1.0 + stretch * (f - 1.0), 6) for f in factors)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def target(runs: Sequence[Run]) -> float | None:
    """DDP fp32's final accuracy − `TARGET_MARGIN_PP`: of its run without churn (`REFERENCE`)
    when there is one, else of ``ddp_fp32``'s, else ``ddp_fp16``'s — a run that completed."""
    for name in (REFERENCE, "ddp_fp32", "ddp_fp16"):
        acc = next((r.final_acc for r in runs if r.name == name and r.ok), None)
        if acc is not None:
            return acc - TARGET_MARGIN_PP / 100
    return None


def _best(tta: dict[str, float | None], names: Sequence[str]) -> tuple[str | None, float | None]:
    got = sorted((t, n) for n, t in tta.items() if n in names and t is not None)
    return (got[0][1], got[0][0]) if got else (None, None)


def unfaithful(runs: Sequence[Run]) -> list[str]:
    """The contenders whose emulated devices overran more than `MAX_OVERRUN` of their cycles."""
    out = []
    for r in runs:
        f = r.detail.get("overrun_fraction")
        if isinstance(f, float | int) and f > MAX_OVERRUN:
            out.append(r.name)
    return out


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """The final JSON object (module docstring)."""
    goal = target(runs)
    tta = {r.name: r.tta(goal) if goal is not None else None for r in runs}
    best_async, t_async = _best(tta, ASYNC)
    best_sync, t_sync = _best(tta, [r.name for r in runs if r.name.startswith("dsgd")])
    best_ddp, t_ddp = _best(tta, ("ddp_fp32", "ddp_fp16"))
    rows = []
    for r in runs:
        t = tta[r.name]
        rows.append({
            "name": r.name,
            "ok": r.ok,
            "tta_s": round(t, 2) if t is not None else None,
            "final_acc": round(r.final_acc, 4) if r.final_acc is not None else None,
            "train_s": round(r.train_s, 2) if r.train_s is not None else None,
            "staleness": r.detail.get("staleness", None if r.name in ASYNC else 0.0),
            "idle_fraction": r.detail.get("idle_fraction"),
            **{k: v for k, v in r.detail.items() if k not in ("staleness", "idle_fraction")},
        })  # fmt: skip
    return {
        "benchmark": "async",
        "tta_ratio_async_vs_sync": _ratio(t_async, t_sync),
        "tta_ratio_async_vs_ddp": _ratio(t_async, t_ddp),
        "best_async": best_async,
        "best_sync": best_sync,
        "best_ddp": best_ddp,
        "target_acc": round(goal, 4) if goal is not None else None,
        "unfaithful": unfaithful(runs),
        "contenders": rows,
    }


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def run_all(
    s: Settings, chosen: Sequence[Contender], log: Callable[[str], None] | None = None
) -> list[Run]:
    """Each contender once, DDP first (DDP fp32 sets the target); with churn, DDP fp32 first
    without it (`REFERENCE`: a DDP that lost ranks sets no target)."""
    runs = []
    order = sorted(chosen, key=lambda c: (c.kind != "ddp", c.name != "ddp_fp32"))
    if s.churn is not None and any(c.kind == "ddp" for c in chosen):
        order.insert(0, Contender(REFERENCE, "ddp"))
    for c in order:
        t0 = time.monotonic()
        cpu0 = _children_cpu()
        where = replace(s, churn=None) if c.name == REFERENCE else s
        run = (run_ddp if c.kind == "ddp" else run_concord)(where, c)
        run.detail["load_avg_1m"] = round(os.getloadavg()[0], 2)  # the machine is shared
        # the contender's processes' CPU ÷ the run's wall time: cores it kept busy
        run.detail["cpu_cores"] = round((_children_cpu() - cpu0) / (time.monotonic() - t0), 3)
        runs.append(run)
        if log is not None:
            acc = f"{run.final_acc:.4f}" if run.final_acc is not None else "-"
            over = run.detail.get("overrun_fraction")
            log(f"  {c.name:28s} ok={int(run.ok)}  final {acc}  train {run.train_s or 0:7.1f} s"
                f"  run {time.monotonic() - t0:6.1f} s  load {os.getloadavg()[0]:.1f}"
                f"  cores {run.detail['cpu_cores']}  overruns {over}")  # fmt: skip
    return runs


def write_csv(path: Path, runs: Sequence[Run]) -> None:
    write_curves(path, [(r, (r.name,)) for r in runs], ("contender",), "worst_accuracy")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--churn", action="store_true")
    p.add_argument("--contenders", help="comma-separated names (default: all)")
    p.add_argument("--epochs", type=float)
    p.add_argument("--samples", type=int)
    p.add_argument("--out", type=Path)
    p.add_argument("--stretch", type=float, default=1.0, help="scale the slowdowns' sleeps")
    p.add_argument("--device-ms", type=float, default=DEVICE_MS,
                   help="base device's step time (ms); 0: stretch CPU time instead")  # fmt: skip
    args = p.parse_args(argv)
    if not args.stretch >= 1.0:
        print(f"--stretch: expected a number ≥ 1, got {args.stretch}", file=sys.stderr)
        return 2
    if not args.device_ms >= 0 or (args.device_ms > 0 and args.stretch != 1.0):
        print(f"--device-ms: expected ms ≥ 0, and 0 with --stretch; got {args.device_ms}",
              file=sys.stderr)  # fmt: skip
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the teardown (reap) below
    every = {c.name: c for c in contenders()}
    names = args.contenders.split(",") if args.contenders else [n for n in DEFAULT if n in every]
    bad = sorted(set(names) - set(every))
    if bad:
        print(f"unknown contenders {bad}; valid: {sorted(every)}", file=sys.stderr)
        return 2
    epochs = args.epochs or (2.0 if args.quick else EPOCHS)
    samples = args.samples or (4000 if args.quick else SAMPLES)
    steps_per_epoch = int(samples * TRAIN_SHARE) // len(FACTORS) // BATCH
    s = Settings(
        out=args.out or Path(tempfile.mkdtemp(prefix="concord-async-")),
        sets=(*base_sets(HIDDEN, epochs, 0, samples), f"optim.batch_size={BATCH}", *CONCORD_SETS),
        factors=stretched(FACTORS, args.stretch),
        total_steps=int(epochs * steps_per_epoch),
        churn=Churn() if args.churn else None,
        device_ms=args.device_ms or None,
    )
    token = set_tag()
    t0 = time.monotonic()
    load0 = os.getloadavg()
    print(f"{len(FACTORS)} peers ×{list(s.factors)}, device {s.device_ms} ms, "
          f"{epochs:g} epochs ({s.total_steps} steps), "
          f"{samples} samples, MLP {HIDDEN}, churn {bool(s.churn)}, out: {s.out}, "
          f"load {load0[0]:.1f}", flush=True)  # fmt: skip
    try:
        runs = run_all(s, [every[n] for n in names], log=lambda m: print(m, flush=True))
    finally:
        reap(tagged(token))
    result = summarize(runs)
    result.update(epochs=epochs, samples=samples, hidden=HIDDEN, factors=list(FACTORS),
                  stretch=args.stretch, factors_applied=list(s.factors),
                  device_ms=s.device_ms,
                  churn=bool(s.churn), wall_s=round(time.monotonic() - t0, 1),
                  load_avg={"start": [round(x, 2) for x in load0],
                            "end": [round(x, 2) for x in os.getloadavg()]},
                  out=str(s.out))  # fmt: skip
    write_csv(s.out / "async.csv", runs)
    if result["unfaithful"]:
        print(f"UNFAITHFUL emulation: {result['unfaithful']} overran their device time in more "
              f"than {MAX_OVERRUN:.0%} of their steps (host too slow or loaded for "
              f"--device-ms {args.device_ms:g}): the ratios below do not measure the devices",
              file=sys.stderr)  # fmt: skip
    report_targets(result, RATIO_BOUNDS)
    return 3 if result["unfaithful"] else 0


if __name__ == "__main__":
    sys.exit(main())
