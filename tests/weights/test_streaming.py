"""Streaming while packing: remote receivers fetch chunk k as soon as the trainer packed and hashed it.

Packing is held on an event before the last chunk (the publisher's ``pack_gate``), so every
assertion below happens while the version is provably not packed yet.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from rlkube.weights.client import FetchResult, WeightStoreClient
from rlkube.weights.copies import buffer_checksum
from rlkube.weights.errors import FetchError
from rlkube.weights.publisher import PublisherConfig, WeightPublisher, chunk_pieces
from rlkube.weights.receiver import NodeReceiver, ReceiverConfig
from rlkube.weights.shm_reader import ShmReader
from rlkube.weights.version import WeightVersion

from tests.weights.conftest import Helper
from tests.weights.pack_gate import Gate

GRID = 4096


def state(value: float) -> dict[str, dict[str, torch.Tensor]]:
    """Several chunks on a 4 KiB grid; one tensor spans chunks, small ones share them."""
    return {
        "net": {"w": torch.full((64, 64), value), "b": torch.full((64,), value)},
        "head": {"w": torch.full((16, 64), value, dtype=torch.bfloat16)},
    }


class Arrivals(dict[int, int]):
    """``digests`` for fetch_into: sets ``first`` when the chunk at offset 0 arrived (verified)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = threading.Event()

    def __setitem__(self, offset: int, digest: int) -> None:
        super().__setitem__(offset, digest)
        if offset == 0:
            self.first.set()


@pytest.fixture
def publisher(shm_dir: Path) -> Iterator[WeightPublisher]:
    config = PublisherConfig(
        shm_dir=shm_dir / "train", listen="127.0.0.1:0", chunk_bytes=GRID, pack_threads=1, incarnation="inc"
    )
    with WeightPublisher(config) as pub:
        yield pub


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def watch_while_packing(publisher: WeightPublisher, client: WeightStoreClient) -> Iterator[WeightVersion]:
    """A while_packing watch that is known to be registered: it has received version 1 already."""
    publisher.send(state(1.0), version=1)
    versions = client.watch(after=None, while_packing=True, seconds=60)
    assert next(versions).version == 1
    return versions


def test_a_receiver_gets_chunk_0_before_the_last_chunk_is_packed(
    publisher: WeightPublisher, pool: ThreadPoolExecutor
) -> None:
    gate = publisher.pack_gate = Gate()
    with WeightStoreClient(publisher.address or "").connect() as client:
        versions = watch_while_packing(publisher, client)
        sent: Future[int] = pool.submit(publisher.send, state(2.0), version=2)
        announced = next(versions)
        assert (announced.version, announced.checksum) == (2, 0)  # announced before it is packed
        dst = np.zeros(announced.total_bytes, dtype=np.uint8)
        arrivals = Arrivals()
        fetched: Future[FetchResult] = pool.submit(client.fetch_into, announced, dst, digests=arrivals)
        assert gate.packing_last.wait(30)  # packing is held before the last chunk ...
        assert arrivals.first.wait(30)  # ... and the receiver has chunk 0 already
        assert not sent.done()
        assert not fetched.done()  # the fetch waits for the last chunk
        gate.release()
        assert sent.result(30) == 2
        result = fetched.result(30)
        committed = next(versions)  # announced again once committed, now with its checksum
    assert (committed.version, committed.checksum) == (2, result.root)
    assert result.root == buffer_checksum(dst, GRID) == publisher.latest().checksum
    with ShmReader(publisher.config.shm_dir) as reader, reader.acquire() as snap:
        assert bytes(snap.buffer.numpy()) == dst.tobytes()


