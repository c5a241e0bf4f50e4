"""Time to accuracy on a shaped network: Concord's gossip contenders against gloo DDP, every
process in a network namespace of its own with its link capped (``bench/netns.py``, tc tbf both
ways), on the clock.

The run (defaults; all flags below): 8 peers, MNIST-1D generated locally (5,000 samples: 4,000
train, 1,000 test), the 1.09M-parameter MLP (40 → 1024 → 1024 → 10), local batch 16, the config's
LR schedule (lr 0.1, 5 % warm-up, ×0.1 at 50 % and 75 %) — the same data, batches, initial
parameters, epochs and schedule for every contender; one torch thread per process; every link
(peers, DDP ranks, orchestrator, broker) capped at ``--mbit`` (default 100 Mbit/s) both ways.

Contenders (`CONTENDERS`; one line each — an ``overlap`` variant is added when the config has the
switch, `overlap_key`):

* ``ddp_fp32`` / ``ddp_fp16``: ``torch.nn.parallel.DistributedDataParallel`` over gloo, 8 ranks,
  default bucketing, without / with PyTorch's ``fp16_compress_hook`` (``bench/_ddp.py``);
* ``dsgd_<graph>_<control>_<wire>``: Concord D-SGD (``concord peer`` × 8 + ``concord
  orchestrator`` + Mosquitto) on the ring and on the one-peer exponential graph, with consensus
  control off (``none``) and adaptive in phase 1 (``adaptive``: ``control.factor`` =
  `ADAPTIVE_FACTOR`, ``control.max_rounds`` = `MAX_ROUNDS`), fp32 and bf16 on the wire;
* ``dsgd_exp_fixed3_bf16``: D-SGD on the one-peer exponential graph, bf16, exactly
  `FIXED_ROUNDS` gossip rounds in every step of phase 1 (``control.mode = "fixed"``) — the
  rounds adaptive control settles on here, without its per-round decisions;
* ``choco_topk``: CHOCO-SGD on the ring with top-k (1 %) compression, γ = 0.1;
* ``dsgd_exp_none_bf16_overlap``: D-SGD's combine-then-adapt form, gossip overlapped with the
  gradient (``overlap = true``), when the config has that switch;
* only when named with ``--contenders``: ``dsgd_exp_{none,adaptive}_bf16_torch``, the same gossip
  over the torch.distributed data plane (``network.transport = "torch"``, gloo).

Each is run twice: as is, and with one straggler (peer / rank 3 computing `STRAGGLER_FACTOR`
times slower: ``network.straggler`` for Concord, `concord.peer.pace.Straggler`; the same sleep in
the DDP rank).

Measured per run: wall time from the start of the first training step (the earliest peer's;
DDP: after its first barrier) to each evaluation (every ``--eval-every`` epochs and at the end),
and the test accuracy there — for Concord that of *every* peer (the worst peer's, on the whole
test set: its own model, not the average of all), for DDP the one model; the target is DDP fp32's
final accuracy − 0.5 pp (`TARGET_MARGIN_PP`); ``tta_s`` is the first evaluation at which the
(worst) accuracy reaches it (null: never). ``bytes_per_peer``: mean over peers of the bytes its
link carried out (eth0 counters: payload, framing, TCP/IP headers and control); ``payload_bytes``:
Concord's own count of tensor bytes sent (``bytes_sent_total``).

Written to ``--out`` (default: a temporary directory, kept): ``tta.csv`` (one row per evaluation
of every run), ``tta.png`` (accuracy against wall time, without and with the straggler), the run
directories. Last stdout line: one JSON object with ``tta_ratio_vs_ddp`` and
``tta_ratio_vs_ddp_fp16`` (best Concord ÷ DDP fp32 / fp16 hook), ``tta_ratio_straggler`` (best
Concord ÷ the faster DDP, both with the straggler), ``target_acc`` and ``contenders`` (the
per-run figures).

Sizing, so that the whole bench (26 runs, ~17 s of start-up and teardown each) ends within
30 minutes on this 2-core machine: links at 100 Mbit/s (DDP fp32 ~0.95 s/step there), 2 epochs
(62 steps of 8 × 16 samples), evaluations every 0.2 epoch (6 steps); measured wall time in
docs/performance.md#time-to-accuracy. ``--quick``: 1 epoch of 2,000 samples, 4 contenders (DDP
fp32, DDP fp16, D-SGD exponential bf16, CHOCO) with and without the straggler (~4 minutes).

    python bench/time_to_accuracy.py [--quick] [--mbit 100] [--epochs 2] [--out DIR]
        [--contenders a,b] [--no-straggler]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import concord.lab.net as netns
from bench._procs import ROOT, jsonl, reap, set_tag, spawn, tagged, tail
from bench.chaos_runs import Deployment, write_config
from bench.step_overhead import HIDDEN
from concord.core.records import EvalRecord, StepRecord
from concord.runtime.records import read_metrics, read_peer_summary

TARGET_MARGIN_PP = 0.5
STRAGGLER_PEER = 3
STRAGGLER_FACTOR = 4.0
# adaptive control, phase 1 (the config's default phases): target = ADAPTIVE_FACTOR × the EMA of
# the gradient norm, at most MAX_ROUNDS[graph] rounds per step (3 rounds of the one-peer
# exponential graph average 8 peers exactly; more would repeat the cycle). The factor was chosen
# on this task in the vectorized engine (`concord sim --engine vectorized`, seeds 0 and 1, the
# bench's settings): the config's default 0.25 ran ~70 rounds in 62 steps and ended 1.7–2.1 pp
# below all-reduce; 0.1 and 0.05 run ~119 and end within 0.2 pp of it on the exponential graph.
ADAPTIVE_FACTOR = 0.1
FIXED_ROUNDS = 3  # dsgd_exp_fixed3_bf16: the one-peer exponential graph's exact average of 8
MAX_ROUNDS = {"ring": 4, "exp": 3}
RUN_TIMEOUT = 900.0  # seconds one run may take
DDP_PORT = 29500
STORE_PORT = 29501  # the orchestrator's TCPStore for the torch data plane
TORCH_PLANE = ("network.transport=torch", "network.torch.init=orchestrator",
               f"network.torch.store_port={STORE_PORT}")  # fmt: skip


@dataclass(frozen=True)
class Contender:
    """One way to train: ``kind`` "ddp" (``hook``: "none" / "fp16") or "concord" (``sets``:
    config overrides on top of `base_sets`)."""

    name: str
    kind: str
    sets: tuple[str, ...] = ()
    hook: str = "none"


def _dsgd(graph: str, topology: str, control: str, wire: str, *extra: str) -> Contender:
    codec = {"fp32": "none", "bf16": "bf16"}[wire]
    sets = [f"topology={topology}", f"control.mode={control}", f"compression.codec={codec}"]
    if control == "adaptive":
        sets += [f"control.max_rounds={MAX_ROUNDS[graph]}", f"control.factor={ADAPTIVE_FACTOR}"]
    suffix = "_overlap" if extra else ""
    return Contender(f"dsgd_{graph}_{control}_{wire}{suffix}", "concord", (*sets, *extra))


def overlap_key() -> str | None:
    """The dotted config key of D-SGD's overlap switch, if the config has one."""
    from concord.core.config import RunConfig

    if "overlap" in RunConfig.model_fields:
        return "overlap"
    for name, f in RunConfig.model_fields.items():
        model = f.annotation
        if isinstance(model, type) and "overlap" in getattr(model, "model_fields", {}):
            return f"{name}.overlap"
    return None


