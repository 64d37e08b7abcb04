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

Streaming while packing (``while_packing`` on both calls): when remote receivers watch, the
publisher opens a version on the board (:meth:`VersionBoard.open`) before packing it, announces
it at once with checksum 0, and marks each chunk ready (:meth:`VersionBoard.chunk_ready`) as soon as it is
packed and hashed. A fetch of chunk k waits on the board's condition for chunk k (no polling),
reading it from the slot being packed, which only the publisher writes and only before the
chunk is ready. The fetch ends with a commit chunk (no data, the version's root as its
checksum), sent only once the version is committed; a publish that fails mid-pack is
aborted (:meth:`VersionBoard.abort`) and its fetches end ABORTED, so a receiver never commits it.
Fetches still reading at the commit are covered by the slot's shared pin
(:meth:`ShmWriter.commit_pinned`), held by the board until the last of them ends.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
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
from rlkube.weights.version import WeightVersion
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


def newer(version: WeightVersion, after: WeightKey | None) -> bool:
    """Whether ``version`` supersedes ``after`` (see :meth:`WeightKey.supersedes`)."""
    return version.supersedes(after)


class VersionAborted(Exception):
    """A version being packed was aborted (or the board closed): its fetches end ABORTED."""


@dataclass(eq=False)
class PackingVersion:
    """A version announced while its publisher packs it (see the module docstring)."""

    announcement: WeightVersion  # checksum 0: pending
    data: memoryview  # the slot being packed
    digests: list[int | None]  # chunk k's digest once it is packed and hashed
    state: str = "packing"  # packing | committed | aborted
    root: int = 0
    streams: int = 0  # fetches reading it
    pinned: PinnedSlot | None = None  # the committed slot, pinned while streams remain

    @property
    def key(self) -> WeightKey:
        return self.announcement.key


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
        self._latest: WeightVersion | None = None
        self._layouts: dict[str, WeightLayout] = {}
        self._checksums: dict[tuple[str, int, int, int], int] = {}
        self._closed = False
        self._packing: PackingVersion | None = None
        self._roots: dict[WeightKey, int] = {}  # checksums of the last committed versions
        self._streaming_watchers = 0
        self._peer_fetches_while_packing = False
        self.stats = ServeStats()
        self.bytes_by_peer: Counter[str] = Counter()
        #: What GetDataPort answers: the weight data port serving this board (port 0: none).
        self.data_port = pb.DataPort()

    def served(self, peer: str, nbytes: int) -> None:
        """Count ``nbytes`` sent to ``peer`` (any transport)."""
        self.stats.bytes += nbytes
        self.bytes_by_peer[peer] += nbytes
        metrics.SERVED_BYTES.inc(nbytes)

    # -- streaming while packing
    def wants_streaming(self) -> bool:
        """Whether the next version should be announced while it is packed (hashing chunk by chunk).

        Yes while a remote receiver watches with ``while_packing``, or once a peer's receiver
        fetched ranges that way (Sharded: receivers watch rank 0 only). Otherwise the publisher
        wakes local readers first and hashes afterwards, as they need no checksum.
        """
        with self._cond:
            return self._streaming_watchers > 0 or self._peer_fetches_while_packing

    def open(self, announcement: WeightVersion, layout: WeightLayout, data: memoryview) -> PackingVersion:
        """Announce ``announcement`` (checksum 0) to ``while_packing`` watchers before it is packed."""
        chunks = -(-layout.total_bytes // announcement.chunk_bytes) if layout.total_bytes else 0
        record = PackingVersion(announcement, data, [None] * chunks)
        with self._cond:
            self._layouts[layout.digest] = layout
            self._packing = record
            self._cond.notify_all()
        return record

    def chunk_ready(self, record: PackingVersion, index: int, digest: int) -> None:
        """Chunk ``index`` of ``record`` is packed and hashed: its fetches may send it."""
        with self._cond:
            record.digests[index] = digest
            self._cond.notify_all()

    def abort(self, record: PackingVersion) -> None:
        """The publish of ``record`` failed: its fetches end ABORTED, nobody may commit it."""
        with self._cond:
            record.state = "aborted"
            if self._packing is record:
                self._packing = None
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake every waiting fetch (one whose client went away checks and leaves)."""
        with self._cond:
            self._cond.notify_all()

    def join(self, key: WeightKey, *, wait: float) -> PackingVersion | None:
        """Join the fetches of ``key`` if it is being packed (waiting up to ``wait`` for it to be
        announced); None: it is not being packed (committed, or unknown here)."""
        deadline = time.monotonic() + wait
        with self._cond:
            while not self._closed:
                record = self._packing
                if record is not None and record.key == key:
                    record.streams += 1
                    self._cond.notify_all()
                    return record
                left = deadline - time.monotonic()
                if key in self._roots or left <= 0:
                    return None
                self._cond.wait(left)
        return None

    def wait_streamed(self, key: WeightKey, *, timeout: float) -> bool:
        """Whether a fetch streams ``key`` while it is packed (waiting up to ``timeout`` for one)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._packing is not None and self._packing.key == key and self._packing.streams > 0,
                timeout,
            )

    def leave(self, record: PackingVersion) -> None:
        with self._cond:
            record.streams -= 1
            if record.streams == 0:
                if record.pinned is not None:
                    record.pinned.release()
                    record.pinned = None
                self._cond.notify_all()  # see wait_streams_done

    def wait_streams_done(self, record: PackingVersion, *, until: threading.Event, timeout: float) -> bool:
        """Wait until no fetch streams ``record``; False if ``until`` was set, the board closed or
        ``timeout`` passed first (whoever sets ``until`` calls :meth:`wake`)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while record.streams > 0:
                left = deadline - time.monotonic()
                if self._closed or until.is_set() or left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_chunk(self, record: PackingVersion, index: int, active: Callable[[], bool]) -> int:
        """Chunk ``index``'s digest once it is ready; raises VersionAborted if it never will be."""
        with self._cond:
            while True:
                if record.state == "aborted" or self._closed or not active():
                    raise VersionAborted(f"version {record.key[0]}/{record.key[1]} was aborted while packed")
                if record.pinned is not None and record.pinned.superseded:
                    raise VersionAborted(f"version {record.key[0]}/{record.key[1]} was superseded")
                digest = record.digests[index]
                if digest is not None:
                    return digest
                self._cond.wait()

    def wait_root(
        self,
        key: WeightKey,
        active: Callable[[], bool],
        *,
        wait: float,
        record: PackingVersion | None = None,
    ) -> int:
        """The checksum of ``key`` once it is committed; raises VersionAborted if it never will be.

        Waits as long as ``key`` is being packed, else up to ``wait`` (a version committed but
        not yet announced: the publisher hashes it after waking local readers). ``record``: the
        packing this fetch streamed, which must be the one committed (a failed publish may be
        sent again under the same number).
        """
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                if record is not None and record.state == "aborted":
                    raise VersionAborted(f"version {key[0]}/{key[1]} was aborted while packed")
                if key in self._roots:
                    return self._roots[key]
                packing = self._packing is not None and self._packing.key == key
                left = deadline - time.monotonic()
                if self._closed or not active() or (not packing and left <= 0):
                    raise VersionAborted(f"version {key[0]}/{key[1]} was aborted, not committed")
                self._cond.wait(None if packing else left)

    def watching(self, while_packing: bool, delta: int) -> None:
        if while_packing:
            with self._cond:
                self._streaming_watchers += delta

    def fetched_while_packing(self) -> None:
        with self._cond:
            self._peer_fetches_while_packing = True

    def publish(
        self,
        version: WeightVersion,
        layout: WeightLayout,
        digests: list[int] | None = None,
        *,
        packed: PackingVersion | None = None,
        pinned: PinnedSlot | None = None,
    ) -> None:
        """Announce ``version``; ``digests`` are its chunk checksums on the version's grid (served as is).

        ``packed``: the version was streamed while packed; ``pinned`` (its committed slot) then
        covers its fetches still running, and is released when the last one ends.
        """
        with self._cond:
            self._roots[version.key] = version.checksum
            if len(self._roots) > 4:
                self._roots = dict(list(self._roots.items())[-4:])
            if packed is not None:
                packed.state, packed.root = "committed", version.checksum
                if packed.streams > 0 and pinned is not None:
                    packed.pinned, pinned = pinned, None
                if self._packing is packed:
                    self._packing = None
            if pinned is not None:
                pinned.release()
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

    def latest(self) -> WeightVersion | None:
        with self._cond:
            return self._latest

    def wait_newer(
        self,
        after: WeightKey | None,
        timeout: float,
        *,
        while_packing: bool = False,
        announced: WeightVersion | None = None,
    ) -> WeightVersion | None:
        """The newest version newer than ``after``; ``while_packing``: also one being packed (its
        announcement, checksum 0), unless it is ``announced`` (sent already)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                packing = self._packing
                if (
                    while_packing
                    and packing is not None
                    and packing.announcement is not announced
                    and newer(packing.announcement, after)
                    and (self._latest is None or newer(packing.announcement, self._latest.key))
                ):
                    return packing.announcement
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


@dataclass(frozen=True)
class Piece:
    """One chunk of a fetch, whatever carries it: ``data`` is a view of the slot (no copy).

    ``commit``: the piece that ends a ``while_packing`` fetch: no data, ``offset`` = the range's
    end, ``checksum`` = the version's root.
    """

    version: int
    offset: int
    data: memoryview
    checksum: int
    commit: bool = False


class FetchRefused(Exception):
    """A fetch the board will not (or no longer) serve; every transport answers it with ``code``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def fetch_pieces(
    board: VersionBoard, request: pb.FetchWeightsRequest, *, peer: str, active: Callable[[], bool]
) -> Generator[Piece, None, None]:
    """The pieces of ``request`` from ``board``: the one fetch logic of every weight transport.

    The gRPC WeightStore frames each piece as a ``WeightChunk`` message, the weight data port
    (:mod:`rlkube.weights.data_port`) writes it to its socket. Raises :class:`FetchRefused`
    (NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE, ABORTED) before or between pieces; ``active``
    says whether the caller is still there (a wait for a chunk being packed ends when it is not).
    """
    latest = board.latest()
    incarnation = request.incarnation or (latest.incarnation if latest is not None else "")
    if request.while_packing:
        board.fetched_while_packing()
        record = board.join(WeightKey(incarnation, request.version), wait=PEER_WAIT_SECONDS)
        if record is not None:
            try:
                yield from _pieces_while_packing(board, record, request, peer=peer, active=active)
            finally:
                board.leave(record)
            return
    pinned = board.pin(incarnation, request.version, wait=PEER_WAIT_SECONDS)
    if pinned is None:
        newest = f"{latest.incarnation}/{latest.version}" if latest is not None else "none"
        raise FetchRefused(
            grpc.StatusCode.NOT_FOUND,
            f"version {incarnation}/{request.version} is not served here (newest: {newest})",
        )
    try:
        meta = pinned.meta
        start, end = _requested_range(request, layout_digest=meta.digest, total=meta.length)
        if start > end or end > meta.length:
            raise FetchRefused(
                grpc.StatusCode.OUT_OF_RANGE,
                f"range [{start}, {end}) is outside version {request.version} ({meta.length} bytes)",
            )
        step = int(request.chunk_bytes) or DEFAULT_CHUNK_BYTES
        step = max(1, min(step, MAX_MESSAGE_BYTES - (64 << 10)))
        board.stats.fetches += 1
        started = time.perf_counter()
        for offset in range(start, end, step):
            if pinned.superseded:
                board.stats.aborted += 1
                raise FetchRefused(grpc.StatusCode.ABORTED, f"version {request.version} was superseded")
            data = pinned.data[offset : min(offset + step, end)]
            digest = board.chunk_checksum((meta.incarnation, meta.version, offset, len(data)), data)
            board.served(peer, len(data))
            yield Piece(meta.version, offset, data, digest)
        metrics.FETCH_SERVED_SECONDS.observe(time.perf_counter() - started)
        if request.while_packing:
            yield _commit_piece(board, meta.key, meta.version, end, active)
    finally:
        pinned.release()


