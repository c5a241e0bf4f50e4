"""The harness of ``bench/chaos.py``'s cases: the run context and outcome of a case, ``concord
sim`` launchers (`SimRun`) and deployments started process by process (`Deployment`), and what
the cases read back from the run directories they leave."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import concord.lab.net as netns
from bench._procs import (
    concord,
    jsonl,
    launched_by,
    read_json,
    reap,
    sim_argv,
    spawn,
    steps,
    tail,
    timestamp,
    wait_exit,
    wait_for,
)
from concord.core.records import JSON, RunSummary
from concord.runtime.records import read_orchestrator_summary, read_peer_summary, read_summary

MIB = 1 << 20
VICTIMS = (2, 5)  # kill25: 2 of 8, not neighbours on the ring
RESTARTED, STALLED, CUT = 3, 4, 5
FORGED_MAX_ROUNDS = 4
MARK = "forged-by-chaos"  # the reason field of every forged message
FORGE_EVERY = 0.2  # seconds between two bursts of forgeries
# a peer's own topics: its broker credentials may publish there, so the broker delivers forgeries
# on them by design; whether they are *accepted* is for the receivers (signatures) to decide
OWN_KINDS = {"status", "heartbeat", "stats", "metrics"}
RUN_TIMEOUT = 300.0  # seconds a whole run may take on the loaded 2-core machine


class Skip(Exception):  # noqa: N818 - not an error: a case that cannot run
    """A case that cannot run here; the message says why."""


@dataclass
class Case:
    name: str
    ok: bool = False
    seconds: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ctx:
    out: Path
    quick: bool
    fuzz_examples: int
    epochs_set: int | None = None  # --epochs
    seeds_set: int | None = None  # --restart-seeds
    metrics: dict[str, Any] = field(default_factory=dict)
    run_dirs: list[Path] = field(default_factory=list)  # checked for corrupt outputs
    left_behind: dict[int, str] = field(default_factory=dict)  # orphans of exited launchers
    baseline: RunSummary | None = None

    @property
    def epochs(self) -> int:
        return self.epochs_set or (4 if self.quick else 10)

    @property
    def restart_seeds(self) -> int:
        return self.seeds_set or (3 if self.quick else 5)

    def dir(self, name: str) -> Path:
        d = self.out / name
        if d.exists():
            shutil.rmtree(d)
        self.run_dirs.append(d)
        return d


def base_sets(ctx: Ctx, seed: int = 0) -> list[str]:
    return [
        "peers=8",
        "dataset=digits",
        "model.name=mlp",
        f"epochs={ctx.epochs}",
        "eval.every=2",
        f"seed={seed}",
        "threads=1",
        "orchestrator.heartbeat=0.2",
        "orchestrator.liveness_timeout=2",
        "network.deadline=2",
        "network.startup_timeout=180",
    ]


def total_steps(ctx: Ctx) -> int:
    return ctx.epochs * 11  # digits: 1437 training samples, 8 peers, batches of 16


# -- concord sim runs ----------------------------------------------------------------------------


class SimRun:
    """One ``concord sim`` launcher in a session of its own (its children in its group)."""

    def __init__(
        self, ctx: Ctx, name: str, sets: list[str], *, broker: str | None = None,
        engine: str = "processes",
    ) -> None:  # fmt: skip
        self.dir = ctx.dir(name)
        self.log = ctx.out / f"{name}.launcher.out"
        self.log.unlink(missing_ok=True)
        self.t0 = time.time()
        self.proc = spawn(sim_argv(self.dir, sets, engine=engine, broker=broker), self.log)
        self.code: int | None = None
        self.left: dict[int, str] = {}  # children alive 5 s after the launcher exited by itself
        self.ctx = ctx

    def child(self, role: str) -> int | None:
        """pid of the launcher's ``orchestrator`` or ``peer-<i>``."""
        for pid, cmd in launched_by(self.proc.pid).items():
            words = cmd.split()
            if role == "orchestrator" and "orchestrator" in words:
                return pid
            is_peer = role.startswith("peer-") and "peer" in words and "--id" in words
            if is_peer and words[words.index("--id") + 1] == role[5:]:
                return pid
        return None

    def steps(self) -> int:
        return steps(self.dir / "metrics.jsonl")

    def until_steps(self, n: int, timeout: float = RUN_TIMEOUT) -> bool:
        return wait_for(lambda: self.steps() >= n or self.proc.poll() is not None, timeout, 0.1)

    def until_quarter(self, d: dict[str, Any], total: int | None = None) -> bool:
        """Wait until the run trained a quarter of its ``total`` steps (default: `total_steps`);
        False, the reason in ``d``, when it never does."""
        if self.until_steps((total_steps(self.ctx) if total is None else total) // 4):
            return True
        d["error"] = "the run never reached a quarter of its steps"
        return False

    def wait(self, timeout: float = RUN_TIMEOUT) -> int | None:
        self.code = wait_exit(self.proc, timeout)
        return self.code

    def stop(self) -> None:
        """End the launcher's whole group and any child still alive (teardown). Children that
        outlive a launcher which exited by itself are orphans it left: recorded in ``left`` and
        in the run's orphan count before they are ended."""
        if self.proc.poll() is not None:
            wait_for(lambda: not launched_by(self.proc.pid), 5.0, 0.1)
            self.left = launched_by(self.proc.pid)
            self.ctx.left_behind.update(self.left)
        kids = list(launched_by(self.proc.pid))
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        reap(kids, grace=2.0)

    def summary(self) -> RunSummary | None:
        """The run's summary.json (`concord.runtime.records.read_summary`), None if none."""
        return read_summary(self.dir)


def finished(run: SimRun, d: dict[str, Any], *, dropped: list[int] | None = None) -> bool:
    """Common checks of a run expected to finish: exit 0, a summary, the expected peers."""
    s = run.summary()
    d["exit_code"] = run.code
    if s is None:
        d["launcher_tail"] = tail(run.log, 800)
        return False
    d.update(
        accuracy=s.accuracy_avg_model,
        peers_completed=s.peers_completed,
        peers_dropped=s.peers_dropped,
        children_failed=s.children_failed,
        wall_seconds=s.wall_seconds,
    )
    ok = run.code == 0
    if dropped is not None:
        ok = ok and sorted(s.peers_dropped or []) == sorted(dropped)
        expect = [i for i in range(8) if i not in dropped]
        ok = ok and all(i in (s.peers_completed or []) for i in expect)
    return ok


def step_rows(peer_dir: Path) -> list[dict[str, Any]]:
    return [r for r in jsonl(peer_dir / "metrics.jsonl") if r.get("kind") == "step"]


def flat(x: Any) -> list[Any]:
    if isinstance(x, list):
        return [y for item in x for y in flat(item)]
    return [x]


def over_max_rounds(peer_dirs: list[Path], max_rounds: int) -> int:
    return sum(1 for p in peer_dirs for r in step_rows(p) if int(r.get("rounds") or 0) > max_rounds)


def decisions_diverged(run_dir: Path, peer_dirs: list[Path]) -> int:
    """Peer step rows (train stage, barrier mode) whose rounds differ from the rounds the
    orchestrator decided for that step (control.jsonl): a decision the orchestrator never made
    was followed."""
    decided: dict[int, int] = {}
    for r in jsonl(run_dir / "control.jsonl"):
        if r.get("kind") == "round" and r.get("stage", "train") == "train":
            step, rnd = int(r["step"]), int(r["round"])
            decided[step] = max(decided.get(step, 0), rnd + int(bool(r.get("repeat"))))
    return sum(
        1
        for p in peer_dirs
        for r in step_rows(p)
        if r.get("stage", "train") == "train"
        and int(r["step"]) in decided
        and int(r.get("rounds") or 0) != decided[int(r["step"])]
    )


def drop_times(run_dir: Path) -> dict[int, float]:
    """peer → when the orchestrator logged dropping it (seconds since the epoch)."""
    out: dict[int, float] = {}
    for row in jsonl(run_dir / "log.jsonl"):
        ts = timestamp(row)
        if row.get("event") == "peer.dropped" and ts is not None and "peer" in row:
            out.setdefault(int(row["peer"]), ts)
    return out


def gap_pp(ctx: Ctx, accuracy: Any) -> float | None:
    base = None if ctx.baseline is None else ctx.baseline.accuracy_avg_model
    if not isinstance(base, float) or not isinstance(accuracy, float):
        return None
    return round(100.0 * (base - accuracy), 3)


def output_state(run_dir: Path) -> tuple[str, str]:
    """("summary" | "error" | "records" | "corrupt", why) of what a run directory holds."""
    s = read_json(run_dir / "summary.json")
    if s is not None and ("accuracy_avg_model" in s or "completed" in s):
        return "summary", ""
    e = read_json(run_dir / "error.json")
    if e is not None and e.get("error"):
        return "error", str(e["error"])[:200]
    orch = read_json(run_dir / "orchestrator-summary.json")
    peer_dirs = sorted(p for p in [*run_dir.glob("peers/peer-*"), *run_dir.glob("peer-*")]
                       if p.is_dir())  # fmt: skip
    records = []
    for p in peer_dirs:
        ps, pe = read_json(p / "summary.json"), read_json(p / "error.json")
        if ps is None and (pe is None or not pe.get("error")):
            return "corrupt", f"{p.name} has neither summary.json nor error.json"
        records.append(p.name)
    if orch is not None and peer_dirs:
        return "records", f"orchestrator-summary.json and records of {len(records)} peers"
    if peer_dirs and orch is None:
        return "records", f"records of {len(records)} peers (no orchestrator record)"
    return "corrupt", "no summary.json, error.json or peer records"


# -- deployments: orchestrator and peers started one by one --------------------------------------


def write_config(path: Path, sets: list[str]) -> Path:
    from concord.core.config import load_config, to_toml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(load_config(None, sets, environ={})), encoding="utf-8")
    return path


