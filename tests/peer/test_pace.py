"""`concord.peer.pace`: step records carry their end time; the straggler sleeps (factor − 1) ×
the CPU time of its previous step; ``network.straggler`` is validated."""

from __future__ import annotations

import time

import pytest

from concord.core.config import ConfigError, load_config
from concord.core.records import StepRecord
from concord.peer.pace import StepTime, Straggler, pace_hooks
from tests.records import step_record


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_straggler_sleeps_factor_minus_one_times_the_cpu_of_the_step() -> None:
    hook = Straggler(3.0)
    records: list[StepRecord] = []
    for step in range(3):
        t0 = time.perf_counter()
        hook.before(step)
        slept = time.perf_counter() - t0
        _burn(0.05)
        time.sleep(0.05)  # blocked, not computing: not stretched
        records.append(hook.after(step, step_record(step)))
        if step == 0:
            assert slept < 0.01  # nothing measured yet
        else:
            # 2 × the 50 ms burnt; the upper bound leaves room for a loaded machine
            assert 0.099 <= slept < 0.2, slept
    assert records[0].extra["straggler_sleep_ms"] == 0.0
    sleep_ms = records[2].extra["straggler_sleep_ms"]
    assert isinstance(sleep_ms, float)
    assert 99.0 <= sleep_ms < 200.0


def test_step_time_stamps_every_record() -> None:
    before = time.time()
    record = StepTime().after(0, step_record(0, extra={"step_ms": 3.0}))
    stamp = record.extra["time"]
    assert isinstance(stamp, float)
    assert before <= stamp <= time.time()
    assert record.extra["step_ms"] == 3.0  # what the hooks before it added stays
    assert record.to_json()["time"] == stamp  # written flat beside the fields


def test_pace_hooks_slow_only_the_straggler() -> None:
    cfg = load_config(None, ["peers=4", "network.straggler={peer = 2, factor = 2.5}"], environ={})
    assert [type(h) for h in pace_hooks(cfg, 1)] == [StepTime]
    slow = pace_hooks(cfg, 2)
    assert [type(h) for h in slow] == [StepTime, Straggler]
    assert isinstance(slow[1], Straggler)
    assert slow[1].factor == 2.5


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["peers=4", "network.straggler.peer=4", "network.straggler.factor=2"], "names no peer"),
        (["network.straggler.peer=1", "network.straggler.factor=0.5"], "greater than or equal"),
        (["network.straggler.peer=-1", "network.straggler.factor=2"], "greater than or equal"),
        (["network.straggler.factor=2"], "peer"),
    ],
)
def test_bad_straggler_settings_are_refused(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets, environ={})
