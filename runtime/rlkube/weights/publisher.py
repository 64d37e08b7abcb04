"""The train side: write each version into this node's shm slot and serve it over gRPC.

I/O. ``WeightPublisher(config)`` does nothing until ``connect()``, which becomes the writer of
``config.shm_dir`` (eval processes on this node that share the directory read it directly:
the network is skipped) and, with ``config.listen``, starts the WeightStore server. ``send()``
packs the state dict into the inactive slot (one copy per tensor), checksums it, flips the
header and announces the version to watchers; when it returns the version is committed and
servable. Every train rank can run one: ranks hold identical weights after a DDP step, so a
Sharded receiver fetches ranges from all of them (``config.peers``).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch

from rlkube._proto import policy_group_pb2 as pb
from rlkube.weights.copies import checksum
from rlkube.weights.layout import Destinations, StateDict, destinations_of, layout_of, pack_into_
from rlkube.weights.service import VersionBoard, serve_weight_store
from rlkube.weights.shm import ShmWriter
from rlkube.weights.wire import DEFAULT_CHUNK_BYTES

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
    #: How long send() waits for eval readers to leave the slot it must overwrite.
    slot_wait_timeout: float = 30.0
    #: Changes when train rank 0 restarts; default: random per publisher.
    incarnation: str | None = None
    #: gRPC server threads (each watcher holds one for its stream's lifetime).
    max_workers: int = 64
    #: Length of one WatchWeights stream before the client reconnects.
    watch_seconds: float = 60.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES


class WeightPublisher:
    """Publishes weight versions from one train rank (see the module docstring)."""

    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self.incarnation = config.incarnation or secrets.token_hex(8)
        self.writer = ShmWriter(config.shm_dir, slot_wait_timeout=config.slot_wait_timeout)
        self.board = VersionBoard(self.writer, watch_seconds=config.watch_seconds)
        self._server: grpc.Server | None = None
        self.port: int | None = None
        self._version = 0
        self._destinations: dict[tuple[int, int, str], Destinations] = {}  # per slot mapping and layout

    def connect(self) -> WeightPublisher:
        self.writer.open()
        if self.config.listen is not None:
            self._server, self.port = serve_weight_store(
                self.board, self.config.listen, max_workers=self.config.max_workers
            )
        return self

    @property
    def address(self) -> str | None:
        """Where receivers reach this rank's WeightStore."""
        if self.config.advertise:
            return self.config.advertise
        return f"127.0.0.1:{self.port}" if self.port else None

    def close(self) -> None:
        self.board.close()
        if self._server is not None:
            self._server.stop(grace=1.0).wait(5.0)
            self._server = None
        self.writer.close()

    def __enter__(self) -> WeightPublisher:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        """The last version sent (0 before the first)."""
        return self._version

    def latest(self) -> pb.WeightVersion | None:
        return self.board.latest()

    def send(
        self,
        state_dict: StateDict,
        *,
        version: int | None = None,
        fingerprint: Mapping[str, float] | None = None,
    ) -> int:
        """Publish ``{module: {param: tensor}}`` as the next version (or ``version``); returns it.

        Returns once the version is committed in this node's buffer and servable. Raises
        SlotBusyError if local eval readers hold the slot past ``slot_wait_timeout``.
        """
        number = self._version + 1 if version is None else int(version)
        layout = layout_of(state_dict)  # from this very state dict: validates it, so no second check
        started = time.perf_counter()
        lease = self.writer.begin(version=number, incarnation=self.incarnation, layout=layout)
        try:
            key = (lease.index, lease.array.ctypes.data, layout.digest)
            if key not in self._destinations:
                self._destinations = {k: v for k, v in self._destinations.items() if k[0] != lease.index}
                self._destinations[key] = destinations_of(lease.tensor, layout)
            with torch.no_grad():
                pack_into_(lease.tensor, state_dict, layout, destinations=self._destinations[key])
            total = checksum(lease.array)
        except BaseException:
            self.writer.abort(lease)
            raise
        meta = self.writer.commit(lease, checksum=total)
        self._version = number
        sources = [a for a in (self.address, *self.config.peers) if a]
        self.board.publish(
            pb.WeightVersion(
                version=number,
                layout_digest=layout.digest,
                total_bytes=layout.total_bytes,
                checksum=total,
                incarnation=self.incarnation,
                published_at=meta.published_at,
                sources=sources,
                fingerprint=dict(fingerprint or {}),
            ),
            layout,
        )
        logger.debug(
            "published version %d (%d bytes) in %.1f ms",
            number,
            layout.total_bytes,
            1e3 * (time.perf_counter() - started),
        )
        return number
