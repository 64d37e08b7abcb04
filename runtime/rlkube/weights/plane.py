"""What an eval worker wires up per strategy: receiver, watcher and weight source in one object.

I/O. The eval worker (``rlkube.launch``) does, for each EVAL policy it runs::

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from rlkube._proto import policy_group_pb2 as pb
from rlkube.metrics import series as metrics
from rlkube.policy.base import BasePolicy
from rlkube.weight_key import WeightKey
from rlkube.weights.client import WeightStoreClient
from rlkube.weights.copies import copy_buffer_into_params, hash_list_root
from rlkube.weights.errors import IntegrityError
from rlkube.weights.layout import WeightLayout, views_of
from rlkube.weights.receiver import NodeReceiver, ReceiverConfig
from rlkube.weights.service import newer
from rlkube.weights.sources import ShmWatcher, ShmWeightSource, bind, swaps_pointers

if TYPE_CHECKING:
    from rlkube.spec import WeightBufferSpec


Strategy = Literal["None", "Double", "Shared", "Sharded"]
STRATEGIES: tuple[str, ...] = ("None", "Double", "Shared", "Sharded")


@dataclass(frozen=True)
class EvalPlaneConfig:
    strategy: Strategy
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
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown weight strategy {self.strategy!r}: expected one of {STRATEGIES}")

    @classmethod
    def from_spec(
        cls, spec: WeightBufferSpec, *, shm_dir: Path | str, source: str, worker_id: str, node_name: str = ""
    ) -> EvalPlaneConfig:
        return cls(
            strategy=spec.strategy.value,  # type: ignore[arg-type]
            shm_dir=Path(shm_dir),
            source=source,
            worker_id=worker_id,
            node_name=node_name,
            streams=spec.streams,
            slot_wait_timeout=spec.pin_timeout_seconds,
        )

    @property
    def buffer_dir(self) -> Path:
        """The directory this process reads (and maybe writes)."""
        return self.shm_dir / self.worker_id if self.strategy == "Double" else self.shm_dir


class EvalWeightPlane:
    """The eval side of one strategy, for one EVAL policy (see the module docstring)."""

    def __init__(self, config: EvalPlaneConfig) -> None:
        self.config = config
        self.source: ShmWeightSource | None = None
        self.receiver: NodeReceiver | None = None
        self.watcher: ShmWatcher | None = None
        self.loader: StreamLoader | None = None
        self._notified_at = 0.0

    def attach(self, policy: BasePolicy) -> None:
        """Give ``policy`` its WeightSource; call before ``policy.init_eval()``."""
        if self.config.strategy == "None":
            self.loader = StreamLoader(self.config.source, rpc_timeout=self.config.rpc_timeout)
            return
        mode = self.config.mode
        if mode == "auto":
            mode = "view" if str(policy.device) == "cpu" else "copy"
        self.source = ShmWeightSource(self.config.buffer_dir, mode=mode).open()
        policy.attach_weight_source(self.source)

    def start(self, policy: BasePolicy) -> EvalWeightPlane:
        """Start the receiver candidate and the watcher; call after ``policy.init_eval()``."""
        if self.config.strategy == "None":
            return self
        cfg = self.config
        self.receiver = NodeReceiver(
            ReceiverConfig(
                shm_dir=cfg.buffer_dir,
                source=cfg.source,
                streams=cfg.streams if cfg.strategy == "Sharded" else 1,
                worker_id=cfg.worker_id,
                node_name=cfg.node_name,
                rpc_timeout=cfg.rpc_timeout,
                slot_wait_timeout=cfg.slot_wait_timeout,
            )
        ).start()

        def notify() -> None:
            self._notified_at = time.perf_counter()
            policy.notify_update_weights()

        self.watcher = ShmWatcher(cfg.buffer_dir, notify).start()
        return self

    def loaded_key(self) -> WeightKey | None:
        """(incarnation, version) the policy's model holds now."""
        if self.loader is not None:
            return self.loader.current_key
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
        """Make sure the model holds ``min_version`` or newer; returns (incarnation, version) held.

        With ``incarnation`` the version must also come from it (train rank 0 restarted: its
        numbers start again). Background strategies: load the newest snapshot of the node's buffer
        in this thread (waiting for it to arrive); None: fetch and load here. Returns what the
        model holds when the timeout passes, ``stop`` is set or ``abandon()`` says the wait is
        pointless (the caller learnt that ``incarnation`` is dead), maybe None.
        """
        deadline = time.monotonic() + timeout
        stop = stop or threading.Event()  # never set: wait out the timeout

        def give_up() -> bool:
            return stop.is_set() or (abandon is not None and abandon())

        def satisfied(key: WeightKey | None) -> bool:
            return key is not None and key.satisfies(min_version=min_version, incarnation=incarnation)

        if self.loader is not None:
            while True:
                waiting = not satisfied(self.loader.current_key)
                left = max(0.0, deadline - time.monotonic())
                self.loader.load_newest(policy, wait=min(left, 1.0) if waiting else 0.05)
                if satisfied(self.loader.current_key) or time.monotonic() >= deadline or give_up():
                    return self.loader.current_key
        while time.monotonic() < deadline:
            # Held already: no update cycle (the watcher nudges the updater for newer versions itself).
            if satisfied(self.loaded_key()):
                break
            policy.update_weights_now()  # the caller is between rollouts: no hand-off to the updater
            if satisfied(self.loaded_key()):
                break
            # Not in this node's buffer yet (its receiver is still fetching).
            if stop.wait(0.005) or give_up():
                break
        return self.loaded_key()

    def loaded_report(self, policy: BasePolicy) -> pb.ReportLoadedRequest:
        """What to send to ``PolicyGroup.ReportLoaded`` after a load (fingerprint computed here)."""
        key = self.loaded_key() or WeightKey("", 0)
        blocked = policy.update_block_seconds[-1] if policy.update_block_seconds else 0.0
        return pb.ReportLoadedRequest(
            worker_id=self.config.worker_id,
            version=key.version,
            incarnation=key.incarnation,
            fingerprint=policy.get_param_fingerprint(),
            load_seconds=max(0.0, time.perf_counter() - self._notified_at) if self._notified_at else 0.0,
            blocked_seconds=blocked,
            node_name=self.config.node_name,
        )

    def close(self) -> None:
        """Stop watcher and receiver and release the buffer (after the policy stopped rolling out)."""
        if self.watcher is not None:
            self.watcher.close()
        if self.receiver is not None:
            self.receiver.close()
        if self.source is not None:
            self.source.close()
        if self.loader is not None:
            self.loader.close()


class StreamLoader:
    """Strategy None: fetch the newest version into a private buffer and copy it into the model."""

    def __init__(self, address: str, *, rpc_timeout: float = 30.0) -> None:
        self.client = WeightStoreClient(address, rpc_timeout=rpc_timeout)
        self.current_key: WeightKey | None = None
        self._buffer: np.ndarray | None = None
        self._layout: WeightLayout | None = None

    def newest(self, *, wait: float) -> pb.WeightVersion | None:
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

    def load(self, policy: BasePolicy, version: pb.WeightVersion) -> None:
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
        self.current_key = WeightKey(version.incarnation, version.version)

    def close(self) -> None:
        self.client.close()
