"""Past this machine, on paper: an α–β cost model of one training step, ring all-reduce against
gossip, fitted to constants measured here, extrapolated to n = 8 … 1024 peers and 1–100 Gbit/s.

Measured in this run (spawned processes on loopback, one torch thread each):

* ``allreduce``: torch.distributed gloo ``all_reduce`` of M bytes among 2 and 4 ranks;
* ``gloo_p2p``: gloo ``batch_isend_irecv`` of M bytes between two ranks (both ways);
* ``concord``: one tensor of M bytes through Concord's gRPC data plane (`bench._grpc`: the real
  `Transport`, from packing to the receiver's Ack);
* ``compute``: forward + backward + SGD step of `bench/step_overhead.py`'s workload (its
  1.09M-parameter MLP and batches, its baselines' optimizer) on one thread.

Each mechanism's time is fitted by least squares to ``T(M) = a + b·M`` over ``--sizes``
(median of ``--repeats`` per size). On loopback there is no link: ``b`` is the *software* cost
per byte (copies, framing, reductions), ``a`` the per-message latency. For all-reduce, the ring
algorithm's ``T = 2(n−1)·α + 2(n−1)/n·M·β`` is fitted to the 2- and 4-rank series together.

The model of one step on n peers (every peer on its own machine and full-duplex NIC of rate R
bytes/s, a non-blocking switch; parameters of M bytes; C the step's compute):

* ring all-reduce:    T_ar  = 2(n−1)·α_ar + 2(n−1)/n · M · (β_ar + 1/R)
* gossip on the ring: T_rg  = α_g + 2·M·(β_g + 1/R)     (two neighbours, one NIC: 2M out, 2M in)
* one-peer exponential graph: T_ex = α_g + M·(β_g + 1/R)      (one peer per round)

with ``--wire bf16`` halving M for gossip (the bf16 wire; the cast cost is in β_g's fit only if
measured that way — not here, so bf16 figures are optimistic by the cast, ~3 ms per 64 MiB). Per
step: C + T without overlap, max(C, T) with it (DDP overlaps its bucketed all-reduce with
backward; Concord's ``overlap = true`` overlaps the gossip with forward and backward), which is
what is printed. Software and wire costs add (not pipelined): a conservative choice for both.

Not in the model: gossip needs more steps than all-reduce for the same accuracy (a consensus
distance to pay for: `bench/time_to_accuracy.py` measures it), stragglers (all-reduce waits for
the slowest of n, gossip for the slowest neighbour), and switch oversubscription.

The loopback fit's α is inflated by what this machine adds to every message (four processes on
two cores: a context switch per hop, Python dispatch), ~1 ms against the 5–50 µs of a
data-centre network; so every prediction is also made with α = ``--dc-alpha-us`` (20 µs) for
both mechanisms, the fitted β kept.

**The latency term at the edge** (`WanPath`, `EdgeModel`; used by ``bench/edge.py --map``):
on a wide-area path the per-message latency is α = h one-way delays + a per-message overhead,
where h is what the protocol waits for per message: 1 for a gossip message (the sender does not
wait for its Ack), 2 for a hop of gloo's ring (the receiver's "ready" notification, then the
data). A ring all-reduce of M bytes in b DDP buckets pays b·2(n−1) sequential α and
2(n−1)/n·M of serialization; a one-peer gossip exchange pays one α and M (every peer sends one
message and waits for one, sent at the same moment). Serialization counts only the bytes beyond a
token bucket's burst (``tbf`` on the emulated links lets 32 KiB or 4 ms at the rate through at
once). The step is a floor (compute and per-message software costs) + that term, no overlap.

Output: per α, a table of predicted ms/step and the crossover n (smallest n from which gossip is
faster) per link rate; a CSV (``--csv``, both tables, column ``alpha``); as the last line a JSON
object with the fitted constants, both sets of crossovers and the sizes measured.

    python bench/cost_model.py [--sizes 1,4,16] [--repeats 5] [--csv FILE] [--model-mb 4.36]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1 << 20
CONTENDERS = ("ring", "exp", "exp_bf16")
PEERS = (8, 16, 32, 64, 128, 256, 512, 1024)
GBITS = (1.0, 10.0, 25.0, 100.0)


@dataclass(frozen=True)
class Fit:
    """``T = alpha + beta · bytes`` (seconds, seconds per byte) and how well it fits."""

    alpha: float
    beta: float
    r2: float


def fit_line(sizes: Sequence[float], times: Sequence[float]) -> Fit:
    """Least squares of ``times = alpha + beta · sizes`` (at least two distinct sizes); alpha
    is clamped at 0 (a negative latency is an artefact of noise, not a prediction)."""
    if len(sizes) != len(times) or len(set(sizes)) < 2:
        raise ValueError("fit_line needs matching series with at least two distinct sizes")
    mx, my = statistics.fmean(sizes), statistics.fmean(times)
    sxx = sum((x - mx) ** 2 for x in sizes)
    beta = sum((x - mx) * (y - my) for x, y in zip(sizes, times, strict=True)) / sxx
    alpha = max(0.0, my - beta * mx)
    ss_tot = sum((y - my) ** 2 for y in times) or 1e-30
    ss_res = sum((y - alpha - beta * x) ** 2 for x, y in zip(sizes, times, strict=True))
    return Fit(alpha, beta, 1.0 - ss_res / ss_tot)


def fit_ring_allreduce(series: dict[int, list[tuple[float, float]]]) -> Fit:
    """α, β of ``T = 2(n−1)·α + 2(n−1)/n·M·β`` from (M, T) series per rank count n: a line
    through the origin-free design (2(n−1), 2(n−1)/n·M) solved by the 2×2 normal equations."""
    rows = [(2.0 * (n - 1), 2.0 * (n - 1) / n * m, t) for n, pts in series.items() for m, t in pts]
    if len(rows) < 2:
        raise ValueError("fit_ring_allreduce needs at least two points")
    s11 = sum(a * a for a, _, _ in rows)
    s12 = sum(a * b for a, b, _ in rows)
    s22 = sum(b * b for _, b, _ in rows)
    t1 = sum(a * t for a, _, t in rows)
    t2 = sum(b * t for _, b, t in rows)
    det = s11 * s22 - s12 * s12
    if det == 0:
        raise ValueError("degenerate all-reduce series (one rank count and one size?)")
    alpha = max(0.0, (t1 * s22 - t2 * s12) / det)
    beta = (s11 * t2 - s12 * t1) / det
    ts = [t for _, _, t in rows]
    mt = statistics.fmean(ts)
    ss_tot = sum((t - mt) ** 2 for t in ts) or 1e-30
    ss_res = sum((t - alpha * a - beta * b) ** 2 for a, b, t in rows)
    return Fit(alpha, beta, 1.0 - ss_res / ss_tot)


@dataclass(frozen=True)
class Model:
    allreduce: Fit
    gossip: Fit
    compute_s: float
    model_bytes: float

    def allreduce_s(self, n: int, rate: float) -> float:
        a, b = self.allreduce.alpha, self.allreduce.beta
        return 2 * (n - 1) * a + 2 * (n - 1) / n * self.model_bytes * (b + 1.0 / rate)

    def gossip_s(self, rate: float, degree: int, wire_scale: float = 1.0) -> float:
        m = self.model_bytes * wire_scale
        return self.gossip.alpha + degree * m * (self.gossip.beta + 1.0 / rate)

    def step_s(self, comm_s: float, overlap: bool) -> float:
        return max(self.compute_s, comm_s) if overlap else self.compute_s + comm_s

    def with_latency(self, alpha: float) -> Model:
        """The same model with per-message latency ``alpha`` (s) for both mechanisms: the
        loopback fit's α is inflated by processes sharing this machine's cores."""
        return Model(
            Fit(alpha, self.allreduce.beta, self.allreduce.r2),
            Fit(alpha, self.gossip.beta, self.gossip.r2),
            self.compute_s,
            self.model_bytes,
        )


def predictions(model: Model, overlap: bool = True) -> list[dict[str, Any]]:
    """One row per (link Gbit/s, n): ms per step of each contender."""

    def row(gbit: float, n: int) -> dict[str, Any]:
        rate = gbit * 1e9 / 8

        def ms(comm_s: float) -> float:
            return 1e3 * model.step_s(comm_s, overlap)

        return {
            "gbit_s": gbit,
            "n": n,
            "allreduce_ms": ms(model.allreduce_s(n, rate)),
            "ring_ms": ms(model.gossip_s(rate, 2)),
            "ring_bf16_ms": ms(model.gossip_s(rate, 2, 0.5)),
            "exp_ms": ms(model.gossip_s(rate, 1)),
            "exp_bf16_ms": ms(model.gossip_s(rate, 1, 0.5)),
        }

    return [row(g, n) for g in GBITS for n in PEERS]


def crossover(model: Model, gbit: float, contender: str) -> int | None:
    """The smallest n (a power of two from 2 to 2^20) from which ``contender``'s step is
    faster than ring all-reduce's; None if never (gossip's cost does not grow with n, all-reduce's
    latency term does, so beyond some n it always is unless α_ar = 0)."""
    rate = gbit * 1e9 / 8
    degree, scale = {"ring": (2, 1.0), "exp": (1, 1.0), "exp_bf16": (1, 0.5)}[contender]
    g = model.step_s(model.gossip_s(rate, degree, scale), overlap=True)
    for k in range(1, 21):
        n = 1 << k
        if g < model.step_s(model.allreduce_s(n, rate), overlap=True):
            return n
    return None


# -- the latency term: one step across a wide-area path (``bench/edge.py --map``) ---------------

FIRST_BUCKET_BYTES = 1 << 20  # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
BUCKET_BYTES = 25 << 20  # its later buckets (``bucket_cap_mb`` = 25)
GLOO_HANDSHAKE = 2  # one-way delays per ring hop of gloo: the receiver's "ready", then the data


@dataclass(frozen=True)
class WanPath:
    """The path between two peers: round trip ``rtt_s``, bottleneck ``rate`` (bytes/s) and
    ``burst``: the bytes a token bucket lets through at once after an idle spell (``tbf``'s bucket
    on an emulated link; 0: none), which only the bytes of a message beyond it wait for."""

    rtt_s: float
    rate: float
    burst: float = 0.0

    def __post_init__(self) -> None:
        if not (self.rtt_s >= 0 and self.rate > 0 and self.burst >= 0):
            raise ValueError(f"WanPath needs rtt_s ≥ 0, rate > 0, burst ≥ 0; got {self}")

    @property
    def one_way_s(self) -> float:
        return self.rtt_s / 2

    def wire_s(self, nbytes: float) -> float:
        """Serialization time of one message of ``nbytes`` at the bottleneck."""
        return max(0.0, nbytes - self.burst) / self.rate


def tbf_burst(rate_mbit: float, mtu: int = 9000) -> float:
    """The bucket `concord.lab.net.Net.cap` gives a link of ``rate_mbit``: 4 ms at the rate, at
    least 32 KiB and one frame."""
    return float(max(32 * 1024, int(rate_mbit * 1e6 / 8 * 0.004), mtu + 64))


def ddp_buckets(grad_bytes: float) -> int:
    """How many all-reduces DDP runs per step for ``grad_bytes`` of (fp32) gradients: a first
    bucket of 1 MiB, then 25 MiB each (a bucket is filled before any hook compresses it)."""
    if grad_bytes <= FIRST_BUCKET_BYTES:
        return 1
    return 1 + math.ceil((grad_bytes - FIRST_BUCKET_BYTES) / BUCKET_BYTES)


def ring_allreduce_wan_s(
    n: int,
    nbytes: float,
    path: WanPath,
    overhead_s: float = 0.0,
    handshake: int = GLOO_HANDSHAKE,
    buckets: int = 1,
) -> float:
    """A ring all-reduce of ``nbytes`` (on the wire) among ``n`` peers, in ``buckets`` equal
    all-reduces one after another: each bucket is 2(n−1) sequential hops (reduce-scatter, then
    all-gather), each paying the per-message latency α = ``handshake`` one-way delays +
    ``overhead_s`` and sending a chunk of nbytes/(n·buckets):

        T = buckets · 2(n−1) · (α + wire(nbytes / (n · buckets)))

    which, with no token bucket (``burst`` 0), is buckets · 2(n−1)·α + 2(n−1)/n · nbytes / rate."""
    if n < 2 or buckets < 1:
        raise ValueError(f"ring_allreduce_wan_s needs n ≥ 2 and buckets ≥ 1; got {n}, {buckets}")
    alpha = handshake * path.one_way_s + overhead_s
    return buckets * 2 * (n - 1) * (alpha + path.wire_s(nbytes / (n * buckets)))


def gossip_wan_s(nbytes: float, path: WanPath, overhead_s: float = 0.0) -> float:
    """One one-peer gossip exchange of ``nbytes``: every peer sends its message to one peer and
    waits for one, sent at the same moment, so the step pays one message: α + wire(nbytes), with
    α = one one-way delay + ``overhead_s`` (the sender does not wait for its Ack)."""
    return path.one_way_s + overhead_s + path.wire_s(nbytes)


@dataclass(frozen=True)
class EdgeModel:
    """Step times at the edge, no overlap (DDP's single bucket is ready only when backward ends;
    the map's gossip runs without ``overlap``): ``floor`` + the path's term, where a floor is
    what does not depend on the path — the step's compute and the per-message software costs
    (`calibrate` takes them from the measured cell with the smallest path term).
    ``params``: the model's parameters (DDP buckets 4 bytes each, sends 2 with the fp16 hook;
    gossip sends 2 with the bf16 wire)."""

    n: int
    params: int
    ddp_floor_s: float = 0.0
    gossip_floor_s: float = 0.0
    handshake: int = GLOO_HANDSHAKE

    def ddp_fp16_s(self, path: WanPath) -> float:
        buckets = ddp_buckets(4.0 * self.params)
        comm = ring_allreduce_wan_s(self.n, 2.0 * self.params, path, 0.0, self.handshake, buckets)
        return self.ddp_floor_s + comm

    def gossip_bf16_s(self, path: WanPath) -> float:
        return self.gossip_floor_s + gossip_wan_s(2.0 * self.params, path)

    def calibrate(self, path: WanPath, ddp_s: float, gossip_s: float) -> EdgeModel:
        """The floors that make the model match ``ddp_s`` and ``gossip_s`` measured on ``path``
        (clamped at 0: a negative floor means the path term over-predicts there)."""
        bare = dataclasses.replace(self, ddp_floor_s=0.0, gossip_floor_s=0.0)
        return dataclasses.replace(
            self,
            ddp_floor_s=max(0.0, ddp_s - bare.ddp_fp16_s(path)),
            gossip_floor_s=max(0.0, gossip_s - bare.gossip_bf16_s(path)),
        )


# -- measurements --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _time(op: Any, repeats: int, barrier: Any) -> float:
    """Median seconds of ``op()`` over ``repeats``, after two discarded, a barrier before each."""
    times = []
    for k in range(repeats + 2):
        barrier()
        t0 = time.perf_counter()
        op()
        if k >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _compute_s(steps: int) -> tuple[float, int]:
    """Median seconds of one step of `bench/step_overhead.py`'s workload, and its parameters."""
    import torch

    from bench.step_overhead import _mlp, _workload

    torch.manual_seed(0)
    model = _mlp()
    opt, x, y, loss_fn = _workload(model, 0)
    k = 0

    def step() -> None:
        nonlocal k
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[k % 64]), y[k % 64]).backward()
        opt.step()
        k += 1

    return _time(step, steps, lambda: None), sum(p.numel() for p in model.parameters())


