"""A node's receiver: fetch each new version once, straight into the inactive slot, then flip.

I/O (threads, gRPC, shm). Every eval process of a node runs a :class:`NodeReceiver` on the
node's buffer directory; the one that holds the directory's writer lock is the receiver, the
others stand by and take over within ``election_interval`` when it dies (the kernel drops its
lock). If the trainer itself writes the directory (same node), no eval process is elected and
nothing crosses the network.

The elected receiver watches train rank 0's WeightStore and, for the newest announced version:

1. rejects it before touching any slot if it is not newer (same incarnation, lower or equal
   number: :class:`StaleVersionError`) or its layout does not match its digest or size;
2. takes the inactive slot and fetches the bytes into it chunk by chunk (each chunk checked,
   then copied once); with ``streams > 1`` (Sharded) as parallel ranges from the train ranks
   listed in the version's ``sources``, falling back to rank 0 for a range a peer cannot serve;
3. checks length and the whole-buffer xxh3 against the announcement, then flips the header.

It watches ``while_packing``: a version is announced when the trainer starts packing it
(checksum 0) and fetched while it is packed, each chunk as soon as the trainer hashed it; the
checksum of step 3 then comes with every range's commit chunk, which the trainer only sends
once the version is committed. A publish that fails mid-pack (or a trainer that dies) ends the
fetch with an error: the scratch slot is dropped as in any other failure, never committed.

Any failure in 2-3 marks the scratch slot EMPTY: the readable version and every reader stay as
they were. A new incarnation (train rank 0 restarted) is accepted whatever its number.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rlkube.metrics import series as metrics
from rlkube.weight_key import WeightKey
from rlkube.weights.client import WeightStoreClient
from rlkube.weights.copies import hash_list_root
from rlkube.weights.errors import FetchError, IntegrityError, StaleVersionError, WeightPlaneError
from rlkube.weights.fetch_checks import FetchResult
from rlkube.weights.layout import LayoutError, WeightLayout
from rlkube.weights.service import newer
from rlkube.weights.shm import ShmWriter, SlotLease
from rlkube.weights.shm_files import trainer_present
from rlkube.weights.shm_header import SlotMeta
from rlkube.weights.version import WeightVersion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiverConfig:
    #: The buffer directory this receiver fills (the node's, or the eval process's own for Double).
    shm_dir: Path
    #: Train rank 0's WeightStore ("host:port"): watched, and the fallback for every range.
    source: str
    #: Parallel range streams per fetch; more than 1 is the Sharded strategy.
    streams: int = 1
    worker_id: str = ""
    node_name: str = ""
    #: Deadline of unary calls; fetches get this plus size / 50 MB/s.
    rpc_timeout: float = 30.0
    #: Deadline of one WatchWeights stream (the server ends it earlier; then we reconnect).
    watch_seconds: float = 75.0
    #: How often a standby process tries to become the receiver.
    election_interval: float = 0.5
    #: How long a fetch waits for local readers to leave the inactive slot.
    slot_wait_timeout: float = 30.0
    #: Pause after a failed fetch or a lost connection before trying again.
    retry_backoff: float = 0.5


@dataclass
class ReceiverStats:
    elected: bool = False
    fetches: int = 0  # versions fetched and published
    bytes: int = 0  # bytes received over the network
    rejected: int = 0
    fetch_seconds: list[float] = field(default_factory=list)  # network + checks, per version (last 100)
    last_error: str | None = None
    errors: list[str] = field(default_factory=list)


def split_ranges(total: int, streams: int, align: int) -> list[tuple[int, int]]:
    """``streams`` contiguous [start, end) ranges covering ``total``, boundaries on ``align``."""
    per = -(-total // max(1, streams))
    per = max(align, -(-per // align) * align)
    return [(start, min(start + per, total)) for start in range(0, total, per)] or [(0, 0)]


class NodeReceiver:
    """Elects itself among a directory's eval processes and keeps its buffer at the newest version."""

    def __init__(self, config: ReceiverConfig) -> None:
        self.config = config
        self.writer = ShmWriter(config.shm_dir, slot_wait_timeout=config.slot_wait_timeout)
        self.stats = ReceiverStats()
        self._clients: dict[tuple[str, int], WeightStoreClient] = {}
        self._layouts: dict[str, WeightLayout] = {}
        self._stop = threading.Event()
        self._announced = threading.Condition()
        self._pending: WeightVersion | None = None
        self._threads: list[threading.Thread] = []
        self._watch_client: WeightStoreClient | None = None
        self._watching: threading.Event | None = None  # set to end the current election's watch

    # -- life cycle
    def start(self) -> NodeReceiver:
        thread = threading.Thread(target=self._run, name="weight-receiver", daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    @property
    def elected(self) -> bool:
        return self.writer.is_open

    def close(self) -> None:
        self._stop.set()
        with self._announced:
            self._announced.notify_all()
        self._stop_watching()
        for thread in self._threads:
            thread.join(timeout=10.0)
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        self.writer.close()

    def __enter__(self) -> NodeReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- threads
    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.writer.is_open:
                if trainer_present(self.config.shm_dir) or not self.writer.try_open():
                    self._stop.wait(self.config.election_interval)
                    continue
                self.stats.elected = True
                logger.info("%s: elected weight receiver for %s", self.config.worker_id, self.config.shm_dir)
                self._watching = threading.Event()
                watcher = threading.Thread(
                    target=self._watch, args=(self._watching,), name="weight-watch", daemon=True
                )
                watcher.start()
                self._threads.append(watcher)
            if trainer_present(self.config.shm_dir):
                self._stand_down()
                continue
            version = self._take_announced(timeout=0.5)
            if version is None:
                continue
            try:
                self.apply(version)
            except StaleVersionError as exc:
                logger.debug("%s", exc)
            except (WeightPlaneError, LayoutError) as exc:
                self._record_error(exc)
                self._stop.wait(self.config.retry_backoff)
                with self._announced:  # try again unless something newer came meanwhile
                    if self._pending is None:
                        self._pending = version
            except Exception as exc:  # never let the receiver thread die
                self._record_error(exc)
                logger.exception("weight receiver failed")
                self._stop.wait(self.config.retry_backoff)

    def _stand_down(self) -> None:
        """A trainer wants this directory (it writes it directly): hand the writer role over."""
        logger.info("%s: a trainer writes %s; standing by", self.config.worker_id, self.config.shm_dir)
        self._stop_watching()
        self.writer.close()
        self.stats.elected = False
        with self._announced:
            self._pending = None

    def _stop_watching(self) -> None:
        if self._watching is not None:
            self._watching.set()
        if self._watch_client is not None:
            self._watch_client.close()  # cancels the watch stream
            self._watch_client = None

    def _record_error(self, exc: BaseException) -> None:
        self.stats.rejected += 1
        self.stats.last_error = f"{type(exc).__name__}: {exc}"
        self.stats.errors = [*self.stats.errors[-9:], self.stats.last_error]
        logger.warning("weight receiver: %s", self.stats.last_error)

    def _watch(self, until: threading.Event) -> None:
        client = self._watch_client = WeightStoreClient(
            self.config.source, rpc_timeout=self.config.rpc_timeout
        )
        client.connect()
        while not (self._stop.is_set() or until.is_set()):
            try:
                latest = self.writer.latest()
            except AssertionError:  # closed meanwhile
                return
            try:
                for version in client.watch(
                    after=latest.key if latest is not None else None,
                    worker_id=self.config.worker_id,
                    node_name=self.config.node_name,
                    seconds=self.config.watch_seconds,
                    while_packing=True,
                ):
                    self._announce(version)
            except FetchError as exc:
                if self._stop.is_set() or until.is_set():
                    return
                logger.info("weight watch: %s; reconnecting", exc)
                self._stop.wait(self.config.retry_backoff)
            except (ValueError, AssertionError):  # the channel was closed by close() or a stand-down
                return

    def _announce(self, version: WeightVersion) -> None:
        with self._announced:
            pending = self._pending
            if pending is None or newer(version, WeightKey(pending.incarnation, pending.version)):
                self._pending = version
                self._announced.notify_all()

    def _take_announced(self, timeout: float) -> WeightVersion | None:
        with self._announced:
            if self._pending is None:
                self._announced.wait(timeout)
            version, self._pending = self._pending, None
            return version

    # -- one version
    def apply(self, version: WeightVersion) -> SlotMeta:
        """Fetch, verify and publish ``version`` into this node's buffer (the writer must be open)."""
        if not self.writer.is_open:
            self.writer.open()
            self.stats.elected = True
        current = self.writer.latest()
        if current is not None and not newer(version, current.key):
            raise StaleVersionError(
                f"version {version.incarnation}/{version.version} is not newer than the buffer's "
                f"{current.incarnation}/{current.version}; nothing changed"
            )
        layout = self._layout(version.layout_digest)
        if layout.total_bytes != version.total_bytes:
            raise IntegrityError(
                f"version {version.version} announces {version.total_bytes} bytes, its layout "
                f"{layout.digest} has {layout.total_bytes}; nothing changed"
            )
        lease = self.writer.begin(version=version.version, incarnation=version.incarnation, layout=layout)
        started = time.perf_counter()
        try:
            received, committed = self._fetch(version, lease)
            if version.checksum and committed - {version.checksum}:
                raise IntegrityError(
                    f"version {version.version}: committed with checksums {sorted(committed)}, "
                    f"announced {version.checksum:016x}"
                )
            expected = version.checksum or (committed.pop() if len(committed) == 1 else None)
            if expected is None:
                raise IntegrityError(
                    f"version {version.version} was announced while packed and its ranges were "
                    f"committed with {len(committed)} different checksums; nothing changed"
                )
            if received != expected:
                raise IntegrityError(
                    f"version {version.version}: the {version.total_bytes} bytes received hash to "
                    f"{received:016x}, the trainer announced {expected:016x}"
                )
        except BaseException:
            self.writer.abort(lease)
            raise
        seconds = time.perf_counter() - started
        self.stats.fetch_seconds = [*self.stats.fetch_seconds[-99:], seconds]
        metrics.FETCH_SECONDS.observe(seconds)
        metrics.FETCHED_BYTES.inc(version.total_bytes)
        meta = self.writer.commit(lease, checksum=expected, chunk_bytes=version.chunk_bytes)
        self.stats.fetches += 1
        return meta

    def _client(self, address: str, stream: int = 0) -> WeightStoreClient:
        key = (address, stream)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = WeightStoreClient(
                address, rpc_timeout=self.config.rpc_timeout
            ).connect()
        return client

    def _layout(self, digest: str) -> WeightLayout:
        layout = self._layouts.get(digest)
        if layout is None:
            layout = self._client(self.config.source).get_layout(digest)
            self._layouts = {digest: layout, **dict(list(self._layouts.items())[:3])}
        return layout

    def _fetch(self, version: WeightVersion, lease: SlotLease) -> tuple[int, set[int]]:
        """Fill the lease from the network; returns the hash-list root of the chunks received and
        the checksums the ranges' commit chunks carried."""
        total, grid = version.total_bytes, version.chunk_bytes
        if grid <= 0:
            raise IntegrityError(f"version {version.version} announces no checksum grid (chunk_bytes)")
        ranges = split_ranges(total, self.config.streams, grid)
        sources = list(version.sources) or [self.config.source]
        digests: dict[int, int] = {}
        committed: set[int] = set()

        def fetch_range(index: int) -> int:
            start, end = ranges[index]
            address = self.config.source if len(ranges) == 1 else sources[index % len(sources)]

            def fetch_from(source: str) -> FetchResult:
                return self._client(source, index).fetch_into(
                    version,
                    lease.array,
                    offset=start,
                    length=end - start,
                    digests=digests,
                    while_packing=True,
                )

            try:
                got = fetch_from(address)
            except (FetchError, IntegrityError) as exc:
                if address == self.config.source:
                    raise
                logger.info(
                    "range %d-%d from %s failed (%s); fetching it from rank 0", start, end, address, exc
                )
                got = fetch_from(self.config.source)
            if got.root is not None:
                committed.add(got.root)
            return got.nbytes

        if len(ranges) == 1:
            self.stats.bytes += fetch_range(0)
        else:
            with ThreadPoolExecutor(max_workers=len(ranges), thread_name_prefix="weight-range") as pool:
                self.stats.bytes += sum(pool.map(fetch_range, range(len(ranges))))
        if len(digests) != -(-total // grid):
            raise IntegrityError(
                f"version {version.version}: {len(digests)} chunks received, expected {-(-total // grid)}"
            )
        return hash_list_root([digests[offset] for offset in sorted(digests)]), committed
