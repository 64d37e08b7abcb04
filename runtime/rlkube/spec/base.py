"""The RLJob's names and shared pieces: API constants, enums, the strict base model, field types.

Pure: no I/O. Every section of :mod:`rlkube.spec` builds on these.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

API_GROUP = "rlkube.io"
API_VERSION = "v1alpha1"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ("rlj",)

#: Job names become pod names like ``<name>-train-12`` and Service names like
#: ``<name>-coordinator``; 40 characters leaves room for both inside the 63 of a DNS label.
MAX_JOB_NAME_LENGTH = 40
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

GPU_RESOURCE = "nvidia.com/gpu"


class Engine(StrEnum):
    """Which loop train rank 0 drives (RLightning's Sync/AsyncRLEngine, EvaluationEngine, RSLRLEngine)."""

    SYNC = "sync"
    ASYNC = "async"
    EVAL = "eval"
    RSL = "rsl"  # the sync loop with RSL-RL's rollout contract (rlkube.engine.rsl_engine)


class StaleFragments(StrEnum):
    """What the async engine does with a fragment collected by older weights than the learner's."""

    DROP = "drop"  # older than train.maxStaleness: dropped and counted, never trained on
    VTRACE = "vtrace"  # trained on, corrected with V-trace (rlkube.policy.utils.vtrace)


class VtraceClipAnchor(StrEnum):
    """What the built-in PPO's clipped ratio of a stale row is taken against (``staleFragments: vtrace``)."""

    LEARNER = "learner"  # the learner's policy when the update began: a whole trust region per update
    BEHAVIOUR = "behaviour"  # the policy that collected the row, as RLightning's ppo_vtrace


class RolloutMode(StrEnum):
    """How an EVAL policy's ``rollout_step`` is called: plain call or awaited coroutine."""

    SYNC = "sync"
    ASYNC = "async"


class WeightStrategy(StrEnum):
    """How trained weights reach eval policies; see docs/architecture.md."""

    NONE = "None"
    DOUBLE = "Double"
    SHARED = "Shared"
    SHARDED = "Sharded"


class WeightTransport(StrEnum):
    """How a version's bytes cross the network to a node's receiver; see docs/architecture-weights.md."""

    TCP = "tcp"
    GRPC = "grpc"


class WeightBufferType(StrEnum):
    """RLightning's buffer class names, accepted so configs port unchanged; all share one implementation."""

    WEIGHT_BUFFER = "WeightBuffer"
    CPU_WEIGHT_BUFFER = "CPUWeightBuffer"
    SHARDED_WEIGHT_BUFFER = "ShardedWeightBuffer"


class Backend(StrEnum):
    """torch.distributed backend of the train ranks; ``auto`` is NCCL with GPUs, else gloo."""

    AUTO = "auto"
    NCCL = "nccl"
    GLOO = "gloo"


class BufferType(StrEnum):
    """Trajectory storage on the coordinator: on-policy fragments or an off-policy replay ring."""

    ROLLOUT = "rollout"
    REPLAY = "replay"


class CleanPodPolicy(StrEnum):
    """What happens to pods when a job finishes (Kubeflow's semantics, applied to StatefulSets)."""

    ALL = "All"  # scale both StatefulSets to zero
    RUNNING = "Running"  # same as All for StatefulSets: every pod that still runs is removed
    NONE = "None"  # leave pods running (their processes idle after the completion marker)


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogBackend(StrEnum):
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"


class WandbMode(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"
    DISABLED = "disabled"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        # Documents must use the YAML spelling (camelCase), as the CRD does; Python code may use
        # field names with model_copy(update=...).
        validate_by_name=False,
        validate_by_alias=True,
        extra="forbid",
        frozen=True,
        use_enum_values=False,
        validate_default=True,
    )


PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Quantity = int | float | str
ResourceList = dict[str, Quantity]
DnsLabel = Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=63)]

#: Bounds on user env entries; they also bound the cost the API server estimates for the CEL rules
#: that check env names (an unbounded list of unbounded strings exceeds its budget).
MAX_ENV_ENTRIES = 128
MAX_ENV_NAME_LENGTH = 256


def _check_env_entry(entry: dict[str, Any]) -> dict[str, Any]:
    name = entry.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_ENV_NAME_LENGTH:
        raise ValueError(f"an env entry with a 'name' of 1 to {MAX_ENV_NAME_LENGTH} characters")
    return entry


#: One container env entry as in a Pod (``name`` plus ``value`` or ``valueFrom``); kept a plain dict.
EnvEntry = Annotated[
    dict[str, Any],
    AfterValidator(_check_env_entry),
    WithJsonSchema(
        {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": MAX_ENV_NAME_LENGTH}},
            "additionalProperties": True,
        }
    ),
]


class ObjectMeta(_Model):
    """The part of Kubernetes object metadata a job uses; the API server's own keys pass through."""

    model_config = ConfigDict(alias_generator=to_camel, extra="allow", frozen=True)

    name: Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=MAX_JOB_NAME_LENGTH)]
    namespace: DnsLabel = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
