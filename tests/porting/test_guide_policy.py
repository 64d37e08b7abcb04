"""The Customize Policy guide's snippets, assembled literally, train on rlkube with 8 envs per worker.

The class (tests/porting/guide_policy.py) is the guide's code with ``rlightning`` renamed to
``rlkube`` in its imports, ``rollout_step`` included: it ``unsqueeze(0)``s one env's observation.
Each test runs ``rlkube run`` as a user would, in one process and as a local cluster of two train
ranks, in sync and async rollout mode, and checks that the eval side held the trainer's weights.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.porting.jobs import ROOT, document, rlkube_run

GUIDE_POLICY = ROOT / "tests" / "porting" / "guide_policy.py"


def guide_job(**kwargs: object) -> dict[str, object]:
    return document("MyPolicy", "tests.porting.guide_policy", "Pendulum-v1", **kwargs)  # type: ignore[arg-type]


def test_the_assembled_guide_policy_imports_only_rlkube_and_keeps_the_guide_s_lines() -> None:
    source = GUIDE_POLICY.read_text()
    tree = ast.parse(source)
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert {"rlkube.policy", "rlkube.types", "rlkube.utils.registry"} <= imported
    assert not any("rlightning" in name for name in imported)
    for line in (
        "obs = env_ret.observation.float().unsqueeze(0)",
        "action_dim = action_space.shape[0]",
        "self.optimizer = torch.optim.AdamW(params, lr=optim_cfg.lr)",
        "model.load_state_dict(state_dict[name], strict=strict)",
        "module = model.module if isinstance(model, DDP) else model",
    ):
        assert line in source


@pytest.mark.parametrize("rollout_mode", ["sync", "async"])
def test_the_guide_policy_trains_in_process_with_8_envs(tmp_path: Path, rollout_mode: str) -> None:
    result, summary = rlkube_run(tmp_path, guide_job(rollout_mode=rollout_mode), "--in-process")
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary is not None
    assert summary["epochs"] == 2
    assert summary["env_steps"] == 2 * 128
    assert summary["weight_version"] == 2
    assert summary["fingerprints_consistent"] is True
    assert summary["fingerprint_checks"] == 2


@pytest.mark.parametrize("rollout_mode", ["sync", "async"])
def test_the_guide_policy_trains_as_a_local_cluster_with_2_train_ranks(
    tmp_path: Path, rollout_mode: str
) -> None:
    result, summary = rlkube_run(tmp_path, guide_job(rollout_mode=rollout_mode, train_ranks=2), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert summary is not None
    assert summary["epochs"] == 2
    assert summary["fingerprints_consistent"] is True
    assert summary["fingerprint_checks"] >= 2
    assert summary["fragments_trained"] == summary["fragments_acknowledged"] == 4
