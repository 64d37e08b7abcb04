"""Guide-style policies of our own (tests/porting/own_policies.py) port by imports only and train.

Each runs ``rlkube run --in-process`` with 8 envs; the two-rank DDP ones are trained in
tests/policy/test_ddp_and_checkpoints.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.porting.jobs import ROOT, document, rlkube_run

OWN = ROOT / "tests" / "porting" / "own_policies.py"


def test_the_policies_import_only_rlkube_names() -> None:
    tree = ast.parse(OWN.read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert {"rlkube.policy", "rlkube.types", "rlkube.utils.registry"} <= imported
    assert not any("rlightning" in name for name in imported)


@pytest.mark.parametrize(
    ("policy", "env_id", "rollout_mode"),
    [
        ("GaussianPolicy", "Pendulum-v1", "sync"),
        ("ListedPolicy", "CartPole-v1", "sync"),
        ("CheckpointingPolicy", "CartPole-v1", "sync"),
        ("AsyncAcrobotPolicy", "Acrobot-v1", "async"),
    ],
)
def test_a_guide_style_policy_trains_in_process(
    tmp_path: Path, policy: str, env_id: str, rollout_mode: str
) -> None:
    doc = document(policy, "tests.porting.own_policies", env_id, rollout_mode=rollout_mode)
    result, summary = rlkube_run(tmp_path, doc, "--in-process")
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary is not None
    assert summary["epochs"] == 2
    assert summary["fingerprints_consistent"] is True
    assert summary["fingerprint_checks"] == 2
