"""A job that must not go on: non-finite weights. Detected on rank 0, recorded next to the checkpoints.

Pure check (:func:`non_finite_parameter`) plus a small marker file (``FAILED.json``, I/O) beside
``COMPLETE.json``: a restarted rank 0 that finds it serves the failure instead of training
again, and the local launcher ends the run with its message. The reason
(:class:`rlkube.contract.EngineFailure`) travels to the operator as ``JobStatus.failure_reason``,
the reason of the job's ``Failed`` condition.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from rlkube.contract import EngineFailure

FAILED_FILE = "FAILED.json"
NON_FINITE_WEIGHTS = EngineFailure.NON_FINITE_WEIGHTS


class NonFiniteWeights(RuntimeError):
    """The trained weights hold NaN or Inf; they were not published and the job fails."""


def non_finite_parameter(state: Mapping[str, Any]) -> str | None:
    """The first floating-point tensor of ``state`` (``{module: {param: tensor}}`` or flat) holding
    NaN or Inf, named ``module.param``; None when all are finite."""
    for name, value in state.items():
        if isinstance(value, Mapping):
            inner = non_finite_parameter(value)
            if inner is not None:
                return f"{name}.{inner}"
        elif (
            isinstance(value, torch.Tensor)
            and value.is_floating_point()
            and not bool(torch.isfinite(value).all())
        ):
            return str(name)
    return None


def write_failure(directory: Path, *, reason: str, message: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".tmp-{FAILED_FILE}-{os.getpid()}"
    tmp.write_text(json.dumps({"reason": reason, "message": message}, indent=1))
    tmp.replace(directory / FAILED_FILE)


def read_failure(directory: Path) -> dict[str, str] | None:
    """The recorded failure, or None."""
    try:
        data = json.loads((directory / FAILED_FILE).read_text())
    except (OSError, ValueError):
        return None
    return {"reason": str(data.get("reason", "")), "message": str(data.get("message", ""))}


def recorded_reason(recorded: Mapping[str, str]) -> EngineFailure:
    """The reason of a :func:`read_failure` record (one this version does not name: TRAINING_FAILED)."""
    try:
        return EngineFailure(recorded.get("reason", ""))
    except ValueError:
        return EngineFailure.TRAINING_FAILED
