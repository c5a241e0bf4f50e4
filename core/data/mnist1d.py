"""MNIST-1D, generated locally (Greydanus, "Scaling down deep learning", 2020; arXiv:2011.14439).

Ten hand-designed 1-D digit templates of length 12 are turned into 1-D signals of length 40 by the
published procedure, applied here to all samples at once (vectorised over samples):

1. add ε = 1e-8 to the template (so the template stays non-zero) and append p zeros,
   p ~ U{padding[0] … padding[1]};
2. linearly resample the padded signal to ``12 + padding[1]`` points (dilation);
3. multiply by ``1 + scale_coeff · (u − ½)``, u ~ U[0, 1);
4. translate circularly to the right by k ~ U{0 … max_translation − 1};
5. replace the zero (padding) positions by correlated noise — N(0, corr_noise_scale²) smoothed by a
   Gaussian filter with σ = 2 (radius 8, reflecting boundary);
6. add i.i.d. noise N(0, iid_noise_scale²) everywhere;
7. shear: subtract ``c · linspace(−½, ½)`` with c = shear_scale · (u − ½);
8. linearly resample to ``final_seq_length`` points.

Each class gets ``num_samples // 10`` samples; the samples are shuffled, standardised with the
scalar mean/std of the whole set (as published), and split: the first ``train_split`` fraction is
train. This is an independent implementation: randomness comes only from a numpy Generator seeded by
``seed`` (the published generator uses global RNG state), so values differ from the published
pickle while the distribution is the same.

Hyperparameters (published defaults): num_samples 5000 (≥ 10), train_split 0.8 (0, 1),
padding (36, 60) (0 ≤ low ≤ high), scale_coeff 0.4 [0, 2), max_translation 48 (≥ 1, ≤ 12 + high),
corr_noise_scale 0.25 (≥ 0), iid_noise_scale 0.02 (≥ 0), shear_scale 0.75 (≥ 0),
final_seq_length 40 (≥ 2).

Generated arrays are cached as ``mnist1d-<hash>.npz`` in the cache directory, keyed by every
parameter and the seed; they are read back with ``np.load(allow_pickle=False)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from concord.core.data.base import (
    Dataset,
    check_fraction,
    check_positive_int,
    default_cache_dir,
)

GENERATOR_VERSION = 1  # bump when the generation procedure changes (invalidates caches)

# The ten digit templates of the MNIST-1D paper (Greydanus 2020, Fig. 1): 12 points each.
_RAW_TEMPLATES = np.array(
    [
        [5, 6, 6.5, 6.75, 7, 7, 7, 7, 6.75, 6.5, 6, 5],
        [5, 3, 3, 3.4, 3.8, 4.2, 4.6, 5, 5.4, 5.8, 5, 5],
        [5, 6, 6.5, 6.5, 6, 5.25, 4.75, 4, 3.5, 3.5, 4, 5],
        [5, 6, 6.5, 6.5, 6, 5, 5, 6, 6.5, 6.5, 6, 5],
        [5, 4.4, 3.8, 3.2, 2.6, 2.6, 5, 5, 5, 5, 5, 5],
        [5, 3, 3, 3, 3, 5, 6, 6.5, 6.5, 6, 4.5, 5],
        [5, 4, 3.5, 3.25, 3, 3, 3, 3, 3.25, 3.5, 4, 5],
        [5, 7, 7, 6.6, 6.2, 5.8, 5.4, 5, 4.6, 4.2, 5, 5],
        [5, 4, 3.5, 3.5, 4, 5, 5, 4, 3.5, 3.5, 4, 5],
        [5, 4, 3.5, 3.5, 4, 5, 5, 5, 5, 4.7, 4.3, 5],
    ],
    dtype=np.float64,
)
TEMPLATE_LEN = 12
NUM_CLASSES = 10
_EPS = 1e-8
_SMOOTH_SIGMA = 2.0
_SMOOTH_RADIUS = 8  # truncate at 4σ, as scipy.ndimage.gaussian_filter does by default

DEFAULTS: dict[str, Any] = {
    "num_samples": 5000,
    "train_split": 0.8,
    "padding": (36, 60),
    "scale_coeff": 0.4,
    "max_translation": 48,
    "corr_noise_scale": 0.25,
    "iid_noise_scale": 0.02,
    "shear_scale": 0.75,
    "final_seq_length": 40,
}


def templates() -> np.ndarray:
    """[10, 12] float64: each raw template standardised, shifted to start (and end) at 0, ÷ 6."""
    x = _RAW_TEMPLATES - _RAW_TEMPLATES.mean(axis=1, keepdims=True)
    x /= x.std(axis=1, keepdims=True)
    x -= x[:, :1]
    scaled: np.ndarray = x / 6.0
    return scaled


def _resample(x: np.ndarray, lengths: np.ndarray, out_len: int) -> np.ndarray:
    """Linear resampling of each row's first ``lengths[m]`` values to ``out_len`` points.

    x: [M, L] (entries beyond a row's length are ignored); lengths: [M] ints in [2, L].
    Equivalent to interpolating (linspace(0, 1, len), row) at linspace(0, 1, out_len).
    """
    t = np.arange(out_len, dtype=np.float64) / (out_len - 1)
    pos = t[None, :] * (lengths[:, None] - 1).astype(np.float64)  # [M, out_len]
    i0 = np.minimum(np.floor(pos).astype(np.int64), lengths[:, None] - 2)
    frac = pos - i0
    left = np.take_along_axis(x, i0, axis=1)
    right = np.take_along_axis(x, i0 + 1, axis=1)
    mixed: np.ndarray = left * (1.0 - frac) + right * frac
    return mixed


def gaussian_smooth(noise: np.ndarray) -> np.ndarray:
    """Gaussian filter (σ = 2, radius 8) along the last axis with half-sample-symmetric boundary.

    Matches scipy.ndimage.gaussian_filter1d(noise, 2, mode="reflect") for each row.
    """
    offsets = np.arange(-_SMOOTH_RADIUS, _SMOOTH_RADIUS + 1, dtype=np.float64)
    w = np.exp(-0.5 * (offsets / _SMOOTH_SIGMA) ** 2)
    w /= w.sum()
    L = noise.shape[-1]
    padded = np.pad(noise, ((0, 0), (_SMOOTH_RADIUS, _SMOOTH_RADIUS)), mode="symmetric")
    out = np.zeros_like(noise)
    for j, wj in enumerate(w):  # 17 taps; vectorised over samples and positions
        out += wj * padded[:, j : j + L]
    return out


def _check_params(params: dict[str, Any]) -> dict[str, Any]:
    p = dict(params)
    p["num_samples"] = check_positive_int("num_samples", p["num_samples"], NUM_CLASSES)
    p["train_split"] = check_fraction("train_split", p["train_split"])
    pad = p["padding"]
    if (
        not isinstance(pad, list | tuple)
        or len(pad) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in pad)
        or not 0 <= pad[0] <= pad[1]
    ):
        raise ValueError(f"padding must be two integers 0 ≤ low ≤ high, got {pad!r}")
    p["padding"] = (int(pad[0]), int(pad[1]))
    if p["padding"][1] + TEMPLATE_LEN < 2:
        raise ValueError("padding high + 12 must be ≥ 2")
    p["max_translation"] = check_positive_int("max_translation", p["max_translation"])
    if p["max_translation"] > TEMPLATE_LEN + p["padding"][1]:
        raise ValueError(
            f"max_translation must be ≤ 12 + padding high = {TEMPLATE_LEN + p['padding'][1]}, "
            f"got {p['max_translation']}"
        )
    p["final_seq_length"] = check_positive_int("final_seq_length", p["final_seq_length"], 2)
    for name in ("scale_coeff", "corr_noise_scale", "iid_noise_scale", "shear_scale"):
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < float("inf"):
            raise ValueError(f"{name} must be a finite number ≥ 0, got {v!r}")
        p[name] = float(v)
    if p["scale_coeff"] >= 2.0:
        raise ValueError(
            f"scale_coeff must be < 2 (else signals may flip sign), got {p['scale_coeff']}"
        )
    return p


def generate_mnist1d(
    seed: int = 0, **params: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate MNIST-1D arrays: (x_train [N, F] float32, y_train [N] int64, x_test, y_test).

    ``params`` override `DEFAULTS`; F = final_seq_length. Deterministic given (seed, params).
    """
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown mnist1d option(s) {unknown}; valid: {', '.join(DEFAULTS)}")
    p = _check_params({**DEFAULTS, **params})
    rng = np.random.default_rng(seed)
    per_class = p["num_samples"] // NUM_CLASSES
    labels = np.repeat(np.arange(NUM_CLASSES, dtype=np.int64), per_class)
    M = labels.shape[0]
    low, high = p["padding"]
    L = TEMPLATE_LEN + high  # dilated length

    # 1-2. pad with a random number of zeros, then dilate to L points.
    padded = np.zeros((M, L), dtype=np.float64)
    padded[:, :TEMPLATE_LEN] = templates()[labels] + _EPS
    lengths = TEMPLATE_LEN + rng.integers(low, high + 1, size=M)
    x = _resample(padded, lengths, L)
    # 3. random scale.
    x *= 1.0 + p["scale_coeff"] * (rng.random(M) - 0.5)[:, None]
    # 4. circular translation to the right by k: new[j] = old[(j − k) mod L].
    k = rng.integers(0, p["max_translation"], size=M)
    src = (np.arange(L)[None, :] - k[:, None]) % L
    x = np.take_along_axis(x, src, axis=1)
    # 5-6. correlated noise where the signal is zero, i.i.d. noise everywhere.
    corr = gaussian_smooth(p["corr_noise_scale"] * rng.standard_normal((M, L)))
    x = np.where(x != 0.0, x, corr)
    x += p["iid_noise_scale"] * rng.standard_normal((M, L))
    # 7. shear.
    coeff = p["shear_scale"] * (rng.random(M) - 0.5)
    x -= coeff[:, None] * np.linspace(-0.5, 0.5, L)[None, :]
    # 8. resample to the final length.
    x = _resample(x, np.full(M, L), p["final_seq_length"])

    perm = rng.permutation(M)
    x, y = x[perm], labels[perm]
    x = (x - x.mean()) / x.std()
    split = int(M * p["train_split"])
    xf = x.astype(np.float32)
    return xf[:split], y[:split], xf[split:], y[split:]


def _cache_key(seed: int, params: dict[str, Any]) -> tuple[str, str]:
    desc = json.dumps(
        {"generator": "concord-mnist1d", "version": GENERATOR_VERSION, "seed": seed, **params},
        sort_keys=True,
    )
    return hashlib.sha256(desc.encode()).hexdigest()[:20], desc


def _read_cache(path: Path, desc: str) -> tuple[np.ndarray, ...] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["params"]) != desc:
                return None
            arrays = (z["x_train"], z["y_train"], z["x_test"], z["y_test"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    x_tr, y_tr = arrays[0], arrays[1]
    if x_tr.dtype != np.float32 or y_tr.dtype != np.int64 or len(x_tr) != len(y_tr):
        return None
    return arrays


def _write_cache(path: Path, desc: str, arrays: tuple[np.ndarray, ...]) -> bool:
    """Atomic write (temporary file + rename); returns False if the directory is not writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp.npz")
        try:
            with os.fdopen(fd, "wb") as fh:
                x_tr, y_tr, x_te, y_te = arrays
                np.savez(
                    fh, x_train=x_tr, y_train=y_tr, x_test=x_te, y_test=y_te, params=np.array(desc)
                )
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is readable like any file
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        return False
    return True


def load_mnist1d(
    *, seed: int = 0, cache_dir: str | Path | None = None, use_cache: bool = True, **params: Any
) -> Dataset:
    """MNIST-1D as a `Dataset` (input_shape (final_seq_length,), 10 classes), cached on disk.

    ``use_cache=False`` neither reads nor writes the cache.
    """
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise ValueError(
            f"unknown mnist1d option(s) {unknown}; valid: {', '.join(DEFAULTS)}, use_cache"
        )
    p = _check_params({**DEFAULTS, **params})
    p["padding"] = list(p["padding"])  # JSON form
    digest, desc = _cache_key(seed, p)
    path = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = path / f"mnist1d-{digest}.npz"
    arrays = _read_cache(path, desc) if use_cache else None
    hit = arrays is not None
    if arrays is None:
        arrays = generate_mnist1d(seed, **{**p, "padding": tuple(p["padding"])})
        cached = use_cache and _write_cache(path, desc, arrays)
    else:
        cached = True
    x_tr, y_tr, x_te, y_te = arrays
    return Dataset(
        name="mnist1d",
        x_train=torch.from_numpy(np.ascontiguousarray(x_tr)),
        y_train=torch.from_numpy(np.ascontiguousarray(y_tr)),
        x_test=torch.from_numpy(np.ascontiguousarray(x_te)),
        y_test=torch.from_numpy(np.ascontiguousarray(y_te)),
        num_classes=NUM_CLASSES,
        input_shape=(p["final_seq_length"],),
        meta={
            "source": "generated (Greydanus 2020 procedure)",
            "seed": seed,
            "generator_version": GENERATOR_VERSION,
            **p,
            "cache_path": str(path) if cached else None,
            "cache_hit": hit,
        },
    )
