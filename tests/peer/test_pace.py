"""`concord.peer.pace`: step records carry their end time; the straggler sleeps (factor − 1) ×
the CPU time of its previous step; ``network.straggler`` is validated; `DeviceTime` fills each
cycle up to its device time (``network.device``)."""

from __future__ import annotations

import time

import pytest

from concord.core.config import ConfigError, load_config
from concord.core.records import StepRecord
from concord.peer.pace import DeviceTime, StepTime, Straggler, device_sleep, pace_hooks
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


def test_device_sleep_fills_the_device_time_and_flags_an_overrun() -> None:
    assert device_sleep(0.08, 0.03) == pytest.approx((0.05, False))
    assert device_sleep(0.08, 0.0) == (0.08, False)
    assert device_sleep(0.08, 0.08) == (0.0, False)  # exactly on time: no overrun
    assert device_sleep(0.08, 0.1) == (0.0, True)  # the host was too slow: no sleep
    with pytest.raises(ValueError, match="device time"):
        device_sleep(0.0, 0.01)
    with pytest.raises(ValueError, match="CPU time"):
        device_sleep(0.08, -1.0)


def test_device_time_sleeps_factor_times_step_less_the_cpu_since_its_last_sleep() -> None:
    hook = DeviceTime(step_ms=60.0, factor=2.0)  # 120 ms a cycle
    records: list[StepRecord] = []
    for step in range(3):
        t0 = time.perf_counter()
        hook.before(step)
        slept = time.perf_counter() - t0
        _burn(0.03)  # the step's compute
        time.sleep(0.05)  # blocked on the network: costs no device time
        records.append(hook.after(step, step_record(step)))
        _burn(0.02)  # an evaluation after the step: inside the next cycle
        if step == 0:
            assert slept < 0.01  # nothing measured yet
        else:
            # 120 − 50 ms of CPU; the upper bound leaves room for a loaded machine's wake-up
            assert 0.069 <= slept < 0.12, slept
    assert records[0].extra["device_sleep_ms"] == 0.0
    cpu_ms, sleep_ms = records[2].extra["device_cpu_ms"], records[2].extra["device_sleep_ms"]
    assert isinstance(cpu_ms, float)
    assert isinstance(sleep_ms, float)
    assert 49.0 <= cpu_ms < 60.0  # 50 ms burnt (thread CPU time: the sleeps are not in it)
    assert records[2].extra["device_overrun"] == 0.0
    assert (hook.cycles, hook.overruns) == (2, 0)


def test_device_time_counts_an_overrun() -> None:
    hook = DeviceTime(step_ms=10.0, factor=1.0)
    hook.before(0)
    _burn(0.03)  # 30 ms of CPU against a 10 ms device
    hook.before(1)
    record = hook.after(1, step_record(1))
    assert record.extra["device_overrun"] == 1.0
    assert record.extra["device_sleep_ms"] == 0.0
    assert (hook.cycles, hook.overruns) == (1, 1)


def test_pace_hooks_give_every_peer_its_device() -> None:
    cfg = load_config(
        None, ["peers=3", "network.device={step_ms = 40, factors = [1, 1.5, 6]}"], environ={}
    )
    hooks = [pace_hooks(cfg, i) for i in range(3)]
    assert all([type(h) for h in peer] == [DeviceTime, StepTime] for peer in hooks)
    assert [h[0].device_s for h in hooks] == pytest.approx([0.04, 0.06, 0.24])  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["peers=3", "network.device={step_ms = 40, factors = [1, 2]}"], "2 factors for 3 peers"),
        (["peers=2", "network.device={step_ms = 40, factors = [1, 0.5]}"], "1 … 100"),
        (["peers=2", "network.device={step_ms = 0, factors = [1, 2]}"], "greater than 0"),
        (["peers=2", "network.device={factors = [1, 2]}"], "step_ms"),
        (
            [
                "peers=2",
                "network.device={step_ms = 40, factors = [1, 2]}",
                "network.straggler={peer = 1, factor = 2}",
            ],
            "use one",
        ),
    ],
)
def test_bad_device_settings_are_refused(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, sets, environ={})
