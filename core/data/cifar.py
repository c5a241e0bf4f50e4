"""CIFAR-10 from local python-format batches, read with a restricted unpickler, plus augmentation.

Layout expected (the standard ``cifar-10-batches-py`` directory of cifar-10-python.tar.gz from
https://www.cs.toronto.edu/~kriz/cifar.html): ``data_batch_1`` … ``data_batch_5`` and
``test_batch``, each a pickled dict with ``data`` (uint8 ndarray [m, 3072], channel-major 32×32
images) and ``labels`` (list of m ints in 0..9). Nothing is ever downloaded.

Security: the batch files are Python pickles, and a pickle can call any importable function while
it is loaded (e.g. ``os.system``). `RestrictedUnpickler` therefore refuses every global except the
three that numpy's array pickling needs — ``numpy.core.multiarray._reconstruct`` (also spelled
``numpy._core.multiarray._reconstruct`` by numpy ≥ 2), ``numpy.ndarray`` and ``numpy.dtype`` — and
even those are wrapped: ``_reconstruct`` only builds plain ``numpy.ndarray`` objects and ``dtype``
refuses object dtypes (whose array payload would itself be an arbitrary pickle). Dicts, lists,
bytes, str and ints need no globals. Persistent ids are refused by the base class.

Preprocessing: pixels ÷ 255, then per channel (x − mean) / std with mean (0.4914, 0.4822, 0.4465)
and std (0.2023, 0.1994, 0.2010) — the convention of Tao Lin's code and relaysgd ``tasks/cifar.py``
(docs/algorithms.md#training-recipes). Augmentation (`augment_cifar`): random 32×32 crop of the
image zero-padded by 4 pixels (padding in raw pixel space, i.e. black) and a horizontal flip with
probability ½.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from concord.core.data.base import (
    Dataset,
    DatasetFormatError,
    DatasetNotFoundError,
    default_data_dir,
)
from concord.errors import UnsafePickleError as UnsafePickleError

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
# The normalised value of a black (0) pixel: what zero-padding in raw pixel space becomes.
CIFAR10_BLACK = tuple(-m / s for m, s in zip(CIFAR10_MEAN, CIFAR10_STD, strict=True))
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
DIR_NAME = "cifar-10-batches-py"
IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10


_RECONSTRUCT: Any = np.ndarray(0).__reduce__()[
    0
]  # numpy's array-reconstruction function, any version


def _safe_reconstruct(subtype: object, shape: object, dtype: object) -> np.ndarray:
    if subtype is not np.ndarray:
        raise UnsafePickleError(f"array reconstruction with subtype {subtype!r} refused")
    out: np.ndarray = _RECONSTRUCT(subtype, shape, dtype)
    return out


def _safe_dtype(*args: Any) -> np.dtype[Any]:
    dt: np.dtype[Any] = np.dtype(*args)
    if dt.hasobject:
        raise UnsafePickleError(f"object dtype {dt!r} refused (its payload would be a pickle)")
    return dt


_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _safe_reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): _safe_dtype,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler resolving only the numpy array-reconstruction globals (see module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"refusing to load global {module}.{name}: only numpy array reconstruction "
                f"({', '.join(f'{m}.{n}' for m, n in _ALLOWED)}) is allowed"
            ) from None


def restricted_load(data: bytes) -> Any:
    """Unpickle ``data`` with `RestrictedUnpickler` (encoding='bytes' for Python-2 pickles)."""
    return RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch file → (images uint8 [m, 3, 32, 32], labels int64 [m]); validates the structure."""
    try:
        obj = restricted_load(path.read_bytes())
    except UnsafePickleError as e:
        raise UnsafePickleError(f"{path}: {e}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise DatasetFormatError(f"{path}: not a CIFAR-10 python batch ({e})") from None
    if not isinstance(obj, dict):
        raise DatasetFormatError(f"{path}: expected a dict, got {type(obj).__name__}")
    d = {k.decode() if isinstance(k, bytes) else k: v for k, v in obj.items()}
    data, labels = d.get("data"), d.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise DatasetFormatError(f"{path}: 'data' must be a uint8 array [m, 3072]")
    if data.shape[1] != 3 * 32 * 32:
        raise DatasetFormatError(f"{path}: 'data' has {data.shape[1]} columns, expected 3072")
    if not isinstance(labels, list | np.ndarray) or len(labels) != data.shape[0]:
        raise DatasetFormatError(f"{path}: 'labels' must be a list of {data.shape[0]} ints")
    y = np.asarray(labels)
    if y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= NUM_CLASSES):
        raise DatasetFormatError(f"{path}: labels must be integers in 0..9")
    return data.reshape(-1, *IMAGE_SHAPE), y.astype(np.int64)


