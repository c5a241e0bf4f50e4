"""Time to accuracy at the edge: Concord's synchronous gossip against gloo DDP (fp32 and with
``fp16_compress_hook``), 8 peers / ranks, every process behind emulated WAN links
(`concord.lab.net`: the userspace delay/loss emulator and tbf rates; docs/network-emulation.md).

Profiles (`concord.core.emulation.PROFILES`, per access link; peer to peer is two links):

* ``edge``: 20 Mbit/s each way, 15 ms one-way per link (60 ms RTT peer to peer), 0.05 % loss per
  link direction (≈ 0.1 % per peer-to-peer path);
* ``edge-mixed``: ``edge`` with link delays spread from 5 to 37.5 ms over the peers (pairwise
  RTT 20–150 ms), and peers `SLOW_PEERS` computing `SLOW_FACTOR` × slower — emulated by a sleep
  of (factor − 1) × the CPU time of the step's computation before the next step
  (`concord.peer.pace.Straggler`; ``bench/_ddp.py`` does the same in a DDP rank). A sleep,
  not fewer torch threads: every process already runs one thread on a 2-core machine.

Same for every contender: MNIST-1D (5,000 samples: 4,000 train, 1,000 test), the MLP
40 → 128 → 128 → 10 (23,050 parameters), local batch 16, the config's LR schedule (lr 0.1, 5 %
warm-up, ×0.1 at 50 % and 75 %), `EPOCHS` epochs (31 steps each), seed 0: the same data, batches,
initial parameters and schedule; one torch thread per process; evaluations every 0.25 epoch.

**Budget (searched first, in the vectorized engine: ``python bench/edge_budget.py``).** D-SGD on
the one-peer exponential graph with one gossip round per step and no consensus control, next to
``concord sim``'s all-reduce reference of the same budget, seeds 0–2; target = all-reduce's final
accuracy − 0.5 pp; in how many seeds gossip's *worst* peer reaches it (all-reduce's steps /
gossip's steps to it where it does):

=========  ====================================  ====================================
 epochs     hidden 128×128                        hidden 256×256
=========  ====================================  ====================================
 4 (2 s.)   1 of 2 (104/80)                       0 of 2
 6          1 of 3 (128/176)                      2 of 3 (112/160, 120/168)
 8 (2 s.)   1 of 2 (176/216)                      1 of 2 (144/208)
 10         2 of 3 (240/256, 216/224)             1 of 3 (216/272)
 12 (2 s.)  1 of 2 (216/264)                      1 of 2 (256/368)
 16         3 of 3 (328/272, 280/352, 280/376)    3 of 3 (272/272, 376/344, 288/320)
=========  ====================================  ====================================

The 2-epoch budget of ``bench/time_to_accuracy.py`` (and anything under 16 epochs) leaves the
worst gossip peer short of all-reduce in some seeds; at 16 epochs (496 steps) it reaches the
target in every seed, needing 0.83–1.34× all-reduce's steps (128×128). So `EPOCHS` = 16.

**Model size.** 128×128: 23,050 parameters = 92 KB in fp32, 46 KB in fp16/bf16, i.e. 37 / 18 ms
of transmission at 20 Mbit/s — below the 60 ms round trip, so a step's communication is
latency-bound: the regime of the edge, where a ring all-reduce pays 2 (n − 1) = 14 sequential
one-way latencies per step and a one-peer gossip round one exchange. Its compute (a few ms a step)
keeps 8 processes within 2 cores; DDP takes ~0.95 s per step on ``edge`` and ~2.1 s on
``edge-mixed`` (measured with ``--quick``), so its 496 steps take ~8 and ~17 minutes. (The
1.09M-parameter MLP of ``bench/time_to_accuracy.py`` would be 4.4 MB per exchange, 1.7 s at
20 Mbit/s: bandwidth-bound, and a DDP run of 496 steps would take over an hour.)

Contenders (`contenders`): ``ddp_fp32``, ``ddp_fp16`` (``bench/_ddp.py``); Concord D-SGD with
consensus control off (one gossip round per step, the budget searched above; adaptive and fixed-
round control, which add gossip rounds and control messages through the broker, were not searched
here) over the graph (one-peer exponential, ring), the wire (bf16, fp32), the data plane (gRPC,
torch/gloo) and overlap (combine-then-adapt): ``dsgd_<graph>_none_<wire>[_overlap|_torch]``; and
CHOCO-SGD top-1 % on the ring (``choco_topk``). The search, on ``edge`` for 2 epochs (62 steps;
``--profiles edge --epochs 2 --contenders ...``; load average 1.5–11 meanwhile), seconds per step:
exponential bf16 gRPC 0.047, ring bf16 0.075, exponential bf16 torch plane 0.105, CHOCO 0.128,
exponential bf16 overlap 0.144, exponential fp32 0.198 (its 92 KB message outgrows TCP's initial
window of 10 segments at MTU 9000, so it pays extra round trips). So the best is
``dsgd_exp_none_bf16``, with the ring as the runner-up. `DEFAULT` names the default matrix's
contenders per profile (≤ 40 minutes: DDP fp32 only on ``edge``, where it sets the target);
``--contenders`` any of them, on every profile.

Measured (``--profiles edge --contenders ddp_fp16,dsgd_exp_none_bf16``, 16 epochs, load average
1.5–10): DDP fp16 0.89 s per step (≈ 15 RTTs: about one round trip for each of the ring's 14 hops),
target 0.625 (DDP fp16's final 0.630 − 0.5 pp) at 266 s, final 0.630, 45.3 MB sent per rank, link
utilisation 4 %; D-SGD exponential bf16 0.052 s per step, target at 13.7 s, final (worst peer)
0.645, 23.6 MB per peer, utilisation 36 %: ``tta_ratio_vs_ddp_fp16_edge`` = 0.052.

Measured per run (`bench.edge_runs`): time to accuracy (wall time from the first training step to
the first evaluation whose accuracy — Concord's worst peer — reaches the target: DDP fp32's
final accuracy − 0.5 pp (the first profile's DDP fp32 run: DDP's arithmetic does not depend on the
links; DDP fp16's when no fp32 run was made)), final accuracy, bytes per peer (its
link's eth0 frames sent), Concord's payload bytes, link utilisation (bits sent ÷ (upload rate ×
training time), mean over peers), per-step time.

Last stdout line, JSON: ``tta_ratio_vs_ddp_fp16_edge`` and ``tta_ratio_vs_ddp_fp16_mixed`` (the
best Concord contender's TTA ÷ DDP fp16's on that profile; targets ≤ 0.5 and ≤ 0.4),
``tta_ratio_vs_ddp_fp32_*``, ``best_edge`` / ``best_mixed``, ``target_acc`` and
``contenders`` (a row per run). Also written to ``--out``: ``edge.csv`` (every evaluation of
every run), the run directories. ``--quick``: 1 epoch of 1,000 samples (6 steps), DDP fp16 and
D-SGD exponential bf16 on both profiles (under 2 minutes).

``--map``: the crossover map instead (`bench.edge_map`): time per step of DDP fp16 and
``dsgd_exp_none_bf16`` over RTT (``--rtts``, default 1, 20, 80 ms) × link rate (``--rates``, 20,
100, 1000 Mbit/s), no loss, 48 steps per run, beside the α–β model
(`bench.cost_model.EdgeModel`); ``edge_map.csv`` and ``edge_map.png`` in ``--out`` (about 14
minutes; measured: docs/performance.md, "Crossover map").

    python bench/edge.py [--quick] [--profiles edge,edge-mixed] [--contenders a,b]
        [--epochs 16] [--out DIR]
    python bench/edge.py --map [--rtts 1,20,80] [--rates 20,100,1000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import concord.lab.net as netns
from bench import edge_map
from bench._procs import reap, set_tag, tagged
from bench.edge_budget import base_sets
from bench.edge_runs import Case, run_concord, run_ddp
from bench.time_to_accuracy import (
    CHOCO_TOPK,
    TORCH_PLANE,
    Contender,
    Run,
    _dsgd,
    overlap_key,
    report_targets,
    write_curves,
)

TARGET_MARGIN_PP = 0.5
HIDDEN = [128, 128]
EPOCHS = 16.0
SLOW_PEERS = (3, 6)
SLOW_FACTOR = 3.0
CASES = {"edge": Case("edge"), "edge-mixed": Case("edge-mixed", SLOW_PEERS, SLOW_FACTOR)}
JSON_KEY = {"edge": "edge", "edge-mixed": "mixed"}
GOSSIP = ("dsgd_exp_none_bf16", "dsgd_ring_none_bf16")
DEFAULT = {"edge": ("ddp_fp32", "ddp_fp16", *GOSSIP), "edge-mixed": ("ddp_fp16", *GOSSIP)}
QUICK = ("ddp_fp16", "dsgd_exp_none_bf16")


def contenders() -> list[Contender]:
    """Every contender (module docstring); `DEFAULT` / `QUICK` name those run by default."""
    exp = ("exp", "exponential-one-peer", "none")
    out = [Contender("ddp_fp32", "ddp"), Contender("ddp_fp16", "ddp", hook="fp16")]
    out += [_dsgd(*exp, wire) for wire in ("bf16", "fp32")]
    out.append(_dsgd("ring", "ring", "none", "bf16"))
    torch_plane = _dsgd(*exp, "bf16")
    out.append(Contender(f"{torch_plane.name}_torch", "concord", (*torch_plane.sets, *TORCH_PLANE)))
    key = overlap_key()
    if key is not None:
        out.append(_dsgd(*exp, "bf16", f"{key}=true"))
    out.append(CHOCO_TOPK)
    return out


@dataclass
class Settings:
    out: Path
    peers: int = 8
    hidden: list[int] = field(default_factory=lambda: list(HIDDEN))
    epochs: float = EPOCHS
    samples: int = 5000
    seed: int = 0

    def sets(self) -> list[str]:
        shared = base_sets(self.hidden, self.epochs, self.seed, self.samples)[1:]
        return [f"peers={self.peers}", *shared, "network.deadline=60",
                "network.startup_timeout=180"]  # fmt: skip


def run_all(
    s: Settings,
    matrix: Mapping[str, Sequence[Contender]],
    log: Callable[[str], None] | None = None,
) -> dict[str, list[Run]]:
    """On each profile of ``matrix`` its contenders (DDP fp32 first, then fp16: they set the
    target)."""
    out: dict[str, list[Run]] = {}
    for profile, chosen in matrix.items():
        case = CASES[profile]
        for c in sorted(chosen, key=lambda c: (c.kind != "ddp", c.name != "ddp_fp32")):
            t0 = time.monotonic()
            run = (run_ddp if c.kind == "ddp" else run_concord)(s.out, s.sets(), c, case)
            out.setdefault(profile, []).append(run)
            if log is not None:
                acc = f"{run.final_acc:.4f}" if run.final_acc is not None else "-"
                took = time.monotonic() - t0
                log(f"  {profile:10s} {c.name:28s} ok={int(run.ok)}  final {acc}  "
                    f"train {run.train_s or 0:7.1f} s  run {took:6.1f} s")  # fmt: skip
    return out


def target(by_profile: Mapping[str, Sequence[Run]]) -> float | None:
    """DDP fp32's final accuracy − `TARGET_MARGIN_PP` (its first run; DDP fp16's without one)."""
    runs = [r for rs in by_profile.values() for r in rs if r.final_acc is not None]
    for name in ("ddp_fp32", "ddp_fp16"):
        acc = next((r.final_acc for r in runs if r.name == name), None)
        if acc is not None:
            return acc - TARGET_MARGIN_PP / 100
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _row(profile: str, r: Run, target: float | None) -> dict[str, Any]:
    tta = r.tta(target) if target is not None else None
    steps = r.curve[-1][0] + 1 if r.curve else None  # the last evaluation is at the last step
    return {
        "profile": profile,
        "name": r.name,
        "ok": r.ok,
        "tta_s": round(tta, 2) if tta is not None else None,
        "final_acc": round(r.final_acc, 4) if r.final_acc is not None else None,
        "train_s": round(r.train_s, 2) if r.train_s is not None else None,
        "step_s": round(r.train_s / steps, 4) if r.train_s and steps else None,
        "bytes_per_peer": round(r.bytes_per_peer) if r.bytes_per_peer else None,
        "payload_bytes": round(r.payload_bytes) if r.payload_bytes else None,
        "link_util": r.detail.get("link_util"),
        "evals": len(r.curve),
        **({"detail": {k: v for k, v in r.detail.items() if k != "link_util"}}
           if set(r.detail) - {"link_util"} else {}),
    }  # fmt: skip


def summarize(by_profile: dict[str, list[Run]]) -> dict[str, Any]:
    """The final JSON object (module docstring)."""
    goal = target(by_profile)
    result: dict[str, Any] = {
        "benchmark": "edge",
        "target_acc": round(goal, 4) if goal is not None else None,
        "contenders": [],
    }
    for profile in CASES:
        runs = by_profile.get(profile, [])
        key = JSON_KEY[profile]
        result["contenders"] += [_row(profile, r, goal) for r in runs]
        tta = {r.name: r.tta(goal) if goal is not None else None for r in runs}
        gossip = sorted((t, n) for n, t in tta.items() if t is not None and not n.startswith("ddp"))
        best_t, best = gossip[0] if gossip else (None, None)
        result[f"best_{key}"] = best
        result[f"tta_ratio_vs_ddp_fp16_{key}"] = _ratio(best_t, tta.get("ddp_fp16"))
        result[f"tta_ratio_vs_ddp_fp32_{key}"] = _ratio(best_t, tta.get("ddp_fp32"))
    return result


def write_csv(path: Path, by_profile: dict[str, list[Run]]) -> None:
    rows = [(r, (profile, r.name)) for profile, runs in by_profile.items() for r in runs]
    write_curves(path, rows, ("profile", "contender"))


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise SystemExit(f"{flag}: expected comma-separated non-negative numbers, got {text!r}")
    return values


def crossover_map(args: argparse.Namespace, every: Mapping[str, Contender]) -> int:
    """``--map``: `bench.edge_map`'s grid measured, its CSV, heat map and JSON line."""
    points = [(r, m) for r in _floats(args.rtts, "--rtts") for m in _floats(args.rates, "--rates")]
    if any(m <= 0 for _, m in points):
        raise SystemExit("--rates: a rate must be > 0 Mbit/s")
    s = Settings(
        out=args.out or Path(tempfile.mkdtemp(prefix="concord-edge-map-")),
        epochs=args.epochs or edge_map.MAP_EPOCHS,
        samples=args.samples or 5000,
    )
    s.out.mkdir(parents=True, exist_ok=True)
    token = set_tag()
    t0 = time.monotonic()
    print(f"crossover map: {len(points)} points × {edge_map.MAP_CONTENDERS}, {s.peers} peers, "
          f"{s.epochs:g} epochs, out: {s.out}", flush=True)  # fmt: skip
    try:
        sets = [*s.sets(), "eval.every=100"]  # one evaluation, after the last step
        cells = edge_map.measure(s.out, sets, dict(every), points, s.peers,
                                 log=lambda m: print(m, flush=True))  # fmt: skip
    finally:
        reap(tagged(token))
    result = edge_map.summarize(cells, s.hidden, s.peers)
    edge_map.write_map_csv(s.out / "edge_map.csv", result["cells"])
    edge_map.plot_map(s.out / "edge_map.png", result["cells"])
    result.update(epochs=s.epochs, peers=s.peers, hidden=s.hidden,
                  wall_s=round(time.monotonic() - t0, 1), out=str(s.out))  # fmt: skip
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--profiles", default="edge,edge-mixed")
    p.add_argument("--contenders", help="comma-separated names (default: DEFAULT / QUICK)")
    p.add_argument("--epochs", type=float)
    p.add_argument("--samples", type=int)
    p.add_argument("--out", type=Path)
    p.add_argument("--map", action="store_true", help="the crossover map (bench/edge_map.py)")
    p.add_argument("--rtts", default=",".join(f"{x:g}" for x in edge_map.RTTS_MS),
                   help="--map: RTTs peer to peer, ms")  # fmt: skip
    p.add_argument("--rates", default=",".join(f"{x:g}" for x in edge_map.RATES_MBIT),
                   help="--map: link rates, Mbit/s each way")  # fmt: skip
    args = p.parse_args(argv)
    ok, why = netns.available()
    if not ok:
        print(f"network namespaces unavailable: {why}", file=sys.stderr)
        return 2
    every = {c.name: c for c in contenders()}
    if args.map:
        return crossover_map(args, every)
    profiles = args.profiles.split(",")
    names = {
        p: args.contenders.split(",") if args.contenders else QUICK if args.quick else DEFAULT[p]
        for p in profiles
        if p in CASES
    }
    bad = sorted({n for ns in names.values() for n in ns} - set(every))
    bad += sorted(set(profiles) - set(CASES))
    if bad:
        print(f"unknown contenders or profiles {bad}; valid: {sorted(every)}, {sorted(CASES)}")
        return 2
    s = Settings(
        out=args.out or Path(tempfile.mkdtemp(prefix="concord-edge-")),
        epochs=args.epochs or (1.0 if args.quick else EPOCHS),
        samples=args.samples or (1000 if args.quick else 5000),
    )
    token = set_tag()
    t0 = time.monotonic()
    print(f"{s.peers} peers, profiles {profiles}, {s.epochs:g} epochs, "
          f"{s.samples} samples, MLP {s.hidden}, out: {s.out}", flush=True)  # fmt: skip
    try:
        matrix = {p: [every[n] for n in ns] for p, ns in names.items()}
        by_profile = run_all(s, matrix, log=lambda m: print(m, flush=True))
    finally:
        reap(tagged(token))
    result = summarize(by_profile)
    result.update(epochs=s.epochs, samples=s.samples, peers=s.peers, hidden=s.hidden,
                  slow={"peers": list(SLOW_PEERS), "factor": SLOW_FACTOR},
                  wall_s=round(time.monotonic() - t0, 1), out=str(s.out))  # fmt: skip
    write_csv(s.out / "edge.csv", by_profile)
    report_targets(result, {"tta_ratio_vs_ddp_fp16_edge": 0.5, "tta_ratio_vs_ddp_fp16_mixed": 0.4})
    return 0


if __name__ == "__main__":
    sys.exit(main())
