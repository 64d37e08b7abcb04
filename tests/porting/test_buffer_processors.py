"""spec.buffer.processors: advantages, returns and transitions as RLightning's rollout buffer gives them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from rlkube.buffer.processors import ProcessorError, apply_processors, value_fn_of
from rlkube.engine.rollout import takes_env_ret_and_response
from rlkube.spec import FlattenProcessor, GAEProcessor, SpecError, parse_job
from tensordict import TensorDict

from tests.conftest import MINIMAL_JOB


def two_rows() -> TensorDict:
    """Row 0: one episode running through the fragment. Row 1: terminated at t=0, truncated at t=1."""
    next_observation = torch.tensor([[0.0, 0.0, 2.0], [0.0, 3.0, 4.0]]).unsqueeze(-1)
    return TensorDict(
        {
            "observation": torch.zeros(2, 3, 1),
            "next_observation": next_observation,
            "reward": torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]),
            "terminated": torch.tensor([[False, False, False], [True, False, False]]),
            "truncated": torch.tensor([[False, False, False], [False, True, False]]),
            "value": torch.ones(2, 3, 1),  # a [1] value per env, as a per-env response stores it
            "action": torch.zeros(2, 3, dtype=torch.long),
        },
        batch_size=[2, 3],
    )


class Critic:
    """get_value: V(observation) is the observation's number; remembers what it was asked."""

    device = "cpu"

    def __init__(self) -> None:
        self.asked: list[torch.Tensor] = []

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        self.asked.append(obs.clone())
        return obs[:, 0]


GAE = GAEProcessor.model_validate({"type": "GAE", "gamma": 0.5, "gaeLambda": 1.0, "normalize": False})


def test_gae_bootstraps_cut_rows_from_get_value_and_stops_at_terminations() -> None:
    critic = Critic()
    out = apply_processors([GAE], two_rows(), value_fn=value_fn_of(critic))
    # row 0: deltas .5, -.5, 0 (+ .5 * V(next)=2 - 1); row 1: 0 (terminated), 1.5 (.5 * 3), 2 (.5 * 4)
    expected = torch.tensor([[0.25, -0.5, 0.0], [0.0, 1.5, 2.0]])
    torch.testing.assert_close(out["advantages"], expected)
    torch.testing.assert_close(out["returns"], expected + 1.0)
    assert [float(v) for v in torch.cat(critic.asked).flatten()] == [2.0, 3.0, 4.0]
    assert "advantages" not in two_rows()


def test_gae_without_bootstrap_treats_every_cut_as_an_episode_end_and_needs_no_get_value() -> None:
    settings = GAE.model_copy(update={"bootstrap": "none"})
    out = apply_processors([settings], two_rows(), value_fn=None)
    torch.testing.assert_close(out["advantages"], torch.tensor([[0.0, -1.0, -1.0], [0.0, 0.0, 0.0]]))


def test_gae_normalizes_advantages_but_not_returns() -> None:
    settings = GAE.model_copy(update={"normalize": True})
    out = apply_processors([settings], two_rows(), value_fn=value_fn_of(Critic()))
    raw = torch.tensor([[0.25, -0.5, 0.0], [0.0, 1.5, 2.0]])
    torch.testing.assert_close(out["advantages"], (raw - raw.mean()) / (raw.std() + 1e-8))
    torch.testing.assert_close(out["returns"], raw + 1.0)


def test_flatten_turns_rows_of_steps_into_transitions_in_row_order() -> None:
    out = apply_processors(
        [GAE, FlattenProcessor(type="Flatten")], two_rows(), value_fn=value_fn_of(Critic())
    )
    assert out.batch_size == torch.Size([6])
    assert out["next_observation"].shape == (6, 1)
    torch.testing.assert_close(out["advantages"], torch.tensor([0.25, -0.5, 0.0, 0.0, 1.5, 2.0]))


def test_gae_errors_name_the_processor_and_the_fix() -> None:
    data = two_rows()
    with pytest.raises(ProcessorError, match=r"processors\[0\] \(GAE\).*get_value.*bootstrap: none"):
        apply_processors([GAE], data, value_fn=None)
    with pytest.raises(ProcessorError, match=r"data\['critic'\].*keys: action, next_observation"):
        apply_processors([GAE.model_copy(update={"value_key": "critic"})], data, value_fn=None)
    with pytest.raises(ProcessorError, match="not one value per observation"):
        apply_processors([GAE], data, value_fn=lambda obs: torch.zeros(1))
    with pytest.raises(ProcessorError, match=r"needs \[rows, T\]"):
        apply_processors([GAE], data.reshape(-1), value_fn=None)


def job_with_buffer(buffer: dict[str, Any]) -> dict[str, Any]:
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"]["buffer"] = buffer
    return document


