"""The unit of rollout work: every env of one eval replica stepped ``fragmentLength`` steps.

Pure: no I/O. A :class:`Fragment` holds a TensorDict with ``batch_size [num_envs, T]`` (rows are
envs, columns are time) and the episodes that finished inside it. The standard keys, written by
``rlkube.engine.rollout``:

==================== =====================================================================
``observation``      what the policy saw at step t
(policy fields)      every PolicyResponse field except ``env_id`` (``action``, ``log_prob``, ...)
``reward``           reward of step t
``terminated``       the episode ended at step t by the MDP (no bootstrap)
``truncated``        the episode was cut at step t (time limit: bootstrap from ``next_observation``)
``next_observation`` the true next observation (the final one where the episode ended)
(postprocess keys)   whatever ``policy.postprocess`` returned as a dict
``policy_lag``       async engine with ``staleFragments: vtrace`` only, added by the trainer:
                     how many versions the fragment's weights are behind the learner's
==================== =====================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import torch
from tensordict import TensorDict

from rlkube.data.wire import Received

OBSERVATION = "observation"
NEXT_OBSERVATION = "next_observation"
REWARD = "reward"
TERMINATED = "terminated"
TRUNCATED = "truncated"
POLICY_LAG = "policy_lag"


@dataclass(frozen=True)
class Fragment:
    """One replica's ``[num_envs, T]`` slice of experience, tagged with the weights that produced it."""

    data: TensorDict
    episode_returns: tuple[float, ...] = ()
    episode_lengths: tuple[int, ...] = ()
    weight_version: int = 0
    replica: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    #: The bytes ``data`` was decoded from, when it came over the wire (``data.wire.Received``).
    received: Received | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.data.batch_size) != 2:
            raise ValueError(f"a fragment is [num_envs, T]; got batch_size {tuple(self.data.batch_size)}")
        if len(self.episode_returns) != len(self.episode_lengths):
            raise ValueError("episode_returns and episode_lengths must have the same length")

    @property
    def num_envs(self) -> int:
        return int(self.data.batch_size[0])

    @property
    def length(self) -> int:
        return int(self.data.batch_size[1])

    @property
    def env_steps(self) -> int:
        return self.num_envs * self.length


def concat_rows(fragments: Sequence[Fragment]) -> TensorDict:
    """Stack fragments along the env dimension: ``[sum(num_envs), T]`` (all must share T and keys)."""
    if not fragments:
        raise ValueError("no fragments to concatenate")
    lengths = {f.length for f in fragments}
    if len(lengths) != 1:
        raise ValueError(f"fragments have different lengths {sorted(lengths)}; cannot stack them as rows")
    return cast(TensorDict, torch.cat([f.data for f in fragments], dim=0))