class Deployment:
    """Orchestrator + n peers as separate commands with one run id; on loopback, or each in its
    own namespace host of ``net`` (hosts "orch", "p<i>"; peers listen on 0.0.0.0:50051)."""

    def __init__(
        self, run_dir: Path, config: Path, broker: str, run_id: str, peers: int,
        net: netns.Net | None = None,
    ) -> None:  # fmt: skip
        self.dir, self.peers, self.net = run_dir, peers, net
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        common = ["--config", str(config), "--broker", broker, "--run-id", run_id]
        if net is not None:  # every interface, no TLS, an anonymous broker: a lab network
            common.append("--insecure")
        popen = net["orch"].run if net else None
        logs = run_dir / "logs"
        self.procs["orchestrator"] = spawn(
            concord("orchestrator", *common, "--out", str(run_dir)), logs / "orchestrator.out",
            popen=popen,
        )  # fmt: skip
        for i in range(peers):
            if net is not None:
                host = net[f"p{i}"]
                where = ["--listen", "0.0.0.0:50051", "--advertise", f"{host.ip}:50051"]
                popen = host.run
            else:
                where, popen = ["--listen", "127.0.0.1:0"], None
            out = run_dir / "peers" / f"peer-{i}"
            argv = concord("peer", *common, "--id", str(i), *where, "--out", str(out))
            self.procs[f"peer-{i}"] = spawn(argv, logs / f"peer-{i}.out", popen=popen)

    def steps(self, peer: int = 0) -> int:
        return steps(self.dir / "peers" / f"peer-{peer}" / "metrics.jsonl")

    def wait(self, timeout: float = RUN_TIMEOUT) -> dict[str, int | None]:
        end = time.monotonic() + timeout
        return {n: wait_exit(p, max(0.1, end - time.monotonic())) for n, p in self.procs.items()}

    def stop(self) -> None:
        alive = [p.pid for p in self.procs.values() if p.poll() is None]
        reap(alive, grace=2.0)
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)

    def check(self, d: dict[str, Any], codes: dict[str, int | None], spare: set[int]) -> bool:
        """The orchestrator exited 0 and every peer but ``spare`` completed."""
        d["exit_codes"] = codes
        hung = [n for n, c in codes.items() if c is None]
        if hung:
            d["hung"] = hung  # still running at the end of the wait: ended by the teardown
        orch = read_orchestrator_summary(self.dir)
        if orch is not None:
            d["peers_done"], d["peers_dropped"] = orch.peers_done, orch.peers_dropped
        accs = []
        ok = codes.get("orchestrator") == 0 and not hung
        for i in range(self.peers):
            s = read_peer_summary(self.dir / "peers" / f"peer-{i}")
            if s is not None and s.accuracy_mean_peer is not None:
                accs.append(s.accuracy_mean_peer)
            if i not in spare and (s is None or not s.completed):
                ok = False
                d.setdefault("not_completed", []).append(i)
        d["accuracy_mean_peer"] = sum(accs) / len(accs) if accs else None
        if not ok:
            d["orchestrator_tail"] = tail(self.dir / "logs" / "orchestrator.out", 600)
        return ok


def peer_extra(peer_dir: Path, name: str) -> JSON:
    """``name`` of the ``extra`` of the peer's summary (its transport and coordination
    counters: `concord.runtime.records.read_peer_summary`); None without a summary or one."""
    summary = read_peer_summary(peer_dir)
    return None if summary is None else summary.extra.get(name)


def final_params(path: Path) -> Any:
    """(parameters, the whole state) of the checkpoint at ``path``."""
    import torch

    state = torch.load(path, weights_only=True, map_location="cpu")
    return state["params"], state


def max_abs_diff(a: Any, b: Any) -> float:
    """max |a − b| over the tensors of ``a`` and ``b`` (nested dictionaries of the same keys)."""
    import torch

    if isinstance(a, dict):
        return max((max_abs_diff(a[k], b[k]) for k in a), default=0.0)
    return float(torch.max(torch.abs(a.double() - b.double())).item()) if a.numel() else 0.0
