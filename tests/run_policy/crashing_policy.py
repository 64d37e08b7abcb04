"""A policy whose train rank 1 dies hard at every first train step (like an OOM kill or a segfault).

Imported by jobs through ``spec.imports``; the crash is a process exit, not an exception, so it is
what the supervisor of the train group (the local launcher or a kubelet) sees of a broken node.
"""

from __future__ import annotations

import os
from typing import Any

from rlkube.policy.builtin.ppo import PPO
from rlkube.utils.registry import POLICIES

CRASH_EXIT_CODE = 7  # not 1 (a Python error), 2 (refused) or 3 (a disk fault): a plain crash


@POLICIES.register("RankOneCrashingPPO")
class RankOneCrashingPPO(PPO):
    def train(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        if os.environ.get("RANK") == "1":
            os._exit(CRASH_EXIT_CODE)
        return super().train(*args, **kwargs)
