"""The SAC example learns: Pendulum-v1 climbs from about -1200 (random) past -500 within 8,000 env steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlkube.engine.run_paths import RunPaths
from rlkube.jobfile import load_job
from rlkube.launch.in_process import InProcessRun
from rlkube.policy.builtin.sac import SAC

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pendulum-sac.yaml"


@pytest.mark.slow
def test_the_pendulum_example_passes_minus_500_within_8000_env_steps(tmp_path: Path) -> None:
    overrides = [
        "spec.train.maxEpochs=40",
        "spec.train.targetReturn=-500",
        "spec.train.evalInterval=0",
        "spec.train.saveInterval=0",
        "spec.policy.modelCfg.hiddenSizes=[64,64]",
    ]
    job = load_job(EXAMPLE, overrides)
    summary = InProcessRun(job, SAC, paths=RunPaths(tmp_path).create()).run()
    assert summary.stop_reason == "target_return"
    assert summary.final_return is not None
    assert summary.final_return >= -500
    assert summary.env_steps <= 8_000
    assert summary.fingerprints_consistent
