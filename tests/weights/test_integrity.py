"""A receiver rejects bad versions with a clear error and leaves the readable version untouched."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import xxhash
from rlkube._proto import policy_group_pb2 as pb
from rlkube.weights.copies import buffer_checksum
from rlkube.weights.errors import FetchError, IntegrityError, StaleVersionError
from rlkube.weights.layout import LayoutError, WeightLayout, layout_of, pack_into_
from rlkube.weights.receiver import NodeReceiver, ReceiverConfig
from rlkube.weights.shm_reader import ShmReader
from rlkube.weights.version import WeightVersion
from rlkube.weights.wire import SERVER_OPTIONS, SERVICE, chunk_framing, decode_chunk

CHUNK = 1024


def packed(value: float) -> tuple[WeightLayout, bytes]:
    sd = {"net": {"w": torch.full((40, 30), value), "b": torch.full((30,), value, dtype=torch.bfloat16)}}
    layout = layout_of(sd)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    pack_into_(buf, sd, layout)
    return layout, buf.numpy().tobytes()


class FakeStore:
    """A WeightStore that serves given bytes, optionally tampered with on the way."""

    def __init__(self) -> None:
        self.layout, self.data = packed(1.0)
        self.tamper = ""
        self.server = grpc.server(futures.ThreadPoolExecutor(4), options=list(SERVER_OPTIONS))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "GetLayout": grpc.unary_unary_rpc_method_handler(
                            self.get_layout,
                            request_deserializer=pb.GetLayoutRequest.FromString,
                            response_serializer=pb.WeightLayout.SerializeToString,
                        ),
                        "FetchWeights": grpc.unary_stream_rpc_method_handler(
                            self.fetch, request_deserializer=pb.FetchWeightsRequest.FromString
                        ),
                    },
                ),
            )
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def version(self, number: int, *, incarnation: str = "inc-1", **changes: Any) -> WeightVersion:
        return WeightVersion(
            **{
                "version": number,
                "layout_digest": self.layout.digest,
                "total_bytes": self.layout.total_bytes,
                "checksum": buffer_checksum(self.data, CHUNK),
                "chunk_bytes": CHUNK,
                "incarnation": incarnation,
                **changes,
            }
        )

    def get_layout(self, request: pb.GetLayoutRequest, context: grpc.ServicerContext) -> pb.WeightLayout:
        msg = self.layout.to_proto()
        if self.tamper == "layout-entries":
            msg.entries[0].shape[0] = 41  # the digest no longer matches the entries
        if self.tamper == "other-layout":
            msg = layout_of({"net": {"w": torch.zeros(2)}}).to_proto()
        return msg

    def fetch(self, request: pb.FetchWeightsRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        end = request.offset + (request.length or len(self.data))
        step = CHUNK // 2 if self.tamper == "half-chunks" else CHUNK
        offsets = list(range(request.offset, end, step))
        if self.tamper == "truncate":
            offsets = offsets[:-1]
        if self.tamper == "gap":
            del offsets[1]
        for i, offset in enumerate(offsets):
            payload = bytearray(self.data[offset : min(offset + step, end)])
            csum = xxhash.xxh3_64_intdigest(bytes(payload))
            if self.tamper == "corrupt" and i == 2:
                payload[7] ^= 0xFF
            version = request.version + (1 if self.tamper == "wrong-version" else 0)
            prefix, suffix = chunk_framing(version, offset, len(payload), csum)
            yield prefix + bytes(payload) + suffix

    def close(self) -> None:
        self.server.stop(0).wait()


@pytest.fixture
def store() -> Iterator[FakeStore]:
    fake = FakeStore()
    yield fake
    fake.close()


@pytest.fixture
def node(shm_dir: Path, store: FakeStore) -> Iterator[tuple[NodeReceiver, ShmReader]]:
    receiver = NodeReceiver(ReceiverConfig(shm_dir=shm_dir, source=store.address))
    receiver.apply(store.version(1))
    reader = ShmReader(shm_dir, verify=True).open()
    yield receiver, reader
    reader.close()
    receiver.close()


def assert_still_serving_version_1(receiver: NodeReceiver, reader: ShmReader) -> None:
    assert receiver.writer.latest().key == ("inc-1", 1)
    with reader.acquire() as snap:
        assert snap.version == 1
        assert bool((snap.views["net"]["w"] == 1.0).all())


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        ("corrupt", r"version inc-1/2 from .*: chunk at offset 2048 \(1024 bytes\) fails its checksum"),
        ("truncate", r"version inc-1/2 from .*: truncated: received \d+ of \d+ bytes"),
        ("gap", r"chunk at offset 2048, expected offset 1024"),
        ("wrong-version", r"received a chunk of version 3"),
        ("half-chunks", r"chunk at offset 0 has 512 bytes; the grid is 1024"),
    ],
)
def test_bad_chunks_are_rejected_and_the_readable_version_stays(
    store: FakeStore, node: tuple[NodeReceiver, ShmReader], tamper: str, message: str
) -> None:
    receiver, reader = node
    store.tamper = tamper
    with pytest.raises(IntegrityError, match=message):
        receiver.apply(store.version(2))
    assert_still_serving_version_1(receiver, reader)
    store.tamper = ""
    receiver.apply(store.version(2))  # the same version fetches fine once the bytes are good
    assert receiver.writer.latest().key == ("inc-1", 2)


def test_a_wrong_total_checksum_is_rejected(store: FakeStore, node: tuple[NodeReceiver, ShmReader]) -> None:
    receiver, reader = node
    with pytest.raises(IntegrityError, match=r"hash to [0-9a-f]{16}, the trainer announced 000000000000002a"):
        receiver.apply(store.version(2, checksum=42))
    assert_still_serving_version_1(receiver, reader)


@pytest.mark.parametrize(
    ("tamper", "changes", "error", "message"),
    [
        ("layout-entries", {}, LayoutError, "layout digest mismatch"),
        ("other-layout", {}, IntegrityError, "asked for layout [0-9a-f]{32}, .* sent [0-9a-f]{32}"),
        ("", {"total_bytes": 12}, IntegrityError, "announces 12 bytes, its layout .* has 4864"),
    ],
)
def test_a_wrong_layout_digest_or_size_is_rejected_before_any_slot_changes(
    store: FakeStore,
    node: tuple[NodeReceiver, ShmReader],
    tamper: str,
    changes: dict,
    error: type,
    message: str,
) -> None:
    receiver, reader = node
    receiver._layouts.clear()
    before = receiver.writer.header().slots
    store.tamper = tamper
    with pytest.raises(error, match=message):
        receiver.apply(store.version(2, **changes))
    assert receiver.writer.header().slots == before
    assert_still_serving_version_1(receiver, reader)


def test_an_old_version_is_rejected_and_a_new_incarnation_is_accepted(
    store: FakeStore, node: tuple[NodeReceiver, ShmReader]
) -> None:
    receiver, reader = node
    receiver.apply(store.version(5))
    before = receiver.writer.header().slots
    for stale in (5, 4):
        with pytest.raises(
            StaleVersionError, match=f"version inc-1/{stale} is not newer than the buffer's inc-1/5"
        ):
            receiver.apply(store.version(stale))
    assert receiver.writer.header().slots == before
    receiver.apply(store.version(1, incarnation="inc-2"))  # train rank 0 restarted and counts from 1
    with reader.acquire() as snap:
        assert snap.key == ("inc-2", 1)


def test_a_server_error_names_the_store_and_status(shm_dir: Path, store: FakeStore) -> None:
    receiver = NodeReceiver(ReceiverConfig(shm_dir=shm_dir, source="127.0.0.1:1", rpc_timeout=2))
    try:
        with pytest.raises(FetchError, match=r"GetLayout\(.*\) from 127.0.0.1:1: UNAVAILABLE"):
            receiver.apply(store.version(1))
    finally:
        receiver.close()


def test_the_hand_framed_chunk_is_the_protobuf_message() -> None:
    prefix, suffix = chunk_framing(7, 1 << 40, 5, 2**64 - 1)
    raw = prefix + b"hello" + suffix
    msg = pb.WeightChunk.FromString(raw)
    assert (msg.version, msg.offset, msg.data, msg.checksum) == (7, 1 << 40, b"hello", 2**64 - 1)
    generated = pb.WeightChunk(checksum=3, data=b"xy", offset=9, version=2).SerializeToString()
    chunk = decode_chunk(generated)
    assert (chunk.version, chunk.offset, bytes(chunk.data), chunk.checksum) == (2, 9, b"xy", 3)
