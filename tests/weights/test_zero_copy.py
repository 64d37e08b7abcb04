"""Zero-copy publish: the trainer trains in the back slot, a publish flips it, the copy comes after.

Driven as the trainer does it: publish once, ``keep_resident`` the policy's own tensors, then
train (after ``wait_writable``) and publish again.
"""

from __future__ import annotations

import itertools
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.engine.trainer import keep_resident, own_tensors
from rlkube.weights.client import WeightStoreClient
from rlkube.weights.copies import COPIES, buffer_checksum
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from rlkube.weights.shm_reader import ShmReader
from rlkube.weights.version import WeightVersion
from rlkube.weights.wire import CHANNEL_OPTIONS, FETCH_METHOD, decode_chunk
from torch import nn

from tests.weights.conftest import Helper
from tests.weights.procs import filled_state_dict
from tests.weights.tiny import TinyPolicy, tiny_policy


def snapshot(state: Any) -> dict[str, dict[str, torch.Tensor]]:
    return {m: {n: t.detach().clone() for n, t in ps.items()} for m, ps in state.items()}


def assert_same(views: Any, expected: Any) -> None:
    for module, params in expected.items():
        for name, tensor in params.items():
            assert torch.equal(views[module][name], tensor), f"{module}.{name} differs"


@pytest.fixture
def trainer() -> TinyPolicy:
    policy = tiny_policy("train", hidden=256)
    policy.init_train()
    return policy


@pytest.fixture
def publisher(shm_dir: Path) -> Iterator[WeightPublisher]:
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, chunk_bytes=4096, slot_wait_timeout=2.0)) as pub:
        yield pub


def publish_and_reside(publisher: WeightPublisher, trainer: TinyPolicy) -> None:
    publisher.send(trainer.get_trainable_parameters(), version=1)
    assert publisher.keep_resident(own_tensors(trainer))
    publisher.wait_writable()


def train_once(publisher: WeightPublisher, trainer: TinyPolicy) -> None:
    publisher.wait_writable()
    trainer.train()


def test_a_reader_attached_to_the_slot_sees_exactly_the_flipped_versions_bytes(
    publisher: WeightPublisher, trainer: TinyPolicy, shm_dir: Path
) -> None:
    publish_and_reside(publisher, trainer)
    for version in (2, 3, 4):
        train_once(publisher, trainer)
        expected = snapshot(trainer.get_trainable_parameters())
        publisher.send(trainer.get_trainable_parameters(), version=version)
        with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
            assert snap.key == (publisher.incarnation, version)
            assert_same(snap.views, expected)
            assert snap.meta.checksum == publisher.latest().checksum
            assert snap.meta.checksum == buffer_checksum(snap.buffer.numpy(), 4096)


def test_the_trainer_keeps_training_after_a_flip_without_touching_the_bytes_readers_read(
    publisher: WeightPublisher, trainer: TinyPolicy, shm_dir: Path
) -> None:
    publish_and_reside(publisher, trainer)
    train_once(publisher, trainer)
    publisher.send(trainer.get_trainable_parameters(), version=2)
    with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
        read = bytes(snap.buffer.numpy())
        for _ in range(3):  # the trainer goes on in the other slot while this reader holds version 2
            train_once(publisher, trainer)
        assert bytes(snap.buffer.numpy()) == read
        moved = trainer.get_trainable_parameters()["actor"]["0.weight"]
        assert not torch.equal(moved, snap.views["actor"]["0.weight"])
        start = snap.buffer.data_ptr()
        assert not start <= moved.data_ptr() < start + snap.buffer.numel()  # not a view of slot 2


