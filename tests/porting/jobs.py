"""Job files for the ported policies, and `rlkube run` on them as a user would type it."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def document(
    policy_type: str,
    module: str,
    env_id: str,
    *,
    rollout_mode: str = "sync",
    train_ranks: int = 1,
    evaluators: int = 1,
    num_envs: int = 8,
    **train: Any,
) -> dict[str, Any]:
    """A tiny RLJob: 2 epochs of 2 fragments of ``num_envs`` x 8 steps."""
    return {
        "apiVersion": "rlkube.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "ported"},
        "spec": {
            "policy": {
                "type": policy_type,
                "module": module,
                "rolloutMode": rollout_mode,
                "optimCfg": {"lr": 0.001},
                "weightBuffer": {"strategy": "Shared"},
            },
            "env": {"id": env_id, "numEnvs": num_envs},
            "train": {
                "maxEpochs": 2,
                "stepsPerEpoch": 2 * num_envs * 8,
                "fragmentLength": 8,
                "batchSize": 32,
                "evalInterval": 0,
                "saveInterval": 1,
                **train,
            },
            "trainer": {"replicas": train_ranks},
            "evaluator": {"replicas": evaluators},
            "log": {"intervalSeconds": 1.0},
        },
    }


def with_spec(doc: dict[str, Any], **sections: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    for dotted, value in sections.items():
        node = out["spec"]
        *parents, last = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return out


def rlkube_run(
    tmp_path: Path, doc: dict[str, Any], *args: str, timeout: float = 240
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """``rlkube run job.yaml --run-dir DIR --no-progress ARGS``; the result and summary.json (if any)."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "runtime"), str(ROOT / "operator"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlkube.cli",
            "run",
            str(job),
            "--run-dir",
            str(run_dir),
            "--no-progress",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
    return result, summary
