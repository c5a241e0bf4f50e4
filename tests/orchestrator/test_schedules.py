"""`concord.orchestrator.schedules`, sans-io: the plan message and the schedule versions — the
initial one at step 0, repairs ahead of the newest step, ada-feedback decisions at their step +
lag — built without a broker."""

from __future__ import annotations

from concord.core.config import RunConfig, load_config
from concord.core.control.runplan import make_lr_schedule, make_plan
from concord.core.graphs.adagraph import FeedbackDecision
from concord.orchestrator.options import OrchestratorOptions
from concord.orchestrator.schedules import REPAIR_AHEAD, Schedules, plan_message
from concord.protos.control_plane import Stats

STEPS_PER_EPOCH = 10


def config(*overrides: str) -> RunConfig:
    return load_config(None, ["peers=4", "epochs=2", *overrides], environ={})


def started(cfg: RunConfig) -> Schedules:
    s = Schedules(OrchestratorOptions.resolve(cfg, run_id="t", broker=None).schedules)
    s.start(make_plan(cfg, make_lr_schedule(cfg, STEPS_PER_EPOCH)))
    return s


def test_plan_message_carries_the_plan_and_control_settings() -> None:
    cfg = config("control.mode=constant", "control.phases=[1]")
    lr = make_lr_schedule(cfg, STEPS_PER_EPOCH)
    plan = make_plan(cfg, lr)
    msg = plan_message(cfg, plan, lr)
    assert msg.total_steps == plan.total_steps == 20
    assert msg.phases == plan.to_dict()
    assert msg.lr == lr.to_dict()
    assert msg.control["mode"] == "constant"
    assert msg.control["phases"] == [1]


def test_versions_the_initial_schedule_and_repairs() -> None:
    cfg = config()
    s = started(cfg)
    first = s.next("initial", [0, 1, 2, 3], ["a:1", "b:1", "c:1", "d:1"], newest_step=7)
    assert (first.version, first.effective_step, first.reason) == (1, 0, "initial")
    assert first.peers == [0, 1, 2, 3]
    assert first.topology == cfg.topology
    assert s.plan is not None
    assert [p["index"] for p in first.phases] == [p.index for p in s.plan.phases]
    repair = s.next("peer 2 left", [0, 1, 3], ["a:1", "b:1", "d:1"], newest_step=7)
    assert (repair.version, repair.effective_step) == (2, 7 + REPAIR_AHEAD)
    assert repair.addresses == ["a:1", "b:1", "d:1"]
    assert s.version == 2
    assert Schedules.row(repair) == {
        "version": 2,
        "peers": [0, 1, 3],
        "reason": "peer 2 left",
        "effective_step": 9,
        "topologies": [p["topology"] for p in repair.phases],
        "decided_at": None,
    }


def test_feedback_moves_every_phase_to_the_decided_graph() -> None:
    s = started(config("algorithm=ada-feedback"))
    d = FeedbackDecision(
        step=5, effective=7, k_from=1, k_to=2, theta=2.0, target=1.0, steps=3, reason="denser"
    )
    reason = s.on_feedback(d)
    assert reason == "ada-feedback step 5: K 1 -> 2 (denser)"
    sched = s.next(reason, [0, 1, 2, 3], ["a:1", "b:1", "c:1", "d:1"], 3, effective_step=7)
    assert sched.effective_step == 7
    assert sched.decided_at == 5
    assert {p["topology"] for p in sched.phases} == {"exponential:2"}


def test_graph_statistics_are_the_uncontrolled_train_steps() -> None:
    s = started(config("algorithm=ada-feedback"))
    assert s.plan is not None
    controlled = {p.index for p in s.plan.phases if p.controlled}

    def stats(step: int, stage: str = "train") -> Stats:
        return Stats(peer=0, step=step, round=1, theta=1.0, grad_norm=1.0, stage=stage)

    for step in range(s.plan.total_steps):
        want = s.plan.phase_at(step).index not in controlled
        assert s.is_graph_statistic(stats(step)) == want
    assert not s.is_graph_statistic(stats(s.plan.total_steps))
    assert not s.is_graph_statistic(stats(0, "calibrate"))
