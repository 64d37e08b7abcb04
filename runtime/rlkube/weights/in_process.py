"""Weights within one process: strategy ``None`` without a stream (a direct load of the published state).

I/O: none (memory only). ``rlkube run --in-process`` gives the rank-0 engine an
:class:`InProcessPublisher` and the eval worker an :class:`InProcessPlane`, both over one
:class:`PublishedWeights`:

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
from rlkube.weights.layout import StateDict


def copy_state(state: StateDict) -> dict[str, dict[str, torch.Tensor]]:
    """The one copy on the publishing side: ``{module: {param: detached clone}}``."""
    return {
        module: {name: t.detach().clone() for name, t in params.items()} for module, params in state.items()
    }


class PublishedWeights:
    """The newest published state and its ``(incarnation, version)``; readers wait on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._key: tuple[str, int] | None = None
        self._state: dict[str, dict[str, torch.Tensor]] | None = None

    def publish(self, state: dict[str, dict[str, torch.Tensor]], *, incarnation: str, version: int) -> None:
        with self._cond:
            self._key, self._state = (incarnation, version), state
            self._cond.notify_all()

    def latest(self) -> tuple[tuple[str, int], dict[str, dict[str, torch.Tensor]]] | None:
        with self._cond:
            return None if self._key is None or self._state is None else (self._key, self._state)

    def wait(self, satisfied: Callable[[tuple[str, int] | None], bool], *, timeout: float) -> None:
        """Wait until ``satisfied(key)`` holds for the newest key, up to ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: satisfied(self._key), timeout=max(0.0, timeout))


class InProcessPublisher:
    """The rank-0 engine's publisher in process: ``send()`` and ``incarnation``, as WeightPublisher."""

    def __init__(self, weights: PublishedWeights, *, incarnation: str) -> None:
        self.weights = weights
        self.incarnation = incarnation
        self._version = 0

    def send(
        self,
        state_dict: StateDict,
        *,
        version: int | None = None,
        fingerprint: Mapping[str, float] | None = None,
    ) -> int:
        number = self._version + 1 if version is None else int(version)
        self.weights.publish(copy_state(state_dict), incarnation=self.incarnation, version=number)
        self._version = number
        return number

    def close(self) -> None:
        pass


class InProcessPlane:
    """The eval worker's weight plane in process (the interface of ``EvalWeightPlane``)."""

    def __init__(self, weights: PublishedWeights, *, worker_id: str, node_name: str = "") -> None:
        self.weights = weights
        self.worker_id = worker_id
        self.node_name = node_name
        self.current_key: tuple[str, int] | None = None
        self._loaded_at = 0.0
        self._load_seconds = 0.0

    def attach(self, policy: BasePolicy) -> None:
        """Nothing to attach: strategy None has no weight source."""

    def start(self, policy: BasePolicy) -> InProcessPlane:
        return self

    def loaded_key(self) -> tuple[str, int] | None:
        return self.current_key

    def sync(
        self,
        policy: BasePolicy,
        *,
        min_version: int = 0,
        incarnation: str | None = None,
        timeout: float = 60.0,
        stop: threading.Event | None = None,
    ) -> tuple[str, int] | None:
        """Wait (up to ``timeout``, or until ``stop``) for ``min_version``, then load the newest version."""
        deadline = time.monotonic() + timeout

        def satisfied(key: tuple[str, int] | None) -> bool:
            return key is not None and key[1] >= min_version and incarnation in (None, key[0])

        while True:
            latest = self.weights.latest()
            if latest is not None and latest[0] != self.current_key and satisfied(latest[0]):
                self._load(policy, *latest)
            if satisfied(self.current_key) or time.monotonic() >= deadline or (stop and stop.is_set()):
                return self.current_key
            self.weights.wait(satisfied, timeout=min(0.25, deadline - time.monotonic()))

    def _load(
        self, policy: BasePolicy, key: tuple[str, int], state: dict[str, dict[str, torch.Tensor]]
    ) -> None:
        started = time.perf_counter()
        policy.load_state_dict(state)
        policy.weight_version = key[1]
        self.current_key = key
        self._loaded_at = time.perf_counter()
        self._load_seconds = self._loaded_at - started

    def loaded_report(self, policy: BasePolicy) -> pb.ReportLoadedRequest:
        """What to send to ``PolicyGroup.ReportLoaded`` after a load (fingerprint computed here)."""
        key = self.current_key or ("", 0)
        return pb.ReportLoadedRequest(
            worker_id=self.worker_id,
            version=key[1],
            incarnation=key[0],
            fingerprint=policy.get_param_fingerprint(),
            load_seconds=self._load_seconds,
            blocked_seconds=0.0,
            node_name=self.node_name,
        )

    def close(self) -> None:
        pass
