"""A dataset of the user's: ``[dataset] name = "module:callable"`` (`concord.core.plugins`
finds the module: working directory, ``--plugin-path``, installed packages).

The callable is called with the keywords it declares among ``seed``, ``root``, ``cache_dir`` and
``num_samples`` (``dataset.samples``), plus ``dataset.options``; it must be deterministic in them
(every peer process calls it and must see the same data). It returns one of:

* a `concord.core.data.Dataset`;
* a mapping with ``x_train``, ``y_train``, ``x_test``, ``y_test`` (numpy arrays or tensors) and
  optionally ``num_classes`` (default: max label + 1), ``groups_train`` (one natural group id per
  training sample — a writer, a hospital, a speaker — for partition schemes that use it) and
  ``name``;
* a tuple ``(x_train, y_train, x_test, y_test)``;
* a tuple ``(train, test)`` of map-style torch datasets (``len`` and ``ds[i] -> (x, y)``), read
  once into memory.

Features become float32, labels int64 in 0 … num_classes − 1; anything else is a
`DatasetFormatError` naming the plug-in and the field.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from concord.core.data.base import Dataset, DatasetFormatError
from concord.core.plugins import resolve

_CONTEXT = ("seed", "root", "cache_dir", "num_samples")


def user_dataset_options(spec: str) -> list[str] | None:
    """The options ``spec``'s callable declares (None: it takes ``**kwargs``, any option)."""
    return _declared(resolve(spec, "dataset"))


def _declared(fn: Any) -> list[str] | None:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def _tensor(spec: str, field: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise DatasetFormatError(
            f"dataset {spec!r}: {field} is a {type(value).__name__}, not an array ({exc})"
        ) from None


def _labels(spec: str, field: str, value: Any) -> torch.Tensor:
    y = _tensor(spec, field, value)
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.dim() != 1:
        raise DatasetFormatError(
            f"dataset {spec!r}: {field} must be a 1-D integer array; got {y.dtype} {tuple(y.shape)}"
        )
    return y.to(torch.int64)


def _features(spec: str, field: str, value: Any) -> torch.Tensor:
    x = _tensor(spec, field, value)
    if x.dim() < 2 or not (x.dtype.is_floating_point or x.dtype in (torch.uint8, torch.int64)):
        raise DatasetFormatError(
            f"dataset {spec!r}: {field} must be a numeric array [N, ...]; got {x.dtype} "
            f"{tuple(x.shape)}"
        )
    return x.to(torch.float32).contiguous()


def _read_torch_dataset(spec: str, field: str, ds: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A map-style dataset read into two tensors (x stacked, y as int64)."""
    try:
        n = len(ds)
        items = [ds[i] for i in range(n)]
    except Exception as exc:
        raise DatasetFormatError(f"dataset {spec!r}: reading {field} failed: {exc!r}") from None
    if n == 0:
        raise DatasetFormatError(f"dataset {spec!r}: {field} is empty")
    if not all(isinstance(it, Sequence) and len(it) == 2 for it in items[:1]):
        raise DatasetFormatError(
            f"dataset {spec!r}: {field}[0] is a {type(items[0]).__name__}; expected (x, y)"
        )
    xs = [torch.as_tensor(np.asarray(x)) for x, _ in items]
    ys = [int(y) for _, y in items]
    return torch.stack(xs), torch.tensor(ys, dtype=torch.int64)


def as_dataset(spec: str, out: Any) -> Dataset:
    """What a dataset plug-in returned, checked and converted (module docstring)."""
    if isinstance(out, Dataset):
        return out
    groups: torch.Tensor | None = None
    num_classes: int | None = None
    name = spec
    if isinstance(out, Mapping):
        missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in out]
        if missing:
            raise DatasetFormatError(
                f"dataset {spec!r} returned a mapping without {', '.join(missing)}"
            )
        x_tr, y_tr = (
            _features(spec, "x_train", out["x_train"]),
            _labels(spec, "y_train", out["y_train"]),
        )
        x_te, y_te = (
            _features(spec, "x_test", out["x_test"]),
            _labels(spec, "y_test", out["y_test"]),
        )
        if out.get("groups_train") is not None:
            groups = _labels(spec, "groups_train", out["groups_train"])
        if out.get("num_classes") is not None:
            num_classes = int(out["num_classes"])
        name = str(out.get("name", spec))
    elif isinstance(out, tuple) and len(out) == 4:
        x_tr, y_tr = _features(spec, "x_train", out[0]), _labels(spec, "y_train", out[1])
        x_te, y_te = _features(spec, "x_test", out[2]), _labels(spec, "y_test", out[3])
    elif isinstance(out, tuple) and len(out) == 2:
        (x_tr, y_tr), (x_te, y_te) = (
            _read_torch_dataset(spec, "train", out[0]),
            _read_torch_dataset(spec, "test", out[1]),
        )
        x_tr, x_te = _features(spec, "train x", x_tr), _features(spec, "test x", x_te)
    else:
        raise DatasetFormatError(
            f"dataset {spec!r} returned a {type(out).__name__}; expected a Dataset, a mapping "
            "with x_train/y_train/x_test/y_test, (x_train, y_train, x_test, y_test) or "
            "(train, test) map-style datasets"
        )
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise DatasetFormatError(
            f"dataset {spec!r}: train samples have shape {tuple(x_tr.shape[1:])}, test samples "
            f"{tuple(x_te.shape[1:])}"
        )
    for field, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if x.shape[0] != y.shape[0]:
            raise DatasetFormatError(
                f"dataset {spec!r}: {x.shape[0]} {field} samples but {y.shape[0]} labels"
            )
        if y.numel() and int(y.min()) < 0:
            raise DatasetFormatError(f"dataset {spec!r}: {field} labels must be ≥ 0")
    if groups is not None and groups.shape[0] != x_tr.shape[0]:
        raise DatasetFormatError(
            f"dataset {spec!r}: groups_train has {groups.shape[0]} entries for "
            f"{x_tr.shape[0]} training samples"
        )
    top = max(int(y_tr.max()) if y_tr.numel() else 0, int(y_te.max()) if y_te.numel() else 0)
    classes = num_classes if num_classes is not None else top + 1
    try:
        return Dataset(
            name=name,
            x_train=x_tr,
            y_train=y_tr,
            x_test=x_te,
            y_test=y_te,
            num_classes=classes,
            input_shape=tuple(x_tr.shape[1:]),
            meta={"source": spec},
            groups_train=groups,
        )
    except ValueError as exc:
        raise DatasetFormatError(str(exc)) from None


def load_user_dataset(
    spec: str,
    *,
    seed: int,
    root: Any = None,
    cache_dir: Any = None,
    num_samples: int | None = None,
    **options: Any,
) -> Dataset:
    """Call the plug-in ``spec`` (module docstring) and return its `Dataset`."""
    fn = resolve(spec, "dataset")
    declared = _declared(fn)
    context = {"seed": seed, "root": root, "cache_dir": cache_dir, "num_samples": num_samples}
    if declared is not None:
        unknown = sorted(set(options) - set(declared))
        if unknown:
            raise ValueError(
                f"dataset {spec!r} has no option(s) {', '.join(unknown)}; its callable takes "
                f"{', '.join(p for p in declared if p not in _CONTEXT) or '(none)'}"
            )
        context = {k: v for k, v in context.items() if k in declared}
    else:
        context = {k: v for k, v in context.items() if v is not None or k == "seed"}
    return as_dataset(spec, fn(**context, **options))
