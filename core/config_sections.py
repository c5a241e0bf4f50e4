"""The sections of the run configuration that say what is trained and how: data, partition,
model, optimiser, consensus control, compression and evaluation (`concord.core.config`
assembles them into `RunConfig`). Torch-free, like the whole config.

A name (dataset, model, partition scheme, codec) is accepted when its spec table
(`concord.core.specs`) declares it, built in or registered at run time, or when it is a
``module:callable`` plug-in.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from concord.core.algorithms.catalog import CATALOG
from concord.core.plugins import is_spec
from concord.core.specs import (
    CODEC_SPECS,
    DATASET_SPECS,
    MODEL_SPECS,
    PARTITIONER_SPECS,
    TOPOLOGY_SPECS,
    SpecTable,
)
from concord.core.suggest import closest

# The built-in names of each kind. Validators ask the spec tables (`concord.core.specs`), which
# also hold the names registered at run time; ``module:Name`` plug-ins are accepted besides.
ALGORITHM_NAMES: tuple[str, ...] = tuple(CATALOG)  # every algorithm of the catalog, in its order
DATASET_NAMES: tuple[str, ...] = tuple(DATASET_SPECS)
MODEL_NAMES: tuple[str, ...] = tuple(MODEL_SPECS)
PARTITION_NAMES: tuple[str, ...] = tuple(PARTITIONER_SPECS)
TOPOLOGY_NAMES: tuple[str, ...] = tuple(TOPOLOGY_SPECS)
ENGINE_NAMES: tuple[str, ...] = ("vectorized", "processes")
PLAN_PRESETS = "'gossip', 'exact', 'dec-phase-K', or a list of per-phase modes"


class Section(BaseModel):
    """A table of the config: unknown keys are refused, values frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _known(table: SpecTable[Any], kind: str) -> AfterValidator:
    """The check of a name of ``kind``: ``table`` declares it (when the config is validated, so
    names registered at run time count) or it is a ``module:callable`` plug-in (imported where it
    is used, not here: the orchestrator does not import a user's torch code)."""

    def check(v: str) -> str:
        if v not in table and not is_spec(v):
            raise ValueError(unknown_name(kind, v, table.names(), "module:callable"))
        return v

    return AfterValidator(check)


DatasetName = Annotated[str, _known(DATASET_SPECS, "dataset")]
PartitionName = Annotated[str, _known(PARTITIONER_SPECS, "partition scheme")]
ModelName = Annotated[str, _known(MODEL_SPECS, "model")]
CodecName = Annotated[str, _known(CODEC_SPECS, "codec")]


class DatasetConfig(Section):
    name: DatasetName = Field(
        default="mnist1d",
        description="a built-in dataset or 'module:callable' (a dataset plug-in, docs/api.md)",
    )
    samples: int | None = Field(default=None, gt=0, description="generated datasets: total samples")
    root: str | None = Field(default=None, description="directory of on-disk datasets (cifar10)")
    test_samples: int | None = Field(
        default=None, gt=0, description="evaluate on at most this many"
    )
    augment: bool = False
    options: dict[str, Any] = Field(default_factory=dict)


class PartitionConfig(Section):
    scheme: PartitionName = "iid"
    alpha: float = Field(default=1.0, gt=0, description="Dirichlet concentration")
    shuffled_fraction: float = Field(default=0.0, ge=0, le=1, description="'sorted' scheme")
    shards_per_peer: int = Field(default=2, ge=1)
    exponent: float = Field(
        default=1.0, ge=0, le=10, description="'powerlaw' scheme: sizes ∝ (rank + 1)^−exponent"
    )
    options: dict[str, Any] = Field(default_factory=dict, description="passed to user code")


class ModelConfig(Section):
    name: ModelName = "cnn1d"
    width: int | None = Field(default=None, gt=0)
    norm: Literal["bn", "gn"] | None = None
    hidden: list[int] | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    def build_options(self) -> dict[str, Any]:
        opts = dict(self.options)
        for key in ("width", "norm", "hidden"):
            value = getattr(self, key)
            if value is not None:
                opts[key] = value
        return opts


