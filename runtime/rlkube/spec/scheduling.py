"""The RLJob's ``scheduling`` section: gang admission of the train ranks, with its CEL rules.

Pure: no I/O.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import (
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rlkube.spec.base import PositiveInt, _Model


class GangScheduler(StrEnum):
    """Who admits the train ranks all or nothing (``scheduling.gang``); see docs/operations.md."""

    NONE = "none"  # the default scheduler places each pod on its own
    VOLCANO = "volcano"  # a Volcano PodGroup (scheduling.volcano.sh/v1beta1), schedulerName volcano
    COSCHEDULING = "coscheduling"  # a scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1)
    KUEUE = "kueue"  # Kueue admits the train ranks as one workload from a LocalQueue


class KueueIntegration(StrEnum):
    """Which Kueue integration admits the job (see docs/operations.md, "Kueue")."""

    STATEFULSET = "StatefulSet"  # queue-name on the StatefulSet (Kueue's statefulset integration)
    POD = "Pod"  # queue-name and pod-group labels on the pods (Kueue's plain pod-group integration)
    # The operator is Kueue's integration for RLJobs (an external framework): one Workload per job
    # whose PodSets are the train ranks and the eval workers; the job runs only while admitted.
    RLJOB = "RLJob"


DnsSubdomain = Annotated[
    str,
    StringConstraints(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", max_length=253
    ),
]

_SCHEDULING_CEL: tuple[tuple[str, str, str], ...] = (
    (
        "queue",
        "self.gang != 'kueue' || has(self.queue)",
        "expected the name of a Kueue LocalQueue in this namespace: gang 'kueue' admits from a queue",
    ),
    (
        "queue",
        "!has(self.queue) || self.gang == 'volcano' || self.gang == 'kueue'",
        "expected no queue: only gang 'volcano' (a Volcano Queue) and 'kueue' (a LocalQueue) take one",
    ),
    (
        "scheduleTimeoutSeconds",
        "!has(self.scheduleTimeoutSeconds) || self.gang == 'coscheduling'",
        "expected no scheduleTimeoutSeconds: only gang 'coscheduling' has one",
    ),
)


class SchedulingSpec(_Model):
    """``scheduling``: the train ranks are admitted all or nothing; eval replicas stay elastic."""

    # DDP needs every rank: a train StatefulSet of 4 ranks that gets 3 GPUs holds them while the 4th
    # pod stays Pending. With a gang scheduler the ranks are placed together or not at all. Eval
    # pods never join the gang, so `kubectl scale` changes them without waiting for room for all.

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": rule,
                    "message": f"spec.scheduling.{field}: {message}",
                    "fieldPath": f".{field}",
                    "reason": "FieldValueInvalid",
                }
                for field, rule, message in _SCHEDULING_CEL
            ]
        }
    )

    gang: GangScheduler = Field(
        GangScheduler.NONE,
        description="none: the default scheduler places each pod alone. volcano: a Volcano PodGroup "
        "and schedulerName volcano. coscheduling: a scheduler-plugins PodGroup and the scheduler-plugins "
        "scheduler. kueue: Kueue admits the train ranks as one workload. The PodGroup's minMember is "
        "trainer.replicas (DDP needs every rank); trainer.schedulerName overrides the scheduler name.",
    )
    queue: DnsSubdomain | None = Field(
        None,
        description="volcano: the Volcano Queue (default: Volcano's 'default'). kueue: the LocalQueue "
        "of this namespace (required).",
    )
    kueue_integration: KueueIntegration = Field(
        KueueIntegration.STATEFULSET,
        description="kueue: StatefulSet labels the train StatefulSet (Kueue's statefulset integration, "
        "on by default since Kueue 0.15); Pod labels the train pods as one pod group (Kueue's pod "
        "integration); RLJob makes the whole job one Kueue Workload (train ranks and eval workers as "
        "its PodSets; Kueue's config lists RLJob.v1alpha1.rlkube.io in externalFrameworks): the job "
        "stays suspended until admitted, and an eviction checkpoints and suspends it until admitted "
        "again.",
    )
    schedule_timeout_seconds: PositiveInt | None = Field(
        None,
        description="coscheduling: seconds the ranks wait for the whole gang before the PodGroup "
        "gives up the resources it holds and retries (default: the plugin's, 60).",
    )
    disruption_budget: bool = Field(
        True,
        description="Render a PodDisruptionBudget that lets no voluntary eviction (a node drain) take "
        "a running train rank: one lost rank stops every rank. Unready ranks may still be evicted.",
    )

    @model_validator(mode="after")
    def _gang_fields(self) -> SchedulingSpec:
        problems = []
        if self.gang is GangScheduler.KUEUE and self.queue is None:
            problems.append(f"spec.scheduling.queue: got None, {_SCHEDULING_CEL[0][2]}")
        if self.queue is not None and self.gang not in (GangScheduler.VOLCANO, GangScheduler.KUEUE):
            problems.append(f"spec.scheduling.queue: got {self.queue!r}, {_SCHEDULING_CEL[1][2]}")
        if self.schedule_timeout_seconds is not None and self.gang is not GangScheduler.COSCHEDULING:
            problems.append(
                f"spec.scheduling.scheduleTimeoutSeconds: got {self.schedule_timeout_seconds}, "
                f"{_SCHEDULING_CEL[2][2]}"
            )
        if problems:
            raise PydanticCustomError("cross_field", "{problems}", {"problems": "\n".join(problems)})
        return self
