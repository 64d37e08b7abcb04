"""CartPole whose steps take a fixed wall time and can be held, so a test's run outlasts what it watches.

A run of plain CartPole ends in seconds on a quiet machine and in minutes on a loaded one; a test
that scales eval workers mid-run needs the run to last longer than a worker takes to start,
whatever the load. Sleeping steps give epochs a floor that does not shrink on a fast machine, and
``hold_file`` (an env kwarg) is the handshake: while that file exists every step waits, so no
rollout and no training progress happens until the test removes it.

``hold_after_steps`` with ``release_file`` is the other handshake, for a test that must act at
a point of the run it cannot race: after that many steps each env waits until the release file
exists, so the run stops at a known amount of progress however fast the machine is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ENV_ID = "SlowCartPole-v1"


class SlowCartPole(CartPoleEnv):
    def __init__(
        self,
        step_seconds: float = 0.002,
        hold_file: str | None = None,
        hold_after_steps: int | None = None,
        release_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.step_seconds = step_seconds
        self.hold_file = Path(hold_file) if hold_file else None
        self.hold_after_steps = hold_after_steps
        self.release_file = Path(release_file) if release_file else None
        self.steps_taken = 0

    def step(self, action: Any) -> Any:
        while self.hold_file is not None and self.hold_file.exists():
            time.sleep(0.01)
        if self.hold_after_steps is not None and self.steps_taken >= self.hold_after_steps:
            while self.release_file is not None and not self.release_file.exists():
                time.sleep(0.01)
        self.steps_taken += 1
        time.sleep(self.step_seconds)
        return super().step(action)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SlowCartPole, max_episode_steps=500)
