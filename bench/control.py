"""The control plane's cost, with Mosquitto and with the orchestrator's embedded amqtt broker, all
measured in one run on this machine.

1. **Barrier decision round trip.** The real orchestrator (``python -m concord.lab.cli
   orchestrator``, a separate process; with ``--broker`` pointing at a private Mosquitto, or
   without it so that it embeds amqtt in its own event loop) runs a one-phase plan under adaptive
   control with a tiny factor (1e-9): every round is above target, so the orchestrator answers
   "repeat" after every round up to ``max_rounds`` — every round needs a decision. ``--peers``
   synthetic peers in this process play the peer side with the real peer's control client
   (`concord.peer.control.ControlClient`: retained status "ready" with address, steps per epoch
   and fingerprint, heartbeats, the schedule and the "train" start, decisions); per round every
   synthetic peer publishes its `Stats` at the same instant and waits for the `Decision` of that
   (step, round), following repeat/stop; at the end status "done" and the orchestrator exits.
   RTT sample = from the *last* stats publish of the round to the decision's arrival at a peer
   (its message handler); median and p90 over peers and rounds, the first step discarded (warm-up).
   "To the first peer" is the same from the round's first arrival (the synthetic peers share
   this process's event loop, so decisions reach them one after another).
   Baseline through the same broker (taken while the orchestrator waits for its peers): plain
   MQTT ping-pong between two NODELAY clients in two processes, one broker pass each way at the
   QoS the contract gives stats and decisions (0) — the same two hops as stats → orchestrator →
   decision.
2. **Lagged-control overhead.** ``concord.sim.processes.run_processes``: orchestrator + 4 peer
   processes, ring, D-SGD, ~1.09M-parameter MLP on mnist1d, 1 torch thread each, evaluation only
   at the end.
   The run's plan has ``--blocks`` phases (LR milestones at i/blocks): phase 1 warms up (not timed),
   then controlled (adaptive, ``lagged = true``, factor 1e6) and uncontrolled blocks alternate
   *within one run*, starting with a controlled block in odd repeats and with an uncontrolled one in
   even repeats (so neither side always comes first). The factor keeps exactly one round per step,
   so communication is identical; in a controlled step the peers' per-step metrics message
   carries their statistics (`concord.protos.control_plane.Metrics`) and they take
   the rounds from the decision that closed step t − lag, in an uncontrolled step the control hook
   is not called at all (`concord.core.loop`), which is what ``control.mode = "none"`` runs.
   Comparing blocks of one run removes the between-run variance of this shared 2-CPU machine
   (separate runs of the same config differ by up to ±8 % in step time, more than the 3 % to
   resolve). Step time = the peers' own ``step_ms`` (wall time of the step, control waits included;
   the arrival times of the metrics over MQTT are no clock: publishing is deferred to the peer's
   event loop); the first ``SKIP`` steps of every block are left out;
   overhead fraction = mean over controlled steps / mean over uncontrolled steps − 1, per run,
   median over ``--repeats`` runs. One run per ``control.lag`` in ``--lags`` and repeat (default
   lags 1 and 2; the headline ``lagged_overhead_fraction`` is the largest lag's): with lag 1 a
   step needs every peer's previous step, a global barrier a peer meets after its step's first
   round, with lag 2 the decision a peer needs is published long before it asks
   (`concord.core.control.controller`).
   Also: the mean ``control_wait_ms`` per controlled step (time peers blocked on the
   orchestrator), and with ``--observe`` (a passive MQTT client on a
   thread of this process; it receives every statistic and decision and so takes CPU from the peers:
   off by default) how far apart the peers finish a step, how long the orchestrator takes from the
   last peer's stats of a step to its decision while the peers compute, and the split of each wait
   into "for the slowest peer's stats" and "for the decision after them" (a wait ends with the
   decision's arrival, so it began at decision − wait).

Targets (printed, never asserted): barrier RTT ≤ 5 ms median with Mosquitto; lagged overhead
≤ 0.03. Last line: a JSON object with ``barrier_rtt_ms_mosquitto`` and ``lagged_overhead_fraction``
(the Mosquitto one), the same for the embedded broker and the baselines.

    python bench/control.py [--peers 8] [--steps 50] [--max-rounds 20] [--lagged-peers 4]
                            [--lagged-steps 280] [--blocks 7] [--repeats 5] [--lags 1,2]
                            [--quick] [--keep DIR] [--run-timeout 600]

The numbers are only comparable within one run: on a shared 2-vCPU machine they move by ±20 %.
The table's header prints the 1-minute load average before and after (this bench alone takes it
to about 6 on 2 CPUs); a high "before" means other work shared the CPUs and the run says little.
An overhead run that does not finish within ``--run-timeout`` is stopped (children terminated).
One overhead run differs from the next by about ±0.02 even when both block kinds are uncontrolled
(an A/A check), hence the median over 5 repeats by default; the whole bench takes ~15 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.control_barrier import (  # noqa: E402
    PING_QOS,
    PONG_QOS,
    BarrierResult,
    barrier_rtt,
    ms,
)
from bench.control_lagged import (  # noqa: E402
    HIDDEN,
    SAMPLES,
    SKIP,
    StepRun,
    lagged_config,
    lagged_run,
)
from concord.orchestrator.broker import MosquittoBroker  # noqa: E402

# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--peers", type=int, default=8, help="synthetic peers (barrier RTT)")
    parser.add_argument("--steps", type=int, default=50, help="steps of the barrier run")
    parser.add_argument("--max-rounds", type=int, default=20, help="rounds per barrier step")
    parser.add_argument("--pings", type=int, default=300, help="timed MQTT ping-pongs")
    parser.add_argument("--lagged-peers", type=int, default=4, help="peer processes (overhead)")
    parser.add_argument("--lagged-steps", type=int, default=280, help="steps per overhead run")
    parser.add_argument(
        "--blocks", type=int, default=7, help="phases per run: a warm-up, then alternating blocks"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="runs of each overhead config (A/A noise ±0.02 each)"
    )
    parser.add_argument(
        "--lags",
        default="1,2",
        help="control.lag values measured (comma-separated); the headline is the largest",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument(
        "--observe",
        action="store_true",
        help="watch the overhead runs over MQTT for the wait diagnostics (costs the peers CPU)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep run directories under DIR")
    parser.add_argument(
        "--run-timeout", type=float, default=600.0, help="seconds one overhead run may take"
    )
    args = parser.parse_args(argv)
    hidden, samples = HIDDEN, SAMPLES
    if args.quick:
        args.peers, args.steps, args.max_rounds, args.pings = 3, 4, 3, 30
        args.lagged_peers, args.lagged_steps, args.repeats, args.blocks = 2, 48, 1, 3
        hidden, samples = [64], 2000
    if min(args.peers, args.max_rounds, args.pings, args.repeats) < 1 or args.steps < 2:
        parser.error("--peers, --max-rounds, --pings, --repeats must be ≥ 1 and --steps ≥ 2")
    if args.lagged_peers < 2 or args.lagged_steps < 2:
        parser.error("--lagged-peers and --lagged-steps must be ≥ 2")
    if args.blocks < 3 or args.lagged_steps < args.blocks * (SKIP + 5):
        parser.error(
            f"--blocks must be ≥ 3 and each block needs ≥ {SKIP + 5} steps "
            f"(--lagged-steps ≥ {SKIP + 5} × --blocks)"
        )
    try:
        args.lag_list = sorted({int(x) for x in args.lags.split(",") if x.strip()})
    except ValueError:
        parser.error(f"--lags must be comma-separated integers; got {args.lags!r}")
    if not args.lag_list or args.lag_list[0] < 1:
        parser.error(f"--lags must name at least one lag ≥ 1; got {args.lags!r}")
    barrier: dict[str, BarrierResult] = {}
    steps: dict[str, dict[str, list[StepRun]]] = {}
    args.load_before = os.getloadavg()[0]  # other work on the host shows here
    with contextlib.ExitStack() as stack:
        if args.keep is not None:  # a fresh directory per invocation: never stale files
            work = args.keep / time.strftime("control-%Y%m%d-%H%M%S")
            work.mkdir(parents=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-control-")))
        mosquitto = MosquittoBroker()
        mosquitto.start()
        stack.callback(mosquitto.stop)
        for name, url in (("mosquitto", mosquitto.url), ("embedded", None)):
            out = work / f"barrier-{name}"
            res = barrier[name] = barrier_rtt(
                url, out, args.peers, args.max_rounds, args.steps, args.pings
            )
            print(
                f"{name:>9}: barrier RTT median {ms(res.rtt):.2f} ms, p90 "
                f"{ms(res.rtt, 0.9):.2f} ms, {len(res.rtt)} samples ({res.rounds_total} "
                f"rounds, {res.steps} steps); MQTT ping-pong {ms(res.pingpong):.2f} ms; "
                f"orchestrator exit {res.orchestrator_exit}",
                flush=True,
            )
            steps[name] = {_label(lag): [] for lag in args.lag_list}
            for rep in range(args.repeats):
                for lag in args.lag_list:
                    label = _label(lag)
                    cfg = lagged_config(
                        args.lagged_peers,
                        args.lagged_steps,
                        args.blocks,
                        lag,
                        2 + rep % 2,
                        hidden,
                        samples,
                    )
                    run = lagged_run(
                        cfg,
                        work / f"steps-{name}-{label}-{rep}",
                        url,
                        args.run_timeout,
                        args.observe,
                    )
                    steps[name][label].append(run)
                    _say_run(name, label, rep, run)
    _report(args, barrier, steps)


def _label(lag: int) -> str:
    return f"lag{lag}"


def _say_run(name: str, label: str, rep: int, run: StepRun) -> None:
    head = f"{name:>9}: {label} run {rep + 1}:"
    print(
        f"{head} {run.step_s * 1e3:.2f} ms/step controlled, {run.step_s_uncontrolled * 1e3:.2f} "
        f"uncontrolled (overhead {run.overhead:+.4f}; {run.steps_timed[0]}/"
        f"{run.steps_timed[1]} peer-steps timed), {run.rounds_per_step:.2f} rounds/step, "
        f"{run.fallbacks} fallbacks; control wait mean {run.wait_ms:.2f} / median "
        f"{run.wait_median_ms:.2f} / p90 {run.wait_p90_ms:.2f} ms per controlled step",
        flush=True,
    )
    print(
        f"{head} block means "
        + " ".join(f"{'C' if c else 'U'}{t * 1e3:.1f}" for _, c, t in run.blocks)
        + " ms/step (C controlled, U uncontrolled)",
        flush=True,
    )
    if run.spread:
        print(
            f"{head} peers finish a step {ms(run.spread):.2f} ms apart controlled, "
            f"{ms(run.spread_uncontrolled):.2f} uncontrolled (medians)",
            flush=True,
        )
    if run.wait_peers:
        print(
            f"{head} last stats → decision {ms(run.decide):.2f} ms (median); of the wait, "
            f"{statistics.fmean(run.wait_peers) * 1e3:.2f} ms for the slowest peer's stats, "
            f"{statistics.fmean(run.wait_orchestrator) * 1e3:.2f} ms for the decision after "
            "them (means per peer and step)",
            flush=True,
        )


def _report(
    args: argparse.Namespace,
    barrier: dict[str, BarrierResult],
    steps: dict[str, dict[str, list[StepRun]]],
) -> None:
    names = list(barrier)
    b = barrier
    lagged = [_label(lag) for lag in args.lag_list]
    head = lagged[-1]  # the headline: the largest lag measured

    def med(n: str, k: str, what: str) -> float:
        return statistics.median(getattr(r, what) for r in steps[n][k])

    def pooled(n: str, k: str, what: str) -> list[float]:
        return [x for r in steps[n][k] for x in getattr(r, what)]

    def meanms(n: str, k: str, what: str) -> float | None:
        values = pooled(n, k, what)
        return statistics.fmean(values) * 1e3 if values else None

    def row(label: str, cells: list[str]) -> None:
        print(f"  {label:<52}" + "".join(f"{c:>12}" for c in cells))

    def ms(values: list[float], q: float = 0.5) -> str:
        return f"{ms(values, q):.2f}" if values else "-"

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print()
    print(
        f"barrier: {args.peers} synthetic peers, {args.steps} steps × {args.max_rounds} rounds; "
        f"overhead: {args.lagged_peers} peer processes, {args.lagged_steps} steps in "
        f"{args.blocks} alternating blocks, {args.repeats} run(s) per lag, 1 torch thread; "
        f"{os.cpu_count()} CPUs, load average {args.load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after"
    )
    row("", names)
    row("barrier decision RTT, median ms (target ≤ 5)", [ms(b[n].rtt) for n in names])
    row("barrier decision RTT, p90 ms", [ms(b[n].rtt, 0.9) for n in names])
    row("  to the first synthetic peer, median ms", [ms(b[n].first) for n in names])
    row(
        f"MQTT ping-pong QoS {PING_QOS}/{PONG_QOS}, median ms (baseline)",
        [ms(b[n].pingpong) for n in names],
    )
    row("barrier RTT ÷ ping-pong", [f"{ms(b[n].rtt) / ms(b[n].pingpong):.2f}" for n in names])
    for k in lagged:
        target = " (target ≤ 0.03)" if k == head else ""
        row(
            f"[{k}] step, uncontrolled blocks, ms",
            [f"{med(n, k, 'step_s_uncontrolled') * 1e3:.2f}" for n in names],
        )
        row(
            f"[{k}] step, lagged-control blocks, ms",
            [f"{med(n, k, 'step_s') * 1e3:.2f}" for n in names],
        )
        row(
            f"[{k}] lagged overhead fraction{target}",
            [f"{med(n, k, 'overhead'):+.4f}" for n in names],
        )
        row(
            f"[{k}]   … per run",
            ["/".join(f"{r.overhead:+.3f}" for r in steps[n][k]) for n in names],
        )
        row(
            f"[{k}] control_wait_ms per controlled step, mean",
            [f"{med(n, k, 'wait_ms'):.2f}" for n in names],
        )
        row(
            f"[{k}]   … for the slowest peer's stats, mean ms",
            [fmt(meanms(n, k, "wait_peers")) for n in names],
        )
        row(
            f"[{k}]   … for the decision after them, mean ms",
            [fmt(meanms(n, k, "wait_orchestrator")) for n in names],
        )
        row(
            f"[{k}] peers finish a step … ms apart, controlled",
            [ms(pooled(n, k, "spread")) for n in names],
        )
        row(f"[{k}]   … uncontrolled", [ms(pooled(n, k, "spread_uncontrolled")) for n in names])
        row(f"[{k}] last stats → decision, median ms", [ms(pooled(n, k, "decide")) for n in names])
        row(f"[{k}] gossip rounds per step", [f"{med(n, k, 'rounds_per_step'):.2f}" for n in names])
        row(f"[{k}] control fallbacks", [str(sum(r.fallbacks for r in steps[n][k])) for n in names])
    result: dict[str, Any] = {"benchmark": "control", "peers_barrier": args.peers}
    for n in names:
        result[f"barrier_rtt_ms_{n}"] = round(ms(b[n].rtt), 3)
        result[f"barrier_rtt_p90_ms_{n}"] = round(ms(b[n].rtt, 0.9), 3)
    for n in names:
        result[f"mqtt_pingpong_ms_{n}"] = round(ms(b[n].pingpong), 3)
    for n in names:
        for k in lagged:
            result[f"step_ms_uncontrolled_{k}_{n}"] = round(
                med(n, k, "step_s_uncontrolled") * 1e3, 3
            )
            result[f"step_ms_{k}_{n}"] = round(med(n, k, "step_s") * 1e3, 3)
            result[f"lagged_overhead_fraction_{k}_{n}"] = round(med(n, k, "overhead"), 4)
            result[f"control_wait_ms_{k}_{n}"] = round(med(n, k, "wait_ms"), 3)
            for key, what in (("peers", "wait_peers"), ("decision", "wait_orchestrator")):
                v = meanms(n, k, what)
                result[f"control_wait_{key}_ms_{k}_{n}"] = None if v is None else round(v, 3)
            decide = pooled(n, k, "decide")
            result[f"lagged_decision_ms_{k}_{n}"] = round(ms(decide), 3) if decide else None
        result[f"lagged_overhead_fraction_{n}"] = result[f"lagged_overhead_fraction_{head}_{n}"]
    result["lagged_overhead_fraction"] = result["lagged_overhead_fraction_mosquitto"]
    result.update(
        lagged_overhead_lag=args.lag_list[-1],
        lags=args.lag_list,
        steps_barrier=args.steps,
        max_rounds=args.max_rounds,
        peers_lagged=args.lagged_peers,
        steps_lagged=args.lagged_steps,
        blocks=args.blocks,
        repeats=args.repeats,
        quick=args.quick,
        load_average_before=round(args.load_before, 2),
        load_average_after=round(os.getloadavg()[0], 2),
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
