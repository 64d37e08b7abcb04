"""The weight data port: a version's bytes over a plain socket, checked as over gRPC, and its edge.

Receivers are driven as the eval side drives them (``NodeReceiver``, ``WeightStoreClient``);
hostile clients speak raw bytes to the port, as anyone on the network could.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from rlkube._proto import policy_group_pb2 as pb
from rlkube.metrics import series as metrics
from rlkube.security.credential import (
    TLS_DIR_ENV,
    TOKEN_FILE_ENV,
    Credential,
    TlsFiles,
    new_token,
    write_token_file,
)
from rlkube.spec import WeightBufferSpec
from rlkube.weights.client import WeightStoreClient
from rlkube.weights.copies import COPIES, buffer_checksum
from rlkube.weights.data_port import DataPortServer
from rlkube.weights.data_wire import (
    FRAME_HEAD,
    MAGIC,
    REQUEST_HEAD,
    WIRE_VERSION,
    FrameKind,
    MalformedRequest,
    decode_frame,
    encode_request,
    frame,
    status_code,
)
from rlkube.weights.errors import IntegrityError
from rlkube.weights.publisher import PublisherConfig, WeightPublisher
from rlkube.weights.receiver import NodeReceiver, ReceiverConfig
from rlkube.weights.shm_reader import ShmReader
from rlkube.weights.version import WeightVersion

from tests.weights.pack_gate import Gate

GRID = 64 << 10


def state(value: float) -> dict[str, dict[str, torch.Tensor]]:
    """~400 KB over several 64 KiB chunks."""
    return {"net": {"w": torch.full((256, 256), value), "b": torch.arange(300, dtype=torch.float32) * value}}


def publisher_config(directory: Path, **overrides: object) -> PublisherConfig:
    base: dict[str, object] = {
        "shm_dir": directory,
        "listen": "127.0.0.1:0",
        "data_listen": "127.0.0.1:0",
        "chunk_bytes": GRID,
        "incarnation": "inc",
    }
    return PublisherConfig(**(base | overrides))  # type: ignore[arg-type]


@pytest.fixture
def publisher(shm_dir: Path) -> Iterator[WeightPublisher]:
    with WeightPublisher(publisher_config(shm_dir / "train")) as pub:
        yield pub


def data_port(publisher: WeightPublisher) -> DataPortServer:
    server = publisher._data_server
    assert server is not None
    return server


def receive(publisher: WeightPublisher, node: Path, **config: object) -> tuple[NodeReceiver, WeightVersion]:
    """A node receiver that applied the publisher's latest version."""
    receiver = NodeReceiver(ReceiverConfig(shm_dir=node, source=publisher.address or "", **config))  # type: ignore[arg-type]
    latest = publisher.latest()
    assert latest is not None
    receiver.apply(latest)
    return receiver, latest


def node_bytes(node: Path) -> bytes:
    with ShmReader(node) as reader, reader.acquire() as snap:
        return bytes(snap.buffer.numpy())


def trainer_bytes(publisher: WeightPublisher) -> bytes:
    with ShmReader(publisher.config.shm_dir) as reader, reader.acquire() as snap:
        return bytes(snap.buffer.numpy())


def fetch_latest(publisher: WeightPublisher, address: str | None = None) -> tuple[bytes, int]:
    """The latest version fetched as an eval node's client does: its bytes, and how many came
    over the data port."""
    latest = publisher.latest()
    assert latest is not None
    with WeightStoreClient(address or publisher.address or "").connect() as client:
        dst = np.zeros(latest.total_bytes, dtype=np.uint8)
        client.fetch_into(latest, dst)
        return dst.tobytes(), client.fetched_over_data_port


# -- the path --------------------------------------------------------------------------------


