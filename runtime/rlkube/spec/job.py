"""The whole RLJob: ``RLJobSpec`` (its sections, checked by the cross-field rules), the manifest
``RLJob``, and :func:`parse_job` with its one-line-per-field :class:`SpecError`.

Pure: no I/O (``rlkube.jobfile`` reads files).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from rlkube.spec.base import Backend, Engine, ObjectMeta, _Model, _short
from rlkube.spec.env import WRAPPER_TYPES, EnvSpec
from rlkube.spec.pods import EvaluatorSpec, TrainerSpec
from rlkube.spec.rules import cross_field_problems
from rlkube.spec.scheduling import SchedulingSpec
from rlkube.spec.sections import (
    PROCESSOR_TYPES,
    BufferSpec,
    CheckpointSpec,
    LogSpec,
    PolicySpec,
    RunPolicySpec,
    SecuritySpec,
    TrainSpec,
)


class RLJobSpec(_Model):
    """The ``spec`` of an RLJob."""

    image: str | None = Field(
        None, description="Image of the train and eval pods; default: the operator's default image."
    )
    engine: Engine = Field(Engine.SYNC)
    imports: list[str] = Field(
        default_factory=list, description="Modules imported at start-up so their @POLICIES.register runs."
    )
    policy: PolicySpec = Field(default_factory=PolicySpec)
    env: EnvSpec
    buffer: BufferSpec = Field(default_factory=BufferSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    security: SecuritySpec = Field(default_factory=SecuritySpec)
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec)
    log: LogSpec = Field(default_factory=LogSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RLJobSpec:
        problems = cross_field_problems(self)
        if problems:
            raise PydanticCustomError("cross_field", "{problems}", {"problems": "\n".join(problems)})
        return self

    def resolved_backend(self, *, cuda_available: bool | None = None) -> Backend:
        """``auto`` becomes NCCL when the trainer asks for GPUs (or CUDA is present), else gloo."""
        if self.trainer.backend is not Backend.AUTO:
            return self.trainer.backend
        has_gpu = self.trainer.gpus() > 0 if cuda_available is None else cuda_available
        return Backend.NCCL if has_gpu else Backend.GLOO

    def fragment_steps(self) -> int:
        """Env steps in one fragment: every env of an eval replica, ``fragmentLength`` steps each."""
        return self.env.num_envs * self.train.fragment_length

    def fragments_per_epoch(self) -> int:
        return max(1, -(-self.train.steps_per_epoch // self.fragment_steps()))


class RLJob(_Model):
    """A whole RLJob manifest, as ``kubectl apply`` and ``rlkube run`` take it."""

    api_version: Literal["rlkube.io/v1alpha1"] = Field("rlkube.io/v1alpha1")
    kind: Literal["RLJob"] = Field("RLJob")
    metadata: ObjectMeta
    spec: RLJobSpec
    status: dict[str, Any] | None = Field(None, description="Written by the operator; ignored on input.")

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace


class SpecError(ValueError):
    """A job document that does not validate; ``problems`` has one line per bad field."""

    def __init__(self, problems: list[str], *, source: str = "job") -> None:
        self.problems = problems
        self.source = source
        super().__init__(f"invalid {source}:\n" + "\n".join(f"  - {p}" for p in problems))


def parse_job(document: Any, *, source: str = "job") -> RLJob:
    """Validate a manifest (already parsed from YAML) into an :class:`RLJob` or raise :class:`SpecError`."""
    from pydantic import ValidationError

    if not isinstance(document, dict):
        raise SpecError(
            [f"(root): got {type(document).__name__}, expected a mapping (an RLJob manifest)"], source=source
        )
    try:
        return RLJob.model_validate(document)
    except ValidationError as exc:
        problems = [line for err in exc.errors() for line in _describe(err).splitlines()]
        raise SpecError(problems, source=source) from None


def _describe(err: Any) -> str:
    loc = [part for part in err["loc"] if not (isinstance(part, str) and part.startswith("function-after"))]
    loc = _without_union_tags(loc)
    path = _format_path(loc)
    kind = err["type"]
    if kind == "cross_field":
        # Cross-field rules name their own paths, relative to the manifest.
        return str(err["msg"])
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else ""
        hint = f" (did you mean {to_camel(key)!r}?)" if "_" in key and to_camel(key) != key else ""
        return f"{path}: unknown field{hint}"
    if kind == "missing":
        return f"{path}: required field is missing"
    value = err.get("input")
    shown = _short(value)
    expected = str(err["msg"])
    expected = re.sub(r"^(Input should be|Value error, )\s*", "", expected)
    return f"{path}: got {shown}, expected {expected}"


def _without_union_tags(loc: list[Any]) -> list[Any]:
    """Drop the discriminator pydantic puts after a list index (``wrappers[1].FrameStack.stackSize``)."""
    return [
        part
        for i, part in enumerate(loc)
        if not (part in WRAPPER_TYPES + PROCESSOR_TYPES and i > 0 and isinstance(loc[i - 1], int))
    ]


def _format_path(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(root)"
