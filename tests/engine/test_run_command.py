"""`rlkube run` refuses a bad job with exit code 2 before anything starts, and runs a good one to the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from rlkube.cli import main

from tests.engine.jobs import tiny_document


def write_job(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def with_spec(**spec: Any) -> dict[str, Any]:
    document = tiny_document()
    document["spec"].update(spec)
    return document


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default run dir is ./runs/...


@pytest.mark.parametrize(
    ("document", "args", "message"),
    [
        (with_spec(train={"maxEpochs": 0}), [], "spec.train.maxEpochs: got 0"),
        (with_spec(policy={"type": "PP0"}), [], "spec.policy.type: no policy named 'PP0'"),
        (
            with_spec(policy={"type": "Mine", "module": "no_such_policies"}),
            [],
            "cannot import 'no_such_policies'",
        ),
        (with_spec(env={"id": "CartPol-v1"}), [], "spec.env.id: got 'CartPol-v1'"),
        (with_spec(policy={"type": "PPO", "algoCfg": {"gamma": 3}}), [], "spec.policy.algoCfg.gamma: got 3"),
        (tiny_document(), ["--set", "spec.train.batchSize=many"], "spec.train.batchSize: got 'many'"),
        (with_spec(policy={"type": "PP0"}), ["--in-process"], "spec.policy.type: no policy named 'PP0'"),
    ],
)
def test_a_bad_job_exits_2_naming_the_field_and_starts_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    document: dict[str, Any],
    args: list[str],
    message: str,
) -> None:
    job = write_job(tmp_path, document)
    assert main(["run", str(job), "--no-progress", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_missing_job_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_good_job_runs_and_says_where_everything_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_job(tmp_path, tiny_document(maxEpochs=2))
    extra = tmp_path / "out" / "summary.json"
    assert main(["run", str(job), "--no-progress", "--summary", str(extra)]) == 0
    out = capsys.readouterr().out
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("tiny-")
    for label in ("logs", "checkpoint", "plot", "summary"):
        assert f"  {label}" in out
    assert f"runs/{run_dir.name}/learning_curve.png" in out
    summary = json.loads(extra.read_text())
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2
    assert (run_dir / "job.yaml").is_file()


def test_the_console_entry_point_exits_2_for_a_bad_job(tmp_path: Path) -> None:
    job = write_job(tmp_path, with_spec(train={"batchSize": -1}))
    result = subprocess.run(
        [sys.executable, "-m", "rlkube.cli", "run", str(job)],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "spec.train.batchSize: got -1" in result.stderr


def test_two_runs_in_the_same_second_get_their_own_run_dirs(tmp_path: Path) -> None:
    job = write_job(tmp_path, tiny_document(maxEpochs=1))
    assert main(["run", str(job), "--no-progress"]) == 0
    assert main(["run", str(job), "--no-progress"]) == 0
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    for run_dir in runs:
        assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "max_epochs"


def test_rerunning_a_finished_run_dir_does_not_train_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = write_job(tmp_path, tiny_document(maxEpochs=1))
    assert main(["run", str(job), "--no-progress", "--run-dir", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    assert main(["run", str(job), "--no-progress", "--run-dir", str(tmp_path / "r")]) == 0
    assert "already complete" in capsys.readouterr().out


def test_every_engine_runs_in_process(tmp_path: Path) -> None:
    """``--in-process`` runs the cluster's engines, async included, in this one process."""
    job = write_job(
        tmp_path, with_spec(engine="async", train={**tiny_document()["spec"]["train"], "maxEpochs": 2})
    )
    assert main(["run", str(job), "--no-progress", "--in-process", "--run-dir", str(tmp_path / "r")]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["engine"] == "async"
    assert summary["epochs"] == 2
