"""The built-in PPO on pixels: NatureCNN over HWC/CHW/stacked frames, uint8 kept uint8 in fragments."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rlkube.data.fragment import OBSERVATION
from rlkube.data.wire import encode
from rlkube.engine.rollout import RolloutWorker
from rlkube.envs.group import EnvGroup
from rlkube.policy.builtin.encoders import chw_shape, image_layout, to_chw
from rlkube.policy.builtin.ppo import PPO
from rlkube.spec import EnvSpec, PolicySpec, SpecError, TrainSpec

import tests.envs.wrapper_envs  # noqa: F401  (registers RlkubeFrames-v0)

LAYOUTS = [
    # (observation shape, resolved layout, the CNN's (C, H, W))
    ((84, 84), "chw", (1, 84, 84)),
    ((4, 84, 84), "chw", (4, 84, 84)),  # FrameStack over grey frames
    ((84, 84, 4), "hwc", (4, 84, 84)),
    ((210, 160, 3), "hwc", (3, 210, 160)),  # raw ALE RGB
    ((4, 84, 84, 3), "hwc", (12, 84, 84)),  # FrameStack over RGB frames
]


@pytest.mark.parametrize(("shape", "layout", "chw"), LAYOUTS)
def test_image_layouts_resolve_to_channels_first(shape: tuple[int, ...], layout: str, chw: tuple) -> None:
    assert image_layout(shape, "auto") == layout
    assert chw_shape(shape, image_layout(shape, "auto")) == chw


def test_hwc_frames_are_moved_channels_first_and_scaled_from_uint8() -> None:
    frame = torch.zeros(1, 2, 3, 3, dtype=torch.uint8)  # [B, H, W, C]
    frame[0, :, :, 1] = 255  # channel 1 is white
    out = to_chw(frame, (2, 3, 3), "hwc")
    assert tuple(out.shape) == (1, 3, 2, 3)
    assert out.dtype == torch.float32
    assert out[0, 1].eq(1.0).all()
    assert out[0, 0].eq(0.0).all()


def test_normalize_observation_with_the_cnn_is_refused_naming_the_field() -> None:
    spec = PolicySpec.model_validate(
        {"type": "PPO", "modelCfg": {"encoder": "nature_cnn", "normalizeObservation": True}}
    )
    with pytest.raises(SpecError, match=r"spec\.policy\.modelCfg"):
        PPO(spec, "train")


def pixel_group(wrappers: list[dict[str, Any]] | None = None) -> EnvGroup:
    env = EnvSpec.model_validate(
        {
            "id": "RlkubeFrames-v0",
            "numEnvs": 2,
            "imports": ["tests.envs.wrapper_envs"],
            "wrappers": wrappers or [],
        }
    )
    return EnvGroup.from_spec(env, base_seed=0)


@pytest.mark.parametrize("wrappers", [[], [{"type": "FrameStack", "stackSize": 2}]], ids=["hwc", "stacked"])
def test_ppo_with_nature_cnn_collects_uint8_fragments_and_trains_on_them(
    wrappers: list[dict[str, Any]],
) -> None:
    spec = PolicySpec.model_validate(
        {
            "type": "PPO",
            "modelCfg": {"encoder": "nature_cnn"},
            "algoCfg": {"updateEpochs": 1},
            "weightBuffer": {"strategy": "None"},
        }
    )
    with pixel_group(wrappers) as group:
        group.reset()
        train = PPO(spec, "train")
        train.init_train(TrainSpec.model_validate({"batchSize": 8, "stepsPerEpoch": 16}), env_meta=group.meta)
        evaluator = PPO(spec, "eval")
        evaluator.init_eval(env_meta=group.meta)
        evaluator.load_state_dict(train.get_trainable_parameters())
        fragment = RolloutWorker(group, evaluator).collect(8)
    observation = fragment.data[OBSERVATION]
    assert observation.dtype == torch.uint8
    assert tuple(observation.shape[2:]) == group.meta.observation_space.shape
    before = train.get_param_fingerprint()
    train.update_dataset(fragment.data)
    metrics = train.train()
    assert train.get_param_fingerprint() != before
    assert metrics["losses/value_loss"] >= 0.0


def test_uint8_frames_take_a_quarter_of_the_float32_bytes_on_the_wire() -> None:
    spec = PolicySpec.model_validate(
        {"type": "PPO", "modelCfg": {"encoder": "nature_cnn"}, "weightBuffer": {"strategy": "None"}}
    )
    with pixel_group() as group:
        group.reset()
        evaluator = PPO(spec, "eval")
        evaluator.init_eval(env_meta=group.meta)
        data = RolloutWorker(group, evaluator).collect(4).data
    _, raw = encode(data)
    as_float = data.clone()
    for key in ("observation", "next_observation"):
        as_float[key] = data[key].float()
    _, floats = encode(as_float)
    frame_bytes = 2 * data["observation"].numel()  # observation + next_observation, one byte each
    assert len(floats) - len(raw) == pytest.approx(3 * frame_bytes, rel=0.01)
