"""The train side: write each version into this node's shm slot and serve it over gRPC.

I/O. ``WeightPublisher(config)`` does nothing until ``connect()``, which becomes the writer of
``config.shm_dir`` (eval processes on this node that share the directory read it directly:
the network is skipped) and, with ``config.listen``, starts the WeightStore server. ``send()``
packs the state dict into the inactive slot (one copy per tensor), checksums it, flips the
header and announces the version to watchers; when it returns the version is committed and
servable. While remote receivers watch, ``send()`` streams while packing instead: it announces
the version before packing it, packs and hashes it chunk by chunk (work shared by the pack
threads, chunks in order) and marks each chunk ready for the WeightStore, so remote fetches run
alongside the packing; the version is committed (and its root sent to those fetches) at the
end, or aborted if packing fails (see :mod:`rlkube.weights.service`). Every train rank can run
one: ranks hold identical weights after a DDP step, so a Sharded receiver fetches ranges from
all of them (``config.peers``).

Zero-copy publish: after :meth:`WeightPublisher.keep_resident` the trainer's own tensors live
in the back slot (see :mod:`rlkube.weights.resident`), so ``send()`` of a state dict that
aliases them copies nothing before the flip: it commits the slot the trainer trained in and
wakes local readers, then moves the tensors into the other slot in the background while
rollouts run. :meth:`WeightPublisher.wait_writable` waits for that move; the trainer calls it
before its next update. Tensors that cannot reside (on a GPU, tied) are copied as before.
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import numpy as np
import torch

from rlkube._proto import policy_group_pb2 as pb
from rlkube.metrics import series as metrics
from rlkube.spec import WeightTransport
from rlkube.weight_key import WeightKey
from rlkube.weights.copies import (
    COPIES,
    checksum,
    chunk_digests,
    copy_piece_into_slot,
    copy_tensor_into_slot,
    hash_list_root,
)
from rlkube.weights.data_port import DataPortServer
from rlkube.weights.device_copy import DeviceToSlot
from rlkube.weights.errors import WriterBusyError
from rlkube.weights.layout import (
    Destinations,
    StateDict,
    WeightLayout,
    destinations_of,
    layout_of,
    pack_into_,
)
from rlkube.weights.locks import FileLock, describe_pids, lock_holders
from rlkube.weights.resident import ResidentTensors, aliases, why_not_resident
from rlkube.weights.service import PackingVersion, VersionBoard, serve_weight_store
from rlkube.weights.shm import PinnedSlot, ShmWriter, SlotLease
from rlkube.weights.shm_files import TRAINER_LOCK, WRITER_LOCK, attach, detach
from rlkube.weights.staging import on_accelerator
from rlkube.weights.version import WeightVersion
from rlkube.weights.wire import DEFAULT_CHUNK_BYTES

if TYPE_CHECKING:
    from rlkube.spec import WeightBufferSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublisherConfig:
    #: This rank's buffer directory (the node's shared directory when eval pods share the node).
    shm_dir: Path
    #: "host:port" for the WeightStore server (port 0 picks a free one); None: no server.
    listen: str | None = None
    #: host:port receivers dial for this rank (default: the bound port on 127.0.0.1).
    advertise: str | None = None
    #: WeightStore addresses of the other train ranks, announced as extra sources (Sharded).
    peers: tuple[str, ...] = ()
    #: "host:port" of the weight data port (port 0 picks a free one): the same versions over a
    #: plain socket, straight from slot to slot (rlkube.weights.data_port); None: gRPC only.
    #: Receivers learn the port from the WeightStore (GetDataPort), at the host they reached it at.
    data_listen: str | None = None
    #: How long send() waits for eval readers to leave the slot it must overwrite; then it
    #: reclaims the slot from them (see rlkube.weights.shm), never failing for a hung reader.
    slot_wait_timeout: float = 30.0
    #: Changes when train rank 0 restarts; default: random per publisher.
    incarnation: str | None = None
    #: gRPC server threads (each watcher holds one for its stream's lifetime).
    max_workers: int = 64
    #: Length of one WatchWeights stream before the client reconnects.
    watch_seconds: float = 60.0
    #: Chunk size of fetches, and the grid of the version checksum (a hash list over chunk digests).
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    #: How long connect() waits for an eval receiver that writes shm_dir to hand it over.
    takeover_timeout: float = 30.0
    #: Threads copying the state dict into the slot (numpy releases the GIL; 1 turns it off).
    pack_threads: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))

    #: Let keep_resident() put the trainer's tensors in the back slot (zero-copy publish).
    zero_copy: bool = True
    #: After a zero-copy flip, the move of the trainer's tensors into the other slot waits for the
    #: remote fetches streaming the flipped version to end (they read the same memory on the same
    #: CPUs), at most this long, and never once the trainer waits for its tensors (wait_writable).
    move_defer_seconds: float = 10.0

    @classmethod
    def from_spec(
        cls,
        spec: WeightBufferSpec,
        *,
        shm_dir: Path | str,
        listen: str | None,
        advertise: str | None = None,
        peers: tuple[str, ...] = (),
        incarnation: str | None = None,
        data_listen: str | None = None,
    ) -> PublisherConfig:
        """The configuration of a train rank from ``job.spec.policy.weight_buffer`` and the env contract.

        ``data_listen`` is used only when the spec's transport is ``tcp``.
        """
        return cls(
            shm_dir=Path(shm_dir),
            listen=listen,
            data_listen=data_listen if spec.transport is WeightTransport.TCP else None,
            advertise=advertise,
            peers=tuple(peers),
            incarnation=incarnation,
            chunk_bytes=spec.chunk_bytes,
            slot_wait_timeout=spec.pin_timeout_seconds,
        )


class WeightPublisher:
    """Publishes weight versions from one train rank (see the module docstring)."""

    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self.incarnation = config.incarnation or secrets.token_hex(8)
        self.writer = ShmWriter(config.shm_dir, slot_wait_timeout=config.slot_wait_timeout)
        self.board = VersionBoard(self.writer, watch_seconds=config.watch_seconds)
        self._server: grpc.Server | None = None
        self._data_server: DataPortServer | None = None
        self._attach: FileLock | None = None
        self._trainer_lock: FileLock | None = None
        self.port: int | None = None
        self._version = 0
        self._destinations: dict[tuple[int, int, str], Destinations] = {}  # per slot mapping and layout
        self._pool = ThreadPoolExecutor(max(1, config.pack_threads), thread_name_prefix="weight-pack")
        #: Called by a pack thread before it packs chunk k of n, as ``pack_gate(k, n)``, when a
        #: version streams while packing (tests hold packing with it); None: nothing.
        self.pack_gate: Callable[[int, int], None] | None = None
        #: The trainer's tensors when they live in a slot (zero-copy publish), their WRITING
        #: lease between a move and the next send, and the move running after a flip.
        self._resident: ResidentTensors | None = None
        self._resident_lease: SlotLease | None = None
        self._moving: Future[None] | None = None
        self._mover = ThreadPoolExecutor(1, thread_name_prefix="weight-move")
        self._move_now = threading.Event()  # the trainer waits for the move: no more deferring
        #: How many moves waited for remote fetches to end first, and how many of those were cut
        #: short: the trainer needed its tensors (wait_writable), move_defer_seconds passed, or close.
        self.moves_deferred = 0
        self.moves_hurried = 0
        #: Why zero-copy publishing was turned off for good (a failed move, another state dict).
        self._zero_copy_off: str | None = None if config.zero_copy else "PublisherConfig.zero_copy is off"
        #: Parameters on a GPU: one DMA into the page-locked slot, or staged (rlkube.weights.device_copy).
        self._device_copy = DeviceToSlot()
        #: Bytes copied by the last send() before its flip (0 when the tensors are resident).
        self.last_copied_before_flip = 0
        #: Seconds from the last send()'s start until its version was committed for local readers.
        self.last_commit_seconds = 0.0

    def connect(self) -> WeightPublisher:
        """Become the writer of ``shm_dir`` (taking it over from an eval receiver) and start serving."""
        directory = self.config.shm_dir
        self._attach = attach(directory)
        self._trainer_lock = FileLock(directory / TRAINER_LOCK)
        if not self._trainer_lock.try_acquire(fcntl.LOCK_EX):
            holders = describe_pids(lock_holders(self._trainer_lock.path))
            self._release_directory()
            raise WriterBusyError(f"another trainer publishes into {directory}: {holders}")
        # An eval process may be this directory's elected receiver: it sees trainer.lock and stands down.
        deadline = time.monotonic() + self.config.takeover_timeout
        while not self.writer.try_open():
            if time.monotonic() >= deadline:
                holders = describe_pids(lock_holders(directory / WRITER_LOCK))
                self._release_directory()
                raise WriterBusyError(
                    f"{directory}: its writer ({holders}) kept it past {self.config.takeover_timeout}s"
                )
            time.sleep(0.02)
        if self.config.listen is not None:
            self._server, self.port = serve_weight_store(
                self.board, self.config.listen, max_workers=self.config.max_workers
            )
        if self.config.data_listen is not None:
            try:
                self._data_server = DataPortServer(self.board, self.config.data_listen).start()
            except OSError as exc:  # the fast path is optional: receivers fetch over gRPC instead
                logger.error(
                    "cannot serve the weight data port on %s (%s); remote receivers fetch over gRPC",
                    self.config.data_listen,
                    exc,
                )
            else:
                self.board.data_port = self._data_server.describe()
        metrics.DATA_PORT_SERVING.set(1 if self._data_server is not None else 0)
        return self

    @property
    def address(self) -> str | None:
        """Where receivers reach this rank's WeightStore."""
        if self.config.advertise:
            return self.config.advertise
        return f"127.0.0.1:{self.port}" if self.port else None

    def close(self) -> None:
        self._release_resident()
        self._mover.shutdown(wait=True)
        self.board.close()
        self._pool.shutdown(wait=True)
        if self._data_server is not None:
            self.board.data_port = pb.DataPort()
            self._data_server.close()
            self._data_server = None
        if self._server is not None:
            self._server.stop(grace=1.0).wait(5.0)
            self._server = None
        self._device_copy.close()  # unregister the slots before the writer lets their mappings go
        self.writer.close()
        self._release_directory()

    @property
    def device_copy_path(self) -> str:
        """How the last GPU state dict reached the slot: "dma", "staged" ("" before any)."""
        return self._device_copy.last_path

    def _release_directory(self) -> None:
        if self._trainer_lock is not None:
            self._trainer_lock.close()
            self._trainer_lock = None
        if self._attach is not None:
            detach(self._attach, self.config.shm_dir, remove=True)
            self._attach = None

    def __enter__(self) -> WeightPublisher:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        """The last version sent (0 before the first)."""
        return self._version

    def latest(self) -> WeightVersion | None:
        return self.board.latest()

    def send(
        self,
        state_dict: StateDict,
        *,
        version: int | None = None,
        fingerprint: Mapping[str, float] | None = None,
    ) -> int:
        """Publish ``{module: {param: tensor}}`` as the next version (or ``version``); returns it.

        Returns once the version is committed in this node's buffer and servable. A local eval
        reader that holds the slot past ``slot_wait_timeout`` loses it (the slot is reclaimed with
        new files; that reader keeps its unchanged older copy), so a hung reader never fails this.
        """
        number = self._version + 1 if version is None else int(version)
        copied = _copied_into_slots()
        started = time.perf_counter()
        layout = layout_of(state_dict)  # from this very state dict: validates it, so no second check
        grid = self.config.chunk_bytes
        sources = [a for a in (self.address, *self.config.peers) if a]
        announcement = WeightVersion(
            version=number,
            layout_digest=layout.digest,
            total_bytes=layout.total_bytes,
            incarnation=self.incarnation,
            sources=tuple(sources),
            fingerprint=dict(fingerprint or {}),
            chunk_bytes=grid,
        )
        lease = self._resident_lease_for(state_dict, layout, number)
        resident = lease is not None
        if lease is None:
            lease = self.writer.begin(version=number, incarnation=self.incarnation, layout=layout)
        packing: PackingVersion | None = None
        try:
            destinations = self._destinations_of(lease)
            if on_accelerator(state_dict):  # one DMA into the slot, or via pinned staging (device_copy)
                state_dict = self._device_copy.copy_(
                    state_dict,
                    slot=lease.index,
                    slot_array=lease.array,
                    layout=layout,
                    destinations=destinations,
                )
            if self.board.wants_streaming():
                announcement = replace(announcement, published_at=time.time())
                packing = self.board.open(announcement, layout, lease.array.data)
                digests = self._pack_streaming(state_dict, layout, destinations, lease.array, packing)
            else:
                self._pack(state_dict, layout, destinations)
        except BaseException:
            if packing is not None:
                self.board.abort(packing)
            if not resident:  # a resident lease stays WRITING: the trainer's tensors live in it
                self.writer.abort(lease)
            raise
        self.last_copied_before_flip = _copied_into_slots() - copied
        pinned: PinnedSlot | None = None
        if packing is not None:
            # Every chunk is hashed already: commit with the checksum; the pin covers the fetches
            # still streaming this version from the slot.
            total = hash_list_root(digests)
            pinned = self.writer.commit_pinned(lease, checksum=total, chunk_bytes=grid)
            meta = pinned.meta
            self.last_commit_seconds = time.perf_counter() - started
            metrics.PUBLISH_SECONDS.labels(stage="committed").observe(self.last_commit_seconds)
            metrics.PUBLISHED_BYTES.inc(layout.total_bytes)
        else:
            # Local readers need no checksum (pins keep their snapshot intact): wake them first,
            # then hash for remote receivers while they swap the new version in.
            meta = self.writer.commit(lease, checksum=None, chunk_bytes=grid)
            self.last_commit_seconds = time.perf_counter() - started
            metrics.PUBLISH_SECONDS.labels(stage="committed").observe(self.last_commit_seconds)
            metrics.PUBLISHED_BYTES.inc(layout.total_bytes)
            digests = self._digests(lease.array, grid)
            total = hash_list_root(digests)
            self.writer.record_checksum(lease.index, WeightKey(self.incarnation, number), total)
        self._version = number
        if resident:  # the trainer must not write the slot readers now read: move off it
            self._resident_lease = None
            self._move_now.clear()
            self._moving = self._mover.submit(self._move_resident, packing)
        committed = replace(announcement, checksum=total, published_at=meta.published_at)
        self.board.publish(committed, layout, digests, packed=packing, pinned=pinned)
        metrics.PUBLISH_SECONDS.labels(stage="announced").observe(time.perf_counter() - started)
        logger.debug(
            "published version %d (%d bytes) in %.1f ms",
            number,
            layout.total_bytes,
            1e3 * (time.perf_counter() - started),
        )
        return number

    # ------------------------------------------------------------------ zero-copy publish
    def keep_resident(self, tensors: StateDict) -> bool:
        """Keep the trainer's own tensors (the objects it trains, e.g. ``state_dict(keep_vars=True)``
        of its models) in this node's back slot, so that ``send()`` of a state dict aliasing them
        copies nothing before the flip. The first move runs in the background (one copy).

        Returns False, and nothing changes, where they cannot reside (the reason is logged):
        ``send()`` then copies as before. Call :meth:`wait_writable` before updating them.
        """
        if self._zero_copy_off is not None or self._resident is not None:
            return self._resident is not None
        reason = why_not_resident(tensors)
        if reason is not None:
            logger.info("weights are copied at each publish (not zero-copy): %s", reason)
            self._zero_copy_off = reason
            return False
        self._resident = ResidentTensors(tensors)
        self._moving = self._mover.submit(self._move_resident)
        logger.info(
            "zero-copy publish: the trainer's %d tensors (%d bytes) now live in %s",
            len(self._resident.layout.entries),
            self._resident.layout.total_bytes,
            self.config.shm_dir,
        )
        return True

    @property
    def resident(self) -> bool:
        """Whether the trainer's tensors live in a slot (zero-copy publish)."""
        return self._resident is not None

    def wait_writable(self) -> None:
        """Return once the trainer may update its tensors: a move after a flip is done."""
        moving, self._moving = self._moving, None
        if moving is not None:
            self._move_now.set()
            self.board.wake()
            moving.result()

    def _move_resident(self, streamed: PackingVersion | None = None) -> None:
        """Take the back slot and move the resident tensors into it (the trainer waits for this).

        ``streamed``: the version just flipped, which remote receivers may still be fetching:
        the move (one copy of the model) waits for those fetches first, unless the trainer
        needs its tensors now (see ``PublisherConfig.move_defer_seconds``).
        """
        if streamed is not None and streamed.streams > 0 and not self._move_now.is_set():
            self.moves_deferred += 1
            if not self.board.wait_streams_done(
                streamed, until=self._move_now, timeout=self.config.move_defer_seconds
            ):
                self.moves_hurried += 1
        tensors = self._resident
        assert tensors is not None
        try:
            lease = self.writer.begin(
                version=self._version + 1, incarnation=self.incarnation, layout=tensors.layout
            )
        except BaseException as exc:
            logger.exception("no slot for the trainer's tensors: publishing by copy from now on")
            self._zero_copy_off = f"no slot for the trainer's tensors: {exc}"
            tensors.evict_()
            self._resident = None
            return
        try:
            tensors.move_into_(self._destinations_of(lease))
        except BaseException as exc:
            self._zero_copy_off = f"moving the trainer's tensors failed: {exc}"
            tensors.evict_()
            self._resident = None
            self.writer.abort(lease)
            raise
        self._resident_lease = lease

    def _resident_lease_for(
        self, state_dict: StateDict, layout: WeightLayout, number: int
    ) -> SlotLease | None:
        """The lease the trainer's tensors live in, if ``state_dict`` is them; else None (copy)."""
        self.wait_writable()
        lease, tensors = self._resident_lease, self._resident
        if lease is None or tensors is None:
            return None
        if lease.layout.digest != layout.digest or not aliases(state_dict, tensors.tensors):
            logger.warning("the published state dict is not the resident one: publishing by copy")
            self._zero_copy_off = "a published state dict was not the resident tensors"
            self._release_resident()
            return None
        lease.version = number
        return lease

    def _release_resident(self) -> None:
        """Give the trainer's tensors private memory again and hand their slot back."""
        try:
            self.wait_writable()
        finally:
            if self._resident is not None:
                self._resident.evict_()
                self._resident = None
            if self._resident_lease is not None:
                self.writer.abort(self._resident_lease)
                self._resident_lease = None

    def _destinations_of(self, lease: SlotLease) -> Destinations:
        key = (lease.index, lease.array.ctypes.data, lease.layout.digest)
        if key not in self._destinations:
            self._destinations = {k: v for k, v in self._destinations.items() if k[0] != lease.index}
            self._destinations[key] = destinations_of(lease.tensor, lease.layout)
        return self._destinations[key]

    def _digests(self, data: np.ndarray, grid: int) -> list[int]:
        """The chunk digests of ``data``: contiguous runs of chunks hashed on the pack threads (xxhash
        releases the GIL), so announcing a version costs about 1/pack_threads of one hashing pass."""
        chunks = -(-data.nbytes // grid)
        parts = min(self.config.pack_threads, chunks)
        if parts <= 1:
            return chunk_digests(data, grid)
        per = -(-chunks // parts) * grid
        jobs = [
            self._pool.submit(chunk_digests, data[lo : lo + per], grid) for lo in range(0, data.nbytes, per)
        ]
        return [digest for job in jobs for digest in job.result()]

    def _pack_streaming(
        self,
        state_dict: StateDict,
        layout: WeightLayout,
        destinations: Destinations,
        data: np.ndarray,
        packing: PackingVersion,
    ) -> list[int]:
        """Pack and hash chunk by chunk, in order, marking each ready on the board; returns the digests.

        The pack threads take the next chunk from one counter, so chunks become ready about in
        order whatever the tensor sizes (a large tensor is copied in pieces, one per chunk).
        """
        grid = self.config.chunk_bytes
        pieces = chunk_pieces(layout, grid)
        tensors = [t for params in state_dict.values() for t in params.values()]
        digests = [0] * len(pieces)
        counter = itertools.count()
        failed = threading.Event()
        gate = self.pack_gate

        def work() -> None:
            while not failed.is_set() and (index := next(counter)) < len(pieces):
                try:
                    if gate is not None:
                        gate(index, len(pieces))
                    for entry, lo, hi in pieces[index]:
                        copy_piece_into_slot(destinations[entry][1][lo:hi], tensors[entry], lo, hi)
                    digests[index] = checksum(data[index * grid : (index + 1) * grid])
                except BaseException:
                    failed.set()
                    raise
                self.board.chunk_ready(packing, index, digests[index])

        with torch.no_grad():
            parts = min(self.config.pack_threads, len(pieces))
            if parts <= 1:
                work()
            else:
                jobs = [self._pool.submit(work) for _ in range(parts)]
                wait(jobs)  # all of them: none may still write the slot when it is aborted
                for job in jobs:
                    job.result()
        return digests

    def _pack(self, state_dict: StateDict, layout: WeightLayout, destinations: Destinations) -> None:
        """One copy per tensor, spread over ``pack_threads`` threads in contiguous groups of similar size."""
        tensors = [t for params in state_dict.values() for t in params.values()]
        groups = split_evenly([e.nbytes for e in layout.entries], self.config.pack_threads)
        with torch.no_grad():
            if len(groups) == 1:
                pack_into_(None, state_dict, layout, destinations=destinations)
                return
            jobs = [self._pool.submit(_copy_group, destinations[lo:hi], tensors[lo:hi]) for lo, hi in groups]
            for job in jobs:
                job.result()


def _copied_into_slots() -> int:
    """Bytes this process copied from state dicts towards slots so far (see rlkube.weights.copies)."""
    counted = COPIES.snapshot()
    names = (
        "copy_device_into_slot",
        "copy_device_into_staging",
        "copy_tensor_into_slot",
        "copy_piece_into_slot",
    )
    return sum(counted.get(name, (0, 0))[1] for name in names)


def _copy_group(destinations: Destinations, tensors: list[torch.Tensor]) -> None:
    for (dst, dst_bytes), tensor in zip(destinations, tensors, strict=True):
        copy_tensor_into_slot(dst, tensor, dst_bytes)


def chunk_pieces(layout: WeightLayout, grid: int) -> list[list[tuple[int, int, int]]]:
    """Per chunk of ``grid`` bytes: the (entry index, start, stop) byte ranges of the entries in it."""
    chunks: list[list[tuple[int, int, int]]] = [[] for _ in range(-(-layout.total_bytes // grid))]
    for index, entry in enumerate(layout.entries):
        position = entry.offset
        while position < entry.offset + entry.nbytes:
            stop = min(entry.offset + entry.nbytes, (position // grid + 1) * grid)
            chunks[position // grid].append((index, position - entry.offset, stop - entry.offset))
            position = stop
    return chunks


def split_evenly(sizes: list[int], parts: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) index ranges over ``sizes`` with roughly equal sums (at most ``parts``)."""
    total = sum(sizes)
    if parts <= 1 or total == 0 or len(sizes) <= 1:
        return [(0, len(sizes))]
    ranges: list[tuple[int, int]] = []
    lo = acc = 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= total * (len(ranges) + 1) / parts and len(ranges) < parts - 1:
            ranges.append((lo, i + 1))
            lo = i + 1
    if lo < len(sizes):
        ranges.append((lo, len(sizes)))
    return ranges
