"""Fragments and TensorDicts <-> protobuf messages (the trajectory plane's wire format).

Pure: no I/O. Tensors travel as ``rlkube.data.wire``'s manifest plus raw bytes (never pickle).
Copies, counted: an eval worker's push (:func:`encode_fragment`) copies each leaf once, straight
into the serialized request; rank 0 reads a large push with :func:`read_push`, which leaves the
payload in the bytes gRPC delivered (protobuf's parse would copy it twice), its tensors view
those bytes (``data.wire.decode``) until the epoch's fragments are stacked for training, and the
journal writes them from there (:func:`fragment_pieces`: no copy). Messages built field by field
(:func:`fragment_to_proto`) cost protobuf's copies on top (three of the payload's size, or more).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import TensorDict

from rlkube._proto import policy_group_pb2 as pb
from rlkube.data import protowire
from rlkube.data.fragment import Fragment
from rlkube.data.protowire import LENGTH_DELIMITED, MalformedMessage, field_header
from rlkube.data.wire import Manifest, Received, TensorMeta, decode, encode, payload_pieces, plan

#: The PolicyGroup service, and the methods whose requests both ends frame themselves (client and server).
SERVICE = pb.DESCRIPTOR.services_by_name["PolicyGroup"].full_name
PUSH_METHOD = f"/{SERVICE}/PushFragment"
PUSH_STREAM_METHOD = f"/{SERVICE}/PushFragments"

_BATCH_FIELD = pb.Fragment.DESCRIPTOR.fields_by_name["batch"].number
_PAYLOAD_FIELD = pb.TensorBatch.DESCRIPTOR.fields_by_name["payload"].number


#: Pushes at least this large are read by :func:`read_push` without protobuf copying the payload.
LARGE_PUSH_BYTES = 1 << 20


@dataclass(frozen=True)
class ReceivedPush:
    """A PushFragment request as rank 0 read it: the message without its batch's payload, and the
    payload as a view of the received bytes (protobuf's parse would copy it twice)."""

    message: pb.Fragment
    payload: memoryview


def read_push(data: bytes, *, large: int = LARGE_PUSH_BYTES) -> pb.Fragment | ReceivedPush:
    """A PushFragment request from the wire; one of ``large`` bytes or more keeps its payload in
    ``data`` (:class:`ReceivedPush`). Means exactly what ``pb.Fragment.FromString(data)`` means
    (concatenated messages merge; the last payload wins), and raises as it does: anything the
    scan below does not take plainly (a group, a malformed varint) is left to protobuf."""
    split = _split_payload(data) if len(data) >= large else None
    if split is None:
        return pb.Fragment.FromString(data)
    header, payload = split
    return ReceivedPush(pb.Fragment.FromString(header), payload)


def _split_payload(data: bytes) -> tuple[bytes, memoryview] | None:
    """(``data`` without the batch payloads, the last payload), or None for protobuf to parse."""
    try:
        header: list[bytes] = []
        payload: tuple[int, int] | None = None
        for field in protowire.fields(data):
            if field.number != _BATCH_FIELD or field.wire_type != LENGTH_DELIMITED:
                header.append(data[field.start : field.end])
                continue
            batch: list[bytes] = []
            for sub in protowire.fields(data, field.value_at, field.end):
                if sub.number == _PAYLOAD_FIELD and sub.wire_type == LENGTH_DELIMITED:
                    payload = (sub.value_at, sub.end)
                else:
                    batch.append(data[sub.start : sub.end])
            body = b"".join(batch)
            header.append(field_header(_BATCH_FIELD, LENGTH_DELIMITED, len(body)) + body)
    except MalformedMessage:
        return None
    if payload is None:
        return None
    return b"".join(header), memoryview(data)[payload[0] : payload[1]]


@dataclass(frozen=True)
class EncodedFragment:
    """A PushFragment request already serialized (:func:`fragment_pieces`, joined), with the
    fields its sender reads; ``data`` parses as a ``pb.Fragment`` (:meth:`message`)."""

    task_id: str
    worker_id: str
    lease_next: bool
    data: bytes

    def message(self) -> pb.Fragment:
        return pb.Fragment.FromString(self.data)


def encode_fragment(
    fragment: Fragment,
    *,
    task_id: str,
    worker_id: str,
    epoch: int,
    rollout_seconds: float = 0.0,
    weight_wait_seconds: float = 0.0,
    lease_next: bool = False,
) -> EncodedFragment:
    """:func:`fragment_to_proto`, serialized, with one copy of each leaf (the join)."""
    pieces = fragment_pieces(
        fragment,
        task_id=task_id,
        worker_id=worker_id,
        epoch=epoch,
        rollout_seconds=rollout_seconds,
        weight_wait_seconds=weight_wait_seconds,
        lease_next=lease_next,
    )
    return EncodedFragment(task_id, worker_id, lease_next, b"".join(pieces))


def fragment_pieces(
    fragment: Fragment,
    *,
    task_id: str,
    worker_id: str,
    epoch: int,
    rollout_seconds: float = 0.0,
    weight_wait_seconds: float = 0.0,
    lease_next: bool = False,
) -> list[bytes | memoryview]:
    """:func:`fragment_to_proto` serialized, as buffers in order: the tensors are viewed, not copied.

    A header (every field; the batch's manifest without its payload), then the batch's payload
    field: concatenated serialized messages parse as one merged message (protobuf's rule; an
    embedded message's fields merge), so the tensors never pass through a message. A fragment that
    came over the wire is written from the bytes its tensors view (nothing encoded anew).
    """
    received = (
        fragment.received if fragment.received is not None and fragment.received.of(fragment.data) else None
    )
    manifest = received.manifest if received is not None else plan(fragment.data)
    header = _fragment_message(
        fragment,
        _manifest_to_proto(manifest),
        task_id=task_id,
        worker_id=worker_id,
        epoch=epoch,
        rollout_seconds=rollout_seconds,
        weight_wait_seconds=weight_wait_seconds,
        lease_next=lease_next,
    ).SerializeToString()
    pieces: list[bytes | memoryview] = [header]
    if manifest.total_bytes:
        payload = field_header(_PAYLOAD_FIELD, LENGTH_DELIMITED, manifest.total_bytes)
        pieces += [
            field_header(_BATCH_FIELD, LENGTH_DELIMITED, len(payload) + manifest.total_bytes),
            payload,
            *(
                [memoryview(received.payload)[: manifest.total_bytes]]
                if received is not None
                else payload_pieces(fragment.data, manifest)
            ),
        ]
    return pieces


def _manifest_to_proto(manifest: Manifest) -> pb.TensorBatch:
    return pb.TensorBatch(
        batch_size=list(manifest.batch_size),
        tensors=[
            pb.TensorMeta(key=m.key, dtype=m.dtype, shape=list(m.shape), offset=m.offset, nbytes=m.nbytes)
            for m in manifest.tensors
        ],
    )


def batch_to_proto(td: TensorDict) -> pb.TensorBatch:
    manifest, payload = encode(td)
    message = _manifest_to_proto(manifest)
    message.payload = bytes(payload)
    return message


def batch_from_proto(message: pb.TensorBatch) -> TensorDict:
    """Decode a TensorBatch; a malformed manifest raises ``data.wire.WireError`` naming the key."""
    return received_batch(message).data  # type: ignore[return-value]


def received_batch(message: pb.TensorBatch, payload: memoryview | None = None) -> Received:
    """:func:`batch_from_proto`, with the manifest and payload its tensors view (``payload``: the
    batch's payload when ``message`` was read without it, :func:`read_push`)."""
    metas = tuple(
        TensorMeta(key=m.key, dtype=m.dtype, shape=tuple(m.shape), offset=m.offset, nbytes=m.nbytes)
        for m in message.tensors
    )
    total = max((m.offset + m.nbytes for m in metas), default=0)
    manifest = Manifest(batch_size=tuple(message.batch_size), tensors=metas, total_bytes=total)
    data = message.payload if payload is None else payload
    return Received(manifest, data, decode(manifest, data))


def fragment_to_proto(
    fragment: Fragment,
    *,
    task_id: str,
    worker_id: str,
    epoch: int,
    rollout_seconds: float = 0.0,
    weight_wait_seconds: float = 0.0,
) -> pb.Fragment:
    return _fragment_message(
        fragment,
        batch_to_proto(fragment.data),
        task_id=task_id,
        worker_id=worker_id,
        epoch=epoch,
        rollout_seconds=rollout_seconds,
        weight_wait_seconds=weight_wait_seconds,
    )


def _fragment_message(
    fragment: Fragment,
    batch: pb.TensorBatch,
    *,
    task_id: str,
    worker_id: str,
    epoch: int,
    rollout_seconds: float,
    weight_wait_seconds: float,
    lease_next: bool = False,
) -> pb.Fragment:
    return pb.Fragment(
        task_id=task_id,
        worker_id=worker_id,
        weight_version=fragment.weight_version,
        epoch=epoch,
        batch=batch,
        episodes=pb.EpisodeStats(
            returns=list(fragment.episode_returns), lengths=list(fragment.episode_lengths)
        ),
        env_steps=fragment.env_steps,
        rollout_seconds=rollout_seconds,
        weight_wait_seconds=weight_wait_seconds,
        lease_next=lease_next,
    )


def fragment_from_proto(pushed: pb.Fragment | ReceivedPush, *, replica: int = 0) -> Fragment:
    """Rebuild a Fragment; raises ValueError (naming what is wrong) for a malformed message."""
    message, payload = (
        (pushed.message, pushed.payload) if isinstance(pushed, ReceivedPush) else (pushed, None)
    )
    received = received_batch(message.batch, payload)
    data = received.data
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
        received=received,
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
