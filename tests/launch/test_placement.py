"""NCCL ranks beyond a machine's GPUs are refused before anything starts, saying what to change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rlkube.cli import main
from rlkube.contract import FailureReason
from rlkube.launch import preflight as preflight_module
from rlkube.launch.devices import bind_train_device
from rlkube.launch.preflight import preflight
from rlkube.placement import TrainPlacement, placement_problems, visible_gpu_for_rank
from rlkube.spec import Backend, RLJob

from tests.engine.jobs import tiny_document


def job_with(**trainer: Any) -> dict[str, Any]:
    document = tiny_document()
    document["spec"]["trainer"] = {**document["spec"].get("trainer", {}), **trainer}
    return document


def spec_of(document: dict[str, Any]) -> Any:
    return RLJob.model_validate(document).spec


@pytest.mark.parametrize(
    ("trainer", "gpus", "refused"),
    [
        ({"replicas": 2}, 1, True),  # auto -> nccl with CUDA present: the one-GPU machine
        ({"replicas": 1}, 1, False),
        ({"replicas": 2}, 2, False),
        ({"replicas": 2, "backend": "gloo"}, 1, False),  # gloo ranks may share a GPU
        ({"replicas": 4}, 0, False),  # no CUDA: auto is gloo
    ],
    ids=["2-ranks-1-gpu", "1-rank-1-gpu", "2-ranks-2-gpus", "gloo-shares", "cpu-only"],
)
def test_local_placement_refuses_only_nccl_ranks_beyond_the_gpus(
    trainer: dict[str, Any], gpus: int, refused: bool
) -> None:
    problems = placement_problems(TrainPlacement.local(spec_of(job_with(**trainer)), gpus=gpus))
    assert bool(problems) is refused


def test_the_refusal_names_the_field_the_cause_and_both_fixes() -> None:
    [problem] = placement_problems(TrainPlacement.local(spec_of(job_with(replicas=2)), gpus=1))
    assert problem.startswith("spec.trainer.replicas: 2 train ranks on this machine use NCCL")
    assert "spec.trainer.backend is auto and CUDA is present" in problem
    assert "only 1 GPU is visible" in problem
    assert "--set spec.trainer.replicas=1" in problem
    assert "--set spec.trainer.backend=gloo" in problem


def test_a_train_pod_told_nccl_without_a_visible_gpu_is_refused_naming_gloo() -> None:
    placement = TrainPlacement(Backend.NCCL, ranks_per_node=1, gpus_per_node=0, where="in this train pod")
    [problem] = placement_problems(placement)
    assert "no GPU is visible" in problem
    assert "set spec.trainer.backend to gloo" in problem


def test_preflight_refuses_a_bad_placement_as_an_invalid_spec() -> None:
    job = RLJob.model_validate(job_with(replicas=3))
    checks = preflight(job, placement=TrainPlacement.local(job.spec, gpus=2))
    assert checks.refusal is not None
    assert checks.refusal.reason is FailureReason.INVALID_SPEC
    assert "--set spec.trainer.replicas=2" in checks.refusal.message
    passed = preflight(job, placement=TrainPlacement.local(job.spec, gpus=4))
    assert passed.ok
    assert "placement: 3 train ranks on this machine over nccl, 4 GPUs visible" in passed.checked


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(preflight_module, "local_gpus", lambda: 1)
    monkeypatch.chdir(tmp_path)  # the default run dir is ./runs/...


def test_rlkube_run_on_a_one_gpu_machine_refuses_two_ranks_before_anything_starts(
    one_gpu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_with(replicas=2)))
    assert main(["run", str(job), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "spec.trainer.replicas: 2 train ranks on this machine use NCCL" in err
    assert "--set spec.trainer.replicas=1" in err
    assert not (tmp_path / "runs").exists()


def test_rlkube_validate_on_a_one_gpu_machine_warns_what_rlkube_run_would_refuse(
    one_gpu: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(job_with(replicas=2)))
    assert main(["validate", str(job)]) == 0  # valid for a cluster: one rank per pod
    out = capsys.readouterr().out
    assert "rlkube run on this machine would refuse it: spec.trainer.replicas: 2 train ranks" in out


@pytest.mark.parametrize(
    ("index", "parent", "count", "expected"),
    [
        (0, None, 0, None),
        (0, None, 2, "0"),
        (1, None, 2, "1"),
        (1, "3,5", 2, "5"),
        (2, "3,5", 2, "3"),  # more ranks than GPUs (gloo): round-robin
        (0, "GPU-aa, GPU-bb", 2, "GPU-aa"),
    ],
)
def test_each_local_train_rank_sees_its_own_gpu(
    index: int, parent: str | None, count: int, expected: str | None
) -> None:
    assert visible_gpu_for_rank(index, parent_visible=parent, count=count) == expected


def test_a_train_rank_without_cuda_binds_the_cpu() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert bind_train_device(rank=0, backend="gloo") == "cpu"
