"""``pystdlib-chars``: next-character prediction on the running interpreter's standard library.

A language-modelling task with *natural* heterogeneity and nothing to download (the idea of
LEAF's Shakespeare-by-speaker split, Caldas et al. 2018): the corpus is the ``.py`` source of the
standard library of the interpreter that runs Concord, and each training sequence carries the
top-level package it comes from, so ``partition.scheme = "groups"`` gives each peer whole
packages (``email``, ``asyncio``, ``xml``, …) — code that differs in vocabulary, style and size the
way real users' data does.

Corpus (fixed for a given Python build):

* the ``*.py`` files under ``sysconfig.get_paths()["stdlib"]`` (or ``root``), walked in sorted
  order of their POSIX relative paths, without test code (any directory named ``test``,
  ``tests`` or ``idle_test``), ``idlelib``, ``site-packages``/``dist-packages`` and top-level
  directories that are not package names (the build's ``config-3.x-<platform>``);
* ``files_sha256``: SHA-256 of the newline-joined relative paths; ``corpus_sha256``: SHA-256 over
  every file's path, byte length and bytes. Both go into ``Dataset.meta``; the option
  ``expected_sha256`` makes a different corpus (another Python version or a patched stdlib) an
  error instead of a silent change. `PINNED` lists the hashes measured for known builds.

Samples: every file is cut into non-overlapping windows of ``seq_len + 1`` bytes (a file's tail
shorter than that is dropped). A sample's input is the first ``seq_len`` characters, as float32
codes of the vocabulary; its label is the character that follows (a ``VOCAB_SIZE``-way
classification, so the standard classification task, accuracy and loss apply unchanged).
Vocabulary: 0 = ``<unk>`` (any other byte, including every byte of a non-ASCII UTF-8 character),
1 = tab, 2 = newline, 3 … 97 = the printable ASCII characters 32 … 126.

Groups: every top-level package directory is one group; the single-file top-level modules, in
sorted order, are bundled into consecutive groups of at least `BUNDLE_BYTES` bytes each (the last
bundle takes the rest), named ``modules:<first>..<last>``.

Sampling (deterministic in ``seed``): ``num_samples`` windows in all (or every window, if fewer),
allocated to groups in proportion to their window counts (largest remainders), drawn without
replacement within each group; ``round(test_fraction · a_g)`` of group g's ``a_g`` windows are
held out as its test samples; both sets are then shuffled (a prefix of the test set, as
``dataset.test_samples`` takes, spans every package). Windows never overlap, so no test character
is a training input.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from concord.core.data.base import (
    Dataset,
    DatasetFormatError,
    DatasetNotFoundError,
    check_fraction,
    check_positive_int,
)

NAME = "pystdlib-chars"
EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "__pycache__"}
)
BUNDLE_BYTES = 256 * 1024  # single-file modules are grouped into bundles of about this size
VOCAB_SIZE = 98
UNK, TAB, NEWLINE, FIRST_PRINTABLE = 0, 1, 2, 3

PINNED: dict[str, dict[str, str | int]] = {
    "cpython 3.11.7": {
        "files": 673,
        "bytes": 11352100,
        "groups": 47,
        "files_sha256": "752fc191cc2285b7f778692444b4f7a7996d85be00d74a45ddbcbc5dc4074d20",
        "corpus_sha256": "26c300572ee22fa112c189a04c4346daa7da690c9012ec5c5714b4f0c02fb5ee",
    },
}
"""Measured corpora: ``"<implementation> <version>"`` → files, bytes and the two hashes
(`corpus_facts`). Informative: a run checks its corpus only against ``expected_sha256``."""

_LOADED: dict[str, str | int] = {}
"""`corpus_facts` of the corpus this process last read (`read_corpus`; empty: none), which
`corpus_host_facts` gives the host facts of the run (`concord.runtime.hostinfo`)."""


def _byte_table() -> np.ndarray:
    table = np.full(256, UNK, dtype=np.uint8)
    table[ord("\t")] = TAB
    table[ord("\n")] = NEWLINE
    table[32:127] = np.arange(FIRST_PRINTABLE, FIRST_PRINTABLE + 95, dtype=np.uint8)
    return table


BYTE_TO_CODE = _byte_table()


def decode(codes: np.ndarray | torch.Tensor) -> str:
    """Vocabulary codes back to text (``<unk>`` shown as ``\\ufffd``), for inspection."""
    chars = ["\ufffd", "\t", "\n", *map(chr, range(32, 127))]
    return "".join(chars[int(c)] for c in np.asarray(codes).reshape(-1))


def default_stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path) -> list[str]:
    """The corpus files: sorted POSIX paths relative to ``root`` (module docstring)."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        top = rel.parts[0] if rel.parts else ""
        if top and not top.isidentifier():
            dirnames.clear()  # config-3.x-<platform> and the like: build files, not library
            continue
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        found.extend((rel / f).as_posix() for f in filenames if f.endswith(".py"))
    return sorted(found)


