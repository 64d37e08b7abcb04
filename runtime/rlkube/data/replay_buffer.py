"""Off-policy trajectory storage: a fixed-size ring of transitions, sampled uniformly.

Pure and thread-safe: no I/O. ``extend`` flattens any batch shape (``[num_envs, T]`` fragments
included) into transitions and writes them over the oldest ones; storage is allocated on the first
``extend`` from that batch's keys, dtypes and shapes, and every later batch must have the same keys.
"""

from __future__ import annotations

import threading

import torch
from tensordict import TensorDict, TensorDictBase


class ReplayBuffer:
    """A ring of at most ``capacity`` transitions."""

    def __init__(self, capacity: int, *, seed: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._storage: TensorDict | None = None
        self._keys: set[object] = set()
        self._cursor = 0  # next slot to write
        self._size = 0
        self._lock = threading.Lock()
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(seed)

    def __len__(self) -> int:
        with self._lock:
            return self._size

    def extend(self, batch: TensorDictBase) -> int:
        """Append every transition of ``batch`` (any batch shape); returns how many were written."""
        flat = batch.reshape(-1) if batch.batch_dims != 1 else batch
        count = int(flat.batch_size[0]) if flat.batch_dims else 0
        if count == 0:
            return 0
        if count > self.capacity:  # only the newest ones fit
            flat = flat[count - self.capacity :]
            count = self.capacity
        keys = set(flat.keys(include_nested=True, leaves_only=True))
        with self._lock:
            if self._storage is None:
                self._storage = flat[:1].expand(self.capacity).clone()
                self._keys = keys
            elif keys != self._keys:
                missing = sorted(map(str, self._keys - keys))
                extra = sorted(map(str, keys - self._keys))
                raise ValueError(f"transition keys changed: missing {missing}, unexpected {extra}")
            index = (torch.arange(count) + self._cursor) % self.capacity
            self._storage[index] = flat.to("cpu")
            self._cursor = (self._cursor + count) % self.capacity
            self._size = min(self._size + count, self.capacity)
        return count

    def sample(self, batch_size: int) -> TensorDict:
        """``batch_size`` transitions drawn uniformly with replacement (a copy, safe to keep)."""
        with self._lock:
            if self._storage is None or self._size == 0:
                raise ValueError("cannot sample from an empty replay buffer")
            index = torch.randint(0, self._size, (batch_size,), generator=self._generator)
            return self._storage[index].clone()
