"""RLightning's ``rlightning.buffer.utils.preprocessors``: observations into vectors. Pure.

A preprocessor is built from one env's observation space; ``transform`` handles one observation,
``batch_transform`` a batch (leading axis) or a tuple of observations; ``shape`` is what comes out.
``get_preprocessor_cls(space)`` picks :class:`BoxFlattenPreprocessor` for a Box,
:class:`DiscretePreprocessor` (one-hot) for a Discrete, :class:`NonPreprocessor` otherwise.
numpy in gives numpy out; tensors give tensors.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F


class Preprocessor(ABC):
    """Turns raw observations of ``space`` into vectors."""

    def __init__(self, space: gym.Space) -> None:
        self.original_space = space

    @abstractmethod
    def transform(self, data: Any) -> Any:
        """One observation."""

    @abstractmethod
    def batch_transform(self, batched_data: Any) -> Any:
        """A batch (leading axis) or a tuple of observations."""

    @property
    def shape(self) -> Sequence[int]:
        raise NotImplementedError

    def __call__(self, data: Any) -> Any:
        if not isinstance(data, np.ndarray | torch.Tensor | dict):
            raise TypeError(
                f"{type(self).__name__} takes an array, a tensor or a dict, got {type(data).__name__}"
            )
        return self.transform(data)


class NonPreprocessor(Preprocessor):
    """Leaves observations as they are."""

    def transform(self, data: Any) -> Any:
        return data

    def batch_transform(self, batched_data: Any) -> Any:
        return batched_data

    @property
    def shape(self) -> Sequence[int]:
        return tuple(self.original_space.shape or ())


class BoxFlattenPreprocessor(Preprocessor):
    """A Box observation as one flat vector of ``prod(space.shape)`` entries."""

    def __init__(self, space: gym.Space) -> None:
        if not isinstance(space, gym.spaces.Box):
            raise TypeError(f"BoxFlattenPreprocessor needs a Box space, got {type(space).__name__}")
        super().__init__(space)
        self.out_dim = math.prod(space.shape)

    @property
    def shape(self) -> Sequence[int]:
        return (self.out_dim,)

    def transform(self, data: Any) -> Any:
        if isinstance(data, dict):
            raise TypeError("BoxFlattenPreprocessor cannot flatten a dict observation")
        return data.flatten() if isinstance(data, torch.Tensor) else np.asarray(data).reshape(-1)

    def batch_transform(self, batched_data: Any) -> Any:
        if isinstance(batched_data, tuple):
            return tuple(self.transform(item) for item in batched_data)
        if isinstance(batched_data, torch.Tensor):
            return batched_data.flatten(1)
        if isinstance(batched_data, np.ndarray):
            return batched_data.reshape(batched_data.shape[0], -1)
        raise TypeError(
            f"BoxFlattenPreprocessor cannot flatten a batch of type {type(batched_data).__name__}"
        )


class DiscretePreprocessor(Preprocessor):
    """A Discrete observation as a one-hot float vector of ``space.n`` entries."""

    def __init__(self, space: gym.Space) -> None:
        if not isinstance(space, gym.spaces.Discrete):
            raise TypeError(f"DiscretePreprocessor needs a Discrete space, got {type(space).__name__}")
        super().__init__(space)
        self.out_dim = int(space.n)

    @property
    def shape(self) -> Sequence[int]:
        return (self.out_dim,)

    def transform(self, data: Any) -> Any:
        if isinstance(data, dict):
            raise TypeError("DiscretePreprocessor cannot one-hot a dict observation")
        values = torch.as_tensor(data).long() - int(self.original_space.start)  # type: ignore[attr-defined]
        one_hot = F.one_hot(values, num_classes=self.out_dim).float()
        return one_hot.numpy() if isinstance(data, np.ndarray) else one_hot

    def batch_transform(self, batched_data: Any) -> Any:
        if isinstance(batched_data, tuple):
            return tuple(self.transform(item) for item in batched_data)
        return self.transform(batched_data)


def default_obs_preprocessor(obs_seq: list[Any]) -> list[Any]:
    """Observations as they are (RLightning's default)."""
    return obs_seq


def default_reward_preprocessor(rew_seq: list[Any]) -> list[Any]:
    """Rewards as they are (RLightning's default)."""
    return rew_seq


def get_preprocessor_cls(space: gym.Space) -> type[Preprocessor]:
    """The preprocessor class for ``space``: Box flattens, Discrete one-hots, anything else passes."""
    if isinstance(space, gym.spaces.Box):
        return BoxFlattenPreprocessor
    if isinstance(space, gym.spaces.Discrete):
        return DiscretePreprocessor
    return NonPreprocessor
