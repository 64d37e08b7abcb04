"""Non-finite weights are never published: the step is caught on rank 0 and the job fails, named."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from rlkube.contract import EngineFailure
from rlkube.engine.failure import (
    NON_FINITE_WEIGHTS,
    non_finite_parameter,
    read_failure,
    recorded_reason,
    write_failure,
)


def test_a_nan_or_inf_parameter_is_found_by_name_and_integer_buffers_are_ignored() -> None:
    state = {"w": torch.ones(3), "steps": torch.tensor([7]), "b": torch.tensor([0.0, math.inf])}
    assert non_finite_parameter(state) == "b"
    assert non_finite_parameter({"w": torch.ones(3), "steps": torch.tensor([7])}) is None
    nested = {"actor": {"w": torch.ones(2)}, "critic": {"b": torch.tensor([math.nan])}}
    assert non_finite_parameter(nested) == "critic.b"  # get_trainable_parameters' {module: {param: t}}


def test_the_failure_is_recorded_beside_the_checkpoints_for_a_restarted_rank_and_the_launcher(
    tmp_path: Path,
) -> None:
    assert read_failure(tmp_path) is None
    message = f"{NON_FINITE_WEIGHTS}: after epoch 4 parameter pi.weight holds NaN or Inf"
    write_failure(tmp_path, reason=NON_FINITE_WEIGHTS, message=message)
    assert read_failure(tmp_path) == {"reason": NON_FINITE_WEIGHTS, "message": message}
    recorded = read_failure(tmp_path)
    assert recorded is not None
    assert recorded_reason(recorded) is EngineFailure.NON_FINITE_WEIGHTS
    assert recorded_reason({"reason": "SomethingNewer", "message": ""}) is EngineFailure.TRAINING_FAILED
