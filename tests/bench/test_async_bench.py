"""``bench/async.py``: the worst-peer curve and time to accuracy, the churn schedule and its
kill / restart against real (sleeping) processes, the per-rank slowdowns of ``bench/_ddp.py``,
the curve, idle fraction and staleness read from Concord peers' records and DDP ranks' files,
the summary's ratios and JSON line (fast); one
``--quick`` run of DDP fp32 and synchronous D-SGD end to end (slow: 16 processes, ~60 s)."""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import _ddp  # noqa: E402
from bench.async_runs import (  # noqa: E402
    Churn,
    Settings,
    apply_churn,
    read_concord,
    read_ddp,
    worst_curve,
)
from bench.time_to_accuracy import Run  # noqa: E402
from tests.records import step_record  # noqa: E402

bench_async: Any = importlib.import_module("bench.async")  # "async" is a keyword


def test_worst_curve_takes_the_lowest_latest_accuracy_once_every_peer_has_evaluated() -> None:
    # peer 0 (fast) evaluates at 1, 2, 3 s; peer 1 (slow) at 2.5 and 6 s
    per_peer = {0: [(9, 1.0, 0.5), (19, 2.0, 0.7), (29, 3.0, 0.8)],
                1: [(9, 2.5, 0.4), (19, 6.0, 0.9)]}  # fmt: skip
    curve = worst_curve(per_peer)
    # nothing before 2.5 s (peer 1 had not evaluated); then min(latest) at every evaluation
    assert curve == [(9, 2.5, 0.4), (29, 3.0, 0.4), (19, 6.0, 0.8)]
    run = Run("ad_psgd", True, curve=curve)
    assert run.tta(0.8) == 6.0  # the slow peer's 0.9 at 6 s lifts the worst to peer 0's 0.8
    assert run.tta(0.81) is None
    assert run.final_acc == 0.8


def test_churn_schedule_is_a_fraction_of_the_reference_peers_steps() -> None:
    assert Churn().schedule(372) == (112, 223)  # 30 % and 60 % of 12 epochs × 31 steps
    assert Churn().schedule(2) == (1, 2)  # never at step 0, restart strictly after the kill
    with pytest.raises(ValueError, match="kill_at < restart_at"):
        Churn(kill_at=0.6, restart_at=0.3)
    with pytest.raises(ValueError, match="reference peer 2"):
        Churn(ref=2)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_apply_churn_kills_the_victims_at_30_percent_and_restarts_them_at_60(
    tmp_path: Path,
) -> None:
    s = Settings(tmp_path, (), (1.0,) * 4, total_steps=10, churn=Churn(victims=(1, 3)))
    procs = {i: _sleeper() for i in range(4)}
    first = dict(procs)
    seen: list[int] = []  # the reference's progress at each poll: one step per poll

    def progress() -> int:
        seen.append(len(seen))
        return seen[-1]

    try:
        events = apply_churn(s, progress, procs, lambda i: _sleeper())
        assert (events["kill_step"], events["restart_step"]) == (3, 6)
        assert events["killed_at"] <= events["restarted_at"]
        for i in (1, 3):
            assert first[i].returncode == -signal.SIGKILL
            assert procs[i] is not first[i]  # restarted
            assert procs[i].poll() is None
        assert all(procs[i] is first[i] and procs[i].poll() is None for i in (0, 2))
        assert seen[-1] >= 6
    finally:
        for p in [*first.values(), *procs.values()]:
            p.kill()
            p.wait(10)


def test_apply_churn_without_a_restart_only_kills(tmp_path: Path) -> None:
    s = Settings(tmp_path, (), (1.0,) * 3, total_steps=4, churn=Churn(victims=(2,)))
    procs = {i: _sleeper() for i in range(3)}
    try:
        events = apply_churn(s, lambda: 4, procs, None)
        assert "restarted_at" not in events
        assert "killed_at" in events
        assert procs[2].returncode == -signal.SIGKILL
        assert procs[0].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait(10)


def _args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"slow_ranks": "", "slow_factor": 1.0, "slow_factors": "", **kw})


