"""One pod as the node agent tracks it: its container's process, restarts and back-off.

The values of :mod:`rlkube_devcluster.kubelet.node_agent`; ``base_env`` is the env a container
starts from. Back-off, signalling and spawning are :mod:`rlkube.launch.processes`, shared with
``rlkube run``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlkube import contract
from rlkube.launch.processes import RUNTIME_DEFAULTS

from rlkube_devcluster.kubelet.sandbox import Node, PodSandbox

ROOT = Path(__file__).resolve().parents[3]


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
