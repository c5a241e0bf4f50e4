"""Chaos: a fault matrix over real runs — every case a real run (or a real peer / transport
process) in a fresh directory, checked afterwards from what it left behind.

The runs: 8 peers, the digits dataset, an MLP, D-SGD on a ring with adaptive consensus control,
4 epochs with ``--quick`` (10 without; ``--epochs``), one torch thread per process, heartbeats
every 0.2 s, ``liveness_timeout`` and the step deadline 2 s (`base_sets`). ``concord sim
--engine processes`` runs them where one host is enough; the cases that need a network of their
own (``cut``, ``cap``) or a fixed run id (the broker ACL of ``forged_secure``) start Mosquitto,
``concord orchestrator`` and ``concord peer`` themselves (`Deployment`), in network namespaces
(``bench/_netns.py``) for the former.

Cases (``--cases`` picks some; each is ok only if every check listed holds):

* ``baseline``: fault-free run, seed 0 — exits 0, every peer completed; its accuracy is the
  reference of the gaps (run first whenever ``kill25`` or ``restart`` is asked for);
* ``kill25``: SIGKILL peers 2 and 5 at a quarter of the steps — the run finishes (exit 0) with
  both dropped and the rest completed; ``kill25_acc_gap_pp`` = baseline − this accuracy (pp);
  ``detect_s``: kill → the first sign of detection per victim (the orchestrator's
  ``peer.dropped`` log record or a ring neighbour's step row naming it ``missing``, polled every
  50 ms), the slower victim;
* ``restart``: a run ``RESTART_LENGTH`` (8) times longer (a restarted interpreter needs seconds
  to be back) and its fault-free reference; SIGKILL peer 3 at an eighth, and once the
  orchestrator dropped it (≤ 10 s), start the very same command again (argv, environment, cwd
  from /proc) — the run finishes and the restarted peer exits 0; ``rejoin_s``: the restarted
  process ready (its ``peer.listening`` log line) → its first new step row (null if it never
  trains again; the time from the command, its exit code and output are in the details);
  ``rejoin_acc_gap_pp`` = reference − this accuracy, the mean over ``--restart-seeds`` seeds
  (3 with ``--quick``, 5 without), each run against the reference of its own seed (the paired
  gaps and their spread in the details; ``rejoin_s``: the slowest of the seeds);
* ``stall``: SIGSTOP peer 4 for 20 s, then SIGCONT — the run finishes, the others completed;
* ``cut`` / ``cap``: in network namespaces: peer 5's link down for 10 s, then up / every link
  capped at 10 Mbit/s both ways (tc tbf) — the orchestrator exits 0 and every peer (but the cut
  one) completed;
* ``broker_barrier`` / ``broker_lagged``: ``concord sim --broker`` on a Mosquitto that is stopped
  at a quarter of the steps (phase 1) and restarted on the same port 1.5 s later — exit 0, no peer
  dropped;
* ``orch_kill_start`` / ``orch_kill_mid`` / ``orch_kill_between``: SIGKILL the orchestrator as soon
  as it announced itself (before the peers are admitted) / at a quarter of the steps / at the end
  of the ``calibrate`` stage (constant control: calibrate, then train) — the launcher and every
  child end within 180 s and the run directory holds a summary or error records;
* ``forged_unauth`` / ``forged_peer`` (security off, ``control.max_rounds`` = 4): a rogue client
  (anonymous / with a peer-like client id) publishes forged decisions (``repeat`` every round,
  ``rounds_next`` = 10 000), schedules (a peer missing, bogus addresses) and statistics every
  0.2 s (`FORGE_EVERY`) from the orchestrator's start to the run's end — ``forged_crashes``:
  failed processes (launcher exit ≠ 0, failed children); ``forged_max_rounds_exceeded``: peer
  step rows with more than ``max_rounds`` rounds; ``decisions_diverged`` (details): step rows
  whose rounds differ from what the orchestrator decided (control.jsonl), i.e. forged decisions
  followed;
* ``forged_secure`` (security on): ``concord certs init`` + ``concord certs broker``, Mosquitto
  with the password file, ACL and TLS; an anonymous client and one with peer 0's credentials
  publish the same forgeries from the first training step on — ``forged_accepted``: accepted
  anonymous connections + forged messages a monitor subscriber received + step rows beyond
  ``max_rounds`` + step rows following a decision the orchestrator never made;
* ``forged_signed``: the same with every control message signed (``concord.protos.signing``,
  ``network.tls.sign_control`` with ``concord certs issue`` keys), plus forgeries on peer 0's own
  topics (a "failed" status, statistics), which its broker credentials may publish and only the
  signatures can refuse (accepted if peer 0 is dropped); skipped with the reason while the
  module or its switch is missing;
* ``impersonation``: a peer under mTLS; a client with peer 0's valid certificate claims id 1 (Hello
  and a tensor stream) — ``impersonation_accepted``: a Hello accepted or a stream not refused;
* ``stalled_streams``: 40 streams (own connections, own Hellos) send half a 16 MiB tensor and stall
  at a real `Transport` in its own process — ``rss_growth_mib_stalled`` ≤ ``rss_bound_mib`` (two
  tensors per neighbour + 50 MiB); the code of ``tests/peer/test_bounds.py``;
* ``mailbox_flood``: one neighbour sends 12 tensors for rounds nobody collects yet — at most the
  budget (2 tensors) is held, the rest refused with RESOURCE_EXHAUSTED, and the peer still serves;
* ``resume_vectorized``: the vectorized engine uninterrupted vs SIGKILLed at its first checkpoint
  and continued with ``concord sim --resume`` — ``resume_max_abs_diff`` of the final parameters;
* ``resume_processes``: the processes engine, every process SIGKILLed once all hold a common
  checkpoint step, continued with ``concord sim --resume`` — ``resume_max_abs_diff_processes``
  against the baseline's peer checkpoints
  with the command's refusal as the reason;
* ``fuzz``: ``bench/fuzz.py``'s `run_target` on every target, 2,000 (``--quick``) or 10,000
  cases each — ``fuzz_cases`` (total; per target in ``fuzz_cases_by_target``), ``fuzz_crashes``;
* ``takeover`` / ``stale_run`` / ``fetch_flood``: issue 26's attacks on real runs
  (``bench/chaos_attacks.py`` says how) — ``takeover_accepted``, ``stale_run_accepted``,
  ``fetch_non_neighbour_accepted``, each 0.

``orphans`` = processes still alive after all cases that carry this run's tag (`bench._procs`;
they are then ended) + children still alive 5 s after their ``concord sim`` launcher exited by
itself (found per case, before the case's teardown ends them); ``corrupt_outputs`` = run
directories with neither a valid summary nor an error record. A skipped case counts in
``cases_total`` and not in ``cases_ok``.

Last stdout line: one JSON object (keys in `KEYS`, per-case ``cases``); the targets are printed
before it, each PASS / FAIL (or n/a when not measured).

    python bench/chaos.py [--quick] [--cases a,b] [--out DIR] [--fuzz-examples N] [--epochs N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _netns, chaos_attacks
from bench._procs import (
    ROOT,
    concord,
    jsonl,
    launched_by,
    read_json,
    reap,
    set_tag,
    sim_argv,
    spawn,
    steps,
    tagged,
    tail,
    timestamp,
    wait_exit,
    wait_for,
)

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

KEYS = [
    "cases_total", "cases_ok", "orphans", "corrupt_outputs", "forged_accepted", "forged_crashes",
    "forged_max_rounds_exceeded", "impersonation_accepted", "kill25_acc_gap_pp",
    "rejoin_acc_gap_pp", "detect_s", "rejoin_s", "rss_growth_mib_stalled", "rss_bound_mib",
    "resume_max_abs_diff", "resume_max_abs_diff_processes", "fuzz_cases", "fuzz_crashes",
    "takeover_accepted", "stale_run_accepted", "fetch_non_neighbour_accepted",
]  # fmt: skip


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
    baseline: dict[str, Any] | None = None

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

    def summary(self) -> dict[str, Any] | None:
        return read_json(self.dir / "summary.json")


def finished(run: SimRun, d: dict[str, Any], *, dropped: list[int] | None = None) -> bool:
    """Common checks of a run expected to finish: exit 0, a summary, the expected peers."""
    s = run.summary()
    d["exit_code"] = run.code
    if s is None:
        d["launcher_tail"] = tail(run.log, 800)
        return False
    d.update(
        accuracy=s.get("accuracy_avg_model"),
        peers_completed=s.get("peers_completed"),
        peers_dropped=s.get("peers_dropped"),
        children_failed=s.get("children_failed"),
        wall_seconds=s.get("wall_seconds"),
    )
    ok = run.code == 0
    if dropped is not None:
        ok = ok and sorted(s.get("peers_dropped") or []) == sorted(dropped)
        expect = [i for i in range(8) if i not in dropped]
        ok = ok and all(i in (s.get("peers_completed") or []) for i in expect)
    return ok


def step_rows(peer_dir: Path) -> list[dict[str, Any]]:
    return [r for r in jsonl(peer_dir / "metrics.jsonl") if r.get("kind") == "step"]


def _flat(x: Any) -> list[Any]:
    if isinstance(x, list):
        return [y for item in x for y in _flat(item)]
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
    base = (ctx.baseline or {}).get("accuracy_avg_model")
    if not isinstance(base, float) or not isinstance(accuracy, float):
        return None
    return round(100.0 * (base - accuracy), 3)


# -- the cases: runs on one host -----------------------------------------------------------------


def case_baseline(ctx: Ctx, d: dict[str, Any]) -> bool:
    run = SimRun(ctx, "baseline", base_sets(ctx))
    try:
        run.wait()
    finally:
        run.stop()
    ok = finished(run, d, dropped=[])
    ctx.baseline = run.summary() if ok else None
    return ok


def _ensure_baseline(ctx: Ctx) -> None:
    if ctx.baseline is None:
        raise RuntimeError("the fault-free baseline failed or did not run: no reference")


def case_kill25(ctx: Ctx, d: dict[str, Any]) -> bool:
    run = SimRun(ctx, "kill25", base_sets(ctx))
    try:
        if not run.until_steps(total_steps(ctx) // 4):
            d["error"] = "the run never reached a quarter of its steps"
            return False
        pids = {v: run.child(f"peer-{v}") for v in VICTIMS}
        neighbours = {v: [(v - 1) % 8, (v + 1) % 8] for v in VICTIMS}
        seen_rows = {  # rows before the kill do not count (a slow victim may have been missed)
            n: len(step_rows(run.dir / "peers" / f"peer-{n}")) for ns in neighbours.values()
            for n in ns
        }  # fmt: skip
        killed: dict[int, float] = {}
        for v, pid in pids.items():
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed[v] = time.time()
        d["killed_at_step"] = run.steps()
        skip_seen: dict[int, float] = {}

        def detected() -> bool:
            for v in VICTIMS:
                if v in skip_seen:
                    continue
                for n in neighbours[v]:
                    rows = step_rows(run.dir / "peers" / f"peer-{n}")[seen_rows[n] :]
                    if any(v in _flat(r.get("missing")) for r in rows):
                        skip_seen[v] = time.time()
                        break
            drops = drop_times(run.dir)
            return all(v in skip_seen and v in drops for v in VICTIMS)

        wait_for(detected, 30.0, 0.05)
        run.wait()
    finally:
        run.stop()
    drops = drop_times(run.dir)
    per: dict[str, Any] = {}
    worst: float | None = None
    for v in VICTIMS:
        if v not in killed:
            per[str(v)] = "not found to kill"
            continue
        drop = drops.get(v)
        skip = skip_seen.get(v)
        first = min(x for x in (drop, skip, float("inf")) if x is not None)
        per[str(v)] = {
            "drop_s": None if drop is None else round(drop - killed[v], 3),
            "skip_s": None if skip is None else round(skip - killed[v], 3),
        }
        if first != float("inf"):
            worst = max(worst or 0.0, first - killed[v])
        else:
            worst = float("inf")
    d["detect"] = per
    ok = len(killed) == len(VICTIMS) and finished(run, d, dropped=list(VICTIMS))
    ctx.metrics["detect_s"] = None if worst in (None, float("inf")) else round(worst, 3)
    ctx.metrics["kill25_acc_gap_pp"] = gap_pp(ctx, d.get("accuracy"))
    return ok


def _proc_snapshot(pid: int) -> tuple[list[str], dict[str, str], str]:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    env = {}
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode()] = value.decode(errors="replace")
    return [a.decode() for a in argv], env, os.readlink(f"/proc/{pid}/cwd")


RESTART_LENGTH = 8  # the restart case trains this many times longer: time to rejoin


def restart_sets(ctx: Ctx, seed: int) -> list[str]:
    """The base run, ``RESTART_LENGTH`` times longer: a restarted interpreter takes seconds
    (Python, torch) to be back, while a quick run's whole training takes a few."""
    sets = [s for s in base_sets(ctx, seed) if not s.startswith("epochs=")]
    return [*sets, f"epochs={RESTART_LENGTH * ctx.epochs}"]


