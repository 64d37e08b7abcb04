"""The seam between an EVAL policy's updater thread and the weight plane.

Pure interface: the policy layer defines what it needs, ``rlkube.weights`` provides it (the
dependency points upwards, as the layers require). An update happens in two steps so that
rollouts are blocked only for the second:

1. ``stage()`` runs on the updater thread *outside* the rollout gate: it finds the newest
   complete snapshot and makes it ready to use (maps views into shared memory, or copies into a
   shadow buffer on the accelerator). It returns ``None`` when there is nothing newer.
2. ``commit()`` runs *inside* the gate (no rollout step in flight): it makes the policy use the
   staged tensors, ideally by swapping storage pointers.
3. ``after_commit()`` (optional) runs once the gate is open again: release the previous
   snapshot there, so that no system call (which may hand the GIL to another thread) happens
   while rollouts wait.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from rlkube.weight_key import WeightKey

if TYPE_CHECKING:
    import torch

#: The policy a source loads into: ``WeightSource[BasePolicy]`` (a type parameter, so that this
#: seam does not import ``rlkube.policy.base``, which imports it).
PolicyT = TypeVar("PolicyT", contravariant=True)


@dataclass
class StagedWeights:
    """A snapshot ready to be committed: ``{module: {param: tensor}}`` plus where it came from."""

    version: int
    state_dict: dict[str, dict[str, torch.Tensor]]
    handle: Any = None  # transport-specific (e.g. the pinned shm slot); released after commit
    #: (incarnation, version) of the snapshot; None where the source does not tell incarnations apart.
    key: WeightKey | None = None
    #: (live tensor, its new storage) per parameter, prepared outside the gate, for a commit()
    #: that swaps storage pointers instead of copying (empty where the source does not).
    swaps: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


class WeightSource(Protocol[PolicyT]):
    """Where an EVAL policy's updater thread gets weights from."""

    def stage(self, policy: PolicyT) -> StagedWeights | None: ...

    def commit(self, policy: PolicyT, staged: StagedWeights) -> None: ...

    # Optional: ``def after_commit(self, policy: PolicyT, staged: StagedWeights) -> None``.

    def close(self) -> None: ...
