"""Models are found without being listed, the registry names what is missing, roles set up as documented."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from rlkube.policy import POLICIES, BasePolicy, PolicyRole, Registry, import_modules
from rlkube.utils.registry import POLICIES as PORTED_POLICIES

from tests.policy.toy import ToyPolicy, policy_spec


def test_models_with_trainable_parameters_are_discovered() -> None:
    policy = ToyPolicy(policy_spec(), PolicyRole.TRAIN)
    policy.init_train(None, env_meta=None)
    assert [name for name, _ in policy.model_list] == ["net"]  # the frozen layer is left out
    assert isinstance(policy.optimizer, torch.optim.SGD)
    assert policy.optimizers() == {"optimizer": policy.optimizer}
    assert policy.net.training


def test_an_explicit_model_list_is_kept_and_checked() -> None:
    class Listed(ToyPolicy):
        def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
            super().construct_network(env_meta)
            self.model_list = [("frozen", self.frozen)]

    policy = Listed(policy_spec(), "train")
    policy.init_train(None)
    assert [name for name, _ in policy.model_list] == ["frozen"]

    class Broken(ToyPolicy):
        def construct_network(self, env_meta: Any, *args: Any, **kwargs: Any) -> None:
            self.model_list = [("weights", torch.zeros(2))]  # type: ignore[list-item]

    with pytest.raises(ValueError, match=r"'weights' is a Tensor, not an nn\.Module"):
        Broken(policy_spec(), "train").init_train(None)


def test_eval_models_are_in_eval_mode_without_gradients() -> None:
    policy = ToyPolicy(policy_spec(strategy="None"), "eval")
    policy.init_eval(env_meta=None)
    assert not policy.net.training
    assert not any(p.requires_grad for p in policy.net.parameters())


def test_fingerprint_names_module_and_parameter() -> None:
    policy = ToyPolicy(policy_spec(), "train")
    policy.init_train(None)
    with torch.no_grad():
        policy.net.weight.fill_(1.0)
    fingerprint = policy.get_param_fingerprint()
    assert set(fingerprint) == {"net.weight", "net.bias"}
    assert fingerprint["net.weight"] == pytest.approx(2**0.5)


def test_weights_round_trip_between_roles() -> None:
    train = ToyPolicy(policy_spec(), "train")
    train.init_train(None)
    evaluator = ToyPolicy(policy_spec(strategy="None"), "eval")
    evaluator.init_eval(env_meta=None)
    evaluator.load_state_dict(train.get_trainable_parameters())
    assert evaluator.get_param_fingerprint() == train.get_param_fingerprint()
    with pytest.raises(KeyError, match="no entry for model 'net'"):
        evaluator.load_state_dict({"other": {}})


def test_unknown_policy_names_the_registered_ones_and_suggests() -> None:
    registry: Registry[Any] = Registry("policy")
    registry.register("MyPPO")(ToyPolicy)
    with pytest.raises(KeyError, match=r"no policy named 'MyPP0'.*registered: MyPPO.*did you mean 'MyPPO'"):
        registry.get("MyPP0")


def test_a_name_cannot_be_taken_twice_by_different_classes() -> None:
    registry: Registry[Any] = Registry("policy")
    registry.register("A")(ToyPolicy)

    class Other(BasePolicy):
        pass

    with pytest.raises(KeyError, match="'A' is already registered"):
        registry.register("A")(Other)


def test_builtin_ppo_is_registered_and_the_porting_path_is_the_same_registry() -> None:
    assert "PPO" in POLICIES
    assert PORTED_POLICIES is POLICIES


def test_importing_a_missing_module_names_the_field() -> None:
    with pytest.raises(ImportError, match=r"cannot import 'no_such_policies'.*spec\.imports"):
        import_modules(["no_such_policies"])


def test_invalid_role_is_refused() -> None:
    with pytest.raises(ValueError, match="'critic' is not a valid PolicyRole"):
        ToyPolicy(policy_spec(), "critic")


def test_reset_training_state_rebuilds_models_and_optimizer() -> None:
    policy = ToyPolicy(policy_spec(), "train")
    policy.init_train(None)
    first = policy.net
    policy.reset_training_state(None, seed=3)
    assert policy.net is not first
    assert [name for name, _ in policy.model_list] == ["net"]
    assert isinstance(policy.optimizer, torch.optim.SGD)


def test_a_module_that_was_imported_but_registered_nothing_is_named() -> None:
    import_modules(["tests.policy.registers_nothing"])
    with pytest.raises(KeyError) as error:
        POLICIES.get("Forgotten", imported=["tests.policy.registers_nothing", "rlkube.policy.builtin.ppo"])
    message = error.value.args[0]
    assert "'tests.policy.registers_nothing' imported but registered no policy" in message
    assert '@POLICIES.register("Name")' in message
    assert "'rlkube.policy.builtin.ppo' registered 'PPO'" in message
    assert "list that module in spec.imports" not in message  # it was listed: that advice would mislead
