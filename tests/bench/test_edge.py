"""``bench/edge.py``: its summary arithmetic and the crossover map's arithmetic — step times,
model, CSV, heat map (fast) —, its ``--quick`` mode end to end (slow: 8 DDP ranks and 8 Concord
peers behind the emulated ``edge`` and ``edge-mixed`` links, about 80 s) — the last line is JSON
with every key, and no namespace of the run is left behind — and one point of ``--map`` end to
end (slow, about 60 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import concord.lab.net as netns  # noqa: E402
from bench import edge, edge_map, time_to_accuracy  # noqa: E402
from bench.cost_model import EdgeModel  # noqa: E402
from bench.time_to_accuracy import Run  # noqa: E402
from tests.records import step_record  # noqa: E402

ROW_KEYS = {"profile", "name", "ok", "tta_s", "final_acc", "train_s", "step_s",
            "bytes_per_peer", "payload_bytes", "link_util", "evals"}  # fmt: skip
TOP_KEYS = {"benchmark", "target_acc", "contenders", "best_edge", "best_mixed",
            "tta_ratio_vs_ddp_fp16_edge", "tta_ratio_vs_ddp_fp16_mixed",
            "tta_ratio_vs_ddp_fp32_edge", "tta_ratio_vs_ddp_fp32_mixed",
            "epochs", "samples", "peers", "hidden", "slow", "wall_s", "out"}  # fmt: skip


def _run(name: str, curve: list[tuple[int, float, float]]) -> Run:
    r = Run(name, False, ok=True, curve=curve, train_s=curve[-1][1])
    r.detail["link_util"] = 0.5
    return r


def test_summary_ratios_use_the_ddp_fp32_target_on_every_profile() -> None:
    # DDP fp32 ends at 0.60 on "edge": the target is 0.595 on both profiles
    by = {
        "edge": [
            _run("ddp_fp32", [(9, 10.0, 0.5), (19, 20.0, 0.6)]),
            _run("ddp_fp16", [(9, 8.0, 0.59), (19, 16.0, 0.6)]),
            _run("dsgd_exp_none_bf16", [(9, 1.0, 0.58), (19, 2.0, 0.597)]),
            _run("dsgd_ring_none_bf16", [(9, 3.0, 0.596), (19, 6.0, 0.61)]),
        ],
        "edge-mixed": [
            _run("ddp_fp16", [(9, 20.0, 0.59), (19, 40.0, 0.6)]),
            _run("dsgd_exp_none_bf16", [(9, 2.0, 0.5), (19, 4.0, 0.58)]),  # never reaches it
        ],
    }
    out = edge.summarize(by)
    assert out["target_acc"] == pytest.approx(0.595, abs=1e-9)
    assert out["best_edge"] == "dsgd_exp_none_bf16"  # 2.0 s beats the ring's 3.0 s
    assert out["tta_ratio_vs_ddp_fp16_edge"] == pytest.approx(2.0 / 16.0, abs=1e-3)
    assert out["tta_ratio_vs_ddp_fp32_edge"] == pytest.approx(2.0 / 20.0, abs=1e-3)
    assert out["best_mixed"] is None
    assert out["tta_ratio_vs_ddp_fp16_mixed"] is None
    rows = {(r["profile"], r["name"]): r for r in out["contenders"]}
    assert rows[("edge", "ddp_fp32")]["step_s"] == pytest.approx(1.0)  # 20 s, 20 steps
    assert rows[("edge-mixed", "dsgd_exp_none_bf16")]["tta_s"] is None
    assert all(set(r) == ROW_KEYS for r in out["contenders"])


def _skip_reason() -> str | None:
    ok, why = netns.available()
    if not ok:
        return f"network namespaces not permitted here: {why}"
    from concord.orchestrator.broker import mosquitto_binary

    if mosquitto_binary() is None:
        return "mosquitto is not installed"
    return None


@pytest.mark.slow
@pytest.mark.mosquitto
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_quick_edge_bench_reports_every_key_and_leaves_no_namespace(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "bench" / "edge.py"), "--quick", "--out", str(tmp_path)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr[-2000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert set(result) == TOP_KEYS
    assert {(r["profile"], r["name"]) for r in result["contenders"]} == {
        (profile, name) for profile in ("edge", "edge-mixed") for name in edge.QUICK
    }
    for row in result["contenders"]:
        assert set(row) == ROW_KEYS
        assert row["ok"], row
        assert row["bytes_per_peer"] > 0
        assert 0.0 < row["link_util"] < 1.0, row
    # DDP fp16 sets the target in --quick (no fp32 run) and reaches it at the latest at its end;
    # 6 steps leave accuracy near chance, so whether gossip's worst peer reaches it varies
    assert all(r["tta_s"] is not None for r in result["contenders"] if r["name"] == "ddp_fp16")
    for key in ("tta_ratio_vs_ddp_fp16_edge", "tta_ratio_vs_ddp_fp16_mixed"):
        assert result[key] is None or result[key] > 0, (key, result[key])
    # the bench's namespaces are named after its pid (`concord.lab.net.Net`); others' runs may
    # be creating their own meanwhile
    ours = [n for n in netns.namespaces() if n.startswith(f"{netns.PREFIX}{p.pid}-")]
    assert not ours, f"namespaces left behind: {ours}"
    assert (tmp_path / "edge.csv").is_file()


# -- the crossover map (--map) ---------------------------------------------------------------------


def test_choco_topk_is_defined_once_and_shared() -> None:
    [choco] = [c for c in edge.contenders() if c.name == "choco_topk"]
    assert choco is time_to_accuracy.CHOCO_TOPK


def test_a_map_point_is_the_edge_profile_at_its_rtt_and_rate_without_loss() -> None:
    emulation = edge_map.point_emulation(20.0, 100.0)
    for link in emulation.links(8):
        for direction in (link.up, link.down):
            # 5 ms on each of the 4 link crossings of a round trip
            assert (direction.delay_ms, direction.rate_mbit, direction.loss) == (5.0, 100.0, 0.0)
    assert emulation.mtu == 9000
    assert edge_map.point_name(1.0, 1000.0) == "map-rtt1ms-1000mbit"


def test_mlp_params_counts_weights_and_biases() -> None:
    # 40·128 + 128 + 128·128 + 128 + 128·10 + 10; a bf16 message is twice that in bytes (46,100,
    # the peers' bytes_sent per step)
    assert edge_map.mlp_params([128, 128]) == 23_050


def test_median_step_leaves_out_the_warm_up() -> None:
    ends = [0.0, 5.0, 5.5, 6.0, 6.2, 6.4, 6.7]  # intervals 5, .5, .5, .2, .2, .3
    assert edge_map.median_step_s(ends, warmup=1) == pytest.approx(0.3)
    assert edge_map.median_step_s(ends, warmup=6) is None
    assert edge_map.median_step_s([], warmup=0) is None


def test_step_ends_of_ddp_rank_0_and_of_the_slowest_peer(tmp_path: Path) -> None:
    rank0 = tmp_path / "rank-0.jsonl"
    lines = [{"kind": "start", "time": 0.5}, {"kind": "step", "step": 1, "time": 2.0},
             {"kind": "step", "step": 0, "time": 1.0},
             {"kind": "eval", "step": 1, "time": 2.0, "accuracy": 0.1}]  # fmt: skip
    rank0.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert edge_map.ddp_step_ends(rank0) == [1.0, 2.0]  # in step order, steps only
    peers = tmp_path / "peers"
    times = {0: [1.0, 2.0, 3.0], 1: [1.5, 1.8]}  # peer 1 stopped after step 1
    for peer, ts in times.items():
        (peers / f"peer-{peer}").mkdir(parents=True)
        records = [step_record(k, extra={"time": t}).to_json() for k, t in enumerate(ts)]
        text = "".join(json.dumps(r) + "\n" for r in records)
        (peers / f"peer-{peer}" / "metrics.jsonl").write_text(text)
    # per step, the last peer to end it; only steps every peer has
    assert edge_map.concord_step_ends(peers, 2) == [1.5, 2.0]
    assert edge_map.concord_step_ends(peers, 3) == []  # peer 2 has no records


def _cells() -> list[edge_map.Cell]:
    return [
        edge_map.Cell(1.0, 1000.0, ddp_s=0.030, gossip_s=0.008, load1=3.0),
        edge_map.Cell(80.0, 20.0, ddp_s=1.2, gossip_s=0.06, load1=4.0),
        edge_map.Cell(20.0, 100.0, ddp_s=0.3, gossip_s=None, load1=5.0),  # gossip's run failed
    ]


def test_the_model_is_calibrated_on_the_shortest_rtt_and_fastest_rate() -> None:
    cells = _cells()
    fit = edge_map.calibrated(cells, EdgeModel(8, 23_050))
    assert fit is not None
    model, base = fit
    assert (base.rtt_ms, base.rate_mbit) == (1.0, 1000.0)
    table = {(r["rtt_ms"], r["rate_mbit"]): r for r in edge_map.rows(cells, model)}
    # exact where calibrated, up to the CSV's rounding (0.01 ms, 0.001 relative error)
    assert table[(1.0, 1000.0)]["model_ddp_ms"] == pytest.approx(30.0, abs=0.01)
    assert table[(1.0, 1000.0)]["gossip_err"] == 0.0
    slow = table[(80.0, 20.0)]
    assert slow["ratio"] == pytest.approx(0.06 / 1.2, abs=1e-4)
    path = edge_map.path_of(80.0, 20.0)
    assert slow["model_ddp_ms"] == pytest.approx(1e3 * model.ddp_fp16_s(path), abs=0.01)
    assert slow["model_ratio"] == pytest.approx(
        model.gossip_bf16_s(path) / model.ddp_fp16_s(path), abs=1e-4
    )
    assert slow["ddp_err"] == pytest.approx((model.ddp_fp16_s(path) - 1.2) / 1.2, abs=1e-3)
    failed = table[(20.0, 100.0)]
    assert (failed["gossip_ms"], failed["ratio"], failed["gossip_err"]) == (None, None, None)
    assert failed["model_gossip_ms"] is not None  # the model still predicts it
    assert edge_map.calibrated([cells[2]], EdgeModel(8, 23_050)) is None


def test_map_csv_round_trips_and_the_heat_map_is_written(tmp_path: Path) -> None:
    result = edge_map.summarize(_cells(), [128, 128], 8)
    assert result["model"]["calibrated_at"] == {"rtt_ms": 1.0, "rate_mbit": 1000.0}
    assert result["model"]["params"] == 23_050
    path = tmp_path / "edge_map.csv"
    edge_map.write_map_csv(path, result["cells"])
    back = edge_map.read_map_csv(path)
    assert [list(r) for r in back] == [list(edge_map.COLUMNS)] * 3
    assert back[1]["ratio"] == pytest.approx(0.05, abs=1e-4)
    assert back[2]["gossip_ms"] is None
    edge_map.plot_map(tmp_path / "edge_map.png", result["cells"])
    assert (tmp_path / "edge_map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.mosquitto
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_one_map_point_end_to_end(tmp_path: Path) -> None:
    argv = [sys.executable, str(ROOT / "bench" / "edge.py"), "--map", "--rtts", "1",
            "--rates", "1000", "--out", str(tmp_path)]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr[-2000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    [cell] = result["cells"]
    # both ran and were timed; the model is calibrated on this very cell, so it matches it
    assert cell["ddp_ms"] > 0, stdout[-2000:]
    assert cell["gossip_ms"] > 0, stdout[-2000:]
    assert cell["ddp_err"] == 0.0
    assert cell["gossip_err"] == 0.0
    assert (tmp_path / "edge_map.csv").is_file()
    assert (tmp_path / "edge_map.png").is_file()
    ours = [n for n in netns.namespaces() if n.startswith(f"{netns.PREFIX}{p.pid}-")]
    assert not ours, f"namespaces left behind: {ours}"
