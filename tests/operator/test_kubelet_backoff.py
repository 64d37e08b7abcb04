"""The process kubelet restarts a crashing container on the kubelet's CrashLoopBackOff schedule."""

from __future__ import annotations

import pytest
from rlkube.launch.processes import RestartBackOff


def test_the_default_back_off_is_the_kubelets_ten_seconds_doubling_to_five_minutes() -> None:
    backoff = RestartBackOff()
    assert [backoff.delay(n) for n in range(1, 9)] == [10, 20, 40, 80, 160, 300, 300, 300]
    assert backoff.reset_after == 600  # ten minutes of running without an exit start it over
    assert RestartBackOff.kubelet() == backoff


def test_a_speedup_divides_every_figure_for_tests() -> None:
    fast = RestartBackOff.kubelet(speedup=20)
    assert [fast.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0]
    assert fast.reset_after == 30


def test_a_speedup_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        RestartBackOff.kubelet(speedup=0)
