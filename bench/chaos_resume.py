"""``bench/chaos.py``'s resume cases (its docstring says what each checks): either engine
SIGKILLed and continued with ``concord sim --resume``, compared with an uninterrupted run."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from bench._procs import (
    ROOT,
    concord,
    launched_by,
    sim_argv,
    spawn,
    steps,
    wait_for,
)
from bench.chaos_faults import case_baseline, ensure_baseline
from bench.chaos_runs import (
    RUN_TIMEOUT,
    Ctx,
    SimRun,
    base_sets,
    final_params,
    max_abs_diff,
)

# -- resume --------------------------------------------------------------------------------------


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
    _, state = final_params(cut / "checkpoint.pt")
    d["interrupted_at_step"] = int(state["run"]["next_step"])
    d["total_steps"] = int(state["run"]["total_steps"])
    p = subprocess.run(concord("sim", "--resume", str(cut), "--quiet", "--reference", "none"),
                       cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                       check=False)  # fmt: skip
    d["resume_exit_code"] = p.returncode
    if p.returncode:
        d["error"] = f"--resume failed: {p.stdout[-500:]}{p.stderr[-500:]}"
        return False
    a, _ = final_params(whole / "checkpoint.pt")
    b, _ = final_params(cut / "checkpoint.pt")
    diff = max_abs_diff(a, b)
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
    ensure_baseline(ctx)
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
    base = ROOT / ("" if ctx.baseline is None else ctx.baseline.run_dir)
    diff = max(
        max_abs_diff(final_params(base / "peers" / f"peer-{i}" / "checkpoint.pt")[0],
                  final_params(run.dir / "peers" / f"peer-{i}" / "checkpoint.pt")[0])
        for i in range(8)
    )  # fmt: skip
    ctx.metrics["resume_max_abs_diff_processes"] = diff
    d["max_abs_diff"] = diff
    return diff <= 1e-5
