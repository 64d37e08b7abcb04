"""An eval worker's push is serialized with one copy of its tensors, and means exactly the message.

``encode_fragment`` writes a header and then the payload field (concatenated protobuf messages
merge), so these tests hold it to the message built field by field, byte for byte in meaning,
and drive it through the real server: acknowledged, equal on arrival, and refused like any other
when its contents are bad. Rank 0's journal writes the same pieces from the received bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.coordinator.journal import AckJournal
from rlkube.coordinator.wire import EncodedFragment, encode_fragment, fragment_from_proto, fragment_to_proto
from rlkube.data.fragment import Fragment
from tensordict import TensorDict

from tests.security.live import LiveJob, arrivals, code_of, live_job, register, trajectories


@pytest.fixture
def live() -> Iterator[LiveJob]:
    yield from live_job()


def every_kind_of_leaf() -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(5, 3, 4).transpose(0, 1),  # not contiguous
            "action": torch.randint(0, 7, (3, 5)),
            "terminated": torch.rand(3, 5) > 0.5,
            "log_prob": torch.randn(3, 5).to(torch.bfloat16),
            "value": torch.randn(3, 5).half(),
            "pixels": torch.randint(0, 255, (3, 5, 2, 7, 7), dtype=torch.uint8),  # odd sizes: padding
            "next": {"observation": torch.randn(3, 5, 4), "empty": torch.zeros(3, 5, 0)},
        },
        batch_size=[3, 5],
    )


def encode(fragment: Fragment, **fields: object) -> EncodedFragment:
    return encode_fragment(fragment, task_id="t-1", worker_id="w#1", epoch=3, **fields)  # type: ignore[arg-type]


def test_an_encoded_push_parses_as_the_message_built_field_by_field() -> None:
    fragment = Fragment(
        data=every_kind_of_leaf(), episode_returns=(1.5, -2.0), episode_lengths=(4, 9), weight_version=7
    )
    encoded = encode(fragment, rollout_seconds=0.25, weight_wait_seconds=0.5, lease_next=True)
    built = fragment_to_proto(
        fragment, task_id="t-1", worker_id="w#1", epoch=3, rollout_seconds=0.25, weight_wait_seconds=0.5
    )
    built.lease_next = True
    assert encoded.message() == built
    back = fragment_from_proto(encoded.message())
    for key in fragment.data.keys(True, True):
        assert back.data[key].dtype == fragment.data[key].dtype, key
        assert torch.equal(back.data[key], fragment.data[key]), key


def test_a_fragment_without_bytes_still_names_its_tensors() -> None:
    fragment = Fragment(data=TensorDict({"observation": torch.zeros(2, 0, 4)}, batch_size=[2, 0]))
    message = encode(fragment).message()
    assert [m.key for m in message.batch.tensors] == ["observation"]
    assert message.batch.payload == b""


def test_an_encoded_push_is_acknowledged_and_arrives_equal(live: LiveJob) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    arrived = arrivals(live)
    sent = trajectories()
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        task = client.lease(worker_id, wait_seconds=1.0)
        push = encode_fragment(
            Fragment(data=sent), task_id=task.task_id, worker_id=worker_id, epoch=task.epoch
        )
        assert client.push(push, retry_for=0).accepted
        assert client.push(push, retry_for=0).duplicate  # a retry of the same bytes
    assert live.coordinator.progress.fragments == 1
    assert len(arrived) == 1
    received = arrived[0].data
    for key in sent.keys(True, True):
        assert torch.equal(received[key], sent[key]), key


def test_an_encoded_push_with_bad_numbers_is_refused_like_a_message(live: LiveJob) -> None:
    live.coordinator.open_epoch(epoch=1, version=0)
    poisoned = trajectories()
    poisoned["observation"][0, 0, 0] = math.nan
    with live.client() as client:
        worker_id = register(client, "cartpole-eval-0")
        task = client.lease(worker_id, wait_seconds=1.0)
        push = encode_fragment(
            Fragment(data=poisoned), task_id=task.task_id, worker_id=worker_id, epoch=task.epoch
        )
        assert code_of(lambda: client.push(push, retry_for=0)) == grpc.StatusCode.INVALID_ARGUMENT
        assert client.lease(worker_id, wait_seconds=1.0).kind == pb.Task.COLLECT  # requeued
    assert live.coordinator.progress.fragments == 0


def test_a_journal_entry_is_whole_when_the_disk_takes_a_few_bytes_per_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_writev = os.writev
    monkeypatch.setattr(os, "writev", lambda fd, buffers: real_writev(fd, [memoryview(buffers[0])[:7]]))
    fragment = Fragment(
        data=every_kind_of_leaf(), episode_returns=(3.0,), episode_lengths=(5,), weight_version=2
    )
    journal = AckJournal(tmp_path, incarnation="inc").open()
    journal.record(epoch=4, fragment=fragment, key="task-1.0", worker="cartpole-eval-0")
    monkeypatch.undo()
    [(_, back)] = AckJournal(tmp_path, incarnation="next").open().replay(epoch=4)
    assert back.episode_returns == (3.0,)
    assert back.weight_version == 2
    for key in fragment.data.keys(True, True):
        assert torch.equal(back.data[key], fragment.data[key]), key
