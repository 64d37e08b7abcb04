"""``python -m benchmarks.rollout.profile``: py-spy on a real local cluster's rank 0 and eval worker.

The run is stopped once both profiles are taken; the breakdown names the stages each process
spends its time in, and nothing of the run is left behind.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_profiles_rank0_and_a_worker_of_a_running_cluster_then_stops_it(tmp_path: Path) -> None:
    out = tmp_path / "profile"
    shm_before = set(Path("/dev/shm").glob("rlkube-bench-profile-*"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.rollout.profile",
            "--workers",
            "1",
            "--seconds",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    text = (out / "breakdown.txt").read_text()
    assert text == result.stdout
    rate = re.search(r"^env steps/s while profiled: ([\d,]+) \(", text, re.M)
    assert rate, text
    assert int(rate[1].replace(",", "")) > 0
    assert re.search(r"^rank0, main thread\(s\): \d+ samples\n(  .*\n)*? +[\d.]+%  training$", text, re.M), (
        text
    )
    rollout = (
        r"^worker0, main thread\(s\): \d+ samples\n(  .*\n)*? +[\d.]+%  worker: rollout \(env \+ policy\)$"
    )
    assert re.search(rollout, text, re.M), text
    assert (out / "profile-rank0.txt").stat().st_size > 0
    assert (out / "profile-worker0.txt").stat().st_size > 0
    assert set(Path("/dev/shm").glob("rlkube-bench-profile-*")) == shm_before  # the run was shut down