def _ready_at(log: Path, after: float) -> float | None:
    """When the restarted process was ready (its ``peer.listening`` log line after ``after``)."""
    times = [
        t
        for row in jsonl(log)
        if row.get("event") == "peer.listening" and (t := timestamp(row)) is not None
    ]
    later = [t for t in times if t >= after]
    return min(later) if later else None


def case_restart(ctx: Ctx, d: dict[str, Any]) -> bool:
    """`restart_seed` for seeds 0 … ``ctx.restart_seeds`` − 1, each against its own reference:
    ``rejoin_acc_gap_pp`` is the mean of the paired gaps (one test set of 359 samples puts a
    single run's gap on a grid of 0.28 points, and where one rejoin lands in training moves the
    end by a few samples either way: one seed measures that noise as much as the rejoin), the
    gaps themselves in the details; ``rejoin_s`` the slowest of the rejoins."""
    gaps: list[float] = []
    rejoins: list[float] = []
    ok = True
    for seed in range(ctx.restart_seeds):
        one = d.setdefault("seeds", {}).setdefault(str(seed), {})
        ok = restart_seed(ctx, seed, one) and ok
        if isinstance(one.get("gap_pp"), float):
            gaps.append(one["gap_pp"])
        if isinstance(one.get("rejoin_s"), float):
            rejoins.append(one["rejoin_s"])
    complete = len(gaps) == len(rejoins) == ctx.restart_seeds
    ctx.metrics["rejoin_acc_gap_pp"] = round(statistics.fmean(gaps), 3) if complete else None
    ctx.metrics["rejoin_s"] = max(rejoins) if complete else None
    d["gaps_pp"] = gaps
    d["gap_pp_spread"] = [min(gaps), max(gaps)] if gaps else None
    return ok and complete


