"""The delivery examples are valid RLJobs that say what they claim (CPU/gloo for kind, NCCL/GPUs for GPU
clusters), and every delivery YAML file passes yamllint."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from rlkube.spec import Backend, RLJob, WeightStrategy, parse_job

from tests.delivery.chart import CHART, ROOT, tool

KIND_EXAMPLE = ROOT / "examples" / "rljob-kind.yaml"
GPU_EXAMPLE = ROOT / "examples" / "rljob-gpu.yaml"
E2E_SCRIPT = ROOT / "e2e" / "run.sh"
YAML_FILES = [
    CHART / "Chart.yaml",
    CHART / "values.yaml",
    CHART / "values-gpu.yaml",
    KIND_EXAMPLE,
    GPU_EXAMPLE,
    ROOT / "e2e" / "kind.yaml",
]


def load(path: Path) -> RLJob:
    return parse_job(yaml.safe_load(path.read_text()), source=path.name)


def test_kind_example_trains_on_cpu_with_gloo_2_train_and_2_eval() -> None:
    job = load(KIND_EXAMPLE)
    assert job.spec.env.id == "CartPole-v1"
    assert job.spec.trainer.replicas == 2
    assert job.spec.evaluator.replicas == 2
    assert job.spec.resolved_backend() is Backend.GLOO
    assert job.spec.trainer.gpus() == 0
    assert job.spec.evaluator.gpus() == 0
    # No hostPath: the pods meet Pod Security restricted, and kind's nodes need nothing.
    assert job.spec.policy.weight_buffer.strategy in (WeightStrategy.DOUBLE, WeightStrategy.NONE)
    # The image comes from the operator's default (the chart's), which e2e/run.sh loads into kind.
    assert job.spec.image is None


def test_kind_example_is_the_job_the_e2e_script_drives() -> None:
    job = load(KIND_EXAMPLE)
    script = E2E_SCRIPT.read_text()
    assert re.search(rf"^JOB={job.name}$", script, re.M)
    assert re.search(rf"^TRAIN_REPLICAS={job.spec.trainer.replicas}$", script, re.M)
    scaled = re.search(r"^EVAL_SCALED=(\d+)$", script, re.M)
    assert scaled
    assert int(scaled[1]) != job.spec.evaluator.replicas
    assert 'JOB_FILE="$ROOT/examples/rljob-kind.yaml"' in script


def test_gpu_example_trains_over_nccl_with_one_gpu_per_train_pod() -> None:
    job = load(GPU_EXAMPLE)
    assert job.spec.resolved_backend() is Backend.NCCL
    assert job.spec.trainer.gpus() == 1
    assert job.spec.trainer.replicas > 1
    assert {
        "key": "nvidia.com/gpu",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in job.spec.trainer.tolerations
    assert job.spec.image is not None
    assert job.spec.image.endswith("-cuda")


def test_delivery_yaml_passes_yamllint() -> None:
    result = subprocess.run(
        [
            tool("yamllint"),
            "--strict",
            "-c",
            str(ROOT / "tests/delivery/yamllint.yaml"),
            *map(str, YAML_FILES),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
