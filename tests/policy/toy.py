"""Small policies and a fake weight source for the BasePolicy tests."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import torch
from rlkube.policy import BasePolicy
from rlkube.policy.weight_source import StagedWeights
from rlkube.spec import PolicySpec
from rlkube.types import EnvRet, PolicyResponse
from torch import nn


def policy_spec(*, strategy: str = "Double", rollout_mode: str = "sync") -> PolicySpec:
    return PolicySpec.model_validate(
        {"type": "Toy", "rolloutMode": rollout_mode, "weightBuffer": {"strategy": strategy}}
    )


def env_ret(n: int = 2) -> EnvRet:
    return EnvRet(env_id=torch.arange(n), observation=torch.ones(n, 2))


class ToyPolicy(BasePolicy):
    """One linear layer; a rollout step marks itself in progress and takes ``step_seconds``.

    With ``hold_steps`` cleared, a step sets ``step_started`` and stays in flight until the test
    sets ``hold_steps`` again (a handshake instead of a step that is merely slow).
    """

    step_seconds = 0.002

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_step = 0
        self.steps = 0
        self.step_started = threading.Event()
        self.hold_steps = threading.Event()
        self.hold_steps.set()

    def _in_flight(self) -> None:
        self.step_started.set()
        if not self.hold_steps.is_set():
            assert self.hold_steps.wait(timeout=30), "the test never let the step finish"
        else:
            time.sleep(self.step_seconds)

    def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
        self.net = nn.Linear(2, 1)
        self.frozen = nn.Linear(2, 2).requires_grad_(False)

    def setup_optimizer(self, optim_cfg: Any) -> None:
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1)

    def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        self.in_step += 1
        try:
            self._in_flight()
            self.steps += 1
            return PolicyResponse(env_id=env_ret.env_id, action=self.net(env_ret.observation.float()))
        finally:
            self.in_step -= 1

    def postprocess(self, env_ret: EnvRet | None = None, policy_resp: PolicyResponse | None = None) -> Any:
        return None

    def update_dataset(self, data: Any) -> None:
        self.dataset = data

    def train(self, *args: Any, **kwargs: Any) -> Any:
        return {}


class AsyncToyPolicy(ToyPolicy):
    """``rollout_step`` is a coroutine that yields to the loop while in flight."""

    async def rollout_step(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:  # type: ignore[override]
        self.in_step += 1
        try:
            await asyncio.sleep(self.step_seconds)
            self.steps += 1
            return PolicyResponse(env_id=env_ret.env_id, action=self.net(env_ret.observation.float()))
        finally:
            self.in_step -= 1


class FakeSource:
    """A WeightSource serving versions 1, 2, ...; records whether a commit ever overlapped a step."""

    def __init__(self) -> None:
        self.version = 0
        self.overlaps = 0
        self.commits: list[int] = []
        self.staged = threading.Event()  # set once stage() returned new weights
        self.stage_gate = threading.Event()
        self.stage_gate.set()
        self.fail_next = False
        self.staged_during_step = 0
        self.closed = False

    def publish(self) -> int:
        self.version += 1
        return self.version

    def stage(self, policy: ToyPolicy) -> StagedWeights | None:
        self.stage_gate.wait(timeout=10)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("torn snapshot")
        if self.version <= policy.weight_version:
            return None
        if policy.in_step:
            self.staged_during_step += 1
        value = float(self.version)
        self.staged.set()
        return StagedWeights(
            version=self.version,
            state_dict={"net": {"weight": torch.full((1, 2), value), "bias": torch.full((1,), value)}},
        )

    def commit(self, policy: ToyPolicy, staged: StagedWeights) -> None:
        if policy.in_step:
            self.overlaps += 1
        time.sleep(0.001)  # widen the window an overlap would need
        if policy.in_step:
            self.overlaps += 1
        policy.load_state_dict(staged.state_dict, strict=False)
        self.commits.append(staged.version)

    def close(self) -> None:
        self.closed = True