def resolve_root(root: str | Path | None) -> Path:
    """The batch directory: ``root`` itself or ``root/cifar-10-batches-py`` if that holds the files.

    Default: $CONCORD_DATA/cifar-10-batches-py, else ./data/cifar-10-batches-py.
    """
    if root is None:
        return default_data_dir() / DIR_NAME
    p = Path(root).expanduser()
    if not (p / TEST_FILE).is_file() and (p / DIR_NAME / TEST_FILE).is_file():
        return p / DIR_NAME
    return p


def normalize_cifar(images: np.ndarray) -> torch.Tensor:
    """uint8 [m, 3, 32, 32] → float32 normalised with `CIFAR10_MEAN` / `CIFAR10_STD`."""
    x = torch.from_numpy(images).to(torch.float32).div_(255.0)
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std)


def load_cifar10(*, root: str | Path | None = None, normalize: bool = True) -> Dataset:
    """CIFAR-10 (50 000 train / 10 000 test for the official files) as a `Dataset`.

    Raises `DatasetNotFoundError` naming the directory and missing files if any file is absent,
    `UnsafePickleError` if a file references a forbidden global, `DatasetFormatError` otherwise.
    """
    d = resolve_root(root)
    names = (*TRAIN_FILES, TEST_FILE)
    missing = [n for n in names if not (d / n).is_file()]
    if missing:
        raise DatasetNotFoundError(
            f"CIFAR-10 not found: expected directory {d.resolve()} containing "
            f"{', '.join(names)} (missing: {', '.join(missing)}). Nothing is downloaded: get "
            f"cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html, extract it, "
            f"and pass root=<path to {DIR_NAME}> or set CONCORD_DATA to its parent directory."
        )
    parts = [read_batch(d / n) for n in TRAIN_FILES]
    x_tr = np.concatenate([p[0] for p in parts])
    y_tr = np.concatenate([p[1] for p in parts])
    x_te, y_te = read_batch(d / TEST_FILE)

    def prep(x: np.ndarray) -> torch.Tensor:
        return normalize_cifar(x) if normalize else torch.from_numpy(x).to(torch.float32)

    return Dataset(
        name="cifar10",
        x_train=prep(x_tr),
        y_train=torch.from_numpy(y_tr),
        x_test=prep(x_te),
        y_test=torch.from_numpy(y_te),
        num_classes=NUM_CLASSES,
        input_shape=IMAGE_SHAPE,
        meta={
            "source": str(d.resolve()),
            "files": list(names),
            "normalize": normalize,
            "mean": list(CIFAR10_MEAN) if normalize else None,
            "std": list(CIFAR10_STD) if normalize else None,
        },
    )


def augment_cifar(
    x: torch.Tensor,
    generator: torch.Generator,
    *,
    padding: int = 4,
    fill: float | Sequence[float] = CIFAR10_BLACK,
) -> torch.Tensor:
    """Random crop (of the image padded by ``padding`` pixels of ``fill``) and horizontal flip.

    x: [..., C, H, W] (typically [k, B, 3, 32, 32]); returns a new tensor of the same shape. Each
    image draws its own offsets (oy, ox) ~ U{0 … 2·padding}² and a flip with probability ½ from
    ``generator``; one gather for the whole batch (no loop over images). ``fill`` defaults to the
    normalised black pixel, i.e. zero-padding in raw pixel space as in the usual RandomCrop before
    Normalize; pass 0.0 for unnormalised data. ``padding`` ≥ 0.
    """
    if x.dim() < 3:
        raise ValueError(f"x must have shape [..., C, H, W], got {tuple(x.shape)}")
    if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
        raise ValueError(f"padding must be an integer ≥ 0, got {padding!r}")
    *lead, C, H, W = x.shape
    flat = x.reshape(-1, C, H, W)
    M = flat.shape[0]
    fill_t = torch.as_tensor(fill, dtype=x.dtype, device=x.device).reshape(-1)
    if fill_t.numel() not in (1, C):
        raise ValueError(f"fill must be a number or {C} per-channel values, got {fill!r}")
    P = padding
    padded = fill_t.reshape(1, -1, 1, 1).expand(M, C, H + 2 * P, W + 2 * P).clone()
    padded[:, :, P : P + H, P : P + W] = flat
    dev = x.device
    oy = torch.randint(0, 2 * P + 1, (M,), generator=generator, device=dev)
    ox = torch.randint(0, 2 * P + 1, (M,), generator=generator, device=dev)
    flip = torch.rand(M, generator=generator, device=dev) < 0.5
    ar_h = torch.arange(H, device=dev)
    ar_w = torch.arange(W, device=dev)
    cols_src = torch.where(flip[:, None], (W - 1 - ar_w)[None, :], ar_w[None, :])
    rows = oy[:, None] + ar_h[None, :]  # [M, H]
    cols = ox[:, None] + cols_src  # [M, W]
    out = padded[
        torch.arange(M, device=dev)[:, None, None, None],
        torch.arange(C, device=dev)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]
    return out.reshape(*lead, C, H, W)
