"""Offline datasets, data partitioners and the per-replica batch sampler.

- `load_dataset` / `Dataset` / `DATASET_NAMES` — mnist1d (generated), digits (shipped file),
  gaussian-mixture (generated), cifar10 (local files, restricted unpickler);
- `partition` / `PARTITION_NAMES` / `label_histograms` / `partition_stats` — iid, Dirichlet,
  label-sorted (DeTAG), shards, or "module:callable" user code;
- `ReplicaSampler` — deterministic per-(seed, rank, epoch) minibatch index streams;
- `HeterogeneousQuadratics` — the random-quadratics optimisation test problem;
- `augment_cifar` — batched random crop + horizontal flip.
"""

from __future__ import annotations

from concord.core.data.base import Dataset, DatasetFormatError, DatasetNotFoundError
from concord.core.data.cifar import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    RestrictedUnpickler,
    UnsafePickleError,
    augment_cifar,
)
from concord.core.data.datasets import DATASET_NAMES, DATASETS, dataset_options, load_dataset
from concord.core.data.partition import (
    PARTITION_NAMES,
    PARTITIONERS,
    PartitionError,
    label_histograms,
    partition,
    partition_digest,
    partition_stats,
    validate_partition,
)
from concord.core.data.sampler import ReplicaSampler
from concord.core.data.synthetic import HeterogeneousQuadratics

__all__ = [
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "DATASETS",
    "DATASET_NAMES",
    "PARTITIONERS",
    "PARTITION_NAMES",
    "Dataset",
    "DatasetFormatError",
    "DatasetNotFoundError",
    "HeterogeneousQuadratics",
    "PartitionError",
    "ReplicaSampler",
    "RestrictedUnpickler",
    "UnsafePickleError",
    "augment_cifar",
    "dataset_options",
    "label_histograms",
    "load_dataset",
    "partition",
    "partition_digest",
    "partition_stats",
    "validate_partition",
]
