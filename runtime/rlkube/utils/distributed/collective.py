"""RLightning's ``all_reduce_dict``: reduce a dict of numbers over the train ranks."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from rlkube.utils.distributed.comm_context import CommContext
from rlkube.utils.distributed.group_initializer import ParallelMode


def all_reduce_dict(
    dictionary: Mapping[str, float | torch.Tensor],
    comm_mode: ParallelMode = ParallelMode.TRAIN_DATA_PARALLEL,
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    dtype: torch.dtype = torch.float32,
) -> dict[str, float]:
    """Every rank gets ``op`` over all ranks of each value (SUM by default, as in RLightning).

    One rank, or no process group: the values themselves, as floats. The tensor travels on CUDA
    when the group's backend is NCCL, else on the CPU; ``ReduceOp.AVG`` (which RLightning's VLA
    policy uses) works on gloo too.
    """
    keys = sorted(dictionary)
    values = [float(dictionary[key]) for key in keys]
    group = CommContext().get_group(comm_mode)
    if group is None or dist.get_world_size() == 1:
        return dict(zip(keys, values, strict=True))
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
    tensor = torch.tensor(values, dtype=dtype, device=device)
    if op == dist.ReduceOp.AVG and not nccl:  # gloo has no AVG: the sum over the ranks, divided
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        tensor /= dist.get_world_size()
    else:
        dist.all_reduce(tensor, op=op, group=group)
    return dict(zip(keys, tensor.tolist(), strict=True))
