"""engine: rsl runs rsl_rl's PPO (RSLRLPolicy) on continuing fragments, in process as in a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rlkube.engine.rollout import RolloutWorker
from rlkube.engine.run_paths import RunPaths
from rlkube.envs.group import EnvGroup
from rlkube.launch.in_process import InProcessRun
from rlkube.policy.builtin.rsl_rl_policy import RSLRLPolicy
from rlkube.spec import PolicySpec, SpecError, TrainSpec, parse_job

pytest.importorskip("rsl_rl")

SMALL = {
    "algorithm": {"num_learning_epochs": 2, "num_mini_batches": 2, "learning_rate": 1e-3},
    "actor": {"hidden_dims": [32, 32]},
    "critic": {"hidden_dims": [32, 32]},
}


def rsl_job(**spec: Any) -> Any:
    document: dict[str, Any] = {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "rsl"},
        "spec": {
            "engine": "rsl",
            "policy": {"type": "RSLRLPolicy", "algoCfg": SMALL},
            "env": {"id": "Pendulum-v1", "numEnvs": 2},
            "train": {
                "maxEpochs": 3,
                "stepsPerEpoch": 32,
                "fragmentLength": 16,
                "batchSize": 16,
                "evalInterval": 0,
                "saveInterval": 0,
            },
            **spec,
        },
    }
    return parse_job(document)


def test_an_rsl_job_trains_rsl_rl_s_ppo_in_process(tmp_path: Path) -> None:
    summary = InProcessRun(rsl_job(), RSLRLPolicy, paths=RunPaths(tmp_path).create()).run()
    assert summary.engine == "rsl"
    assert summary.epochs == 3
    assert summary.env_steps == 3 * 32
    assert summary.fingerprints_consistent
    assert summary.details["fragments_trained"] == 3  # one fragment (2 envs x 16 steps) per epoch


def test_rsl_with_a_replay_buffer_is_refused_by_the_spec() -> None:
    with pytest.raises(SpecError, match=r"spec\.buffer\.type: got 'replay', expected rollout with engine"):
        rsl_job(buffer={"type": "replay"})


def test_unknown_rsl_rl_sections_name_their_key() -> None:
    spec = PolicySpec.model_validate({"type": "RSLRLPolicy", "algoCfg": {"algorythm": {}}})
    with pytest.raises(SpecError, match=r"spec.policy.algoCfg.algorythm: unknown section"):
        RSLRLPolicy(spec, "train")


def test_the_fragment_s_behaviour_log_probs_and_returns_fill_rsl_rl_s_storage() -> None:
    spec = PolicySpec.model_validate(
        {"type": "RSLRLPolicy", "algoCfg": SMALL, "weightBuffer": {"strategy": "None"}}
    )
    with EnvGroup("Pendulum-v1", num_envs=2, seed=0) as group:
        group.reset()
        train = RSLRLPolicy(spec, "train")
        train.init_train(TrainSpec(), env_meta=group.meta)
        evaluator = RSLRLPolicy(spec, "eval")
        evaluator.init_eval(env_meta=group.meta)
        evaluator.load_state_dict(train.get_trainable_parameters())
        fragment = RolloutWorker(group, evaluator).collect(8)
    train.update_dataset(fragment.data)
    storage = train.alg.storage
    assert storage.step == 8
    assert torch.allclose(storage.actions_log_prob[:, :, 0], fragment.data["log_prob"].T.float())
    assert torch.isfinite(storage.returns).all()
    metrics = train.train()
    assert {"losses/value", "losses/surrogate", "losses/entropy", "charts/learning_rate"} <= set(metrics)
    evaluator.close()