class OptimConfig(Section):
    lr: float = Field(default=0.1, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    nesterov: bool = True
    weight_decay: float = Field(default=1e-4, ge=0)
    batch_size: int = Field(default=16, ge=1, description="local (per-peer) batch size")
    warmup: float = Field(default=0.05, ge=0, lt=1, description="fraction of training")
    warmup_from: float = Field(default=0.0, ge=0, le=1, description="warm-up starts at this × lr")
    milestones: list[float] = Field(default_factory=lambda: [0.5, 0.75])
    gamma: float = Field(default=0.1, gt=0, le=1)
    clip_norm: float | None = Field(
        default=None,
        gt=0,
        description="clip each replica's stochastic gradient to this L2 norm before the optimizer "
        "(unset: no clipping)",
    )

    @field_validator("milestones")
    @classmethod
    def _increasing(cls, v: list[float]) -> list[float]:
        if any(not 0 < m < 1 for m in v):
            raise ValueError(f"milestones are fractions of training in (0, 1); got {v}")
        if any(b <= a for a, b in itertools.pairwise(v)):
            raise ValueError(f"milestones must be strictly increasing; got {v}")
        return v


class ControlSection(Section):
    """Consensus control. The default (adaptive control of phase 1, Kong et al.'s practical
    guideline) applies to gossip algorithms only; it is silently inert for all-reduce, local SGD,
    DeTAG/DSGT (their own rounds) and exact-averaging phases. A ``mode`` set explicitly is checked
    against the plan. ``mode = "fixed"`` is not consensus control: every step of the controlled
    phases runs exactly ``rounds`` gossip rounds (equal-budget comparisons)."""

    mode: Literal["none", "constant", "adaptive", "fixed"] = "adaptive"
    factor: float = Field(default=0.25, gt=0)
    phases: list[int] = Field(default_factory=lambda: [1], description="controlled phases, 1-based")
    max_rounds: int = Field(default=20, ge=1)
    lagged: bool = False
    lag: int = Field(
        default=1,
        ge=1,
        description="lagged mode: rounds of step t from the statistics of step t − lag",
    )
    ema: float = Field(default=0.9, ge=0, lt=1)
    statistic: Literal["theta", "xi", "sketch"] = "theta"
    rounds: int = Field(
        default=1,
        ge=1,
        description="mode `fixed`: the gossip rounds every step of a controlled phase runs, "
        "whatever the statistic (≤ `max_rounds`; must stay 1 with the other modes)",
    )

    @model_validator(mode="after")
    def _lag_needs_lagged(self) -> ControlSection:
        if self.lag != 1 and not self.lagged:
            raise ValueError(
                f"lag = {self.lag} only applies to lagged control; set lagged = true (the barrier "
                "protocol decides every round of the current step)"
            )
        return self

    @model_validator(mode="after")
    def _rounds_need_fixed(self) -> ControlSection:
        if self.rounds != 1 and self.mode != "fixed":
            raise ValueError(
                f"rounds = {self.rounds} only applies to mode = 'fixed' (mode {self.mode!r} "
                "decides the rounds of a step from the consensus statistic); set mode = 'fixed' "
                "or leave rounds unset"
            )
        if self.rounds > self.max_rounds:
            raise ValueError(
                f"rounds = {self.rounds} exceeds max_rounds = {self.max_rounds}, the bound on "
                "gossip rounds per step; raise max_rounds"
            )
        return self


# the built-in codecs (`concord.core.specs.CODEC_SPECS`; `concord.core.compress` implements them)
CODEC_NAMES: tuple[str, ...] = tuple(CODEC_SPECS)


class CompressionConfig(Section):
    """What travels on gossip edges. Lossless-enough casts (fp16, bf16) can be used by any gossip
    algorithm; lossy codecs need error feedback, i.e. the ``choco`` algorithm."""

    codec: CodecName = "none"
    ratio: float = Field(default=0.01, gt=0, le=1, description="fraction kept by topk/randomk")
    gamma: float = Field(default=1.0, gt=0, le=1, description="CHOCO consensus step size γ")
    levels: int = Field(
        default=16,
        ge=1,
        le=32767,
        description="qsgd quantisation levels s (16 = the CHOCO '4-bit'; int8 on the wire up to "
        "127, int16 above)",
    )
    unbiased: bool = Field(
        default=False,
        description="qsgd: drop CHOCO's variance-reducing factor 1/(1 + min(d/s², √d/s)) "
        "(unbiased, E Q(x) = x)",
    )


class EvalConfig(Section):
    """The averaged model is evaluated on the whole test set every ``every`` epochs; every replica
    too when ``peers`` (on the first ``peer_samples`` test samples, which keeps n-replica
    evaluation cheap); the final evaluation always covers every replica on the whole test set."""

    every: float = Field(default=1.0, gt=0, description="evaluate every this many epochs")
    peers: bool = True
    peer_samples: int | None = Field(default=1000, gt=0)


def unknown_name(kind: str, value: str, names: Sequence[str], *extra: str) -> str:
    """The problem of an unknown ``value`` of ``kind``: the closest of ``names`` as a hint, then
    every valid name and the ``extra`` forms."""
    close = closest(value, names)
    hint = f" (did you mean {close!r}?)" if close else ""
    return f"unknown {kind} {value!r}{hint}; valid: {', '.join([*names, *extra])}"
