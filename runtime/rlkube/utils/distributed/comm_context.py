"""RLightning's ``CommContext``: ``CommContext().get_group(mode)`` -> the process group for ``mode``."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from rlkube.utils.distributed.group_initializer import ParallelMode


class CommContext:
    """Stateless: every ``ParallelMode`` is the train ranks' default group (None when there is none)."""

    def get_group(self, comm_mode: ParallelMode = ParallelMode.TRAIN_DATA_PARALLEL) -> Any:
        if not isinstance(comm_mode, ParallelMode):
            raise TypeError(f"comm_mode must be a ParallelMode, got {comm_mode!r}")
        return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None

    def get_world_size(self, comm_mode: ParallelMode = ParallelMode.TRAIN_DATA_PARALLEL) -> int:
        return dist.get_world_size() if self.get_group(comm_mode) is not None else 1

    def get_local_rank(self, comm_mode: ParallelMode = ParallelMode.TRAIN_DATA_PARALLEL) -> int:
        return dist.get_rank() if self.get_group(comm_mode) is not None else 0
