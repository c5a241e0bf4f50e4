"""`concord status`'s view (`concord.lab.status.RunView`) from control-plane messages, and its
errors; the live view of a real run is in tests/integration/test_operators.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from concord.lab.status import RunView, resolve_target
from concord.protos.control_plane import Decision, Heartbeat, Metrics, Plan, Presence, Status


def _view() -> RunView:
    view = RunView("run-1", heartbeat=1.0)
    view.on_message("plan", None, Plan(total_steps=100, phases={}, lr={}, control={}))
    view.on_message("orchestrator", None, Presence(state="online", ts=1.0))
    for i in range(4):
        view.on_message("status", i, Status(peer=i, state="training", step=0))
        values = {"loss": 1.0 + i, "rounds": 2.0, "theta": 0.01, "phase": 1.0}
        view.on_message("metrics", i, Metrics(peer=i, step=40 if i != 2 else 30, values=values))
    view.on_message("decision", None, Decision(step=40, round=1, repeat=False, target=0.02,
                                               statistic=0.015))  # fmt: skip
    return view


def test_the_view_folds_the_messages_and_flags_stragglers() -> None:
    view = _view()
    assert view.total_steps == 100
    assert view.step == 30  # the slowest peer's
    assert view.stragglers() == {2: "10 behind"}
    last = max(r.heard or 0.0 for r in view.peers.values())
    assert view.stragglers(now=last + 5.2) == dict.fromkeys(range(4), "silent 5 s")
    view.on_message("heartbeat", 2, Heartbeat(peer=2, step=39, ts=2.0))
    assert view.stragglers() == {}  # caught up
    snap = view.snapshot()
    assert snap["theta"] == 0.015
    assert snap["peers"]["3"]["loss"] == 4.0
    assert snap["peers"]["3"]["phase"] == 1
    json.dumps(snap)  # plain data


def test_a_peers_accuracy_is_read_under_its_old_and_new_names() -> None:
    view = _view()
    new = {"accuracy_mean_peer": 0.75, "loss_mean_peer": 0.5}  # a peer's `EvalRecord` names
    view.on_message("metrics", 0, Metrics(peer=0, step=39, values=new, event="eval"))
    view.on_message("metrics", 1, Metrics(peer=1, step=39, values={"accuracy": 0.5}, event="eval"))
    peers = view.snapshot()["peers"]
    assert (peers["0"]["accuracy"], peers["1"]["accuracy"], peers["2"]["accuracy"]) == (
        0.75,
        0.5,
        None,
    )


def test_the_view_fits_80_columns() -> None:
    console = Console(width=80, record=True, force_terminal=False)
    console.print(_view().render())
    text = console.export_text()
    assert "step 31/100 (31 %)" in text
    assert "Θ 0.015 / target 0.02" in text
    assert "10 behind" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "training" in text  # not cut to "train…"


def test_a_target_without_a_control_plane_says_so(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="vectorized engine has no control plane"):
        resolve_target(str(tmp_path), None, None)
    with pytest.raises(ValueError, match="pass --run-id"):
        resolve_target("mqtt://127.0.0.1:1883", None, None)
    (tmp_path / "orchestrator.json").write_text('{"broker": "mqtt://127.0.0.1:1", "run": "r"}')
    target = resolve_target(str(tmp_path), None, None)
    assert (target.broker, target.run) == ("mqtt://127.0.0.1:1", "r")


def test_status_of_a_dead_broker_fails_at_once(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    done = subprocess.run(
        [sys.executable, "-m", "concord.lab.cli", "status", f"mqtt://127.0.0.1:{port}",
         "--run-id", "r"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"no MQTT broker answers at mqtt://127.0.0.1:{port}" in done.stderr
