"""Weights within one process: strategy ``None`` without a stream (a direct load of the published state).

I/O: none (memory only). ``rlkube run --in-process`` gives the rank-0 engine an
:class:`InProcessPublisher` and the eval worker an :class:`InProcessPlane` reading from it:

- ``send()`` copies the trainer's state dict once (the trainer goes on training while the eval
  worker may still roll out with the previous version) and announces ``(incarnation, version)``;
- the plane's ``sync()`` waits for a version the task needs and loads the newest one into the
  EVAL policy with ``load_state_dict`` (a second copy), between fragments, in the worker's
  thread; ``loaded_report()`` is the same ``ReportLoaded`` request a cluster worker sends.

Nothing runs in the background, exactly as with strategy ``None`` in a cluster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import torch

from rlkube._proto import policy_group_pb2 as pb
from rlkube.policy.base import BasePolicy
from rlkube.weight_key import WeightKey
from rlkube.weights.layout import StateDict

Snapshot = dict[str, dict[str, torch.Tensor]]


class InProcessPublisher:
    """The rank-0 engine's publisher in process: ``send()`` and ``incarnation``, as WeightPublisher's."""

    def __init__(self, *, incarnation: str) -> None:
        self.incarnation = incarnation
        self._cond = threading.Condition()
        self._latest: tuple[WeightKey, Snapshot] | None = None

    def send(
        self,
        state_dict: StateDict,
        *,
        version: int | None = None,
        fingerprint: Mapping[str, float] | None = None,
    ) -> int:
        number = (self._latest[0].version + 1 if self._latest else 1) if version is None else int(version)
        snapshot = {m: {n: t.detach().clone() for n, t in ps.items()} for m, ps in state_dict.items()}
        with self._cond:
            self._latest = (WeightKey(self.incarnation, number), snapshot)
            self._cond.notify_all()
        return number

    def wait_latest(
        self, *, newer_than: WeightKey | None, timeout: float
    ) -> tuple[WeightKey, Snapshot] | None:
        """The newest version if it is not ``newer_than`` (waiting up to ``timeout`` for one), else None."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._latest is not None and self._latest[0] != newer_than, timeout=max(0.0, timeout)
            )
            return self._latest if self._latest is not None and self._latest[0] != newer_than else None

    def close(self) -> None:
        pass


class InProcessPlane:
    """The eval worker's weight plane in process (the worker's ``WorkerPlane``, as ``EvalWeightPlane``)."""

    def __init__(self, publisher: InProcessPublisher, *, worker_id: str, node_name: str = "") -> None:
        self.publisher = publisher
        self.worker_id = worker_id
        self.node_name = node_name
        self.current_key: WeightKey | None = None
        self._load_seconds = 0.0

    def attach(self, policy: BasePolicy) -> None:
        """Nothing to attach: strategy None has no weight source."""

    def start(self, policy: BasePolicy) -> InProcessPlane:
        return self

    def loaded_key(self) -> WeightKey | None:
        return self.current_key

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
        """Load the newest version, waiting (up to ``timeout``, or until ``stop``) for ``min_version``.

        ``abandon`` is the cluster plane's hook for incarnation changes; in process there is one
        incarnation, so it is never asked.
        """
        deadline = time.monotonic() + timeout

        def satisfied(key: WeightKey | None) -> bool:
            return key is not None and key.satisfies(min_version=min_version, incarnation=incarnation)

        while True:
            waiting = not satisfied(self.current_key)
            left = min(0.25, deadline - time.monotonic()) if waiting else 0.0
            newest = self.publisher.wait_latest(newer_than=self.current_key, timeout=left)
            if newest is not None:  # any newer version is loaded, as StreamLoader does
                started = time.perf_counter()
                policy.load_state_dict(newest[1])
                policy.weight_version = newest[0].version
                self.current_key, self._load_seconds = newest[0], time.perf_counter() - started
            if satisfied(self.current_key) or time.monotonic() >= deadline or (stop and stop.is_set()):
                return self.current_key

    def loaded_report(self, policy: BasePolicy) -> pb.ReportLoadedRequest:
        """What to send to ``PolicyGroup.ReportLoaded`` after a load (fingerprint computed here)."""
        key = self.current_key or WeightKey("", 0)
        return pb.ReportLoadedRequest(
            worker_id=self.worker_id,
            version=key.version,
            incarnation=key.incarnation,
            fingerprint=policy.get_param_fingerprint(),
            load_seconds=self._load_seconds,
            node_name=self.node_name,
        )

    def close(self) -> None:
        pass
