"""Live counters of the trajectory plane: steps collected, throughput, duplicates, staleness.

Pure: callers pass ``now`` (monotonic seconds). Episode returns and epoch accounting live in the
engine's ``RunTracker``; these are the figures only the coordinator sees, between epoch ends,
for ``GetStatus`` (the operator's status and the local progress bar) and the rollout benchmark.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass
class Progress:
    env_steps: int = 0
    episodes: int = 0
    fragments: int = 0
    duplicates: int = 0
    dropped_stale: int = 0
    lag_histogram: Counter[int] = field(default_factory=Counter)  # weight-version lag of trained fragments
    weight_wait_seconds: float = 0.0
    rollout_seconds: float = 0.0
    _rate_window: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))

    def record_fragment(
        self,
        *,
        env_steps: int,
        episodes: int,
        now: float,
        rollout_seconds: float = 0.0,
        weight_wait_seconds: float = 0.0,
    ) -> None:
        self.fragments += 1
        self.env_steps += env_steps
        self.episodes += episodes
        self.rollout_seconds += rollout_seconds
        self.weight_wait_seconds += weight_wait_seconds
        self._rate_window.append((now, self.env_steps))

    def record_trained(self, lags: list[int]) -> None:
        """Lags (trainer version minus the version that produced each fragment) of a training batch."""
        self.lag_histogram.update(lags)

    def steps_per_second(self, *, now: float) -> float:
        points = [p for p in self._rate_window if now - p[0] <= 30.0]
        if len(points) < 2:
            return 0.0
        (t0, s0), (t1, s1) = points[0], points[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0

    def weight_wait_fraction(self) -> float:
        """Share of eval-worker time spent waiting for weights instead of rolling out."""
        busy = self.rollout_seconds + self.weight_wait_seconds
        return self.weight_wait_seconds / busy if busy > 0 else 0.0

    def lag_distribution(self) -> dict[int, int]:
        return dict(sorted(self.lag_histogram.items()))
