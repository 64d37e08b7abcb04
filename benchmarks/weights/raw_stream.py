"""The bare streams the weights benchmarks compare rlkube's fetch with: servers and receivers.

No framing, no checks. Over gRPC the server sends the flat bytes as ``DEFAULT_CHUNK_BYTES``
messages (one copy each, as rlkube's server makes) and a receiver reads them to the end,
discarding them or copying each into one buffer (the least a gRPC receiver that keeps the bytes
does). Over plain TCP the server writes the buffer to the socket and the receiver reads it with
``recv_into`` straight into its buffer: the kernel's copy and no other, the floor of any
transport over a socket (``digest=True`` adds xxh3 of every chunk in place, rlkube's check).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
from rlkube.weights.copies import checksum
from rlkube.weights.wire import CHANNEL_OPTIONS, DEFAULT_CHUNK_BYTES, SERVER_OPTIONS

SERVICE, METHOD = "bench.Raw", "Stream"


def serve_raw_stream(data: memoryview) -> tuple[grpc.Server, int]:
    """A started server streaming ``data`` to every caller; returns it and its port on 127.0.0.1."""

    def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for offset in range(0, len(data), DEFAULT_CHUNK_BYTES):
            yield bytes(data[offset : offset + DEFAULT_CHUNK_BYTES])

    server = grpc.server(futures.ThreadPoolExecutor(16), options=list(SERVER_OPTIONS))
    handler = grpc.unary_stream_rpc_method_handler(stream)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


class RawStreamReceiver:
    """One channel to a raw stream server; :meth:`receive` reads the whole stream once."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=list(CHANNEL_OPTIONS))
        self._call: Any = self.channel.unary_stream(
            f"/{SERVICE}/{METHOD}", request_serializer=None, response_deserializer=None
        )

    def receive(self, landing: np.ndarray | None = None) -> int:
        """Read the stream to its end, copying each message into ``landing`` if given; bytes received."""
        received = 0
        for message in self._call(b"", timeout=300):
            if landing is not None:
                landing[received : received + len(message)] = np.frombuffer(message, dtype=np.uint8)
            received += len(message)
        return received

    def close(self) -> None:
        self.channel.close()


class RawTcpServer:
    """A listening socket on 127.0.0.1 that writes all of ``data`` for every byte a client sends."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._serving: list[tuple[socket.socket, threading.Thread]] = []
        self._accepting = threading.Thread(target=self._accept, name="raw-tcp", daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # shut down: the benchmark is over
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._serving.append((conn, thread))
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                while conn.recv(1):
                    conn.sendall(self.data)
            except OSError:  # the client went away, or close() shut the connection
                return

    def close(self) -> None:
        """Stop accepting and end every connection: the port is free once this returns.

        (An accepted socket holds the listener's port too, so each one is shut down and its
        thread joined; shutdown also wakes the blocked accept.)
        """
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._accepting.join(timeout=5.0)
        for conn, thread in self._serving:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            thread.join(timeout=5.0)
        self._serving.clear()


class RawTcpReceiver:
    """One connection to a :class:`RawTcpServer`; :meth:`receive` reads one whole copy into a buffer."""

    def __init__(self, address: str, total_bytes: int) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.total = total_bytes

    def receive(self, landing: np.ndarray, *, digest: bool = False) -> int:
        """Ask for the bytes and read them into ``landing``; ``digest``: xxh3 each chunk once landed."""
        view = memoryview(landing.data).cast("B")[: self.total]
        self.sock.sendall(b"!")
        received = hashed = 0
        while received < self.total:
            got = self.sock.recv_into(view[received : received + DEFAULT_CHUNK_BYTES])
            if not got:
                raise ConnectionError(f"the raw TCP stream ended after {received} of {self.total} bytes")
            received += got
            while (
                digest
                and hashed < received
                and (received - hashed >= DEFAULT_CHUNK_BYTES or received == self.total)
            ):
                end = min(hashed + DEFAULT_CHUNK_BYTES, received)
                checksum(view[hashed:end])
                hashed = end
        return received

    def close(self) -> None:
        self.sock.close()
