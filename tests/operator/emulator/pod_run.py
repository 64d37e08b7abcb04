"""One pod as the process kubelet tracks it: its container's process, restarts and back-off.

The values of :mod:`tests.operator.emulator.process_kubelet`; ``signal_group`` and ``base_env``
are its two small I/O helpers (signalling a container's process group, the env a container starts from).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkube import contract

from tests.operator.emulator.sandbox import Node, PodSandbox

ROOT = Path(__file__).resolve().parents[3]
#: Defaults of the emulated container runtime (the container's own env wins): one intra-op thread
#: per process on a shared machine, as ``rlkube run`` does, and unbuffered output for the logs.
RUNTIME_DEFAULTS = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class BackOff:
    """Restart delay after the n-th consecutive exit, as the kubelet's CrashLoopBackOff.

    The kubelet's figures by default: 10 s after the first exit, doubling to a cap of 5 min, and
    a container that ran 10 min without exiting starts over at 10 s. :meth:`kubelet` with a
    ``speedup`` divides all three, for tests (``speedup=20``: 0.5 s doubling to 15 s).
    """

    initial: float = 10.0
    cap: float = 300.0
    reset_after: float = 600.0

    @classmethod
    def kubelet(cls, *, speedup: float = 1.0) -> BackOff:
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        return cls(initial=10.0 / speedup, cap=300.0 / speedup, reset_after=600.0 / speedup)

    def delay(self, failures: int) -> float:
        return min(self.cap, self.initial * 2 ** max(0, failures - 1))


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class PodRun:
    """What the kubelet knows of one pod (by uid) and its container's process."""

    namespace: str
    name: str
    uid: str
    node: Node
    container: dict[str, Any]
    init_containers: list[dict[str, Any]]
    restart_policy: str
    grace: float
    job: str | None
    log_dir: Path
    start_time: str
    sandbox: PodSandbox | None = None
    log_file: Path | None = None
    popen: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    started_at: str = ""
    started_mono: float = 0.0
    restarts: int = 0
    failures: int = 0
    next_start: float | None = 0.0  # None: never again (restartPolicy)
    waiting: tuple[str, str] = ("ContainerCreating", "")
    last_terminated: dict[str, Any] | None = None
    deleting: bool = False
    term_sent: bool = False
    kill_at: float | None = None
    written: dict[str, Any] | None = None
    condition_times: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.popen is not None


def base_env(environ: Mapping[str, str]) -> dict[str, str]:
    """This machine's env as a container's starting point: without the env contract, the operator's
    settings and the kubeconfig; with PYTHONPATH reaching the project (as the image's install does)."""
    contract_names = {var.name for var in contract.ENV_CONTRACT}
    env = {
        k: v
        for k, v in environ.items()
        if k not in contract_names and not k.startswith(("RLKUBE_", "PET_")) and k != "KUBECONFIG"
    }
    project = [str(ROOT / "runtime"), str(ROOT / "operator"), str(ROOT)]
    existing = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in project]
    env["PYTHONPATH"] = os.pathsep.join(project + existing)
    return {**RUNTIME_DEFAULTS, **env}
