"""``bench/chaos.py``'s fault cases (its docstring says what each checks): the fault-free
baseline, killed, restarted and stalled peers, a restarted broker, a killed orchestrator, and a
cut or capped link in network namespaces."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import concord.lab.net as netns
from bench._procs import (
    jsonl,
    launched_by,
    reap,
    steps,
    tail,
    timestamp,
    wait_exit,
    wait_for,
)
from bench.chaos_runs import (
    CUT,
    RESTARTED,
    RUN_TIMEOUT,
    STALLED,
    VICTIMS,
    Ctx,
    Deployment,
    SimRun,
    Skip,
    base_sets,
    drop_times,
    finished,
    flat,
    gap_pp,
    output_state,
    step_rows,
    total_steps,
    write_config,
)

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


def ensure_baseline(ctx: Ctx) -> None:
    if ctx.baseline is None:
        raise RuntimeError("the fault-free baseline failed or did not run: no reference")


def case_kill25(ctx: Ctx, d: dict[str, Any]) -> bool:
    run = SimRun(ctx, "kill25", base_sets(ctx))
    try:
        if not run.until_quarter(d):
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
                    if any(v in flat(r.get("missing")) for r in rows):
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
    done = reference.summary()
    reference_acc = None if done is None else done.accuracy_avg_model
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
        if not run.until_quarter(d):
            return False
        pid = run.child(f"peer-{STALLED}")
        if pid is None:
            d["error"] = f"peer {STALLED} not found"
            return False
        netns.stall(pid)
        time.sleep(20.0)
        netns.resume(pid)
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
    d["stalled_peer_steps_alone"] = sum(1 for r in rows if len(flat(r.get("missing"))) >= 2)
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
        if not run.until_quarter(d, total=epochs * 11):
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


def _netns_run(ctx: Ctx, d: dict[str, Any], name: str, fault: str) -> bool:
    ok_net, why = netns.available()
    if not ok_net:
        raise Skip(f"network namespaces unavailable: {why}")
    from concord.orchestrator.broker import mosquitto_binary

    if mosquitto_binary() is None:
        raise Skip("mosquitto is not installed")
    run_dir = ctx.dir(name)
    run_id = f"chaos-{name}-{os.getpid()}"
    config = write_config(run_dir / "run.toml", base_sets(ctx))
    hosts = ["broker", "orch", *(f"p{i}" for i in range(8))]
    with netns.Net(hosts) as net:
        b = net["broker"]
        try:
            mosq = netns.mosquitto(b, run_dir / "logs")
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
