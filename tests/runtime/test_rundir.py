"""`concord.runtime.rundir.RunWriter`: one writer for engine and peer run directories."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from concord.core.config import load_config
from concord.core.records import CheckpointRunState, CounterState, RecordError
from concord.runtime.rundir import RunWriter, load_checkpoint, run_state_of


def test_flush_every_line_leaves_each_record_on_disk(tmp_path: Path) -> None:
    cfg = load_config(None, ["peers=2"], environ={})
    writer = RunWriter(tmp_path / "peer-0", cfg, run="r", flush_every=1, peer=0)
    writer.metric({"kind": "step", "step": 0})
    on_disk = (tmp_path / "peer-0" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in on_disk] == [0]  # before finish
    writer.finish({"completed": True}, plots=False)
    assert json.loads((tmp_path / "peer-0" / "summary.json").read_text()) == {"completed": True}
    log = [
        json.loads(line) for line in (tmp_path / "peer-0" / "log.jsonl").read_text().splitlines()
    ]
    assert {e["event"] for e in log} >= {"run.start", "run.finish"}
    assert all(e["run"] == "r" and e["peer"] == 0 for e in log)


def test_buffered_writer_flushes_at_finish(tmp_path: Path) -> None:
    cfg = load_config(None, [], environ={})
    writer = RunWriter(tmp_path / "run", cfg)
    for step in range(3):
        writer.metric({"step": step})
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""  # buffered (200 lines)
    writer.finish({}, plots=False)
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3


def test_checkpoint_is_replaced_atomically_and_loads_without_pickle(tmp_path: Path) -> None:
    cfg = load_config(None, [], environ={})
    writer = RunWriter(tmp_path / "run", cfg)
    task = SimpleNamespace(
        x=torch.arange(6.0).reshape(1, 6), flat=SimpleNamespace(buffers_flat=lambda: None)
    )
    algorithm = SimpleNamespace(state_dict=lambda: {"m": torch.ones(1, 6)})
    writer.save_checkpoint(task, algorithm, 4)
    task.x = task.x + 1
    path = writer.save_checkpoint(task, algorithm, 9)
    assert not list((tmp_path / "run").glob("*.tmp"))
    state = load_checkpoint(path)  # torch.load(weights_only=True)
    assert int(state["step"]) == 9
    assert torch.equal(state["params"], task.x)
    assert torch.equal(state["algorithm"]["m"], torch.ones(1, 6))
    writer.close()


def test_keeping_the_previous_checkpoint_never_leaves_checkpoint_pt_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer killed while it rotates its checkpoints must still have ``checkpoint.pt`` (a
    restart, and whoever reads it, looks there first): every rename of the rotation happens
    while it exists, and the previous one ends up as ``checkpoint.prev.pt``."""
    import os

    cfg = load_config(None, [], environ={})
    run = tmp_path / "run"
    writer = RunWriter(run, cfg)
    task = SimpleNamespace(x=torch.zeros(1, 6), flat=SimpleNamespace(buffers_flat=lambda: None))
    algorithm = SimpleNamespace(state_dict=dict)
    writer.save_checkpoint(task, algorithm, 4, keep_previous=True)
    real = os.replace
    seen: list[str] = []

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(Path(dst).name)
        assert (run / "checkpoint.pt").is_file(), f"checkpoint.pt missing before {dst}"
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    writer.save_checkpoint(task, algorithm, 9, keep_previous=True)
    monkeypatch.setattr(os, "replace", real)
    assert seen == ["checkpoint.prev.pt", "checkpoint.pt"]
    assert int(load_checkpoint(run / "checkpoint.pt")["step"]) == 9
    assert int(load_checkpoint(run / "checkpoint.prev.pt")["step"]) == 4
    assert not list(run.glob("*.tmp"))
    writer.close()


def test_checkpoint_holds_run_state_and_rng_and_flushes_metrics(tmp_path: Path) -> None:
    from concord.runtime.rundir import restore_checkpoint

    cfg = load_config(None, ["peers=2"], environ={})
    writer = RunWriter(tmp_path / "run", cfg)
    loaded: dict[str, object] = {}
    task = SimpleNamespace(
        x=torch.arange(6.0).reshape(2, 3),
        flat=SimpleNamespace(buffers_flat=lambda: None),
        rng_state=lambda: {"sampler": {"seed": 3, "ranks": [0, 1]}, "gen": torch.ones(4)},
        load_rng_state=lambda s: loaded.update(rng=s),
    )
    algorithm = SimpleNamespace(
        state_dict=lambda: {"m": torch.ones(2, 3)}, load_state_dict=lambda s: loaded.update(alg=s)
    )
    writer.metric({"kind": "step", "step": 0})
    counters = CounterState(
        bytes_raw=12, bytes_wire=12, messages=1, rounds=1, edges=[(0, 1, 12, 12)]
    )
    run_state = CheckpointRunState(
        engine="vectorized", next_step=1, total_steps=4, rounds_total=1, counters=counters
    )
    path = writer.save_checkpoint(task, algorithm, 0, run_state=run_state)
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 1  # flushed first
    state = load_checkpoint(path)  # weights_only=True: plain containers only
    assert state["run"] == run_state.to_json()
    assert run_state_of(state, path) == run_state
    assert state["rng"]["sampler"] == {"seed": 3, "ranks": [0, 1]}
    task.x.zero_()
    restore_checkpoint(state, task, algorithm)
    assert torch.equal(task.x, torch.arange(6.0).reshape(2, 3))
    assert torch.equal(loaded["alg"]["m"], torch.ones(2, 3))  # type: ignore[index]
    assert loaded["rng"] == state["rng"]
    writer.close()


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ([torch.ones(2)], ""),
        ({"version": 2, "params": torch.ones(1, 3), "algorithm": {}}, "step"),
        ({"version": 2, "step": torch.tensor(3), "params": [1.0], "algorithm": {}}, "params"),
    ],
)
def test_a_file_that_is_no_checkpoint_table_is_named(
    tmp_path: Path, table: object, field: str
) -> None:
    path = tmp_path / "checkpoint.pt"
    torch.save(table, path)
    with pytest.raises(RecordError, match=r"checkpoint\.pt") as info:
        load_checkpoint(path)
    assert info.value.field == field


def test_resumed_writer_drops_later_lines_and_appends(tmp_path: Path) -> None:
    cfg = load_config(None, [], environ={})
    writer = RunWriter(tmp_path / "run", cfg, flush_every=1)
    for step in range(5):
        writer.metric({"kind": "step", "step": step})
        if step % 2:
            writer.metric({"kind": "eval", "step": step})
    writer.close()
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "st')  # torn by a crash
    again = RunWriter(tmp_path / "run", cfg, flush_every=1, resume_after=2)
    again.metric({"kind": "step", "step": 3})
    again.close()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in lines] == [
        ("step", 0),
        ("step", 1),
        ("eval", 1),
        ("step", 2),
        ("step", 3),
    ]
    log = (tmp_path / "run" / "log.jsonl").read_text()
    assert "run.start" in log
    assert "run.resume" in log  # the log is appended to
