"""A fragment's observations and actions are checked against the env's spaces, naming the key and why."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlkube.data.spaces import TrajectorySpaces
from tensordict import TensorDict

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def fragment(action: torch.Tensor, *, obs: torch.Tensor | None = None) -> TensorDict:
    n, t = action.shape[:2]
    observation = torch.zeros(n, t, 4) if obs is None else obs
    return TensorDict(
        {"observation": observation, "next_observation": observation.clone(), "action": action},
        batch_size=[n, t],
    )


def spaces(action_space: gym.Space, *, bounds: bool = False) -> TrajectorySpaces:  # type: ignore[type-arg]
    return TrajectorySpaces.of(CARTPOLE_OBS, action_space, action_bounds=bounds)


def test_actions_inside_a_discrete_space_pass() -> None:
    assert spaces(gym.spaces.Discrete(2)).violation(fragment(torch.tensor([[0, 1], [1, 0]]))) is None


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (torch.tensor([[0, 7], [1, 0]]), "action holds 1 values outside Discrete(2) [0, 1] (e.g. 7)"),
        (torch.tensor([[0, -1], [1, 0]]), "action holds 1 values outside Discrete(2)"),
        (torch.tensor([[0.0, 0.5], [1.0, 0.0]]), "action holds non-integral values (e.g. 0.5)"),
        (torch.tensor([[0.0, float("nan")], [1.0, 0.0]]), "action holds non-integral values (e.g. nan)"),
        (torch.tensor([[True, False]]), "action is bool; Discrete(2) [0, 1] takes integers"),
        (torch.zeros(2, 2, 3, dtype=torch.int64), "action has shape [3] per step"),
    ],
    ids=["above", "below", "fraction", "nan", "bool", "shape"],
)
def test_an_action_outside_a_discrete_space_is_named_with_the_reason(
    action: torch.Tensor, reason: str
) -> None:
    problem = spaces(gym.spaces.Discrete(2)).violation(fragment(action))
    assert reason in str(problem)


def test_floats_holding_whole_actions_pass_as_the_env_and_the_loss_take_them() -> None:
    check = spaces(gym.spaces.Discrete(2))
    assert check.violation(fragment(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))) is None
    assert "outside Discrete(2)" in str(check.violation(fragment(torch.tensor([[0.0, 7.0]]))))


def test_a_discrete_space_with_a_start_shifts_the_range() -> None:
    check = spaces(gym.spaces.Discrete(3, start=-1))
    assert check.violation(fragment(torch.tensor([[-1, 1]]))) is None
    assert "outside Discrete(3) [-1, 1]" in str(check.violation(fragment(torch.tensor([[2, 0]]))))


def test_multi_discrete_actions_are_checked_per_component() -> None:
    check = spaces(gym.spaces.MultiDiscrete([2, 5]))
    assert check.violation(fragment(torch.tensor([[[1, 4]]]))) is None
    assert "outside MultiDiscrete([2, 5])" in str(check.violation(fragment(torch.tensor([[[2, 4]]]))))


def test_multi_binary_actions_may_be_bools_or_zeros_and_ones() -> None:
    check = spaces(gym.spaces.MultiBinary(3))
    assert check.violation(fragment(torch.tensor([[[True, False, True]]]))) is None
    assert check.violation(fragment(torch.tensor([[[1, 0, 1]]]))) is None
    assert "outside MultiBinary([3])" in str(check.violation(fragment(torch.tensor([[[1, 2, 1]]]))))


def test_box_actions_outside_their_bounds_pass_unless_the_policy_promises_the_bounds() -> None:
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    wide = fragment(torch.tensor([[[0.5, 3.0]]]))
    assert spaces(box).violation(wide) is None  # a Gaussian policy: the env clips
    assert "1 values outside Box[2] (e.g. 3.0)" in str(spaces(box, bounds=True).violation(wide))


def test_box_actions_must_be_finite_floats_of_the_space_shape() -> None:
    check = spaces(gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    assert "non-finite" in str(check.violation(fragment(torch.tensor([[[0.0, float("nan")]]]))))
    assert "takes floating-point" in str(check.violation(fragment(torch.tensor([[[0, 1]]]))))
    assert "shape [3] per step" in str(check.violation(fragment(torch.zeros(1, 1, 3))))


@pytest.mark.parametrize(
    ("obs", "reason"),
    [
        (torch.zeros(2, 2, 5), "observation has shape [5] per step; the env's observations are [4]"),
        (
            torch.zeros(2, 2, 4, dtype=torch.float64),
            "observation is float64; the env's observations are float32",
        ),
    ],
    ids=["shape", "dtype"],
)
def test_observations_of_another_shape_or_dtype_are_named(obs: torch.Tensor, reason: str) -> None:
    problem = spaces(gym.spaces.Discrete(2)).violation(
        fragment(torch.zeros(2, 2, dtype=torch.int64), obs=obs)
    )
    assert problem == reason


def test_a_fragment_without_actions_is_refused_when_the_job_has_an_action_space() -> None:
    data = fragment(torch.zeros(1, 1, dtype=torch.int64))
    del data["action"]
    assert "needs an 'action' tensor" in str(spaces(gym.spaces.Discrete(2)).violation(data))


def test_spaces_it_does_not_know_are_left_to_the_schema() -> None:
    check = TrajectorySpaces.of(gym.spaces.Dict({"a": CARTPOLE_OBS}), gym.spaces.Text(4), action_bounds=True)
    assert check.observation is None
    assert check.action is None
    assert check.violation(fragment(torch.zeros(1, 1, dtype=torch.int64))) is None
