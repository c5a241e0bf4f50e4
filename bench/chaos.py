"""Chaos: a fault matrix over real runs — every case a real run (or a real peer / transport
process) in a fresh directory, checked afterwards from what it left behind.

The runs: 8 peers, the digits dataset, an MLP, D-SGD on a ring with adaptive consensus control,
4 epochs with ``--quick`` (10 without; ``--epochs``), one torch thread per process, heartbeats
every 0.2 s, ``liveness_timeout`` and the step deadline 2 s (`base_sets`). ``concord sim
--engine processes`` runs them where one host is enough; the cases that need a network of their
own (``cut``, ``cap``) or a fixed run id (the broker ACL of ``forged_secure``) start Mosquitto,
``concord orchestrator`` and ``concord peer`` themselves (`Deployment`), in network namespaces
(``bench/netns.py``) for the former.

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
import json
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import concord.lab.net as netns
from bench import chaos_attacks
from bench._procs import reap, set_tag, tagged
from bench.chaos_faults import (
    case_baseline,
    case_broker_barrier,
    case_broker_lagged,
    case_cap,
    case_cut,
    case_kill25,
    case_orch_kill_between,
    case_orch_kill_mid,
    case_orch_kill_start,
    case_restart,
    case_stall,
)
from bench.chaos_forged import (
    case_forged_peer,
    case_forged_secure,
    case_forged_signed,
    case_forged_unauth,
)
from bench.chaos_resume import case_resume_processes, case_resume_vectorized
from bench.chaos_runs import Case, Ctx, Skip, output_state
from bench.chaos_wire import (
    case_fuzz,
    case_impersonation,
    case_mailbox_flood,
    case_stalled_streams,
)

KEYS = [
    "cases_total", "cases_ok", "orphans", "corrupt_outputs", "forged_accepted", "forged_crashes",
    "forged_max_rounds_exceeded", "impersonation_accepted", "kill25_acc_gap_pp",
    "rejoin_acc_gap_pp", "detect_s", "rejoin_s", "rss_growth_mib_stalled", "rss_bound_mib",
    "resume_max_abs_diff", "resume_max_abs_diff_processes", "fuzz_cases", "fuzz_crashes",
    "takeover_accepted", "stale_run_accepted", "fetch_non_neighbour_accepted",
]  # fmt: skip


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
CASES.update(chaos_attacks.CASES)
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
        netns.cleanup()
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
