"""The crossover map of ``bench/edge.py --map``: time per step of DDP fp16 (gloo,
``fp16_compress_hook``: ``bench/_ddp.py``) and of Concord's best edge gossip
(``dsgd_exp_none_bf16``: D-SGD on the one-peer exponential graph, bf16 wire, gRPC) on a grid of
round-trip times × link rates, 8 peers / ranks each behind emulated links, beside the α–β
model's prediction (`bench.cost_model.EdgeModel`).

A point (`point_emulation`): the ``edge`` profile with ``delay_ms`` = RTT / 4 on every access
link (peer to peer crosses two links each way), ``rate_mbit`` each way and **no loss** — the map
separates latency from bandwidth, and the model has no loss term. Each run is `MAP_EPOCHS` of
`bench/edge.py`'s model and data (48 steps), no evaluation before the last step; its time per step
is the median of the step-to-step intervals after `WARMUP` steps (`median_step_s`): DDP rank 0's
step records, Concord's steps as the moment the last peer ended each (`concord_step_ends`).

The model (`bench.cost_model`): DDP fp16 = floor + 2(n−1) hops of 2 one-way delays each
(gloo's ring: the receiver's "ready", then the chunk) + the chunks' serialization; gossip =
floor + one one-way delay + one message's serialization; serialization counts only the bytes
beyond the link's ``tbf`` bucket (`bench.cost_model.tbf_burst`). The floors (compute and
per-message software costs, which do not depend on the path) are calibrated on the cell with the
shortest RTT and the highest rate; every other cell is a prediction.

Written to ``--out``: ``edge_map.csv`` (`COLUMNS`), ``edge_map.png`` (the gossip / DDP ratio,
measured and modelled), the run folders (``map-rtt<R>ms-<M>mbit/<contender>``); the last stdout
line is JSON (``cells``: the CSV's rows, ``model``: its constants).
"""

from __future__ import annotations

import csv
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import concord.lab.net as netns
from bench._procs import jsonl
from bench.cost_model import EdgeModel, WanPath, tbf_burst
from bench.edge_runs import Case, run_concord, run_ddp
from bench.time_to_accuracy import Contender
from concord.core.records import StepRecord
from concord.runtime.records import read_metrics

RTTS_MS = (1.0, 20.0, 80.0)
RATES_MBIT = (20.0, 100.0, 1000.0)
MAP_CONTENDERS = ("ddp_fp16", "dsgd_exp_none_bf16")
MAP_EPOCHS = 1.55  # 48 steps of 31 per epoch
WARMUP = 8  # step intervals left out of the median (connections, caches, TCP windows)
INPUT_DIM, CLASSES = 40, 10  # MNIST-1D
COLUMNS = ("rtt_ms", "rate_mbit", "ddp_ms", "gossip_ms", "ratio", "model_ddp_ms",
           "model_gossip_ms", "model_ratio", "ddp_err", "gossip_err", "load1")  # fmt: skip
"""``*_ms``: median ms per step; ``ratio``: gossip ÷ DDP; ``*_err``: (model − measured) ÷
measured; ``load1``: the 1-minute load average when the point's runs ended (the larger)."""


def point_emulation(rtt_ms: float, rate_mbit: float) -> netns.Emulation:
    """The emulated network of one point: ``edge`` with RTT ``rtt_ms`` peer to peer (a quarter on
    each link direction), ``rate_mbit`` each way, no loss."""
    return netns.parse_emulation(
        {"profile": "edge", "delay_ms": rtt_ms / 4, "rate_mbit": rate_mbit, "loss": 0.0}
    )


def point_name(rtt_ms: float, rate_mbit: float) -> str:
    """The point's run folder."""
    return f"map-rtt{rtt_ms:g}ms-{rate_mbit:g}mbit"


def path_of(rtt_ms: float, rate_mbit: float, mtu: int = 9000) -> WanPath:
    """The model's peer-to-peer path of a point (the tbf bucket of its links)."""
    return WanPath(rtt_ms / 1e3, rate_mbit * 1e6 / 8, tbf_burst(rate_mbit, mtu))


def mlp_params(hidden: Sequence[int]) -> int:
    """Parameters of the MNIST-1D ReLU MLP with ``hidden`` widths (weights and biases)."""
    dims = [INPUT_DIM, *hidden, CLASSES]
    return sum(a * b + b for a, b in itertools.pairwise(dims))


