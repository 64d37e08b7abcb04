"""Cross-field rules: each has the CEL expression the CRD carries (checked by the API server at
apply time) and the Python check the runtime and the operator run, so the same document is
refused for the same reason everywhere.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlkube.spec.base import Backend, BufferType, Engine, _short
from rlkube.spec.pods import EvaluatorSpec, PodSpecOverrides, TrainerSpec
from rlkube.spec.sections import BufferSpec, CheckpointSpec, TrainSpec


class JobSections(Protocol):
    """What the rules read of a spec: :class:`~rlkube.spec.job.RLJobSpec` has all of it (a
    protocol, so that the rules do not import the job model that runs them)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def train(self) -> TrainSpec: ...

    @property
    def buffer(self) -> BufferSpec: ...

    @property
    def trainer(self) -> TrainerSpec: ...

    @property
    def evaluator(self) -> EvaluatorSpec: ...

    @property
    def checkpoint(self) -> CheckpointSpec: ...


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule over several fields: CEL for the CRD (``self`` is the spec), Python for everyone else."""

    path: str  # the field the error names, relative to the manifest
    cel: str
    message: str
    check: Callable[[JobSections], bool]
    got: Callable[[JobSections], Any]


def cross_field_problems(spec: JobSections) -> list[str]:
    """One line per broken cross-field rule: the field path, the value and what was expected."""
    return [
        f"{rule.path}: got {_short(rule.got(spec))}, {rule.message}"
        for rule in CROSS_FIELD_RULES
        if not rule.check(spec)
    ]


def _env_names(pod: PodSpecOverrides) -> set[str]:
    return {str(item.get("name", "")) for item in pod.env}


#: Names of the env contract that users may not set (kept here to keep spec free of imports).
RESERVED_ENV_PREFIXES = ("RLKUBE_", "PET_")
RESERVED_ENV_NAMES = frozenset({"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"})


def _no_reserved_env(pod: PodSpecOverrides) -> bool:
    return not any(
        name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES) for name in _env_names(pod)
    )


#: The pod label users may not set (``rlkube.contract.LABEL_JOB_POD``, repeated to keep spec free of
#: imports): only the operator's rendered pods carry it, and NetworkPolicies admit peers by it.
RESERVED_LABEL = "rlkube.io/job-pod"


def _no_reserved_labels(pod: PodSpecOverrides) -> bool:
    return RESERVED_LABEL not in pod.labels


_RESERVED_LABELS_CEL = "!has(self.{role}.labels) || !('" + RESERVED_LABEL + "' in self.{role}.labels)"

_RESERVED_LABELS_MESSAGE = (
    f"expected no {RESERVED_LABEL} label: the operator sets it, and NetworkPolicies admit the job's "
    "pods by it"
)

_RESERVED_CEL = (
    "!has(self.{role}.env) || self.{role}.env.all(e, !(e.name in "
    "['WORLD_SIZE','RANK','LOCAL_RANK','MASTER_ADDR','MASTER_PORT']) "
    "&& !e.name.startsWith('RLKUBE_') && !e.name.startsWith('PET_'))"
)

CROSS_FIELD_RULES: tuple[CrossFieldRule, ...] = (
    CrossFieldRule(
        path="spec.train.batchSize",
        cel="!has(self.train) || !has(self.train.batchSize) || !has(self.train.stepsPerEpoch) "
        "|| self.train.batchSize <= self.train.stepsPerEpoch "
        "|| (has(self.buffer) && has(self.buffer.type) && self.buffer.type == 'replay')",
        message="expected at most spec.train.stepsPerEpoch (a replay buffer may sample more)",
        check=lambda s: s.train.batch_size <= s.train.steps_per_epoch or s.buffer.type is BufferType.REPLAY,
        got=lambda s: s.train.batch_size,
    ),
    CrossFieldRule(
        path="spec.buffer.type",
        cel="!has(self.engine) || self.engine != 'rsl' || !has(self.buffer) || !has(self.buffer.type) "
        "|| self.buffer.type == 'rollout'",
        message="expected rollout with engine rsl (RSL-RL trains on-policy on the whole collected batch)",
        check=lambda s: s.engine is not Engine.RSL or s.buffer.type is BufferType.ROLLOUT,
        got=lambda s: s.buffer.type.value,
    ),
    CrossFieldRule(
        path="spec.trainer.backend",
        cel="!has(self.trainer) || !has(self.trainer.backend) || self.trainer.backend != 'nccl' "
        "|| (has(self.trainer.resources) && has(self.trainer.resources.limits) "
        "&& 'nvidia.com/gpu' in self.trainer.resources.limits)",
        message="expected gloo or auto without GPUs: nccl needs "
        "spec.trainer.resources.limits['nvidia.com/gpu']",
        check=lambda s: s.trainer.backend is not Backend.NCCL or s.trainer.gpus() > 0,
        got=lambda s: s.trainer.backend.value,
    ),
    CrossFieldRule(
        path="spec.checkpoint.path",
        cel="self.engine != 'eval' || (has(self.checkpoint) && has(self.checkpoint.path))",
        message="expected a checkpoint file: engine 'eval' evaluates a saved policy",
        check=lambda s: s.engine is not Engine.EVAL or s.checkpoint.path is not None,
        got=lambda s: s.checkpoint.path,
    ),
    CrossFieldRule(
        path="spec.trainer.env",
        cel=_RESERVED_CEL.format(role="trainer"),
        message="expected no names of the env contract (RLKUBE_*, PET_*, WORLD_SIZE, RANK, "
        "LOCAL_RANK, MASTER_ADDR, MASTER_PORT): rlkube sets those",
        check=lambda s: _no_reserved_env(s.trainer),
        got=lambda s: sorted(_env_names(s.trainer)),
    ),
    CrossFieldRule(
        path="spec.evaluator.env",
        cel=_RESERVED_CEL.format(role="evaluator"),
        message="expected no names of the env contract (RLKUBE_*, PET_*, WORLD_SIZE, RANK, "
        "LOCAL_RANK, MASTER_ADDR, MASTER_PORT): rlkube sets those",
        check=lambda s: _no_reserved_env(s.evaluator),
        got=lambda s: sorted(_env_names(s.evaluator)),
    ),
    CrossFieldRule(
        path="spec.trainer.labels",
        cel=_RESERVED_LABELS_CEL.format(role="trainer"),
        message=_RESERVED_LABELS_MESSAGE,
        check=lambda s: _no_reserved_labels(s.trainer),
        got=lambda s: sorted(s.trainer.labels),
    ),
    CrossFieldRule(
        path="spec.evaluator.labels",
        cel=_RESERVED_LABELS_CEL.format(role="evaluator"),
        message=_RESERVED_LABELS_MESSAGE,
        check=lambda s: _no_reserved_labels(s.evaluator),
        got=lambda s: sorted(s.evaluator.labels),
    ),
)
