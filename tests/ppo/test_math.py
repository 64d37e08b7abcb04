"""PPO's maths on tensors small enough to compute by hand."""

from __future__ import annotations

import math

import pytest
import torch
from rlkube.policy.builtin.ppo_math import clipped_surrogate, explained_variance, gae, normalize, value_loss

F, T = False, True


def test_gae_cuts_at_termination_bootstraps_truncation_and_stops_at_the_fragment_end() -> None:
    # Row 0: step 0 continues, step 1 terminates, step 2 is truncated, step 3 is the fragment's end.
    # Row 1: no episode ends, so the lambda-discounted trace runs through the whole fragment.
    rewards = torch.tensor([[1.0, 2.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 1.0, 2.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    next_values = torch.tensor([[1.0, 4.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    terminated = torch.tensor([[F, T, F, F], [F, F, F, F]])
    truncated = torch.tensor([[F, F, T, F], [F, F, F, F]])
    advantages, returns = gae(rewards, values, next_values, terminated, truncated, gamma=0.5, gae_lambda=0.5)
    # t=3: delta = 1 + 0.5*2 - 1 = 1                 -> A = 1        (nothing after the fragment end)
    # t=2: delta = 1 + 0.5*3 - 2 = 0.5 (truncated: bootstraps V(final frame) = 3) -> A = 0.5 (cut)
    # t=1: delta = 2 + 0 - 1 = 1 (terminated: no bootstrap) -> A = 1 (cut)
    # t=0: delta = 1 + 0.5*1 - 0.5 = 1               -> A = 1 + 0.25 * 1 = 1.25
    assert advantages[0].tolist() == pytest.approx([1.25, 1.0, 0.5, 1.0])
    assert advantages[1].tolist() == pytest.approx([0.015625, 0.0625, 0.25, 1.0])
    assert returns[0].tolist() == pytest.approx([1.75, 2.0, 2.5, 2.0])


def test_gae_with_lambda_one_is_the_bootstrapped_discounted_return() -> None:
    rewards = torch.tensor([[1.0, 1.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 0.6]])
    next_values = torch.tensor([[0.4, 0.6, 5.0]])
    no = torch.zeros(1, 3, dtype=torch.bool)
    _, returns = gae(rewards, values, next_values, no, no, gamma=0.9, gae_lambda=1.0)
    expected_first = 1 + 0.9 * 1 + 0.81 * 1 + 0.729 * 5.0
    assert returns[0, 0].item() == pytest.approx(expected_first)


def test_gae_refuses_mismatched_shapes() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"rewards \(2, 3\), values \(2, 4\)"):
        gae(x, torch.zeros(2, 4), x, x.bool(), x.bool(), gamma=0.9, gae_lambda=0.9)


def test_clipped_surrogate_takes_the_pessimistic_branch() -> None:
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7])
    new_log_prob = ratios.log().requires_grad_(True)
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    out = clipped_surrogate(new_log_prob, torch.zeros(4), advantages, clip_coef=0.2)
    # per element max(-A r, -A clip(r)): -1.2, -0.5, 1.1, 0.8
    assert out.loss.item() == pytest.approx(0.05)
    assert out.clipfrac.item() == pytest.approx(0.75)
    expected_kl = sum((r - 1) - math.log(r) for r in [1.5, 0.5, 1.1, 0.7]) / 4
    assert out.approx_kl.item() == pytest.approx(expected_kl, rel=1e-5)
    out.loss.backward()
    # clipped elements (0 and 3) pass no gradient; d(-A r)/dlog r = -A r, over 4 elements
    assert new_log_prob.grad is not None
    assert new_log_prob.grad.tolist() == pytest.approx([0.0, -0.125, 0.275, 0.0])


def test_value_loss_clips_around_the_old_values() -> None:
    old = torch.tensor([1.0, 1.0])
    new = torch.tensor([2.0, 0.9])
    returns = torch.tensor([3.0, 0.0])
    # element 0: unclipped (2-3)^2 = 1, clipped (1.2-3)^2 = 3.24 -> 3.24; element 1: both 0.81
    assert value_loss(new, old, returns, clip_coef=0.2, clip=True).item() == pytest.approx(1.0125)
    assert value_loss(new, old, returns, clip_coef=0.2, clip=False).item() == pytest.approx(0.4525)


def test_normalize_and_explained_variance() -> None:
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    normed = normalize(x)
    assert normed.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert normed.std().item() == pytest.approx(1.0, rel=1e-6)
    assert normalize(torch.tensor([5.0])).item() == 5.0
    assert explained_variance(x, x) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4), x) == pytest.approx(0.0)
    assert math.isnan(explained_variance(x, torch.ones(4)))


def test_the_clipped_value_loss_form_trains_the_clipped_value_alone() -> None:
    # V moved 0.5 past the old value *away* from the return (old 1, new 0.5, return 3):
    # unclipped (0.5-3)^2 = 6.25, clipped (0.8-3)^2 = 4.84. "max" (CleanRL) takes 6.25 and pulls
    # V back; "clipped" (SB3's clip_range_vf) takes 4.84, which V (past the clip) does not move.
    old = torch.tensor([1.0])
    returns = torch.tensor([3.0])
    pessimistic = torch.tensor([0.5], requires_grad=True)
    loss = value_loss(pessimistic, old, returns, clip_coef=0.2, clip=True, form="max")
    assert loss.item() == pytest.approx(3.125)
    loss.backward()
    assert pessimistic.grad is not None
    assert pessimistic.grad.item() == pytest.approx(-2.5)
    clipped_only = torch.tensor([0.5], requires_grad=True)
    loss = value_loss(clipped_only, old, returns, clip_coef=0.2, clip=True, form="clipped")
    assert loss.item() == pytest.approx(2.42)
    loss.backward()
    assert clipped_only.grad is not None
    assert clipped_only.grad.item() == 0.0
    # Inside the clip range both forms are the plain loss.
    inside = torch.tensor([1.1])
    for form in ("max", "clipped"):
        assert value_loss(inside, old, returns, clip_coef=0.2, clip=True, form=form).item() == pytest.approx(
            0.5 * 1.9**2
        )
    with pytest.raises(ValueError, match="max"):
        value_loss(inside, old, returns, clip_coef=0.2, clip=True, form="huber")
