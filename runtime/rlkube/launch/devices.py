"""A train rank's device: ``cuda:LOCAL_RANK`` of the GPUs it sees, made current and logged once.

I/O (CUDA's runtime, a log line). Called by the train entrypoint before the process group and the
policy exist: ``torch.cuda.set_device`` makes the rank's GPU the current one, so the policy's
``device`` (``BasePolicy``: the current CUDA device), DDP's ``device_ids`` and NCCL's communicator
all agree. Which GPU a rank sees is decided outside (Kubernetes' device plugin per pod, or the
local launcher's ``CUDA_VISIBLE_DEVICES`` per rank; see :mod:`rlkube.placement`).
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)


def bind_train_device(*, rank: int, backend: str) -> str:
    """Make ``cuda:LOCAL_RANK`` current (CPU without CUDA) and log the choice; returns the device."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "(all)")
    if not torch.cuda.is_available():
        logger.info("train rank %d: device cpu (no CUDA device visible), backend %s", rank, backend)
        return "cpu"
    count = torch.cuda.device_count()
    index = local_rank % count  # with NCCL, preflight refused local_rank >= count already
    torch.cuda.set_device(index)
    device = f"cuda:{index}"
    logger.info(
        "train rank %d: device %s (%s) of %d visible (LOCAL_RANK=%d, CUDA_VISIBLE_DEVICES=%s), backend %s",
        rank,
        device,
        torch.cuda.get_device_name(index),
        count,
        local_rank,
        visible,
        backend,
    )
    return device