def test_a_node_receiver_gets_each_version_byte_exact_over_the_socket_with_no_copy_in_python(
    publisher: WeightPublisher, shm_dir: Path
) -> None:
    publisher.send(state(1.0))
    COPIES.reset()
    receiver, latest = receive(publisher, shm_dir / "node")
    try:
        assert node_bytes(shm_dir / "node") == trainer_bytes(publisher)
        copies = COPIES.snapshot()
        # The kernel's copies, counted by the socket functions; gRPC's two copies never happened.
        assert copies["receive_socket_into_slot"][1] == latest.total_bytes
        assert copies["send_slot_to_socket"][1] == latest.total_bytes
        assert "copy_message_into_slot" not in copies
        assert "copy_slot_into_message" not in copies
        assert data_port(publisher).stats.requests == 1
        # The connection is kept: the next version is one more request on it.
        publisher.send(state(2.0))
        receiver.apply(publisher.latest())  # type: ignore[arg-type]
        assert node_bytes(shm_dir / "node") == trainer_bytes(publisher)
        assert data_port(publisher).stats.connections == 1
        assert data_port(publisher).stats.requests == 2
    finally:
        receiver.close()


def test_a_version_streamed_while_packed_arrives_over_the_socket_with_its_commit(
    publisher: WeightPublisher,
) -> None:
    publisher.send(state(1.0), version=1)
    with WeightStoreClient(publisher.address or "").connect() as client:
        versions = client.watch(after=None, while_packing=True, seconds=60)
        assert next(versions).version == 1
        gate = publisher.pack_gate = Gate()  # packing holds before its last chunk until released
        sender = threading.Thread(target=publisher.send, args=(state(3.0),), kwargs={"version": 2})
        sender.start()
        announced = next(versions)
        assert (announced.version, announced.checksum) == (2, 0)  # still being packed
        assert gate.packing_last.wait(30)
        dst = np.zeros(announced.total_bytes, dtype=np.uint8)
        with ThreadPoolExecutor(1) as pool:
            fetched = pool.submit(client.fetch_into, announced, dst)
            gate.release()
            result = fetched.result(30)
        sender.join(30)
        assert client.fetched_over_data_port == announced.total_bytes
    assert result.root == buffer_checksum(dst, GRID) == publisher.latest().checksum  # type: ignore[union-attr]
    assert dst.tobytes() == trainer_bytes(publisher)


def test_transport_grpc_serves_no_data_port_and_every_byte_comes_over_grpc(shm_dir: Path) -> None:
    spec = WeightBufferSpec.model_validate({"transport": "grpc", "chunkBytes": GRID})
    config = PublisherConfig.from_spec(
        spec, shm_dir=shm_dir / "train", listen="127.0.0.1:0", data_listen="127.0.0.1:0"
    )
    assert config.data_listen is None
    with WeightPublisher(config) as publisher:
        publisher.send(state(1.0))
        with WeightStoreClient(publisher.address or "").connect() as client:
            latest = publisher.latest()
            assert latest is not None
            dst = np.zeros(latest.total_bytes, dtype=np.uint8)
            client.fetch_into(latest, dst)
            assert client.data_port() is None
            assert client.fetched_over_data_port == 0
        assert dst.tobytes() == trainer_bytes(publisher)
    default = PublisherConfig.from_spec(
        WeightBufferSpec(), shm_dir=shm_dir, listen="127.0.0.1:0", data_listen="127.0.0.1:0"
    )
    assert default.data_listen == "127.0.0.1:0"  # tcp is the default transport


