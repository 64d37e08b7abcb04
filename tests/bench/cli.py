"""Run a benchmark the way a user does, ``python -m benchmarks.cli NAME ...``, from a test."""

from __future__ import annotations

import os
import subprocess
import sys


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``benchmarks.cli`` with this interpreter and import path; fails the test unless it exits 0."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
