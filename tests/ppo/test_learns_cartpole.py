"""The demo job learns: examples/cartpole.yaml reaches a mean return of 475 within 300k env steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlkube.engine.run_paths import RunPaths
from rlkube.jobfile import load_job
from rlkube.launch.in_process import InProcessRun
from rlkube.policy.builtin.ppo import PPO

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole.yaml"


@pytest.mark.slow
def test_the_cartpole_example_solves_cartpole_within_300k_env_steps(tmp_path: Path) -> None:
    job = load_job(EXAMPLE, ["spec.train.evalInterval=0", "spec.train.saveInterval=0"])
    summary = InProcessRun(job, PPO, paths=RunPaths(tmp_path).create()).run()
    assert summary.stop_reason == "target_return"
    assert summary.final_return is not None
    assert summary.final_return >= 475
    assert summary.env_steps <= 300_000
    assert summary.fingerprints_consistent
