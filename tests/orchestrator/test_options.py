"""`concord.orchestrator.options`: the config resolved once into what each part of the
orchestrator reads."""

from __future__ import annotations

from concord.core.config import load_config
from concord.orchestrator.options import STALE_SLACK, OrchestratorOptions


def test_the_config_is_resolved_into_each_parts_options() -> None:
    cfg = load_config(
        None,
        [
            "peers=5",
            "topology=exponential",
            "seed=3",
            "orchestrator.liveness_timeout=7.5",
            "orchestrator.heartbeat=0.25",
            "orchestrator.broker=mqtt://config:1883",
            "network.startup_timeout=40",
            "control.mode=constant",
            "control.phases=[1]",
            "control.lagged=true",
            "control.lag=2",
        ],
        environ={},
    )
    o = OrchestratorOptions.resolve(cfg, run_id="r", broker=None)
    assert (o.run_id, o.broker, o.startup_timeout) == ("r", "mqtt://config:1883", 40.0)
    assert (o.lag, o.calibrate, o.graph_feedback) == (2, True, False)
    a = o.admission
    assert (a.peers, a.liveness_timeout, a.heartbeat) == (5, 7.5, 0.25)
    assert a.stale_after == 40.0 + STALE_SLACK
    assert a.step_deadline == cfg.network.deadline
    s = o.schedules
    assert (s.peers, s.topology, s.seed, s.kappa) == (5, "exponential", 3, cfg.kappa)
    # the command line's broker wins; barrier control has no lag; no controlled phase, no
    # calibration
    plain = load_config(None, ["peers=2", "control.mode=none"], environ={})
    p = OrchestratorOptions.resolve(plain, run_id="r", broker="mqtt://cli:1")
    assert (p.broker, p.lag, p.calibrate) == ("mqtt://cli:1", None, False)
