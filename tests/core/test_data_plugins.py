"""Data plug-ins for heterogeneity studies: a ``module:callable`` dataset in every accepted
return form (and a clear error for the others), natural groups carried into the partition,
partition schemes that see features and groups, quantity skew, the partition digest, and
plug-ins imported from the working directory or ``CONCORD_PLUGIN_PATH``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from concord.core.config import load_config
from concord.core.data import DatasetFormatError, load_dataset, partition, partition_digest
from concord.core.plugins import PLUGIN_PATH_ENV, PluginError, resolve
from concord.core.task import ClassificationTask, load_task_data, make_partition

PLUGIN = '''
import numpy as np
import torch


def _arrays(seed, n=400):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + 2 * (x[:, 1] > 0)
    return x, y


def as_mapping(seed, num_samples=None, writers=20):
    x, y = _arrays(seed, num_samples or 400)
    return {"x_train": x[:300], "y_train": y[:300], "x_test": x[300:], "y_test": y[300:],
            "groups_train": np.arange(300) % writers, "num_classes": 4, "name": "toy"}


def as_tuple(seed):
    x, y = _arrays(seed)
    return x[:300], y[:300], x[300:], y[300:]


class _Map(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), int(self.y[i])


def as_torch(seed):
    x, y = _arrays(seed)
    return _Map(x[:300], y[:300]), _Map(x[300:], y[300:])


def bad_return(seed):
    return [1, 2, 3]


def bad_labels(seed):
    x, y = _arrays(seed)
    return x[:300], x[:300, 0], x[300:], y[300:]


def by_feature(labels, n, seed, features, groups):
    """Split on the sign of the first feature, then by the natural groups' parity."""
    assert groups is not None
    order = np.lexsort((groups % 2, features[:, 0] > 0))
    return np.array_split(order, n)
'''


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A study directory holding ``toydata.py``, as the working directory."""
    (tmp_path / "toydata.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # undone after the test (resolve adds cwd too)
    return tmp_path


@pytest.mark.parametrize("fn", ["as_mapping", "as_tuple", "as_torch"])
def test_a_dataset_plugin_in_each_return_form_loads_the_same_data(
    plugin_dir: Path, fn: str
) -> None:
    data = load_dataset(f"toydata:{fn}", seed=3)
    assert data.x_train.shape == (300, 6)
    assert data.x_train.dtype == torch.float32
    assert data.y_train.dtype == torch.int64
    assert data.num_classes == 4
    assert data.input_shape == (6,)
    ref = load_dataset("toydata:as_tuple", seed=3)
    torch.testing.assert_close(data.x_train, ref.x_train, rtol=0, atol=0)
    assert torch.equal(data.y_test, ref.y_test)
    assert (data.groups_train is not None) == (fn == "as_mapping")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("bad_return", r"returned a list; expected a Dataset"),
        ("bad_labels", r"y_train must be a 1-D integer array; got torch.float32"),
    ],
)
def test_a_malformed_dataset_plugin_names_what_is_wrong(
    plugin_dir: Path, fn: str, message: str
) -> None:
    with pytest.raises(DatasetFormatError, match=message):
        load_dataset(f"toydata:{fn}", seed=0)


def test_unknown_plugin_options_and_modules_are_named(plugin_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"has no option\(s\) colour; its callable takes"):
        load_dataset("toydata:as_mapping", seed=0, colour="red")
    with pytest.raises(PluginError, match=r"cannot import module 'nowhere_xyz'.*plugin-path"):
        resolve("nowhere_xyz:fn", "dataset")


def test_a_config_runs_on_a_plugin_dataset_with_a_partition_of_features_and_groups(
    plugin_dir: Path,
) -> None:
    cfg = load_config(
        None,
        [
            "peers=4",
            "dataset.name=toydata:as_mapping",
            "dataset.samples=400",
            "dataset.options={writers = 8}",
            "partition.scheme=toydata:by_feature",
            "model.name=mlp",
        ],
        environ={},
    )
    data = load_task_data(cfg)
    assert data.groups_train is not None
    assert int(data.groups_train.max()) == 7  # the option reached the plug-in
    parts = make_partition(cfg, data)
    x0 = data.x_train[:, 0].numpy()
    assert (x0[parts[0]] <= 0).all()  # the scheme saw the features: sorted on x₀'s sign
    assert (x0[parts[3]] > 0).all()
    task = ClassificationTask(cfg, [0, 1, 2, 3], device=torch.device("cpu"))
    assert task.partition_stats()["sha256"] == partition_digest(parts)


def test_natural_groups_stay_whole_and_sizes_balance() -> None:
    labels = np.zeros(1000, np.int64)
    groups = np.random.default_rng(0).integers(0, 50, size=1000)
    parts = partition(labels, 5, "groups", seed=2, groups=groups)
    owners = [set(groups[p].tolist()) for p in parts]
    for i in range(5):
        for j in range(i + 1, 5):
            assert not owners[i] & owners[j], "a group was split between peers"
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= max(np.bincount(groups))  # greedy: within one group
    with pytest.raises(ValueError, match="needs natural group ids"):
        partition(labels, 5, "groups", seed=2)


@pytest.mark.parametrize("exponent", [0.0, 1.0, 2.0])
def test_powerlaw_sizes_follow_the_exponent(exponent: float) -> None:
    labels = np.random.default_rng(0).integers(0, 10, size=10_000)
    parts = partition(labels, 8, "powerlaw", seed=1, exponent=exponent)
    sizes = np.sort([len(p) for p in parts])[::-1]
    w = (np.arange(8) + 1.0) ** -exponent
    expected = 1 + (10_000 - 8) * w / w.sum()  # one sample each, the rest in proportion
    assert np.abs(sizes - expected).max() < 1  # largest-remainder rounding
    assert sizes.sum() == 10_000
    assert min(sizes) >= 1


def test_the_digest_changes_with_any_assignment_and_only_then() -> None:
    labels = np.random.default_rng(0).integers(0, 10, size=500)
    a = partition(labels, 4, "dirichlet", seed=1, alpha=0.5)
    b = partition(labels, 4, "dirichlet", seed=1, alpha=0.5)
    assert partition_digest(a) == partition_digest(b)
    moved = [a[0][:-1], np.sort(np.append(a[1], a[0][-1])), a[2], a[3]]  # one sample moved
    assert partition_digest(moved) != partition_digest(a)
    assert partition_digest(partition(labels, 4, "dirichlet", seed=2, alpha=0.5)) != (
        partition_digest(a)
    )


def test_plugins_are_found_on_the_plugin_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = tmp_path / "study"
    study.mkdir()
    (study / "farplug.py").write_text(
        "def split(labels, n, seed):\n    return [labels.nonzero()[0]]\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # restored after the test
    with pytest.raises(PluginError, match="cannot import module 'farplug'"):
        resolve("farplug:split", "partition scheme")
    monkeypatch.setenv(PLUGIN_PATH_ENV, str(study))
    assert callable(resolve("farplug:split", "partition scheme"))
