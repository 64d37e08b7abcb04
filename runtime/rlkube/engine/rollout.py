"""The rollout loop, written once: an EVAL policy steps an EnvGroup and fills fragments.

I/O: steps environments. The in-process engine uses :class:`RolloutWorker` directly; a remote
eval worker process wraps the same class and ships each :class:`~rlkube.data.Fragment` over
the wire. Envs keep running across fragments (an episode may span several); the first
``collect`` resets them. ``rollout_step`` is called through the policy's gate
(``_rollout`` or, with ``rolloutMode: async``, awaited through ``_rollout_async``), so a
weight update never lands in the middle of a step.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from rlkube.data.fragment import NEXT_OBSERVATION, OBSERVATION, REWARD, TERMINATED, TRUNCATED, Fragment
from rlkube.envs.group import EnvGroup
from rlkube.envs.types import EnvRet, PolicyResponse
from rlkube.envs.wrappers import finished_episodes
from rlkube.policy.base import BasePolicy

logger = logging.getLogger(__name__)

_ENV_KEYS = (OBSERVATION, REWARD, TERMINATED, TRUNCATED, NEXT_OBSERVATION)


@dataclass(frozen=True)
class EvalResult:
    """Episodes played by :meth:`RolloutWorker.evaluate`."""

    returns: tuple[float, ...]
    lengths: tuple[int, ...]

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")


def accepts_deterministic(policy: BasePolicy) -> bool:
    """True when ``rollout_step`` has a ``deterministic`` parameter (greedy actions for evaluation)."""
    return "deterministic" in inspect.signature(policy.rollout_step).parameters


class RolloutWorker:
    """One eval replica's loop: ``collect(steps) -> Fragment`` and ``evaluate(episodes)``."""

    def __init__(self, env_group: EnvGroup, policy: BasePolicy, *, replica: int = 0) -> None:
        self.env_group = env_group
        self.policy = policy
        self.replica = replica
        self.num_envs = env_group.num_envs
        self._current: EnvRet | None = None
        self._warned: set[str] = set()

    @property
    def is_async(self) -> bool:
        return self.policy.rollout_mode == "async"

    def reset(self, seed: int | None = None) -> EnvRet:
        """Reset every env; the next fragment starts from fresh episodes."""
        self._current = self.env_group.reset(seed=seed)
        self.env_group.pop_finished_episodes()
        return self._current

    # ------------------------------------------------------------------ collection
    def collect(self, steps: int) -> Fragment:
        """Step every env ``steps`` times; returns the ``[num_envs, steps]`` fragment."""
        if not self.is_async:
            return self._run_sync(steps)
        loop = self.policy.event_loop
        if loop is None:
            raise RuntimeError("rolloutMode async needs init_eval() before collecting")
        return loop.run_until_complete(self.collect_async(steps))

    async def collect_async(self, steps: int) -> Fragment:
        """:meth:`collect` for a caller already on the policy's event loop."""
        recorder = self._begin(steps)
        for _ in range(steps):
            assert self._current is not None
            response = await self._act_async(self._current)
            self._advance(recorder, response)
        return self._finish(recorder)

    def _run_sync(self, steps: int) -> Fragment:
        recorder = self._begin(steps)
        for _ in range(steps):
            assert self._current is not None
            response = self.policy._rollout(self._current)
            self._advance(recorder, response)
        return self._finish(recorder)

    async def _act_async(self, env_ret: EnvRet, **kwargs: Any) -> PolicyResponse:
        return await self.policy._rollout_async(env_ret, **kwargs)

    def _begin(self, steps: int) -> _Recorder:
        if steps < 1:
            raise ValueError(f"a fragment needs at least one step, got {steps}")
        if self._current is None:
            self.reset()
        return _Recorder(version=self.policy.weight_version)

    def _advance(self, recorder: _Recorder, response: PolicyResponse) -> None:
        assert self._current is not None
        if "action" not in response:
            raise ValueError(f"{type(self.policy).__name__}.rollout_step returned no 'action' field")
        next_ret = self.env_group.step(response.action)
        extra = self.policy._postprocess(next_ret, response)
        row: dict[str, torch.Tensor] = {
            OBSERVATION: self._current.observation,
            REWARD: next_ret.reward,
            TERMINATED: next_ret.terminated,
            TRUNCATED: next_ret.truncated,
            NEXT_OBSERVATION: next_ret.get("final_observation", next_ret.observation),
        }
        for key, value in response.items():
            if key != "env_id":
                self._put(row, key, value, source="rollout_step")
        if isinstance(extra, Mapping):
            for key, value in extra.items():
                self._put(row, str(key), value, source="postprocess")
        elif extra is not None:
            self._warn_once(
                "postprocess", f"postprocess returned {type(extra).__name__}; only a dict is stored"
            )
        recorder.rows.append(row)
        self._current = next_ret

    def _put(self, row: dict[str, torch.Tensor], key: str, value: Any, *, source: str) -> None:
        if key in _ENV_KEYS:
            raise ValueError(f"{source} returned a field {key!r}, which the rollout loop writes itself")
        if not isinstance(value, torch.Tensor) or value.ndim == 0 or value.shape[0] != self.num_envs:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            self._warn_once(key, f"{source} field {key!r} ({shape}) has no row per env; not stored")
            return
        row[key] = value.detach().to("cpu")

    def _finish(self, recorder: _Recorder) -> Fragment:
        keys = recorder.rows[0].keys()
        for index, row in enumerate(recorder.rows):
            if row.keys() != keys:
                raise ValueError(
                    f"step {index} produced fields {sorted(row)}, step 0 produced {sorted(keys)}"
                )
        steps = len(recorder.rows)
        data = TensorDict(
            {key: torch.stack([row[key] for row in recorder.rows], dim=1) for key in keys},
            batch_size=[self.num_envs, steps],
        )
        returns, lengths = self.env_group.pop_finished_episodes()
        return Fragment(
            data=data,
            episode_returns=tuple(returns),
            episode_lengths=tuple(lengths),
            weight_version=recorder.version,
            replica=self.replica,
        )

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, episodes: int, *, deterministic: bool = True, seed: int | None = None) -> EvalResult:
        """Play ``episodes`` whole episodes from a fresh reset (greedy when the policy supports it).

        Each env plays an equal share (so short episodes are not over-counted); the envs are left
        mid-episode, so the next ``collect`` on this worker starts from a reset.
        """
        kwargs = {"deterministic": deterministic} if accepts_deterministic(self.policy) else {}
        if self.is_async:
            loop = self.policy.event_loop
            if loop is None:
                raise RuntimeError("rolloutMode async needs init_eval() before evaluating")
            return loop.run_until_complete(self._evaluate_async(episodes, seed, kwargs))
        tally = self._start_evaluation(episodes, seed)
        while not tally.complete:
            tally.record(self.env_group.step(self.policy._rollout(tally.current, **kwargs).action))
        self.env_group.pop_finished_episodes()
        return tally.result()

    async def _evaluate_async(self, episodes: int, seed: int | None, kwargs: dict[str, Any]) -> EvalResult:
        tally = self._start_evaluation(episodes, seed)
        while not tally.complete:
            response = await self.policy._rollout_async(tally.current, **kwargs)
            tally.record(self.env_group.step(response.action))
        self.env_group.pop_finished_episodes()
        return tally.result()

    def _start_evaluation(self, episodes: int, seed: int | None) -> _EpisodeTally:
        if episodes < 1:
            raise ValueError(f"episodes must be at least 1, got {episodes}")
        self._current = None  # training collection (if any) restarts from a reset
        first = self.env_group.reset(seed=seed)
        self.env_group.pop_finished_episodes()
        return _EpisodeTally(episodes, self.num_envs, first)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


@dataclass
class _Recorder:
    version: int
    rows: list[dict[str, torch.Tensor]] = field(default_factory=list)


class _EpisodeTally:
    """Evaluation bookkeeping: env ``i`` contributes its first ``quota[i]`` episodes."""

    def __init__(self, episodes: int, num_envs: int, first: EnvRet) -> None:
        self.quota = [episodes // num_envs + (1 if i < episodes % num_envs else 0) for i in range(num_envs)]
        self.finished: list[list[tuple[float, int]]] = [[] for _ in range(num_envs)]
        self.current = first

    @property
    def complete(self) -> bool:
        return all(len(done) >= q for done, q in zip(self.finished, self.quota, strict=True))

    def record(self, result: EnvRet) -> None:
        # Raw episodes (recorded inside every spec.env.wrappers entry), not the wrapped rewards.
        for i, raw_return, raw_length in finished_episodes(result.info):
            self.finished[i].append((raw_return, raw_length))
        self.current = result

    def result(self) -> EvalResult:
        played = [ep for done, q in zip(self.finished, self.quota, strict=True) for ep in done[:q]]
        return EvalResult(returns=tuple(r for r, _ in played), lengths=tuple(n for _, n in played))
