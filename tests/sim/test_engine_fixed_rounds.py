"""``control.mode = "fixed"`` in the vectorized engine: every step of a controlled phase runs
exactly ``control.rounds`` gossip rounds with the phase's matrices, the records and the summary
count them (rounds and bytes), and no calibration pass runs.

Tolerance: the parameters after one step equal the uncontrolled step's mixed R − 1 more times by
hand (float64 products of the topology matrix) to 1e-6 — the engine mixes in float32 with W cast
to float32 (1/3 → 1/3 · (1 + ~3e-8)); two extra rounds of float32 products on parameters of
magnitude < 10 stay below 1e-6 per coordinate, while one round more or fewer moves them by ~1e-2.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from concord.core.config import load_config
from concord.sim.engine import Trainer, run

torch.set_num_threads(1)

TINY = [  # tests/sim/test_engine_overlap.py's: 10 steps, phases [0, 5) [5, 8) [8, 10)
    "peers=4",
    "dataset.samples=800",
    "model=mlp",
    "model.hidden=[32]",
    "epochs=1",
    "optim.warmup=0",  # η > 0 from the first step
]
FIXED = ["control.mode=fixed", "control.rounds=3"]  # control.phases = [1]: steps 0 … 4


def _trainer(*extra: str) -> Trainer:
    return Trainer(load_config(None, [*TINY, *extra], environ={}))


def _ring4() -> np.ndarray:
    """Metropolis weights of the ring of 4 (every degree 2): 1/3 to itself and each neighbour."""
    W = np.zeros((4, 4))
    for i in range(4):
        for j in (i - 1, i, i + 1):
            W[i, j % 4] = 1.0 / 3.0
    return W


def test_dsgd_runs_exactly_three_rounds_per_step_of_the_controlled_phase() -> None:
    trainer = _trainer(*FIXED)
    assert trainer.controller.calibration is None
    records = [trainer.train_step(step).to_json() for step in range(trainer.total_steps)]
    phases = [r["phase"] for r in records]
    assert phases == [1] * 5 + [2] * 3 + [3] * 2
    assert [r["rounds"] for r in records] == [3] * 5 + [1] * 5  # phase 1 only (control.phases)
    assert all(r["target"] is None for r in records)  # no target: not consensus control
    assert trainer.rounds_total == 5 * 3 + 5
    # every round sends the model once over each of the ring's 8 directed edges (raw float32)
    per_round = 8 * trainer.task.x.shape[1] * 4
    sent = np.diff([0] + [r["bytes_sent"] for r in records])
    assert sent.tolist() == [3 * per_round] * 5 + [per_round] * 5


def test_one_step_is_the_plain_step_mixed_twice_more_with_the_same_w() -> None:
    """D-SGD: x¹ = W³ (x⁰ − η d); the uncontrolled run gives W (x⁰ − η d) from the same x⁰ and
    gradients, so the fixed run must be W² times it."""
    W = _ring4()
    plain, fixed = _trainer("control.mode=none"), _trainer(*FIXED)
    np.testing.assert_allclose(fixed.schedules.get(fixed.plan.phases[0]).matrix(0), W, atol=1e-15)
    torch.testing.assert_close(plain.task.x, fixed.task.x, rtol=0, atol=0)  # same x⁰
    assert plain.train_step(0).to_json()["rounds"] == 1
    assert fixed.train_step(0).to_json()["rounds"] == 3
    once = plain.task.x.double().numpy()
    by_hand = torch.from_numpy(W @ W @ once)
    torch.testing.assert_close(fixed.task.x.double(), by_hand, rtol=0, atol=1e-6)
    # and not a step with one round more or fewer
    assert float((fixed.task.x.double() - torch.from_numpy(W @ once)).abs().max()) > 1e-4
    assert float((fixed.task.x.double() - torch.from_numpy(W @ by_hand.numpy())).abs().max()) > 1e-4


def test_sgp_pushes_twice_per_step_with_the_next_directed_matrix() -> None:
    """SGP on the directed one-peer exponential graph of 4 (i keeps ½ and pushes ½ to
    i + 2^(k mod 2) in round k), two rounds per step: P¹ after P⁰, the push-sum weights mixed
    along (they stay 1 here: each P^k is doubly stochastic, tests/core/test_sgp.py)."""
    sgp = ["algorithm=sgp", "topology=exponential-one-peer-directed"]
    plain = _trainer(*sgp, "control.mode=none")
    fixed = _trainer(*sgp, "control.mode=fixed", "control.rounds=2")
    P = []
    for k in (0, 1):
        Pk = np.eye(4) / 2
        for i in range(4):
            Pk[(i + 2**k) % 4, i] = 0.5
        np.testing.assert_array_equal(fixed.schedules.get(fixed.plan.phases[0]).matrix(k), Pk)
        P.append(Pk)
    assert not np.array_equal(P[0], P[0].T)  # directed (P¹ is symmetric for n = 4: i ± 2)
    assert plain.train_step(0).to_json()["rounds"] == 1
    record = fixed.train_step(0).to_json()
    assert (record["rounds"], fixed.rounds_total) == (2, 2)
    w_plain = plain.algorithm.weights  # type: ignore[attr-defined]
    numerators = plain.task.x.double().numpy() * w_plain[:, None]  # x = w z after round 0
    w = P[1] @ w_plain
    by_hand = torch.from_numpy((P[1] @ numerators) / w[:, None])
    np.testing.assert_allclose(fixed.algorithm.weights, w, rtol=0, atol=1e-12)  # type: ignore[attr-defined]
    torch.testing.assert_close(fixed.task.x.double(), by_hand, rtol=0, atol=1e-6)
    assert float((fixed.task.x.double() - plain.task.x.double()).abs().max()) > 1e-4
    # the next step goes on with P⁰, P¹ again (round indices 2, 3 of the period-2 schedule)
    assert fixed.train_step(1).to_json()["rounds"] == 2
    assert fixed.rounds_total == 4


def test_run_summary_counts_rounds_and_bytes_and_skips_calibration(tmp_path: Path) -> None:
    cfg = load_config(None, [*TINY, *FIXED, "control.phases=[1, 2, 3]"], environ={})
    summary = run(cfg, tmp_path / "run", progress=False, plots=False)
    assert not (tmp_path / "run" / "calibration.json").exists()
    assert not (tmp_path / "run" / "calibration").exists()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    assert [r["rounds"] for r in steps] == [3] * 10  # every phase listed: every step
    assert summary["gossip_rounds_total"] == 30 == steps[-1]["rounds_total"]
    d = json.loads((tmp_path / "run" / "manifest.json").read_text())["parameters"]
    # 30 rounds × 8 directed edges × d float32 values, as recorded by the last step
    assert summary["bytes_sent_total"] == 30 * 8 * 4 * d == steps[-1]["bytes_sent"]
    assert (summary["control_mode"], summary["control_factor"]) == ("fixed", None)
