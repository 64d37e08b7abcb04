"""Under DDP, PPO ranks train on their own equal shards, take the same steps and stay identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.ddp import spawn_ranks


def _rank(rank: int, world: int, out: str) -> None:
    import gymnasium as gym
    from rlkube.envs.types import EnvMeta
    from rlkube.policy.builtin.ppo import PPO
    from rlkube.spec import PolicySpec, TrainSpec

    from tests.ppo.test_policy import fake_fragment_data

    torch.manual_seed(0)  # same initial weights on both ranks (DDP also broadcasts rank 0's)
    meta = EnvMeta("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), num_envs=4)
    spec = PolicySpec.model_validate({"algoCfg": {"updateEpochs": 3, "targetKl": 0.5}})
    policy = PPO(spec, "train")
    policy.init_train(TrainSpec.model_validate({"batchSize": 32, "stepsPerEpoch": 64}), env_meta=meta)
    assert policy.world_size == world
    data = fake_fragment_data(rows=4, steps=8)
    torch.manual_seed(100 + rank)  # each rank's own shard and minibatch order
    data["reward"] = torch.rand(4, 8)
    policy.update_dataset(data)
    assert policy.minibatch_size() == 16  # the global 32 split over 2 ranks
    policy.train()
    fingerprint = torch.tensor(list(policy.get_param_fingerprint().values()))
    gathered = [torch.zeros_like(fingerprint) for _ in range(world)]
    dist.all_gather(gathered, fingerprint)
    if rank == 0:
        torch.save(gathered, out)


@pytest.mark.timeout(120)
def test_two_ddp_ranks_end_an_update_with_identical_weights(tmp_path: Path) -> None:
    out = tmp_path / "fingerprints.pt"
    spawn_ranks(_rank, 2, tmp_path, str(out))
    first, second = torch.load(out)
    assert torch.equal(first, second)


def _rank_with_override(rank: int, world: int, out: str) -> None:
    import gymnasium as gym
    from rlkube.envs.types import EnvMeta
    from rlkube.policy.builtin.ppo import PPO
    from rlkube.spec import PolicySpec, TrainSpec
    from torch.nn.parallel import DistributedDataParallel

    class WrapsNothing(PPO):
        calls: list[int] = []

        def wrap_with_ddp(self, gpu_id: int, process_group: object) -> None:
            self.calls.append(gpu_id)  # e.g. a policy that syncs gradients itself

    meta = EnvMeta("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), num_envs=4)
    policy = WrapsNothing(PolicySpec(), "train")
    policy.init_train(TrainSpec.model_validate({"batchSize": 32, "stepsPerEpoch": 64}), env_meta=meta)
    wrapped = [name for name, model in policy.model_list if isinstance(model, DistributedDataParallel)]
    if rank == 0:
        torch.save({"calls": WrapsNothing.calls, "wrapped": wrapped, "models": len(policy.model_list)}, out)


@pytest.mark.timeout(120)
def test_a_policy_that_overrides_wrap_with_ddp_decides_what_is_wrapped(tmp_path: Path) -> None:
    out = tmp_path / "wrapped.pt"
    spawn_ranks(_rank_with_override, 2, tmp_path, str(out))
    seen = torch.load(out)
    assert seen["calls"] == [0]  # called once, with this rank's device index
    assert seen["models"] >= 1
    assert seen["wrapped"] == []
