"""`concord.core.graphs.adagraph`: the two Ada interpretations — the feedback controller (decisions,
hysteresis, clamping, lag, gaps), the dense → sparse schedule, hyperparameter validation, and the
config errors of ada-schedule / ada-feedback."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from concord.core.algorithms import ALGORITHMS, LocalSGD, SGDConfig, make_algorithm
from concord.core.config import ConfigError, load_config
from concord.core.graphs.adagraph import (
    FeedbackConfig,
    FeedbackDecision,
    GraphFeedback,
    default_graphs,
    feedback_config,
    hyper_problems,
    initial_topologies,
    schedule_graphs,
)

ROOT = Path(__file__).resolve().parents[2]


def feed(fb: GraphFeedback, step: int, theta: float, grad: float = 1.0, phase: int = 1) -> list:
    """One step where every replica has Θ_t = theta (θ_i = theta²) and ‖g_i‖ = grad."""
    return fb.observe(step, phase, [theta * theta] * 4, [grad] * 4)


def controller(**kw: object) -> GraphFeedback:
    base: dict[str, object] = {"every": 2, "factor": 1.0, "ema": 0.0, "hysteresis": 0.5, "lag": 1}
    base.update(kw)
    return GraphFeedback(FeedbackConfig(**base), n=16)  # type: ignore[arg-type]


# -- decisions -----------------------------------------------------------------------------------


def test_decides_only_at_decision_points_on_the_window_mean() -> None:
    fb = controller(k0=2, every=3)
    assert feed(fb, 0, 2.0) == []
    assert feed(fb, 1, 0.0) == []
    (d,) = feed(fb, 2, 1.6)  # (2 + 0 + 1.6) / 3 = 1.2 > target 1
    assert (d.step, d.effective, d.k_from, d.k_to, d.reason) == (2, 3, 2, 3, "denser")
    assert d.theta == pytest.approx(1.2)
    assert d.target == 1.0
    assert d.steps == 3
    assert feed(fb, 3, 0.7) == []
    assert feed(fb, 4, 0.7) == []
    (d,) = feed(fb, 5, 0.7)  # 0.7 ∈ [0.5, 1]: the dead band keeps K
    assert (d.k_from, d.k_to, d.reason) == (3, 3, "in-band")
    feed(fb, 6, 0.3)
    feed(fb, 7, 0.3)
    (d,) = feed(fb, 8, 0.3)  # below hysteresis × target
    assert (d.k_from, d.k_to, d.reason) == (3, 2, "sparser")
    assert [x.step for x in fb.decisions] == [2, 5, 8]


def test_hysteresis_one_has_no_dead_band_and_equality_keeps_k() -> None:
    fb = controller(k0=2, hysteresis=1.0)
    feed(fb, 0, 1.0)
    (d,) = feed(fb, 1, 1.0)  # Θ̄ == target: neither above nor below
    assert d.reason == "in-band"
    assert d.k_to == 2
    feed(fb, 2, 0.999)
    (d,) = feed(fb, 3, 0.999)
    assert d.reason == "sparser"
    assert d.k_to == 1


def test_k_is_clamped_to_one_and_ceil_log2_n() -> None:
    fb = controller(k0=4)  # n = 16: the densest is exponential:4
    assert fb.k_max == 4
    feed(fb, 0, 9.0)
    (d,) = feed(fb, 1, 9.0)
    assert (d.k_to, d.reason) == (4, "densest")
    fb = controller(k0=1)
    feed(fb, 0, 0.0)
    (d,) = feed(fb, 1, 0.0)
    assert (d.k_to, d.reason) == (1, "sparsest")


def test_a_decision_takes_effect_lag_steps_later() -> None:
    fb = controller(k0=2, lag=2, every=2)
    feed(fb, 0, 5.0)
    (d,) = feed(fb, 1, 5.0)
    assert (d.step, d.effective, d.k_to) == (1, 3, 3)
    assert [fb.k_at(s) for s in range(5)] == [2, 2, 2, 3, 3]
    assert [fb.topology(s) for s in (2, 3)] == ["exponential:2", "exponential:3"]
    feed(fb, 2, 5.0)
    feed(fb, 3, 5.0)  # decided at 3 → in force from 5
    assert [fb.k_at(s) for s in range(3, 7)] == [3, 3, 4, 4]


def test_decision_schedule_arithmetic() -> None:
    c = FeedbackConfig(every=3, lag=2)
    assert [s for s in range(12) if c.is_decision_point(s)] == [2, 5, 8, 11]
    assert [c.decided_for(t) for t in range(9)] == [None] * 4 + [2, None, None, 5, None]
    assert [c.in_force(t) for t in range(10)] == [None] * 4 + [2, 2, 2, 5, 5, 5]


def test_target_is_factor_times_an_ema_reset_at_each_phase() -> None:
    fb = controller(factor=0.5, ema=0.5, every=100)
    feed(fb, 0, 1.0, grad=4.0)
    assert fb.target() == 2.0  # initialised with the first value
    feed(fb, 1, 1.0, grad=2.0)
    assert fb.target() == 0.5 * (0.5 * 4.0 + 0.5 * 2.0)
    feed(fb, 2, 1.0, grad=10.0, phase=2)  # a new phase starts over
    assert fb.target() == 5.0


def test_statistics_use_fsum_means_of_the_replicas() -> None:
    fb = controller(every=1, factor=1.0)
    thetas = [0.1, 0.2, 0.3, 1e-17]
    grads = [0.3, 0.1, 0.2, 0.4]
    (d,) = fb.observe(0, 1, thetas, grads)
    assert d.theta == math.sqrt(math.fsum(thetas) / 4)
    assert d.target == math.fsum(grads) / 4


def test_skipped_decision_points_are_decided_on_what_their_window_holds() -> None:
    fb = controller(k0=2, every=2)
    feed(fb, 0, 5.0)
    decisions = feed(fb, 4, 5.0)  # steps 1–3 never observed (lost statistics)
    assert [(d.step, d.steps, d.k_to) for d in decisions] == [(1, 1, 3), (3, 0, 3)]
    assert decisions[1].reason == "no-statistics"
    (d,) = feed(fb, 5, 5.0)
    assert (d.step, d.steps) == (5, 2)


def test_observe_rejects_out_of_order_steps_and_bad_values() -> None:
    fb = controller()
    feed(fb, 3, 1.0)
    with pytest.raises(ValueError, match="in order"):
        feed(fb, 3, 1.0)
    with pytest.raises(ValueError, match="empty"):
        fb.observe(4, 1, [], [1.0])
    with pytest.raises(ValueError, match=r"thetas \(step 4\)\[1\]"):
        fb.observe(4, 1, [1.0, math.nan], [1.0, 1.0])
    with pytest.raises(ValueError, match="grad_norms"):
        fb.observe(4, 1, [1.0], [-1.0])


def test_state_dict_round_trip_continues_exactly() -> None:
    """A controller loaded from another's `state_dict` mid-run (a resumed run) takes the same
    decisions from then on; the state is plain containers (checkpoints load weights-only)."""
    thetas = [2.0, 0.0, 1.6, 0.7, 0.7, 0.7, 0.3, 0.3, 0.3, 1.9, 1.9, 1.9]
    ema = {"k0": 2, "every": 3, "ema": 0.5}
    whole, first = controller(**ema), controller(**ema)
    for step, theta in enumerate(thetas):
        feed(whole, step, theta)
    for step, theta in enumerate(thetas[:5]):  # stopped mid-window
        feed(first, step, theta)
    state = first.state_dict()
    assert json.loads(json.dumps(state)) == state
    resumed = controller(**ema)
    resumed.load_state_dict(state)
    for step, theta in enumerate(thetas[5:], start=5):
        feed(resumed, step, theta)
    assert resumed.decisions == whole.decisions
    assert [resumed.k_at(s) for s in range(14)] == [whole.k_at(s) for s in range(14)]
    assert resumed.target() == whole.target()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"k": "two"}, "k"),
        ({"changes": [[5]]}, "changes.0.1"),
        ({"decisions": [{"step": 3}]}, "decisions.0.effective"),
        ({"window": None}, "window"),
    ],
)
def test_a_bad_state_names_its_field(change: dict[str, object], field: str) -> None:
    first = controller(k0=2, every=3, ema=0.5)
    for step, theta in enumerate([2.0, 0.0, 1.6, 0.7]):
        feed(first, step, theta)
    state = {**first.state_dict(), **change}
    with pytest.raises(ValueError, match=f"ada-feedback state field '{field}'"):
        controller(k0=2, every=3, ema=0.5).load_state_dict(state)  # type: ignore[arg-type]


def test_decision_json() -> None:
    d = FeedbackDecision(3, 5, 2, 3, 0.5, 0.25, 2, "denser")
    assert d.to_json() == {
        "kind": "graph",
        "step": 3,
        "effective": 5,
        "k_from": 2,
        "k_to": 3,
        "theta": 0.5,
        "target": 0.25,
        "steps": 2,
        "reason": "denser",
    }


# -- hyperparameters -----------------------------------------------------------------------------


def test_feedback_defaults_and_k_start() -> None:
    c = FeedbackConfig()
    assert (c.every, c.factor, c.ema, c.hysteresis, c.k0, c.lag) == (20, 0.25, 0.9, 0.5, None, 2)
    assert c.k_start(16) == 4
    assert c.k_start(17) == 5
    assert c.k_start(2) == 1
    assert FeedbackConfig(k0=2).k_start(8) == 2
    with pytest.raises(ValueError, match=r"hyper.k0 = 4 exceeds ceil\(log2 n\) = 3"):
        FeedbackConfig(k0=4).k_start(8)


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"every": 0}, r"hyper.every = 0; must be an integer >= 1"),
        ({"every": 2.5}, r"hyper.every = 2.5"),
        ({"factor": 0}, r"hyper.factor = 0; must be a finite number > 0"),
        ({"factor": math.inf}, r"hyper.factor = inf"),
        ({"ema": 1.0}, r"hyper.ema = 1.0; the EMA coefficient must be in \[0, 1\)"),
        ({"hysteresis": 0.0}, r"hyper.hysteresis = 0.0; must be in \(0, 1\]"),
        ({"hysteresis": 1.5}, r"hyper.hysteresis = 1.5"),
        ({"k0": 0}, r"hyper.k0 = 0; must be an integer >= 1"),
        ({"k0": True}, r"hyper.k0 = True"),
        ({"lag": 0}, r"hyper.lag = 0; must be an integer >= 1"),
        ({"lag": 3, "every": 2}, r"hyper.lag = 3 exceeds hyper.every = 2"),
    ],
)
def test_feedback_config_errors(kw: dict[str, object], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        FeedbackConfig(**kw)  # type: ignore[arg-type]


def test_feedback_config_reports_every_problem_and_unknown_keys() -> None:
    with pytest.raises(ValueError) as exc:
        FeedbackConfig(every=0, factor=-1.0, ema=2.0)
    assert all(k in str(exc.value) for k in ("hyper.every", "hyper.factor", "hyper.ema"))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['evry'\] for ada-feedback"):
        feedback_config({"evry": 3})
    problems = hyper_problems("ada-feedback", {"evry": 3, "every": 0}, 8, 3)
    assert len(problems) == 2
    assert "evry" in problems[0]
    assert "hyper.every" in problems[1]


def test_algorithm_constructors_check_their_hyperparameters() -> None:
    import torch

    opt = LocalSGD(SGDConfig(), torch.ones(1))
    assert make_algorithm("ada-feedback", opt, every=5, lag=1).feedback.every == 5  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"hyper\.hysteresis"):
        make_algorithm("ada-feedback", opt, hysteresis=2.0)
    with pytest.raises(ValueError, match="accepts"):
        make_algorithm("ada-feedback", opt, graphs=["ring"])
    with pytest.raises(ValueError, match="must be a list of topology names"):
        make_algorithm("ada-schedule", opt, graphs="ring")
    assert {"ada-schedule", "ada-feedback"} <= set(ALGORITHMS.names())


# -- interpretation (a): the dense → sparse schedule ---------------------------------------------


def test_default_graphs_go_dense_to_sparse() -> None:
    assert default_graphs(16, 3) == ["exponential:4", "exponential:2", "ring"]
    assert default_graphs(8, 4) == ["exponential:3", "exponential:2", "exponential:1", "ring"]
    assert default_graphs(64, 2) == ["exponential:6", "ring"]
    assert default_graphs(16, 1) == ["exponential:4"]
    assert default_graphs(2, 2) == ["exponential:1", "ring"]


def test_schedule_graphs_checks_names_for_n_and_phases(tmp_path: Path) -> None:
    edges = tmp_path / "g.txt"
    edges.write_text("0 1\n1 2\n2 3\n3 0\n")
    graphs = ["complete", "exponential:2", f"file:{edges}"]
    assert schedule_graphs(graphs, 4, 3) == graphs
    assert schedule_graphs(None, 4, 3) == default_graphs(4, 3)
    with pytest.raises(ValueError) as exc:
        schedule_graphs(["exponential:3", "torsu", "exponential-one-peer-directed"], 4, 2)
    msg = str(exc.value)
    assert "lists 3 topologies for 2 phase(s)" in msg
    assert "hyper.graphs[0] (phase 1): topology 'exponential:3' needs K <= ceil(log2 n) = 2" in msg
    assert "hyper.graphs[1] (phase 2): unknown topology 'torsu'" in msg
    assert "hyper.graphs[2] (phase 3): 'exponential-one-peer-directed' is directed" in msg
    with pytest.raises(ValueError, match="not found"):
        schedule_graphs(["file:/nonexistent/graph.txt"], 4, 1)
    with pytest.raises(ValueError, match="entries must be topology names"):
        schedule_graphs(["ring", 3], 4, 2)  # type: ignore[list-item]


def test_initial_topologies() -> None:
    assert initial_topologies("ada-schedule", {}, 8, 3) == {
        1: "exponential:3",
        2: "exponential:2",
        3: "ring",
    }
    assert initial_topologies("ada-feedback", {"k0": 2}, 8, 2) == {
        1: "exponential:2",
        2: "exponential:2",
    }
    assert initial_topologies("dsgd", {}, 8, 3) == {}


# -- config ----------------------------------------------------------------------------------------


def config_problems(*overrides: str) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(None, ["peers=8", *overrides], environ={})
    return str(exc.value)


def test_ada_configs_load_with_defaults() -> None:
    for name in ("ada-schedule", "ada-feedback"):
        cfg = load_config(None, ["peers=8", f"algorithm={name}"], environ={})
        assert cfg.algorithm == name
        assert "topology" not in cfg.to_dict()  # unused, and must stay unset when reloaded
    cfg = load_config(None, ["peers=8", "algorithm=ada-feedback"], environ={})
    assert cfg.controlled_phases() == []  # the default control is inert for ada-feedback
    cfg = load_config(
        None, ["peers=8", "algorithm=ada-schedule", "control.mode=adaptive"], environ={}
    )
    assert cfg.controlled_phases() == [1]  # ada-schedule combines with consensus control


def test_ada_feedback_config_errors() -> None:
    msg = config_problems(
        "algorithm=ada-feedback",
        "control.mode=adaptive",
        "topology=torus",
        "plan=dec-phase-1",
        "hyper.k0=5",
    )
    assert "control.mode: ada-feedback moves its graph from the same Θ" in msg
    assert "topology: algorithm 'ada-feedback' chooses its graphs" in msg
    assert "plan 'dec-phase-1': algorithm 'ada-feedback' chooses the gossip graph" in msg
    assert "hyper.k0 = 5 exceeds ceil(log2 n) = 3 for n = 8" in msg
    msg = config_problems("algorithm=ada-feedback", "hyper.every=4", "hyper.lag=5")
    assert "hyper.lag = 5 exceeds hyper.every = 4" in msg


def test_ada_schedule_config_errors() -> None:
    msg = config_problems(
        "algorithm=ada-schedule",
        'phase_topologies=["ring", "ring", "ring"]',
        'hyper.graphs=["exponential:4", "ring"]',
        "hyper.rounds=2",
    )
    assert "phase_topologies: algorithm 'ada-schedule' chooses its graphs (hyper.graphs)" in msg
    assert "hyper: unknown key(s) ['rounds'] for ada-schedule; valid: ['graphs']" in msg
    assert "hyper.graphs lists 2 topologies for 3 phase(s)" in msg
    assert "'exponential:4' needs K <= ceil(log2 n) = 3" in msg


def test_exponential_k_topology_config() -> None:
    cfg = load_config(None, ["peers=8", "topology=exponential:2"], environ={})
    assert cfg.topology == "exponential:2"
    assert "needs K <= ceil(log2 n) = 3 for n=8" in config_problems("topology=exponential:4")
    msg = config_problems('phase_topologies=["exponential:1", "exponential:9", "ring"]')
    assert "'exponential:9' needs K" in msg
    assert "K in 'exponential:K' must be an integer >= 1" in config_problems(
        "topology=exponential:0"
    )


def test_module_is_torch_free() -> None:
    code = (
        "import sys, concord.core.graphs.adagraph, concord.orchestrator.graphs; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
