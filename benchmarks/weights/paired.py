"""Rates of two methods measured in turns, version by version, compared pair by pair. Pure.

Scenario (b) measures rlkube and the raw streams alternately, so that a change in the machine's
load hits both alike. Comparing the medians of the two series throws that pairing away; the
share per pair (the peer's seconds over ours for the versions measured back to back) keeps it,
and a bootstrap over the pairs says how far a single run's figure can be trusted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedShare:
    """Our rate as a share of the peer's: the median over pairs and its 95% bootstrap interval."""

    median: float
    low: float
    high: float
    pairs: int


def paired_share(ours: Sequence[float], peer: Sequence[float], *, resamples: int = 2000) -> PairedShare:
    """``peer[i] / ours[i]`` (seconds, so > 1 means we are faster) over the pairs measured in turns."""
    if len(ours) != len(peer) or not ours:
        raise ValueError(f"need as many measurements of each method, got {len(ours)} and {len(peer)}")
    shares = np.asarray(peer, dtype=float) / np.asarray(ours, dtype=float)
    rng = np.random.default_rng(0)  # the same run prints the same interval
    picks = rng.integers(0, len(shares), size=(resamples, len(shares)))
    medians = np.median(shares[picks], axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return PairedShare(float(np.median(shares)), float(low), float(high), len(shares))
