"""Which Python packages the GPU check needs, and which of them this interpreter lacks.

A GPU machine may have torch and CUDA but not rlkube's other dependencies; the check names every
missing one by its pip name before anything else runs, instead of failing on the first import.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Package:
    module: str  # what is imported
    pip: str  # what to install
    needed_by: str  # which sections need it


#: What `rlkube run` imports (the runtime's dependencies in pyproject.toml, less the operator's).
RUNTIME = (
    Package("torch", "torch", "every section"),
    Package("numpy", "numpy", "every section"),
    Package("pydantic", "pydantic", "every section (rlkube.spec)"),
    Package("yaml", "pyyaml", "every section"),
    Package("tensordict", "tensordict", "rlkube run, weights"),
    Package("gymnasium", "gymnasium", "rlkube run"),
    Package("grpc", "grpcio", "rlkube run, weights"),
    Package("grpc_health", "grpcio-health-checking", "rlkube run"),
    Package("google.protobuf", "protobuf", "rlkube run, weights"),
    Package("xxhash", "xxhash", "rlkube run, weights"),
    Package("rich", "rich", "rlkube run"),
    Package("matplotlib", "matplotlib", "rlkube run (the learning curve)"),
    Package("tensorboard", "tensorboard", "rlkube run (TensorBoard logs)"),
    Package("prometheus_client", "prometheus-client", "rlkube run (/metrics)"),
)

#: HalfCheetah-v5 (gymnasium's MuJoCo envs import their renderer's modules even when nothing renders).
MUJOCO = (
    Package("mujoco", "mujoco", "halfcheetah"),
    Package("glfw", "glfw", "halfcheetah (imported by gymnasium's MuJoCo envs)"),
    Package("imageio", "imageio", "halfcheetah (imported by gymnasium's MuJoCo envs)"),
)


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def missing(packages: tuple[Package, ...]) -> list[Package]:
    return [p for p in packages if not installed(p.module)]


def describe_missing(packages: list[Package]) -> str:
    """One line per missing package and the pip command that installs them all."""
    lines = [f"  - {p.pip} (import {p.module}; needed by {p.needed_by})" for p in packages]
    pips = " ".join(dict.fromkeys(p.pip for p in packages))
    return "\n".join(
        [*lines, f"  install: python3 -m pip install {pips}  (or put their wheels on PYTHONPATH)"]
    )