def test_a_resident_publish_copies_no_model_bytes_before_the_flip(
    publisher: WeightPublisher, trainer: TinyPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_and_reside(publisher, trainer)
    at_flip: list[dict[str, tuple[int, int]]] = []
    commit = publisher.writer.commit

    def counting_commit(*args: Any, **kwargs: Any) -> Any:
        at_flip.append(COPIES.snapshot())
        return commit(*args, **kwargs)

    monkeypatch.setattr(publisher.writer, "commit", counting_commit)
    train_once(publisher, trainer)
    COPIES.reset()
    publisher.send(trainer.get_trainable_parameters(), version=2)
    model_bytes = publisher.writer.latest().length
    copied = {name: nbytes for name, (_, nbytes) in at_flip[0].items() if name.startswith("copy_")}
    assert copied == {}  # nothing at all copied between "train step done" and the flip
    assert publisher.last_copied_before_flip == 0
    publisher.wait_writable()  # the copy into the next slot happens after the flip
    assert 0 < COPIES.snapshot()["copy_resident_into_slot"][1] <= model_bytes


def test_a_publish_by_copy_counts_the_model_before_the_flip(
    publisher: WeightPublisher, trainer: TinyPolicy
) -> None:
    state = trainer.get_trainable_parameters()
    publisher.send(state, version=1)  # not resident: one copy per tensor, all before the flip
    assert publisher.last_copied_before_flip == sum(
        t.numel() * t.element_size() for p in state.values() for t in p.values()
    )


def test_tied_weights_are_published_by_copy(publisher: WeightPublisher, shm_dir: Path) -> None:
    shared = nn.Parameter(torch.randn(8, 8))
    tensors = {"m": {"a": shared, "b": shared}}
    assert not publisher.keep_resident(tensors)
    publisher.send(tensors, version=1)
    assert publisher.last_copied_before_flip > 0
    with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
        assert torch.equal(snap.views["m"]["b"], shared.detach())


def test_a_state_dict_that_is_not_the_resident_one_is_published_by_copy_and_leaves_the_trainer_alone(
    publisher: WeightPublisher, trainer: TinyPolicy, shm_dir: Path
) -> None:
    publish_and_reside(publisher, trainer)
    train_once(publisher, trainer)
    mine = snapshot(trainer.get_trainable_parameters())
    other = {m: {n: t + 1 if t.is_floating_point() else t for n, t in ps.items()} for m, ps in mine.items()}
    publisher.send(other, version=2)
    assert not publisher.resident
    assert not publisher.keep_resident(own_tensors(trainer))  # by copy from now on
    with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
        assert_same(snap.views, other)
    assert_same(trainer.get_trainable_parameters(), mine)  # its tensors kept their values


def test_the_optimizer_trains_the_moved_parameters(publisher: WeightPublisher, shm_dir: Path) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    publisher.send({"m": model.state_dict()}, version=1)
    assert publisher.keep_resident({"m": model.state_dict(keep_vars=True)})
    for version in (2, 3):
        publisher.wait_writable()
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        expected = snapshot({"m": model.state_dict()})
        publisher.send({"m": model.state_dict()}, version=version)
        with ShmReader(shm_dir, verify=True) as reader, reader.acquire() as snap:
            assert_same(snap.views, expected)


def test_remote_receivers_fetching_while_it_is_hashed_get_the_flipped_version(
    shm_dir: Path, trainer: TinyPolicy
) -> None:
    config = PublisherConfig(
        shm_dir=shm_dir / "train", listen="127.0.0.1:0", chunk_bytes=4096, incarnation="inc"
    )
    with WeightPublisher(config) as publisher, WeightStoreClient(publisher.address or "").connect() as client:
        publish_and_reside(publisher, trainer)
        versions = client.watch(after=None, while_packing=True, seconds=60)
        assert next(versions).version == 1
        with ThreadPoolExecutor(2) as pool:
            train_once(publisher, trainer)
            expected = snapshot(trainer.get_trainable_parameters())
            sent = pool.submit(publisher.send, trainer.get_trainable_parameters(), version=2)
            announced = next(versions)
            dst = np.zeros(announced.total_bytes, dtype=np.uint8)
            result = client.fetch_into(announced, dst, digests={})
            assert sent.result(30) == 2
        assert publisher.last_copied_before_flip == 0
        assert result.root == buffer_checksum(dst, 4096) == publisher.latest().checksum
        with ShmReader(shm_dir / "train", verify=True) as reader, reader.acquire() as snap:
            assert bytes(snap.buffer.numpy()) == dst.tobytes()
            assert_same(snap.views, expected)


def test_readers_racing_a_resident_trainer_never_see_a_torn_or_mixed_version(
    shm_dir: Path, helpers: list[Helper]
) -> None:
    flips, lockstep = 400, 30
    state = filled_state_dict(1.0)
    with WeightPublisher(PublisherConfig(shm_dir=shm_dir, chunk_bytes=4096)) as publisher:
        publisher.send(state, version=1)
        assert publisher.keep_resident(state)
        helpers.extend(Helper("reader-loop", shm_dir, flips, lockstep) for _ in range(2))
        for helper in helpers:
            assert helper.read()["ready"]

        def train_and_publish(version: int) -> None:
            publisher.wait_writable()
            for params in state.values():
                for tensor in params.values():
                    tensor.fill_(version)  # the step writes the next version in place, in the slot
            publisher.send(state, version=version)
            assert publisher.last_copied_before_flip == 0

        for version in range(2, lockstep + 2):  # readers hold the newest while the next is trained
            for helper in helpers:
                helper.send({"pin": True})
            for helper in helpers:
                assert helper.read()["pinned"] == version - 1
            train_and_publish(version)
            for helper in helpers:
                helper.send({"check": True})
        for version in range(lockstep + 2, flips + 1):
            train_and_publish(version)
        results = [helper.read(timeout=120) for helper in helpers]
        for helper in helpers:
            assert helper.wait() == 0
    for result in results:
        assert result["problems"] == []
        assert result["versions"] > lockstep


def test_a_trainer_killed_while_training_in_the_slot_leaves_the_last_committed_version(
    shm_dir: Path, helpers: list[Helper]
) -> None:
    trainer = Helper("resident-trainer", shm_dir)
    helpers.append(trainer)
    assert trainer.read(timeout=120)["training"]  # version 1 committed, training in the other slot
    trainer.kill()
    with ShmReader(shm_dir, verify=True) as reader:
        with reader.acquire() as snap:
            assert snap.key == ("inc", 1)
            assert bool((snap.views["body"]["w"] == 1.0).all())
        with WeightPublisher(PublisherConfig(shm_dir=shm_dir, incarnation="inc2")) as publisher:
            assert publisher.writer.latest().key == ("inc", 1)  # the WRITING slot was never committed
            assert publisher.send({"net": {"w": torch.zeros(3)}}) == 1
    shutil.rmtree(shm_dir, ignore_errors=True)


class CopyingPolicy(TinyPolicy):
    """A user policy whose get_trainable_parameters hands out copies, not its tensors."""

    def get_trainable_parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        return snapshot(super().get_trainable_parameters())


def test_the_trainer_keeps_a_base_policys_tensors_resident_but_not_a_policy_that_returns_copies(
    publisher: WeightPublisher, trainer: TinyPolicy
) -> None:
    publisher.send(trainer.get_trainable_parameters(), version=1)
    keep_resident(publisher, trainer)
    assert publisher.resident
    publisher.close()
    assert not publisher.resident  # closing hands the tensors private memory again

    copying = CopyingPolicy(trainer.config, "train")
    copying.init_train()
    with WeightPublisher(PublisherConfig(shm_dir=publisher.config.shm_dir)) as other:
        other.send(copying.get_trainable_parameters(), version=1)
        keep_resident(other, copying)
        assert not other.resident
        other.send(copying.get_trainable_parameters(), version=2)
        assert other.last_copied_before_flip > 0


class WatchedDefer:
    """Wraps ``board.wait_streams_done``: events when the move starts waiting and when it stops."""

    def __init__(self, publisher: WeightPublisher, monkeypatch: pytest.MonkeyPatch) -> None:
        self.waiting, self.returned = threading.Event(), threading.Event()
        self.result: bool | None = None
        original = publisher.board.wait_streams_done

        def wrapped(*args: Any, **kwargs: Any) -> bool:
            self.waiting.set()
            self.result = original(*args, **kwargs)
            self.returned.set()
            return self.result

        monkeypatch.setattr(publisher.board, "wait_streams_done", wrapped)


def fetch_stream(address: str, announced: WeightVersion) -> Iterator[bytes]:
    """A remote receiver's fetch of ``announced`` as raw messages, read only as far as the test reads."""
    # No window growth: a stream the test does not read holds the server back after 64 KiB.
    window = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 64 << 10)]
    channel = grpc.insecure_channel(address, options=[*CHANNEL_OPTIONS, *window])
    call = channel.unary_stream(
        FETCH_METHOD, request_serializer=pb.FetchWeightsRequest.SerializeToString, response_deserializer=None
    )
    request = pb.FetchWeightsRequest(
        version=announced.version,
        layout_digest=announced.layout_digest,
        chunk_bytes=announced.chunk_bytes,
        incarnation=announced.incarnation,
        while_packing=True,
    )
    try:
        yield from call(request, timeout=60)
    finally:
        channel.close()


