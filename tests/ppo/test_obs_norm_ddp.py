"""Under DDP every rank ends an update with the same observation statistics: those of all ranks' shards."""

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

    from tests.ppo.test_obs_norm import fragment

    torch.manual_seed(0)
    meta = EnvMeta("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), num_envs=4)
    spec = PolicySpec.model_validate(
        {"modelCfg": {"normalizeObservation": True}, "algoCfg": {"updateEpochs": 1}}
    )
    policy = PPO(spec, "train")
    policy.init_train(TrainSpec.model_validate({"batchSize": 32, "stepsPerEpoch": 64}), env_meta=meta)
    data = fragment(offset=10.0 + 20.0 * rank)  # each rank's shard has its own distribution
    policy.update_dataset(data)
    policy.train()
    norm = policy.model.module.obs_norm  # DDP-wrapped
    mine = torch.cat([norm.count.reshape(1), norm.mean, norm.var, data["observation"].reshape(-1).double()])
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        torch.save(gathered, out)


@pytest.mark.timeout(120)
def test_two_ddp_ranks_merge_their_shards_into_the_same_statistics(tmp_path: Path) -> None:
    out = tmp_path / "stats.pt"
    spawn_ranks(_rank, 2, tmp_path, str(out))
    first, second = torch.load(out)
    assert torch.equal(first[:9], second[:9])  # count, mean[4], var[4]
    union = torch.cat([first[9:], second[9:]]).reshape(-1, 4)
    assert first[0].item() == pytest.approx(64 + 1e-4)
    assert torch.allclose(first[1:5], union.mean(0), rtol=1e-4)