def median_step_s(ends: Sequence[float], warmup: int = WARMUP) -> float | None:
    """The median interval between consecutive step ends, leaving out the first ``warmup``
    intervals; None when none is left."""
    gaps = [b - a for a, b in itertools.pairwise(ends)][warmup:]
    return statistics.median(gaps) if gaps else None


def ddp_step_ends(rank0: Path) -> list[float]:
    """End times of DDP rank 0's steps, in step order (``bench/_ddp.py``'s step records)."""
    rows = [r for r in jsonl(rank0) if r.get("kind") == "step"]
    return [float(r["time"]) for r in sorted(rows, key=lambda r: int(r["step"]))]


def concord_step_ends(peers_dir: Path, n: int) -> list[float]:
    """For every step all ``n`` peers recorded, the moment the last of them ended it (step
    records' ``time``), in step order: gossip's peers wait for each other, so the slowest sets
    the pace."""
    per_peer: list[dict[int, float]] = []
    for i in range(n):
        peer_dir = peers_dir / f"peer-{i}"
        if not (peer_dir / "metrics.jsonl").is_file():
            return []
        records = read_metrics(peer_dir)
        per_peer.append(
            {
                r.step: float(t)
                for r in records
                if isinstance(r, StepRecord) and isinstance(t := r.extra.get("time"), int | float)
            }
        )
    common = set.intersection(*(set(p) for p in per_peer)) if per_peer else set()
    return [max(p[s] for p in per_peer) for s in sorted(common)]


@dataclass
class Cell:
    """One point of the map: seconds per step of each contender (None: its run failed)."""

    rtt_ms: float
    rate_mbit: float
    ddp_s: float | None = None
    gossip_s: float | None = None
    load1: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.gossip_s / self.ddp_s if self.gossip_s and self.ddp_s else None


def calibrated(cells: Iterable[Cell], model: EdgeModel) -> tuple[EdgeModel, Cell] | None:
    """``model`` with its floors taken from the measured cell of shortest RTT, then highest rate
    (the smallest path term), and that cell; None when no cell has both measurements."""
    done = [(c, c.ddp_s, c.gossip_s) for c in cells if c.ddp_s and c.gossip_s]
    if not done:
        return None
    base, ddp, gossip = min(done, key=lambda x: (x[0].rtt_ms, -x[0].rate_mbit))
    return model.calibrate(path_of(base.rtt_ms, base.rate_mbit), ddp, gossip), base


def _err(model: float, measured: float | None) -> float | None:
    return round((model - measured) / measured, 3) if measured else None


def _ms(s: float | None) -> float | None:
    return round(1e3 * s, 2) if s is not None else None


def rows(cells: Sequence[Cell], model: EdgeModel | None) -> list[dict[str, Any]]:
    """The CSV's rows (`COLUMNS`), the model's columns empty without a model."""
    out = []
    for c in cells:
        row: dict[str, Any] = dict.fromkeys(COLUMNS)
        ratio = c.ratio
        row.update(rtt_ms=c.rtt_ms, rate_mbit=c.rate_mbit, ddp_ms=_ms(c.ddp_s),
                   gossip_ms=_ms(c.gossip_s), load1=c.load1,
                   ratio=round(ratio, 4) if ratio is not None else None)  # fmt: skip
        if model is not None:
            path = path_of(c.rtt_ms, c.rate_mbit)
            ddp, gossip = model.ddp_fp16_s(path), model.gossip_bf16_s(path)
            row.update(model_ddp_ms=_ms(ddp), model_gossip_ms=_ms(gossip),
                       model_ratio=round(gossip / ddp, 4),
                       ddp_err=_err(ddp, c.ddp_s), gossip_err=_err(gossip, c.gossip_s))  # fmt: skip
        out.append(row)
    return out


