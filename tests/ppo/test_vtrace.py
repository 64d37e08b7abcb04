"""V-trace's maths on tensors small enough to compute by hand."""

from __future__ import annotations

import math

import pytest
import torch
from rlkube.policy.builtin.ppo_math import gae
from rlkube.policy.utils.vtrace import vtrace_correction

F, T = False, True


def test_vtrace_clips_rho_and_c_separately() -> None:
    # pi/mu = 2 at t=0 (clipped to rho_bar 1.5 for delta and advantage, c_bar 1 for the trace), 0.5 at t=1.
    rewards = torch.tensor([1.0, 2.0])
    values = torch.tensor([1.0, 1.0])
    next_values = torch.tensor([1.0, 2.0])  # V(x_1) = 1, then the fragment's last next observation
    log_rhos = torch.tensor([math.log(2.0), math.log(0.5)])
    no = torch.zeros(2, dtype=torch.bool)
    vs, advantages = vtrace_correction(rewards, values, next_values, no, log_rhos, 0.5, 1.5, 1.0)
    # delta_1 = 0.5 * (2 + 0.5*2 - 1) = 1      -> v_1 = 1 + 1 = 2
    # delta_0 = 1.5 * (1 + 0.5*1 - 1) = 0.75   -> v_0 = 1 + 0.75 + 0.5 * 1 * (2 - 1) = 2.25
    assert vs.tolist() == pytest.approx([2.25, 2.0])
    # A_0 = 1.5 * (1 + 0.5 * v_1 - 1) = 1.5;  A_1 = 0.5 * (2 + 0.5 * V(next) - 1) = 1
    assert advantages.tolist() == pytest.approx([1.5, 1.0])


def test_vtrace_cuts_the_trace_at_termination_and_bootstraps_a_truncation() -> None:
    rewards = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    values = torch.tensor([[0.5, 1.0], [0.5, 1.0]])
    next_values = torch.tensor([[9.0, 2.0], [9.0, 2.0]])  # 9: the final frame of the ended episode
    dones = torch.tensor([[T, F], [T, F]])
    terminated = torch.tensor([[T, F], [F, F]])  # row 0 terminated at t=0, row 1 was truncated
    vs, advantages = vtrace_correction(
        rewards, values, next_values, dones, torch.zeros(2, 2), 0.5, 1.0, 1.0, terminated=terminated
    )
    # t=1 (both rows): delta = 1 + 0.5*2 - 1 = 1 -> v_1 = 2, A_1 = 1
    # row 0, t=0: delta = 1 - 0.5 = 0.5 (no bootstrap), the trace stops -> v_0 = 1, A_0 = 0.5
    # row 1, t=0: delta = 1 + 0.5*9 - 0.5 = 5 (bootstraps its last frame) -> v_0 = 5.5, A_0 = 5
    assert vs.flatten().tolist() == pytest.approx([1.0, 2.0, 5.5, 2.0])
    assert advantages.flatten().tolist() == pytest.approx([0.5, 1.0, 5.0, 1.0])


def test_every_done_is_a_termination_unless_told_otherwise_as_in_rlightning() -> None:
    rewards, values, next_values = torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([9.0])
    vs, advantages = vtrace_correction(rewards, values, next_values, torch.tensor([T]), torch.zeros(1), 0.5)
    assert vs.tolist() == pytest.approx([1.0])
    assert advantages.tolist() == pytest.approx([0.5])


def test_on_policy_vtrace_with_lambda_is_gae_s_return() -> None:
    generator = torch.Generator().manual_seed(3)
    rewards, values, next_values = (torch.randn(3, 6, generator=generator) for _ in range(3))
    terminated = torch.rand(3, 6, generator=generator) < 0.2
    truncated = (torch.rand(3, 6, generator=generator) < 0.2) & ~terminated
    _, returns = gae(rewards, values, next_values, terminated, truncated, gamma=0.9, gae_lambda=0.8)
    vs, _ = vtrace_correction(
        rewards,
        values,
        next_values,
        terminated | truncated,
        torch.zeros(3, 6),
        0.9,
        terminated=terminated,
        lambda_=0.8,
    )
    assert torch.allclose(vs, returns, atol=1e-5)


def test_a_policy_that_never_takes_the_behaviour_action_learns_nothing_from_it() -> None:
    vs, advantages = vtrace_correction(
        torch.ones(3),
        torch.zeros(3),
        torch.zeros(3),
        torch.zeros(3, dtype=torch.bool),
        torch.full((3,), -50.0),
    )
    assert vs.abs().max().item() < 1e-15
    assert advantages.abs().max().item() < 1e-15


def test_vtrace_refuses_mismatched_shapes_and_non_positive_clips() -> None:
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"rewards \(2, 3\), values \(2, 4\)"):
        vtrace_correction(x, torch.zeros(2, 4), x, x.bool(), x)
    with pytest.raises(ValueError, match="rho_bar > 0"):
        vtrace_correction(x, x, x, x.bool(), x, 0.9, 0.0, 1.0)