CHOCO_TOPK = Contender(
    "choco_topk",
    "concord",
    (
        "algorithm=choco",
        "topology=ring",
        "compression.codec=topk",
        "compression.ratio=0.01",
        "compression.gamma=0.1",
        "control.mode=none",
    ),
)
"""CHOCO-SGD on the ring with top-k (1 %) compression, γ = 0.1 (also a contender of
``bench/edge.py``)."""


def contenders() -> list[Contender]:
    out = [Contender("ddp_fp32", "ddp"), Contender("ddp_fp16", "ddp", hook="fp16")]
    out += [
        _dsgd(graph, topology, control, wire)
        for graph, topology in (("ring", "ring"), ("exp", "exponential-one-peer"))
        for control in ("none", "adaptive")
        for wire in ("fp32", "bf16")
    ]
    out.append(CHOCO_TOPK)
    # equal-budget control: exactly FIXED_ROUNDS rounds in every phase-1 step, no decisions to
    # wait for (what adaptive control converges to here, without its per-round barrier)
    fixed = _dsgd("exp", "exponential-one-peer", "none", "bf16")
    sets = (
        *fixed.sets[:1],
        "control.mode=fixed",
        f"control.rounds={FIXED_ROUNDS}",
        *fixed.sets[2:],
    )
    out.append(Contender(f"dsgd_exp_fixed{FIXED_ROUNDS}_bf16", "concord", sets))
    key = overlap_key()
    if key is not None:  # combine-then-adapt D-SGD, gossip overlapped with compute
        out.append(_dsgd("exp", "exponential-one-peer", "none", "bf16", f"{key}=true"))
    return out


