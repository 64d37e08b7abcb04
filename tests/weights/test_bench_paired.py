"""The (b) verdict's paired share: versions measured in turns are compared pair by pair."""

from __future__ import annotations

import pytest

from benchmarks.weights.paired import paired_share


def test_a_peer_twice_as_slow_on_every_version_gives_a_share_of_two_with_no_spread() -> None:
    share = paired_share([0.1, 0.2, 0.3], [0.2, 0.4, 0.6])
    assert share.median == pytest.approx(2.0)
    assert share.low == pytest.approx(2.0)
    assert share.high == pytest.approx(2.0)
    assert share.pairs == 3


def test_pairing_cancels_a_load_drift_that_the_ratio_of_medians_keeps() -> None:
    # The machine slows down over the run; the peer is 10% faster on every pair.
    ours = [0.10 * (1 + i) for i in range(9)]
    peer = [s / 1.1 for s in ours]
    share = paired_share(ours, peer)
    assert share.median == pytest.approx(1 / 1.1)
    assert share.high - share.low == pytest.approx(0.0, abs=1e-12)


def test_the_interval_holds_the_median_and_widens_with_scatter() -> None:
    tight = paired_share([1.0] * 20, [0.9, 0.91] * 10)
    loose = paired_share([1.0] * 20, [0.7, 1.1] * 10)
    for share in (tight, loose):
        assert share.low <= share.median <= share.high
    assert loose.high - loose.low > tight.high - tight.low


def test_series_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="as many measurements"):
        paired_share([0.1, 0.2], [0.1])
