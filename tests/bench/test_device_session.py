"""benchmarks/device_session.sh: one bounded command for a lent GPU machine with no network.

Its sections are the benches' own (tested beside them; shellcheck in tests/delivery/test_makefile.py);
this proves the harness: each section bounded by its own limit (one stopped there is reported and
the next runs), the machine described first, and every file it leaves fits what comes back from a lease.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_session.sh"


def test_each_section_is_bounded_reported_and_leaves_its_log(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "DEVICE_WHEELS": str(tmp_path / "no-wheels"),  # this interpreter's packages, not a wheelhouse's
        "DEVICE_SECTIONS": "intake gpu-check",
        "DEVICE_WORKERS": "1",
        "DEVICE_INTAKE_SECONDS": "300",
        "DEVICE_GPU_CHECK_SECONDS": "1",  # its CPU fallback alone runs for tens of seconds: stopped
        "RLKUBE_GPU_CHECK_CPU": "1",
    }
    out = tmp_path / "out"
    scratch = {*Path("/tmp").glob("rlkube-site.*"), *Path("/tmp").glob("rlkube-profiles.*")}
    result = subprocess.run(
        ["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    summary = (out / "summary.txt").read_text()
    assert re.search(r"^intake: ok \(rc 0\)", summary, re.M), summary
    assert re.search(r"^gpu-check: stopped at its limit \(rc 124\)", summary, re.M), summary
    assert result.returncode == 0, result.stdout + result.stderr  # stopped is not failed
    intake = (out / "intake.log").read_text()
    assert re.search(r"^cartpole +1 +on +\S+ +0 +\S+", intake, re.M), intake  # the bench's table
    machine = summary  # the machine is described first
    assert re.search(r"^cores: \d+", machine, re.M)
    assert re.search(r"^torch \S+", machine, re.M)
    assert "cuda available:" in machine
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu-check.log", "intake.log", "summary.txt"]
    assert len(files) <= 8  # what a lease brings back
    assert {*Path("/tmp").glob("rlkube-site.*"), *Path("/tmp").glob("rlkube-profiles.*")} == scratch
