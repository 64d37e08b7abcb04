"""The kind end-to-end run (e2e/run.sh): runs where a Docker daemon answers, skips elsewhere with the reason.

pytest tests/e2e -m e2e        # or: make e2e
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "run.sh"

pytestmark = pytest.mark.e2e


def missing_prerequisite() -> str | None:
    """Why the kind run cannot happen on this machine, or None when it can."""
    if shutil.which("docker") is None:
        return "docker is not on PATH"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "the Docker daemon does not answer (docker info timed out)"
    if info.returncode != 0:
        return f"the Docker daemon does not answer: {(info.stderr.strip().splitlines() or ['?'])[-1]}"
    for name in ("kind", "kubectl"):
        if shutil.which(name) is None:
            return f"{name} is not on PATH"
    if shutil.which("helm") is None and not (Path(sys.executable).parent / "helm").exists():
        return "helm is not on PATH (scripts/install_helm.py puts it in the venv)"
    return None


@pytest.mark.timeout(3600)
def test_cartpole_rljob_runs_to_complete_on_kind_and_scales_eval_without_restarting_training() -> None:
    reason = missing_prerequisite()
    if reason:
        pytest.skip(f"kind end-to-end needs Docker: {reason}")
    helm = shutil.which("helm") or str(Path(sys.executable).parent / "helm")
    result = subprocess.run(
        ["bash", str(SCRIPT)], env={**os.environ, "HELM": helm}, timeout=3500, check=False
    )
    assert result.returncode == 0, "e2e/run.sh failed; logs and events are in runs/e2e/"
