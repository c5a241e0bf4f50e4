"""One contender's run of ``bench/edge.py`` behind an emulated network (`concord.lab.net`): every
process — the DDP ranks, or the Concord peers, the orchestrator and Mosquitto — in a namespace
of its own behind the profile's access link (peer / rank i: `Emulation.for_peer`; broker and
orchestrator: the common link), the slow peers computing `Case.slow_factor` times slower.

Concord peers are started one by one (not `bench.chaos_runs.Deployment`, which gives every peer
one config): a slow peer's config differs from the others' only in ``network.straggler`` (one
peer per config: `concord.peer.pace.Straggler`). The DDP ranks are ``bench/_ddp.py``.

What a run measures is `bench.time_to_accuracy.Run` (its curve lined up on the wall clock the
same way), plus ``link_util``: the mean over peers of the bits its link carried out (eth0
frames) ÷ (its upload rate × the training time).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import concord.lab.net as netns
from bench._procs import ROOT, concord, jsonl, reap, spawn, tail
from bench.chaos_runs import write_config
from bench.time_to_accuracy import Contender, Run, _concord_curve, _wait
from concord.runtime.records import read_peer_summary

RUN_TIMEOUT = 1800.0  # seconds one run may take
DDP_PORT = 29500


@dataclass(frozen=True)
class Case:
    """Where a contender runs: the emulation ``profile`` (a `concord.lab.net.PROFILES` name,
    and the name of the run's folder), or ``emulation`` when given (``profile`` then only names
    the folder: the crossover map's points), the ``slow`` peers / ranks and how much slower they
    compute."""

    profile: str
    slow: tuple[int, ...] = ()
    slow_factor: float = 1.0
    emulation: netns.Emulation | None = None

    def links(self) -> netns.Emulation:
        """The emulated network of this case."""
        return self.emulation if self.emulation is not None else netns.profile(self.profile)


def _net(case: Case, peers: Sequence[str], others: Sequence[str]) -> netns.Net:
    return netns.Net.for_emulation(case.links(), [*peers, *others])


def _apply(net: netns.Net, case: Case, peers: Sequence[str], others: Sequence[str]) -> None:
    net.apply(case.links(), [net[h] for h in peers], [net[h] for h in others])


def _measure_links(run: Run, net: netns.Net, hosts: Sequence[str]) -> None:
    """``bytes_per_peer`` and ``link_util`` (module docstring) of ``hosts``."""
    sent = {h: net.counters(net[h])["tx_bytes"] for h in hosts}
    run.bytes_per_peer = statistics.fmean(sent.values())
    if run.train_s:
        util = [
            sent[h] * 8 / (net[h].link.up.rate_mbit * 1e6 * run.train_s)
            for h in hosts
            if net[h].link.up.rate_mbit
        ]
        run.detail["link_util"] = round(statistics.fmean(util), 4) if util else None


def run_ddp(out: Path, sets: list[str], c: Contender, case: Case) -> Run:
    """DDP contender ``c`` (``c.hook``), ``len`` ranks from ``peers=`` in ``sets``."""
    run = Run(c.name, bool(case.slow))
    d = out / case.profile / c.name
    d.mkdir(parents=True, exist_ok=True)
    config = write_config(d / "run.toml", sets)
    n = _peers(sets)
    hosts = [f"r{i}" for i in range(n)]
    with _net(case, hosts, []) as net:
        _apply(net, case, hosts, [])
        master = f"{net['r0'].ip}:{DDP_PORT}"
        procs = []
        for i in range(n):
            argv = [sys.executable, str(ROOT / "bench" / "_ddp.py"), "--config", str(config),
                    "--rank", str(i), "--world", str(n), "--master", master,
                    "--out", str(d / "rank-0.jsonl"), "--hook", c.hook,
                    "--slow-ranks", ",".join(map(str, case.slow)),
                    "--slow-factor", str(case.slow_factor)]  # fmt: skip
            env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
            procs.append(spawn(argv, d / f"rank-{i}.out", env=env, popen=net[f"r{i}"].run))
        end = time.monotonic() + RUN_TIMEOUT
        codes = [_wait(p, end) for p in procs]
        rows = jsonl(d / "rank-0.jsonl")
        summary = next((r for r in rows if r.get("kind") == "summary"), None)
        run.train_s = summary["train_seconds"] if summary else None
        _measure_links(run, net, hosts)
    start = next((r["time"] for r in rows if r.get("kind") == "start"), None)
    if start is not None:
        run.curve = [
            (int(r["step"]), float(r["time"]) - start, float(r["accuracy"]))
            for r in rows
            if r.get("kind") == "eval"
        ]
    run.ok = all(code == 0 for code in codes) and summary is not None and bool(run.curve)
    if not run.ok:
        run.detail.update(exit_codes=codes, tail=tail(d / "rank-0.out", 800))
    return run


def _peers(sets: Sequence[str]) -> int:
    return int(next(s.split("=", 1)[1] for s in sets if s.startswith("peers=")))


def run_concord(out: Path, sets: list[str], c: Contender, case: Case) -> Run:
    """Concord contender ``c`` (``c.sets`` on top of ``sets``): orchestrator, peers, Mosquitto."""
    run = Run(c.name, bool(case.slow))
    d = out / case.profile / c.name
    d.mkdir(parents=True, exist_ok=True)
    sets = [*sets, *c.sets]
    n = _peers(sets)
    peers = [f"p{i}" for i in range(n)]
    with _net(case, peers, ["broker", "orch"]) as net:
        _apply(net, case, peers, ["broker", "orch"])
        if "network.transport=torch" in sets:  # peers reach the store at the orchestrator's
            sets.append(f"network.torch.store_host={net['orch'].ip}")
        mosq = netns.mosquitto(net["broker"], d / "logs")
        run_id = f"edge-{c.name}-{os.getpid()}".replace("_", "-")
        common = ["--broker", f"mqtt://{net['broker'].ip}:1883", "--run-id", run_id, "--insecure"]
        procs = {"orchestrator": spawn(
            concord("orchestrator", "--config", str(write_config(d / "run.toml", sets)),
                    *common, "--out", str(d)),
            d / "logs" / "orchestrator.out", popen=net["orch"].run,
        )}  # fmt: skip
        env = {"GLOO_SOCKET_IFNAME": "eth0"}  # the torch plane's gloo binds the emulated link
        for i in range(n):
            own = sets + (_straggler(i, case) if i in case.slow else [])
            config = write_config(d / f"peer-{i}.toml", own)
            host = net[f"p{i}"]
            argv = concord("peer", "--config", str(config), *common, "--id", str(i),
                           "--listen", "0.0.0.0:50051", "--advertise", f"{host.ip}:50051",
                           "--out", str(d / "peers" / f"peer-{i}"))  # fmt: skip
            procs[f"peer-{i}"] = spawn(argv, d / "logs" / f"peer-{i}.out", env=env, popen=host.run)
        end = time.monotonic() + RUN_TIMEOUT
        try:
            codes = {name: _wait(p, end) for name, p in procs.items()}
            _concord_curve(run, d / "peers", n)
            _measure_links(run, net, peers)
        finally:
            reap([p.pid for p in procs.values() if p.poll() is None], grace=2.0)
            mosq.kill()
            mosq.wait(10)
    summaries = [read_peer_summary(d / "peers" / f"peer-{i}") for i in range(n)]
    payload = [x.bytes_sent_total for x in summaries if x is not None]
    run.payload_bytes = statistics.fmean(payload) if payload else None
    run.ok = all(v == 0 for v in codes.values()) and bool(run.curve)
    if not run.ok:
        run.detail.update(exit_codes=codes, tail=tail(d / "logs" / "orchestrator.out", 800))
    return run


def _straggler(peer: int, case: Case) -> list[str]:
    return [f"network.straggler.peer={peer}", f"network.straggler.factor={case.slow_factor}"]
