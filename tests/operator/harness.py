"""kubectl for the operator tests: /usr/bin/kubectl with the emulated cluster's kubeconfig.

The dev cluster itself (the API emulator, the process kubelet, the operator as a process, fake
coordinators, ``wait_for``) is the ``rlkube_devcluster`` source root (devcluster/); this module
holds only what the tests add: the repository root and a ``kubectl`` that fails a CI run (and
skips elsewhere) when kubectl is not installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


def kubectl(
    kubeconfig: Path, *args: str, input: str | None = None, timeout: float = 120.0, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if not Path(KUBECTL).is_file():
        import pytest

        if os.environ.get("CI"):  # CI must run the operator tests, not skip them quietly
            pytest.fail(f"kubectl is not installed (looked on PATH and at {KUBECTL}); CI needs it")
        pytest.skip("kubectl is not installed")
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    cache = kubeconfig.parent / "kubectl-cache"
    result = subprocess.run(
        [KUBECTL, "--cache-dir", str(cache), *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result
