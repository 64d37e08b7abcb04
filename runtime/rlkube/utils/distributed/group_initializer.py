"""RLightning's ``ParallelMode``: which process group a collective runs over."""

from __future__ import annotations

from enum import Enum


class ParallelMode(Enum):
    """The groups RLightning names; on rlkube both are the job's train ranks."""

    GLOBAL = "global"
    TRAIN_DATA_PARALLEL = "train_data_parallel"
