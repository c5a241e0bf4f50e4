"""``bench/cost_model.py``: the α–β fits recover known constants, the model's predictions have
the shape the model claims, the command measures and prints its JSON line, and the latency term
of the edge model (``bench/edge.py --map``) has its closed forms."""

from __future__ import annotations

import json

import pytest

from bench.cost_model import (
    GBITS,
    PEERS,
    EdgeModel,
    Fit,
    Model,
    WanPath,
    crossover,
    ddp_buckets,
    fit_line,
    fit_ring_allreduce,
    gossip_wan_s,
    main,
    predictions,
    ring_allreduce_wan_s,
    tbf_burst,
)

MB = 1e6


def test_fit_line_recovers_alpha_and_beta_of_exact_data() -> None:
    sizes = [1 * MB, 4 * MB, 16 * MB]
    f = fit_line(sizes, [50e-6 + 2e-10 * s for s in sizes])
    # exact data: only float rounding separates the fit from the truth
    assert f.alpha == pytest.approx(50e-6, rel=1e-6)
    assert f.beta == pytest.approx(2e-10, rel=1e-9)
    assert f.r2 == pytest.approx(1.0)


def test_fit_line_refuses_a_single_size() -> None:
    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_line([MB, MB], [1.0, 2.0])


def test_fit_ring_allreduce_separates_latency_from_bandwidth_over_rank_counts() -> None:
    alpha, beta = 80e-6, 5e-10

    def t(n: int, m: float) -> float:
        return 2 * (n - 1) * alpha + 2 * (n - 1) / n * m * beta

    series = {n: [(m, t(n, m)) for m in (MB, 4 * MB, 16 * MB)] for n in (2, 4)}
    f = fit_ring_allreduce(series)
    assert f.alpha == pytest.approx(alpha, rel=1e-6)
    assert f.beta == pytest.approx(beta, rel=1e-6)


def _model(alpha_ar: float = 100e-6) -> Model:
    return Model(
        allreduce=Fit(alpha_ar, 3e-10, 1.0),
        gossip=Fit(200e-6, 5e-10, 1.0),
        compute_s=0.01,
        model_bytes=4.36 * MB,
    )


def test_predictions_follow_the_model() -> None:
    rows = predictions(_model())
    assert len(rows) == len(GBITS) * len(PEERS)
    for gbit in GBITS:
        ar = [r["allreduce_ms"] for r in rows if r["gbit_s"] == gbit]
        ring = {r["ring_ms"] for r in rows if r["gbit_s"] == gbit}
        assert ar == sorted(ar)  # all-reduce's latency term grows with n …
        assert len(ring) == 1  # … gossip's does not depend on n
    for r in rows:  # fewer bytes, never slower; never faster than the compute (overlap on)
        assert r["exp_ms"] <= r["ring_ms"]
        assert r["exp_bf16_ms"] <= r["exp_ms"]
        assert r["ring_bf16_ms"] <= r["ring_ms"]
        assert min(r["allreduce_ms"], r["exp_bf16_ms"]) >= 10.0


def test_with_latency_replaces_both_alphas_and_keeps_the_rest() -> None:
    m = _model().with_latency(20e-6)
    assert (m.allreduce.alpha, m.gossip.alpha) == (20e-6, 20e-6)
    assert (m.allreduce.beta, m.gossip.beta, m.compute_s) == (3e-10, 5e-10, 0.01)


