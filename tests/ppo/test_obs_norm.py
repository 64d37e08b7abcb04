"""Observation statistics are model state: moved by the trainer, shipped with every version, checkpointed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlkube.envs.group import EnvGroup
from rlkube.envs.types import EnvRet
from rlkube.policy.builtin.ppo import PPO
from rlkube.policy.builtin.running_stats import RunningObsNorm, merge_moments
from rlkube.spec import PolicySpec, TrainSpec
from rlkube.weights.plane import EvalPlaneConfig, EvalWeightPlane
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from tensordict import TensorDict

from tests.weights.conftest import shm_dir  # noqa: F401  (fixture)

NORM = {"modelCfg": {"normalizeObservation": True}, "algoCfg": {"updateEpochs": 1}}


def spec(strategy: str = "None") -> PolicySpec:
    return PolicySpec.model_validate({"type": "PPO", "weightBuffer": {"strategy": strategy}, **NORM})


def meta() -> object:
    with EnvGroup("CartPole-v1", num_envs=1, seed=0) as group:
        group.reset()
        return group.meta


def trainer() -> PPO:
    policy = PPO(spec(), "train")
    policy.init_train(TrainSpec.model_validate({"batchSize": 16, "stepsPerEpoch": 64}), env_meta=meta())
    return policy


def fragment(offset: float, rows: int = 4, steps: int = 8) -> TensorDict:
    """Observations around ``offset`` (std ~2 per feature): far from the initial mean 0, var 1."""
    torch.manual_seed(int(offset))
    obs = offset + 2.0 * torch.randn(rows, steps, 4)
    return TensorDict(
        {
            "observation": obs,
            "next_observation": obs + 0.1,
            "action": torch.randint(0, 2, (rows, steps)),
            "log_prob": torch.full((rows, steps), -0.69),
            "reward": torch.ones(rows, steps),
            "terminated": torch.zeros(rows, steps, dtype=torch.bool),
            "truncated": torch.zeros(rows, steps, dtype=torch.bool),
        },
        batch_size=[rows, steps],
    )


def same_stats(a: PPO, b: PPO) -> bool:
    return all(torch.equal(stats(a)[key], stats(b)[key]) for key in ("count", "mean", "var"))


def stats(policy: PPO) -> dict[str, torch.Tensor]:
    norm = policy.model.obs_norm
    assert isinstance(norm, RunningObsNorm)
    return {"count": norm.count.clone(), "mean": norm.mean.clone(), "var": norm.var.clone()}


def test_merging_two_samples_gives_the_moments_of_their_union() -> None:
    # [1, 2, 3] has mean 2, population variance 2/3; [4, 5] mean 4.5, variance 1/4.
    # Together [1..5]: mean 3, population variance 2.
    t = torch.tensor
    count, mean, var = merge_moments(t(3.0), t(2.0), t(2.0 / 3.0), t(2.0), t(4.5), t(0.25))
    assert (float(count), float(mean), float(var)) == pytest.approx((5.0, 3.0, 2.0))


def test_normalised_features_use_the_statistics_and_are_clipped() -> None:
    norm = RunningObsNorm(2, clip=3.0)
    norm.mean.copy_(torch.tensor([1.0, -1.0], dtype=torch.float64))
    norm.var.copy_(torch.tensor([4.0, 0.25], dtype=torch.float64))
    # (3 - 1) / 2 = 1 and (0 + 1) / 0.5 = 2; (101 - 1) / 2 = 50 is clipped to 3.
    assert norm(torch.tensor([[3.0, 0.0]]))[0].tolist() == pytest.approx([1.0, 2.0])
    assert norm(torch.tensor([[101.0, -1.0]]))[0].tolist() == pytest.approx([3.0, 0.0])


def test_statistics_move_after_the_update_from_the_raw_observations_it_trained_on() -> None:
    policy = trainer()
    data = fragment(offset=50.0)
    policy.update_dataset(data)
    assert stats(policy)["mean"].abs().max() == 0.0  # collecting and GAE used version v's statistics
    metrics = policy.train()
    after = stats(policy)
    raw = data["observation"].reshape(-1, 4).double()
    assert after["count"].item() == pytest.approx(32 + 1e-4)
    assert torch.allclose(after["mean"], raw.mean(0), rtol=1e-4)
    # The prior (count 1e-4, variance 1, mean 0) still weighs a little: (1e-4 * (1 + 50^2)) / 32 ~ 0.008.
    assert torch.allclose(after["var"], raw.var(0, unbiased=False), atol=0.02)
    # The batch was trained with the statistics it was collected with: the first step's ratio is 1.
    assert metrics["losses/approx_kl"] < 1e-2


def test_an_eval_policy_normalises_with_the_statistics_of_the_version_it_loaded() -> None:
    train = trainer()
    evaluator = PPO(spec(), "eval")
    evaluator.init_eval(env_meta=meta())
    obs = EnvRet(env_id=torch.arange(3), observation=40.0 + torch.randn(3, 4))
    for offset in (30.0, 60.0):
        train.update_dataset(fragment(offset))
        train.train()
        evaluator.load_state_dict(train.get_trainable_parameters())
        assert same_stats(train, evaluator)
        fingerprint = evaluator.get_param_fingerprint()
        assert fingerprint == train.get_param_fingerprint()
        assert {"model.obs_norm.mean", "model.obs_norm.var", "model.obs_norm.count"} <= set(fingerprint)
        greedy = evaluator.rollout_step(obs, deterministic=True)
        expected = train.rollout_step(obs, deterministic=True)
        assert torch.equal(greedy.action, expected.action)
        assert torch.allclose(greedy.value, expected.value)


def test_statistics_are_saved_in_checkpoints_and_restored(tmp_path: Path) -> None:
    train = trainer()
    train.update_dataset(fragment(20.0))
    train.train()
    train.save_checkpoint(tmp_path / "policy.pt")
    restored = trainer()
    assert not torch.equal(stats(restored)["mean"], stats(train)["mean"])
    restored.load_checkpoint(tmp_path / "policy.pt")
    assert same_stats(train, restored)


def test_eval_workers_on_two_nodes_get_the_trainers_statistics_with_each_version(shm_dir: Path) -> None:  # noqa: F811
    train = trainer()
    evaluators: list[PPO] = []
    planes: list[EvalWeightPlane] = []
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir / "train", listen="127.0.0.1:0")) as publisher:
        try:
            for node in ("node-a", "node-b"):
                policy = PPO(spec("Shared"), "eval")
                plane = EvalWeightPlane(EvalPlaneConfig("Shared", shm_dir / node, publisher.address, node))
                plane.attach(policy)
                policy.init_eval(env_meta=meta())
                plane.start(policy)
                evaluators.append(policy)
                planes.append(plane)
            for offset in (10.0, 70.0, 5.0):
                train.update_dataset(fragment(offset))
                train.train()
                version = publisher.send(
                    train.get_trainable_parameters(), fingerprint=train.get_param_fingerprint()
                )
                for policy, plane in zip(evaluators, planes, strict=True):
                    plane.sync(policy, min_version=version, timeout=30)
                    assert policy.weight_version == version
                    assert same_stats(train, policy)
                    assert plane.loaded_report(policy).fingerprint == train.get_param_fingerprint()
        finally:
            for policy in evaluators:
                policy.close()
            for plane in planes:
                plane.close()


def test_a_resumed_run_continues_from_the_checkpointed_statistics(tmp_path: Path) -> None:
    from rlkube.engine.checkpoint import COMPLETE_FILE
    from rlkube.engine.run_paths import RunPaths
    from rlkube.launch.in_process import InProcessRun
    from rlkube.spec import parse_job

    def job(epochs: int) -> object:
        return parse_job(
            {
                "apiVersion": "rlkube.io/v1alpha1",
                "kind": "RLJob",
                "metadata": {"name": "norm-resume"},
                "spec": {
                    "policy": {"type": "PPO", **NORM},
                    "env": {"id": "CartPole-v1", "numEnvs": 4},
                    "train": {
                        "maxEpochs": epochs,
                        "stepsPerEpoch": 32,
                        "fragmentLength": 8,
                        "batchSize": 16,
                        "evalInterval": 0,
                        "saveInterval": 1,
                    },
                },
            }
        )

    paths = RunPaths(tmp_path).create()
    first = InProcessRun(job(2), PPO, paths=paths)  # type: ignore[arg-type]
    first.run()
    saved = stats(first.train_policy)  # type: ignore[arg-type]
    assert saved["count"].item() == pytest.approx(64 + 1e-4)
    (paths.checkpoints / COMPLETE_FILE).unlink()  # let the same job train on (as a larger maxEpochs would)
    second = InProcessRun(job(3), PPO, paths=paths)  # type: ignore[arg-type]
    second.run()
    resumed = stats(second.train_policy)  # type: ignore[arg-type]
    assert resumed["count"].item() == pytest.approx(96 + 1e-4)  # 64 restored + one more epoch of 32
    # The eval worker collected the third epoch with the version published at resume: the
    # checkpointed statistics (it loads a newer version only when a task needs one).
    eval_stats = stats(second.eval_policy)  # type: ignore[arg-type]
    assert torch.equal(eval_stats["mean"], saved["mean"])
