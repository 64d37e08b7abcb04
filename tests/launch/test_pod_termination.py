"""A pod that refuses its job or crashes says why in its termination message; the checks behind it are
the same ``rlkube validate`` and ``rlkube run`` make."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rlkube.contract import TERMINATION_MESSAGE_MAX_BYTES, FailureReason
from rlkube.engine.checkpoint import POLICY_FILE
from rlkube.launch import pod, preflight
from rlkube.launch.termination import PATH_VARIABLE, termination_path, write_termination_message
from rlkube.spec import parse_job

from tests.conftest import MINIMAL_JOB

ROOT = Path(__file__).resolve().parents[2]


def job(**spec: Any) -> Any:
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"].update(spec)
    return parse_job(document)


def test_the_message_is_written_where_the_kubelet_says_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert write_termination_message("Crashed", "x" * 100_000, environ={PATH_VARIABLE: str(path)})
    written = path.read_text()
    assert len(written.encode()) <= TERMINATION_MESSAGE_MAX_BYTES
    assert json.loads(written)["reason"] == "Crashed"
    assert json.loads(written)["permanent"] is False


def test_outside_a_pod_nothing_is_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("rlkube.launch.termination.TERMINATION_MESSAGE_PATH", str(tmp_path / "absent"))
    assert termination_path({}) is None
    assert not write_termination_message("Crashed", "no file", environ={})
    assert not (tmp_path / "absent").exists()


@pytest.mark.parametrize(
    ("spec", "reason", "words"),
    [
        ({"policy": {"type": "PPO2"}}, FailureReason.POLICY_NOT_REGISTERED, "did you mean 'PPO'"),
        ({"imports": ["no_such_module_here"]}, FailureReason.IMPORT_FAILED, "no_such_module_here"),
        ({"buffer": {"type": "replay"}}, FailureReason.BUFFER_NOT_SUPPORTED, "spec.buffer.type"),
        (
            {"policy": {"type": "PPO", "modelCfg": {"hiddenSizes": "big"}}},
            FailureReason.POLICY_CONFIG_INVALID,
            "spec.policy.modelCfg.hiddenSizes",
        ),
        ({"env": {"id": "CartPole-v9"}}, FailureReason.ENV_NOT_FOUND, "spec.env.id"),
    ],
)
def test_each_refusal_has_its_reason_and_names_the_field(
    spec: dict[str, Any], reason: FailureReason, words: str
) -> None:
    checks = preflight.preflight(job(**spec))
    assert checks.refusal is not None
    assert checks.refusal.reason is reason
    assert words in checks.refusal.message


def test_a_missing_checkpoint_is_refused_only_when_asked(tmp_path: Path) -> None:
    missing = job(engine="eval", checkpoint={"path": str(tmp_path / "nothing.pt")})
    assert preflight.preflight(missing).ok
    refused = preflight.preflight(missing, check_checkpoint=True).refusal
    assert refused is not None
    assert refused.reason is FailureReason.CHECKPOINT_NOT_FOUND
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / POLICY_FILE).write_bytes(b"")
    present = job(engine="eval", checkpoint={"path": str(tmp_path / "ckpt")})
    assert preflight.preflight(present, check_checkpoint=True).ok


def test_a_good_job_passes_every_check_and_says_what_was_checked() -> None:
    checks = preflight.preflight(job())
    assert checks.ok
    assert [line.split(":")[0] for line in checks.checked] == [
        "spec.policy.type",
        "spec.buffer.type",
        "spec.policy",
        "spec.env.id",
    ]


def test_the_pod_writes_its_refusal_of_a_broken_env_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "termination-log"
    for name in list(os.environ):
        if name.startswith(("RLKUBE_", "WORLD_SIZE", "RANK", "MASTER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv(PATH_VARIABLE, str(path))
    assert pod.main() == pod.EXIT_INVALID
    written = json.loads(path.read_text())
    assert (written["reason"], written["permanent"]) == ("EnvContractBroken", True)
    assert "RLKUBE_JOB_NAME is not set" in written["message"]


def _raise_here() -> None:
    raise ZeroDivisionError("in the policy's own module")


class _ThisModulesPolicy:
    pass


def test_a_crash_in_the_policys_module_is_a_policy_error_and_anything_else_a_crash() -> None:
    with pytest.raises(ZeroDivisionError) as in_policy:
        _raise_here()
    assert pod.crash_reason(in_policy.value, _ThisModulesPolicy) is FailureReason.POLICY_ERROR
    with pytest.raises(json.JSONDecodeError) as elsewhere:
        json.loads("{")
    assert pod.crash_reason(elsewhere.value, pod.PodEnv) is FailureReason.CRASHED


def test_the_preflight_knows_the_checkpoint_file_name_of_the_engine() -> None:
    assert preflight.POLICY_FILE == POLICY_FILE


def test_rlkube_validate_refuses_ppo_with_a_replay_buffer_and_says_why(tmp_path: Path) -> None:
    document = copy.deepcopy(MINIMAL_JOB)
    document["spec"]["buffer"] = {"type": "replay"}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(document))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube.cli", "validate", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 2
    assert "BufferNotSupported" in result.stderr
    assert "spec.buffer.type" in result.stderr