def restart_seed(ctx: Ctx, seed: int, d: dict[str, Any]) -> bool:
    """One seed of ``restart``: the fault-free reference, then the run with the restart."""
    suffix = "" if seed == 0 else f"_seed{seed}"
    reference = SimRun(ctx, f"restart_reference{suffix}", restart_sets(ctx, seed))
    try:
        reference.wait()
    finally:
        reference.stop()
    if not finished(reference, d.setdefault("reference", {}), dropped=[]):
        d["error"] = "the fault-free reference run of this length failed"
        return False
    reference_acc = (reference.summary() or {}).get("accuracy_avg_model")
    run = SimRun(ctx, f"restart{suffix}", restart_sets(ctx, seed))
    again: subprocess.Popen[bytes] | None = None
    metrics = run.dir / "peers" / f"peer-{RESTARTED}" / "metrics.jsonl"
    rejoin = ready = None
    try:
        if not run.until_steps(RESTART_LENGTH * total_steps(ctx) // 8):
            d["error"] = "the run never reached a quarter of its steps"
            return False
        pid = run.child(f"peer-{RESTARTED}")
        if pid is None:
            d["error"] = f"peer {RESTARTED} not found"
            return False
        argv, env, cwd = _proc_snapshot(pid)
        # as a user restarts it by hand: not as a child of the launcher (that child would die
        # at once, seeing the parent it was told of gone: concord.runtime.lifecycle)
        env.pop("CONCORD_PARENT_PID", None)
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        before = steps(metrics)
        wait_for(lambda: RESTARTED in drop_times(run.dir), 10.0, 0.05)
        drop = drop_times(run.dir).get(RESTARTED)
        d["drop_s"] = None if drop is None else round(drop - killed, 3)
        log = ctx.out / f"restart{suffix}.peer.out"
        restarted = time.time()
        with log.open("wb") as f:
            again = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        d["command"] = " ".join(argv[2:])
        trained = wait_for(lambda: steps(metrics) > before or again.poll() is not None, 60, 0.05)
        if trained and steps(metrics) > before:
            back = time.time()
            rejoin = back - restarted
            ready = _ready_at(metrics.parent / "log.jsonl", restarted)
            d["ready_s"] = None if ready is None else round(ready - restarted, 3)
            d["rejoin_from_command_s"] = round(rejoin, 3)
        run.wait()
        d["restarted_exit_code"] = wait_exit(again, 60)
        if d["restarted_exit_code"] not in (None, 0):
            d["restarted_tail"] = tail(log, 600)
    finally:
        run.stop()
        if again is not None and again.poll() is None:
            reap([again.pid], grace=2.0)
            again.wait(10)
    # rejoin_s: from the restarted process being ready (listening: interpreter, torch and the
    # data loaded, which no protocol can shorten) to its first step back in the run
    d["rejoin_s"] = (
        None if rejoin is None or ready is None else round(restarted + rejoin - ready, 3)
    )
    ok = finished(run, d)
    accuracy = d.get("accuracy")
    d["gap_pp"] = (
        round(100.0 * (reference_acc - accuracy), 3)
        if isinstance(reference_acc, float) and isinstance(accuracy, float)
        else None
    )
    d["reference_accuracy"] = reference_acc
    return ok and d["restarted_exit_code"] == 0


def case_stall(ctx: Ctx, d: dict[str, Any]) -> bool:
    run = SimRun(ctx, "stall", base_sets(ctx))
    try:
        if not run.until_steps(total_steps(ctx) // 4):
            d["error"] = "the run never reached a quarter of its steps"
            return False
        pid = run.child(f"peer-{STALLED}")
        if pid is None:
            d["error"] = f"peer {STALLED} not found"
            return False
        _netns.stall(pid)
        time.sleep(20.0)
        _netns.resume(pid)
        resumed = time.time()
        run.wait()
    finally:
        run.stop()
    ok = finished(run, d)
    log = jsonl(run.dir / "peers" / f"peer-{STALLED}" / "log.jsonl")
    ends = [timestamp(r) for r in log if r.get("event") == "run.finish"]
    d["stalled_peer_finished_after_resume_s"] = (
        round(ends[0] - resumed, 1) if ends and ends[0] is not None else None
    )
    rows = step_rows(run.dir / "peers" / f"peer-{STALLED}")
    d["stalled_peer_steps_alone"] = sum(1 for r in rows if len(_flat(r.get("missing"))) >= 2)
    completed = d.get("peers_completed") or []
    others = [i for i in range(8) if i != STALLED]
    d["stalled_peer"] = (
        "completed" if STALLED in completed
        else "dropped" if STALLED in (d.get("peers_dropped") or []) else "neither"
    )  # fmt: skip
    return ok and all(i in completed for i in others)


def _broker_restart(ctx: Ctx, d: dict[str, Any], name: str, lagged: bool) -> bool:
    from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary

    if mosquitto_binary() is None:
        raise Skip("mosquitto is not installed")
    broker = MosquittoBroker()
    broker.start()
    restarted: MosquittoBroker | None = None
    # one controlled phase (no milestones) 3× as long: the outage falls in the middle of it, with
    # enough training left that the peers are still at work when the broker is back
    epochs = 3 * ctx.epochs
    sets = [*base_sets(ctx), f"epochs={epochs}", "optim.milestones=[]"]
    sets.append(f"control.lagged={str(lagged).lower()}")
    run = SimRun(ctx, name, sets, broker=broker.url)
    try:
        if not run.until_steps(epochs * 11 // 4):
            d["error"] = "the run never reached a quarter of its steps"
            return False
        d["stopped_at_step"] = run.steps()
        broker.stop()
        time.sleep(1.5)
        restarted = MosquittoBroker(port=broker.port)
        restarted.start()
        run.wait()
    finally:
        run.stop()
        broker.stop()
        if restarted is not None:
            restarted.stop()
    rows = [r for i in range(8) for r in step_rows(run.dir / "peers" / f"peer-{i}")]
    d["fallback_steps"] = sum(1 for r in rows if r.get("control") == "fallback")
    return finished(run, d, dropped=[])


def case_broker_barrier(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _broker_restart(ctx, d, "broker_barrier", lagged=False)


def case_broker_lagged(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _broker_restart(ctx, d, "broker_lagged", lagged=True)


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


def _orch_kill(ctx: Ctx, d: dict[str, Any], name: str, when: str) -> bool:
    sets = base_sets(ctx)
    if when == "between":
        sets += ["control.mode=constant", "control.factor=0.5"]
    run = SimRun(ctx, name, sets)
    try:
        if when == "start":
            ready = wait_for(lambda: (run.dir / "orchestrator.json").is_file(), 120, 0.01)
            d["manifest_before_kill"] = (run.dir / "manifest.json").is_file()
        elif when == "mid":
            ready = run.until_steps(total_steps(ctx) // 4)
        else:

            def calibrated() -> bool:
                return any(
                    r.get("event") == "stage.done" and r.get("stage") == "calibrate"
                    for r in jsonl(run.dir / "log.jsonl")
                )

            ready = wait_for(calibrated, RUN_TIMEOUT, 0.01)
        pid = run.child("orchestrator")
        if not ready or pid is None:
            d["error"] = f"never reached the moment to kill ({when}); orchestrator pid {pid}"
            return False
        kids = set(launched_by(run.proc.pid))
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        d["killed_at_step"] = run.steps()
        run.wait(180)
        d["launcher_exit_s"] = round(time.monotonic() - killed, 1)
        gone = wait_for(lambda: not (set(launched_by(run.proc.pid)) & kids), 30, 0.2)
        d["children_left_30s_after"] = sorted(set(launched_by(run.proc.pid)) & kids)
    finally:
        run.stop()
    state, why = output_state(run.dir)
    d.update(exit_code=run.code, output=state, output_detail=why)
    d["launcher_tail"] = tail(run.log, 400)
    return run.code is not None and gone and state != "corrupt"


def case_orch_kill_start(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _orch_kill(ctx, d, "orch_kill_start", "start")


def case_orch_kill_mid(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _orch_kill(ctx, d, "orch_kill_mid", "mid")


def case_orch_kill_between(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _orch_kill(ctx, d, "orch_kill_between", "between")


# -- forged control messages ---------------------------------------------------------------------


def _forgeries(
    run: str, step: int, max_rounds: int, own: bool = False, own_peer: int = 0
) -> list[tuple[str, Any, int | None]]:
    """(kind, message, peer) of one burst of forged control messages around ``step``."""
    from concord.protos.control_plane import MAX_ROUNDS, Decision, Schedule, Stats, Status

    out: list[tuple[str, Any, int | None]] = []
    for s in range(step, step + 3):
        out += [
            ("decision", Decision(step=s, round=r, repeat=True, reason=MARK), None)
            for r in range(1, max_rounds + 3)
        ]
        out.append(
            ("decision", Decision(step=s, round=1, repeat=False, rounds_next=MAX_ROUNDS,
                                  reason=MARK), None)
        )  # fmt: skip
    out.append((
        "schedule",
        Schedule(
            version=1_000_000 + step, peers=list(range(7)), topology="ring", weights=None,
            kappa=1.0, seed=0, phases=[{"index": 1, "topology": None}], reason=MARK,
            addresses=[f"10.9.9.{i + 1}:1" for i in range(7)], effective_step=step + 1,
        ),
        None,
    ))  # fmt: skip
    out.append(("stats", Stats(peer=0, step=step, round=1, theta=1e9, grad_norm=1.0), 0))
    if own:  # on the rogue identity's own topics (what its broker credentials may publish)
        out.append(("status", Status(peer=own_peer, state="failed", reason=MARK), own_peer))
        out.append(("stats", Stats(peer=own_peer, step=step, round=1, theta=0.0, grad_norm=0.0),
                    own_peer))  # fmt: skip
    return out


async def _forge(
    url: str, run: str, who: str, auth: Any, running: Callable[[], bool],
    step: Callable[[], int], max_rounds: int, counts: dict[str, Any], own: bool = False,
    own_peer: int = 0,
) -> None:  # fmt: skip
    """Connect as ``who`` and publish forgery bursts every 0.2 s while ``running()``."""
    import aiomqtt

    from concord.protos.control_plane import TOPICS, Topics, encode
    from concord.protos.mqtt import client

    topics = Topics(run)
    try:
        async with client(url, who, auth=auth, timeout=5) as c:
            counts["connected"] = True
            while running():
                for kind, msg, peer in _forgeries(run, step(), max_rounds, own, own_peer):
                    spec = TOPICS[kind]
                    await c.publish(topics.topic(kind, peer), encode(msg), qos=spec.qos,
                                    retain=spec.retain)  # fmt: skip
                    counts["published"] = counts.get("published", 0) + 1
                await asyncio.sleep(FORGE_EVERY)
    except (aiomqtt.MqttError, OSError) as e:
        counts.setdefault("connected", False)
        counts["error"] = f"{type(e).__name__}: {e}"[:200]


def _current_step(metrics: Path) -> Callable[[], int]:
    def get() -> int:
        rows = [r for r in jsonl(metrics) if r.get("kind") == "step"]
        return int(rows[-1]["step"]) + 1 if rows else 0

    return get


def _forged_open(ctx: Ctx, d: dict[str, Any], name: str, who: str) -> bool:
    sets = [*base_sets(ctx), f"control.max_rounds={FORGED_MAX_ROUNDS}"]
    run = SimRun(ctx, name, sets)
    counts: dict[str, Any] = {}
    try:
        if not wait_for(lambda: (run.dir / "orchestrator.json").is_file(), 120, 0.05):
            d["error"] = "no orchestrator.json"
            return False
        info = read_json(run.dir / "orchestrator.json") or {}
        client_id = who.format(run=info.get("run"))
        asyncio.run(
            _forge(str(info.get("broker")), str(info.get("run")), client_id, None,
                   lambda: run.proc.poll() is None, _current_step(run.dir / "metrics.jsonl"),
                   FORGED_MAX_ROUNDS, counts)
        )  # fmt: skip
        run.wait()
    finally:
        run.stop()
    d["rogue"] = counts
    d["client_id"] = client_id
    ok = finished(run, d, dropped=[])
    peers = [run.dir / "peers" / f"peer-{i}" for i in range(8)]
    crashes = int(run.code != 0) + len(d.get("children_failed") or {})
    exceeded = over_max_rounds(peers, FORGED_MAX_ROUNDS)
    d.update(crashes=crashes, max_rounds_exceeded=exceeded)
    d["decisions_diverged"] = decisions_diverged(run.dir, peers)  # security off: for the record
    rows = [r for p in peers for r in step_rows(p)]
    d["mean_rounds_per_step"] = round(sum(int(r.get("rounds") or 0) for r in rows) / len(rows), 3)
    d["handler_errors"] = sum(
        int((read_json(p / "summary.json") or {}).get("control_handler_errors") or 0) for p in peers
    )
    d["schedules_refused"] = sum(
        int((read_json(p / "summary.json") or {}).get("schedules_refused") or 0) for p in peers
    )
    for key, value in (("forged_crashes", crashes), ("forged_max_rounds_exceeded", exceeded)):
        ctx.metrics[key] = (ctx.metrics.get(key) or 0) + value
    return ok and crashes == 0 and exceeded == 0 and bool(counts.get("published"))


def case_forged_unauth(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _forged_open(ctx, d, "forged_unauth", "rogue")


def case_forged_peer(ctx: Ctx, d: dict[str, Any]) -> bool:
    # without security a client id is all an identity is: a peer's shape, an id not in use (the
    # real peer's own id would only take its session over)
    return _forged_open(ctx, d, "forged_peer", "peer-{run}-9")


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
        net: _netns.Net | None = None,
    ) -> None:  # fmt: skip
        self.dir, self.peers, self.net = run_dir, peers, net
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        common = ["--config", str(config), "--broker", broker, "--run-id", run_id]
        if net is not None:  # every interface, no TLS, an anonymous broker: a lab network
            common.append("--insecure")
        if net is not None:  # the emulated hosts' bridge is this machine's own: said out loud
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
        orch = read_json(self.dir / "orchestrator-summary.json") or {}
        d["peers_done"], d["peers_dropped"] = orch.get("peers_done"), orch.get("peers_dropped")
        accs = []
        ok = codes.get("orchestrator") == 0 and not hung
        for i in range(self.peers):
            s = read_json(self.dir / "peers" / f"peer-{i}" / "summary.json") or {}
            if isinstance(s.get("accuracy"), float):
                accs.append(s["accuracy"])
            if i not in spare and not s.get("completed"):
                ok = False
                d.setdefault("not_completed", []).append(i)
        d["accuracy_mean_peer"] = sum(accs) / len(accs) if accs else None
        if not ok:
            d["orchestrator_tail"] = tail(self.dir / "logs" / "orchestrator.out", 600)
        return ok


def _netns_run(ctx: Ctx, d: dict[str, Any], name: str, fault: str) -> bool:
    ok_net, why = _netns.available()
    if not ok_net:
        raise Skip(f"network namespaces unavailable: {why}")
    from concord.orchestrator.broker import mosquitto_binary

    if mosquitto_binary() is None:
        raise Skip("mosquitto is not installed")
    run_dir = ctx.dir(name)
    run_id = f"chaos-{name}-{os.getpid()}"
    config = write_config(run_dir / "run.toml", base_sets(ctx))
    hosts = ["broker", "orch", *(f"p{i}" for i in range(8))]
    with _netns.Net(hosts) as net:
        b = net["broker"]
        try:
            mosq = _netns.mosquitto(b, run_dir / "logs")
        except RuntimeError as exc:
            d["error"] = str(exc)
            return False
        dep = Deployment(run_dir, config, f"mqtt://{b.ip}:1883", run_id, 8, net)
        try:
            if fault == "cap":
                for host in net:
                    net.cap(host, 10.0)
                d["cap_mbit"] = 10.0
            ok_steps = wait_for(lambda: dep.steps() >= total_steps(ctx) // 4, RUN_TIMEOUT, 0.1)
            if fault == "cut" and ok_steps:
                d["cut_at_step"] = dep.steps()
                net.cut(net[f"p{CUT}"])
                time.sleep(10.0)
                net.restore(net[f"p{CUT}"])
            t0 = time.monotonic()
            codes = dep.wait()
            d["tail_s"] = round(time.monotonic() - t0, 1)
        finally:
            dep.stop()
            mosq.kill()
            mosq.wait(10)
    return dep.check(d, codes, {CUT} if fault == "cut" else set())


def case_cut(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _netns_run(ctx, d, "cut", "cut")


def case_cap(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _netns_run(ctx, d, "cap", "cap")


def _signing() -> tuple[str | None, str]:
    """(the config switch for signed control messages, "") or (None, why not)."""
    import importlib.util

    if importlib.util.find_spec("concord.protos.signing") is None:
        return None, "concord.protos.signing (protos/signing.py) does not exist yet"
    from concord.core import config

    tls = getattr(config, "TLSConfig", None)
    fields = getattr(tls, "model_fields", {})
    names = [n for n in fields if "sign" in n]
    if not names:
        return None, "protos/signing.py exists but no network.tls.*sign* key switches it on"
    return f"network.tls.{names[0]}", ""


def _forged_secure(ctx: Ctx, d: dict[str, Any], name: str, signed: bool) -> bool:
    from concord.orchestrator.broker import MosquittoBroker, mosquitto_binary
    from concord.protos.mqtt import BrokerAuth

    switch = None
    if signed:
        switch, why = _signing()
        if switch is None:
            raise Skip(why)
    if mosquitto_binary() is None:
        raise Skip("mosquitto is not installed")
    run_dir = ctx.dir(name)
    run_id = f"chaos-{name}-{os.getpid()}"
    certs = run_dir / "certs"
    # broker identities for 9 peers: the rogue holds peer 8's, a valid peer login of no peer in
    # the run (Mosquitto binds client ids to logins: one holding peer 0's would close peer 0's
    # own session, an outage its owner causes, not a forgery)
    commands = [("init", "--run-id", run_id), ("broker", "--run-id", run_id, "--peers", "9")]
    if signed:  # every peer's key signs its control messages (and serves mTLS)
        commands[1:1] = [("issue", "--peer", str(i)) for i in range(8)]
    for args in commands:
        p = subprocess.run(concord("certs", args[0], "--dir", str(certs), *args[1:]),
                           capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        if p.returncode:
            d["error"] = f"concord certs {args[0]}: {p.stderr[-500:]}"
            return False
    folder = certs / "broker"
    ca = certs / "ca.crt"
    sets = [
        *base_sets(ctx),
        f"control.max_rounds={FORGED_MAX_ROUNDS}",
        "orchestrator.broker_username={identity}",
        f"orchestrator.broker_password_file={folder}/{{identity}}.password",
        f"orchestrator.broker_ca={ca}",
    ]
    if switch is not None:
        sets += [
            f"network.tls.ca={ca}",
            f"network.tls.cert={certs}/peer-{{id}}.crt",
            f"network.tls.key={certs}/peer-{{id}}.key",
            f"{switch}=true",
        ]
    config = write_config(run_dir / "run.toml", sets)
    broker = MosquittoBroker(
        password_file=folder / "passwd", acl_file=folder / "acl",
        tls=(ca, certs / "broker.crt", certs / "broker.key"),
    )  # fmt: skip
    broker.start()

    def auth(who: str) -> BrokerAuth:
        return BrokerAuth.resolve(
            who, username=who, password_file=folder / f"{who}.password", ca=ca
        )

    dep = Deployment(run_dir, config, broker.url, run_id, 8)

    def running() -> bool:
        return dep.procs["orchestrator"].poll() is None

    anon: dict[str, Any] = {}
    as_peer: dict[str, Any] = {}
    seen: dict[str, int] = {"forged_received": 0}
    try:
        if not wait_for(lambda: dep.steps() >= 1 or not running(), 150, 0.1):
            d["error"] = "training never started within 150 s"
        if dep.steps() < 1:
            d.setdefault("error", "training never started")
            d["orchestrator_tail"] = tail(run_dir / "logs" / "orchestrator.out", 800)
            problems = [
                f"{str(r.get('topic', '')).rsplit('/', 1)[-1]}: {r.get('problem')}"
                for r in jsonl(run_dir / "peers" / "peer-0" / "log.jsonl")
                if r.get("event") == "control.rejected"
            ]
            d["peer0_rejected"] = sorted(set(problems))[:3]
            return False
        step = _current_step(run_dir / "peers" / "peer-0" / "metrics.jsonl")

        async def attack() -> None:
            await asyncio.gather(
                _monitor(broker.url, run_id, auth("monitor"), running, seen),
                _forge(broker.url, run_id, "rogue", BrokerAuth(ca=ca), running, step,
                       FORGED_MAX_ROUNDS, anon),
                _forge(broker.url, run_id, "rogue-peer-8", auth("peer-8"), running, step,
                       FORGED_MAX_ROUNDS, as_peer, own=signed, own_peer=8),
            )  # fmt: skip

        asyncio.run(attack())
        codes = dep.wait()
    finally:
        dep.stop()
        broker.stop()
    d.update(anonymous=anon, with_peer_credentials=as_peer, **seen)
    peers = [run_dir / "peers" / f"peer-{i}" for i in range(8)]
    exceeded = over_max_rounds(peers, FORGED_MAX_ROUNDS)
    diverged = decisions_diverged(run_dir, peers)
    ok = dep.check(d, codes, set())
    # signed: peer 8's own topics carried unsigned statuses and statistics, which the broker lets
    # through; one that passed the signature check would be refused next as an unknown peer
    dropped_by_forgery = sum(
        1 for r in jsonl(run_dir / "log.jsonl")
        if r.get("event") == "control.rejected" and r.get("peer") == 8
        and r.get("problem") == "unknown peer id"
    ) if signed else 0  # fmt: skip
    accepted = (
        int(bool(anon.get("connected"))) + seen["forged_received"] + exceeded + diverged
        + dropped_by_forgery
    )  # fmt: skip
    refused: dict[str, int] = {}
    for r in jsonl(run_dir / "log.jsonl"):
        if r.get("event") in ("control.rejected", "broker.topic_refused", "broker.auth_refused"):
            key = f"{r['event']}: {str(r.get('problem') or r.get('topic') or '')[:60]}"
            refused[key] = refused.get(key, 0) + 1
    d["orchestrator_refusals"] = dict(sorted(refused.items(), key=lambda kv: -kv[1])[:5])
    d.update(max_rounds_exceeded=exceeded, decisions_diverged=diverged, accepted=accepted,
             unsigned_passed_signatures=dropped_by_forgery)  # fmt: skip
    ctx.metrics["forged_accepted"] = (ctx.metrics.get("forged_accepted") or 0) + accepted
    return ok and accepted == 0 and bool(as_peer.get("published"))


async def _monitor(
    url: str, run: str, auth: Any, running: Callable[[], bool], seen: dict[str, int]
) -> None:
    """Count forged messages (reason `MARK`) that reach a subscriber of the run's topics: on the
    orchestrator's topics in ``forged_received`` (the ACL should stop them), per kind as well."""
    import aiomqtt
    import msgpack

    from concord.protos.control_plane import Topics
    from concord.protos.mqtt import client

    with contextlib.suppress(aiomqtt.MqttError, OSError):
        async with client(url, "chaos-monitor", auth=auth, timeout=5) as c:
            await c.subscribe(Topics(run).all(), qos=1)
            while running():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        async for m in c.messages:
                            with contextlib.suppress(Exception):
                                body = msgpack.unpackb(bytes(m.payload))
                                if isinstance(body, dict) and body.get("reason") == MARK:
                                    kind = str(m.topic).split("/")[3]
                                    key = f"forged_received_{kind}"
                                    seen[key] = seen.get(key, 0) + 1
                                    if kind not in OWN_KINDS:
                                        seen["forged_received"] += 1


def case_forged_secure(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _forged_secure(ctx, d, "forged_secure", signed=False)


def case_forged_signed(ctx: Ctx, d: dict[str, Any]) -> bool:
    return _forged_secure(ctx, d, "forged_signed", signed=True)


# -- the data plane ------------------------------------------------------------------------------


def case_impersonation(ctx: Ctx, d: dict[str, Any]) -> bool:
    """tests/integration/test_mtls.py's set-up: peer 0 under mTLS; a client with peer 0's own
    valid certificate claims to be peer 1 (Hello, then a tensor stream)."""
    import grpc
    import torch

    from concord.core.config import load_config
    from concord.core.models import FlatParams, build_model
    from concord.peer import serde
    from concord.protos import data_plane_pb2 as pb
    from tests.integration.peers import Peers
    from tests.integration.test_mtls import _hello, _tls_config

    run_dir = ctx.dir("impersonation")
    run_dir.mkdir(parents=True)
    config = _tls_config(run_dir, epochs=500, startup=1.0)
    cfg = load_config(config, environ={})
    flat = FlatParams(build_model("mlp", 1, input_shape=(40,), num_classes=10, hidden=[8]))
    address = cfg.network.addresses[0]  # type: ignore[index]
    certs = run_dir / "certs"
    accepted = 0
    peers = Peers(config, run_dir, [0])
    try:
        metrics = run_dir / "peer-0" / "metrics.jsonl"
        wait_for(lambda: metrics.is_file() and metrics.stat().st_size > 0, 120, 0.1)
        stolen = grpc.ssl_channel_credentials(
            (certs / "ca.crt").read_bytes(),
            (certs / "peer-0.key").read_bytes(),
            (certs / "peer-0.crt").read_bytes(),
        )
        with grpc.secure_channel(address, stolen) as channel:
            hello = _hello(channel, flat.fingerprint())
            d["hello"] = hello if isinstance(hello, bool) else str(hello.code())
            accepted += hello is True
            frames = serde.frames(
                run_id="itest", sender=1, step=0, round=0, tensor_id=0, codec="none",
                dim=flat.d, parts={"values": torch.zeros(flat.d)}, chunk_bytes=1 << 20,
            )  # fmt: skip
            raw = channel.stream_stream(
                "/concord.v1.Gossip/ExchangeRaw", response_deserializer=pb.Ack.FromString
            )
            try:
                acks = list(raw(iter([serde.raw_message(f.header, f.body) for f in frames]),
                                timeout=10))  # fmt: skip
                d["stream"] = f"not refused: {len(acks)} acks"
                accepted += 1
            except grpc.RpcError as e:
                d["stream"] = str(e.code())
        peers.procs[0].send_signal(signal.SIGTERM)
        d["exit_code"] = peers.wait(timeout=60)[0]
    finally:
        peers.kill_all()
    summary = read_json(run_dir / "peer-0" / "summary.json") or {}
    d["frames_rejected"] = summary.get("frames_rejected")
    d["accepted"] = accepted
    ctx.metrics["impersonation_accepted"] = accepted
    return accepted == 0 and d["exit_code"] == 0


def case_stalled_streams(ctx: Ctx, d: dict[str, Any]) -> bool:
    """tests/peer/test_bounds.py's measurement: 40 stalled streams at a receiving process."""
    from tests.peer import test_bounds as tb

    growth, counts = tb._stall("default")
    bound = 2 * tb.RSS_DIM * 4 + 50 * MIB  # two tensors per neighbour (one here) + 50 MiB
    d.update(streams=tb.STREAMS, tensor_mib=tb.RSS_DIM * 4 / MIB, rejections=counts.strip())
    ctx.metrics["rss_growth_mib_stalled"] = round(growth / MIB, 1)
    ctx.metrics["rss_bound_mib"] = round(bound / MIB, 1)
    return growth <= bound


def case_mailbox_flood(ctx: Ctx, d: dict[str, Any]) -> bool:
    """One neighbour sends 12 tensors for rounds nobody collects (test_bounds' helpers)."""
    import grpc

    from concord.protos import data_plane_pb2 as pb
    from tests.peer import test_bounds as tb

    async def body() -> bool:
        addresses = [f"127.0.0.1:{tb._free_port()}", f"127.0.0.1:{tb._free_port()}"]
        t1 = tb._transport(1, addresses)
        await t1.start(addresses[1])
        ch = grpc.aio.insecure_channel(addresses[1], options=tb.OWN_CONNECTION)
        try:
            if not (await tb._hello(ch, 0)).accepted:
                d["error"] = "hello refused"
                return False
            results = [await tb._send(ch, tb._messages(0, round=r)) for r in range(1, 13)]
            refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
            d["accepted"] = len(results) - len(refused)
            d["refused"] = len(refused)
            d["refusal_codes"] = sorted({str(e.code()) for e in refused})
            d["refusal_details"] = sorted({f"{e.code()}: {e.details()}"[:160] for e in refused})
            d["held_bytes"] = t1.mailbox.held(0)
            d["rejected"] = dict(t1.counters.rejected)
            arrived, _ = await t1.round_(
                step=0, round=1, tensor_id=0, frames=None, send_to=[], receive_from=[0]
            )
            fits = await tb._send(ch, tb._messages(0, step=1, round=1))
            d["serves_after"] = isinstance(fits, list) and fits[0].status == pb.ACK_OK
            tensor = tb.DIM * 4
            # every refusal is the server's "overload" (its counter), whatever grpcio's client
            # reports when it loses the status to its own write race (`tb._refused_with`)
            exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
            return (
                d["accepted"] <= 2
                and d["held_bytes"] <= 2 * tensor
                and all(tb._refused_with(e, exhausted) for e in refused)
                and d["rejected"] == {"overload": len(refused)}
                and 0 in arrived
                and bool(d["serves_after"])
            )
        finally:
            await ch.close()
            await t1.stop(1.0)

    return asyncio.run(asyncio.wait_for(body(), 120))


# -- resume --------------------------------------------------------------------------------------


def _params(path: Path) -> Any:
    import torch

    state = torch.load(path, weights_only=True, map_location="cpu")
    return state["params"], state


def _max_diff(a: Any, b: Any) -> float:
    import torch

    if isinstance(a, dict):
        return max((_max_diff(a[k], b[k]) for k in a), default=0.0)
    return float(torch.max(torch.abs(a.double() - b.double())).item()) if a.numel() else 0.0


def case_resume_vectorized(ctx: Ctx, d: dict[str, Any]) -> bool:
    # a checkpoint after every epoch; SIGKILL right after the first one
    sets = [*base_sets(ctx), f"epochs={max(3, 2 * ctx.epochs)}", "eval.every=1"]
    whole = ctx.dir("resume_whole")
    p = subprocess.run(sim_argv(whole, sets, engine="vectorized"), cwd=ROOT, capture_output=True,
                       text=True, timeout=RUN_TIMEOUT, check=False)  # fmt: skip
    if p.returncode:
        d["error"] = f"uninterrupted run failed: {p.stdout[-500:]}{p.stderr[-500:]}"
        return False
    cut = ctx.dir("resume_cut")
    log = ctx.out / "resume_cut.out"
    proc = spawn(sim_argv(cut, sets, engine="vectorized"), log)
    try:
        wait_for(lambda: (cut / "checkpoint.pt").is_file() or proc.poll() is not None, 120, 0.01)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    if (cut / "summary.json").is_file() or not (cut / "checkpoint.pt").is_file():
        d["error"] = "the run was not interrupted mid-way (finished, or no checkpoint)"
        return False
    _, state = _params(cut / "checkpoint.pt")
    d["interrupted_at_step"] = int(state["run"]["next_step"])
    d["total_steps"] = int(state["run"]["total_steps"])
    p = subprocess.run(concord("sim", "--resume", str(cut), "--quiet", "--reference", "none"),
                       cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                       check=False)  # fmt: skip
    d["resume_exit_code"] = p.returncode
    if p.returncode:
        d["error"] = f"--resume failed: {p.stdout[-500:]}{p.stderr[-500:]}"
        return False
    a, _ = _params(whole / "checkpoint.pt")
    b, _ = _params(cut / "checkpoint.pt")
    diff = _max_diff(a, b)
    ctx.metrics["resume_max_abs_diff"] = diff
    d["max_abs_diff"] = diff
    return diff <= 1e-6 and d["interrupted_at_step"] < d["total_steps"]


def _resumable(run_dir: Path, sets: list[str]) -> int | None:
    """The step ``concord sim --resume`` would continue after (None: none yet)."""
    from concord.core.config import load_config
    from concord.errors import ProcessesError
    from concord.sim.processes import resume_step

    try:
        return resume_step(load_config(None, sets, environ={}), run_dir)
    except (ProcessesError, OSError, ValueError):
        return None


def case_resume_processes(ctx: Ctx, d: dict[str, Any]) -> bool:
    """SIGKILL every process of a run (orchestrator, peers, launcher: a machine that went down)
    once all hold a common checkpoint step, ``concord sim --resume`` it, and compare the final
    parameters with the fault-free baseline's, peer by peer."""
    if ctx.baseline is None:
        case_baseline(ctx, d.setdefault("baseline", {}))
    _ensure_baseline(ctx)
    sets = base_sets(ctx)
    run = SimRun(ctx, "resume_processes", sets)
    try:
        wait_for(lambda: _resumable(run.dir, sets) is not None or run.proc.poll() is not None,
                 RUN_TIMEOUT, 0.1)  # fmt: skip
        d["interrupted_at_step"] = steps(run.dir / "peers" / "peer-0" / "metrics.jsonl")
        for pid in launched_by(run.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.proc.pid, signal.SIGKILL)
    finally:
        run.stop()
    if (run.dir / "summary.json").is_file():
        d["error"] = "the run finished before it could be interrupted"
        return False
    d["resumed_after_step"] = _resumable(run.dir, sets)
    t0 = time.time()
    p = subprocess.run(concord("sim", "--resume", str(run.dir), "--quiet", "--reference", "none"),
                       cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                       check=False)  # fmt: skip
    d["resume_exit_code"] = p.returncode
    d["resume_s"] = round(time.time() - t0, 1)
    if p.returncode:
        d["error"] = f"--resume failed: {(p.stdout + p.stderr)[-600:]}"
        return False
    base = ROOT / (ctx.baseline or {}).get("run_dir", "")
    diff = max(
        _max_diff(_params(base / "peers" / f"peer-{i}" / "checkpoint.pt")[0],
                  _params(run.dir / "peers" / f"peer-{i}" / "checkpoint.pt")[0])
        for i in range(8)
    )  # fmt: skip
    ctx.metrics["resume_max_abs_diff_processes"] = diff
    d["max_abs_diff"] = diff
    return diff <= 1e-5


# -- fuzz ----------------------------------------------------------------------------------------


def case_fuzz(ctx: Ctx, d: dict[str, Any]) -> bool:
    import random

    from bench.fuzz import run_target
    from tests.fuzz.targets import TARGETS

    seed = random.randrange(2**32)
    by_target, crashes = {}, 0
    for name in TARGETS:
        r = run_target(name, ctx.fuzz_examples, 10.0, seed)
        by_target[name] = r.cases
        crashes += r.crash_count
        for c in r.crashes.values():
            d.setdefault("crashes", []).append(
                f"{name}: {c.kind} at {c.where} ({c.count}x): {c.message[:200]}; "
                f"smallest input {c.example[:300]}"
            )
        print(f"  fuzz {name}: {r.cases} cases, {r.crash_count} crashes, {r.seconds:.1f} s",
              flush=True)  # fmt: skip
    d.update(seed=seed, cases_by_target=by_target)
    ctx.metrics.update(
        fuzz_cases=sum(by_target.values()), fuzz_cases_by_target=by_target, fuzz_crashes=crashes
    )
    return crashes == 0 and min(by_target.values()) >= ctx.fuzz_examples


# -- the matrix ----------------------------------------------------------------------------------

CASES: dict[str, Callable[[Ctx, dict[str, Any]], bool]] = {
    "baseline": case_baseline,
    "kill25": case_kill25,
    "restart": case_restart,
    "stall": case_stall,
    "cut": case_cut,
    "cap": case_cap,
    "broker_barrier": case_broker_barrier,
    "broker_lagged": case_broker_lagged,
    "orch_kill_start": case_orch_kill_start,
    "orch_kill_mid": case_orch_kill_mid,
    "orch_kill_between": case_orch_kill_between,
    "forged_unauth": case_forged_unauth,
    "forged_peer": case_forged_peer,
    "forged_secure": case_forged_secure,
    "forged_signed": case_forged_signed,
    "impersonation": case_impersonation,
    "stalled_streams": case_stalled_streams,
    "mailbox_flood": case_mailbox_flood,
    "resume_vectorized": case_resume_vectorized,
    "resume_processes": case_resume_processes,
    "fuzz": case_fuzz,
}
# issue 26's attacks (bench/chaos_attacks.py): client-id takeover, a cross-run replay, a Fetch flood
CASES.update(chaos_attacks.cases(sys.modules[__name__]))
NEEDS_BASELINE = {"kill25"}  # restart runs its own, longer reference


def run_case(ctx: Ctx, name: str) -> Case:
    case = Case(name)
    start = time.monotonic()
    print(f"case {name} …", flush=True)
    try:
        case.ok = bool(CASES[name](ctx, case.detail))
    except Skip as why:
        case.detail["skipped"] = str(why)
    except Exception as e:
        case.detail["error"] = f"{type(e).__name__}: {e}"
        case.detail["traceback"] = traceback.format_exc()[-1500:]
    case.seconds = round(time.monotonic() - start, 1)
    status = "SKIP" if "skipped" in case.detail else "ok" if case.ok else "FAILED"
    note = case.detail.get("skipped") or case.detail.get("error") or ""
    print(f"case {name}: {status} in {case.seconds:.1f} s {note}"[:300], flush=True)
    return case


# the cases that measure each metric: a metric still null after one of them ran is a failure
SOURCES = {
    "forged_accepted": ["forged_secure", "forged_signed"],
    "forged_crashes": ["forged_unauth", "forged_peer"],
    "forged_max_rounds_exceeded": ["forged_unauth", "forged_peer"],
    "impersonation_accepted": ["impersonation"],
    "kill25_acc_gap_pp": ["kill25"],
    "detect_s": ["kill25"],
    "rejoin_acc_gap_pp": ["restart"],
    "rejoin_s": ["restart"],
    "rss_growth_mib_stalled": ["stalled_streams"],
    "resume_max_abs_diff": ["resume_vectorized"],
    "resume_max_abs_diff_processes": ["resume_processes"],
    "fuzz_crashes": ["fuzz"],
    "takeover_accepted": ["takeover"],
    "stale_run_accepted": ["stale_run"],
    "fetch_non_neighbour_accepted": ["fetch_flood"],
}


def targets(m: dict[str, Any], quick: bool) -> list[tuple[str, bool | None, str]]:
    """(target, met — None when no case measuring it ran, the measured value)."""
    ran = {c["name"] for c in m["cases"]}

    def judge(key: str, v: Any, test: Callable[[Any], bool]) -> bool | None:
        if v is not None:
            return test(v)
        return False if ran & set(SOURCES.get(key, [])) else None

    def le(key: str, bound: float) -> tuple[str, bool | None, str]:
        v = m.get(key)
        return f"{key} ≤ {bound:g}", judge(key, v, lambda x: x <= bound), str(v)

    def eq(key: str, value: int) -> tuple[str, bool | None, str]:
        v = m.get(key)
        return f"{key} = {value}", judge(key, v, lambda x: x == value), str(v)

    per = m.get("fuzz_cases_by_target") or {}
    need = 2000 if quick else 10_000
    bound = m.get("rss_bound_mib")
    rss = m.get("rss_growth_mib_stalled")
    return [
        ("cases_ok = cases_total", m["cases_ok"] == m["cases_total"],
         f"{m['cases_ok']}/{m['cases_total']}"),
        eq("orphans", 0),
        eq("corrupt_outputs", 0),
        eq("forged_accepted", 0),
        eq("forged_crashes", 0),
        eq("forged_max_rounds_exceeded", 0),
        eq("impersonation_accepted", 0),
        le("kill25_acc_gap_pp", 1.0),
        le("rejoin_acc_gap_pp", 1.0),
        le("detect_s", 3.0),
        le("rejoin_s", 2 * 2.0),  # two step deadlines (network.deadline = 2 s)
        ("rss_growth_mib_stalled ≤ rss_bound_mib",
         judge("rss_growth_mib_stalled", rss, lambda x: bound is not None and x <= bound),
         f"{rss} / {bound}"),
        le("resume_max_abs_diff", 1e-6),
        le("resume_max_abs_diff_processes", 1e-5),
        (f"fuzz_cases ≥ {need} per target",
         judge("fuzz_crashes", min(per.values()) if per else None, lambda x: x >= need),
         str(per or None)),
        eq("fuzz_crashes", 0),
        eq("takeover_accepted", 0),
        eq("stale_run_accepted", 0),
        eq("fetch_non_neighbour_accepted", 0),
    ]  # fmt: skip


def _term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, 2,000 fuzz cases")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=None, help="keep the run directories here")
    parser.add_argument("--fuzz-examples", type=int, default=None, help="fuzz cases per target")
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs of the runs (default 4 quick, 10 full)"
    )
    parser.add_argument(
        "--restart-seeds",
        type=int,
        default=None,
        help="seeds of the restart case, each with its reference (default 3 quick, 5 full)",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    if any(n in NEEDS_BASELINE for n in names) and "baseline" not in names:
        names.insert(0, "baseline")
    names.sort(key=list(CASES).index)
    token = set_tag()
    signal.signal(signal.SIGTERM, _term)  # SIGTERM ends the case at hand, then reports
    started = time.monotonic()
    tmp = None if args.out else tempfile.TemporaryDirectory(prefix="concord-chaos-")
    out = (args.out or Path(tmp.name if tmp else ".")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    examples = args.fuzz_examples or (2000 if args.quick else 10_000)
    ctx = Ctx(out, args.quick, examples, epochs_set=args.epochs, seeds_set=args.restart_seeds)
    print(f"chaos: {len(names)} cases in {out} ({'quick' if args.quick else 'full'}), "
          f"tag {token}", flush=True)  # fmt: skip
    cases: list[Case] = []
    interrupted = None
    try:
        for name in names:
            cases.append(run_case(ctx, name))  # noqa: PERF401 - kept on an interruption
    except (KeyboardInterrupt, SystemExit) as e:  # SIGINT / SIGTERM: report what ran
        interrupted = type(e).__name__
    finally:
        time.sleep(2.0)  # what is ending anyway gets to end
        left = tagged(token)
        reap(left, grace=3.0)
        _netns.cleanup()
    corrupt = []
    for d in ctx.run_dirs:
        if d.exists():
            state, why = output_state(d)
            if state == "corrupt":
                corrupt.append({"dir": d.name, "why": why})
    m: dict[str, Any] = dict.fromkeys(KEYS)
    m.update(ctx.metrics)
    m.update(
        cases_total=len(cases),
        cases_ok=sum(c.ok for c in cases),
        cases_skipped=[c.name for c in cases if "skipped" in c.detail],
        orphans=len(left) + len(ctx.left_behind),
        orphan_commands=sorted({**left, **ctx.left_behind}.values())[:10],
        corrupt_outputs=len(corrupt),
        corrupt_dirs=corrupt,
        wall_s=round(time.monotonic() - started, 1),
        interrupted=interrupted,
        cases_not_run=[n for n in names if n not in {c.name for c in cases}],
        quick=args.quick,
        out=str(out) if args.out else None,
        cases=[{"name": c.name, "ok": c.ok, "seconds": c.seconds, "detail": c.detail}
               for c in cases],
    )  # fmt: skip
    print()
    for c in cases:
        status = "SKIP" if "skipped" in c.detail else "ok  " if c.ok else "FAIL"
        print(f"{status} {c.name:<18} {c.seconds:7.1f} s  {c.detail.get('skipped', '')}")
    print()
    if m.get("resume_max_abs_diff_processes_reason"):
        print(f"resume_max_abs_diff_processes null: {m['resume_max_abs_diff_processes_reason']}")
    for label, met, value in targets(m, args.quick):
        verdict = "n/a " if met is None else "PASS" if met else "FAIL"
        print(f"{verdict} {label}: {value}")
    print(f"wall time {m['wall_s']:.1f} s")
    print(json.dumps(m, default=str))
    if tmp is not None:
        tmp.cleanup()
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
