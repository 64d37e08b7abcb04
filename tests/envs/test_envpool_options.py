"""``spec.env`` on the envpool backend: each wrapper maps to envpool's option or is refused by name.

Pure: envpool's option names are given, no envpool is imported (``test_envpool_backend`` runs it).
"""

from __future__ import annotations

from typing import Any

import pytest
from rlkube.envs.envpool_options import ALE_V5_DEFAULTS, envpool_options, unknown_id_message
from rlkube.spec import EnvSpec

#: envpool 1.2's option names of an Atari task and of CartPole-v1.
ATARI_KEYS = [
    *("num_envs", "batch_size", "num_threads", "max_num_players", "thread_affinity_offset", "base_path"),
    *("seed", "env_seed", "gym_reset_return_info", "max_episode_steps", "stack_num", "frame_skip"),
    *("noop_max", "zero_discount_on_life_loss", "episodic_life", "reward_clip", "use_fire_reset"),
    *("img_height", "img_width", "task", "mode", "difficulty", "full_action_space"),
    *("repeat_action_probability", "use_inter_area_resize", "gray_scale"),
]
CARTPOLE_KEYS = [
    *("num_envs", "batch_size", "num_threads", "max_num_players", "thread_affinity_offset", "base_path"),
    *("seed", "env_seed", "gym_reset_return_info", "max_episode_steps", "reward_threshold"),
]

BREAKOUT_WRAPPERS: list[dict[str, Any]] = [
    {"type": "AtariPreprocessing", "noopMax": 30, "frameSkip": 4, "screenSize": 84},
    {"type": "EpisodicLife"},
    {"type": "FireReset"},
    {"type": "ClipReward", "sign": True},
    {"type": "FrameStack", "stackSize": 4},
]
FRAMESKIP_1 = {"frameskip": 1, "repeat_action_probability": 0.0}


def options(env_id: str, wrappers: list[dict[str, Any]], kwargs: dict[str, Any] | None = None) -> Any:
    spec = EnvSpec.model_validate(
        {"id": env_id, "vectorization": "envpool", "wrappers": wrappers, "kwargs": kwargs or {}}
    )
    keys = ATARI_KEYS if "Breakout" in env_id or "Pong" in env_id else CARTPOLE_KEYS
    return envpool_options(spec.id, kwargs=dict(spec.kwargs), wrappers=spec.wrappers, config_keys=keys)


def test_cleanrls_atari_wrappers_become_envpools_native_options() -> None:
    made = options("ALE/Breakout-v5", BREAKOUT_WRAPPERS, FRAMESKIP_1)
    assert made.task_id == "Breakout-v5"
    assert made.options == {
        "noop_max": 30,
        "frame_skip": 4,
        "img_height": 84,
        "img_width": 84,
        "gray_scale": True,
        "episodic_life": True,
        "use_fire_reset": True,
        "reward_clip": True,
        "stack_num": 4,
        "max_episode_steps": 27_000,  # ALE v5's 108,000 frames / frameSkip 4
        "repeat_action_probability": 0.0,
        "full_action_space": False,
    }
    assert made.frames_per_step == 4
    assert not made.drop_stack_axis


def test_atari_options_no_wrapper_asks_for_are_off_and_ale_v5_sticky_actions_apply() -> None:
    made = options("Pong-v5", BREAKOUT_WRAPPERS[:1], {"frameskip": 1})
    assert made.options["stack_num"] == 1
    assert made.drop_stack_axis  # (84, 84) frames, as gymnasium's AtariPreprocessing gives
    assert not made.options["episodic_life"]
    assert not made.options["use_fire_reset"]
    assert not made.options["reward_clip"]
    assert made.options["repeat_action_probability"] == ALE_V5_DEFAULTS["repeat_action_probability"]


def test_a_time_limit_after_preprocessing_counts_agent_steps() -> None:
    made = options(
        "ALE/Breakout-v5", [*BREAKOUT_WRAPPERS, {"type": "TimeLimit", "maxEpisodeSteps": 500}], FRAMESKIP_1
    )
    assert made.options["max_episode_steps"] == 500


def test_a_classic_env_takes_its_gymnasium_kwargs_and_a_time_limit() -> None:
    made = options("CartPole-v1", [{"type": "ClipAction"}, {"type": "TimeLimit", "maxEpisodeSteps": 50}])
    assert made.options == {"max_episode_steps": 50}
    assert options("CartPole-v1", [], {"max_episode_steps": 7}).options == {"max_episode_steps": 7}


