"""Rank 0 reads a large push without protobuf copying its payload, and means exactly what
protobuf's parse means: the same message, the same payload, the same refusals of bad bytes."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.wire import (
    ReceivedPush,
    encode_fragment,
    fragment_from_proto,
    fragment_to_proto,
    read_push,
)
from rlkube.data.fragment import Fragment

from tests.coordinator.test_encoded_fragment import every_kind_of_leaf
from tests.security.live import LiveJob, arrivals, live_job, register, trajectories


@pytest.fixture
def live() -> Iterator[LiveJob]:
    yield from live_job()


def as_protobuf_reads_it(read: pb.Fragment | ReceivedPush) -> pb.Fragment:
    if isinstance(read, pb.Fragment):
        return read
    message = pb.Fragment()
    message.CopyFrom(read.message)
    message.batch.payload = bytes(read.payload)
    return message


def pushes() -> list[bytes]:
    fragment = Fragment(
        data=every_kind_of_leaf(), episode_returns=(1.0,), episode_lengths=(3,), weight_version=2
    )
    encoded = encode_fragment(fragment, task_id="t-1", worker_id="w#1", epoch=3, lease_next=True).data
    built = fragment_to_proto(fragment, task_id="t-1", worker_id="w#1", epoch=3).SerializeToString()
    later = fragment_to_proto(
        Fragment(data=every_kind_of_leaf()), task_id="t-2", worker_id="w#2", epoch=4
    ).SerializeToString()
    no_payload = pb.Fragment(task_id="t-3", batch=pb.TensorBatch(batch_size=[3, 5])).SerializeToString()
    return [encoded, built, encoded + later, later + no_payload, b"", no_payload]


@pytest.mark.parametrize("index", range(6))
def test_a_push_read_without_copying_its_payload_is_the_message_protobuf_reads(index: int) -> None:
    data = pushes()[index]
    read = read_push(data, large=0)
    expected = pb.Fragment.FromString(data)
    assert as_protobuf_reads_it(read) == expected
    if expected.batch.payload:
        assert isinstance(read, ReceivedPush)  # the payload stayed in ``data``
        assert read.payload.obj is data
    if index < 2:  # (the merged ones repeat batch_size: neither decodes, as protobuf means it)
        back, direct = fragment_from_proto(read), fragment_from_proto(expected)
        for key in direct.data.keys(True, True):
            assert torch.equal(back.data[key], direct.data[key]), key


def test_damaged_bytes_are_refused_or_read_exactly_as_protobuf_does() -> None:
    rng = random.Random(7)
    whole = pushes()[0]
    cases = [whole[:cut] for cut in range(0, len(whole), 7)]
    for _ in range(300):
        damaged = bytearray(whole)
        for _ in range(rng.randint(1, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cases.append(bytes(damaged))
    for data in cases:
        try:
            expected = pb.Fragment.FromString(data)
        except Exception:
            expected = None
        try:
            read = as_protobuf_reads_it(read_push(data, large=0))
        except Exception:
            read = None
        assert read == expected


def test_a_large_push_arrives_viewing_the_received_bytes(live: LiveJob) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    arrived = arrivals(live)
    sent = trajectories()
    sent["frames"] = torch.randint(0, 255, (*sent.batch_size, 200_000), dtype=torch.uint8)  # 1.6 MB
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        task = client.lease(worker_id, wait_seconds=1.0)
        push = encode_fragment(
            Fragment(data=sent), task_id=task.task_id, worker_id=worker_id, epoch=task.epoch
        )
        assert client.push(push, retry_for=0).accepted
    [fragment] = arrived
    assert fragment.received is not None
    assert isinstance(fragment.received.payload, memoryview)  # read by read_push: not copied
    for key in sent.keys(True, True):
        assert torch.equal(fragment.data[key], sent[key]), key
