"""What train ranks say to each other besides DDP's gradients: commands, and state on resume.

I/O (torch.distributed collectives). Rank 0 drives: before each training step it broadcasts a
:class:`Command` (train on step ``serial``, or stop) over a small gloo group, so the other ranks
follow without polling; the data itself comes from the coordinator (``PullShard``). On resume,
rank 0 loads the checkpoint and broadcasts the weights, optimizer states and progress, so the
other ranks need no access to rank 0's run directory (a pod's own volume, in a cluster).
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlkube.policy.base import BasePolicy, clone_to_cpu, unwrap

#: Collectives on the control group wait this long for a rank (a dead rank makes the others fail
#: instead of hanging; the launcher or the StatefulSet then restarts the group).
CONTROL_TIMEOUT = datetime.timedelta(minutes=30)


class Op(enum.IntEnum):
    STOP = 0
    TRAIN = 1


@dataclass(frozen=True)
class Command:
    op: Op
    serial: int = 0  # which batch to pull (the engine's step counter)
    version: int = 0  # the weight version this step will publish


class RankChannel:
    """Rank 0 -> every rank commands; a no-op world of one when not distributed."""

    def __init__(self) -> None:
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        # A gloo group even when training uses NCCL: commands are tiny CPU tensors.
        self.group = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT) if self.world_size > 1 else None

    def send(self, command: Command) -> None:
        if self.group is None:
            return
        message = torch.tensor([int(command.op), command.serial, command.version], dtype=torch.int64)
        dist.broadcast(message, src=0, group=self.group)

    def receive(self) -> Command:
        message = torch.zeros(3, dtype=torch.int64)
        dist.broadcast(message, src=0, group=self.group)
        op, serial, version = (int(v) for v in message.tolist())
        return Command(Op(op), serial, version)

    def barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order."""
        if self.group is None:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def agree(self, value: bool) -> bool:
        """True when every rank says True."""
        if self.group is None:
            return value
        flag = torch.tensor([1 if value else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def share_state(self, policy: BasePolicy, progress: Any) -> Any:
        """Rank 0's weights, optimizer states and ``progress`` become every rank's; returns progress."""
        if self.group is None:
            return progress
        for _, model in policy.model_list:
            for tensor in [*unwrap(model).parameters(), *unwrap(model).buffers()]:
                if tensor.device.type == "cpu":
                    dist.broadcast(tensor.data, src=0, group=self.group)
                else:  # the control group is gloo: stage accelerator tensors through the CPU
                    staged = tensor.data.cpu()
                    dist.broadcast(staged, src=0, group=self.group)
                    tensor.data.copy_(staged)
        # On the CPU: pickled CUDA tensors would unpickle onto rank 0's device index in every rank;
        # load_state_dict moves each state onto its parameter's device.
        states = [
            {name: clone_to_cpu(opt.state_dict()) for name, opt in policy.optimizers().items()}
            if self.rank == 0
            else None,
            progress if self.rank == 0 else None,
        ]
        dist.broadcast_object_list(states, src=0, group=self.group)
        if self.rank != 0:
            optimizers = policy.optimizers()
            for name, state in (states[0] or {}).items():
                if name in optimizers:
                    optimizers[name].load_state_dict(state)
        return states[1]
