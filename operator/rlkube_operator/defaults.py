"""Operator-wide defaults for the pods of every RLJob, merged under each job's own settings.

Pure: values in, values out. The Helm chart's ``jobDefaults.trainer`` / ``jobDefaults.evaluator``
reach the operator as RLKUBE_DEFAULT_POD_SETTINGS, a JSON object ``{"trainer": {...},
"evaluator": {...}}`` whose sections take the keys of an RLJob's ``spec.trainer`` /
``spec.evaluator`` (without ``replicas`` and ``backend``, which are per job).
:func:`parse_pod_defaults` checks it; :func:`merged_role` and :func:`with_pod_defaults` give the
settings the operator renders. The job's own settings always win:

* ``resources``: per resource name. A resource the job names, in requests or in limits, is
  entirely the job's, so a default limit never ends up below the job's own request.
* ``nodeSelector``, ``labels``, ``annotations``: merged per key; the job's value wins.
* ``env``: merged per name; the job's entry wins (the remaining defaults come first).
* ``tolerations``: the job's plus the defaults' (a toleration only permits).
* ``affinity``, ``priorityClassName``, ``schedulerName``, ``serviceAccountName``,
  ``imagePullPolicy``: the job's when it sets one, else the default.

An empty value counts as unset (the API server fills in empty defaults), so a job can override a
default but not remove it. Merging is idempotent: merging twice gives the same result as once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError
from rlkube.contract import Role
from rlkube.spec import RESERVED_ENV_NAMES, RESERVED_ENV_PREFIXES, PodSpecOverrides, RLJob

#: The sections of RLKUBE_DEFAULT_POD_SETTINGS, named as in an RLJob's spec.
SECTIONS: dict[str, Role] = {"trainer": Role.TRAIN, "evaluator": Role.EVAL}
#: Keys of a job's spec.trainer / spec.evaluator that are per job, never defaults.
PER_JOB_KEYS = ("replicas", "backend")
#: Keys a section may hold (the camelCase spelling of PodSpecOverrides' fields, less replicas).
DEFAULTABLE_KEYS: tuple[str, ...] = tuple(
    info.alias or name for name, info in PodSpecOverrides.model_fields.items() if name != "replicas"
)

Pod = TypeVar("Pod", bound=PodSpecOverrides)


@dataclass(frozen=True)
class PodDefaults:
    """Defaults for the train and the eval pods of every RLJob (``replicas`` of these is ignored)."""

    trainer: PodSpecOverrides = field(default_factory=PodSpecOverrides)
    evaluator: PodSpecOverrides = field(default_factory=PodSpecOverrides)

    def for_role(self, role: Role) -> PodSpecOverrides:
        return self.trainer if role is Role.TRAIN else self.evaluator

    def is_empty(self) -> bool:
        return self.trainer == PodSpecOverrides() and self.evaluator == PodSpecOverrides()

    def digest_input(self) -> dict[str, Any]:
        """The defaults as plain JSON (for the spec hash: changed defaults roll the pods)."""
        return {name: _dump(self.for_role(role)) for name, role in SECTIONS.items()}


class PodDefaultsError(ValueError):
    """RLKUBE_DEFAULT_POD_SETTINGS does not describe pod defaults; the message lists every problem."""


def parse_pod_defaults(value: Any) -> PodDefaults:
    """Check a decoded RLKUBE_DEFAULT_POD_SETTINGS value; problems name the key path."""
    if not isinstance(value, Mapping):
        raise PodDefaultsError('expected a JSON object {"trainer": {...}, "evaluator": {...}}')
    problems = [
        f"{key}: unknown section, expected trainer or evaluator" for key in value if key not in SECTIONS
    ]
    sections: dict[str, PodSpecOverrides] = {}
    for name in SECTIONS:
        raw = value.get(name)
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            problems.append(f"{name}: expected an object with the keys of spec.{name}")
            continue
        problems += [
            f"{name}.{key}: set per job (spec.{name}.{key}), not as a default"
            for key in PER_JOB_KEYS
            if key in raw
        ]
        try:
            section = PodSpecOverrides.model_validate({k: v for k, v in raw.items() if k not in PER_JOB_KEYS})
        except ValidationError as exc:
            problems += [
                f"{name}.{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
            ]
            continue
        reserved = sorted(n for n in _env_names(section) if _is_reserved(n))
        if reserved:
            problems.append(
                f"{name}.env: {', '.join(reserved)} belong to the env contract (rlkube sets them)"
            )
        sections[name] = section
    if problems:
        raise PodDefaultsError("; ".join(problems))
    return PodDefaults(**sections)


def merged_role(own: Pod, defaults: PodSpecOverrides) -> Pod:
    """``own`` (a job's spec.trainer or spec.evaluator) with ``defaults`` filled in under it."""
    if defaults == PodSpecOverrides():
        return own
    mine, base = _dump(own), _dump(defaults)
    merged = dict(mine)
    merged["resources"] = _merge_resources(mine.get("resources", {}), base.get("resources", {}))
    for key in ("nodeSelector", "labels", "annotations"):
        merged[key] = {**base.get(key, {}), **mine.get(key, {})}
    own_env = mine.get("env", [])
    own_names = {entry["name"] for entry in own_env}
    merged["env"] = [e for e in base.get("env", []) if e["name"] not in own_names] + own_env
    own_tolerations = mine.get("tolerations", [])
    merged["tolerations"] = own_tolerations + [
        t for t in base.get("tolerations", []) if t not in own_tolerations
    ]
    for key in ("affinity", "priorityClassName", "schedulerName", "serviceAccountName", "imagePullPolicy"):
        if not mine.get(key) and base.get(key):
            merged[key] = base[key]
    return type(own).model_validate(merged)


def with_pod_defaults(job: RLJob, defaults: PodDefaults) -> RLJob:
    """The job as the operator renders it: its trainer and evaluator with the defaults merged in."""
    if defaults.is_empty():
        return job
    spec = job.spec.model_copy(
        update={
            "trainer": merged_role(job.spec.trainer, defaults.trainer),
            "evaluator": merged_role(job.spec.evaluator, defaults.evaluator),
        }
    )
    return job.model_copy(update={"spec": spec})


def _dump(pod: PodSpecOverrides) -> dict[str, Any]:
    return pod.model_dump(mode="json", by_alias=True, exclude_none=True)


def _merge_resources(mine: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    named_by_job = set(mine.get("limits", {})) | set(mine.get("requests", {}))
    out: dict[str, Any] = {}
    for kind in ("limits", "requests"):
        values = {n: q for n, q in base.get(kind, {}).items() if n not in named_by_job}
        values.update(mine.get(kind, {}))
        out[kind] = values
    return out


def _env_names(pod: PodSpecOverrides) -> set[str]:
    return {str(entry.get("name", "")) for entry in pod.env}


def _is_reserved(name: str) -> bool:
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)
