"""Eval side: the WeightSource that BasePolicy's updater thread uses, and the header watcher.

I/O (shm, a thread, a unix socket). :class:`ShmWeightSource` implements
``rlkube.policy.weight_source.WeightSource`` over a buffer directory:

* ``stage()`` (updater thread, rollouts running) pins the newest snapshot and prepares it:
  in **view** mode (CPU models) the snapshot's zero-copy views *are* the new weights; in
  **copy** mode (models on an accelerator) the slot is copied once into the idle one of two
  shadow buffers on the model's device (one DMA from the page-locked slot on a GPU, see
  :mod:`rlkube.weights.device_copy`) and the pin is dropped at once.
* ``commit()`` (inside the rollout gate) swaps each parameter's storage pointer
  (``param.data = new``): no bytes move while rollouts are blocked. In view mode the previous
  snapshot's pin is released afterwards, which is what lets the writer reuse that slot.

A policy that overrides ``load_state_dict`` gets it called inside the gate instead (its own
copy semantics); the pin is then released right after the call.

:class:`ShmWatcher` wakes on the writer's datagram (or polls the header) and calls
``on_change`` (usually ``policy.notify_update_weights``) when the header advances.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from torch import nn

from rlkube.policy.base import BasePolicy, unwrap
from rlkube.policy.weight_source import StagedWeights
from rlkube.weight_key import WeightKey
from rlkube.weights.cuda_host import HostRegistrations
from rlkube.weights.device_copy import load_slot_into_device
from rlkube.weights.layout import LayoutError, WeightLayout, views_of
from rlkube.weights.shm_files import notify_socket_path
from rlkube.weights.shm_reader import ShmReader, Snapshot

if TYPE_CHECKING:
    from collections.abc import Iterable

logger = logging.getLogger(__name__)

Mode = Literal["view", "copy"]


@dataclass(frozen=True)
class Binding:
    """Where one layout entry lands in a live model: the tensor whose storage is swapped."""

    module: str
    param: str
    target: torch.Tensor


def bind(policy: BasePolicy, layout: WeightLayout) -> list[Binding]:
    """Find every layout entry's parameter or buffer in ``policy.model_list``; mismatches are named."""
    models = {name: unwrap(model) for name, model in policy.model_list}
    bindings = []
    for entry in layout.entries:
        model = models.get(entry.module)
        if model is None:
            raise LayoutError(
                f"the trainer sends module {entry.module!r}; the eval policy has {sorted(models)}"
            )
        owner_path, _, attr = entry.param.rpartition(".")
        try:
            owner: nn.Module = model.get_submodule(owner_path) if owner_path else model
        except AttributeError as exc:
            raise LayoutError(f"eval model {entry.module!r} has no submodule for {entry.param!r}") from exc
        target: torch.Tensor | None = owner._parameters.get(attr)
        if target is None:
            target = owner._buffers.get(attr)
        if target is None:
            raise LayoutError(f"eval model {entry.module!r} has no parameter or buffer {entry.param!r}")
        if target.dtype != entry.torch_dtype or tuple(target.shape) != entry.shape:
            raise LayoutError(
                f"{entry.name}: the eval model has {target.dtype}{list(target.shape)}, the trainer sends "
                f"{entry.dtype}{list(entry.shape)}"
            )
        bindings.append(Binding(entry.module, entry.param, target))
    return bindings


def swaps_pointers(policy: BasePolicy) -> bool:
    """Whether commit can swap storage pointers (the policy keeps BasePolicy's load_state_dict)."""
    return type(policy).load_state_dict is BasePolicy.load_state_dict


