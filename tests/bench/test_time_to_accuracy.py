"""``bench/time_to_accuracy.py`` in a tiny configuration: 2 DDP ranks and 2 Concord peers (with
orchestrator and Mosquitto), each process in a network namespace of its own with its link
capped, a fraction of an epoch — the rows it reports are complete and consistent."""

from __future__ import annotations

import csv
import itertools
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import concord.lab.net as netns  # noqa: E402
from bench import time_to_accuracy as tta  # noqa: E402


def _skip_reason() -> str | None:
    ok, why = netns.available()
    if not ok:
        return f"network namespaces not permitted here: {why}"
    from concord.orchestrator.broker import mosquitto_binary

    if mosquitto_binary() is None:
        return "mosquitto is not installed"
    return None


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_tiny_time_to_accuracy(tmp_path: Path) -> None:
    s = tta.Settings(out=tmp_path, peers=2, mbit=200.0, epochs=0.25, samples=1000, eval_every=0.1)
    chosen = [c for c in tta.contenders() if c.name in ("ddp_fp32", "dsgd_ring_none_bf16")]
    runs = tta.run_all(s, chosen, [False])
    assert [r.name for r in runs] == ["ddp_fp32", "dsgd_ring_none_bf16"]  # DDP first
    steps_per_epoch = 1000 * 0.8 / 2 / 16  # 400 training samples per peer, batches of 16: 25
    for r in runs:
        assert r.ok, (r.name, r.detail)
        steps = [step for step, _, _ in r.curve]
        times = [t for _, t, _ in r.curve]
        # evaluations every 0.1 epoch (2 steps) and at the last step (step 5 of 6)
        assert steps == [1, 3, 5], (r.name, steps)
        assert steps[-1] == round(0.25 * steps_per_epoch) - 1
        assert times[0] > 0, (r.name, times)
        assert all(a < b for a, b in itertools.pairwise(times)), (r.name, times)
        assert r.train_s is not None
        assert times[-1] <= r.train_s + 1e-6
        assert all(0.0 <= acc <= 1.0 for *_, acc in r.curve)
        # every step sends at least the model once over the link (1.09M parameters)
        per_step = 2 * 1_090_000 if r.name.endswith("bf16") else 4 * 1_090_000
        assert r.bytes_per_peer is not None
        assert r.bytes_per_peer > (steps[-1] + 1) * per_step
    concord = runs[1]
    assert concord.payload_bytes is not None
    assert concord.bytes_per_peer is not None
    assert concord.payload_bytes < concord.bytes_per_peer  # the link carries headers too
    result = tta.summarize(runs)
    assert result["target_acc"] == pytest.approx(runs[0].final_acc - 0.005)
    rows = {row["name"]: row for row in result["contenders"]}
    assert set(rows) == {"ddp_fp32", "dsgd_ring_none_bf16"}
    for row in rows.values():
        assert row["ok"]
        assert row["final_acc"] is not None
        assert row["bytes_per_peer"] > 0
    assert rows["ddp_fp32"]["tta_s"] is not None  # DDP reaches its own final − 0.5 pp
    assert rows["ddp_fp32"]["tta_s"] <= rows["ddp_fp32"]["train_s"]
    json.dumps(result)  # the last stdout line is this object
    tta.write_csv(tmp_path / "tta.csv", runs)
    with (tmp_path / "tta.csv").open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == sum(len(r.curve) for r in runs)
    assert all(v != "" for row in table for v in row.values())
    tta.plot(tmp_path / "tta.png", runs, result["target_acc"])
    assert (tmp_path / "tta.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mine = f"{netns.PREFIX}{os.getpid()}-"
    assert not [n for n in netns.namespaces() if n.startswith(mine)]  # all torn down


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_tiny_torch_plane_contender(tmp_path: Path) -> None:
    """The opt-in torch-plane contender runs in the namespaces too: the peers reach the
    orchestrator's TCPStore at its namespace address and gloo binds their eth0 (the variable is
    set only for the run's processes)."""
    s = tta.Settings(out=tmp_path, peers=2, mbit=200.0, epochs=0.25, samples=1000, eval_every=0.1)
    chosen = [c for c in tta.extra_contenders() if c.name == "dsgd_exp_none_bf16_torch"]
    before = os.environ.get("GLOO_SOCKET_IFNAME")
    (run,) = tta.run_all(s, chosen, [False])
    assert os.environ.get("GLOO_SOCKET_IFNAME") == before
    assert run.ok, run.detail
    assert [step for step, _, _ in run.curve] == [1, 3, 5]
    config = (tmp_path / "plain" / run.name / "run.toml").read_text()
    assert 'transport = "torch"' in config
    assert run.bytes_per_peer is not None
    assert run.bytes_per_peer > 6 * 2 * 1_090_000  # 6 steps of the bf16 model over eth0
