"""Every RLightning module path a policy imports exists under rlkube with the names it imports."""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

import numpy as np
import pytest
import torch
from rlkube.models.vision import NatureCNN
from rlkube.utils.logger import log_metric
from rlkube.utils.profiler import profiler

#: RLightning module -> the names its policies and examples import from it (docs/porting-from-rlightning.md).
MODULES: dict[str, tuple[str, ...]] = {
    "models.vision": ("NatureCNN",),
    "models.mlp": (),
    "models.toy_model": ("NatureCNN",),
    "env": ("EnvMeta", "EnvGroup"),
    "utils.utils": ("to_device",),
    "utils.config": ("Config", "PolicyConfig", "TrainConfig", "MainConfig", "BufferConfig"),
    "utils.distributed.collective": ("all_reduce_dict",),
    "utils.distributed.group_initializer": ("ParallelMode",),
    "utils.distributed.comm_context": ("CommContext",),
    "policy": ("BasePolicy",),
    "policy.base_policy": ("BasePolicy", "PolicyRole"),
    "policy.utils.losses": (
        "compute_ppo_actor_critic_loss",
        "compute_ppo_actor_loss",
        "compute_ppo_critic_loss",
    ),
    "policy.utils.router": (
        "AsyncRouter",
        "SimpleRouter",
        "NodeAffinityRouter",
        "SyncRouter",
        "SyncSimpleRouter",
        "SyncNodeAffinityRouter",
        "create_router",
    ),
    "policy.utils.utils": ("huber_loss", "masked_mean", "masked_mean_ratio", "expand_to_target_dim"),
    "types": ("EnvRet", "PolicyResponse", "EnvMeta", "Processed_EnvRet_fields"),
    "utils.logger": ("get_logger", "log_metric", "setup_logger"),
    "utils.profiler": ("profiler",),
    "utils.profiler.profiler": ("timer_wrap", "timer", "record_timing", "log_gpu_memory_usage"),
    "utils.registry": ("POLICIES", "BUFFERS", "WEIGHTS", "ENVS", "ENGINE", "load_modules_from_config"),
    "utils.registry.registry": ("Registry",),
    "buffer.utils.preprocessors": (
        "Preprocessor",
        "NonPreprocessor",
        "BoxFlattenPreprocessor",
        "DiscretePreprocessor",
        "get_preprocessor_cls",
        "default_obs_preprocessor",
        "default_reward_preprocessor",
    ),
    "buffer.utils.utils": ("default_compute_gae", "default_gae_no_loop"),
}


@pytest.mark.parametrize("path", sorted(MODULES))
def test_the_rlightning_module_path_imports_under_rlkube_with_its_names(path: str) -> None:
    module = importlib.import_module(f"rlkube.{path}")
    missing = [name for name in MODULES[path] if not hasattr(module, name)]
    assert not missing, f"rlkube.{path} lacks {missing}"


def test_the_porting_guide_lists_every_module_path_and_its_counterpart() -> None:
    from tests.porting.jobs import ROOT

    guide = (ROOT / "docs" / "porting-from-rlightning.md").read_text()
    for path in MODULES:
        assert f"rlightning.{path}`" in guide, path
        assert f"rlkube.{path}`" in guide, path
    assert "rlkube.policy.utils.vtrace`" in guide


# ---------------------------------------------------------------------------- NatureCNN


def test_nature_cnn_keeps_rlightning_s_constructor_and_feature_width() -> None:
    encoder = NatureCNN(image_format="HWC")
    assert encoder.out_feature_dim == 256
    assert encoder.standard_input_size == (84, 84)
    assert encoder.in_channels == 3


def test_nature_cnn_sees_the_same_image_in_either_format_and_any_size() -> None:
    torch.manual_seed(0)
    hwc = NatureCNN(image_format="HWC")
    chw = NatureCNN(image_format="CHW")
    chw.load_state_dict(hwc.state_dict())
    frames = torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8)
    from_hwc = hwc(frames)
    from_chw = chw(frames.permute(0, 3, 1, 2))
    assert from_hwc.shape == (2, 256)
    torch.testing.assert_close(from_hwc, from_chw)


def test_nature_cnn_takes_numpy_and_scales_pixel_values_into_the_unit_range() -> None:
    encoder = NatureCNN(image_format="HWC")
    frames = np.random.default_rng(0).integers(0, 256, (1, 84, 84, 3)).astype(np.float32)
    torch.testing.assert_close(encoder(frames), encoder(torch.from_numpy(frames / 255.0)))


def test_nature_cnn_names_the_format_and_shape_it_cannot_take() -> None:
    with pytest.raises(ValueError, match=r"HWC.*\(84, 84, 3\)"):
        NatureCNN(image_format="HWC")(torch.zeros(84, 84, 3))
    with pytest.raises(ValueError, match="image_format"):
        NatureCNN(image_format="NHWC")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- profiler, logger


