"""Offline datasets by name: ``load_dataset(name, seed=…, root=…, cache_dir=…, **options)``.

==================  =========================================================  ===============
name                source                                                     input_shape
==================  =========================================================  ===============
mnist1d             generated locally (Greydanus 2020), cached as .npz          (40,)
digits              shipped ``digits.npz`` (scikit-learn's copy), ÷ 16          (1, 8, 8)
gaussian-mixture    generated (`concord.core.data.synthetic`)                           (dim,)
cifar10             local ``cifar-10-batches-py`` files (`concord.core.data.cifar`)     (3, 32, 32)
pystdlib-chars      the interpreter's stdlib source (`concord.core.data.pystdlib`)     (seq_len,)
==================  =========================================================  ===============

Nothing is downloaded. ``root`` is used by on-disk datasets and ``cache_dir`` by generated ones that
cache; each is ignored by datasets that do not use it, so a caller may pass both for any name.
Options a dataset does not know raise ValueError listing the valid ones.
"""

from __future__ import annotations

import importlib.resources
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from concord.core.data.base import (
    Dataset,
    DatasetFormatError,
    DatasetNotFoundError,
    check_fraction,
    split_dataset,
    stratified_split,
)
from concord.core.data.cifar import load_cifar10
from concord.core.data.mnist1d import load_mnist1d
from concord.core.data.plugin import load_user_dataset, user_dataset_options
from concord.core.data.pystdlib import load_pystdlib_chars
from concord.core.data.synthetic import load_gaussian_mixture
from concord.core.plugins import is_spec
from concord.core.registry import Registry
from concord.core.specs import DATASET_SPECS

DatasetLoader = Callable[..., Dataset]
DATASETS: Registry[DatasetLoader] = Registry("dataset", DATASET_SPECS)
DATASET_NAMES = ("mnist1d", "digits", "gaussian-mixture", "cifar10", "pystdlib-chars")
_CONTEXT_ARGS = ("seed", "root", "cache_dir")  # passed only to loaders that declare them
DIGITS_FILE = "digits.npz"  # package data next to this module; see scripts/export_digits.py
DIGITS_COUNT = 1797


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The shipped digits file → (pixels uint8 [1797, 64] in 0..16, labels uint8 [1797]).

    Read with `importlib.resources`, so it works from a wheel, an editable install or a zip.
    """
    resource = importlib.resources.files(__package__ or "concord.core.data") / DIGITS_FILE
    try:
        with resource.open("rb") as f, np.load(f, allow_pickle=False) as npz:
            data, target = np.asarray(npz["data"]), np.asarray(npz["target"])
    except FileNotFoundError:
        raise DatasetNotFoundError(
            f"{DIGITS_FILE} is missing from the installed concord.core.data package "
            "(scripts/export_digits.py regenerates it)"
        ) from None
    except (KeyError, ValueError, OSError) as e:
        raise DatasetFormatError(f"{DIGITS_FILE}: not a digits archive ({e})") from None
    if (
        data.dtype != np.uint8
        or target.dtype != np.uint8
        or data.shape != (DIGITS_COUNT, 64)
        or target.shape != (DIGITS_COUNT,)
        or int(data.max()) > 16
        or int(target.max()) > 9
    ):
        raise DatasetFormatError(
            f"{DIGITS_FILE}: expected uint8 data [{DIGITS_COUNT}, 64] in 0..16 and target "
            f"[{DIGITS_COUNT}] in 0..9, got {data.dtype} {data.shape} and {target.dtype} "
            f"{target.shape}"
        )
    return data, target


def load_digits_dataset(*, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """The 8×8 handwritten digits (1797 images, 10 classes), pixels scaled to [0, 1].

    The data is scikit-learn's ``load_digits`` copy (UCI optdigits), shipped with Concord as
    ``digits.npz`` (scripts/export_digits.py): loading needs no scikit-learn.
    Seeded stratified split: each class puts round(test_fraction · count) images in test;
    test_fraction in (0, 1), default 0.2.
    """
    tf = check_fraction("test_fraction", test_fraction)
    data, target = read_digits()
    x = (data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = target.astype(np.int64)
    split = stratified_split(y, tf, np.random.default_rng(seed))
    return split_dataset(
        "digits",
        x,
        y,
        split,
        num_classes=10,
        meta={
            "source": f"concord.core.data/{DIGITS_FILE} (scikit-learn load_digits)",
            "seed": seed,
            "test_fraction": tf,
        },
    )


DATASETS.add("mnist1d", load_mnist1d)
DATASETS.add("digits", load_digits_dataset)
DATASETS.add("gaussian-mixture", load_gaussian_mixture)
DATASETS.add("cifar10", load_cifar10)
DATASETS.add("pystdlib-chars", load_pystdlib_chars)


def dataset_options(name: str) -> list[str]:
    """The option names ``load_dataset(name, **options)`` accepts (besides seed/root/cache_dir);
    for a ``module:callable`` plug-in, what its callable declares (``num_samples`` included when
    it takes ``**kwargs``)."""
    if is_spec(name):
        declared = user_dataset_options(name)
        names = ["num_samples"] if declared is None else declared
        return [n for n in names if n not in _CONTEXT_ARGS]
    loader = DATASETS.get(name)
    params = inspect.signature(loader).parameters
    names = [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
    if loader is load_mnist1d:
        from concord.core.data.mnist1d import DEFAULTS

        names += list(DEFAULTS)
    return [n for n in names if n not in _CONTEXT_ARGS]


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    root: str | Path | None = None,
    cache_dir: str | Path | None = None,
    **options: Any,
) -> Dataset:
    """Load a dataset by name (see the module table); deterministic given (name, seed, options).

    ``name`` may be a ``module:callable`` dataset plug-in (`concord.core.data.plugin`).

    Raises `concord.core.registry.UnknownNameError` for an unknown name, ValueError for an unknown
    or invalid option or a negative seed, `DatasetNotFoundError` when on-disk files are missing.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ValueError(f"seed must be an integer ≥ 0, got {seed!r}")
    if is_spec(name):
        return load_user_dataset(name, seed=int(seed), root=root, cache_dir=cache_dir, **options)
    loader = DATASETS.get(name)
    valid = dataset_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"dataset {name!r} has no option(s) {', '.join(unknown)}; valid: "
            f"{', '.join(valid) or '(none)'}"
        )
    declared = inspect.signature(loader).parameters
    context = {"seed": int(seed), "root": root, "cache_dir": cache_dir}
    kwargs = {k: v for k, v in context.items() if k in declared}
    return loader(**kwargs, **options)
