"""Every malformed job is refused with a message naming the field path, the value and the expectation."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from rlkube.jobfile import apply_overrides, load_job
from rlkube.spec import SpecError, parse_job

from tests.conftest import MINIMAL_JOB


def job_with(path: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(MINIMAL_JOB)
    node = document
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return document


MALFORMED = [
    # (field path set, value, text the error must contain)
    ("spec.train.maxEpochs", -3, "spec.train.maxEpochs: got -3, expected greater than or equal to 1"),
    ("spec.train.maxEpochs", "many", "spec.train.maxEpochs: got 'many', expected a valid integer"),
    ("spec.train.stepsPerEpoch", 0, "spec.train.stepsPerEpoch: got 0"),
    ("spec.engine", "turbo", "spec.engine: got 'turbo', expected 'sync', 'async', 'eval' or 'rsl'"),
    ("spec.policy.rolloutMode", "parallel", "spec.policy.rolloutMode: got 'parallel'"),
    ("spec.policy.weightBuffer.strategy", "Triple", "spec.policy.weightBuffer.strategy: got 'Triple'"),
    ("spec.policy.weightBuffer.chunkBytes", 10, "spec.policy.weightBuffer.chunkBytes: got 10"),
    ("spec.env.numEnvs", 0, "spec.env.numEnvs: got 0, expected greater than or equal to 1"),
    ("spec.env.id", "", "spec.env.id: got ''"),
    ("spec.env.vectorization", "threads", "spec.env.vectorization: got 'threads'"),
    ("spec.trainer.replicas", 0, "spec.trainer.replicas: got 0"),
    ("spec.trainer.backend", "mpi", "spec.trainer.backend: got 'mpi', expected 'auto', 'nccl' or 'gloo'"),
    ("spec.evaluator.replicas", -1, "spec.evaluator.replicas: got -1"),
    ("spec.runPolicy.cleanPodPolicy", "Some", "spec.runPolicy.cleanPodPolicy: got 'Some'"),
    ("spec.runPolicy.backoffLimit", -1, "spec.runPolicy.backoffLimit: got -1"),
    ("spec.log.level", "loud", "spec.log.level: got 'loud'"),
    ("spec.buffer.type", "ring", "spec.buffer.type: got 'ring', expected 'rollout' or 'replay'"),
    ("metadata.name", "Cart_Pole", "metadata.name: got 'Cart_Pole'"),
    ("metadata.name", "x" * 41, "metadata.name: got 'xxxx"),
    ("spec.train.fragmentLength", 0, "spec.train.fragmentLength: got 0"),
    ("spec.policy.modelCfg", [1, 2], "spec.policy.modelCfg: got [1, 2], expected a valid dictionary"),
    ("spec.trainer.resources.limits", "lots", "spec.trainer.resources.limits: got 'lots'"),
]


@pytest.mark.parametrize(
    ("path", "value", "expected"), MALFORMED, ids=[f"{p}={v!r}"[:60] for p, v, _ in MALFORMED]
)
def test_malformed_field_is_named_with_value_and_expectation(path: str, value: Any, expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(job_with(path, value))
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_unknown_field_is_refused_and_snake_case_gets_a_hint() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(job_with("spec.train.max_epochs", 3))
    assert caught.value.problems == ["spec.train.max_epochs: unknown field (did you mean 'maxEpochs'?)"]


def test_missing_env_section_is_named() -> None:
    document = copy.deepcopy(MINIMAL_JOB)
    del document["spec"]["env"]
    with pytest.raises(SpecError) as caught:
        parse_job(document)
    assert caught.value.problems == ["spec.env: required field is missing"]


def test_wrong_kind_and_api_version_are_named() -> None:
    document = copy.deepcopy(MINIMAL_JOB)
    document["kind"] = "Job"
    document["apiVersion"] = "batch/v1"
    with pytest.raises(SpecError) as caught:
        parse_job(document)
    text = "\n".join(caught.value.problems)
    assert "kind: got 'Job', expected 'RLJob'" in text
    assert "apiVersion: got 'batch/v1', expected 'rlkube.io/v1alpha1'" in text


def test_every_problem_is_reported_at_once() -> None:
    document = job_with("spec.train.maxEpochs", 0)
    document["spec"]["env"]["numEnvs"] = 0
    with pytest.raises(SpecError) as caught:
        parse_job(document)
    assert len(caught.value.problems) == 2


def test_batch_size_larger_than_an_epoch_is_a_cross_field_error() -> None:
    document = job_with("spec.train", {"batchSize": 4096, "stepsPerEpoch": 1024})
    with pytest.raises(SpecError) as caught:
        parse_job(document)
    assert caught.value.problems == [
        "spec.train.batchSize: got 4096, expected at most spec.train.stepsPerEpoch "
        "(a replay buffer may sample more)"
    ]


def test_nccl_without_gpus_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(job_with("spec.trainer", {"backend": "nccl"}))
    assert caught.value.problems[0].startswith("spec.trainer.backend: got 'nccl'")


def test_nccl_with_gpus_is_accepted() -> None:
    job = parse_job(
        job_with("spec.trainer", {"backend": "nccl", "resources": {"limits": {"nvidia.com/gpu": 1}}})
    )
    assert job.spec.resolved_backend().value == "nccl"


def test_auto_backend_is_gloo_without_gpus() -> None:
    assert parse_job(copy.deepcopy(MINIMAL_JOB)).spec.resolved_backend().value == "gloo"


def test_eval_engine_needs_a_checkpoint_path() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(job_with("spec.engine", "eval"))
    assert caught.value.problems == [
        "spec.checkpoint.path: got None, expected a checkpoint file: engine 'eval' evaluates a saved policy"
    ]


@pytest.mark.parametrize("name", ["RANK", "MASTER_ADDR", "RLKUBE_ROLE", "PET_NNODES"])
def test_user_env_colliding_with_the_contract_is_refused(name: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(job_with("spec.evaluator", {"env": [{"name": name, "value": "1"}]}))
    assert caught.value.problems[0].startswith("spec.evaluator.env: got")
    assert name in caught.value.problems[0]


def test_a_manifest_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(["not", "a", "job"])
    assert "expected a mapping" in caught.value.problems[0]


def test_set_override_changes_a_nested_field() -> None:
    document = apply_overrides(
        copy.deepcopy(MINIMAL_JOB), ["spec.train.maxEpochs=3", "spec.env.kwargs={a: 1}"]
    )
    job = parse_job(document)
    assert job.spec.train.max_epochs == 3
    assert job.spec.env.kwargs.a == 1


def test_set_override_without_equals_sign_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        apply_overrides(copy.deepcopy(MINIMAL_JOB), ["spec.train.maxEpochs"])
    assert "expected PATH=VALUE" in caught.value.problems[0]


def test_set_override_value_is_validated_like_the_file(tmp_path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "apiVersion: rlkube.io/v1alpha1\nkind: RLJob\nmetadata: {name: a}\nspec: {env: {id: X-v0}}\n"
    )
    with pytest.raises(SpecError) as caught:
        load_job(job_file, ["spec.train.maxEpochs=zero"])
    assert caught.value.problems[0].startswith("spec.train.maxEpochs: got 'zero'")


def test_yaml_syntax_error_names_file_and_line(tmp_path) -> None:
    job_file = tmp_path / "broken.yaml"
    job_file.write_text("spec:\n  env: [unclosed\n")
    with pytest.raises(SpecError) as caught:
        load_job(job_file)
    assert str(job_file) in caught.value.problems[0]
    assert "line" in caught.value.problems[0]


def test_missing_file_is_named(tmp_path) -> None:
    with pytest.raises(SpecError) as caught:
        load_job(tmp_path / "nope.yaml")
    assert caught.value.problems == [f"{tmp_path / 'nope.yaml'}: no such file"]


def test_smallest_job_gets_sensible_defaults() -> None:
    spec = parse_job(copy.deepcopy(MINIMAL_JOB)).spec
    assert spec.policy.type == "PPO"
    assert spec.policy.weight_buffer.buffer_strategy == "Shared"
    assert spec.fragments_per_epoch() == 2048 // (8 * 64)