def _requested_range(request: pb.FetchWeightsRequest, *, layout_digest: str, total: int) -> tuple[int, int]:
    """``[start, end)`` of a fetch of a version of ``total`` bytes (length 0: to the end); a
    request for another layout is refused (FAILED_PRECONDITION). The caller checks the bounds."""
    if request.layout_digest and request.layout_digest != layout_digest:
        raise FetchRefused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"version {request.version} has layout {layout_digest}, not {request.layout_digest}",
        )
    start = int(request.offset)
    return start, total if request.length == 0 else start + int(request.length)


def _commit_piece(
    board: VersionBoard,
    key: WeightKey,
    version: int,
    end: int,
    active: Callable[[], bool],
    record: PackingVersion | None = None,
) -> Piece:
    """The piece that ends a ``while_packing`` fetch: no data, the version's root as checksum."""
    try:
        root = board.wait_root(key, active, wait=PEER_WAIT_SECONDS, record=record)
    except VersionAborted as exc:
        board.stats.aborted += 1
        raise FetchRefused(grpc.StatusCode.ABORTED, str(exc)) from None
    return Piece(version, end, memoryview(b""), root, commit=True)


def _pieces_while_packing(
    board: VersionBoard,
    record: PackingVersion,
    request: pb.FetchWeightsRequest,
    *,
    peer: str,
    active: Callable[[], bool],
) -> Generator[Piece, None, None]:
    """A fetch of a version being packed: chunk k as soon as it is ready, then the commit piece."""
    version = record.announcement
    grid, total = version.chunk_bytes, version.total_bytes
    start, end = _requested_range(request, layout_digest=version.layout_digest, total=total)
    off_grid = start % grid or (request.chunk_bytes and request.chunk_bytes != grid)
    if start > end or end > total or off_grid:
        raise FetchRefused(
            grpc.StatusCode.OUT_OF_RANGE,
            f"range [{start}, {end}) in chunks of {request.chunk_bytes} is not on version "
            f"{request.version}'s grid ({total} bytes in chunks of {grid})",
        )
    board.stats.fetches += 1
    started = time.perf_counter()
    for offset in range(start, end, grid):
        try:
            digest = board.wait_chunk(record, offset // grid, active)
        except VersionAborted as exc:
            board.stats.aborted += 1
            raise FetchRefused(grpc.StatusCode.ABORTED, str(exc)) from None
        data = record.data[offset : min(offset + grid, end)]
        board.served(peer, len(data))
        yield Piece(version.version, offset, data, digest)
    metrics.FETCH_SERVED_SECONDS.observe(time.perf_counter() - started)
    yield _commit_piece(board, record.key, version.version, end, active, record)


class _Servicer:
    def __init__(self, board: VersionBoard) -> None:
        self.board = board

    def get_layout(self, request: pb.GetLayoutRequest, context: grpc.ServicerContext) -> pb.WeightLayout:
        layout = self.board.layout(request.layout_digest)
        if layout is None:
            abort(context, grpc.StatusCode.NOT_FOUND, f"no layout {request.layout_digest or '(newest)'} here")
        return layout.to_proto()

    def get_data_port(self, request: pb.GetDataPortRequest, context: grpc.ServicerContext) -> pb.DataPort:
        return self.board.data_port

    def watch(
        self, request: pb.WatchWeightsRequest, context: grpc.ServicerContext
    ) -> Iterator[WeightVersion]:
        after = WeightKey(request.incarnation, request.after_version) if request.incarnation else None
        if after is None and request.after_version:
            after = WeightKey("", request.after_version)
        end = time.monotonic() + self.board.watch_seconds
        # A version announced while packed is announced again once committed (with its checksum):
        # ``after`` only moves on committed ones, so a publish that fails mid-pack and is sent
        # again under the same number is announced again.
        announced: WeightVersion | None = None
        self.board.watching(request.while_packing, +1)
        try:
            while context.is_active() and time.monotonic() < end:
                version = self.board.wait_newer(
                    after,
                    timeout=min(1.0, max(0.0, end - time.monotonic())),
                    while_packing=request.while_packing,
                    announced=announced,
                )
                if version is not None:
                    yield version
                    if version.checksum == 0:
                        announced = version
                    else:
                        after = version.key
        finally:
            self.board.watching(request.while_packing, -1)

    def fetch(self, request: pb.FetchWeightsRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        if request.while_packing:
            context.add_callback(self.board.wake)  # a client that goes away stops a wait for a chunk
        try:
            with contextlib.closing(
                fetch_pieces(self.board, request, peer=context.peer(), active=context.is_active)
            ) as pieces:
                for piece in pieces:
                    prefix, suffix = chunk_framing(
                        piece.version, piece.offset, len(piece.data), piece.checksum
                    )
                    if piece.commit:
                        yield prefix + suffix
                    else:
                        yield copy_slot_into_message(prefix, piece.data, suffix)
        except FetchRefused as exc:
            abort(context, exc.code, exc.details)


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
                response_serializer=WeightVersion.encode,
            ),
            "FetchWeights": grpc.unary_stream_rpc_method_handler(
                servicer.fetch,
                request_deserializer=pb.FetchWeightsRequest.FromString,
                response_serializer=_identity,  # already framed by chunk_framing
            ),
            "GetDataPort": grpc.unary_unary_rpc_method_handler(
                servicer.get_data_port,
                request_deserializer=pb.GetDataPortRequest.FromString,
                response_serializer=pb.DataPort.SerializeToString,
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
