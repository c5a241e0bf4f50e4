#!/usr/bin/env python3
"""Write core/data/digits.npz, the `digits` dataset Concord ships, from scikit-learn's bundled copy.

The file holds scikit-learn's ``load_digits()`` (the UCI optdigits test set: 1797 8×8 images,
pixel counts 0..16, 10 classes) as two arrays: ``data`` uint8 [1797, 64] and ``target`` uint8
[1797]. Run once (needs scikit-learn: ``pip install 'concord[sklearn]'``)::

    .venv/bin/python scripts/export_digits.py [OUT]      # default: core/data/digits.npz

The archive is written with fixed timestamps so that re-running it does not change the file.
tests/core/test_datasets.py checks the shipped file against scikit-learn's copy.
"""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "core" / "data" / "digits.npz"


def digits_arrays() -> dict[str, np.ndarray]:
    """scikit-learn's digits as the compact arrays the .npz stores (lossless: pixels are 0..16)."""
    bunch = load_digits()
    data = np.asarray(bunch.data)
    target = np.asarray(bunch.target)
    if data.min() < 0 or data.max() > 16 or not np.array_equal(data, np.round(data)):
        raise SystemExit("unexpected digits pixels: expected integers 0..16")
    return {"data": data.astype(np.uint8), "target": target.astype(np.uint8)}


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Like ``np.savez_compressed`` but byte-reproducible (fixed member timestamps and order)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, array in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else DEFAULT_OUT
    arrays = digits_arrays()
    write_npz(out, arrays)
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(arrays['target'])} images)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
