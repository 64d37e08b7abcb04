"""The rollout loop, written once: an EVAL policy steps an EnvGroup and fills fragments.

I/O: steps environments. The in-process engine uses :class:`RolloutWorker` directly; a remote
eval worker process wraps the same class and ships each :class:`~rlkube.data.Fragment` over
the wire. Envs keep running across fragments (an episode may span several); the first
``collect`` resets them. ``rollout_step`` is called through the policy's gate
(``_rollout`` or, with ``rolloutMode: async``, awaited through ``_rollout_async``), so a
weight update never lands in the middle of a step.

Requests (``policy.request_mode``): per env, the default, as in RLightning: each step the group's
batched EnvRet is split into one EnvRet per env (``env_id`` a string, unbatched observation), each
is one ``rollout_step`` call (sync: one after another under the idle gate; async: all in flight
together on the policy's event loop, so ``get_num_requests()`` reaches ``numEnvs``), and the
responses are stacked into rows (``rlkube.engine.requests``); ``postprocess`` is called per env
with that env's next EnvRet and its response. Batched: one call per step with every env's rows.
Both modes fill the same ``[num_envs, T]`` fragment (keys in ``rlkube.data.fragment``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict

from rlkube.data.fragment import NEXT_OBSERVATION, OBSERVATION, REWARD, TERMINATED, TRUNCATED, Fragment
from rlkube.engine.requests import Acted, assemble_batched, assemble_per_env, batched_rows, stack_rows
from rlkube.envs.group import EnvGroup
from rlkube.envs.types import EnvRet
from rlkube.envs.wrappers import finished_episodes
from rlkube.policy.base import BasePolicy, RequestMode

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


def takes_env_ret_and_response(method: Any) -> bool:
    """Whether ``method(env_ret, policy_resp)`` binds (a per-step ``postprocess``). Pure."""
    try:
        inspect.signature(method).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (a builtin): assume it does
        return True
    return True


class RolloutWorker:
    """One eval replica's loop: ``collect(steps) -> Fragment`` and ``evaluate(episodes)``."""

    def __init__(self, env_group: EnvGroup, policy: BasePolicy, *, replica: int = 0) -> None:
        self.env_group = env_group
        self.policy = policy
        self.replica = replica
        self.num_envs = env_group.num_envs
        self.per_env = RequestMode(policy.request_mode) is RequestMode.PER_ENV
        space = env_group.single_action_space
        self._action_space = space
        self._action_shape: tuple[int, ...] = tuple(getattr(space, "shape", None) or ())
        self._current: EnvRet | None = None
        self._split_of: EnvRet | None = None
        self._split: list[EnvRet] = []
        self._warned: set[str] = set()
        #: RLightning's sync and async engines never call ``postprocess``, so its shipped policies may
        #: leave it unimplemented (raising NotImplementedError) or declare it with another signature
        #: (``postprocess(self, data)``); such a policy has nothing to add per step and is not asked.
        self._postprocess_unimplemented = not takes_env_ret_and_response(policy.postprocess)

    @property
    def is_async(self) -> bool:
        return self.policy.rollout_mode == "async"

    @property
    def mode(self) -> str:
        """How this loop calls the policy, in the words an error message uses."""
        return f"rolloutMode {self.policy.rollout_mode}"

    def reset(self, seed: int | None = None) -> EnvRet:
        """Reset every env; the next fragment starts from fresh episodes."""
        self._current = self.env_group.reset(seed=seed)
        self._current.mark_env_sent()
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
            self._advance(recorder, await self._act_async(self._current, {}))
        return self._finish(recorder)

    def _run_sync(self, steps: int) -> Fragment:
        recorder = self._begin(steps)
        for _ in range(steps):
            assert self._current is not None
            self._advance(recorder, self._act_sync(self._current, {}))
        return self._finish(recorder)

    # ------------------------------------------------------------------ asking the policy
    def _requests(self, env_ret: EnvRet) -> list[EnvRet]:
        """The per-env requests of a batched EnvRet (split once, reused by postprocess and the next step)."""
        if self._split_of is not env_ret:
            self._split_of, self._split = env_ret, env_ret.split()
        return self._split

    def _act_sync(self, env_ret: EnvRet, kwargs: dict[str, Any]) -> Acted:
        if not self.per_env:
            return self._batched(env_ret, self.policy._rollout(env_ret, **kwargs))
        requests = self._requests(env_ret)
        return self._per_env(requests, [self.policy._rollout(request, **kwargs) for request in requests])

    async def _act_async(self, env_ret: EnvRet, kwargs: dict[str, Any]) -> Acted:
        """Async mode: every env's request is in flight at once on the policy's event loop."""
        if not self.per_env:
            return self._batched(env_ret, await self.policy._rollout_async(env_ret, **kwargs))
        requests = self._requests(env_ret)
        results = await asyncio.gather(*(self.policy._rollout_async(r, **kwargs) for r in requests))
        return self._per_env(requests, results)

    def _per_env(self, requests: list[EnvRet], results: list[Any]) -> Acted:
        return assemble_per_env(
            requests,
            results,
            policy=type(self.policy).__name__,
            mode=self.mode,
            action_shape=self._action_shape,
            action_space=self._action_space,
            reserved=_ENV_KEYS,
        )

    def _batched(self, env_ret: EnvRet, result: Any) -> Acted:
        return assemble_batched(
            env_ret,
            result,
            policy=type(self.policy).__name__,
            mode=self.mode,
            num_envs=self.num_envs,
            reserved=_ENV_KEYS,
            warn=self._warn_once,
        )

    def _postprocess(self, next_ret: EnvRet, acted: Acted) -> dict[str, torch.Tensor]:
        """``postprocess`` per env (or once, batched); the dicts it returns become fragment fields."""
        if self._postprocess_unimplemented:
            return {}
        try:
            return self._postprocessed(next_ret, acted)
        except NotImplementedError:
            self._postprocess_unimplemented = True
            logger.info("%s.postprocess is not implemented: not called again", type(self.policy).__name__)
            return {}

    def _postprocessed(self, next_ret: EnvRet, acted: Acted) -> dict[str, torch.Tensor]:
        source = f"{type(self.policy).__name__}.postprocess"
        if not self.per_env:
            extra = self.policy._postprocess(next_ret, acted.responses[0])
            if isinstance(extra, Mapping):
                return batched_rows(
                    [(str(k), v) for k, v in extra.items()],
                    source=source,
                    num_envs=self.num_envs,
                    reserved=_ENV_KEYS,
                    warn=self._warn_once,
                )
            if extra is not None:
                self._warn_once(
                    "postprocess", f"{source} returned {type(extra).__name__}; only a dict is stored"
                )
            return {}
        results = [
            self.policy._postprocess(request, response)
            for request, response in zip(self._requests(next_ret), acted.responses, strict=True)
        ]
        if all(result is None for result in results):
            return {}
        if not all(isinstance(result, Mapping) for result in results):
            kinds = sorted({type(result).__name__ for result in results})
            self._warn_once("postprocess", f"{source} returned {', '.join(kinds)}; only a dict is stored")
            return {}
        return stack_rows(
            [{str(k): v for k, v in result.items()} for result in results], source=source, reserved=_ENV_KEYS
        )

    def _step_envs(self, action: torch.Tensor) -> EnvRet:
        next_ret = self.env_group.step(action)
        next_ret.mark_env_sent()
        return next_ret

    # ------------------------------------------------------------------ fragments
    def _begin(self, steps: int) -> _Recorder:
        if steps < 1:
            raise ValueError(f"a fragment needs at least one step, got {steps}")
        if self._current is None:
            self.reset()
        return _Recorder(version=self.policy.weight_version)

    def _advance(self, recorder: _Recorder, acted: Acted) -> None:
        assert self._current is not None
        next_ret = self._step_envs(acted.action)
        extra = self._postprocess(next_ret, acted)
        row: dict[str, torch.Tensor] = {
            OBSERVATION: self._current.observation,
            REWARD: next_ret.last_reward,
            TERMINATED: next_ret.last_terminated,
            TRUNCATED: next_ret.last_truncated,
            NEXT_OBSERVATION: next_ret.get("final_observation", next_ret.observation),
        }
        for key, value in {**acted.fields, **extra}.items():
            row[key] = value.to("cpu")
        recorder.rows.append(row)
        self._current = next_ret

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
            tally.record(self._step_envs(self._act_sync(tally.current, kwargs).action))
        self.env_group.pop_finished_episodes()
        return tally.result()

    async def _evaluate_async(self, episodes: int, seed: int | None, kwargs: dict[str, Any]) -> EvalResult:
        tally = self._start_evaluation(episodes, seed)
        while not tally.complete:
            acted = await self._act_async(tally.current, kwargs)
            tally.record(self._step_envs(acted.action))
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