def test_a_data_port_that_cannot_bind_leaves_the_trainer_serving_over_grpc(
    shm_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with WeightPublisher(publisher_config(shm_dir / "other", data_listen="127.0.0.1:0")):
        assert metrics.TRAIN.get_sample_value("rlkube_weights_data_port_serving") == 1
    with socket.create_server(("127.0.0.1", 0)) as taken:
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        with WeightPublisher(publisher_config(shm_dir / "train", data_listen=busy)) as publisher:
            assert publisher.board.data_port.port == 0
            assert (
                metrics.TRAIN.get_sample_value("rlkube_weights_data_port_serving") == 0
            )  # what the dashboard shows
            publisher.send(state(1.0))
            assert fetch_latest(publisher) == (trainer_bytes(publisher), 0)
    assert f"cannot serve the weight data port on {busy}" in caplog.text


def test_a_receiver_that_cannot_reach_the_data_port_fetches_over_grpc(
    publisher: WeightPublisher, shm_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    publisher.send(state(1.0))
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    publisher.board.data_port = pb.DataPort(port=dead_port)  # what a firewalled port looks like
    assert fetch_latest(publisher) == (trainer_bytes(publisher), 0)
    assert f"127.0.0.1:{dead_port}" in caplog.text
    assert "over gRPC" in caplog.text


def test_sharded_ranges_come_over_every_ranks_data_port(shm_dir: Path) -> None:
    with (
        WeightPublisher(publisher_config(shm_dir / "rank0")) as rank0,
        WeightPublisher(publisher_config(shm_dir / "rank1")) as rank1,
    ):
        rank0.config = publisher_config(shm_dir / "rank0", peers=(rank1.address,))
        for pub in (rank0, rank1):
            pub.send(state(5.0), version=1)
        receiver, _ = receive(rank0, shm_dir / "node", streams=2)
        try:
            assert node_bytes(shm_dir / "node") == trainer_bytes(rank0)
        finally:
            receiver.close()
        for pub in (rank0, rank1):
            assert data_port(pub).stats.requests == 1
            assert all(peer.startswith("tcp:") for peer in pub.board.bytes_by_peer)


# -- a lying server ---------------------------------------------------------------------------


class LyingPort:
    """A data port that answers every request with ``frames`` (raw bytes), then closes."""

    def __init__(self, frames: bytes) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frames = frames
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(self.frames)

    def close(self) -> None:
        self.listener.close()
        self.thread.join(5)


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        ("checksum", "fails its checksum"),
        ("offset", "expected offset 0"),
        ("oversized", "has 1073741824 bytes"),
        ("early end", "truncated"),
    ],
)
def test_a_lying_data_port_never_gets_bytes_past_the_checks(
    publisher: WeightPublisher, lie: str, message: str
) -> None:
    publisher.send(state(1.0))
    latest = publisher.latest()
    assert latest is not None
    payload = b"\x07" * GRID
    frames = {
        "checksum": frame(FrameKind.DATA, version=latest.version, length=GRID, checksum=1) + payload,
        "offset": frame(FrameKind.DATA, version=latest.version, offset=GRID, length=GRID) + payload,
        "oversized": frame(FrameKind.DATA, version=latest.version, length=1 << 30),
        "early end": frame(FrameKind.END, version=latest.version),
    }[lie]
    liar = LyingPort(frames)
    publisher.board.data_port = pb.DataPort(port=liar.port)
    dst = np.zeros(latest.total_bytes + GRID, dtype=np.uint8)  # room past the range: nothing lands there
    try:
        with (
            WeightStoreClient(publisher.address or "").connect() as client,
            pytest.raises(IntegrityError, match=message),
        ):
            client.fetch_into(latest, dst)
    finally:
        liar.close()
    if lie != "checksum":  # a chunk whose head lies is refused before a byte lands
        assert not dst.any()


# -- hostile clients --------------------------------------------------------------------------


