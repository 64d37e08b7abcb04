"""The WeightStore gRPC service: serves committed versions straight from the trainer's shm slots.

I/O (gRPC server threads). Every train rank runs one (:class:`WeightPublisher` starts it), so
a Sharded receiver can fetch byte ranges from several ranks at once. :func:`weight_store_handler`
returns the handler alone, for a coordinator that wants WeightStore on its own server
(:class:`PendingWeightStore` when that server starts before the publisher exists).

* ``GetLayout(digest)``: the layout of a version still held (empty digest: the newest).
* ``WatchWeights(after)``: a server stream of versions newer than ``after`` (a different
  incarnation is always newer). Each stream ends after ``watch_seconds``; clients reconnect,
  so that no call lives without a deadline and server threads are recycled.
* ``FetchWeights(version, range)``: the range's bytes as chunks read from the pinned slot. A
  fetch of a version whose slot the trainer wants back is ABORTED (the client moves on to the
  newest version) instead of holding up the trainer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from rlkube._proto import policy_group_pb2 as pb
from rlkube.metrics import series as metrics
from rlkube.security.credential import Credential, process_credential
from rlkube.security.grpc_auth import listen, make_server
from rlkube.weight_key import WeightKey
from rlkube.weights.copies import checksum, copy_slot_into_message
from rlkube.weights.layout import WeightLayout
from rlkube.weights.shm import PinnedSlot, ShmWriter
from rlkube.weights.wire import (
    DEFAULT_CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    SERVICE,
    WEIGHT_SERVER_OPTIONS,
    abort,
    chunk_framing,
)

logger = logging.getLogger(__name__)

#: How long a peer rank waits for a version it has not committed yet before answering NOT_FOUND.
PEER_WAIT_SECONDS = 2.0


def newer(version: pb.WeightVersion, after: WeightKey | None) -> bool:
    """Whether ``version`` supersedes ``after`` (see :meth:`WeightKey.supersedes`)."""
    return WeightKey(version.incarnation, version.version).supersedes(after)


@dataclass
class ServeStats:
    fetches: int = 0
    bytes: int = 0
    aborted: int = 0


class VersionBoard:
    """What a weight server serves: the newest version, its layout, and the slots of its ShmWriter."""

    def __init__(self, writer: ShmWriter, *, watch_seconds: float = 60.0) -> None:
        self.writer = writer
        self.watch_seconds = watch_seconds
        self._cond = threading.Condition()
        self._latest: pb.WeightVersion | None = None
        self._layouts: dict[str, WeightLayout] = {}
        self._checksums: dict[tuple[str, int, int, int], int] = {}
        self._closed = False
        self.stats = ServeStats()
        self.bytes_by_peer: Counter[str] = Counter()

    def publish(
        self, version: pb.WeightVersion, layout: WeightLayout, digests: list[int] | None = None
    ) -> None:
        """Announce ``version``; ``digests`` are its chunk checksums on the version's grid (served as is)."""
        with self._cond:
            self._layouts[layout.digest] = layout
            if len(self._layouts) > 4:
                keep = {layout.digest} | {s.digest for s in self.writer.header().slots}
                self._layouts = {d: lay for d, lay in self._layouts.items() if d in keep}
            self._checksums = {k: v for k, v in self._checksums.items() if k[1] >= version.version - 1}
            grid, total = version.chunk_bytes, version.total_bytes
            for i, digest in enumerate(digests or []):
                offset = i * grid
                self._checksums[(version.incarnation, version.version, offset, min(grid, total - offset))] = (
                    digest
                )
            self._latest = version
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def latest(self) -> pb.WeightVersion | None:
        with self._cond:
            return self._latest

    def wait_newer(self, after: WeightKey | None, timeout: float) -> pb.WeightVersion | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                if self._latest is not None and newer(self._latest, after):
                    return self._latest
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
        return None

    def layout(self, digest: str) -> WeightLayout | None:
        with self._cond:
            if not digest:
                return self._layouts.get(self._latest.layout_digest) if self._latest is not None else None
            return self._layouts.get(digest)

    def pin(self, incarnation: str, version: int, *, wait: float) -> PinnedSlot | None:
        deadline = time.monotonic() + wait
        while True:
            pinned = self.writer.pin_version(incarnation, version)
            if pinned is not None or time.monotonic() >= deadline:
                return pinned
            with self._cond:
                self._cond.wait(0.05)

    def chunk_checksum(self, key: tuple[str, int, int, int], data: memoryview) -> int:
        """xxh3 of a chunk, once per (incarnation, version, offset, length) however many nodes fetch it."""
        value = self._checksums.get(key)
        if value is None:
            value = self._checksums[key] = checksum(data)
        return value


