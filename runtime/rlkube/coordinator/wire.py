"""Fragments and TensorDicts <-> protobuf messages (the trajectory plane's wire format).

Pure: no I/O. Tensors travel as ``rlkube.data.wire``'s manifest plus raw bytes (never pickle).
Copies, counted: the sender encodes each leaf once into one payload (``data.wire.encode``) and
protobuf copies it into the message; the receiver's tensors view the received bytes
(``data.wire.decode``) until the epoch's fragments are stacked for training.
"""

from __future__ import annotations

from tensordict import TensorDict

from rlkube._proto import policy_group_pb2 as pb
from rlkube.data.fragment import Fragment
from rlkube.data.wire import Manifest, TensorMeta, decode, encode


def batch_to_proto(td: TensorDict) -> pb.TensorBatch:
    manifest, payload = encode(td)
    return pb.TensorBatch(
        batch_size=list(manifest.batch_size),
        tensors=[
            pb.TensorMeta(key=m.key, dtype=m.dtype, shape=list(m.shape), offset=m.offset, nbytes=m.nbytes)
            for m in manifest.tensors
        ],
        payload=bytes(payload),
    )


def batch_from_proto(message: pb.TensorBatch) -> TensorDict:
    """Decode a TensorBatch; a malformed manifest raises ``data.wire.WireError`` naming the key."""
    metas = tuple(
        TensorMeta(key=m.key, dtype=m.dtype, shape=tuple(m.shape), offset=m.offset, nbytes=m.nbytes)
        for m in message.tensors
    )
    total = max((m.offset + m.nbytes for m in metas), default=0)
    manifest = Manifest(batch_size=tuple(message.batch_size), tensors=metas, total_bytes=total)
    return decode(manifest, message.payload)


def fragment_to_proto(
    fragment: Fragment,
    *,
    task_id: str,
    worker_id: str,
    epoch: int,
    rollout_seconds: float = 0.0,
    weight_wait_seconds: float = 0.0,
) -> pb.Fragment:
    return pb.Fragment(
        task_id=task_id,
        worker_id=worker_id,
        weight_version=fragment.weight_version,
        epoch=epoch,
        batch=batch_to_proto(fragment.data),
        episodes=pb.EpisodeStats(
            returns=list(fragment.episode_returns), lengths=list(fragment.episode_lengths)
        ),
        env_steps=fragment.env_steps,
        rollout_seconds=rollout_seconds,
        weight_wait_seconds=weight_wait_seconds,
    )


def fragment_from_proto(message: pb.Fragment, *, replica: int = 0) -> Fragment:
    """Rebuild a Fragment; raises ValueError (naming what is wrong) for a malformed message."""
    data = batch_from_proto(message.batch)
    if len(message.episodes.returns) != len(message.episodes.lengths):
        raise ValueError(
            f"fragment {message.task_id}: {len(message.episodes.returns)} episode returns but "
            f"{len(message.episodes.lengths)} lengths"
        )
    fragment = Fragment(
        data=data,
        episode_returns=tuple(message.episodes.returns),
        episode_lengths=tuple(message.episodes.lengths),
        weight_version=message.weight_version,
        replica=replica,
    )
    if message.env_steps and message.env_steps != fragment.env_steps:
        raise ValueError(
            f"fragment {message.task_id}: says {message.env_steps} env steps, "
            f"its batch holds {fragment.env_steps}"
        )
    return fragment


def episodes_only(
    returns: tuple[float, ...],
    lengths: tuple[int, ...],
    *,
    task_id: str,
    worker_id: str,
    epoch: int,
    version: int,
) -> pb.Fragment:
    """An evaluation task's result: episode statistics and no trajectories."""
    return pb.Fragment(
        task_id=task_id,
        worker_id=worker_id,
        weight_version=version,
        epoch=epoch,
        episodes=pb.EpisodeStats(returns=list(returns), lengths=list(lengths)),
    )
