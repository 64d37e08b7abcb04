"""The bare gRPC stream the weights benchmarks compare rlkube's fetch with: server and receiver.

No framing, no checks: the server sends the flat bytes as ``DEFAULT_CHUNK_BYTES`` messages (one
copy each, as rlkube's server makes) and a receiver reads them to the end, discarding them or
copying each into one buffer (the least a receiver that keeps the bytes does).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
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
