"""The `Dataset` container, dataset errors and small helpers shared by the loaders.

Every loader returns a `Dataset`: train and test tensors already preprocessed (standardised or
normalised), so the engines only index them. Invariants checked on construction:

- ``x_train`` is float32 of shape [N, *input_shape], ``y_train`` int64 of shape [N] (same for test);
- labels lie in [0, num_classes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from concord.errors import DatasetFormatError as DatasetFormatError
from concord.errors import DatasetNotFoundError as DatasetNotFoundError

CACHE_ENV = "CONCORD_CACHE"  # overrides the default cache directory ~/.cache/concord
DATA_ENV = "CONCORD_DATA"  # parent directory of on-disk datasets (e.g. cifar-10-batches-py)


@dataclass(frozen=True, eq=False)  # eq=False: tensors have no boolean equality
class Dataset:
    """A classification dataset held in memory.

    Shapes: ``x_train`` [N, *input_shape] float32, ``y_train`` [N] int64, ``x_test``
    [M, *input_shape] float32, ``y_test`` [M] int64. ``meta`` holds the generation parameters /
    source paths and is JSON-serialisable. ``groups_train`` (int64 [N], optional): a natural
    group id per training sample (a writer, a site) for partition schemes that use it.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict)
    groups_train: torch.Tensor | None = None

    def __post_init__(self) -> None:
        g = self.groups_train
        if g is not None and (g.dtype != torch.int64 or g.shape != (self.x_train.shape[0],)):
            raise ValueError(
                f"dataset {self.name!r}: groups_train must be int64 [{self.x_train.shape[0]}], "
                f"got {g.dtype} {tuple(g.shape)}"
            )
        for split, x, y in (
            ("train", self.x_train, self.y_train),
            ("test", self.x_test, self.y_test),
        ):
            if x.dtype != torch.float32 or y.dtype != torch.int64:
                raise ValueError(
                    f"dataset {self.name!r} {split}: x must be float32 and y int64, "
                    f"got {x.dtype} and {y.dtype}"
                )
            if tuple(x.shape[1:]) != tuple(self.input_shape) or y.shape != (x.shape[0],):
                dims = ", ".join(map(str, self.input_shape))
                raise ValueError(
                    f"dataset {self.name!r} {split}: x has shape {tuple(x.shape)} and y "
                    f"{tuple(y.shape)}; expected [N, {dims}] and [N]"
                )
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(
                    f"dataset {self.name!r} {split}: labels span {int(y.min())}..{int(y.max())}, "
                    f"outside 0..{self.num_classes - 1}"
                )

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.x_test.shape[0])


def default_cache_dir() -> Path:
    """$CONCORD_CACHE if set, else ~/.cache/concord."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "concord"


def default_data_dir() -> Path:
    """$CONCORD_DATA if set, else ./data."""
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else Path("data")


def stratified_split(
    labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded stratified split: each class puts round(test_fraction · count) samples in test.

    Returns (train_indices, test_indices), each a shuffled int64 array.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    train: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = round(test_fraction * len(idx))
        test.append(idx[:k])
        train.append(idx[k:])
    tr = rng.permutation(np.concatenate(train)).astype(np.int64)
    te = rng.permutation(np.concatenate(test)).astype(np.int64)
    return tr, te


def split_dataset(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    split: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    meta: dict[str, Any],
) -> Dataset:
    """The `Dataset` ``name`` of the samples ``x`` (float32 [N, *input_shape]) and labels ``y``
    (int64 [N]) split on ``split`` = (train indices, test indices) of `stratified_split`."""
    tr, te = split
    return Dataset(
        name=name,
        x_train=torch.from_numpy(x[tr]),
        y_train=torch.from_numpy(y[tr]),
        x_test=torch.from_numpy(x[te]),
        y_test=torch.from_numpy(y[te]),
        num_classes=num_classes,
        input_shape=tuple(x.shape[1:]),
        meta=meta,
    )


def check_fraction(name: str, value: float) -> float:
    """A fraction strictly between 0 and 1 (train_split, test_fraction)."""
    if not isinstance(value, int | float) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """An int ≥ minimum (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return int(value)
