"""A 4-rank job whose rank 1 always crashes fails under ``rlkube run`` after the same number of
crashes as the operator counts on the cluster-in-a-box (tests/box/test_backoff_on_the_box.py runs
the same job): one crash of the train group is one restart, whatever the number of ranks
(:mod:`rlkube.run_policy`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.run_policy.jobs import BACKOFF_LIMIT, CRASHES_TO_FAIL, crashing_job

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def restarts_in(message: str) -> int:
    found = re.search(r"restarted (\d+) times", message)
    assert found, message
    return int(found.group(1))


def test_rlkube_run_fails_a_four_rank_job_after_backoff_limit_plus_one_crashes(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(crashing_job("crashing")))
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rlkube.cli", "run", str(job), "--run-dir", str(run_dir), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert restarts_in(output) == CRASHES_TO_FAIL, output
    assert f"backoffLimit {BACKOFF_LIMIT}" in output
    # Every rank was started once per crash: the whole group restarts, as pods do.
    rank_one_log = (run_dir / "logs" / "crashing-train-1.log").read_text()
    assert rank_one_log.count("==== crashing-train-1 started") == CRASHES_TO_FAIL
