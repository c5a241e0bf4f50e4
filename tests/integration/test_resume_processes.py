"""``concord sim --resume RUN_DIR`` in the processes engine: a run whose every process was
SIGKILLed mid-training (a machine that went down) continues from the newest checkpoint step that
every peer and the orchestrator hold, and ends where the uninterrupted run ends.

The reference is the vectorized engine on the same config: the processes engine matches it to
1e-5 when nothing fails (tests/integration/test_orchestrated.py), so a resumed run must too —
same parameters per peer (atol 1e-5: float32 sums in another order across the two engines, three
orders of magnitude above the differences seen, 3e-7) and the same rounds in every step (the
controller's state, calibration and lagged plans came back exactly)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from concord.core.config import load_config
from concord.runtime.lock import DirLock, holder
from concord.runtime.rundir import checkpoint_steps, load_checkpoint
from concord.sim.engine import run as run_vectorized
from concord.sim.processes import ProcessesError, resume_step
from tests.integration.peers import lifecycle

SMALL = [
    "peers=4",
    "dataset.samples=3000",
    "eval.every=0.5",  # checkpoints every 19 steps of 76
    "epochs=2",
    "control.factor=0.5",
    "control.max_rounds=6",
]
CASES = {
    # the paper's mode: constant targets from a calibration pass, barrier decisions
    "constant-barrier": ["control.mode=constant", "optim.milestones=[0.5]"],
    "adaptive-lagged": ["control.mode=adaptive", "control.factor=0.05", "control.lagged=true"],
}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "concord.lab.cli", *args]


def _steps(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step" and r.get("stage", "train") == "train"]


def _train_steps(path: Path) -> int:
    try:
        return len(_steps(path))
    except (OSError, ValueError, KeyError):
        return 0  # not there yet, or a line being written


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie holds no files
    except FileNotFoundError:
        return True


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _kill_all(launcher: subprocess.Popen[bytes], run_dir: Path) -> None:
    """SIGKILL the orchestrator and every peer, then the launcher: nobody gets to clean up."""
    pids = _children(launcher.pid)
    assert len(pids) >= 5, f"expected the orchestrator and 4 peers, found {pids}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    launcher.kill()
    launcher.wait(30)
    end = time.monotonic() + 30
    dirs = [run_dir, *(run_dir / "peers" / f"peer-{i}" for i in range(4))]
    while any(holder(d) for d in dirs) and time.monotonic() < end:
        time.sleep(0.01)  # their exit (and the kernel's release of their locks) takes a moment
    assert not [holder(d) for d in dirs if holder(d)], [_gone(p) for p in pids]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_killed_processes_run_resumes_to_the_uninterrupted_result(
    tmp_path: Path, case: str
) -> None:
    sets = [*SMALL, *CASES[case]]
    cfg = load_config(None, sets, environ={})
    run_vectorized(cfg, tmp_path / "vectorized", progress=False)
    expected = [r["rounds"] for r in _steps(tmp_path / "vectorized" / "metrics.jsonl")]
    reference = load_checkpoint(tmp_path / "vectorized" / "checkpoint.pt")["params"]

    run_dir = tmp_path / "processes"
    args = ["sim", "--engine", "processes", "--quiet", "--reference", "none"]
    args += ["--out", str(run_dir), *(a for s in sets for a in ("--set", s))]
    with (tmp_path / "first.out").open("wb") as log:
        launcher = subprocess.Popen(_cli(*args), stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 180
        peer0 = run_dir / "peers" / "peer-0" / "metrics.jsonl"
        while _train_steps(peer0) < 45 and time.monotonic() < end:  # past two checkpoints
            assert launcher.poll() is None, (tmp_path / "first.out").read_text()[-2000:]
            time.sleep(0.05)
    finally:
        _kill_all(launcher, run_dir)
    assert not (run_dir / "summary.json").exists()
    after = resume_step(cfg, run_dir)
    assert after in (18, 37, 56)  # a checkpoint step (every 19 steps), held by all
    for i in range(cfg.peers):
        assert after in checkpoint_steps(run_dir / "peers" / f"peer-{i}")

    done = subprocess.run(
        _cli("sim", "--resume", str(run_dir), "--quiet", "--reference", "none"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_step"] == after + 1
    assert summary["peers_completed"] == list(range(cfg.peers))
    for i in range(cfg.peers):
        peer_dir = run_dir / "peers" / f"peer-{i}"
        got = [r["rounds"] for r in _steps(peer_dir / "metrics.jsonl")]
        assert got == expected, f"peer {i}: rounds per step differ from the uninterrupted run"
        params = load_checkpoint(peer_dir / "checkpoint.pt")["params"][0]
        torch.testing.assert_close(params, reference[i], rtol=0, atol=1e-5)
        # the log is appended to: the resumed process went through the checkpoint first
        assert lifecycle(peer_dir)[-4:] == ["resuming", "training", "leaving", "done"]
    # the orchestrator's records were cut at the resumed step, not doubled
    rows = _steps(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(len(expected)))
    with pytest.raises(ProcessesError, match="finished run"):
        resume_step(cfg, run_dir)


def test_resume_names_what_is_missing_and_who_still_runs(tmp_path: Path) -> None:
    cfg = load_config(None, SMALL, environ={})
    (tmp_path / "peers" / "peer-0").mkdir(parents=True)
    with pytest.raises(ProcessesError, match=r"no checkpoint step held by every process"):
        resume_step(cfg, tmp_path)
    alive = DirLock(tmp_path / "peers" / "peer-2", "peer 2")  # a process of the interrupted run
    try:
        with pytest.raises(ProcessesError, match=r"still write it \(peer-2: peer 2, pid \d+\)"):
            resume_step(cfg, tmp_path)
    finally:
        alive.release()
