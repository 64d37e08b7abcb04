"""RLightning's helper functions on rlkube compute what their names promise, on hand-worked tensors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from rlkube.buffer.utils.preprocessors import (
    BoxFlattenPreprocessor,
    DiscretePreprocessor,
    NonPreprocessor,
    get_preprocessor_cls,
)
from rlkube.buffer.utils.utils import default_compute_gae, default_gae_no_loop
from rlkube.policy.utils.losses import (
    compute_ppo_actor_critic_loss,
    compute_ppo_actor_loss,
    compute_ppo_critic_loss,
)
from rlkube.policy.utils.router import (
    NodeAffinityRouter,
    SimpleRouter,
    SyncNodeAffinityRouter,
    SyncSimpleRouter,
    create_router,
)
from rlkube.policy.utils.utils import huber_loss, masked_mean

# ---------------------------------------------------------------------------- GAE helpers


def test_default_compute_gae_matches_a_hand_worked_two_env_trace() -> None:
    # [T=2, envs=2]; env 1 is done at t=0, so its t=0 advantage does not look past it.
    rewards = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    values = torch.tensor([[0.5, 0.5], [0.25, 1.0]])
    next_values = torch.tensor([[0.25, 9.0], [1.0, 1.0]])
    dones = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    gamma, lam = 0.9, 0.5
    # env 0: delta1 = 0 + .9*1 - .25 = .65; delta0 = 1 + .9*.25 - .5 = .725; A0 = .725 + .45*.65
    # env 1: delta1 = 2 + .9*1 - 1 = 1.9; delta0 = 1 + 0 - .5 = .5 (done cuts bootstrap and trace)
    expected = torch.tensor([[0.725 + 0.45 * 0.65, 0.5], [0.65, 1.9]])
    advantages, returns = default_compute_gae(
        rewards, values, next_values, dones, gamma, lam, normalize_adv=False
    )
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)
    normalized, same_returns = default_gae_no_loop(rewards, values, next_values, dones, gamma, lam)
    torch.testing.assert_close(normalized, (expected - expected.mean()) / (expected.std() + 1e-8))
    torch.testing.assert_close(same_returns, returns)


# ---------------------------------------------------------------------------- losses


def test_ppo_actor_loss_clips_each_side_and_averages_over_valid_entries_only() -> None:
    old = torch.zeros(3)
    new = torch.log(torch.tensor([1.5, 0.5, 4.0]))
    advantages = torch.tensor([1.0, -1.0, 1.0])
    mask = torch.tensor([True, True, False])
    loss, metrics = compute_ppo_actor_loss(new, old, 0.2, 0.3, advantages, loss_mask=mask)
    # entry 0: max(-1.5, -1.3) = -1.3; entry 1: max(0.5, 0.8) = 0.8; entry 2 masked out
    torch.testing.assert_close(loss, torch.tensor((-1.3 + 0.8) / 2))
    assert float(metrics["actor/clip_fraction"]) == pytest.approx(1.0)
    assert float(metrics["actor/approx_kl"]) == pytest.approx(-(np.log(1.5) + np.log(0.5)) / 2)


def test_ppo_actor_loss_dual_clip_bounds_negative_advantage_losses() -> None:
    new, old = torch.log(torch.tensor([10.0])), torch.zeros(1)
    loss, _ = compute_ppo_actor_loss(new, old, 0.2, 0.2, torch.tensor([-1.0]), c_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor(3.0))  # min(max(10, 1.2), 3)
    with pytest.raises(ValueError, match="above 1"):
        compute_ppo_actor_loss(new, old, 0.2, 0.2, torch.tensor([-1.0]), c_clip=0.5)
    with pytest.raises(TypeError, match="float32"):
        compute_ppo_actor_loss(new.double(), old, 0.2, 0.2, torch.tensor([-1.0]))


def test_ppo_critic_loss_takes_the_larger_huber_loss_of_the_clipped_and_unclipped_value() -> None:
    values, prev, returns = torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([0.0])
    loss, metrics = compute_ppo_critic_loss(values, returns, prev, value_clip=0.5, huber_delta=10.0)
    torch.testing.assert_close(loss, torch.tensor(2.0))  # max(0.5 * 2^2, 0.5 * 0.5^2)
    assert metrics["critic/value_clip_ratio"] == 1.0
    total, both = compute_ppo_actor_critic_loss(
        logprobs=torch.zeros(1),
        old_logprobs=torch.zeros(1),
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        advantages=torch.ones(1),
        values=values,
        returns=returns,
        prev_values=prev,
        value_clip=0.5,
        huber_delta=10.0,
    )
    torch.testing.assert_close(total, torch.tensor(-1.0 + 2.0))
    assert {"actor/policy_loss", "critic/value_loss"} <= set(both)


def test_huber_loss_and_masked_mean() -> None:
    torch.testing.assert_close(huber_loss(torch.tensor([0.5, -3.0]), 1.0), torch.tensor([0.125, 2.5]))
    values = torch.tensor([1.0, 3.0, 100.0])
    assert float(masked_mean(values, torch.tensor([True, True, False]))) == 2.0
    assert float(masked_mean(values, torch.tensor([False, False, False]))) == 0.0


# ---------------------------------------------------------------------------- preprocessors


def test_preprocessors_flatten_boxes_one_hot_discretes_and_pass_the_rest() -> None:
    box = gym.spaces.Box(0, 1, shape=(2, 3))
    assert get_preprocessor_cls(box) is BoxFlattenPreprocessor
    flatten = BoxFlattenPreprocessor(box)
    assert flatten.shape == (6,)
    assert flatten(np.ones((2, 3))).shape == (6,)
    assert flatten.batch_transform(torch.ones(4, 2, 3)).shape == (4, 6)
    discrete = gym.spaces.Discrete(3)
    assert get_preprocessor_cls(discrete) is DiscretePreprocessor
    one_hot = DiscretePreprocessor(discrete)
    torch.testing.assert_close(one_hot(torch.tensor(2)), torch.tensor([0.0, 0.0, 1.0]))
    assert isinstance(one_hot(np.array([0, 1])), np.ndarray)
    tuple_space = gym.spaces.Tuple((discrete, discrete))
    assert get_preprocessor_cls(tuple_space) is NonPreprocessor
    with pytest.raises(TypeError, match="Box"):
        BoxFlattenPreprocessor(discrete)


# ---------------------------------------------------------------------------- routers

DISTRIBUTION = {
    "node-a": {"env": {"ids": [0]}, "eval": {"ids": [0, 1]}},
    "node-b": {"env": {"ids": [1]}, "eval": {"ids": [2]}},
}


def test_simple_router_fills_the_least_loaded_policy_first() -> None:
    assert SimpleRouter().assign([2, 0, 1], 4) == [1, 1, 2, 0]
    with pytest.raises(ValueError, match="no eval policies"):
        SimpleRouter().assign([], 1)


def test_node_affinity_router_keeps_requests_on_their_env_worker_s_node() -> None:
    router = NodeAffinityRouter(DISTRIBUTION, policy_node_ids=["node-a", "node-a", "node-b"])
    assert router.assign([0, 0, 5], 3, env_ids=["x-1", "x-0", "x-0"]) == [2, 0, 1]


def test_sync_routers_take_policies_in_turn_and_by_node() -> None:
    assert [SyncSimpleRouter(["p", "q"]).select_policy() for _ in range(1)] == ["p"]
    simple = create_router("sync", "simple", ["p", "q"])
    assert [simple.select_policy() for _ in range(3)] == ["p", "q", "p"]  # type: ignore[union-attr]
    by_node = SyncNodeAffinityRouter(["a0", "a1", "b0"], DISTRIBUTION)
    assert by_node.num_nodes == 2
    assert [by_node.select_policy("0-1") for _ in range(2)] == ["b0", "b0"]
    assert [by_node.select_policy("0-0") for _ in range(3)] == ["a0", "a1", "a0"]
    assert isinstance(create_router("async", "simple", []), SimpleRouter)
    with pytest.raises(ValueError, match="global_resource_manager"):
        create_router("sync", "node_affinity", ["p"])


# ---------------------------------------------------------------------------- the VLA-PPO family's loss path


@pytest.mark.parametrize("logprob_type", ["token_level", "action_level", "chunk_level"])
def test_vla_ppo_s_loss_path_shapes_chunked_actions_and_reduces_to_the_hand_worked_loss(
    logprob_type: str,
) -> None:
    from rlkube.policy.utils.utils import append_to_dict, postprocess_loss_metric, preprocess_loss_inputs

    batch, chunks, action_dim = 4, 2, 3
    logprobs = torch.zeros(batch, chunks * action_dim, requires_grad=True)
    values = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    kwargs = preprocess_loss_inputs(
        logprobs=logprobs,
        old_logprobs=torch.zeros(batch, chunks * action_dim),
        advantages=torch.tensor([1.0, 2.0, 3.0, 4.0]),
        logprob_type=logprob_type,
        single_action_dim=action_dim,
        values=values,
        prev_values=values.detach(),
        returns=values.detach(),
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        value_clip=0.2,
        huber_delta=10.0,
    )
    assert kwargs["clip_ratio_low"] == 0.2
    assert kwargs["advantages"].dim() == kwargs["logprobs"].dim()
    loss, metrics = compute_ppo_actor_critic_loss(**kwargs)
    torch.testing.assert_close(loss, torch.tensor(-2.5))  # ratio 1: -mean(A); V == R: no value loss
    loss.backward()
    assert logprobs.grad is not None
    collected: dict[str, list[float]] = {}
    append_to_dict(collected, postprocess_loss_metric(metrics))
    assert collected["critic/value_loss"] == [0.0]
    with pytest.raises(ValueError, match="single_action_dim"):
        preprocess_loss_inputs(logprobs, logprobs, torch.zeros(batch), logprob_type=logprob_type)


def _average_over_two_ranks(rank: int, store_path: str, results: Any) -> None:
    import torch.distributed as dist
    from rlkube.utils.distributed.collective import all_reduce_dict
    from rlkube.utils.distributed.group_initializer import ParallelMode

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    try:
        results[rank] = all_reduce_dict(
            {"loss": float(rank + 1)}, comm_mode=ParallelMode.TRAIN_DATA_PARALLEL, op=dist.ReduceOp.AVG
        )
    finally:
        dist.destroy_process_group()


def test_all_reduce_dict_averages_over_gloo_ranks_as_vla_ppo_asks(tmp_path: Any) -> None:
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_average_over_two_ranks, args=(str(tmp_path / "store"), results), nprocs=2, join=True)
        assert dict(results) == {0: {"loss": 1.5}, 1: {"loss": 1.5}}