REFUSED: list[tuple[str, list[dict[str, Any]], dict[str, Any], str]] = [
    (
        "CartPole-v1",
        [{"type": "NormalizeReward"}],
        {},
        "spec.env.wrappers[0] (NormalizeReward): the envpool backend has no native option",
    ),
    ("CartPole-v1", [{"type": "ScaleReward", "scale": 2.0}], {}, "spec.env.wrappers[0] (ScaleReward)"),
    ("CartPole-v1", [{"type": "RescaleAction"}], {}, "spec.env.wrappers[0] (RescaleAction)"),
    ("CartPole-v1", [{"type": "Custom", "name": "mine"}], {}, "spec.env.wrappers[0] (Custom)"),
    (
        "CartPole-v1",
        [{"type": "FrameStack"}],
        {},
        "spec.env.wrappers[0] (FrameStack): the envpool backend does it for Atari envs only",
    ),
    ("Breakout-v5", [], FRAMESKIP_1, "spec.env.wrappers[0] must be an AtariPreprocessing wrapper"),
    (
        "Breakout-v5",
        [{"type": "EpisodicLife"}, BREAKOUT_WRAPPERS[0]],
        FRAMESKIP_1,
        "spec.env.wrappers[0] (EpisodicLife): the envpool backend applies it to preprocessed frames",
    ),
    (
        "Breakout-v5",
        [{**BREAKOUT_WRAPPERS[0], "grayscaleObs": False}],
        FRAMESKIP_1,
        "spec.env.wrappers[0] (AtariPreprocessing): the envpool backend gives RGB frames",
    ),
    (
        "Breakout-v5",
        [{**BREAKOUT_WRAPPERS[0], "terminalOnLifeLoss": True}],
        FRAMESKIP_1,
        "use an EpisodicLife wrapper",
    ),
    (
        "Breakout-v5",
        [BREAKOUT_WRAPPERS[0], {"type": "ClipReward"}],
        FRAMESKIP_1,
        "spec.env.wrappers[1] (ClipReward): the envpool backend clips rewards by their sign only",
    ),
    (
        "Breakout-v5",
        [BREAKOUT_WRAPPERS[0], {"type": "FrameStack"}, {"type": "FrameStack"}],
        FRAMESKIP_1,
        "spec.env.wrappers[2] (FrameStack): the envpool backend applies each wrapper at most once",
    ),
    ("Breakout-v5", BREAKOUT_WRAPPERS, {}, "spec.env.kwargs.frameskip: got 4 (ALE v5's default is 4)"),
    (
        "Breakout-v5",
        BREAKOUT_WRAPPERS,
        {**FRAMESKIP_1, "stack_num": 2},
        "spec.env.kwargs.stack_num: spec.env.wrappers set it",
    ),
    ("CartPole-v1", [], {"num_envs": 4}, "spec.env.kwargs.num_envs: the group sets it"),
    (
        "CartPole-v1",
        [],
        {"sutton_barto_reward": True},
        "spec.env.kwargs.sutton_barto_reward: envpool's CartPole-v1 has no such option",
    ),
]


@pytest.mark.parametrize(("env_id", "wrappers", "kwargs", "message"), REFUSED)
def test_what_envpool_cannot_apply_is_refused_naming_the_field(
    env_id: str, wrappers: list[dict[str, Any]], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=r"envpool|spec\.env\.kwargs") as refused:
        options(env_id, wrappers, kwargs)
    assert message in str(refused.value)


def test_an_unknown_id_is_named_with_the_backend_and_the_nearest_ids() -> None:
    message = unknown_id_message("ALE/Breakout-v9", ["Breakout-v5", "Pong-v5", "CartPole-v1"])
    assert "spec.env.id: got 'ALE/Breakout-v9'" in message
    assert "spec.env.vectorization: envpool" in message
    assert "envpool has Breakout-v5" in message


def test_the_ale_v5_defaults_are_ale_pys_registration() -> None:
    pytest.importorskip("ale_py")
    import gymnasium as gym

    registered = gym.spec("ALE/Breakout-v5").kwargs
    assert {key: registered[key] for key in ALE_V5_DEFAULTS} == dict(ALE_V5_DEFAULTS)
