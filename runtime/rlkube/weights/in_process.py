"""Weights within one process: strategy ``None`` without a stream (a direct load of the published state).

I/O: none (memory only). ``rlkube run --in-process`` gives the rank-0 engine an
:class:`InProcessPublisher` and the eval worker the strategy-None plane
(:class:`~rlkube.weights.plane.NullPlane`) reading from it (:func:`in_process_plane`):

- ``send()`` copies the trainer's state dict once (the trainer goes on training while the eval
  worker may still roll out with the previous version) and announces ``(incarnation, version)``;
- the plane's ``sync()`` waits for a version the task needs and loads the newest one into the
  EVAL policy with ``load_state_dict`` (a second copy), between fragments, in the worker's
  thread; ``loaded_report()`` is the same ``ReportLoaded`` request a cluster worker sends.

Nothing runs in the background, exactly as with strategy ``None`` in a cluster: the plane is
that strategy's, only its :class:`PublisherLoader` differs from the cluster's ``StreamLoader``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from rlkube.policy.base import BasePolicy
from rlkube.spec import WeightStrategy
from rlkube.weight_key import WeightKey
from rlkube.weights.layout import StateDict
from rlkube.weights.plane import EvalPlaneConfig, NullPlane

Snapshot = dict[str, dict[str, torch.Tensor]]

#: How often a wait for a version looks at the worker's stop event (a run ends promptly).
POLL_SECONDS = 0.25


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

    def keep_resident(self, tensors: StateDict) -> bool:
        """In process each version is a clone (the eval policy loads it later): nothing resides."""
        return False

    def wait_writable(self) -> None:
        """Nothing moves in process: the trainer may always update its tensors."""

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


class PublisherLoader:
    """Strategy None's loader in process: the newest published state, loaded with ``load_state_dict``."""

    def __init__(self, publisher: InProcessPublisher) -> None:
        self.publisher = publisher
        self.current_key: WeightKey | None = None
        self.load_seconds = 0.0

    def load_newest(self, policy: BasePolicy, *, wait: float) -> WeightKey | None:
        newest = self.publisher.wait_latest(newer_than=self.current_key, timeout=wait)
        if newest is not None:
            started = time.perf_counter()
            policy.load_state_dict(newest[1])
            policy.weight_version = newest[0].version
            self.current_key, self.load_seconds = newest[0], time.perf_counter() - started
        return self.current_key

    def close(self) -> None:
        pass


def in_process_plane(publisher: InProcessPublisher, *, worker_id: str, node_name: str = "") -> NullPlane:
    """The eval worker's weight plane in process: strategy None, reading ``publisher``."""
    config = EvalPlaneConfig(
        WeightStrategy.NONE, shm_dir=Path(), source="in-process", worker_id=worker_id, node_name=node_name
    )
    return NullPlane(config, loader=PublisherLoader(publisher), poll_seconds=POLL_SECONDS)
