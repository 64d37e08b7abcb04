"""What an eval worker wires up per strategy: receiver, watcher and weight source in one object.

I/O. The eval worker (``rlkube.engine.worker``) does, for each EVAL policy it runs::

    plane = EvalWeightPlane(EvalPlaneConfig.from_spec(job.spec.policy.weight_buffer, shm_dir=...,
                                                      source=coordinator_weight_addr, worker_id=...))
    plane.attach(policy)             # before policy.init_eval(): gives it its WeightSource
    policy.init_eval(...)            # starts BasePolicy's updater thread (strategy != None)
    plane.start(policy)              # receiver candidate + header watcher (or nothing for None)
    ...
    plane.sync(policy, min_version=task.min_version, timeout=...)   # before a task needs a version
    report = plane.loaded_report(policy)                             # -> PolicyGroup.ReportLoaded
    ...
    policy.close(); plane.close()

``EvalWeightPlane(config)`` is the strategy's plane, chosen once from ``config.strategy`` (as
``pathlib.Path()`` gives a ``PosixPath``): a :class:`NullPlane` for ``None``, a
:class:`ShmPlane` for the others, which differ only by the data in :data:`SHM_STRATEGIES`.

================  ===========================================================================
strategy          what runs in this eval process
================  ===========================================================================
None              nothing in the background; ``sync()`` fetches the newest version over gRPC
                  into a private buffer and copies it into the model (the caller must not run
                  rollouts meanwhile)
Double            a receiver for ``<shm_dir>/<worker_id>`` (always elected: the directory is
                  this process's own), a watcher, a ShmWeightSource
Shared            a receiver *candidate* for the node's ``shm_dir`` (one per node is elected;
                  none if the trainer writes that directory itself), a watcher, a source
Sharded           as Shared, with ``streams`` parallel range fetches from every train rank
================  ===========================================================================
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from rlkube._proto import policy_group_pb2 as pb
from rlkube.metrics import series as metrics
from rlkube.policy.base import BasePolicy
from rlkube.spec import WeightStrategy
from rlkube.weight_key import WeightKey
from rlkube.weights.client import WeightStoreClient
from rlkube.weights.copies import copy_buffer_into_params, hash_list_root
from rlkube.weights.errors import IntegrityError
from rlkube.weights.layout import WeightLayout, views_of
from rlkube.weights.receiver import NodeReceiver, ReceiverConfig
from rlkube.weights.service import newer
from rlkube.weights.sources import ShmWatcher, ShmWeightSource, bind, swaps_pointers
from rlkube.weights.version import WeightVersion

if TYPE_CHECKING:
    from rlkube.spec import WeightBufferSpec


@dataclass(frozen=True)
class ShmStrategy:
    """What tells the buffered strategies apart: data read by the one :class:`ShmPlane`."""

    #: The eval process reads a buffer of its own, ``<shm_dir>/<worker_id>``, not the node's.
    own_buffer: bool
    #: The receiver fetches ``streams`` ranges in parallel from every train rank (else one stream).
    parallel_ranges: bool


SHM_STRATEGIES: Mapping[WeightStrategy, ShmStrategy] = {
    WeightStrategy.DOUBLE: ShmStrategy(own_buffer=True, parallel_ranges=False),
    WeightStrategy.SHARED: ShmStrategy(own_buffer=False, parallel_ranges=False),
    WeightStrategy.SHARDED: ShmStrategy(own_buffer=False, parallel_ranges=True),
}


@dataclass(frozen=True)
class EvalPlaneConfig:
    #: The job's strategy (its name, e.g. "Shared", is accepted too).
    strategy: WeightStrategy
    #: The node's buffer directory (Shared/Sharded) or the parent of this worker's own (Double).
    shm_dir: Path
    #: Train rank 0's WeightStore, "host:port".
    source: str
    worker_id: str
    node_name: str = ""
    streams: int = 4
    #: view: parameters become views of the slot (CPU); copy: shadow buffers on the model's device.
    #: auto: view on CPU, copy elsewhere.
    mode: Literal["auto", "view", "copy"] = "auto"
    rpc_timeout: float = 30.0
    slot_wait_timeout: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", WeightStrategy(self.strategy))  # an unknown name: ValueError

    @classmethod
    def from_spec(
        cls, spec: WeightBufferSpec, *, shm_dir: Path | str, source: str, worker_id: str, node_name: str = ""
    ) -> EvalPlaneConfig:
        return cls(
            strategy=spec.strategy,
            shm_dir=Path(shm_dir),
            source=source,
            worker_id=worker_id,
            node_name=node_name,
            streams=spec.streams,
            slot_wait_timeout=spec.pin_timeout_seconds,
        )


class EvalWeightPlane:
    """The eval side of one strategy, for one EVAL policy (see the module docstring).

    ``EvalWeightPlane(config)`` constructs the plane of ``config.strategy``; the subclasses
    implement the rest of the methods the eval worker calls.
    """

    #: The node's receiver (buffered strategies; None where nothing is fetched in the background).
    receiver: NodeReceiver | None = None

    def __new__(cls, config: EvalPlaneConfig, **_: object) -> EvalWeightPlane:
        if cls is EvalWeightPlane:
            cls = NullPlane if config.strategy is WeightStrategy.NONE else ShmPlane
        return super().__new__(cls)

    def __init__(self, config: EvalPlaneConfig) -> None:
        self.config = config

    def attach(self, policy: BasePolicy) -> None:
        """Give ``policy`` its WeightSource, if any; call before ``policy.init_eval()``."""

    def start(self, policy: BasePolicy) -> EvalWeightPlane:
        """Start what runs in the background, if anything; call after ``policy.init_eval()``."""
        return self

    def loaded_key(self) -> WeightKey | None:
        """(incarnation, version) the policy's model holds now."""
        raise NotImplementedError

    def sync(
        self,
        policy: BasePolicy,
        *,
        min_version: int = 0,
        incarnation: str | None = None,
        timeout: float = 60.0,
        stop: threading.Event | None = None,
        abandon: Callable[[], bool] | None = None,
    ) -> WeightKey | None:
        """Make sure the model holds ``min_version`` or newer; returns (incarnation, version) held.

        With ``incarnation`` the version must also come from it (train rank 0 restarted: its
        numbers start again). Returns what the model holds when the timeout passes, ``stop`` is
        set or ``abandon()`` says the wait is pointless (the caller learnt that ``incarnation``
        is dead), maybe None.
        """
        raise NotImplementedError

    def load_seconds(self) -> float:
        """How long the version the model holds took to load (0 if unknown)."""
        return 0.0

    def loaded_report(self, policy: BasePolicy) -> pb.ReportLoadedRequest:
        """What to send to ``PolicyGroup.ReportLoaded`` after a load (fingerprint computed here)."""
        key = self.loaded_key() or WeightKey("", 0)
        blocked = policy.update_block_seconds[-1] if policy.update_block_seconds else 0.0
        return pb.ReportLoadedRequest(
            worker_id=self.config.worker_id,
            version=key.version,
            incarnation=key.incarnation,
            fingerprint=policy.get_param_fingerprint(),
            load_seconds=self.load_seconds(),
            blocked_seconds=blocked,
            node_name=self.config.node_name,
        )

    def close(self) -> None:
        """Stop what runs in the background and release buffers (after the policy stopped rolling out)."""


