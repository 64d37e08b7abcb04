"""benchmarks/device_session.sh: one bounded command for a lent GPU machine with no network.

Its sections are the benches' own (tested beside them); this proves the harness: shellcheck-clean
and linted, each section bounded by its own limit (one stopped there is reported and the next
runs), the machine described first, and every file it leaves fits what comes back from a lease.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.delivery.chart import tool
from tests.delivery.test_e2e_script import SHELLCHECK_ARGS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_session.sh"


def test_the_script_is_shellcheck_clean_and_linted_by_make_lint() -> None:
    result = subprocess.run(
        [tool("shellcheck"), *SHELLCHECK_ARGS, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(
        r"shellcheck \$\(SHELLCHECK_ARGS\) .*benchmarks/device_session\.sh", (ROOT / "Makefile").read_text()
    )


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
    result = subprocess.run(
        ["bash", str(SCRIPT), str(out)], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    summary = (out / "summary.txt").read_text()
    assert re.search(r"^intake: ok \(rc 0\)", summary, re.M), summary
    assert re.search(r"^gpu-check: stopped at its limit \(rc 124\)", summary, re.M), summary
    assert result.returncode == 0, result.stdout + result.stderr  # stopped is not failed
    intake = (out / "intake.log").read_text()
    assert re.search(r"^cartpole +1 +on .* 26 ", intake, re.M), intake  # the bench's table, both rows
    machine = (out / "machine.txt").read_text()
    assert re.search(r"^cores: \d+", machine, re.M)
    assert re.search(r"^torch \S+", machine, re.M)
    assert "cuda available:" in machine
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu-check.log", "intake.log", "machine.txt", "summary.txt"]
    assert len(files) <= 8  # what a lease brings back
