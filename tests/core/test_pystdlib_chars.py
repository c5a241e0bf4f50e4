"""`pystdlib-chars`: the fixed stdlib corpus (file list, hashes, exclusions, groups), its samples
and held-out split, and the natural by-package partition (``partition.scheme = "groups"``)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from concord.core.data import DatasetFormatError, PartitionError, load_dataset, partition
from concord.core.data.pystdlib import (
    BUNDLE_BYTES,
    PINNED,
    VOCAB_SIZE,
    corpus_facts,
    decode,
    read_corpus,
    reference_scores,
    stdlib_files,
)


def _fake_stdlib(root: Path) -> Path:
    """A tiny stdlib: two packages, two single-file modules, and everything the corpus skips."""
    files = {
        "alpha/__init__.py": "import os\n" * 40,
        "alpha/core.py": "def f(x):\n    return x + 1\n" * 30,
        "beta/__init__.py": "class B:\n    pass\n" * 50,
        "gamma.py": "print('gamma')\n" * 40,
        "delta.py": "x = [1, 2, 3]\n" * 40,
        "test/test_alpha.py": "assert True\n" * 40,
        "alpha/tests/test_core.py": "assert False\n" * 40,
        "idlelib/editor.py": "EDITOR = 1\n" * 40,
        "site-packages/pkg/mod.py": "third = 'party'\n" * 40,
        "config-3.11-x86_64-linux-gnu/python-config.py": "build = 1\n" * 40,
        "alpha/data.txt": "not python\n" * 40,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_corpus_file_list_skips_tests_idle_site_packages_and_build_dirs(tmp_path: Path) -> None:
    root = _fake_stdlib(tmp_path)
    assert stdlib_files(root) == [
        "alpha/__init__.py",
        "alpha/core.py",
        "beta/__init__.py",
        "delta.py",
        "gamma.py",
    ]
    corpus = read_corpus(root)
    # packages by name, then one bundle of the (small) single-file modules
    assert corpus.group_names == ["alpha", "beta", "modules:delta..gamma"]
    assert corpus.group.tolist() == [0, 0, 1, 2, 2]
    assert corpus.num_bytes == sum((root / f).stat().st_size for f in corpus.files)


def test_the_real_corpus_is_deterministic_and_matches_its_pin() -> None:
    first, second = read_corpus(), read_corpus()
    assert first.files == second.files
    assert first.files == sorted(first.files)
    assert corpus_facts(first) == corpus_facts(second)
    assert np.array_equal(first.codes, second.codes)
    parts = {p for f in first.files for p in f.split("/")[:-1]}
    assert not parts & {"test", "tests", "idle_test", "idlelib", "site-packages"}
    assert {"email", "asyncio", "xml", "json"} <= set(first.group_names)
    # bundles of single-file modules reach BUNDLE_BYTES (the last one may be short)
    sizes = np.bincount(first.group, weights=first.lengths)
    bundles = [i for i, n in enumerate(first.group_names) if n.startswith("modules:")]
    assert all(sizes[i] >= BUNDLE_BYTES for i in bundles[:-1])
    pin = PINNED.get(f"{sys.implementation.name} {sys.version.split()[0]}")
    if pin is not None:
        assert corpus_facts(first) == pin


def test_samples_are_the_next_character_of_corpus_windows(tmp_path: Path) -> None:
    root = _fake_stdlib(tmp_path)
    data = load_dataset("pystdlib-chars", seed=3, root=root, num_samples=40, seq_len=8)
    assert data.input_shape == (8,)
    assert data.num_classes == VOCAB_SIZE
    assert data.num_train + data.num_test == 40
    text = "".join((root / f).read_text() for f in stdlib_files(root))
    for x, y in zip(data.x_train[:10], data.y_train[:10], strict=True):
        assert decode(torch.cat([x, y.float().view(1)])) in text
    assert data.groups_train is not None
    assert data.meta["files"] == 5
    assert len(data.meta["corpus_sha256"]) == 64


def test_reference_scores_count_the_training_windows(tmp_path: Path) -> None:
    """A corpus of one repeated line: the bigram reference predicts every next character of a
    line it saw (accuracy 1 on the held-out windows, loss well below the unigram's), exact
    because every successor is deterministic in "abcabc…"."""
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("abc" * 400)
    data = load_dataset("pystdlib-chars", seed=0, root=root, num_samples=100, seq_len=4)
    refs = reference_scores(data)
    assert refs["bigram_accuracy"] == 1.0
    # windows of 5 characters start at every residue mod 3: the labels are a, b and c alike
    assert refs["unigram_accuracy"] == pytest.approx(1 / 3, abs=0.2)
    # add-one smoothing over 98 characters keeps both losses above 0; the bigram is sharper
    assert 0 < refs["bigram_loss"] < refs["unigram_loss"] / 1.5
    assert reference_scores(data, test_samples=3)["bigram_accuracy"] == 1.0
    with pytest.raises(ValueError, match="test_samples"):
        reference_scores(data, test_samples=0)


def test_loading_is_seeded_and_holds_out_a_fraction_of_every_package() -> None:
    a = load_dataset("pystdlib-chars", seed=0, num_samples=3000)
    b = load_dataset("pystdlib-chars", seed=0, num_samples=3000)
    c = load_dataset("pystdlib-chars", seed=1, num_samples=3000)
    assert torch.equal(a.x_train, b.x_train)
    assert torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.x_train, c.x_train)
    assert a.num_train + a.num_test == 3000
    assert a.num_test == pytest.approx(300, abs=len(a.meta["group_names"]) / 2)
    assert a.meta["corpus_sha256"] == c.meta["corpus_sha256"]
    assert a.groups_train is not None  # shuffled, not package after package (test set alike)
    assert bool((a.groups_train[1:] < a.groups_train[:-1]).any())


def test_a_different_corpus_hash_is_a_clear_error(tmp_path: Path) -> None:
    root = _fake_stdlib(tmp_path)
    with pytest.raises(DatasetFormatError, match=r"expected_sha256 = 00ff.*differs"):
        load_dataset("pystdlib-chars", root=root, num_samples=40, expected_sha256="00ff")
    with pytest.raises(ValueError, match="seq_len must be an integer"):
        load_dataset("pystdlib-chars", root=root, seq_len=0)


def _package_partition(n: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    data = load_dataset("pystdlib-chars", seed=0, num_samples=4000)
    assert data.groups_train is not None
    groups = data.groups_train.numpy()
    parts = partition(data.y_train.numpy(), n, "groups", seed=seed, groups=groups)
    return parts, groups


@pytest.mark.parametrize("n", [4, 16, 32])
def test_package_partition_is_whole_packages_disjoint_complete_and_deterministic(n: int) -> None:
    parts, groups = _package_partition(n)
    flat = np.concatenate(parts)
    assert np.array_equal(np.sort(flat), np.arange(groups.size))  # disjoint and complete
    owner = np.empty(groups.size, np.int64)
    for i, p in enumerate(parts):
        owner[p] = i
        assert p.size > 0
    for g in np.unique(groups):  # every package lies with exactly one peer
        assert np.unique(owner[groups == g]).size == 1
    again, _ = _package_partition(n)
    assert all(np.array_equal(p, q) for p, q in zip(parts, again, strict=True))


def test_more_peers_than_packages_is_an_error_naming_the_limit() -> None:
    data = load_dataset("pystdlib-chars", seed=0, num_samples=4000)
    assert data.groups_train is not None
    limit = int(np.unique(data.groups_train.numpy()).size)
    with pytest.raises(PartitionError, match=f"{limit} groups for {limit + 1} peers"):
        partition(data.y_train.numpy(), limit + 1, "groups", groups=data.groups_train.numpy())
