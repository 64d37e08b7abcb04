"""Pod overrides: what ``trainer`` and ``evaluator`` pass through to every pod of their role.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
)

from rlkube.spec.base import (
    GPU_RESOURCE,
    MAX_ENV_ENTRIES,
    Backend,
    EnvEntry,
    NonNegativeInt,
    PositiveInt,
    ResourceList,
    _Model,
)


class Resources(_Model):
    """Container resources, as in a Pod (quantities are passed through to Kubernetes)."""

    limits: ResourceList = Field(default_factory=dict)
    requests: ResourceList = Field(default_factory=dict)


class PodSpecOverrides(_Model):
    """Settings passed through to every pod of a role."""

    replicas: NonNegativeInt = Field(1)
    resources: Resources = Field(default_factory=Resources)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(default_factory=dict)
    priority_class_name: str | None = None
    scheduler_name: str | None = None
    service_account_name: str | None = None
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    env: list[EnvEntry] = Field(
        default_factory=list,
        max_length=MAX_ENV_ENTRIES,
        description="Extra container env (names of the env contract are refused).",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")

    def gpus(self) -> int:
        """GPUs each pod of this role asks for (``limits['nvidia.com/gpu']``)."""
        value = self.resources.limits.get(GPU_RESOURCE, 0)
        try:
            return int(value)
        except (TypeError, ValueError):
            return 0


class TrainerSpec(PodSpecOverrides):
    """``trainer``: the train StatefulSet (DDP ranks; rank 0 hosts the coordinator)."""

    replicas: PositiveInt = Field(1, le=1024, description="Train ranks (DDP world size).")
    backend: Backend = Field(Backend.AUTO)


class EvaluatorSpec(PodSpecOverrides):
    """``evaluator``: the eval StatefulSet (rollout workers; the /scale subresource targets replicas)."""

    replicas: NonNegativeInt = Field(1, le=10_000, description="Eval replicas; `kubectl scale` changes it.")