def _gloo_worker(rank: int, port: int, sizes: list[int], repeats: int, out: Any) -> None:
    """One of four gloo ranks: all-reduce among all four and among ranks 0–1, and a
    ``batch_isend_irecv`` exchange between ranks 0 and 1; rank 0 also times the compute step
    first (alone: the others wait for it in ``init_process_group``)."""
    import torch
    import torch.distributed as dist

    from concord.peer.memory import tune_malloc

    tune_malloc()
    torch.set_num_threads(1)
    compute = _compute_s(50) if rank == 0 else None
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    pair = dist.new_group([0, 1])
    result: dict[str, dict[int, float]] = {"allreduce4": {}, "allreduce2": {}, "p2p": {}}
    other = 1 - rank  # ranks 0 and 1 exchange
    for size in sizes:
        x = torch.ones(size // 4)
        got = torch.empty_like(x)
        result["allreduce4"][size] = _time(lambda x=x: dist.all_reduce(x), repeats, dist.barrier)
        if rank < 2:

            def exchange(x: torch.Tensor = x, got: torch.Tensor = got) -> None:
                ops = [dist.P2POp(dist.isend, x, other), dist.P2POp(dist.irecv, got, other)]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()

            def sync() -> None:
                dist.barrier(group=pair)

            result["allreduce2"][size] = _time(
                lambda x=x: dist.all_reduce(x, group=pair), repeats, sync
            )
            result["p2p"][size] = _time(exchange, repeats, sync)
        dist.barrier()
    if rank == 0:
        out.put((compute, result))
    dist.destroy_process_group()


def gloo_measure(
    sizes: list[int], repeats: int
) -> tuple[tuple[float, int], dict[str, dict[int, float]]]:
    """(compute seconds per step, parameters), and rank 0's median seconds per size of each
    gloo series (``allreduce4``, ``allreduce2``, ``p2p``)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_gloo_worker, args=(r, port, sizes, repeats, out)) for r in range(4)
    ]
    for p in procs:
        p.start()
    try:
        compute, result = out.get(timeout=900)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return compute, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16", help="MiB, comma-separated (≥ 2 sizes)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model-mb", type=float, default=None, help="M (default: the MLP's)")
    parser.add_argument("--csv", type=Path, default=None, help="write the predictions here")
    parser.add_argument(
        "--dc-alpha-us",
        type=float,
        default=20.0,
        help="a data-centre network's per-message latency, for the second set of crossovers",
    )
    args = parser.parse_args(argv)
    sizes = [int(float(s) * MiB) for s in args.sizes.split(",") if s.strip()]
    if len(set(sizes)) < 2 or min(sizes) <= 0:
        parser.error(f"--sizes needs at least two distinct positive sizes; got {args.sizes!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be ≥ 1; got {args.repeats}")
    from bench._grpc import grpc_exchange

    t0 = time.perf_counter()
    (compute_s, params), gloo = gloo_measure(sizes, args.repeats)
    print(f"compute: {1e3 * compute_s:.2f} ms/step ({params} parameters, one thread)")
    ar = {4: gloo["allreduce4"], 2: gloo["allreduce2"]}
    p2p = gloo["p2p"]
    concord = {s: statistics.median(grpc_exchange(s, args.repeats)) for s in sizes}
    for s in sizes:
        print(
            f"{s / MiB:6.1f} MiB: gloo all-reduce n=2 {1e3 * ar[2][s]:7.2f} ms, n=4 "
            f"{1e3 * ar[4][s]:7.2f} ms; gloo p2p {1e3 * p2p[s]:7.2f} ms; Concord gRPC "
            f"{1e3 * concord[s]:7.2f} ms"
        )
    fit_ar = fit_ring_allreduce({n: [(s, ar[n][s]) for s in sizes] for n in ar})
    fit_p2p = fit_line(sizes, [p2p[s] for s in sizes])
    fit_g = fit_line(sizes, [concord[s] for s in sizes])
    for name, f in (("ring all-reduce", fit_ar), ("gloo p2p", fit_p2p), ("Concord", fit_g)):
        print(
            f"fit {name}: alpha {1e6 * f.alpha:.1f} µs, beta {1e9 * f.beta:.3f} ns/B "
            f"({1e-9 / f.beta if f.beta > 0 else float('inf'):.2f} GB/s), R² {f.r2:.4f}"
        )
    model_bytes = args.model_mb * 1e6 if args.model_mb else 4.0 * params
    fitted = Model(fit_ar, fit_g, compute_s, model_bytes)
    dc = fitted.with_latency(args.dc_alpha_us * 1e-6)
    rows: list[dict[str, Any]] = []
    cross: dict[str, dict[str, int | None]] = {}
    for label, model in (("fitted", fitted), (f"{args.dc_alpha_us:g}us", dc)):
        table = [{"alpha": label, **r} for r in predictions(model)]
        rows += table
        print(f"\npredicted ms/step, alpha {label} (M = {model_bytes / 1e6:.2f} MB, overlap on):")
        print(f"{'Gbit/s':>7} {'n':>5} {'allreduce':>10} {'ring':>8} {'ring bf16':>10} {'exp':>8}")
        for r in table:
            print(
                f"{r['gbit_s']:7g} {r['n']:5d} {r['allreduce_ms']:10.2f} {r['ring_ms']:8.2f} "
                f"{r['ring_bf16_ms']:10.2f} {r['exp_ms']:8.2f}"
            )
        cross[label] = {f"{c}@{g:g}gbit": crossover(model, g, c) for c in CONTENDERS for g in GBITS}
        print(f"crossover n (gossip faster from), alpha {label}:", cross[label])
    if args.csv is not None:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print(
        json.dumps(
            {
                "compute_ms": round(1e3 * compute_s, 3),
                "model_mb": round(model_bytes / 1e6, 3),
                "sizes_mib": [s / MiB for s in sizes],
                "allreduce_alpha_us": round(1e6 * fit_ar.alpha, 2),
                "allreduce_beta_ns_per_byte": round(1e9 * fit_ar.beta, 4),
                "allreduce_r2": round(fit_ar.r2, 4),
                "gloo_p2p_alpha_us": round(1e6 * fit_p2p.alpha, 2),
                "gloo_p2p_beta_ns_per_byte": round(1e9 * fit_p2p.beta, 4),
                "concord_alpha_us": round(1e6 * fit_g.alpha, 2),
                "concord_beta_ns_per_byte": round(1e9 * fit_g.beta, 4),
                "concord_r2": round(fit_g.r2, 4),
                "crossover_n": cross["fitted"],
                "dc_alpha_us": args.dc_alpha_us,
                "crossover_n_dc_alpha": cross[f"{args.dc_alpha_us:g}us"],
                "wall_s": round(time.perf_counter() - t0, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
