"""``tensorboard = true``: `RunWriter` also writes every metrics record to TensorBoard event files
in ``<run dir>/tensorboard`` (`concord.runtime.rundir.TensorBoardLog`)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from concord.core.config import load_config
from concord.errors import ConcordError
from concord.runtime.rundir import (
    RunWriter,
    TensorBoardUnavailableError,
    tensorboard_scalars,
)
from concord.sim.engine import run

torch.set_num_threads(1)

TINY = [
    "peers=4",
    "dataset.samples=400",
    "model=mlp",
    "model.hidden=[16]",
    "epochs=1",
    "optim.batch_size=16",
    "eval.every=0.5",
    "control.mode=none",
]


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _events(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return acc


def _close(a: float, b: float) -> bool:
    # TensorBoard stores scalars as float32: equal to the JSON's float64 to float32 precision
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)


def test_a_vectorized_run_writes_its_metrics_as_tensorboard_scalars(tmp_path: Path) -> None:
    cfg = load_config(None, [*TINY, "tensorboard=true"], environ={})
    run(cfg, tmp_path / "run", progress=False, plots=False)
    records = _metrics(tmp_path / "run")
    steps = [r for r in records if r["kind"] == "step"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert steps
    assert len(evals) >= 2
    acc = _events(tmp_path / "run")
    tags = set(acc.Tags()["scalars"])
    assert {"step/loss", "step/lr", "step/train_acc", "eval/accuracy_avg_model"} <= tags
    assert not {
        t for t in tags if t.split("/", 1)[1] in ("step", "kind", "peer", "epoch", "version")
    }

    loss = acc.Scalars("step/loss")
    assert len(loss) == len(steps)
    assert [e.step for e in loss] == [r["step"] for r in steps]
    for event, record in zip(loss, steps, strict=True):
        assert _close(event.value, record["loss"]), (event, record["loss"])

    accuracy = acc.Scalars("eval/accuracy_avg_model")
    assert [e.step for e in accuracy] == [r["step"] for r in evals]
    for event, record in zip(accuracy, evals, strict=True):
        assert _close(event.value, record["accuracy_avg_model"])


def test_without_tensorboard_no_directory_is_made(tmp_path: Path) -> None:
    cfg = load_config(None, TINY, environ={})
    assert cfg.tensorboard is False
    run(cfg, tmp_path / "run", progress=False, plots=False)
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_only_finite_numbers_become_scalars() -> None:
    record = {
        "kind": "step",
        "step": 3,
        "epoch": 0.5,
        "peer": 1,
        "loss": 0.25,
        "rounds": 2,
        "theta": None,
        "flag": True,
        "graph": "ring",
        "missing": [1, 2],
        "hist": {"a": 1},
        "nan": math.nan,
        "inf": -math.inf,
        "f32": torch.tensor(1.5).numpy()[()],  # a numpy scalar
    }
    assert tensorboard_scalars(record) == {"step/loss": 0.25, "step/rounds": 2.0, "step/f32": 1.5}


def test_a_resumed_run_hides_the_dropped_steps(tmp_path: Path) -> None:
    """Like metrics.jsonl (`truncate_metrics`), the events after the checkpoint's step are
    superseded by the resumed run's (``purge_step``)."""
    cfg = load_config(None, ["peers=2", "tensorboard=true"], environ={})
    first = RunWriter(tmp_path / "run", cfg, flush_every=1)
    for step in range(5):
        first.metric({"kind": "step", "step": step, "loss": float(step)})
    first.close()
    again = RunWriter(tmp_path / "run", cfg, flush_every=1, resume_after=2)
    for step in (3, 4):
        again.metric({"kind": "step", "step": step, "loss": 10.0 + step})
    again.finish({}, plots=False)
    assert [r["loss"] for r in _metrics(tmp_path / "run")] == [0.0, 1.0, 2.0, 13.0, 14.0]
    loss = _events(tmp_path / "run").Scalars("step/loss")
    assert [(e.step, e.value) for e in loss] == [(0, 0.0), (1, 1.0), (2, 2.0), (3, 13.0), (4, 14.0)]


def test_a_peer_writer_flushes_its_events_with_each_line(tmp_path: Path) -> None:
    cfg = load_config(None, ["peers=2", "tensorboard=true"], environ={})
    writer = RunWriter(tmp_path / "peer-0", cfg, run="r", flush_every=1, peer=0)
    writer.metric({"kind": "eval", "step": 0, "peer": 0, "accuracy": 0.5})
    assert [e.value for e in _events(tmp_path / "peer-0").Scalars("eval/accuracy")] == [0.5]
    writer.close()


def test_missing_tensorboard_names_the_extra_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the import fails
    cfg = load_config(None, ["peers=2", "tensorboard=true"], environ={})
    with pytest.raises(TensorBoardUnavailableError) as info:
        RunWriter(tmp_path / "run", cfg)
    assert "pip install 'concord[tensorboard]'" in str(info.value)
    assert isinstance(info.value, ConcordError)
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, RuntimeError)  # the CLI reports it
    assert not (tmp_path / "run").exists()
    RunWriter(tmp_path / "off", load_config(None, ["peers=2"], environ={})).close()  # unaffected
