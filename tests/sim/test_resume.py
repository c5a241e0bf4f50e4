"""Resuming an interrupted vectorized run: same final parameters, metrics and counters."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from concord.core.config import load_config
from concord.core.records import StepRecord
from concord.lab.cli import main
from concord.runtime.rundir import load_checkpoint
from concord.sim.engine import resume_run, run

torch.set_num_threads(1)

SMALL = [
    "peers=4",
    "dataset.samples=800",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=2",  # 10 steps per epoch: 20 steps
    "optim.batch_size=16",
    "optim.momentum=0.9",
    "eval.every=0.5",  # evaluations (and checkpoints) after steps 4, 9, 14, 19
    "control.mode=none",
]

CASES = {
    "dsgd-momentum": ["algorithm=dsgd"],
    "gradient-tracking": ["algorithm=gradient-tracking"],
    "choco": [
        "algorithm=choco",
        "compression.codec=topk",
        "compression.ratio=0.1",
        "compression.gamma=0.5",
    ],
    "adaptive-lagged": [
        "control.mode=adaptive",
        "control.factor=0.05",
        "control.max_rounds=4",
        "control.lagged=true",
        "control.phases=[1]",
    ],
    "ada-feedback": ["algorithm=ada-feedback", "hyper.every=2", "hyper.k0=1", "hyper.factor=0.1"],
}


class _CrashError(Exception):
    """Stands for the process dying after a step."""


def _crash_after(step: int) -> Callable[[StepRecord], None]:
    def on_progress(record: StepRecord) -> None:
        if record.step == step:
            raise _CrashError(step)

    return on_progress


def _steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["kind"] == "step"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_interrupted_then_resumed_run_ends_like_an_uninterrupted_one(
    tmp_path: Path, case: str
) -> None:
    cfg = load_config(None, [*SMALL, *CASES[case]], environ={})
    full = run(cfg, tmp_path / "full", progress=False, plots=False)
    with pytest.raises(_CrashError):
        run(cfg, tmp_path / "cut", progress=False, plots=False, on_progress=_crash_after(14))
    saved = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    last = int(saved["step"])  # the last evaluation at or before the crash
    assert 9 <= last <= 14
    assert saved["run"]["next_step"] == last + 1
    assert _steps(tmp_path / "cut") == list(range(last + 1))  # flushed with the checkpoint
    resumed = resume_run(tmp_path / "cut", progress=False, plots=False)
    expected = load_checkpoint(tmp_path / "full" / "checkpoint.pt")
    got = load_checkpoint(tmp_path / "cut" / "checkpoint.pt")
    diff = float((got["params"] - expected["params"]).abs().max())
    assert diff <= 1e-6, f"{case}: resumed final params differ by max abs {diff:.3e}"
    for key, value in expected["algorithm"].items():
        d = float((got["algorithm"][key] - value).abs().max())
        assert d <= 1e-6, f"{case}: algorithm state {key!r} differs by max abs {d:.3e}"
    # the summary and the metrics continue as if nothing happened
    for key in ("gossip_rounds_total", "bytes_sent_total", "bytes_raw_total"):
        assert resumed[key] == full[key], key
    assert resumed["accuracy_avg_model"] == full["accuracy_avg_model"]
    assert resumed["resumed_from_step"] == last + 1
    assert (tmp_path / "cut" / "metrics.jsonl").read_text() == (
        tmp_path / "full" / "metrics.jsonl"
    ).read_text()
    edges = json.loads((tmp_path / "cut" / "edges.json").read_text())
    assert edges == json.loads((tmp_path / "full" / "edges.json").read_text())
    if case == "ada-feedback":
        assert (tmp_path / "cut" / "graphs.jsonl").read_text() == (
            tmp_path / "full" / "graphs.jsonl"
        ).read_text()


def test_resume_drops_metrics_lines_after_the_checkpoint(tmp_path: Path) -> None:
    cfg = load_config(None, SMALL, environ={})
    run(cfg, tmp_path / "full", progress=False, plots=False)
    d = tmp_path / "cut"
    with pytest.raises(_CrashError):
        run(cfg, d, progress=False, plots=False, on_progress=_crash_after(17))
    with open(d / "metrics.jsonl", "a", encoding="utf-8") as f:  # stale lines and a torn one
        f.write(json.dumps({"kind": "step", "step": 18}) + "\n")
        f.write('{"kind": "step", "st')
    resume_run(d, progress=False, plots=False)
    assert _steps(d) == _steps(tmp_path / "full")
    assert (d / "metrics.jsonl").read_text() == (tmp_path / "full" / "metrics.jsonl").read_text()


def test_resuming_a_finished_run_returns_its_summary(tmp_path: Path) -> None:
    cfg = load_config(None, SMALL, environ={})
    summary = run(cfg, tmp_path / "r", progress=False, plots=False)
    again = resume_run(tmp_path / "r", progress=False, plots=False)
    assert again["wall_seconds"] == summary["wall_seconds"]
    assert _steps(tmp_path / "r") == list(range(20))


def test_resume_needs_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"config\.toml"):
        resume_run(tmp_path / "nothing", progress=False)
    cfg = load_config(None, SMALL, environ={})
    with pytest.raises(_CrashError):
        run(cfg, tmp_path / "early", progress=False, plots=False, on_progress=_crash_after(2))
    with pytest.raises(FileNotFoundError, match=r"checkpoint\.pt"):
        resume_run(tmp_path / "early", progress=False)


def test_cli_sim_resume(tmp_path: Path) -> None:
    cfg = load_config(None, SMALL, environ={})
    d = tmp_path / "cut"
    with pytest.raises(_CrashError):
        run(cfg, d, progress=False, plots=False, on_progress=_crash_after(14))
    result = CliRunner().invoke(main, ["sim", "--resume", str(d), "--quiet", "--reference", "none"])
    assert result.exit_code == 0, result.output
    assert _steps(d) == list(range(20))
    assert json.loads((d / "summary.json").read_text())["resumed_from_step"] == 15
    bad = CliRunner().invoke(main, ["sim", "--resume", str(d), "--set", "peers=8"])
    assert bad.exit_code != 0
    assert "--resume" in bad.output


def test_sampler_state_is_its_stream_key_and_is_checked_on_load() -> None:
    import numpy as np

    from concord.core.data.sampler import ReplicaSampler

    parts = [np.arange(0, 40), np.arange(40, 80)]
    a = ReplicaSampler(parts, [0, 1], 4, seed=3)
    state = a.state_dict()
    assert state == {"seed": 3, "n": 2, "ranks": [0, 1], "batch_size": 4, "steps_per_epoch": 10}
    b = ReplicaSampler(parts, [0, 1], 4, seed=3)
    b.load_state_dict(state)
    assert torch.equal(a.batch_indices(17), b.batch_indices(17))  # no running state: same draws
    with pytest.raises(ValueError, match="seed: saved 3, here 4"):
        ReplicaSampler(parts, [0, 1], 4, seed=4).load_state_dict(state)


PEER_RUN = """
topology = "ring"
algorithm = "dsgd"
seed = 3
epochs = 6
[dataset]
samples = 800
[model]
name = "mlp"
hidden = [32]
[optim]
momentum = 0.9
[control]
mode = "none"
"""


def test_a_killed_static_peer_started_again_continues_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    import signal
    import time

    from tests.integration.peers import Peers, write_config

    config = write_config(tmp_path / "run.toml", 2, PEER_RUN, deadline=0.5)
    with open(config, "a") as f:  # [network] comes last: do not wait long for a finished peer
        f.write("startup_timeout = 3.0\n")
    first = Peers(config, tmp_path, [0, 1])
    again: Peers | None = None
    try:
        ckpt = tmp_path / "peer-1" / "checkpoint.pt"
        metrics = tmp_path / "peer-1" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # a checkpoint and some steps beyond it
            if ckpt.is_file() and len(metrics.read_text().splitlines()) > 35:
                break
            time.sleep(0.05)
        first.procs[1].send_signal(signal.SIGKILL)
        first.procs[1].wait(timeout=10)
        saved = load_checkpoint(ckpt)
        assert saved["run"]["engine"] == "peer"
        again = Peers(config, tmp_path, [1])  # the same command again
        assert again.wait(timeout=300) == {1: 0}
        assert first.procs[0].wait(timeout=300) == 0
    finally:
        first.kill_all()
        if again is not None:
            again.kill_all()
    summary = json.loads((tmp_path / "peer-1" / "summary.json").read_text())
    assert summary["completed"]
    assert summary["resumed_from_step"] == saved["run"]["next_step"] > 0
    assert _steps(tmp_path / "peer-1") == list(range(120))  # no gap, no duplicate (20 / epoch)
    assert summary["gossip_rounds_total"] == 120
    log = (tmp_path / "peer-1" / "log.jsonl").read_text()
    assert "peer.resume" in log
    assert json.loads((tmp_path / "peer-0" / "summary.json").read_text())["completed"]


def test_resume_after_the_last_step_finishes_the_run(tmp_path: Path) -> None:
    cfg = load_config(None, SMALL, environ={})
    full = run(cfg, tmp_path / "r", progress=False, plots=False)
    (tmp_path / "r" / "summary.json").unlink()  # died while writing the summary
    again = resume_run(tmp_path / "r", progress=False, plots=False)
    assert again["accuracy_avg_model"] == full["accuracy_avg_model"]
    assert again["gossip_rounds_total"] == full["gossip_rounds_total"]
    assert _steps(tmp_path / "r") == list(range(20))