def wants(key: WeightKey | None, *, min_version: int, incarnation: str | None) -> bool:
    """Whether holding ``key`` satisfies a wait for ``min_version`` (of ``incarnation``, if given)."""
    return key is not None and key.satisfies(min_version=min_version, incarnation=incarnation)


class VersionLoader(Protocol):
    """Where strategy None gets versions: :class:`StreamLoader` (gRPC) or the in-process publisher."""

    current_key: WeightKey | None
    #: How long the newest load took (fetch and copy into the model).
    load_seconds: float

    def load_newest(self, policy: BasePolicy, *, wait: float) -> WeightKey | None:
        """Load the newest version if one is newer than the model's (waiting up to ``wait`` for one)."""
        ...

    def close(self) -> None: ...


class NullPlane(EvalWeightPlane):
    """Strategy None: nothing in the background; ``sync()`` loads the newest version in the caller's thread.

    ``loader`` defaults to a :class:`StreamLoader` on ``config.source``; ``poll_seconds`` is how
    often a wait looks at ``stop`` and ``abandon``.
    """

    def __init__(
        self, config: EvalPlaneConfig, *, loader: VersionLoader | None = None, poll_seconds: float = 1.0
    ) -> None:
        super().__init__(config)
        self.loader = loader or StreamLoader(config.source, rpc_timeout=config.rpc_timeout)
        self.poll_seconds = poll_seconds

    def loaded_key(self) -> WeightKey | None:
        return self.loader.current_key

    def sync(
        self,
        policy: BasePolicy,
        *,
        min_version: int = 0,
        incarnation: str | None = None,
        timeout: float = 60.0,
        stop: threading.Event | None = None,
        abandon: Callable[[], bool] | None = None,
    ) -> WeightKey | None:
        """Fetch and load here, waiting for the version; any newer version is loaded on the way."""
        deadline = time.monotonic() + timeout
        while True:
            waiting = not wants(self.loader.current_key, min_version=min_version, incarnation=incarnation)
            left = max(0.0, deadline - time.monotonic())
            key = self.loader.load_newest(policy, wait=min(left, self.poll_seconds) if waiting else 0.0)
            if (
                wants(key, min_version=min_version, incarnation=incarnation)
                or time.monotonic() >= deadline
                or (stop is not None and stop.is_set())
                or (abandon is not None and abandon())
            ):
                return key

    def load_seconds(self) -> float:
        return self.loader.load_seconds

    def close(self) -> None:
        self.loader.close()


