"""``spec.env.vectorization: envpool``: the same EnvGroup contract as gymnasium's backends.

Same-step autoreset (envpool's own is next-step), raw whole-game episode statistics, seeds, the
spaces of a reference job, and an unknown id refused before any process starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from rlkube.envs.group import EnvError, EnvGroup
from rlkube.jobfile import load_job
from rlkube.launch.preflight import preflight
from rlkube.spec import EnvSpec

pytest.importorskip("envpool")

ROOT = Path(__file__).resolve().parents[2]
BREAKOUT = ROOT / "examples" / "breakout.yaml"
CARTPOLE_START = 0.05  # CartPole-v1 starts every state variable in [-0.05, 0.05]


def envpool_group(env: dict[str, Any], *, base_seed: int = 0) -> EnvGroup:
    return EnvGroup.from_spec(
        EnvSpec.model_validate({**env, "vectorization": "envpool"}), base_seed=base_seed
    )


def breakout_env(num_envs: int) -> dict[str, Any]:
    env = dict(load_job(BREAKOUT).spec.env.model_dump(by_alias=True, mode="json"))
    return {**env, "numEnvs": num_envs}


def test_an_ended_episode_restarts_within_the_step_that_ended_it() -> None:
    with envpool_group({"id": "CartPole-v1", "numEnvs": 3}, base_seed=5) as group:
        group.reset()
        ends = 0
        for _ in range(60):
            ret = group.step(torch.ones(3, dtype=torch.long))  # always right: ends in ~10 steps
            done = ret.done
            for i in torch.nonzero(done).flatten().tolist():
                ends += 1
                # observation: the next episode's first; final_observation: the ended one's last.
                assert ret.observation[i].abs().max() <= CARTPOLE_START
                assert ret.final_observation[i].abs().max() > CARTPOLE_START
            assert torch.equal(ret.final_observation[~done], ret.observation[~done])
            # The action of every step acts: no step is spent resetting (envpool's next-step mode).
            elapsed = ret.info["elapsed_step"]
            assert all(elapsed[i] >= 1 for i in range(3))
        returns, lengths = group.pop_finished_episodes()
    assert ends > 3
    assert len(returns) == ends
    assert returns == [float(n) for n in lengths]  # CartPole: reward 1 per step
    assert all(8 <= n <= 12 for n in lengths)


def test_a_time_limit_truncates_and_reports_the_shortened_episode() -> None:
    env = {"id": "Pendulum-v1", "numEnvs": 2, "wrappers": [{"type": "TimeLimit", "maxEpisodeSteps": 5}]}
    with envpool_group(env) as group:
        group.reset()
        rets = [group.step(torch.zeros(2, 1)) for _ in range(10)]
        assert group.meta.max_episode_steps == 5
        returns, lengths = group.pop_finished_episodes()
    every_fifth = [[False, False]] * 4 + [[True, True]]
    assert [r.truncated.tolist() for r in rets] == every_fifth * 2
    assert not any(r.terminated.any() for r in rets)
    assert lengths == [5, 5, 5, 5]
    rewards = torch.stack([r.reward for r in rets])  # Pendulum: a negative cost every step
    assert returns[:2] == pytest.approx(rewards[:5].sum(0).tolist(), rel=1e-5)


def test_the_same_seed_gives_the_same_episodes_and_a_new_seed_new_ones() -> None:
    with (
        envpool_group({"id": "CartPole-v1", "numEnvs": 2}, base_seed=3) as a,
        envpool_group({"id": "CartPole-v1", "numEnvs": 2}, base_seed=3) as b,
    ):
        first = a.reset().observation
        assert torch.equal(first, b.reset().observation)
        assert not torch.equal(first[0], first[1])  # env i is seeded seed + i
        assert not torch.equal(first, a.reset(seed=100).observation)
        assert torch.equal(a.reset(seed=3).observation, first)


def test_breakout_on_envpool_has_the_spaces_of_the_gymnasium_backend() -> None:
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    with envpool_group(breakout_env(2)) as pool:
        pool_ret = pool.reset()
    with EnvGroup.from_spec(EnvSpec.model_validate(breakout_env(1)), base_seed=0) as gym_group:
        gym_ret = gym_group.reset()
    assert pool.meta.observation_space == gym_group.meta.observation_space  # Box(0, 255, (4, 84, 84), uint8)
    assert pool.meta.action_space == gym_group.meta.action_space
    assert pool_ret.observation.dtype == gym_ret.observation.dtype == torch.uint8
    assert tuple(pool_ret.observation.shape[1:]) == tuple(gym_ret.observation.shape[1:]) == (4, 84, 84)


def test_a_lost_life_ends_the_policys_episode_and_the_user_is_shown_whole_games() -> None:
    # NOOP with fire-on-reset: every life lasts a few dozen steps, a Breakout game has 5 lives.
    with envpool_group(breakout_env(2)) as group:
        group.reset()
        lives_lost = np.zeros(2, dtype=int)
        games: list[int] = []
        while len(games) < 2:
            ret = group.step(torch.zeros(2, dtype=torch.long))
            lives_lost += ret.terminated.numpy()
            _, lengths = group.pop_finished_episodes()
            games += lengths
    assert lives_lost.tolist() == [5, 5]
    assert all(n % 4 == 0 and n > 5 * 4 for n in games)  # raw frames: agent steps x frameSkip 4


def test_the_returns_shown_are_the_raw_games_not_the_clipped_rewards_the_policy_sees() -> None:
    # Space Invaders scores 5-30 per alien; ClipReward sign gives the policy 1 for each.
    env = breakout_env(2) | {"id": "ALE/SpaceInvaders-v5"}
    env["wrappers"] = [*env["wrappers"], {"type": "TimeLimit", "maxEpisodeSteps": 200}]
    with envpool_group(env) as group:
        group.reset()
        actions = torch.Generator().manual_seed(0)
        rets = [group.step(torch.randint(0, 6, (2,), generator=actions)) for _ in range(200)]
        returns, lengths = group.pop_finished_episodes()
    clipped = torch.stack([r.reward for r in rets])
    assert set(clipped.unique().tolist()) <= {0.0, 1.0}
    assert rets[-1].truncated.all()
    assert lengths == [800, 800]  # 200 agent steps x frameSkip 4
    assert clipped.sum() > 0
    for i in range(2):  # the game's points, unclipped
        assert returns[i] >= 5 * clipped[:, i].sum().item()


def test_an_unknown_envpool_id_is_refused_naming_the_backend_and_the_id() -> None:
    with pytest.raises(EnvError, match=r"spec.env.id: got 'ALE/Breakout-v9'.*envpool backend"):
        envpool_group({"id": "ALE/Breakout-v9"})
    with pytest.raises(EnvError, match=r"spec\.env\.wrappers\[0\] \(ScaleReward\)"):
        envpool_group({"id": "CartPole-v1", "wrappers": [{"type": "ScaleReward", "scale": 2.0}]})


def test_the_breakout_reference_job_on_envpool_passes_every_preflight_check() -> None:
    checks = preflight(load_job(BREAKOUT, ["spec.env.vectorization=envpool"]))
    assert checks.ok, checks.refusal
    assert "spec.env.id: 'ALE/Breakout-v5' is envpool's 'Breakout-v5'" in checks.checked[-1]


def test_train_ranks_build_their_networks_from_an_id_only_envpool_has() -> None:
    from rlkube.launch.train import env_meta

    job = load_job(BREAKOUT, ["spec.env.vectorization=envpool", "spec.env.id=Breakout-v5"])
    meta = env_meta(job)  # gymnasium has no 'Breakout-v5': the spaces come from envpool
    assert meta.obs_shape == (4, 84, 84)
    assert meta.action_space.n == 4


def unknown_id_job(tmp_path: Path) -> Path:
    document = yaml.safe_load(BREAKOUT.read_text())
    document["spec"]["env"].update(id="ALE/Breakoutt-v5", vectorization="envpool")
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("command", [["validate"], ["run"]])
def test_an_unknown_envpool_id_is_refused_before_any_process_starts(
    tmp_path: Path, command: list[str]
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlkube.cli", *command, str(unknown_id_job(tmp_path))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "spec.env.id: got 'ALE/Breakoutt-v5'" in result.stderr
    assert "envpool backend (spec.env.vectorization: envpool)" in result.stderr
    assert "envpool has Breakout-v5" in result.stderr
    assert not (tmp_path / "runs").exists()  # no run directory: nothing was started
