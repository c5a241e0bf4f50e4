"""``bench/cost_model.py``: the α–β fits recover known constants, the model's predictions have
the shape the model claims, and the command measures and prints its JSON line."""

from __future__ import annotations

import json

import pytest

from bench.cost_model import (
    GBITS,
    PEERS,
    Fit,
    Model,
    crossover,
    fit_line,
    fit_ring_allreduce,
    main,
    predictions,
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
