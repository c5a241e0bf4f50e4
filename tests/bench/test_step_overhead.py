"""``bench/step_overhead.py``: its ratios divide the right times, and the framework-overhead
targets are judged against their bounds."""

from __future__ import annotations

import pytest

from bench.step_overhead import TARGETS, ratios, steady_seconds_per_step, targets_met

SECONDS = {  # distinct values, so a ratio over the wrong time cannot pass
    "peers": 0.060,
    "bf16": 0.050,
    "serial": 0.070,
    "torch_plane": 0.030,
    "compute": 0.015,
    "gloo": 0.032,
    "gloo_fp16": 0.036,
    "gossip": 0.027,
    "exchange": 0.026,
    "gossip_exchange": 0.013,
}


def test_framework_overhead_ratios_divide_by_the_gloo_ring_gossip_step() -> None:
    r = ratios(SECONDS)
    assert r["ratio_torch_plane_vs_gloo_gossip"] == pytest.approx(0.030 / 0.027, abs=5e-4)
    assert r["ratio_grpc_vs_gloo_gossip"] == pytest.approx(0.060 / 0.027, abs=5e-4)
    # the ratios printed before stay, over their own baselines
    assert r["ratio_vs_gloo"] == pytest.approx(0.060 / 0.032, abs=5e-4)
    assert r["ratio_torch_plane_vs_gloo"] == pytest.approx(0.030 / 0.032, abs=5e-4)
    assert r["exchange_ratio_vs_gloo_gossip"] == pytest.approx(2.0, abs=5e-4)
    assert r["ratio_vs_compute_only"] == pytest.approx(4.0, abs=5e-4)


def test_targets_are_met_up_to_their_bound_and_missed_above() -> None:
    at = dict(TARGETS)
    assert targets_met(at) == dict.fromkeys(TARGETS, True)
    above = {key: bound + 0.001 for key, bound in TARGETS.items()}
    assert targets_met(above) == dict.fromkeys(TARGETS, False)
    assert TARGETS == {"ratio_torch_plane_vs_gloo_gossip": 1.15, "ratio_grpc_vs_gloo_gossip": 1.6}


def test_a_peers_pace_is_taken_from_its_step_records_past_the_warm_up() -> None:
    # five warm-up steps of any length, then steps ending every 0.5 s
    ends = [0.0, 3.0, 4.0, 4.1, 9.0, *(10.0 + 0.5 * i for i in range(7))]
    records = [{"kind": "step", "step": i, "time": t} for i, t in enumerate(ends)]
    assert steady_seconds_per_step(records) == pytest.approx(0.5, abs=1e-12)
    with pytest.raises(ValueError, match="6 step records; the pace needs at least 7"):
        steady_seconds_per_step(records[:6])