def land(messages: Iterator[bytes], dst: np.ndarray) -> int:
    """Copy every data chunk of ``messages`` into ``dst``; returns the commit chunk's root."""
    root = 0
    for message in messages:
        chunk = decode_chunk(message)
        if len(chunk.data):
            dst[chunk.offset : chunk.offset + len(chunk.data)] = np.frombuffer(chunk.data, dtype=np.uint8)
        else:
            root = chunk.checksum
    return root


#: The next tests hold a remote fetch open by not reading it: the version must be far larger than
#: what gRPC's flow control lets the server push ahead (~34 MB, against a 64 KiB stream window).
LARGE_HIDDEN = 500_000
GRID = 1 << 20


@pytest.fixture
def large_trainer() -> TinyPolicy:
    policy = tiny_policy("train", hidden=LARGE_HIDDEN)
    policy.init_train()
    return policy


@pytest.fixture
def serving(shm_dir: Path, large_trainer: TinyPolicy) -> Iterator[tuple[WeightPublisher, WeightStoreClient]]:
    config = PublisherConfig(shm_dir=shm_dir / "train", listen="127.0.0.1:0", chunk_bytes=GRID)
    with WeightPublisher(config) as publisher, WeightStoreClient(publisher.address or "").connect() as client:
        publish_and_reside(publisher, large_trainer)
        yield publisher, client


