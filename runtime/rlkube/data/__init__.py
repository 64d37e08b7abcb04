"""Trajectory data: fragments, the rollout and replay buffers, and the pickle-free wire encoding.

Every module here is pure (no I/O): ``fragment`` (the unit of rollout work), ``rollout_buffer``
(idempotent, bounded epoch storage with equal shards), ``replay_buffer`` (a ring of transitions),
``wire`` (TensorDict <-> manifest + bytes).
"""

from rlkube.data.fragment import Fragment, concat_rows
from rlkube.data.replay_buffer import ReplayBuffer
from rlkube.data.rollout_buffer import AddResult, EpochBatch, RolloutBuffer
from rlkube.data.wire import Manifest, TensorMeta, WireError, decode, encode

__all__ = [
    "AddResult",
    "EpochBatch",
    "Fragment",
    "Manifest",
    "ReplayBuffer",
    "RolloutBuffer",
    "TensorMeta",
    "WireError",
    "concat_rows",
    "decode",
    "encode",
]
