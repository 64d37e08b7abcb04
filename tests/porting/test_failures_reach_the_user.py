"""Every policy error reaches the user: `rlkube run` fails (never hangs) with the exception and its frame.

For each place a ported policy can break (``rollout_step``, ``construct_network``, ``postprocess``,
``init_eval``) and for an env whose step raises, the local cluster stops within a bounded time
(``runPolicy.evalBackoffLimit`` bounds eval restarts), the console and summary.json carry the
exception's type, message and the policy's frame, and no process or shm directory is left.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.porting.jobs import document, rlkube_run, with_spec


def failing_job(
    name: str, *, fail_in: str | None = None, env_id: str = "Pendulum-v1", eval_restarts: int = 0
) -> dict[str, object]:
    doc = document("FailingPolicy", "tests.porting.failing", env_id, num_envs=2)
    doc["metadata"]["name"] = name
    return with_spec(
        doc,
        policy__modelCfg={"fail_in": fail_in},
        env__imports=["tests.porting.failing"],
        runPolicy={"backoffLimit": 0, "evalBackoffLimit": eval_restarts},
    )


def pods_of(run_dir: Path) -> list[int]:
    """Processes started for this run (their env contract names its run directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RLKUBE_RUN_DIR={run_dir}".encode() in environ:
            found.append(int(entry.name))
    return found


def assert_failed_with(
    tmp_path: Path, name: str, result, summary, *, exception: str, text: str, function: str, reason: str
) -> None:
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"{exception}: {text}" in result.stderr
    assert "failing.py" in result.stderr
    assert function in result.stderr
    assert summary is not None
    assert summary["stop_reason"] == "failed"
    failure = summary["failure"]
    assert failure["exception"] == exception
    assert text in failure["detail"]
    assert failure["reason"] == reason
    assert failure["frame"]["function"] == function
    assert failure["frame"]["file"].endswith("failing.py")
    assert not pods_of((tmp_path / "run").resolve())
    assert not [p for p in Path("/dev/shm").glob(f"rlkube-{name}-*")], "shm left behind"


@pytest.mark.parametrize(
    ("stage", "reason"),
    [
        ("rollout_step", "RolloutStepFailed"),
        ("construct_network", "ConstructNetworkFailed"),
        ("postprocess", "PostprocessFailed"),
        ("init_eval", "InitEvalFailed"),
    ],
)
def test_a_policy_error_fails_the_local_cluster_run_with_its_exception_and_frame(
    tmp_path: Path, stage: str, reason: str
) -> None:
    name = f"fail-{stage.replace('_', '-')}"
    # rollout_step's worker is restarted once first: the limit bounds restarts, it does not forbid them
    restarts = 1 if stage == "rollout_step" else 0
    result, summary = rlkube_run(
        tmp_path, failing_job(name, fail_in=stage, eval_restarts=restarts), timeout=240
    )
    assert_failed_with(
        tmp_path,
        name,
        result,
        summary,
        exception="PolicyBug",
        text=f"deliberate failure in {stage}",
        function="fail_if",
        reason=reason,
    )


def test_a_failing_env_fails_the_local_cluster_run_with_its_exception_and_frame(tmp_path: Path) -> None:
    result, summary = rlkube_run(tmp_path, failing_job("fail-env", env_id="RlkubeFailing-v0"), timeout=240)
    assert_failed_with(
        tmp_path,
        "fail-env",
        result,
        summary,
        exception="RuntimeError",
        text="the simulator lost its connection",
        function="step",
        reason="EnvFailed",
    )


def test_a_policy_error_fails_an_in_process_run_with_its_exception_and_frame(tmp_path: Path) -> None:
    result, summary = rlkube_run(tmp_path, failing_job("fail-inproc", fail_in="rollout_step"), "--in-process")
    assert_failed_with(
        tmp_path,
        "fail-inproc",
        result,
        summary,
        exception="PolicyBug",
        text="deliberate failure in rollout_step",
        function="fail_if",
        reason="RolloutStepFailed",
    )


def test_eval_restarts_are_bounded_by_a_documented_default() -> None:
    from rlkube.spec import RunPolicySpec

    field = RunPolicySpec.model_fields["eval_backoff_limit"]
    assert field.default == 5
    assert field.description
    assert "eval worker" in field.description