def raw_request(
    port: int, data: bytes, *, read: bool = True
) -> tuple[grpc.StatusCode | None, str, socket.socket]:
    """Send ``data`` to the port; the status of an ERROR frame if one comes first, its text, the socket."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(data)
    if not read:
        return None, "", sock
    head = b""
    while len(head) < FRAME_HEAD.size:
        try:
            more = sock.recv(FRAME_HEAD.size - len(head))
        except ConnectionResetError:
            more = b""
        if not more:
            return None, "closed", sock
        head += more
    got = decode_frame(head)
    if got.kind is not FrameKind.ERROR:
        return None, got.kind.name, sock
    text = sock.recv(got.length).decode()
    return status_code(got.offset), text, sock


def fetch_request(latest: WeightVersion) -> bytes:
    return pb.FetchWeightsRequest(
        version=latest.version, incarnation=latest.incarnation, chunk_bytes=GRID
    ).SerializeToString()


@pytest.fixture
def guarded(shm_dir: Path) -> Iterator[tuple[WeightPublisher, DataPortServer, str]]:
    """A publisher whose data port enforces a token (as every pod's does), with a short send timeout."""
    token = new_token()
    with WeightPublisher(publisher_config(shm_dir / "train")) as publisher:
        publisher.send(state(1.0))
        server = DataPortServer(
            publisher.board,
            "127.0.0.1:0",
            credential=Credential.of_token(token),
            max_connections=3,
            head_timeout=1.0,
            send_timeout=1.0,
        ).start()
        try:
            yield publisher, server, token
        finally:
            server.close()


def serves(server: DataPortServer, publisher: WeightPublisher, token: str) -> bool:
    latest = publisher.latest()
    assert latest is not None
    code, kind, sock = raw_request(server.port, encode_request(fetch_request(latest), token))
    sock.close()
    return code is None and kind == "DATA"


def test_a_wrong_or_missing_token_is_refused_and_the_port_then_serves_the_right_one(
    guarded: tuple[WeightPublisher, DataPortServer, str],
) -> None:
    publisher, server, token = guarded
    latest = publisher.latest()
    assert latest is not None
    sent = publisher.board.stats.bytes
    for presented in (token + "x", ""):
        code, text, sock = raw_request(server.port, encode_request(fetch_request(latest), presented))
        assert code is grpc.StatusCode.UNAUTHENTICATED, text
        assert sock.recv(1) == b""  # and the connection is closed
        sock.close()
    assert publisher.board.stats.bytes == sent  # not a byte served
    assert server.stats.unauthenticated == 2
    assert serves(server, publisher, token)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not an rlkube weight data request"),
        (REQUEST_HEAD.pack(MAGIC, WIRE_VERSION, 0xFFFF, 16), "a token of 65535 bytes"),
        (REQUEST_HEAD.pack(MAGIC, WIRE_VERSION, 4, 1 << 30), "a request of 1073741824 bytes"),
        (REQUEST_HEAD.pack(MAGIC, 99, 0, 0), "wire version 99"),
    ],
)
def test_garbage_and_oversized_requests_are_answered_with_an_error_and_the_port_keeps_serving(
    guarded: tuple[WeightPublisher, DataPortServer, str], data: bytes, message: str
) -> None:
    publisher, server, token = guarded
    code, text, sock = raw_request(server.port, data)
    sock.close()
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert message in text
    assert serves(server, publisher, token)


def test_a_request_that_does_not_parse_is_refused(
    guarded: tuple[WeightPublisher, DataPortServer, str],
) -> None:
    publisher, server, token = guarded
    code, text, sock = raw_request(server.port, encode_request(b"\xff\xff\xff", token))
    sock.close()
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    assert "does not parse" in text
    assert serves(server, publisher, token)


def test_a_head_that_never_completes_is_cut(guarded: tuple[WeightPublisher, DataPortServer, str]) -> None:
    publisher, server, token = guarded
    _, _, slow = raw_request(server.port, REQUEST_HEAD.pack(MAGIC, WIRE_VERSION, 8, 0) + b"abc", read=False)
    assert slow.recv(1) == b""  # 5 token bytes never come: cut after head_timeout, not held
    slow.close()
    assert server.stats.cut == 1
    assert serves(server, publisher, token)


def test_a_client_that_never_reads_is_cut_and_its_pin_released(
    guarded: tuple[WeightPublisher, DataPortServer, str],
) -> None:
    publisher, server, token = guarded
    # 32 MB: more than the kernel buffers on both sides hold, so the port's writes block.
    publisher.send({"net": {"w": torch.ones(8 << 20)}})
    latest = publisher.latest()
    assert latest is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(encode_request(fetch_request(latest), token))  # then never reads
    deadline = time.monotonic() + 30
    while server.stats.cut == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.stats.cut == 1  # after send_timeout (1 s here)
    # Its pin went with it: two more versions take both slots back without waiting for a reader.
    publisher.send({"net": {"w": torch.zeros(8 << 20)}})
    publisher.send({"net": {"w": torch.full((8 << 20,), 2.0)}})
    assert publisher.writer.reclaimed == 0
    sock.close()
    assert serves(server, publisher, token)


def test_connections_beyond_the_cap_are_turned_away_until_one_closes(
    guarded: tuple[WeightPublisher, DataPortServer, str],
) -> None:
    publisher, server, token = guarded
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3)]
    deadline = time.monotonic() + 10
    while len(server._connections) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    code, text, extra = raw_request(server.port, b"")
    extra.close()
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, text
    assert server.stats.turned_away == 1
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 10
    while server._connections and time.monotonic() < deadline:
        time.sleep(0.01)
    assert serves(server, publisher, token)