def test_the_spec_reads_processors_in_camel_case_with_rlightning_s_defaults() -> None:
    job = parse_job(job_with_buffer({"processors": [{"type": "GAE", "gaeLambda": 0.9}, {"type": "Flatten"}]}))
    gae, flatten = job.spec.buffer.processors
    assert isinstance(gae, GAEProcessor)
    assert isinstance(flatten, FlattenProcessor)
    assert (gae.gamma, gae.gae_lambda, gae.normalize, gae.value_key, gae.bootstrap) == (
        0.99,
        0.9,
        True,
        "value",
        "policy",
    )


@pytest.mark.parametrize(
    ("buffer", "message"),
    [
        ({"processors": [{"type": "Flatten"}, {"type": "GAE"}]}, "processors[0] (Flatten) comes first"),
        ({"type": "replay", "processors": [{"type": "GAE"}]}, "buffer.type replay"),
        ({"processors": [{"type": "Normalise"}]}, "spec.buffer.processors[0]"),
        ({"processors": [{"type": "GAE", "lambda": 0.9}]}, "spec.buffer.processors[0].lambda: unknown field"),
    ],
)
def test_the_spec_refuses_processors_that_cannot_run(buffer: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(job_with_buffer(buffer))
    assert message in str(caught.value)


def test_train_config_reads_as_attributes_with_keys_as_written() -> None:
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"]["policy"] = {"trainConfig": {"ppo_epochs": 4, "minibatch_size": 64}}
    config = parse_job(document).spec.policy
    assert config.train_config.ppo_epochs == 4
    assert config.train_config.minibatch_size == 64
    with pytest.raises(AttributeError, match="clip_ratio"):
        config.train_config.clip_ratio  # noqa: B018


def test_a_postprocess_that_cannot_take_env_ret_and_response_is_not_a_per_step_hook() -> None:
    class Policies:
        def rlightning_shipped(self, data: Any) -> Any: ...
        def guide(self, env_ret: Any = None, policy_resp: Any = None) -> Any: ...
        def open_ended(self, *args: Any) -> Any: ...

    policies = Policies()
    assert not takes_env_ret_and_response(policies.rlightning_shipped)
    assert takes_env_ret_and_response(policies.guide)
    assert takes_env_ret_and_response(policies.open_ended)


def test_a_job_whose_gae_bootstraps_from_a_policy_without_get_value_is_refused_before_it_runs() -> None:
    from rlkube.contract import FailureReason
    from rlkube.launch.preflight import preflight

    refused = preflight(parse_job(job_with_buffer({"processors": [{"type": "GAE"}]})))  # the built-in PPO
    assert refused.refusal is not None
    assert refused.refusal.reason is FailureReason.BUFFER_NOT_SUPPORTED
    assert (
        "spec.buffer.processors[0] (GAE): bootstrap 'policy' needs PPO.get_value" in refused.refusal.message
    )
    unbootstrapped = job_with_buffer(
        {"processors": [{"type": "GAE", "bootstrap": "none"}, {"type": "Flatten"}]}
    )
    accepted = preflight(parse_job(unbootstrapped))
    assert accepted.ok, accepted.refusal
    assert "spec.buffer.processors: GAE, Flatten can run for PPO" in accepted.checked


def test_get_value_is_asked_once_per_share_even_when_every_row_ended_terminated() -> None:
    data = two_rows()
    data["terminated"][:, -1] = True
    critic = Critic()
    out = apply_processors([GAE], data, value_fn=value_fn_of(critic))
    # one call on every train rank keeps DDP's per-forward collectives in step; the values are unused
    assert len(critic.asked) == 1
    torch.testing.assert_close(out["advantages"][0], torch.tensor([0.0, -1.0, -1.0]))  # no bootstrap at t=2


def test_rlightning_policy_keys_without_a_field_read_as_attributes_through_extra() -> None:
    import pickle

    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"]["policy"] = {"extra": {"ppo_cfg": {"clip_ratio": 0.2}, "length_params": [1, 2]}}
    config = parse_job(document).spec.policy
    assert config.ppo_cfg.clip_ratio == 0.2  # type: ignore[attr-defined]
    assert config.length_params == [1, 2]  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(config)).ppo_cfg == {"clip_ratio": 0.2}
    assert copy.deepcopy(config).ppo_cfg.clip_ratio == 0.2
    with pytest.raises(AttributeError, match=r"spec.policy.extra \(its keys: length_params, ppo_cfg\)"):
        config.sampling_params  # type: ignore[attr-defined]  # noqa: B018
    for taken in ("model_cfg", "modelCfg"):
        document["spec"]["policy"] = {"extra": {taken: {}}}
        with pytest.raises(SpecError, match=f"{taken} cannot be an extra key"):
            parse_job(document)
