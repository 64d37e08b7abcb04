"""What a job's trajectories look like, and the checks a pushed fragment must pass against it.

Pure: no I/O. A :class:`TrajectorySchema` is the set of leaves of a fragment (key, dtype, and the
shape after the ``[num_envs, T]`` batch dimensions). The coordinator learns it from the first
fragment it accepts (or a policy declares it) and refuses any later fragment whose leaves differ,
before the trainer ever sees it: a fragment with the wrong keys would otherwise crash train
rank 0. :func:`non_finite` finds NaN or Inf in the leaves that must be finite (observations,
rewards, log-probabilities and values): one poisoned fragment would otherwise make the trainer
publish NaN weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDictBase

from rlkube.data.fragment import NEXT_OBSERVATION, OBSERVATION, REWARD, TERMINATED, TRUNCATED
from rlkube.data.wire import KEY_SEPARATOR

#: Leaves (by their first key part) the env wrote that must hold finite numbers unless the job
#: allows otherwise (``spec.env.allowNonFinite``).
ENV_FINITE_KEYS: frozenset[str] = frozenset({OBSERVATION, NEXT_OBSERVATION, REWARD})
#: Leaves the policy wrote that must always be finite: what its loss is computed against.
POLICY_FINITE_KEYS: frozenset[str] = frozenset({"log_prob", "value"})
FINITE_KEYS: frozenset[str] = ENV_FINITE_KEYS | POLICY_FINITE_KEYS
#: Leaves (by their first key part) every fragment has: the rollout always writes them.
STANDARD_KEYS: tuple[str, ...] = (OBSERVATION, REWARD, TERMINATED, TRUNCATED, NEXT_OBSERVATION)


@dataclass(frozen=True)
class Leaf:
    key: str
    dtype: str
    shape: tuple[int, ...]  # after the batch dimensions

    def __str__(self) -> str:
        return f"{self.key} {self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class TrajectorySchema:
    leaves: tuple[Leaf, ...]

    @classmethod
    def of(cls, td: TensorDictBase) -> TrajectorySchema:
        batch_dims = len(td.batch_size)
        leaves = []
        for key in td.keys(include_nested=True, leaves_only=True):
            name = key if isinstance(key, str) else KEY_SEPARATOR.join(key)
            tensor = td.get(key)
            leaves.append(
                Leaf(name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape[batch_dims:]))
            )
        return cls(tuple(sorted(leaves, key=lambda leaf: leaf.key)))

    def mismatch(self, other: TrajectorySchema) -> str | None:
        """Why ``other`` differs from this schema (None when it matches)."""
        mine = {leaf.key: leaf for leaf in self.leaves}
        theirs = {leaf.key: leaf for leaf in other.leaves}
        missing = sorted(set(mine) - set(theirs))
        extra = sorted(set(theirs) - set(mine))
        if missing or extra:
            return (
                f"keys differ from the job's: missing {missing[:8]}, unexpected {[k[:64] for k in extra[:8]]}"
            )
        for key, leaf in mine.items():
            got = theirs[key]
            if got != leaf:
                return f"{key} is {got.dtype}{list(got.shape)}, the job's is {leaf.dtype}{list(leaf.shape)}"
        return None


def missing_standard_keys(td: TensorDictBase) -> str | None:
    """Which of :data:`STANDARD_KEYS` the fragment lacks, described; None when it has them all."""
    present = {key if isinstance(key, str) else key[0] for key in td.keys(include_nested=True)}
    missing = [key for key in STANDARD_KEYS if key not in present]
    return f"a fragment needs the keys {list(STANDARD_KEYS)}; missing {missing}" if missing else None


def non_finite(td: TensorDictBase, keys: Iterable[str] = FINITE_KEYS) -> str | None:
    """The first leaf under ``keys`` holding NaN or Inf, described; None when all are finite."""
    wanted = set(keys)
    for key in td.keys(include_nested=True, leaves_only=True):
        parts = (key,) if isinstance(key, str) else tuple(key)
        if parts[0] not in wanted:
            continue
        tensor = td.get(key)
        if (tensor.is_floating_point() or tensor.is_complex()) and not all_finite(tensor):
            bad = int((~torch.isfinite(tensor)).sum())
            return f"{KEY_SEPARATOR.join(parts)} holds {bad} non-finite values (NaN or Inf)"
    return None


#: dtypes numpy checks in place (bfloat16 has no numpy twin).
_NUMPY_FLOATS = frozenset({torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128})


def all_finite(tensor: torch.Tensor) -> bool:
    """No NaN or Inf in ``tensor``. On CPU through numpy: one pass, no bool tensor allocated, 5-12x
    faster than torch's ``isfinite().all()`` here (it runs on rank 0 for every pushed fragment)."""
    if tensor.device.type == "cpu" and tensor.dtype in _NUMPY_FLOATS:
        return bool(np.isfinite(tensor.detach().numpy()).all())
    return bool(torch.isfinite(tensor).all())


def non_finite_numbers(values: Iterable[float]) -> bool:
    return any(not math.isfinite(v) for v in values)