def group_of(path: str) -> str | None:
    """A file's top-level package, or None for a single-file top-level module."""
    head, sep, _ = path.partition("/")
    return head if sep else None


@dataclass(frozen=True)
class Corpus:
    """The encoded corpus: ``codes`` (uint8, all files concatenated), per-file ``offsets`` and
    ``lengths`` into it, per-file ``group`` ids naming ``group_names``, and the hashes."""

    root: Path
    files: list[str]
    codes: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    group: np.ndarray
    group_names: list[str]
    files_sha256: str
    corpus_sha256: str

    @property
    def num_bytes(self) -> int:
        return int(self.codes.shape[0])


def read_corpus(root: Path | None = None) -> Corpus:
    """Read, hash and encode the corpus under ``root`` (default: the running stdlib)."""
    base = default_stdlib_root() if root is None else Path(root)
    if not base.is_dir():
        raise DatasetNotFoundError(f"dataset {NAME!r}: standard library directory {base} not found")
    files = stdlib_files(base)
    if not files:
        raise DatasetNotFoundError(f"dataset {NAME!r}: no .py files under {base}")
    corpus_hash = hashlib.sha256()
    blobs: list[bytes] = []
    for rel in files:
        blob = (base / rel).read_bytes()
        corpus_hash.update(f"{rel}\0{len(blob)}\0".encode())
        corpus_hash.update(blob)
        blobs.append(blob)
    lengths = np.array([len(b) for b in blobs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    raw = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    names, group = _groups(files, lengths)
    corpus = Corpus(
        root=base,
        files=files,
        codes=BYTE_TO_CODE[raw],
        offsets=offsets,
        lengths=lengths,
        group=group,
        group_names=names,
        files_sha256=hashlib.sha256("\n".join(files).encode()).hexdigest(),
        corpus_sha256=corpus_hash.hexdigest(),
    )
    _LOADED.clear()
    _LOADED.update(corpus_facts(corpus))
    return corpus


def corpus_host_facts() -> dict[str, str | int]:
    """The corpus this process read (`read_corpus`), as host facts with dotted keys
    ``data.pystdlib-chars.<fact>`` (`corpus_facts`: files, bytes, groups, ``files_sha256``,
    ``corpus_sha256``); empty when it read none. `concord.runtime.hostinfo.host_facts` records
    them when this module is loaded, so a run's manifest and a report's ``preset.json`` name the
    corpus, and ``concord report verify`` can tell a different corpus from another host."""
    return {f"data.{NAME}.{key}": value for key, value in _LOADED.items()}


def _groups(files: list[str], lengths: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Group id per file: packages by name (sorted), then bundles of single-file modules."""
    packages = sorted({g for f in files if (g := group_of(f)) is not None})
    index = {p: i for i, p in enumerate(packages)}
    names = list(packages)
    group = np.empty(len(files), dtype=np.int64)
    bundle: list[int] = []
    size = 0

    def close() -> None:
        nonlocal size
        first, last = (files[bundle[j]].removesuffix(".py") for j in (0, -1))
        group[bundle] = len(names)
        names.append(f"modules:{first}..{last}")
        bundle.clear()
        size = 0

    for i, f in enumerate(files):
        g = group_of(f)
        if g is not None:
            group[i] = index[g]
            continue
        bundle.append(i)
        size += int(lengths[i])
        if size >= BUNDLE_BYTES:
            close()
    if bundle:
        close()
    return names, group


def corpus_facts(corpus: Corpus) -> dict[str, str | int]:
    """What identifies a corpus: file count, bytes, groups and the two hashes."""
    return {
        "files": len(corpus.files),
        "bytes": corpus.num_bytes,
        "groups": len(corpus.group_names),
        "files_sha256": corpus.files_sha256,
        "corpus_sha256": corpus.corpus_sha256,
    }


def _allocate(counts: np.ndarray, total: int) -> np.ndarray:
    """``total`` split over groups in proportion to ``counts`` (largest remainders, ties by
    group order), each share at most its count."""
    if total >= int(counts.sum()):
        return counts.copy()
    raw = total * counts / counts.sum()
    share = np.floor(raw).astype(np.int64)
    left = total - int(share.sum())
    share[np.argsort(-(raw - share), kind="stable")[:left]] += 1
    capped: np.ndarray = np.minimum(share, counts)
    return capped


def load_pystdlib_chars(
    *,
    seed: int = 0,
    root: str | Path | None = None,
    num_samples: int = 40000,
    seq_len: int = 64,
    test_fraction: float = 0.1,
    expected_sha256: str | None = None,
) -> Dataset:
    """The ``pystdlib-chars`` dataset (module docstring); ``root`` overrides the stdlib directory.

    ``num_samples`` ≥ 2 windows in all (train + test), ``seq_len`` ≥ 1 input characters,
    ``test_fraction`` in (0, 1), ``expected_sha256``: the required ``corpus_sha256`` (None: any).
    """
    total = check_positive_int("num_samples", num_samples, 2)
    length = check_positive_int("seq_len", seq_len)
    tf = check_fraction("test_fraction", test_fraction)
    corpus = read_corpus(None if root is None else Path(root))
    if expected_sha256 is not None and corpus.corpus_sha256 != expected_sha256:
        raise DatasetFormatError(
            f"dataset {NAME!r}: the corpus under {corpus.root} ({len(corpus.files)} files, "
            f"{sys.implementation.name} {sys.version.split()[0]}) has sha256 "
            f"{corpus.corpus_sha256}, but dataset.options.expected_sha256 = {expected_sha256}: "
            "this standard library differs from the pinned one; run with the pinned Python, or "
            "drop expected_sha256 to accept this corpus (its hash is in the dataset metadata)"
        )
    window = length + 1
    per_file = corpus.lengths // window
    starts = np.repeat(corpus.offsets, per_file) + window * (
        np.arange(int(per_file.sum())) - np.repeat(np.cumsum(per_file) - per_file, per_file)
    )
    groups = np.repeat(corpus.group, per_file)
    counts = np.bincount(groups, minlength=len(corpus.group_names))
    shares = _allocate(counts, total)
    rng = np.random.default_rng(seed)
    train_idx: list[np.ndarray] = []
    test_idx: list[np.ndarray] = []
    for g, share in enumerate(shares.tolist()):
        members = np.flatnonzero(groups == g)
        chosen = np.sort(rng.choice(members, size=share, replace=False))
        held = np.zeros(share, dtype=bool)
        held[rng.choice(share, size=round(tf * share), replace=False)] = True
        test_idx.append(chosen[held])
        train_idx.append(chosen[~held])
    # shuffled: `dataset.test_samples` evaluates a prefix of the test set, which must not be
    # the first packages only
    tr, te = rng.permutation(np.concatenate(train_idx)), rng.permutation(np.concatenate(test_idx))
    if tr.size == 0 or te.size == 0:
        raise DatasetFormatError(
            f"dataset {NAME!r}: num_samples={total} and test_fraction={tf} leave "
            f"{tr.size} training and {te.size} test sequences; both must be non-empty"
        )
    offsets = np.arange(window, dtype=np.int64)

    def windows(idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w = corpus.codes[starts[idx][:, None] + offsets]
        x = torch.from_numpy(w[:, :length].astype(np.float32))
        return x, torch.from_numpy(w[:, length].astype(np.int64))

    x_train, y_train = windows(tr)
    x_test, y_test = windows(te)
    meta: dict[str, Any] = {
        "source": f"{corpus.root} (*.py of the running interpreter's standard library)",
        "python": f"{sys.implementation.name} {sys.version.split()[0]}",
        **corpus_facts(corpus),
        "group_names": corpus.group_names,
        "vocabulary": "0 <unk>, 1 tab, 2 newline, 3..97 ASCII 32..126",
        "seq_len": length,
        "num_samples": total,
        "test_fraction": tf,
        "seed": seed,
        "windows": int(per_file.sum()),
    }
    return Dataset(
        name=NAME,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        num_classes=VOCAB_SIZE,
        input_shape=(length,),
        meta=meta,
        groups_train=torch.from_numpy(groups[tr].astype(np.int64)),
    )


def reference_scores(dataset: Dataset, test_samples: int | None = None) -> dict[str, float]:
    """What a model without the transformer's context reaches on ``dataset``'s first
    ``test_samples`` test windows (None: all): the **unigram** reference (always the training
    labels' most frequent character; loss of their add-one-smoothed frequencies) and the
    **bigram** reference (the most frequent successor of the window's last character; loss of
    add-one-smoothed successor frequencies), both counted over every character pair of the
    training windows. Keys ``unigram_accuracy``, ``unigram_loss``, ``bigram_accuracy``,
    ``bigram_loss`` (accuracy a fraction, loss in nats: perplexity = exp(loss))."""
    x_tr = dataset.x_train.numpy().astype(np.int64)
    y_tr = dataset.y_train.numpy().astype(np.int64)
    stop = None if test_samples is None else check_positive_int("test_samples", test_samples)
    x_te = dataset.x_test.numpy().astype(np.int64)[:stop]
    y_te = dataset.y_test.numpy().astype(np.int64)[:stop]
    vocab = dataset.num_classes
    unigram = np.bincount(y_tr, minlength=vocab).astype(np.float64) + 1.0
    unigram /= unigram.sum()
    seqs = np.concatenate([x_tr, y_tr[:, None]], axis=1)
    pairs = np.ones((vocab, vocab), dtype=np.float64)
    np.add.at(pairs, (seqs[:, :-1].ravel(), seqs[:, 1:].ravel()), 1.0)
    pairs /= pairs.sum(axis=1, keepdims=True)
    last = x_te[:, -1]
    return {
        "unigram_accuracy": float(np.mean(y_te == int(np.argmax(unigram)))),
        "unigram_loss": float(-np.mean(np.log(unigram[y_te]))),
        "bigram_accuracy": float(np.mean(np.argmax(pairs[last], axis=1) == y_te)),
        "bigram_loss": float(-np.mean(np.log(pairs[last, y_te]))),
    }
