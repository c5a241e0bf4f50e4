"""Fuzz the wire contracts for longer than the test suite does: every target of `tests.fuzz`
with thousands of grammar-aware inputs each.

Targets (`tests.fuzz.targets.TARGETS`; inputs from `tests.fuzz.strategies`):

* ``serde``: one ``ExchangeRaw`` message → `concord.peer.serde.raw_frame_from_wire`;
* ``check_hello``: a HelloRequest → `concord.peer.validate.check_hello`;
* ``check_frame``: a chunk's FrameHeader → `concord.peer.validate.check_frame`;
* ``receive``: a whole stream through the real servicer (both methods) into a Mailbox, then the
  codec's decode of every filed tensor;
* ``control_plane``: a payload on a topic of every kind → `Topics.parse` + `decode`.

A case *crashes* when the target raises anything but the documented rejections (a broken
property is an ``AssertionError``: a crash too) or runs longer than ``--timeout`` seconds (a hang;
SIGALRM interrupts it). Crashes are grouped by exception type and place; the smallest input seen
per group is printed (hypothesis does not shrink here: the targets are run to count, not to stop
at the first failure — ``pytest tests/fuzz`` shrinks).

Last line: a JSON object with ``fuzz_cases`` (per target and ``total``), ``fuzz_crashes`` (total),
``fuzz_crashes_by_target``, ``cases_per_s`` per target and the ``seed``.

    python bench/fuzz.py [--examples 10000] [--quick] [--targets serde,receive] [--seed N]
                         [--timeout 10] [--fail-on-crash]

``--quick``: 2,000 examples per target. The rates are only comparable within one run: on a
shared 2-vCPU machine they move by ±20 %.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as with_seed

from tests.fuzz.targets import TARGETS


class Hang(BaseException):
    """Raised by SIGALRM in a case that runs past the per-case timeout (a BaseException, so that
    no ``except Exception`` in the code under test swallows it)."""


@dataclass
class Crash:
    kind: str  # exception type, or "hang"
    where: str  # file:line of the innermost frame
    message: str
    example: str  # repr of the smallest input seen
    count: int = 1


@dataclass
class Result:
    target: str
    cases: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    crashes: dict[tuple[str, str], Crash] = field(default_factory=dict)

    @property
    def crash_count(self) -> int:
        return sum(c.count for c in self.crashes.values())

    def record(self, kind: str, where: str, message: str, case: Any) -> None:
        example = repr(case)
        found = self.crashes.get((kind, where))
        if found is None:
            self.crashes[(kind, where)] = Crash(kind, where, message, example)
            return
        found.count += 1
        if len(example) < len(found.example):
            found.example, found.message = example, message


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang


def _where(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return "?"
    last = tb[-1]
    return f"{Path(last.filename).name}:{last.lineno}"


def run_target(name: str, examples: int, timeout: float, seed: int) -> Result:
    strategy, target = TARGETS[name]
    result = Result(name)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    @with_seed(seed)
    @given(strategy())
    def fuzz(case: Any) -> None:
        result.cases += 1
        start = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            result.outcomes[target(case)] += 1
        except Hang:
            result.record("hang", f"> {timeout:g} s", "", case)
        except Exception as exc:
            result.record(type(exc).__name__, _where(exc), str(exc)[:500], case)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if time.perf_counter() - start > timeout and not any(
            c.kind == "hang" for c in result.crashes.values()
        ):
            result.record("hang", f"> {timeout:g} s", "finished late", case)

    previous = signal.signal(signal.SIGALRM, _alarm)
    start = time.perf_counter()
    try:
        fuzz()
    finally:
        result.seconds = time.perf_counter() - start
        signal.signal(signal.SIGALRM, previous)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000, help="examples per target")
    parser.add_argument("--quick", action="store_true", help="2,000 examples per target")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default random)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    parser.add_argument("--fail-on-crash", action="store_true", help="exit 1 on any crash")
    args = parser.parse_args(argv)
    examples = 2_000 if args.quick else args.examples
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"fuzz: {examples} examples per target, seed {seed}, per-case timeout {args.timeout:g} s")

    results = []
    for name in names:
        r = run_target(name, examples, args.timeout, seed)
        results.append(r)
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(r.outcomes.items()))
        print(f"  {name}: {r.cases} cases in {r.seconds:.1f} s ({outcomes})", flush=True)

    header = f"{'target':<14} {'cases':>7} {'crashes':>7} {'ok':>6} {'rejected':>8} {'cases/s':>8}"
    print()
    print(header)
    print("-" * len(header))
    for r in results:
        rate = r.cases / r.seconds if r.seconds else 0.0
        print(
            f"{r.target:<14} {r.cases:>7} {r.crash_count:>7} {r.outcomes['ok']:>6} "
            f"{r.outcomes['rejected']:>8} {rate:>8.0f}"
        )
    for r in results:
        for c in r.crashes.values():
            print(f"\nCRASH {r.target}: {c.kind} at {c.where} ({c.count}×): {c.message}")
            print(f"  smallest input: {c.example[:3000]}")

    total_cases = sum(r.cases for r in results)
    total_crashes = sum(r.crash_count for r in results)
    print(
        json.dumps(
            {
                "fuzz_cases": {**{r.target: r.cases for r in results}, "total": total_cases},
                "fuzz_crashes": total_crashes,
                "fuzz_crashes_by_target": {r.target: r.crash_count for r in results},
                "cases_per_s": {
                    r.target: round(r.cases / r.seconds, 1) if r.seconds else None for r in results
                },
                "seed": seed,
            }
        )
    )
    return 1 if args.fail_on_crash and total_crashes else 0


if __name__ == "__main__":
    sys.exit(main())