def extra_contenders() -> list[Contender]:
    """Run only when named (``--contenders``; the default matrix keeps to 30 minutes): the
    exponential-graph gossip over the torch.distributed data plane (gloo, as the DDP ranks)."""
    out = []
    for control in ("none", "adaptive"):
        c = _dsgd("exp", "exponential-one-peer", control, "bf16")
        out.append(Contender(f"{c.name}_torch", c.kind, (*c.sets, *TORCH_PLANE)))
    return out


QUICK = ("ddp_fp32", "ddp_fp16", "dsgd_exp_none_bf16", "choco_topk")


@dataclass
class Settings:
    out: Path
    peers: int = 8
    mbit: float = 100.0
    epochs: float = 2.0
    samples: int = 5000
    eval_every: float = 0.2
    hidden: list[int] = field(default_factory=lambda: list(HIDDEN))

    def base_sets(self) -> list[str]:
        return [
            f"peers={self.peers}",
            "dataset=mnist1d",
            f"dataset.samples={self.samples}",
            "model.name=mlp",
            f"model.hidden={self.hidden}",
            f"epochs={self.epochs}",
            f"eval.every={self.eval_every}",
            "seed=0",
            "threads=1",
            "network.deadline=30",
            "network.startup_timeout=180",
        ]


@dataclass
class Run:
    """One contender's run: its evaluations ``curve`` (seconds since its training started,
    accuracy — the worst peer's for Concord), and what it cost."""

    name: str
    straggler: bool
    ok: bool = False
    curve: list[tuple[int, float, float]] = field(default_factory=list)  # (step, s, acc)
    mean_acc: list[float] = field(default_factory=list)  # Concord: mean peer accuracy
    train_s: float | None = None
    bytes_per_peer: float | None = None
    payload_bytes: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def final_acc(self) -> float | None:
        return self.curve[-1][2] if self.curve else None

    def tta(self, target: float) -> float | None:
        return next((t for _, t, acc in self.curve if acc >= target - 1e-9), None)


def _cap_all(net: netns.Net, mbit: float) -> None:
    for host in net:
        net.cap(host, mbit)


def _tx_bytes(net: netns.Net, hosts: Sequence[str]) -> float:
    return statistics.fmean(net.counters(net[h])["tx_bytes"] for h in hosts)


def run_ddp(s: Settings, c: Contender, straggler: bool) -> Run:
    run = Run(c.name, straggler)
    d = s.out / ("straggler" if straggler else "plain") / c.name
    d.mkdir(parents=True, exist_ok=True)
    config = write_config(d / "run.toml", s.base_sets())
    hosts = [f"r{i}" for i in range(s.peers)]
    with netns.Net(hosts) as net:
        _cap_all(net, s.mbit)
        master = f"{net['r0'].ip}:{DDP_PORT}"
        procs = []
        for i in range(s.peers):
            argv = [sys.executable, str(ROOT / "bench" / "_ddp.py"), "--config", str(config),
                    "--rank", str(i), "--world", str(s.peers), "--master", master,
                    "--out", str(d / "rank-0.jsonl"), "--hook", c.hook]  # fmt: skip
            if straggler:
                argv += ["--slow-ranks", str(STRAGGLER_PEER % s.peers),
                         "--slow-factor", str(STRAGGLER_FACTOR)]  # fmt: skip
            env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
            procs.append(spawn(argv, d / f"rank-{i}.out", env=env, popen=net[f"r{i}"].run))
        end = time.monotonic() + RUN_TIMEOUT
        codes = [_wait(p, end) for p in procs]
        run.bytes_per_peer = _tx_bytes(net, hosts)
    rows = jsonl(d / "rank-0.jsonl")
    start = next((r["time"] for r in rows if r.get("kind") == "start"), None)
    summary = next((r for r in rows if r.get("kind") == "summary"), None)
    if start is not None:
        run.curve = [
            (int(r["step"]), float(r["time"]) - start, float(r["accuracy"]))
            for r in rows
            if r.get("kind") == "eval"
        ]
    run.train_s = summary["train_seconds"] if summary else None
    run.ok = all(code == 0 for code in codes) and summary is not None and bool(run.curve)
    if not run.ok:
        run.detail = {"exit_codes": codes, "tail": tail(d / "rank-0.out", 800)}
    return run


