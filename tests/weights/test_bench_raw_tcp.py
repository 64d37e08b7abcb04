"""The raw TCP peer of ``rlkube bench transport`` lands exactly the bytes served, again and again."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest
from rlkube.weights.wire import DEFAULT_CHUNK_BYTES

from benchmarks.weights.raw_stream import RawTcpReceiver, RawTcpServer


@pytest.mark.parametrize("digest", [False, True])
def test_every_receive_over_one_connection_lands_the_whole_buffer(digest: bool) -> None:
    total = 2 * DEFAULT_CHUNK_BYTES + 12_345  # a last chunk shorter than the grid
    served = np.random.default_rng(7).integers(0, 256, total, dtype=np.uint8)
    server = RawTcpServer(memoryview(served.data))
    receiver = RawTcpReceiver(f"127.0.0.1:{server.port}", total)
    try:
        for _ in range(3):
            landing = np.zeros(total, dtype=np.uint8)
            assert receiver.receive(landing, digest=digest) == total
            assert np.array_equal(landing, served)
    finally:
        receiver.close()
        server.close()
    with socket.socket() as probe:  # closed means closed: the port is free again
        probe.bind(("127.0.0.1", server.port))


def test_a_stream_cut_short_is_an_error_naming_how_much_arrived() -> None:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve_part() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1)
            conn.sendall(b"x" * 1000)  # then hangs up

    server = threading.Thread(target=serve_part)
    server.start()
    receiver = RawTcpReceiver(f"127.0.0.1:{listener.getsockname()[1]}", 5000)
    try:
        with pytest.raises(ConnectionError, match="after 1000 of 5000 bytes"):
            receiver.receive(np.zeros(5000, dtype=np.uint8))
    finally:
        receiver.close()
        server.join()
        listener.close()
