"""The ``[async]`` section: the virtual clock of the asynchronous algorithms (``ad-psgd``,
``async-sgp``), simulated by the vectorized engine (`concord.sim.asynchronous`,
docs/algorithms.md#asynchronous-simulation). Torch-free, like the whole config.

* ``speeds``: per-peer compute-time multipliers — one float for every peer, a list of n floats,
  or a distribution drawn from the run seed: ``"uniform:A:B"`` (0 < A ≤ B) or
  ``"lognormal:SIGMA"`` (exp(σ·N(0, 1)), 0 ≤ σ ≤ 4);
* ``compute_s``: virtual seconds of one local step at speed 1 (peer i's step takes
  ``compute_s × speeds[i]``);
* ``delays``: one-way message delay in virtual seconds — one float for every link, an n × n
  matrix (row = sender), or the name of an emulated-network profile
  (`concord.core.emulation.PROFILES`), whose peer-to-peer one-way delay is 2 × ``delay_ms``
  (a message crosses two access links; jitter and loss are not simulated);
* ``max_staleness``: τ, in steps: ``async-sgp`` waits rather than mix neighbour information
  older than τ steps (0: a barrier, synchronous SGP). AD-PSGD never waits;
* ``min_weight``: ``async-sgp`` only — a peer whose push-sum weight is below it keeps its shares
  at that step (empty shares complete the round), so its weight stays ≥ ``min_weight`` / 2 on
  one-peer graphs (default 0.25; 0: off, Assran et al.'s published algorithm). Both engines,
  peer processes too;
* ``budget``: how the run's T = ``epochs`` × steps-per-epoch steps are counted. ``"global"``
  (default, Lian et al. 2018: the peers together process the epochs): the run ends when the
  peers' local steps add up to n·T, and the learning rate, ``epoch`` and evaluations follow the
  global progress g = Σ_i k_i / n (peer processes estimate it from the progress vectors their
  messages carry). ``"per-peer"``: peer processes each take T local steps; the simulation runs
  T windows of the fastest peer's step (slower peers take fewer).
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, field_validator

from concord.core.config_sections import Section
from concord.core.emulation import PROFILES

_DISTRIBUTIONS = "'uniform:A:B' (0 < A ≤ B) or 'lognormal:SIGMA' (0 ≤ SIGMA ≤ 4)"
_SPEED_SALT = 0x5EED_A5  # the speeds' random stream, apart from every other use of the seed
BUDGETS = ("global", "per-peer")
MIN_STEP_S = 1e-9  # one tick of the virtual clock (`concord.sim.events`): the shortest step


def _parse_distribution(v: str) -> tuple[str, list[float]]:
    kind, _, rest = v.partition(":")
    try:
        args = [float(a) for a in rest.split(":")] if rest else []
    except ValueError:
        args = []
    if kind == "uniform" and len(args) == 2 and 0 < args[0] <= args[1] < math.inf:
        return kind, args
    if kind == "lognormal" and len(args) == 1 and 0 <= args[0] <= 4:
        return kind, args
    raise ValueError(f"{v!r} is not a distribution: use {_DISTRIBUTIONS}")


class AsyncConfig(Section):
    """The virtual clock of asynchronous algorithms (module docstring)."""

    speeds: float | list[float] | str = Field(
        default=1.0,
        description="per-peer compute-time multipliers: a float (> 0) for every peer, a list of "
        f"n floats, or {_DISTRIBUTIONS} drawn from the seed",
    )
    compute_s: float = Field(
        default=1.0, gt=0, le=1e6, description="virtual seconds of one local step at speed 1"
    )
    delays: float | list[list[float]] | str = Field(
        default=0.0,
        description="one-way message delay in virtual seconds: a float (≥ 0) for every link, an "
        "n × n matrix (row = sender), or an emulation profile name (2 × its delay_ms)",
    )
    max_staleness: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="the staleness bound τ in steps: async-sgp waits rather than mix neighbour "
        "information older than τ steps (0: synchronous SGP)",
    )

    min_weight: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="async-sgp: a peer whose push-sum weight is below this keeps its whole "
        "numerator at that step and sends empty shares (0: off, the published algorithm); "
        "bounds its gradient steps on z = x / w, which grow as η / w when it runs ahead of its "
        "in-neighbours or rejoins behind them (without it a restarted peer process diverged)",
    )

    budget: str = Field(
        default="global",
        description="'global': the run ends when the peers' local steps add up to n × T (T = "
        "epochs × steps per epoch) and the LR, epoch and evaluations follow g = Σ local steps / "
        "n; 'per-peer': each peer process takes T local steps (the simulation: T windows of the "
        "fastest peer's step)",
    )

    @field_validator("budget")
    @classmethod
    def _budget(cls, v: str) -> str:
        if v not in BUDGETS:
            raise ValueError(
                f"{v!r} is not a budget: 'global' (the peers' local steps add up to n × T) or "
                "'per-peer' (each peer takes T local steps)"
            )
        return v

    @property
    def global_budget(self) -> bool:
        return self.budget == "global"

    @field_validator("speeds")
    @classmethod
    def _speeds(cls, v: float | list[float] | str) -> float | list[float] | str:
        if isinstance(v, str):
            _parse_distribution(v)
        elif isinstance(v, list):
            bad = [s for s in v if not 0 < s < math.inf]
            if bad or not v:
                raise ValueError(f"every multiplier must be a finite float > 0; got {bad or v}")
        elif not 0 < v < math.inf:
            raise ValueError(f"must be a finite float > 0; got {v}")
        return v

    @field_validator("delays")
    @classmethod
    def _delays(cls, v: float | list[list[float]] | str) -> float | list[list[float]] | str:
        if isinstance(v, str):
            if v not in PROFILES:
                raise ValueError(
                    f"{v!r} is neither seconds nor a profile: one of {', '.join(PROFILES)}"
                )
        elif isinstance(v, list):
            bad = [d for row in v for d in row if not 0 <= d < math.inf]
            if bad:
                raise ValueError(f"every delay must be ≥ 0 seconds; got {bad[0]}")
        elif not 0 <= v < math.inf:
            raise ValueError(f"must be ≥ 0 seconds; got {v}")
        return v

    def problems(self, peers: int, seed: int) -> list[tuple[str, str]]:
        """What does not fit a run of ``peers`` peers with seed ``seed``, as (key in the
        section, message): list lengths, the matrix shape, and step times the clock cannot
        resolve (a step shorter than one tick would be rounded up, equalising the speeds)."""
        out = []
        if isinstance(self.speeds, list) and len(self.speeds) != peers:
            out.append(("speeds", f"lists {len(self.speeds)} multipliers for {peers} peers"))
        elif min(self.speed_list(peers, seed)) * self.compute_s < MIN_STEP_S:
            fastest = min(self.speed_list(peers, seed)) * self.compute_s
            out.append(
                (
                    "compute_s",
                    f"the fastest peer's step, compute_s × its speed = {fastest:.3g} s, is below "
                    f"the virtual clock's resolution of {MIN_STEP_S:g} s (1 ns); raise compute_s "
                    "or the speeds",
                )
            )
        if isinstance(self.delays, list) and (
            len(self.delays) != peers or any(len(row) != peers for row in self.delays)
        ):
            out.append(("delays", f"a matrix must be {peers} × {peers} (row = sender)"))
        return out

    def speed_list(self, peers: int, seed: int) -> list[float]:
        """Every peer's compute-time multiplier (a distribution drawn from ``seed``)."""
        if isinstance(self.speeds, list):
            return [float(s) for s in self.speeds]
        if not isinstance(self.speeds, str):
            return [float(self.speeds)] * peers
        kind, args = _parse_distribution(self.speeds)
        rng = np.random.default_rng((seed, _SPEED_SALT))
        if kind == "uniform":
            drawn = rng.uniform(args[0], args[1], size=peers)
        else:
            drawn = np.exp(args[0] * rng.standard_normal(size=peers))
        return [float(s) for s in drawn]

    def delay_matrix(self, peers: int) -> list[list[float]]:
        """One-way delay in seconds of every directed link (row = sender)."""
        if isinstance(self.delays, list):
            return [[float(d) for d in row] for row in self.delays]
        if isinstance(self.delays, str):
            one_way = 2 * float(PROFILES[self.delays].get("delay_ms", 0.0)) / 1000
        else:
            one_way = float(self.delays)
        return [[0.0 if i == j else one_way for j in range(peers)] for i in range(peers)]
