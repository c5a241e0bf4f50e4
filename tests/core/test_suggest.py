"""Unknown names suggest the valid name they most likely misspell: Damerau–Levenshtein
distance (a transposition costs 1), ties to the longer common prefix."""

from __future__ import annotations

import pytest

from concord.core.algorithms.catalog import CATALOG
from concord.core.config import ConfigError, load_config
from concord.core.suggest import closest, edit_distance


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("dsdg", "dsgd", 1),  # one transposition
        ("dsdg", "dsgt", 2),
        ("ring", "ring", 0),
        ("", "abc", 3),
        ("kitten", "sitting", 3),
        ("ca", "abc", 3),  # optimal string alignment: no edit of a transposed pair
        ("lrr", "lr", 1),
    ],
)
def test_edit_distance(a: str, b: str, distance: int) -> None:
    assert edit_distance(a, b) == distance
    assert edit_distance(b, a) == distance


def test_a_transposed_algorithm_name_suggests_the_algorithm() -> None:
    names = list(CATALOG)
    assert "dsgt" in names  # the name difflib used to suggest first
    assert closest("dsdg", names) == "dsgd"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm=dsdg"])
    assert "unknown algorithm 'dsdg' (did you mean 'dsgd'?)" in str(err.value)


def test_ties_go_to_the_longer_common_prefix_then_the_earlier_name() -> None:
    assert closest("dsgx", ["dsgt", "dsgd"]) == "dsgt"  # both 1 edit, same prefix: the first
    assert closest("dsgx", ["xsgd", "dsgd"]) == "dsgd"  # both 1 edit: 'dsg' beats ''
    assert closest("RING", ["chain", "ring"]) == "ring"  # case is not a typo


def test_nothing_close_suggests_nothing_and_a_part_still_finds_its_name() -> None:
    assert closest("gossip-please", list(CATALOG)) is None
    assert closest("relaysgdgrad", list(CATALOG)) == "relaysgd-grad"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["optim.lrr=0.1"])
    assert "did you mean 'lr'?" in str(err.value)
