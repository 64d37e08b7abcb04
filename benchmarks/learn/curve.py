"""One seed's learning curve and the figures derived from it (pure: no I/O)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Episodes averaged for "the recent return" (rlkube's tracker and the peer use the same window).
WINDOW = 20


@dataclass
class Curve:
    """Episodes of one run as ``(env_steps_at_end, raw_return)``, plus its cost."""

    side: str
    seed: int
    episodes: list[tuple[int, float]] = field(default_factory=list)
    env_steps: int = 0
    wall_seconds: float = 0.0
    steps_to_target: int | None = None
    #: Launcher time outside ``wall_seconds`` (a local cluster's process start-up and shutdown).
    startup_seconds: float = 0.0
    #: The run's summary.json (local cluster side): fragments trained, dropped, corrected...
    summary: dict[str, Any] = field(default_factory=dict)

    def final_return(self, window: int = WINDOW) -> float | None:
        """Mean raw return of the last ``window`` episodes (None before any episode ended)."""
        tail = [r for _, r in self.episodes[-window:]]
        return statistics.fmean(tail) if tail else None

    @property
    def steps_per_second(self) -> float:
        return self.env_steps / self.wall_seconds if self.wall_seconds > 0 else 0.0


def steps_to_target(episodes: Sequence[tuple[int, float]], target: float, window: int = WINDOW) -> int | None:
    """Env steps at the first episode end where the mean of the last ``window`` returns >= target."""
    for index in range(window - 1, len(episodes)):
        tail = [r for _, r in episodes[index - window + 1 : index + 1]]
        if statistics.fmean(tail) >= target:
            return episodes[index][0]
    return None


def smoothed(episodes: Sequence[tuple[int, float]], window: int = WINDOW) -> list[tuple[int, float]]:
    """``(steps, mean of the last window returns)`` at every episode end."""
    out = []
    for index in range(len(episodes)):
        tail = [r for _, r in episodes[max(0, index - window + 1) : index + 1]]
        out.append((episodes[index][0], statistics.fmean(tail)))
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)
