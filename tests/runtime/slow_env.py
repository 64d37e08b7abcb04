"""CartPole whose steps take a fixed wall time and can be held, so a test's run outlasts what it watches.

A run of plain CartPole ends in seconds on a quiet machine and in minutes on a loaded one; a test
that scales eval workers mid-run needs the run to last longer than a worker takes to start,
whatever the load. Sleeping steps give epochs a floor that does not shrink on a fast machine, and
``hold_file`` (an env kwarg) is the handshake: while that file exists every step waits, so no
rollout and no training progress happens until the test removes it.

``step_budget`` with ``budget_file`` and ``release_file`` is the other handshake, for a test that
must act at a known point of the run however fast the machine and however the work is split:
every env of every worker takes its steps from one budget counted in ``budget_file`` (under an
``fcntl`` lock, so the pods of a run share it), and once it is spent each step waits until the
release file exists. A budget per env would not do: the run stops when the first worker runs
out, and a worker that got few tasks (it started late, or the machine was busy) leaves the run
short of the point the test needs.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ENV_ID = "SlowCartPole-v1"


def take_from_budget(budget_file: Path, budget: int) -> bool:
    """Count one step against the budget shared by every process; False once it is spent."""
    fd = os.open(budget_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        spent = int(os.pread(fd, 32, 0) or b"0")
        if spent >= budget:
            return False
        written = str(spent + 1).encode()
        os.pwrite(fd, written, 0)
        os.ftruncate(fd, len(written))
        return True
    finally:
        os.close(fd)  # closing releases the lock


class SlowCartPole(CartPoleEnv):
    def __init__(
        self,
        step_seconds: float = 0.002,
        hold_file: str | None = None,
        step_budget: int | None = None,
        budget_file: str | None = None,
        release_file: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.budget: tuple[int, Path, Path] | None = None
        if step_budget is not None:
            if not (budget_file and release_file):
                raise ValueError("step_budget needs budget_file and release_file")
            self.budget = (step_budget, Path(budget_file), Path(release_file))
        self.step_seconds = step_seconds
        self.hold_file = Path(hold_file) if hold_file else None

    def step(self, action: Any) -> Any:
        while self.hold_file is not None and self.hold_file.exists():
            time.sleep(0.01)
        if self.budget is not None:
            budget, budget_file, release_file = self.budget
            while not release_file.exists() and not take_from_budget(budget_file, budget):
                time.sleep(0.01)
        time.sleep(self.step_seconds)
        return super().step(action)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SlowCartPole, max_episode_steps=500)