@pytest.fixture
def streamed_publish(
    serving: tuple[WeightPublisher, WeightStoreClient],
    large_trainer: TinyPolicy,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[WeightPublisher, WatchedDefer, Iterator[bytes], WeightVersion]:
    """Version 2, sent while a remote fetch streams it; that fetch has read one chunk and waits,
    and the move after the flip is waiting for it."""
    publisher, client = serving
    defer = WatchedDefer(publisher, monkeypatch)
    versions = client.watch(after=None, while_packing=True, seconds=60)
    assert next(versions).version == 1  # the watch is live: the next publish streams while packed
    joined = threading.Event()
    publisher.pack_gate = lambda index, _: index == 0 or joined.wait(10)  # the fetch joins first
    train_once(publisher, large_trainer)
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(publisher.send, large_trainer.get_trainable_parameters(), version=2)
        announced = next(versions)
        stream = fetch_stream(publisher.address or "", announced)
        first = next(stream)  # chunk 0: the fetch streams the version while it is packed
        joined.set()
        assert sent.result(30) == 2
    assert defer.waiting.wait(10)
    return publisher, defer, itertools.chain([first], stream), announced


def test_the_move_after_a_flip_waits_until_remote_fetches_of_that_version_end(
    streamed_publish: tuple[WeightPublisher, WatchedDefer, Iterator[bytes], WeightVersion],
) -> None:
    publisher, defer, stream, announced = streamed_publish
    moved_before = COPIES.snapshot().get("copy_resident_into_slot", (0, 0))[1]
    dst = np.zeros(announced.total_bytes, dtype=np.uint8)
    root = land(stream, dst)  # the rest of the fetch, then the stream ends
    assert defer.returned.wait(10)
    assert defer.result is True  # it waited for the fetch, not for a timeout or the trainer
    publisher.wait_writable()
    assert COPIES.snapshot()["copy_resident_into_slot"][1] > moved_before  # it moved after the fetch
    assert (publisher.moves_deferred, publisher.moves_hurried) == (1, 0)
    assert root == buffer_checksum(dst, GRID) == publisher.latest().checksum


def test_a_trainer_that_needs_its_tensors_does_not_wait_for_a_slow_remote_fetch(
    streamed_publish: tuple[WeightPublisher, WatchedDefer, Iterator[bytes], WeightVersion],
    large_trainer: TinyPolicy,
) -> None:
    publisher, defer, stream, announced = streamed_publish
    expected = snapshot(large_trainer.get_trainable_parameters())
    publisher.wait_writable()  # the fetch still waits for its second chunk
    assert defer.result is False
    assert (publisher.moves_deferred, publisher.moves_hurried) == (1, 1)
    large_trainer.train()  # the trainer writes its tensors, now in the other slot
    dst = np.zeros(announced.total_bytes, dtype=np.uint8)
    root = land(stream, dst)
    # The slow fetch still gets version 2 intact: its slot stayed pinned while it streamed.
    assert root == buffer_checksum(dst, GRID) == publisher.latest().checksum
    with ShmReader(publisher.config.shm_dir, verify=True) as reader, reader.acquire() as snap:
        assert snap.version == 2
        assert bytes(snap.buffer.numpy()) == dst.tobytes()
        assert_same(snap.views, expected)
