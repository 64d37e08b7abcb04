"""WeightKey: which of two (incarnation, version) pairs a model should hold."""

from __future__ import annotations

import pytest
from rlkube.weight_key import WeightKey


def test_a_higher_version_of_the_same_incarnation_supersedes_and_an_equal_one_does_not() -> None:
    assert WeightKey("a", 3).supersedes(WeightKey("a", 2))
    assert not WeightKey("a", 2).supersedes(WeightKey("a", 2))
    assert not WeightKey("a", 1).supersedes(WeightKey("a", 2))


def test_any_key_of_another_incarnation_supersedes_whatever_its_number_or_text() -> None:
    # Rank 0 restarted: its numbers start again, and its random token may sort before the old one.
    assert WeightKey("0000", 1).supersedes(WeightKey("ffff", 40))
    assert WeightKey("ffff", 1).supersedes(WeightKey("0000", 40))
    assert WeightKey("a", 1).supersedes(None)


def test_keys_have_no_order_so_text_never_decides_which_is_newer() -> None:
    with pytest.raises(TypeError, match="no order"):
        _ = WeightKey("b", 1) < WeightKey("a", 2)
    with pytest.raises(TypeError):
        sorted([WeightKey("b", 1), WeightKey("a", 2)])


def test_a_key_satisfies_a_minimum_version_of_the_incarnation_asked_for() -> None:
    key = WeightKey("a", 5)
    assert key.satisfies(min_version=5)
    assert key.satisfies(min_version=4, incarnation="a")
    assert not key.satisfies(min_version=6)
    assert not key.satisfies(min_version=1, incarnation="b")


def test_a_key_equals_and_hashes_like_the_pair_it_names() -> None:
    assert WeightKey("a", 1) == ("a", 1)
    assert {("a", 1): "x"}[WeightKey("a", 1)] == "x"
    assert WeightKey.of(("a", 1)) == WeightKey("a", 1)
    assert WeightKey.of(None) is None