def test_close_ends_idle_connections_and_frees_the_port(shm_dir: Path) -> None:
    with WeightPublisher(publisher_config(shm_dir / "train")) as publisher:
        publisher.send(state(1.0))
        server = data_port(publisher)
        port = server.port
        with WeightStoreClient(publisher.address or "").connect() as client:
            latest = publisher.latest()
            assert latest is not None
            client.fetch_into(latest, np.zeros(latest.total_bytes, dtype=np.uint8))  # a kept connection
    assert server._connections == {}
    with socket.create_server(("127.0.0.1", port)):  # the port is free again
        pass


# -- TLS --------------------------------------------------------------------------------------


def certificates(directory: Path) -> TlsFiles:
    from tests.security.test_credential import _certificates

    return _certificates(directory)


def test_with_the_jobs_certificates_every_byte_travels_over_mutual_tls(
    shm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    certificates(tmp_path)
    token = new_token()
    monkeypatch.setenv(TLS_DIR_ENV, str(tmp_path))  # as a pod of a job with spec.security.tlsSecretName
    monkeypatch.setenv(TOKEN_FILE_ENV, str(write_token_file(tmp_path / "token", token)))
    config = publisher_config(shm_dir / "train", listen="localhost:0", data_listen="localhost:0")
    with WeightPublisher(config) as publisher:
        publisher.send(state(4.0))
        assert publisher.board.data_port.tls
        latest = publisher.latest()
        assert latest is not None
        fetched = fetch_latest(publisher, f"localhost:{publisher.port}")  # the certificate's name
        assert fetched == (trainer_bytes(publisher), latest.total_bytes)
        # A client without a certificate gets no handshake, so not a byte of its request is read.
        sent = publisher.board.stats.bytes
        code, text, sock = raw_request(
            data_port(publisher).port, encode_request(fetch_request(latest), token)
        )
        sock.close()
        assert (code, text) == (None, "closed")
        assert publisher.board.stats.bytes == sent


def test_a_receiver_of_a_tls_port_without_certificates_falls_back_to_grpc(
    publisher: WeightPublisher, shm_dir: Path
) -> None:
    publisher.send(state(1.0))
    publisher.board.data_port = pb.DataPort(port=data_port(publisher).port, tls=True)
    assert fetch_latest(publisher) == (trainer_bytes(publisher), 0)


def test_frames_and_requests_have_fixed_heads() -> None:
    assert REQUEST_HEAD.size == 11
    assert FRAME_HEAD.size == 36
    head = frame(FrameKind.COMMIT, version=3, offset=7, checksum=9)
    assert decode_frame(head) == decode_frame(struct.pack("<B3xQQQQ", 2, 3, 7, 0, 9))
    with pytest.raises(MalformedRequest, match="unknown kind 9"):
        decode_frame(struct.pack("<B3xQQQQ", 9, 0, 0, 0, 0))


def test_a_receiver_learns_the_port_of_a_restarted_rank_again_instead_of_falling_back(
    publisher: WeightPublisher,
) -> None:
    publisher.send(state(1.0))
    first = data_port(publisher)
    with WeightStoreClient(publisher.address or "").connect() as client:
        latest = publisher.latest()
        assert latest is not None
        client.fetch_into(latest, np.zeros(latest.total_bytes, dtype=np.uint8))  # a kept connection
        # The rank's data port goes and comes back elsewhere (locally the kernel picks it anew).
        first.close()
        with DataPortServer(publisher.board, "127.0.0.1:0") as second:
            publisher.board.data_port = second.describe()
            publisher.send(state(2.0))
            latest = publisher.latest()
            assert latest is not None
            dst = np.zeros(latest.total_bytes, dtype=np.uint8)
            client.fetch_into(latest, dst)
            assert second.stats.requests == 1
        assert client.fetched_over_data_port == 2 * latest.total_bytes
    assert dst.tobytes() == trainer_bytes(publisher)