def swap_pairs(
    bindings: Iterable[Binding], state_dict: dict[str, dict[str, torch.Tensor]]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(live tensor, its new storage) per binding: prepared outside the gate."""
    return [(b.target, state_dict[b.module][b.param]) for b in bindings]


def swap_in(pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Point every live tensor at its new storage (about a microsecond each, no bytes copied)."""
    for target, new in pairs:
        target.data = new


class _Shadows:
    """Two flat buffers on the model's device; the model uses one while the other is filled."""

    def __init__(self, layout: WeightLayout, device: torch.device) -> None:
        self.layout = layout
        self.flats = [torch.empty(layout.total_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        self.views = [views_of(flat, layout) for flat in self.flats]
        self.in_use = 1  # so the first fill goes to buffer 0


class ShmWeightSource:
    """A :class:`~rlkube.policy.weight_source.WeightSource` over a shm buffer directory."""

    def __init__(
        self, directory: Path | str, *, mode: Mode = "view", device: str | None = None, verify: bool = False
    ) -> None:
        if mode not in ("view", "copy"):
            raise ValueError(f"mode must be 'view' or 'copy', not {mode!r}")
        self.directory = Path(directory)
        self.mode: Mode = mode
        self.device = device
        self.reader = ShmReader(self.directory, verify=verify)
        self.current_key: WeightKey | None = None  # what the policy uses
        self._held: Snapshot | None = None
        self._bindings: dict[tuple[int, str], list[Binding]] = {}
        self._shadows: _Shadows | None = None
        self._lock = threading.Lock()
        self._to_release: list[Snapshot] = []
        #: Copy mode on a GPU: this reader's slot mappings page-locked for one DMA per load.
        self._registrations = HostRegistrations(read_only=True)
        #: How the last copy-mode load reached the device: "dma", "pageable" or "cpu".
        self.last_load_path = ""

    def open(self) -> ShmWeightSource:
        self.reader.open()
        return self

    def stage(self, policy: BasePolicy) -> StagedWeights | None:
        snap = self.reader.acquire(newer_than=self.current_key)
        if snap is None:
            return None
        try:
            key = (id(policy), snap.layout.digest)
            bindings = self._bindings.get(key)
            if bindings is None:
                bindings = self._bindings[key] = bind(policy, snap.layout)
            if self.mode == "view":
                tensors, handle = snap.views, snap
            else:
                tensors = self._fill_shadow(policy, snap)
                snap.release()
                handle = None
        except BaseException:
            snap.release()
            raise
        return StagedWeights(
            version=snap.version,
            state_dict=tensors,
            handle=handle,
            key=snap.key,
            swaps=swap_pairs(bindings, tensors),
        )

    def _fill_shadow(self, policy: BasePolicy, snap: Snapshot) -> dict[str, dict[str, torch.Tensor]]:
        device = torch.device(self.device or policy.device)
        if self._shadows is None or self._shadows.layout.digest != snap.layout.digest:
            self._shadows = _Shadows(snap.layout, device)
        idle = 1 - self._shadows.in_use
        self.last_load_path = load_slot_into_device(
            self._shadows.flats[idle], snap.buffer, slot=snap.slot, registrations=self._registrations
        )
        return self._shadows.views[idle]

    def commit(self, policy: BasePolicy, staged: StagedWeights) -> None:
        """Inside the gate: swap pointers only (no system call; the old pin goes in after_commit)."""
        previous = staged.handle  # let go after the gate unless the model now uses its views
        try:
            with self._lock:
                if swaps_pointers(policy):
                    swap_in(staged.swaps)
                    previous, self._held = self._held, staged.handle
                else:
                    policy.load_state_dict(staged.state_dict)  # the policy's own (copying) load
                if self._shadows is not None and self.mode == "copy":
                    self._shadows.in_use = 1 - self._shadows.in_use
                self.current_key = staged.key
        finally:
            if previous is not None:
                self._to_release.append(previous)

    def after_commit(self, policy: BasePolicy, staged: StagedWeights) -> None:
        """After the gate reopened: release the snapshot the model left (the writer may wait for it)."""
        while self._to_release:
            self._to_release.pop().release()

    def discard(self, staged: StagedWeights) -> None:
        """Drop a staged snapshot that will not be committed."""
        if staged.handle is not None:
            staged.handle.release()

    def close(self) -> None:
        """Release the pin and detach. Call it only once the policy no longer runs rollouts."""
        with self._lock:
            self.after_commit(None, None)  # type: ignore[arg-type]
            if self._held is not None:
                self._held.release()
                self._held = None
        self._registrations.close()
        self.reader.close()


class ShmWatcher:
    """Calls ``on_change()`` when a buffer directory's header advances (and at start if it has a version)."""

    def __init__(
        self, directory: Path | str, on_change: Callable[[], None], *, poll_interval: float = 0.25
    ) -> None:
        self.directory = Path(directory)
        self.on_change = on_change
        self.poll_interval = poll_interval
        self.reader = ShmReader(self.directory)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._sock_path: Path | None = None
        self.wakeups = 0

    def start(self) -> ShmWatcher:
        self.reader.open()
        path = notify_socket_path(self.directory)
        if path is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(path))
            sock.setblocking(False)
            self._sock, self._sock_path = sock, path
        self._thread = threading.Thread(target=self._run, name="weight-watcher", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        last = None
        while not self._stop.is_set():
            seq = self.reader.seq()
            if seq is not None and seq != last:
                if seq > 0:
                    self.wakeups += 1
                    try:
                        self.on_change()
                    except Exception:
                        logger.exception("weight watcher callback failed")
                last = seq
            self._wait()

    def _wait(self) -> None:
        if self._sock is None:
            self._stop.wait(self.poll_interval)
            return
        ready, _, _ = select.select([self._sock], [], [], self.poll_interval)
        if ready:
            with contextlib.suppress(OSError):
                while self._sock.recv(64):  # drain: one wake-up covers every datagram
                    pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._sock is not None:
            self._sock.close()
            if self._sock_path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._sock_path)
        self.reader.close()