class Timed:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def log_metric(self, key: str, value: float) -> None:
        self.metrics[key] = value

    @profiler.timer_wrap(level="info")
    def train(self) -> str:
        return "trained"

    @profiler.timer_wrap(name="step", level="debug", log_to_metric=True)
    def rollout_step(self) -> int:
        return 1

    @profiler.timer_wrap(level="debug")
    async def serve(self) -> int:
        await asyncio.sleep(0)
        return 2

    @profiler.timer_wrap(enable=False)
    def untimed(self) -> None:
        return None


def test_timer_wrap_counts_calls_in_timing_raw_and_logs_the_seconds(caplog: Any) -> None:
    timed = Timed()
    with caplog.at_level(logging.INFO, logger="rlkube.utils.profiler"):
        assert timed.train() == "trained"
        assert timed.train() == "trained"
    assert timed.timing_raw["train"]["count"] == 2  # type: ignore[attr-defined]
    assert timed.timing_raw["train"]["avg"] == pytest.approx(timed.timing_raw["train"]["total"] / 2)  # type: ignore[attr-defined]
    assert "time_profile/train" in caplog.text


def test_timer_wrap_to_metric_reaches_the_policy_s_log_metric_and_times_coroutines() -> None:
    timed = Timed()
    assert timed.rollout_step() == 1
    assert set(timed.metrics) == {"time_profile/step"}
    assert asyncio.run(timed.serve()) == 2
    timed.untimed()
    assert set(timed.timing_raw) == {"step", "serve"}  # type: ignore[attr-defined]


def test_profiler_timer_and_record_timing_add_to_a_timing_dict() -> None:
    timing: dict[str, dict[str, Any]] = {}
    with profiler.timer("block", timing):
        pass
    profiler.record_timing("block", 0.5, timing)
    profiler.record_timing("ignored", "not a number", timing)  # type: ignore[arg-type]
    assert timing["block"]["count"] == 2
    assert timing["block"]["total"] >= 0.5
    assert "ignored" not in timing


def test_log_metric_writes_one_line_with_prefix_and_step(caplog: Any) -> None:
    with caplog.at_level(logging.INFO):
        log_metric({"loss": torch.tensor(0.25), "lr": 0.001}, step=3, prefix="Train")
    assert "[Train] loss=0.25, lr=0.001 (step 3)" in caplog.text
    with pytest.raises(TypeError, match="dict"):
        log_metric([("loss", 1.0)])  # type: ignore[arg-type]


def test_load_modules_from_config_imports_what_imports_lists() -> None:
    from rlkube.utils.registry import load_modules_from_config

    load_modules_from_config({"imports": ["tests.envs.counter_env"]})
    load_modules_from_config({})
    with pytest.raises(ImportError, match="no_such_module"):
        load_modules_from_config({"imports": ["no_such_module"]})


# ---------------------------------------------------------------------------- utils, toy model


def test_to_device_moves_tensors_inside_containers_and_turns_arrays_into_tensors() -> None:
    from rlkube.utils.utils import to_device
    from tensordict import TensorDict

    moved = to_device(
        {"a": [torch.zeros(1), np.ones(2)], "b": (TensorDict({"x": torch.ones(1)}, batch_size=[1]), "text")},
        "cpu",
    )
    assert isinstance(moved["a"][1], torch.Tensor)
    assert moved["b"][1] == "text"
    assert isinstance(moved["b"], tuple)


def test_all_reduce_dict_on_one_rank_returns_the_values_as_floats() -> None:
    from rlkube.utils.distributed.collective import all_reduce_dict
    from rlkube.utils.distributed.comm_context import CommContext
    from rlkube.utils.distributed.group_initializer import ParallelMode

    assert all_reduce_dict({"b": torch.tensor(2.0), "a": 1}, ParallelMode.TRAIN_DATA_PARALLEL) == {
        "a": 1.0,
        "b": 2.0,
    }
    assert CommContext().get_group(ParallelMode.TRAIN_DATA_PARALLEL) is None
    assert CommContext().get_world_size() == 1


def test_toy_nature_cnn_concatenates_image_and_state_features() -> None:
    from rlkube.models.toy_model import NatureCNN as ToyCNN

    sample = {"rgb": torch.zeros(2, 64, 64, 3, dtype=torch.uint8), "state": torch.zeros(2, 5)}
    encoder = ToyCNN(sample)
    assert encoder.out_features == 512
    assert encoder(sample).shape == (2, 512)
    assert ToyCNN({"rgb": sample["rgb"]})(sample).shape == (2, 256)
