"""DDP as RLightning wraps it (unused parameters allowed), and checkpoints a user may override safely."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rlkube.engine.checkpoint import CheckpointStore, TrainerProgress
from rlkube.envs.types import EnvMeta
from rlkube.spec import PolicySpec
from tensordict import TensorDict

from tests.ddp import leave_process_group
from tests.porting.own_policies import CheckpointingPolicy, OwnDDPPolicy, UnusedHeadPolicy

META = EnvMeta(
    env_name="CartPole-v1",
    observation_space=gym.spaces.Box(-5.0, 5.0, (4,)),
    action_space=gym.spaces.Discrete(2),
    num_envs=2,
)


def spec() -> PolicySpec:
    return PolicySpec.model_validate({"type": "X", "optimCfg": {"lr": 0.01}})


def batch(seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    rows, steps = 2, 8
    return TensorDict(
        {
            "observation": torch.randn(rows, steps, 4, generator=g),
            "next_observation": torch.randn(rows, steps, 4, generator=g),
            "action": torch.randint(0, 2, (rows, steps), generator=g),
            "log_prob": torch.full((rows, steps), -0.69),
            "reward": torch.ones(rows, steps),
            "terminated": torch.zeros(rows, steps, dtype=torch.bool),
            "truncated": torch.zeros(rows, steps, dtype=torch.bool),
        },
        batch_size=[rows, steps],
    )


#: (policy, ddp_find_unused_parameters) trained on the same two ranks, one after the other; the
#: scenario expected to fail goes last (a failed DDP step may leave the group unusable).
SCENARIOS = (("UnusedHeadPolicy", True), ("OwnDDPPolicy", True), ("UnusedHeadPolicy", False))


def _train_scenarios(rank: int, world: int, port: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, unused in SCENARIOS:
            out.put(((name, unused), rank, *_train_scenario(name, unused, rank)))
    finally:
        leave_process_group()


def _train_scenario(name: str, unused: bool, rank: int) -> tuple[str, dict[str, float]]:
    """(status, fingerprint); the policy and its DDP module end with this call."""
    classes = {"UnusedHeadPolicy": UnusedHeadPolicy, "OwnDDPPolicy": OwnDDPPolicy}
    policy = type(name, (classes[name],), {"ddp_find_unused_parameters": unused})(spec(), "train")
    try:
        policy.init_train(None, env_meta=META)
        for step in range(2):  # an unused parameter breaks DDP on the second step, if at all
            policy.update_dataset(batch(seed=rank * 10 + step))
            policy.train()
        return "ok", policy.get_param_fingerprint()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}", {}


@pytest.fixture(scope="module")
def two_ranks() -> dict[tuple[str, bool], list[tuple[str, dict[str, float]]]]:
    """Every scenario's (status, fingerprint) on rank 0 and rank 1."""
    from rlkube.launch.local import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_train_scenarios, args=(r, 2, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=180) for _ in range(len(SCENARIOS) * 2)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0, 0]  # both ranks left the group cleanly
    by_scenario: dict[tuple[str, bool], list[tuple[str, dict[str, float]]]] = {}
    for scenario, _rank, status, fingerprint in sorted(results, key=lambda r: (r[0], r[1])):
        by_scenario.setdefault(scenario, []).append((status, fingerprint))
    return by_scenario


def test_a_policy_with_a_head_no_step_uses_trains_with_two_ranks_under_the_default_wrap(two_ranks) -> None:
    (status0, rank0), (status1, rank1) = two_ranks[("UnusedHeadPolicy", True)]
    assert (status0, status1) == ("ok", "ok")
    assert rank0["actor.weight"] == pytest.approx(rank1["actor.weight"])  # gradients were averaged
    assert rank0["critic.aux.weight"] == pytest.approx(rank1["critic.aux.weight"])


def test_without_find_unused_parameters_the_same_policy_fails_so_the_default_matters(two_ranks) -> None:
    statuses = [status for status, _ in two_ranks[("UnusedHeadPolicy", False)]]
    assert all("did not receive grad" in s or "finished reduction" in s for s in statuses), statuses


def test_a_cpu_safe_custom_wrap_with_ddp_as_the_guide_writes_it_trains_with_two_ranks(two_ranks) -> None:
    assert [status for status, _ in two_ranks[("OwnDDPPolicy", True)]] == ["ok", "ok"]


def test_a_custom_save_checkpoint_without_load_checkpoint_still_resumes(tmp_path: Path) -> None:
    trained = CheckpointingPolicy(spec(), "train")
    trained.init_train(None, env_meta=META)
    trained.update_dataset(batch(seed=1))
    trained.train()
    store = CheckpointStore(tmp_path)
    saved = store.save(trained, TrainerProgress(epoch=1, weight_version=1))
    assert (saved / "policy.pt").is_file()  # the user's own format is written as they asked
    fresh = CheckpointingPolicy(spec(), "train")
    fresh.init_train(None, env_meta=META)
    checkpoint = store.latest()
    assert checkpoint is not None
    progress = store.load(checkpoint, fresh)
    assert progress.epoch == 1
    assert fresh.get_param_fingerprint() == trained.get_param_fingerprint()


def test_the_default_loader_on_a_custom_file_names_the_missing_method(tmp_path: Path) -> None:
    policy = CheckpointingPolicy(spec(), "train")
    policy.init_train(None, env_meta=META)
    policy.save_checkpoint(tmp_path / "policy.pt")
    with pytest.raises(ValueError, match="overrides save_checkpoint: define load_checkpoint"):
        policy.load_checkpoint(tmp_path / "policy.pt")