def test_an_aborted_publish_ends_its_fetches_without_a_commit(
    publisher: WeightPublisher, pool: ThreadPoolExecutor
) -> None:
    gate = publisher.pack_gate = Gate(fail=True)
    with WeightStoreClient(publisher.address or "").connect() as client:
        versions = watch_while_packing(publisher, client)
        sent = pool.submit(publisher.send, state(2.0), version=2)
        announced = next(versions)
        arrivals = Arrivals()
        dst = np.zeros(announced.total_bytes, dtype=np.uint8)
        fetched = pool.submit(client.fetch_into, announced, dst, digests=arrivals)
        assert arrivals.first.wait(30)
        gate.release()
        with pytest.raises(RuntimeError, match="failed while packing"):
            sent.result(30)
        with pytest.raises(FetchError) as failed:
            fetched.result(30)
    assert failed.value.code == grpc.StatusCode.ABORTED  # type: ignore[attr-defined]
    assert publisher.latest().version == 1


def test_a_node_receiver_never_commits_an_aborted_publish(
    shm_dir: Path, publisher: WeightPublisher, pool: ThreadPoolExecutor
) -> None:
    node = shm_dir / "node"
    receiver = NodeReceiver(ReceiverConfig(shm_dir=node, source=publisher.address or ""))  # driven by hand
    with WeightStoreClient(publisher.address or "").connect() as client:
        versions = watch_while_packing(publisher, client)
        receiver.apply(publisher.latest())
        gate = publisher.pack_gate = Gate(fail=True)
        sent = pool.submit(publisher.send, state(2.0), version=2)
        applied = pool.submit(receiver.apply, next(versions))
        assert gate.packing_last.wait(30)
        assert publisher.board.wait_streamed(("inc", 2), timeout=30)  # it fetches while 2 is packed
        gate.release()
        with pytest.raises(RuntimeError):
            sent.result(30)
        with pytest.raises(FetchError, match="ABORTED"):
            applied.result(30)
        assert receiver.writer.latest().key == ("inc", 1)
        assert receiver.writer.header().publishes == 1  # version 2 was never committed
        with ShmReader(node, verify=True) as reader, reader.acquire() as snap:
            assert snap.key == ("inc", 1)
            assert bool((snap.views["net"]["w"] == 1.0).all())
    receiver.close()


def test_a_trainer_killed_mid_pack_leaves_the_receivers_version_as_it_was(
    shm_dir: Path, helpers: list[Helper], pool: ThreadPoolExecutor
) -> None:
    trainer = Helper("packing-publisher", shm_dir / "train")
    helpers.append(trainer)
    address = trainer.read(timeout=120)["address"]
    node = shm_dir / "node"
    receiver = NodeReceiver(ReceiverConfig(shm_dir=node, source=address, rpc_timeout=10))  # driven by hand
    with WeightStoreClient(address).connect() as client:
        versions = client.watch(after=None, while_packing=True, seconds=60)
        receiver.apply(next(versions))  # version 1, committed
        trainer.send({"send": 2})
        applied = pool.submit(receiver.apply, next(versions))  # version 2, announced while packed
        assert trainer.read()["holding"]  # the fetch streams version 2; its last chunk is not packed
        trainer.kill()
        with pytest.raises(FetchError):
            applied.result(60)
    assert receiver.writer.latest().key == ("inc", 1)
    assert receiver.writer.header().publishes == 1
    with ShmReader(node, verify=True) as reader, reader.acquire() as snap:
        assert snap.key == ("inc", 1)
    receiver.close()
    shutil.rmtree(shm_dir / "train", ignore_errors=True)  # the killed trainer could not clean up


def test_chunk_pieces_cut_every_entry_on_the_grid() -> None:
    from rlkube.weights.layout import layout_of

    layout = layout_of(state(0.0))
    pieces = chunk_pieces(layout, GRID)
    assert len(pieces) == -(-layout.total_bytes // GRID)
    for index, entry in enumerate(layout.entries):
        mine = [(k, lo, hi) for k, chunk in enumerate(pieces) for e, lo, hi in chunk if e == index]
        assert [lo for _, lo, _ in mine] == [0, *[hi for _, _, hi in mine[:-1]]]
        assert mine[-1][2] == entry.nbytes
        assert all(
            k * GRID <= entry.offset + lo and entry.offset + hi <= (k + 1) * GRID for k, lo, hi in mine
        )