def write_map_csv(path: Path, table: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows({k: "" if v is None else v for k, v in r.items()} for r in table)


def read_map_csv(path: Path) -> list[dict[str, float | None]]:
    """``edge_map.csv`` back, every value a float (None where empty)."""
    with path.open(newline="") as f:
        return [{k: float(v) if v != "" else None for k, v in r.items()} for r in csv.DictReader(f)]


def plot_map(path: Path, table: Sequence[dict[str, Any]]) -> None:
    """Two heat maps side by side, RTT × rate: the gossip / DDP ratio measured and modelled (log
    colour scale, 1 = parity), each cell annotated with its ratio and both ms/step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    rtts = sorted({r["rtt_ms"] for r in table})
    rates = sorted({r["rate_mbit"] for r in table})
    at = {(r["rtt_ms"], r["rate_mbit"]): r for r in table}
    norm = LogNorm(vmin=0.01, vmax=1.0)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    for ax, (key, ddp, gossip, title) in zip(axes, (
        ("ratio", "ddp_ms", "gossip_ms", "measured"),
        ("model_ratio", "model_ddp_ms", "model_gossip_ms", "α–β model"),
    ), strict=True):  # fmt: skip
        grid = [[at.get((t, m), {}).get(key) for m in rates] for t in rtts]
        values = [[v if v is not None else float("nan") for v in row] for row in grid]
        im = ax.imshow(values, cmap="viridis", norm=norm, origin="lower", aspect="auto")
        for i, t in enumerate(rtts):
            for j, m in enumerate(rates):
                r = at.get((t, m), {})
                if r.get(key) is None:
                    ax.text(j, i, "n/a", ha="center", va="center", color="grey")
                    continue
                text = f"{r[key]:.3f}\nDDP {r[ddp]:.0f} ms\ngossip {r[gossip]:.1f} ms"
                ax.text(j, i, text, ha="center", va="center", fontsize=8,
                        color="white" if r[key] < 0.1 else "black")  # fmt: skip
        ax.set_xticks(range(len(rates)), [f"{m:g}" for m in rates])
        ax.set_yticks(range(len(rtts)), [f"{t:g}" for t in rtts])
        ax.set_xlabel("link rate (Mbit/s each way)")
        ax.set_title(f"gossip / DDP fp16 time per step, {title}")
    axes[0].set_ylabel("RTT peer to peer (ms)")
    fig.colorbar(im, ax=axes, label="ratio (< 1: gossip faster)")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _step_s(out: Path, case: Case, c: Contender, peers: int) -> float | None:
    d = out / case.profile / c.name
    if c.kind == "ddp":
        return median_step_s(ddp_step_ends(d / "rank-0.jsonl"))
    return median_step_s(concord_step_ends(d / "peers", peers))


def measure(
    out: Path,
    sets: list[str],
    contenders: dict[str, Contender],
    points: Iterable[tuple[float, float]],
    peers: int,
    log: Callable[[str], None] | None = None,
) -> list[Cell]:
    """Each point's runs (`MAP_CONTENDERS`, DDP first), one after another."""
    cells = []
    for rtt, rate in points:
        case = Case(point_name(rtt, rate), emulation=point_emulation(rtt, rate))
        cell = Cell(rtt, rate)
        loads = []
        for name in MAP_CONTENDERS:
            c = contenders[name]
            t0 = time.monotonic()
            run = (run_ddp if c.kind == "ddp" else run_concord)(out, sets, c, case)
            step = _step_s(out, case, c, peers) if run.ok else None
            loads.append(os.getloadavg()[0])
            if c.kind == "ddp":
                cell.ddp_s = step
            else:
                cell.gossip_s = step
            if log is not None:
                ms = f"{1e3 * step:8.1f}" if step is not None else "     n/a"
                took = time.monotonic() - t0
                log(f"  RTT {rtt:4g} ms {rate:6g} Mbit/s {name:20s} ok={int(run.ok)} "
                    f"{ms} ms/step  run {took:5.1f} s  load {loads[-1]:.1f}")  # fmt: skip
        cell.load1 = round(max(loads), 2)
        cells.append(cell)
    return cells


def summarize(cells: Sequence[Cell], hidden: Sequence[int], peers: int) -> dict[str, Any]:
    """The JSON object of a map (module docstring)."""
    fit = calibrated(cells, EdgeModel(peers, mlp_params(hidden)))
    model, base = fit if fit is not None else (None, None)
    return {
        "benchmark": "edge_map",
        "cells": rows(cells, model),
        "model": None
        if model is None or base is None
        else {
            "params": model.params,
            "handshake": model.handshake,
            "ddp_floor_ms": _ms(model.ddp_floor_s),
            "gossip_floor_ms": _ms(model.gossip_floor_s),
            "calibrated_at": {"rtt_ms": base.rtt_ms, "rate_mbit": base.rate_mbit},
        },
    }
