"""RLightning's shipped SimplePPOPolicy, ported by its imports, trains under `rlkube run`.

examples/simple_ppo_policy.py keeps the original's imports (``rlkube`` for ``rlightning``) and
calls: ``NatureCNN(image_format="HWC")``, ``@profiler.timer_wrap``, ``self.config.train_config``,
``data["advantages"]`` / ``data["returns"]`` from the buffer, an unimplemented ``postprocess``, and
``.cuda()`` where the original has it. The runs here use SimplePPOPolicyOnCPU
(tests/porting/simple_ppo_cpu.py): the same class with its three CUDA moves pointed at
``self.device``; the GPU acceptance script runs the original (examples/simple_ppo.yaml).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.porting.jobs import ROOT, rlkube_run

EXAMPLE_POLICY = ROOT / "examples" / "simple_ppo_policy.py"
EXAMPLE_JOB = ROOT / "examples" / "simple_ppo.yaml"

#: What RLightning's SimplePPOPolicy imports from its own package, renamed.
RLIGHTNING_IMPORTS = {
    "rlkube.models.vision": {"NatureCNN"},
    "rlkube.policy.base_policy": {"BasePolicy"},
    "rlkube.types": {"EnvRet", "PolicyResponse"},
    "rlkube.utils.logger": {"get_logger"},
    "rlkube.utils.profiler": {"profiler"},
    "rlkube.utils.registry": {"POLICIES"},
}


def cpu_job(**train: Any) -> dict[str, Any]:
    """examples/simple_ppo.yaml, small, with the CPU variant of the policy."""
    doc = yaml.safe_load(EXAMPLE_JOB.read_text())
    spec = doc["spec"]
    spec["policy"].update(type="SimplePPOPolicyOnCPU", module="tests.porting.simple_ppo_cpu")
    spec["policy"]["trainConfig"].update(ppo_epochs=2, minibatch_size=64)
    spec["env"]["numEnvs"] = 4
    spec["train"].update(
        maxEpochs=2, stepsPerEpoch=128, fragmentLength=16, batchSize=64, saveInterval=1, **train
    )
    spec["log"] = {"intervalSeconds": 1.0}
    return doc


def test_the_ported_policy_imports_what_the_original_imports_renamed_and_keeps_its_calls() -> None:
    source = EXAMPLE_POLICY.read_text()
    imported: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rl"):
            imported.setdefault(node.module, set()).update(alias.name for alias in node.names)
    assert imported == RLIGHTNING_IMPORTS
    for line in (
        'self.encoder = NatureCNN(image_format="HWC")',
        "nn.Linear(self.encoder.out_feature_dim, action_dim)",
        '@profiler.timer_wrap(level="info")',
        '@profiler.timer_wrap(level="debug")',
        "ppo_epochs = train_config.ppo_epochs",
        "minibatch_size = train_config.minibatch_size",
        "clip_coef = train_config.clip_ratio",
        "entropy_coef = train_config.entropy_coef",
        'data["advantages"]',
        'data["returns"]',
        'TensorDict.from_dict(data, auto_batch_size=True, device="cuda")',
        "obs, action = obs.cuda(), action.cuda()",
        "raise NotImplementedError",
    ):
        assert line in source, line


def test_the_example_job_names_the_ported_policy_and_validates(tmp_path: Path) -> None:
    from rlkube.cli import main

    assert main(["validate", str(EXAMPLE_JOB)]) == 0
    spec = yaml.safe_load(EXAMPLE_JOB.read_text())["spec"]
    assert spec["policy"]["type"] == "SimplePPOPolicy"
    assert [p["type"] for p in spec["buffer"]["processors"]] == ["GAE", "Flatten"]


def test_simple_ppo_trains_in_process_on_advantages_from_the_buffer(tmp_path: Path) -> None:
    result, summary = rlkube_run(tmp_path, cpu_job(), "--in-process")
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary is not None
    assert summary["epochs"] == 2
    assert summary["env_steps"] == 2 * 128
    assert summary["weight_version"] == 2
    assert summary["fingerprints_consistent"] is True
    assert "time_profile/train" in result.stdout + result.stderr  # the profiler on train ran


@pytest.mark.slow
def test_simple_ppo_trains_as_a_local_cluster_with_2_train_ranks(tmp_path: Path) -> None:
    doc = cpu_job()
    doc["spec"]["trainer"] = {"replicas": 2}
    result, summary = rlkube_run(tmp_path, doc, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary is not None
    assert summary["epochs"] == 2
    assert summary["fingerprints_consistent"] is True
    assert summary["fragments_trained"] == summary["fragments_acknowledged"]