def _wait(proc: subprocess.Popen[bytes], end: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.1, end - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


@contextlib.contextmanager
def _env(**values: str | None) -> Iterator[None]:
    """Set (a str) the given environment variables for the processes started inside, then put
    the old values back (None: leave that variable as it is)."""
    old = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_concord(s: Settings, c: Contender, straggler: bool) -> Run:
    run = Run(c.name, straggler)
    d = s.out / ("straggler" if straggler else "plain") / c.name
    d.mkdir(parents=True, exist_ok=True)
    sets = [*s.base_sets(), *c.sets]
    if straggler:
        sets += [f"network.straggler.peer={STRAGGLER_PEER % s.peers}",
                 f"network.straggler.factor={STRAGGLER_FACTOR}"]  # fmt: skip
    peers = [f"p{i}" for i in range(s.peers)]
    with netns.Net(["broker", "orch", *peers]) as net:
        _cap_all(net, s.mbit)
        torch_plane = "network.transport=torch" in sets
        if torch_plane:  # peers reach the store at the orchestrator's address
            sets.append(f"network.torch.store_host={net['orch'].ip}")
        config = write_config(d / "run.toml", sets)
        mosq = netns.mosquitto(net["broker"], d / "logs")
        run_id = f"tta-{c.name}-{os.getpid()}".replace("_", "-")
        with _env(GLOO_SOCKET_IFNAME="eth0" if torch_plane else None):  # gloo binds eth0
            dep = Deployment(d, config, f"mqtt://{net['broker'].ip}:1883", run_id, s.peers, net)
        try:
            codes = dep.wait(RUN_TIMEOUT)
            run.bytes_per_peer = _tx_bytes(net, peers)
        finally:
            dep.stop()
            mosq.kill()
            mosq.wait(10)
    _concord_curve(run, d / "peers", s.peers)
    summaries = [read_peer_summary(d / "peers" / f"peer-{i}") for i in range(s.peers)]
    payload = [x.bytes_sent_total for x in summaries if x is not None]
    run.payload_bytes = statistics.fmean(payload) if payload else None
    run.ok = all(v == 0 for v in codes.values()) and bool(run.curve)
    if not run.ok:
        run.detail = {"exit_codes": codes, "tail": tail(d / "logs" / "orchestrator.out", 800)}
    return run


def _concord_curve(run: Run, peers_dir: Path, n: int) -> None:
    """Line the peers' evaluations up on the wall clock: the step records' ``time``
    (`concord.peer.pace.StepTime`); an evaluation counts once every peer has it. The records
    are read through `concord.runtime.records` (every name a peer's accuracy has had)."""
    times: dict[int, list[float]] = {}
    accs: dict[int, list[float]] = {}
    starts, ends = [], []
    for i in range(n):
        peer_dir = peers_dir / f"peer-{i}"
        if not (peer_dir / "metrics.jsonl").is_file():
            return
        records = read_metrics(peer_dir)
        steps = {r.step: r for r in records if isinstance(r, StepRecord) and "time" in r.extra}
        if not steps:
            return
        first, last = steps[min(steps)], steps[max(steps)]
        starts.append(_float(first.extra["time"]) - _float(first.extra["step_ms"]) / 1e3)
        ends.append(_float(last.extra["time"]))
        for r in records:
            if isinstance(r, EvalRecord) and r.step in steps and r.accuracy_mean_peer is not None:
                times.setdefault(r.step, []).append(_float(steps[r.step].extra["time"]))
                accs.setdefault(r.step, []).append(r.accuracy_mean_peer)
    t0 = min(starts)
    run.train_s = max(ends) - t0
    for step in sorted(times):
        if len(times[step]) == n:
            run.curve.append((step, max(times[step]) - t0, min(accs[step])))
            run.mean_acc.append(statistics.fmean(accs[step]))


def _float(value: object) -> float:
    """A JSON number of a record's ``extra`` (``time``, ``step_ms``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def write_csv(path: Path, runs: Sequence[Run]) -> None:
    write_curves(path, [(r, (r.name, int(r.straggler))) for r in runs], ("contender", "straggler"))


def plot(path: Path, runs: Sequence[Run], target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), sharey=True)
    names = list(dict.fromkeys(r.name for r in runs))  # one colour per contender, both panels
    colours = plt.get_cmap("tab20")
    for ax, straggler in zip(axes, (False, True), strict=True):
        for r in runs:
            if r.straggler == straggler and r.curve:
                style = "--" if r.name.startswith("ddp") else "-"
                ax.plot([t for _, t, _ in r.curve], [a for *_, a in r.curve], style,
                        label=r.name, color=colours(names.index(r.name) % 20))  # fmt: skip
        if target is not None:
            ax.axhline(target, color="black", lw=0.8, ls=":", label=f"target {target:.3f}")
        ax.set_title("one straggler" if straggler else "no straggler")
        ax.set_xlabel("wall time since training started (s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (Concord: worst peer)")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """The final JSON object (module docstring)."""
    by = {(r.name, r.straggler): r for r in runs}
    ddp = by.get(("ddp_fp32", False))
    target = ddp.final_acc - TARGET_MARGIN_PP / 100 if ddp and ddp.final_acc else None

    def tta(name: str, straggler: bool) -> float | None:
        r = by.get((name, straggler))
        return r.tta(target) if r is not None and target is not None else None

    def best(straggler: bool) -> tuple[str | None, float | None]:
        found = [
            (t, r.name)
            for r in runs
            if r.straggler == straggler and not r.name.startswith("ddp")
            for t in [r.tta(target) if target is not None else None]
            if t is not None
        ]
        return (min(found)[1], min(found)[0]) if found else (None, None)

    best_name, best_t = best(False)
    best_s_name, best_s_t = best(True)
    ddp_s = [t for t in (tta("ddp_fp32", True), tta("ddp_fp16", True)) if t is not None]
    rows = [
        {
            "name": r.name,
            "straggler": r.straggler,
            "ok": r.ok,
            "tta_s": round(t, 2) if (t := tta(r.name, r.straggler)) is not None else None,
            "final_acc": round(r.final_acc, 4) if r.final_acc is not None else None,
            "train_s": round(r.train_s, 2) if r.train_s is not None else None,
            "bytes_per_peer": round(r.bytes_per_peer) if r.bytes_per_peer else None,
            "payload_bytes": round(r.payload_bytes) if r.payload_bytes else None,
            "evals": len(r.curve),
            **({"detail": r.detail} if r.detail else {}),
        }
        for r in runs
    ]
    return {
        "benchmark": "time_to_accuracy",
        "target_acc": round(target, 4) if target is not None else None,
        "accuracy_of": "worst peer (Concord), the one model (DDP)",
        "best": best_name,
        "best_straggler": best_s_name,
        "tta_ratio_vs_ddp": _ratio(best_t, tta("ddp_fp32", False)),
        "tta_ratio_vs_ddp_fp16": _ratio(best_t, tta("ddp_fp16", False)),
        "tta_ratio_straggler": _ratio(best_s_t, min(ddp_s) if ddp_s else None),
        "tta_ratio_straggler_vs_ddp": _ratio(best_s_t, tta("ddp_fp32", True)),
        "tta_ratio_straggler_vs_ddp_fp16": _ratio(best_s_t, tta("ddp_fp16", True)),
        "contenders": rows,
    }


def run_all(
    s: Settings, chosen: Sequence[Contender], straggler: Sequence[bool], log: Any = None
) -> list[Run]:
    """Every contender in ``chosen`` for every ``straggler`` setting (DDP fp32 first: its final
    accuracy sets the target)."""
    chosen = sorted(chosen, key=lambda c: c.name != "ddp_fp32")
    runs = []
    for slow in straggler:
        for c in chosen:
            t0 = time.monotonic()
            r = (run_ddp if c.kind == "ddp" else run_concord)(s, c, slow)
            runs.append(r)
            if log is not None:
                acc = f"{r.final_acc:.4f}" if r.final_acc is not None else "-"
                took = time.monotonic() - t0
                log(f"  {c.name:28s} straggler={int(slow)}  ok={int(r.ok)}  final {acc}  "
                    f"train {r.train_s or 0:7.1f} s  run {took:6.1f} s")  # fmt: skip
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--mbit", type=float, default=100.0)
    p.add_argument("--epochs", type=float)
    p.add_argument("--samples", type=int)
    p.add_argument("--peers", type=int, default=8)
    p.add_argument("--eval-every", type=float, default=0.2)
    p.add_argument("--contenders", help="comma-separated names (default: all)")
    p.add_argument("--no-straggler", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    ok, why = netns.available()
    if not ok:
        print(f"network namespaces unavailable: {why}", file=sys.stderr)
        return 2
    token = set_tag()
    out = args.out or Path(tempfile.mkdtemp(prefix="concord-tta-"))
    s = Settings(
        out=out,
        peers=args.peers,
        mbit=args.mbit,
        epochs=args.epochs or (1.0 if args.quick else 2.0),
        samples=args.samples or (2000 if args.quick else 5000),
        eval_every=args.eval_every,
    )
    default = contenders()
    every = [*default, *extra_contenders()]
    names = args.contenders.split(",") if args.contenders else (QUICK if args.quick else None)
    chosen = [c for c in (every if names else default) if names is None or c.name in names]
    unknown = set(names or ()) - {c.name for c in every}
    if unknown:
        print(f"unknown contenders {sorted(unknown)}; valid: {[c.name for c in every]}")
        return 2
    t0 = time.monotonic()
    print(f"{s.peers} peers, links capped at {s.mbit:g} Mbit/s, {s.epochs:g} epochs, "
          f"{s.samples} samples, out: {out}", flush=True)  # fmt: skip
    try:
        runs = run_all(s, chosen, [False] if args.no_straggler else [False, True],
                       log=lambda m: print(m, flush=True))  # fmt: skip
    finally:
        reap(tagged(token))
    result = summarize(runs)
    result.update(mbit=s.mbit, epochs=s.epochs, peers=s.peers, samples=s.samples,
                  straggler={"peer": STRAGGLER_PEER, "factor": STRAGGLER_FACTOR},
                  wall_s=round(time.monotonic() - t0, 1), out=str(out))  # fmt: skip
    write_csv(out / "tta.csv", runs)
    plot(out / "tta.png", runs, result["target_acc"])
    report_targets(result, {"tta_ratio_vs_ddp": 0.5, "tta_ratio_vs_ddp_fp16": 0.7,
                            "tta_ratio_straggler": 0.8})  # fmt: skip
    return 0


def write_curves(
    path: Path,
    runs: Iterable[tuple[Run, Sequence[object]]],
    columns: Sequence[str],
    accuracy: str = "accuracy",
) -> None:
    """Every point of every run's curve as a CSV row (the time-to-accuracy benches' curves
    file): each run's values of ``columns``, then ``step``, ``seconds`` and ``accuracy``."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*columns, "step", "seconds", accuracy])
        for run, values in runs:
            for step, t, acc in run.curve:
                w.writerow([*values, step, f"{t:.3f}", f"{acc:.4f}"])


def report_targets(result: dict[str, Any], bounds: dict[str, float]) -> None:
    """Print a PASS / FAIL / n/a line per ratio of ``result`` against its upper bound, then
    ``result`` as the last line, JSON (what every time-to-accuracy bench ends with)."""
    for key, bound in bounds.items():
        v = result[key]
        verdict = "n/a" if v is None else ("PASS" if v <= bound else "FAIL")
        print(f"{verdict:4s} {key} = {v} (target ≤ {bound})")
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
