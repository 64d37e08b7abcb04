"""The reference jobs in examples/ validate, carry CleanRL's settings, and build their envs (if installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rlkube.jobfile import load_job
from rlkube.policy.builtin.ppo_config import PPOAlgoConfig, PPOModelConfig, PPOOptimConfig, parse_section

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MUJOCO = ["halfcheetah", "hopper", "walker2d"]
ATARI = ["breakout", "pong"]

# CleanRL: ppo_continuous_action.py and ppo_atari.py defaults.
CLEANRL: dict[str, dict[str, Any]] = {
    "mujoco": {
        "lr": 3e-4, "num_envs": 1, "rollout": 2048, "minibatch": 64, "epochs": 10, "gamma": 0.99,
        "lambda": 0.95, "clip": 0.2, "ent": 0.0, "vf": 0.5, "grad": 0.5, "steps": 1_000_000,
    },
    "atari": {
        "lr": 2.5e-4, "num_envs": 8, "rollout": 1024, "minibatch": 256, "epochs": 4, "gamma": 0.99,
        "lambda": 0.95, "clip": 0.1, "ent": 0.01, "vf": 0.5, "grad": 0.5, "steps": 10_000_000,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", MUJOCO + ATARI)
def test_a_reference_job_passes_rlkube_validate(name: str) -> None:
    for module in load_job(EXAMPLES / f"{name}.yaml").spec.env.imports:
        pytest.importorskip(module)  # installed by the dev extra (rlkube[envs]); validate refuses it absent
    result = subprocess.run(
        [sys.executable, "-m", "rlkube.cli", "validate", str(EXAMPLES / f"{name}.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"valid RLJob default/{name}" in result.stdout


@pytest.mark.parametrize("name", MUJOCO + ATARI)
def test_a_reference_job_has_cleanrls_hyperparameters(name: str) -> None:
    spec = load_job(EXAMPLES / f"{name}.yaml").spec
    ref = CLEANRL["mujoco" if name in MUJOCO else "atari"]
    algo = parse_section(PPOAlgoConfig, spec.policy.algo_cfg, path="spec.policy.algoCfg")
    optim = parse_section(PPOOptimConfig, spec.policy.optim_cfg, path="spec.policy.optimCfg")
    model = parse_section(PPOModelConfig, spec.policy.model_cfg, path="spec.policy.modelCfg")
    assert optim.lr == ref["lr"]
    assert optim.anneal_lr
    assert optim.max_grad_norm == ref["grad"]
    assert spec.env.num_envs == ref["num_envs"]
    assert spec.train.steps_per_epoch == ref["rollout"]
    assert spec.train.batch_size == ref["minibatch"]
    assert spec.train.max_epochs * spec.train.steps_per_epoch >= ref["steps"]
    assert (spec.train.max_epochs - 1) * spec.train.steps_per_epoch < ref["steps"]
    assert (algo.update_epochs, algo.gamma, algo.gae_lambda) == (ref["epochs"], ref["gamma"], ref["lambda"])
    assert (algo.clip_coef, algo.ent_coef, algo.vf_coef) == (ref["clip"], ref["ent"], ref["vf"])
    assert algo.clip_vloss
    assert algo.norm_adv
    wrappers = [w.type for w in spec.env.wrappers]
    if name in MUJOCO:
        assert model.normalize_observation
        assert wrappers == ["ClipAction", "NormalizeReward"]
    else:
        assert model.encoder == "nature_cnn"
        assert wrappers == ["AtariPreprocessing", "EpisodicLife", "FireReset", "ClipReward", "FrameStack"]


@pytest.mark.parametrize("name", MUJOCO)
def test_a_mujoco_reference_job_builds_its_env(name: str) -> None:
    pytest.importorskip("mujoco")
    from rlkube.envs.group import EnvGroup

    spec = load_job(EXAMPLES / f"{name}.yaml").spec
    with EnvGroup.from_spec(spec.env, base_seed=0) as group:
        first = group.reset()
        assert first.observation.shape[0] == 1
        assert group.single_action_space.shape is not None


@pytest.mark.parametrize("name", ATARI)
def test_an_atari_reference_job_builds_84x84_uint8_stacked_frames(name: str) -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    import torch
    from rlkube.envs.group import EnvGroup

    spec = load_job(EXAMPLES / f"{name}.yaml").spec.env.model_copy(update={"num_envs": 1})
    with EnvGroup.from_spec(spec, base_seed=0) as group:
        first = group.reset()
        assert tuple(first.observation.shape) == (1, 4, 84, 84)
        assert first.observation.dtype == torch.uint8