def test_ddp_slow_factors_give_each_rank_its_own_and_refuse_a_wrong_list() -> None:
    factors = ",".join(f"{f:g}" for f in bench_async.FACTORS)
    assert [_ddp.slow_factor(_args(slow_factors=factors), r, 8) for r in range(8)] == list(
        bench_async.FACTORS
    )
    assert _ddp.slow_factor(_args(slow_ranks="3", slow_factor=4.0), 3, 8) == 4.0
    assert _ddp.slow_factor(_args(slow_ranks="3", slow_factor=4.0), 2, 8) == 1.0
    for bad in ("1,2", "1,1,1,1,1,1,1,0.5", "1,x,1,1,1,1,1,1"):
        with pytest.raises(SystemExit, match="--slow-factors"):
            _ddp.slow_factor(_args(slow_factors=bad), 0, 8)


def test_read_ddp_curve_and_idle_fraction_from_rank_files(tmp_path: Path) -> None:
    rows = [{"kind": "start", "time": 100.0}, {"kind": "step", "step": 0, "time": 101.0},
            {"kind": "eval", "step": 0, "time": 101.0, "accuracy": 0.3},
            {"kind": "step", "step": 1, "time": 104.0},
            {"kind": "eval", "step": 1, "time": 104.0, "accuracy": 0.6}]  # fmt: skip
    (tmp_path / "rank-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # rank 0: 10 s, 2 computing, 3 in the slowdown → 0.5 idle; rank 1: 10 s, 8 computing → 0.2
    for rank, (cpu, slept) in enumerate([(2.0, 3.0), (8.0, 0.0)]):
        summary = {"kind": "summary", "train_seconds": 10.0, "compute_cpu_s": cpu,
                   "slow_sleep_s": slept}  # fmt: skip
        (tmp_path / f"rank-{rank}.out").write_text(f"a log line\n{json.dumps(summary)}\n")
    run = Run("ddp_fp32", True)
    read_ddp(run, tmp_path, 2)
    assert run.curve == [(0, 1.0, 0.3), (1, 4.0, 0.6)]
    assert run.train_s == 4.0
    assert run.detail["idle_fraction"] == pytest.approx(0.35, abs=1e-9)  # exact arithmetic


def _run(name: str, curve: list[tuple[int, float, float]], **detail: Any) -> Run:
    return Run(name, True, ok=True, curve=curve, train_s=curve[-1][1], detail=dict(detail))


def test_summary_ratios_best_contenders_and_json_line() -> None:
    runs = [
        _run("ddp_fp32", [(9, 20.0, 0.60), (19, 40.0, 0.70)], idle_fraction=0.6),
        _run("ddp_fp16", [(9, 15.0, 0.70), (19, 30.0, 0.70)], idle_fraction=0.5),
        _run("dsgd_exp_none_bf16", [(9, 10.0, 0.60), (19, 20.0, 0.70)], idle_fraction=0.4),
        _run("dsgd_exp_none_bf16_overlap", [(9, 12.0, 0.70)]),
        _run("ad_psgd", [(9, 4.0, 0.65), (19, 6.0, 0.71)], staleness=1.5, idle_fraction=0.01),
        _run("async_sgp", [(9, 5.0, 0.60)]),  # never reaches the target
    ]
    out = bench_async.summarize(runs)
    assert out["target_acc"] == 0.695  # DDP fp32's final 0.70 − 0.5 pp
    assert (out["best_async"], out["best_sync"], out["best_ddp"]) == (
        "ad_psgd", "dsgd_exp_none_bf16_overlap", "ddp_fp16")  # fmt: skip
    assert out["tta_ratio_async_vs_sync"] == 0.5  # 6 / 12
    assert out["tta_ratio_async_vs_ddp"] == 0.4  # 6 / 15 (DDP fp16 got there first)
    rows = {r["name"]: r for r in out["contenders"]}
    assert rows["async_sgp"]["tta_s"] is None
    assert rows["async_sgp"]["staleness"] is None  # asynchronous but no record of it
    assert rows["ad_psgd"]["staleness"] == 1.5
    assert rows["ad_psgd"]["idle_fraction"] == 0.01
    assert rows["dsgd_exp_none_bf16"]["staleness"] == 0.0  # synchronous: nothing stale
    assert json.loads(json.dumps(out)) == out


def test_summary_without_an_asynchronous_run_has_no_ratio() -> None:
    out = bench_async.summarize([_run("ddp_fp32", [(9, 20.0, 0.7)])])
    assert out["tta_ratio_async_vs_sync"] is None
    assert out["tta_ratio_async_vs_ddp"] is None
    assert out["best_ddp"] == "ddp_fp32"


def test_unknown_contender_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_async.main(["--contenders", "ddp_fp32,nope"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_sync_and_ddp_run_ends_with_the_json_line(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "bench" / "async.py"), "--quick", "--epochs", "1",
            "--samples", "4000", "--contenders", "ddp_fp32,dsgd_exp_none_bf16",
            "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {r["name"]: r for r in out["contenders"]}
    assert set(rows) == {"ddp_fp32", "dsgd_exp_none_bf16"}
    failed = {k: (r.get("exit_codes"), r.get("tail")) for k, r in rows.items() if not r["ok"]}
    assert not failed, failed
    assert out["best_ddp"] == "ddp_fp32"
    assert out["target_acc"] is not None
    assert rows["ddp_fp32"]["tta_s"] is not None  # DDP reaches its own target by definition
    assert 0 <= rows["dsgd_exp_none_bf16"]["idle_fraction"] <= 1
    assert (tmp_path / "async.csv").is_file()


Row = tuple[int, float, float, float, float | None]


def _write_peer(peer_dir: Path, rows: Sequence[Row]) -> None:
    """A peer's metrics.jsonl: per (step, end time, step_ms, wait_ms, accuracy or None) a step
    record (``time``, ``step_ms``, ``wait_ms`` in its extra; ``staleness_mean`` 2.0) and, with
    an accuracy, that step's evaluation."""
    peer_dir.mkdir(parents=True)
    lines = []
    for step, t, step_ms, wait_ms, acc in rows:
        extra: dict[str, Any] = {"time": t, "step_ms": step_ms, "wait_ms": wait_ms}
        lines.append(step_record(step, extra=extra, staleness_mean=2.0).to_json())
        if acc is not None:
            lines.append({"kind": "eval", "version": 1, "step": step, "epoch": 0.1,
                          "accuracy_mean_peer": acc, "loss_mean_peer": 1.0, "peer": 0})  # fmt: skip
    (peer_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_read_concord_lines_peers_up_from_the_earliest_first_step(tmp_path: Path) -> None:
    # peer 0 starts at 100 s (its first step: 1 s long, ending at 101), steps until 104, 1 s
    # blocked; peer 1 starts at 101, ends at 109, 4 s blocked
    p0 = [(0, 101.0, 1000.0, 0.0, 0.3), (1, 104.0, 3000.0, 1000.0, 0.6)]
    p1 = [(0, 102.0, 1000.0, 0.0, 0.2), (1, 109.0, 7000.0, 4000.0, 0.7)]
    _write_peer(tmp_path / "peer-0", p0)
    _write_peer(tmp_path / "peer-1", p1)
    run = Run("async_sgp", True)
    read_concord(run, tmp_path, 2)
    assert run.train_s == 9.0  # 100 → 109
    # worst of the latest: (2 s: 0.3 vs 0.2), (4 s: 0.6 vs 0.2), (9 s: 0.6 vs 0.7)
    assert run.curve == [(0, 2.0, 0.2), (1, 4.0, 0.2), (1, 9.0, 0.6)]
    # idle: peer 0 1 s of 4, peer 1 4 s of 8 → mean 0.375 (exact binary fractions)
    assert run.detail["idle_fraction"] == 0.375
    assert run.detail["staleness"] == 2.0
    assert run.detail["local_steps"] == [2, 2]


def test_curves_csv_is_the_shared_writer_with_the_benchs_columns(tmp_path: Path) -> None:
    # bench/async.py and bench/edge.py write their curves with time_to_accuracy.write_curves
    edge: Any = importlib.import_module("bench.edge")
    a, b = Run("ad_psgd", True), Run("ddp_fp32", True)
    a.curve, b.curve = [(3, 1.25, 0.5), (7, 2.5, 0.625)], [(5, 2.0, 0.75)]
    bench_async.write_csv(tmp_path / "async.csv", [a, b])
    assert (tmp_path / "async.csv").read_text().splitlines() == [
        "contender,step,seconds,worst_accuracy",
        "ad_psgd,3,1.250,0.5000",
        "ad_psgd,7,2.500,0.6250",
        "ddp_fp32,5,2.000,0.7500",
    ]
    edge.write_csv(tmp_path / "edge.csv", {"lan": [b], "wan": [a]})
    assert (tmp_path / "edge.csv").read_text().splitlines() == [
        "profile,contender,step,seconds,accuracy",
        "lan,ddp_fp32,5,2.000,0.7500",
        "wan,ad_psgd,3,1.250,0.5000",
        "wan,ad_psgd,7,2.500,0.6250",
    ]


def test_read_concord_without_every_peer_evaluating_has_no_curve(tmp_path: Path) -> None:
    _write_peer(tmp_path / "peer-0", [(0, 101.0, 1000.0, 0.0, 0.3)])
    _write_peer(tmp_path / "peer-1", [(0, 102.0, 1000.0, 0.0, None)])
    run = Run("ad_psgd", True)
    read_concord(run, tmp_path, 2)
    assert run.curve == []
    assert run.detail["no_evaluations"] == [1]


def test_stretch_lengthens_every_sleep_and_keeps_unit_factors() -> None:
    assert bench_async.stretched((1.0, 1.5, 6.0), 1.0) == (1.0, 1.5, 6.0)
    assert bench_async.stretched((1.0, 1.5, 6.0), 10.0) == (1.0, 6.0, 51.0)  # 1 + 10 (F − 1)


def test_stretch_below_one_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_async.main(["--stretch", "0.5"]) == 2
    assert "--stretch" in capsys.readouterr().err


def test_read_concord_overrun_fraction_and_final_accuracy_per_peer(tmp_path: Path) -> None:
    # peer 0: 3 steps, the first unmeasured (device_cpu_ms 0), one of the other two overran;
    # peer 1: 3 measured cycles, none overran → 1 overrun in 4 cycles
    for i, overruns in enumerate([(0.0, 1.0, 0.0), (0.0, 0.0, 0.0)]):
        d = tmp_path / f"peer-{i}"
        d.mkdir()
        lines = []
        for step, over in enumerate(overruns):
            cpu = 0.0 if (i, step) == (0, 0) else 30.0
            extra: dict[str, Any] = {"time": 100.0 + step, "step_ms": 50.0,
                                     "device_overrun": over, "device_cpu_ms": cpu}  # fmt: skip
            lines.append(step_record(step, extra=extra).to_json())
            lines.append({"kind": "eval", "version": 1, "step": step, "epoch": 0.1,
                          "accuracy_mean_peer": 0.5 + 0.1 * i + 0.01 * step,
                          "loss_mean_peer": 1.0, "peer": i})  # fmt: skip
        (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = Run("ad_psgd", True)
    read_concord(run, tmp_path, 2)
    assert run.detail["overrun_fraction"] == 0.2  # 1 of 5 measured cycles (3 − 1 + 3)
    assert run.detail["final_acc_per_peer"] == [0.52, 0.62]


def test_read_ddp_overrun_fraction_from_the_rank_summaries(tmp_path: Path) -> None:
    (tmp_path / "rank-0.jsonl").write_text(json.dumps({"kind": "start", "time": 1.0}) + "\n")
    for rank, over in enumerate([3, 1]):
        summary = {"kind": "summary", "train_seconds": 10.0, "compute_cpu_s": 1.0,
                   "slow_sleep_s": 5.0, "device_cycles": 20, "device_overruns": over}  # fmt: skip
        (tmp_path / f"rank-{rank}.out").write_text(json.dumps(summary) + "\n")
    run = Run("ddp_fp32", True)
    read_ddp(run, tmp_path, 2)
    assert run.detail["overrun_fraction"] == 0.1  # 4 of 40


def test_a_contender_over_the_overrun_bound_is_flagged_unfaithful() -> None:
    runs = [
        _run("ddp_fp32", [(9, 20.0, 0.70)], overrun_fraction=0.01),
        _run("ad_psgd", [(9, 4.0, 0.71)], overrun_fraction=0.2),
    ]
    assert bench_async.summarize(runs)["unfaithful"] == ["ad_psgd"]
    assert bench_async.unfaithful(runs[:1]) == []


def test_device_time_with_a_stretch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_async.main(["--stretch", "10"]) == 2  # the default --device-ms is set
    assert "--device-ms" in capsys.readouterr().err
    assert bench_async.main(["--device-ms", "-1"]) == 2


def test_ddp_device_ms_below_zero_is_refused() -> None:
    argv = ["--config", "x", "--rank", "0", "--world", "1", "--master", "h:1", "--out", "o"]
    with pytest.raises(SystemExit, match="--device-ms"):
        _ddp.main([*argv, "--device-ms", "-5"])