class _Servicer:
    def __init__(self, board: VersionBoard) -> None:
        self.board = board

    def get_layout(self, request: pb.GetLayoutRequest, context: grpc.ServicerContext) -> pb.WeightLayout:
        layout = self.board.layout(request.layout_digest)
        if layout is None:
            abort(context, grpc.StatusCode.NOT_FOUND, f"no layout {request.layout_digest or '(newest)'} here")
        return layout.to_proto()

    def watch(
        self, request: pb.WatchWeightsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.WeightVersion]:
        after = WeightKey(request.incarnation, request.after_version) if request.incarnation else None
        if after is None and request.after_version:
            after = WeightKey("", request.after_version)
        end = time.monotonic() + self.board.watch_seconds
        while context.is_active() and time.monotonic() < end:
            version = self.board.wait_newer(after, timeout=min(1.0, max(0.0, end - time.monotonic())))
            if version is not None:
                yield version
                after = WeightKey(version.incarnation, version.version)

    def fetch(self, request: pb.FetchWeightsRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        latest = self.board.latest()
        incarnation = request.incarnation or (latest.incarnation if latest is not None else "")
        pinned = self.board.pin(incarnation, request.version, wait=PEER_WAIT_SECONDS)
        if pinned is None:
            newest = f"{latest.incarnation}/{latest.version}" if latest is not None else "none"
            abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"version {incarnation}/{request.version} is not served here (newest: {newest})",
            )
        try:
            meta = pinned.meta
            if request.layout_digest and request.layout_digest != meta.digest:
                abort(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"version {request.version} has layout {meta.digest}, not {request.layout_digest}",
                )
            start = int(request.offset)
            end = meta.length if request.length == 0 else start + int(request.length)
            if start > end or end > meta.length:
                abort(
                    context,
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"range [{start}, {end}) is outside version {request.version} ({meta.length} bytes)",
                )
            step = int(request.chunk_bytes) or DEFAULT_CHUNK_BYTES
            step = max(1, min(step, MAX_MESSAGE_BYTES - (64 << 10)))
            self.board.stats.fetches += 1
            peer = context.peer()
            started = time.perf_counter()
            for offset in range(start, end, step):
                if pinned.superseded:
                    self.board.stats.aborted += 1
                    abort(context, grpc.StatusCode.ABORTED, f"version {request.version} was superseded")
                data = pinned.data[offset : min(offset + step, end)]
                key = (meta.incarnation, meta.version, offset, len(data))
                prefix, suffix = chunk_framing(
                    meta.version, offset, len(data), self.board.chunk_checksum(key, data)
                )
                message = copy_slot_into_message(prefix, data, suffix)
                self.board.stats.bytes += len(data)
                self.board.bytes_by_peer[peer] += len(data)
                metrics.SERVED_BYTES.inc(len(data))
                yield message
            metrics.FETCH_SERVED_SECONDS.observe(time.perf_counter() - started)
        finally:
            pinned.release()


def _identity(message: bytes) -> bytes:
    return message


def weight_store_handler(board: VersionBoard) -> grpc.GenericRpcHandler:
    """The WeightStore service over ``board``, to add to any ``grpc.Server`` built with SERVER_OPTIONS."""
    servicer = _Servicer(board)
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetLayout": grpc.unary_unary_rpc_method_handler(
                servicer.get_layout,
                request_deserializer=pb.GetLayoutRequest.FromString,
                response_serializer=pb.WeightLayout.SerializeToString,
            ),
            "WatchWeights": grpc.unary_stream_rpc_method_handler(
                servicer.watch,
                request_deserializer=pb.WatchWeightsRequest.FromString,
                response_serializer=pb.WeightVersion.SerializeToString,
            ),
            "FetchWeights": grpc.unary_stream_rpc_method_handler(
                servicer.fetch,
                request_deserializer=pb.FetchWeightsRequest.FromString,
                response_serializer=_identity,  # already framed by chunk_framing
            ),
        },
    )


class PendingWeightStore(grpc.GenericRpcHandler):
    """WeightStore on a server that starts before its publisher exists: unanswered until :meth:`serve`.

    Train rank 0's coordinator server answers before the rendezvous (the other ranks ask it
    whether the job is over before they join), its publisher is built from what the rendezvous
    gathers (the peers' addresses, the incarnation), and gRPC takes no handler once a server
    runs. Until ``serve(board)`` a call is answered as by a server without the service.
    """

    def __init__(self) -> None:
        self._handler: grpc.GenericRpcHandler | None = None

    def serve(self, board: VersionBoard) -> None:
        """Answer WeightStore calls from ``board`` (a connected publisher's) from now on."""
        self._handler = weight_store_handler(board)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handler.service(handler_call_details) if self._handler is not None else None


def serve_weight_store(
    board: VersionBoard, address: str, *, max_workers: int = 32, credential: Credential | None = None
) -> tuple[grpc.Server, int]:
    """Start a gRPC server with only WeightStore on ``address`` ("host:port", port 0 picks one).

    Every call is checked against ``credential`` (default: this process's, from the env contract).
    """
    credential = credential if credential is not None else process_credential()
    server = make_server(
        credential, max_workers=max_workers, options=WEIGHT_SERVER_OPTIONS, thread_name_prefix="weight-store"
    )
    server.add_generic_rpc_handlers((weight_store_handler(board),))
    port = listen(server, address, credential)
    server.start()
    return server, port
