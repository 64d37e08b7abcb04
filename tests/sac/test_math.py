"""SAC's maths on tensors small enough to compute by hand."""

from __future__ import annotations

import math

import pytest
import torch
from rlkube.policy.builtin.sac_math import (
    actor_loss,
    critic_loss,
    polyak_update_,
    soft_td_target,
    squashed_log_prob,
    temperature_loss,
)
from torch.distributions import Normal


def test_the_squashed_log_prob_adds_the_tanh_change_of_variables() -> None:
    normal = Normal(torch.zeros(1, 2), torch.ones(1, 2))
    u = torch.tensor([[0.0, 1.0]])
    gaussian = -0.5 * math.log(2 * math.pi)  # log N(0; 0, 1)
    # dim 0: tanh(0) = 0, no correction; dim 1: log N(1) - log(1 - tanh(1)^2)
    expected = gaussian + (gaussian - 0.5) - math.log(1 - math.tanh(1.0) ** 2 + 1e-6)
    assert squashed_log_prob(normal, u).tolist() == pytest.approx([expected], rel=1e-5)


def test_the_soft_target_bootstraps_the_smaller_critic_minus_the_entropy_term_unless_terminated() -> None:
    target = soft_td_target(
        torch.tensor([1.0, 1.0]),
        torch.tensor([False, True]),
        torch.tensor([3.0, 3.0]),
        torch.tensor([2.0, 2.0]),
        torch.tensor([-1.0, -1.0]),
        alpha=0.5,
        gamma=0.9,
    )
    # min(3, 2) - 0.5 * (-1) = 2.5 -> 1 + 0.9 * 2.5 = 3.25; terminated: just the reward
    assert target.tolist() == pytest.approx([3.25, 1.0])


def test_critic_and_actor_losses() -> None:
    q1, q2, y = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), torch.tensor([1.0, 3.0])
    assert critic_loss(q1, q2, y).item() == pytest.approx(0.5 * ((0 + 1) / 2 + (1 + 1) / 2))
    # alpha log pi - min(Q1, Q2): (0.1*-2 - 0) and (0.1*-2 - 2) averaged
    assert actor_loss(torch.tensor([-2.0, -2.0]), q1, q2, alpha=0.1).item() == pytest.approx(-1.2)


def test_the_temperature_rises_while_the_entropy_is_below_its_target() -> None:
    log_alpha = torch.zeros((), requires_grad=True)
    # log pi = 1: entropy about -1, below the target -0.5 -> loss = -log_alpha * 0.5; the gradient is -0.5
    temperature_loss(log_alpha, torch.tensor([1.0]), target_entropy=-0.5).backward()
    assert log_alpha.grad is not None
    assert log_alpha.grad.item() == pytest.approx(-0.5)


def test_polyak_moves_the_target_a_tau_step_towards_the_source() -> None:
    target, source = [torch.tensor([0.0, 10.0])], [torch.tensor([1.0, 0.0])]
    polyak_update_(target, source, tau=0.1)
    assert target[0].tolist() == pytest.approx([0.1, 9.0])