class ShmPlane(EvalWeightPlane):
    """Double, Shared and Sharded: a node receiver fills a shm buffer, the updater thread swaps it in."""

    def __init__(self, config: EvalPlaneConfig) -> None:
        super().__init__(config)
        strategy = SHM_STRATEGIES[config.strategy]
        #: The directory this process reads (and maybe writes).
        self.buffer_dir = config.shm_dir / config.worker_id if strategy.own_buffer else config.shm_dir
        self.streams = config.streams if strategy.parallel_ranges else 1
        self.source: ShmWeightSource | None = None
        self.watcher: ShmWatcher | None = None
        self._notified_at = 0.0

    def attach(self, policy: BasePolicy) -> None:
        mode = self.config.mode
        if mode == "auto":
            mode = "view" if str(policy.device) == "cpu" else "copy"
        self.source = ShmWeightSource(self.buffer_dir, mode=mode).open()
        policy.attach_weight_source(self.source)

    def start(self, policy: BasePolicy) -> ShmPlane:
        """Start the receiver candidate and the watcher."""
        cfg = self.config
        self.receiver = NodeReceiver(
            ReceiverConfig(
                shm_dir=self.buffer_dir,
                source=cfg.source,
                streams=self.streams,
                worker_id=cfg.worker_id,
                node_name=cfg.node_name,
                rpc_timeout=cfg.rpc_timeout,
                slot_wait_timeout=cfg.slot_wait_timeout,
            )
        ).start()

        def notify() -> None:
            self._notified_at = time.perf_counter()
            policy.notify_update_weights()

        self.watcher = ShmWatcher(self.buffer_dir, notify).start()
        return self

    def loaded_key(self) -> WeightKey | None:
        return self.source.current_key if self.source is not None else None

    def sync(
        self,
        policy: BasePolicy,
        *,
        min_version: int = 0,
        incarnation: str | None = None,
        timeout: float = 60.0,
        stop: threading.Event | None = None,
        abandon: Callable[[], bool] | None = None,
    ) -> WeightKey | None:
        """Load the newest snapshot of the buffer in this thread, waiting for it to arrive."""
        deadline = time.monotonic() + timeout
        stop = stop or threading.Event()  # never set: wait out the timeout
        while time.monotonic() < deadline:
            # Held already: no update cycle (the watcher nudges the updater for newer versions itself).
            if wants(self.loaded_key(), min_version=min_version, incarnation=incarnation):
                break
            policy.update_weights_now()  # the caller is between rollouts: no hand-off to the updater
            if wants(self.loaded_key(), min_version=min_version, incarnation=incarnation):
                break
            # Not in this node's buffer yet (its receiver is still fetching).
            if stop.wait(0.005) or (abandon is not None and abandon()):
                break
        return self.loaded_key()

    def load_seconds(self) -> float:
        """From the watcher's wake-up to now (the report): how long the version took to reach the model."""
        return max(0.0, time.perf_counter() - self._notified_at) if self._notified_at else 0.0

    def close(self) -> None:
        """Stop watcher and receiver and release the buffer."""
        if self.watcher is not None:
            self.watcher.close()
        if self.receiver is not None:
            self.receiver.close()
        if self.source is not None:
            self.source.close()


class StreamLoader:
    """Strategy None: fetch the newest version into a private buffer and copy it into the model."""

    def __init__(self, address: str, *, rpc_timeout: float = 30.0) -> None:
        self.client = WeightStoreClient(address, rpc_timeout=rpc_timeout)
        self.current_key: WeightKey | None = None
        self.load_seconds = 0.0
        self._buffer: np.ndarray | None = None
        self._layout: WeightLayout | None = None

    def newest(self, *, wait: float) -> WeightVersion | None:
        """The newest version if it is newer than what the model holds (waiting up to ``wait`` seconds)."""
        self.client.connect()
        for version in self.client.watch(after=self.current_key, seconds=max(wait, 0.05)):
            return version
        return None

    def load_newest(self, policy: BasePolicy, *, wait: float = 5.0) -> WeightKey | None:
        """Load the newest version if one is newer than the model's (waiting up to ``wait`` for one)."""
        version = self.newest(wait=max(0.05, wait))
        if version is not None:
            self.load(policy, version)
        return self.current_key

    def load(self, policy: BasePolicy, version: WeightVersion) -> None:
        if self.current_key is not None and not newer(version, self.current_key):
            return
        if self._layout is None or self._layout.digest != version.layout_digest:
            self._layout = self.client.get_layout(version.layout_digest)
            self._buffer = np.empty(self._layout.total_bytes, dtype=np.uint8)
        assert self._buffer is not None
        digests: dict[int, int] = {}
        started = time.perf_counter()
        self.client.fetch_into(version, self._buffer, digests=digests)
        metrics.FETCH_SECONDS.observe(time.perf_counter() - started)
        metrics.FETCHED_BYTES.inc(self._layout.total_bytes)
        if hash_list_root([digests[o] for o in sorted(digests)]) != version.checksum:
            raise IntegrityError(
                f"version {version.version}: received bytes do not match the announced checksum"
            )
        tensors = views_of(self._buffer, self._layout)
        if swaps_pointers(policy):
            for b in bind(policy, self._layout):
                copy_buffer_into_params(b.target.data, tensors[b.module][b.param])
        else:
            policy.load_state_dict(tensors)
        policy.weight_version = version.version
        self.current_key = version.key
        self.load_seconds = time.perf_counter() - started

    def close(self) -> None:
        self.client.close()