def test_the_crossover_is_where_gossip_first_beats_allreduce() -> None:
    m = _model()
    for gbit in GBITS:
        n = crossover(m, gbit, "exp")
        assert n is not None
        rate = gbit * 1e9 / 8
        gossip = m.step_s(m.gossip_s(rate, 1), overlap=True)
        assert gossip < m.step_s(m.allreduce_s(n, rate), overlap=True)
        if n > 2:
            assert gossip >= m.step_s(m.allreduce_s(n // 2, rate), overlap=True)
    # without per-message latency, all-reduce's bandwidth term (2(n−1)/n·M) stays below the
    # ring gossip's (2M): never a crossover
    assert crossover(_model(alpha_ar=0.0), 10.0, "ring") is None


def test_the_command_measures_and_prints_its_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sizes", "0.25,1", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    got = json.loads(out[-1])
    assert got["sizes_mib"] == [0.25, 1.0]
    assert got["compute_ms"] > 0
    assert got["model_mb"] > 4.0  # the benches' 1.09M-parameter MLP in float32
    assert set(got["crossover_n"]) == {
        f"{c}@{g:g}gbit" for c in ("ring", "exp", "exp_bf16") for g in GBITS
    }
    assert set(got["crossover_n_dc_alpha"]) == set(got["crossover_n"])
    assert any(line.startswith("fit Concord") for line in out)


# -- the latency term (bench/edge.py --map) --------------------------------------------------------

RTT, RATE = 0.060, 20e6 / 8  # the `edge` profile's path: 60 ms round trip, 20 Mbit/s


def test_ring_allreduce_pays_2n_minus_2_latencies_and_2n_minus_2_over_n_of_the_bytes() -> None:
    path = WanPath(RTT, RATE)
    n, d, o = 8, 46_100.0, 1e-3
    # closed form, gloo's handshake of two one-way delays per hop: 14 · (60 ms + 1 ms) + 14/8 · d/R
    expected = 2 * (n - 1) * (2 * RTT / 2 + o) + 2 * (n - 1) / n * d / RATE
    assert ring_allreduce_wan_s(n, d, path, o) == pytest.approx(expected, rel=1e-12)
    # an eager protocol (one one-way delay per hop) pays half the latency term
    eager = ring_allreduce_wan_s(n, d, path, 0.0, handshake=1)
    assert eager == pytest.approx(2 * (n - 1) * RTT / 2 + 2 * (n - 1) / n * d / RATE, rel=1e-12)
    # buckets multiply the latency term only
    three = ring_allreduce_wan_s(n, d, path, o, buckets=3)
    assert three == pytest.approx(3 * 2 * (n - 1) * (RTT + o) + 2 * (n - 1) / n * d / RATE)


def test_gossip_pays_one_one_way_delay_and_one_message() -> None:
    d = 46_100.0
    assert gossip_wan_s(d, WanPath(RTT, RATE), 2e-3) == pytest.approx(RTT / 2 + 2e-3 + d / RATE)
    # a token bucket lets its burst through at once: only the rest waits for the rate
    burst = tbf_burst(20.0)
    assert burst == 32 * 1024  # 4 ms at 20 Mbit/s is 10 kB: the 32 KiB floor
    got = gossip_wan_s(d, WanPath(RTT, RATE, burst))
    assert got == pytest.approx(RTT / 2 + (d - burst) / RATE)
    assert gossip_wan_s(1000.0, WanPath(RTT, RATE, burst)) == pytest.approx(RTT / 2)


def test_tbf_burst_and_ddp_buckets_follow_their_sources() -> None:
    assert tbf_burst(1000.0) == 500_000  # 4 ms at 125 MB/s
    assert tbf_burst(0.1, mtu=65_000) == 65_064  # one frame at least
    mib = 1 << 20
    sizes = (92_200, mib, mib + 1, 26 * mib, 26 * mib + 1)
    assert [ddp_buckets(b) for b in sizes] == [1, 1, 2, 2, 3]


def test_wan_path_refuses_a_zero_rate() -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        WanPath(0.01, 0.0)


def test_edge_model_calibrates_its_floors_and_predicts_the_path_terms() -> None:
    model = EdgeModel(n=8, params=23_050)
    fast, slow = WanPath(0.001, 125e6, tbf_burst(1000)), WanPath(0.080, RATE, tbf_burst(20))
    cal = model.calibrate(fast, ddp_s=0.030, gossip_s=0.008)
    # exact at the calibration path (float rounding only)
    assert cal.ddp_fp16_s(fast) == pytest.approx(0.030, rel=1e-9)
    assert cal.gossip_bf16_s(fast) == pytest.approx(0.008, rel=1e-9)
    # elsewhere: the floors plus that path's terms; DDP fp16 sends 2 bytes per parameter in one
    # bucket (92 kB of fp32 gradients), 14 hops of 2 one-way delays; chunks of 5.8 kB pass within
    # the bucket, so no serialization term remains
    assert cal.ddp_fp16_s(slow) == pytest.approx(cal.ddp_floor_s + 14 * 0.080, rel=1e-9)
    d = 2 * 23_050
    gossip = cal.gossip_floor_s + 0.040 + (d - tbf_burst(20)) / RATE
    assert cal.gossip_bf16_s(slow) == pytest.approx(gossip, rel=1e-9)
    # a measurement faster than the path term alone gives a floor of 0, not a negative one
    assert model.calibrate(slow, ddp_s=0.1, gossip_s=0.001).ddp_floor_s == 0.0
