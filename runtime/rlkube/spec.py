"""The typed RLJob: one source for the runtime, the operator and the CRD schema.

Pure: no I/O (``rlkube.jobfile`` reads files and applies ``--set`` overrides). Field names are
snake_case in Python and camelCase in YAML (``max_epochs`` <-> ``maxEpochs``); every model
forbids unknown keys so a typo is an error, not a silently ignored setting. The sections mirror
RLightning's config (``policy``, ``env``, ``buffer``, ``train``, ``cluster`` -> ``trainer`` and
``evaluator``) so its users recognise them.

Cross-field rules live in :data:`CROSS_FIELD_RULES`: each has the CEL expression the CRD
carries (checked by the API server at apply time) and the Python check the runtime and the
operator run, so the same document is refused for the same reason everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from rlkube.config import Config

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


class WeightBufferSpec(_Model):
    """``policy.weightBuffer``: how weights travel from train rank 0 to eval policies."""

    type: WeightBufferType = Field(
        WeightBufferType.WEIGHT_BUFFER, description="RLightning buffer class name."
    )
    strategy: WeightStrategy = Field(
        WeightStrategy.SHARED,
        description="None: synchronous load from the stream, no thread. Double: a two-slot buffer per "
        "eval pod. Shared: one two-slot buffer per node, one fetch per node. Sharded: the bytes are "
        "fetched as ranges over parallel streams from several train ranks.",
    )
    streams: PositiveInt = Field(4, le=64, description="Parallel range streams per fetch (Sharded).")
    chunk_bytes: int = Field(
        4 << 20,
        ge=64 << 10,
        le=256 << 20,
        description="Bytes per chunk when streaming weights, and the grid of the version checksum "
        "(default 4 MiB).",
    )
    transport: WeightTransport = Field(
        WeightTransport.TCP,
        description="tcp: every train rank also serves the bytes on its weight data port, a plain "
        "socket (mutual TLS when the job has certificates) read straight into the receiver's buffer; "
        "the watch, the layout and the credential stay on gRPC, and a receiver that cannot reach "
        "the port fetches over gRPC. grpc: every byte through gRPC (one more copy per byte on each side).",
    )
    pin_timeout_seconds: float = Field(
        30.0,
        ge=0.1,
        le=3600,
        description="Seconds an eval reader may keep pinned the buffer slot a writer needs before "
        "it loses the slot (a hung reader keeps an unchanged older copy; the writer uses new files).",
    )
    shm_size_limit: str | None = Field(
        None,
        description="Size limit of the in-memory volume holding the buffer (Double), e.g. '2Gi'. "
        "Default: unlimited (bounded by node memory).",
    )
    host_path: str = Field(
        "/dev/shm/rlkube",
        description="Directory on each node shared by the eval pods of that node (Shared, Sharded).",
    )

    @property
    def buffer_strategy(self) -> str:
        """RLightning's name for :attr:`strategy`."""
        return self.strategy.value


class PolicySpec(_Model):
    """``policy``: which registered BasePolicy subclass to run and how it is configured."""

    type: Annotated[str, StringConstraints(min_length=1)] = Field(
        "PPO", description="Registered name of the policy class (@POLICIES.register)."
    )
    module: str | None = Field(
        None, description="Dotted module imported before the registry lookup, e.g. 'mypkg.policies'."
    )
    rollout_mode: RolloutMode = Field(
        RolloutMode.SYNC, description="'async' when rollout_step is a coroutine."
    )
    model_cfg: Config = Field(default_factory=Config, description="Passed to construct_network (free-form).")
    optim_cfg: Config = Field(default_factory=Config, description="Passed to setup_optimizer (free-form).")
    algo_cfg: Config = Field(default_factory=Config, description="Algorithm hyperparameters (free-form).")
    train_config: Config = Field(
        default_factory=Config,
        description="RLightning's policy.train_config (free-form), read as self.config.train_config, "
        "e.g. {ppo_epochs: 4, minibatch_size: 64, clip_ratio: 0.2, entropy_coef: 0.01}.",
    )
    weight_buffer: WeightBufferSpec = Field(default_factory=WeightBufferSpec)
    extra: Config = Field(
        default_factory=Config,
        description="RLightning policy keys that have no field here (free-form), each read as "
        "self.config.<key>, e.g. {ppo_cfg: {clip_ratio: 0.2}, sampling_params: {...}}.",
    )

    @property
    def weight_buffer_strategy(self) -> str:
        return self.weight_buffer.strategy.value

    @model_validator(mode="after")
    def _extra_adds_only_new_keys(self) -> PolicySpec:
        fields = {key for name, info in type(self).model_fields.items() for key in (name, info.alias) if key}
        taken = sorted(key for key in self.extra if key in fields or key.startswith("_"))
        if taken:
            raise ValueError(
                f"extra: {', '.join(taken)} cannot be an extra key (a field of spec.policy, or private); "
                "set the field itself"
            )
        return self

    if not TYPE_CHECKING:  # at runtime only: type checkers keep seeing the declared fields alone

        def __getattr__(self, name: str) -> Any:
            """``self.config.ppo_cfg``: a key of :attr:`extra`, as RLightning reads its policy section."""
            try:
                return super().__getattr__(name)
            except AttributeError:
                extra = self.__dict__.get("extra")
                if name.startswith("_") or extra is None:
                    raise
                if name in extra:
                    return extra[name]
                known = ", ".join(sorted(extra)) or "none"
                raise AttributeError(
                    f"spec.policy has no {name!r}: RLightning policy keys without a field of their own "
                    f"go under spec.policy.extra (its keys: {known})"
                ) from None


# ---------------------------------------------------------------------------- env wrappers
# ``spec.env.wrappers`` is an ordered list; the first entry wraps the raw env, each next one wraps
# the previous. Episode statistics are recorded *inside* all of them (the raw game's returns), so a
# reward wrapper or an episodic-life wrapper never changes what the user is shown.


class ClipActionWrapper(_Model):
    """Clip Box actions to the action space's bounds (gymnasium ``ClipAction``)."""

    type: Literal["ClipAction"]


class RescaleActionWrapper(_Model):
    """Let the policy act in ``[minAction, maxAction]``, rescaled to the env's bounds (``RescaleAction``)."""

    type: Literal["RescaleAction"]
    min_action: float = Field(-1.0, description="Lower bound the policy acts in.")
    max_action: float = Field(1.0, description="Upper bound the policy acts in.")

    @model_validator(mode="after")
    def _ordered(self) -> RescaleActionWrapper:
        if self.min_action >= self.max_action:
            raise ValueError(f"minAction ({self.min_action}) must be below maxAction ({self.max_action})")
        return self


class NormalizeRewardWrapper(_Model):
    """Scale rewards by the running std of the discounted return (gymnasium ``NormalizeReward``).

    Per env: the statistics only shape the training signal, never the returns reported.
    """

    type: Literal["NormalizeReward"]
    gamma: float = Field(0.99, ge=0.0, le=1.0, description="Discount of the return whose std scales.")
    epsilon: float = Field(1e-8, gt=0.0, description="Added to the variance.")
    clip: float | None = Field(10.0, gt=0.0, description="Clip the scaled reward to +-clip (null: off).")


class ScaleRewardWrapper(_Model):
    """Multiply every reward by ``scale``."""

    type: Literal["ScaleReward"]
    scale: float = Field(..., gt=0.0, description="Factor applied to each reward.")


class ClipRewardWrapper(_Model):
    """Clip rewards to ``[min, max]``; ``sign: true`` maps them to -1, 0, 1 (Atari)."""

    type: Literal["ClipReward"]
    min: float = Field(-1.0, description="Lower bound.")
    max: float = Field(1.0, description="Upper bound.")
    sign: bool = Field(False, description="Use sign(reward) instead of clipping.")

    @model_validator(mode="after")
    def _ordered(self) -> ClipRewardWrapper:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class FrameStackWrapper(_Model):
    """Stack the last ``stackSize`` observations on a new leading axis (``FrameStackObservation``)."""

    type: Literal["FrameStack"]
    stack_size: int = Field(4, ge=1, le=64, description="Observations stacked.")


class AtariPreprocessingWrapper(_Model):
    """gymnasium ``AtariPreprocessing`` (noop reset, frame skip with max-pool, resize, grey).

    Make the env with ``kwargs: {frameskip: 1}`` (ALE v5 skips 4 frames itself) and
    ``repeatActionProbability`` as wanted; this wrapper does the skipping.
    """

    type: Literal["AtariPreprocessing"]
    noop_max: int = Field(30, ge=0, description="Up to this many no-ops after reset.")
    frame_skip: int = Field(4, ge=1, description="Frames per action; the last two are max-pooled.")
    screen_size: int = Field(84, ge=8, le=1024, description="Square side of the resized frame.")
    grayscale_obs: bool = Field(True, description="One grey channel instead of RGB.")
    terminal_on_life_loss: bool = Field(False, description="End the episode at a life loss.")


class EpisodicLifeWrapper(_Model):
    """Signal ``terminated`` at every life loss, reset the game only when it is over (Atari)."""

    type: Literal["EpisodicLife"]


class FireResetWrapper(_Model):
    """Press FIRE after each reset, for games that wait for it (Breakout)."""

    type: Literal["FireReset"]


class TimeLimitWrapper(_Model):
    """Truncate episodes after ``maxEpisodeSteps`` steps (``TimeLimit``)."""

    type: Literal["TimeLimit"]
    max_episode_steps: int = Field(..., ge=1, description="Steps before the episode is truncated.")


class NormalizeObservationWrapper(_Model):
    """Refused with a pointer: observation statistics are model state, not per-env state."""

    type: Literal["NormalizeObservation"]

    @model_validator(mode="after")
    def _refuse(self) -> NormalizeObservationWrapper:
        raise ValueError(
            "no NormalizeObservation wrapper (per-env statistics would differ between eval workers "
            "and the trainer); set spec.policy.modelCfg.normalizeObservation: true, whose statistics "
            "travel with the weights"
        )


class CustomWrapper(_Model):  # type: ignore[no-redef]  # mypy's pydantic plugin: a field named kwargs
    """A wrapper a module in ``spec.env.imports`` registered with ``@WRAPPERS.register(name)``."""

    type: Literal["Custom"]
    name: Annotated[str, StringConstraints(min_length=1)] = Field(..., description="Registered name.")
    kwargs: Config = Field(default_factory=Config, description="Keyword arguments of the wrapper.")


WRAPPER_TYPES = (
    "ClipAction",
    "RescaleAction",
    "NormalizeReward",
    "ScaleReward",
    "ClipReward",
    "FrameStack",
    "AtariPreprocessing",
    "EpisodicLife",
    "FireReset",
    "TimeLimit",
    "NormalizeObservation",
    "Custom",
)

WrapperSpec = Annotated[
    ClipActionWrapper
    | RescaleActionWrapper
    | NormalizeRewardWrapper
    | ScaleRewardWrapper
    | ClipRewardWrapper
    | FrameStackWrapper
    | AtariPreprocessingWrapper
    | EpisodicLifeWrapper
    | FireResetWrapper
    | TimeLimitWrapper
    | NormalizeObservationWrapper
    | CustomWrapper,
    Field(discriminator="type"),
    # The CRD cannot carry a discriminated union (structural schemas have no oneOf of objects):
    # it checks the type name at apply time; the settings are checked by this model everywhere.
    WithJsonSchema(
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": list(WRAPPER_TYPES)}},
            "additionalProperties": True,
            "description": "One env wrapper: type and its settings (see docs/rljob-reference.md).",
        }
    ),
]


class EnvSpec(_Model):  # type: ignore[no-redef]  # mypy's pydantic plugin: a field named kwargs
    """``env``: the gymnasium environment each eval replica runs as a vector of ``numEnvs`` copies."""

    id: Annotated[str, StringConstraints(min_length=1)] = Field(
        ..., description="gymnasium id, e.g. CartPole-v1."
    )
    num_envs: PositiveInt = Field(8, le=4096, description="Environments per eval replica.")
    kwargs: Config = Field(default_factory=Config, description="Keyword arguments for gymnasium.make.")
    vectorization: Literal["sync", "async", "envpool"] = Field(
        "sync",
        description="How the envs are stepped: gymnasium's 'sync' (in-process) or 'async' (in "
        "subprocesses), or 'envpool' (C++ threads; the id must be one envpool has, and each wrapper "
        "maps to an envpool option or the job is refused).",
    )
    imports: list[str] = Field(
        default_factory=list,
        description="Modules imported before gymnasium.make (registering envs and @register_wrapper ones).",
    )
    wrappers: list[WrapperSpec] = Field(
        default_factory=list,
        description="Wrappers applied in order around each env (the first wraps the raw env); "
        "episode returns are always reported raw, from inside all of them.",
    )
    allow_non_finite: bool = Field(
        False,
        description="Accept NaN and Inf in observations and rewards (an env that uses them as markers "
        "and a policy that handles them); otherwise the coordinator refuses such fragments. "
        "Log-probabilities and values must be finite either way.",
    )


class GAEProcessor(_Model):
    """Advantages and returns as RLightning's rollout buffer hands them over (``data["advantages"]``,
    ``data["returns"]``), from the values the policy returned while collecting (GAE)."""

    type: Literal["GAE"]
    gamma: float = Field(0.99, ge=0.0, le=1.0, description="Discount factor.")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="GAE's lambda.")
    normalize: bool = Field(
        True,
        description="Advantages to zero mean and unit std over the train rank's share (returns stay raw).",
    )
    value_key: Annotated[str, StringConstraints(min_length=1)] = Field(
        "value", description="The PolicyResponse field holding V(observation)."
    )
    bootstrap: Literal["policy", "none"] = Field(
        "policy",
        description="Where a row is cut (a truncated episode, the fragment's end): 'policy' bootstraps "
        "from the policy's get_value(next_observation), as the built-in PPO does; 'none' treats the cut "
        "as an episode end.",
    )


class FlattenProcessor(_Model):
    """``[rows, T]`` fragments -> ``[rows * T]`` transitions, the shape RLightning's buffer samples."""

    type: Literal["Flatten"]


PROCESSOR_TYPES = ("GAE", "Flatten")

ProcessorSpec = Annotated[
    GAEProcessor | FlattenProcessor,
    Field(discriminator="type"),
    WithJsonSchema(
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string", "enum": list(PROCESSOR_TYPES)}},
            "additionalProperties": True,
            "description": "One buffer processor: type and its settings (see docs/rljob-reference.md).",
        }
    ),
]


class BufferSpec(_Model):
    """``buffer``: trajectory storage on the coordinator."""

    type: BufferType = Field(BufferType.ROLLOUT)
    capacity: PositiveInt = Field(
        64,
        description="Rollout: fragments held before eval workers are told to wait (back-pressure). "
        "Replay: transitions kept.",
    )
    processors: list[ProcessorSpec] = Field(
        default_factory=list,
        max_length=8,
        description="Applied in order to each train rank's share before update_dataset (rollout only).",
    )

    @model_validator(mode="after")
    def _processors_fit(self) -> BufferSpec:
        flattened_at: int | None = None
        for index, processor in enumerate(self.processors):
            if self.type is BufferType.REPLAY:
                raise ValueError(
                    f"processors[{index}] ({processor.type}): buffer processors work on rollout fragments; "
                    "buffer.type replay hands over sampled transitions"
                )
            if isinstance(processor, FlattenProcessor):
                flattened_at = index if flattened_at is None else flattened_at
            elif flattened_at is not None:
                raise ValueError(
                    f"processors[{index}] ({processor.type}) needs [rows, T] fragments, but "
                    f"processors[{flattened_at}] (Flatten) comes first: put Flatten last"
                )
        return self


class TrainSpec(_Model):
    """``train``: the loop's length and cadence."""

    max_epochs: PositiveInt = Field(
        100, description="Epochs to train; one epoch publishes one weight version."
    )
    steps_per_epoch: PositiveInt = Field(
        2048, description="Env steps collected per epoch, over all eval replicas together."
    )
    fragment_length: PositiveInt = Field(
        64,
        le=100_000,
        description="Steps per env in one fragment, the unit of work an eval replica leases.",
    )
    batch_size: PositiveInt = Field(256, description="Minibatch size of an SGD step.")
    eval_interval: NonNegativeInt = Field(
        10, description="Run evaluation episodes every N epochs (0: never)."
    )
    eval_episodes: PositiveInt = Field(10, description="Episodes per evaluation.")
    save_interval: NonNegativeInt = Field(10, description="Checkpoint every N epochs (0: only at the end).")
    seed: NonNegativeInt = Field(1)
    max_staleness: NonNegativeInt = Field(
        1,
        description="async engine: new work needs weights at most this many versions old; with "
        "staleFragments drop, fragments older than this when trained are dropped.",
    )
    stale_fragments: StaleFragments = Field(
        StaleFragments.DROP,
        description="async engine: drop fragments older than maxStaleness, or train on every fragment "
        "and correct the ones older than the learner's weights with V-trace (built-in PPO).",
    )
    vtrace_rho_clip: float = Field(
        1.0, gt=0.0, description="V-trace rho-bar: clip of the importance weight of each TD error (IMPALA)."
    )
    vtrace_c_clip: float = Field(
        1.0, gt=0.0, description="V-trace c-bar: clip of the trace coefficients (IMPALA)."
    )
    target_return: float | None = Field(
        None, description="Stop early once the mean of the last 20 episode returns reaches this."
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


class SecuritySpec(_Model):
    """``security``: how the job's pods prove themselves to each other (a per-job token always)."""

    tls_secret_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        description="A Secret with tls.crt, tls.key and ca.crt (cert-manager's layout): every gRPC "
        "server of the job then requires, and every channel presents, a certificate signed by ca.crt.",
    )


class CheckpointSpec(_Model):
    """``checkpoint``: where checkpoints go and whether a restarted job resumes."""

    resume: bool = Field(True, description="Resume from the newest checkpoint when one exists.")
    path: str | None = Field(
        None, description="A checkpoint file to start from (eval engine: the policy to evaluate)."
    )
    keep: PositiveInt = Field(3, description="Checkpoints kept; older ones are deleted.")
    claim_name: str | None = Field(
        None, description="PersistentVolumeClaim for the run directory; default an emptyDir per pod."
    )


class RunPolicySpec(_Model):
    """``runPolicy``: the job's lifecycle, as in Kubeflow's RunPolicy."""

    suspend: bool = Field(False, description="Scale to zero and keep the job; resume by setting false.")
    backoff_limit: NonNegativeInt = Field(3, description="Train restarts tolerated before the job fails.")
    eval_backoff_limit: NonNegativeInt = Field(
        5,
        description="Restarts of one eval worker (its pod's restart count) tolerated before the job fails "
        "with that worker's error; a scale-down is not a restart.",
    )
    active_deadline_seconds: PositiveInt | None = Field(None, description="Fail the job after this long.")
    ttl_seconds_after_finished: NonNegativeInt | None = Field(
        None, description="Delete the finished job (and its children) after this long."
    )
    clean_pod_policy: CleanPodPolicy = Field(CleanPodPolicy.ALL)


class WandbSpec(_Model):
    """``log.wandb``: the Weights & Biases run (with ``wandb`` in ``log.backends``)."""

    project: str | None = Field(None, description="W&B project; default: the job's name.")
    entity: str | None = Field(None, description="W&B team or user; default: the API key's.")
    mode: WandbMode = Field(
        WandbMode.ONLINE,
        description="online (needs WANDB_API_KEY in spec.trainer.env), offline (files in the run "
        "directory, `wandb sync` later) or disabled. WANDB_MODE in the pod's env overrides it.",
    )
    tags: list[str] = Field(default_factory=list, description="Tags of the W&B run.")


class LogSpec(_Model):
    """``log``: what the runtime writes."""

    level: LogLevel = Field(LogLevel.INFO)
    tensorboard: bool = Field(True, description="false drops tensorboard from backends.")
    interval_seconds: float = Field(2.0, gt=0, description="How often progress is reported.")
    backends: list[LogBackend] = Field(
        [LogBackend.TENSORBOARD],
        description="Where train rank 0 logs its metrics, under the same names in each: tensorboard "
        "(event files in the run directory), wandb (Weights & Biases; the image needs the "
        "`wandb` extra).",
    )
    wandb: WandbSpec = Field(default_factory=WandbSpec)

    def active_backends(self) -> tuple[LogBackend, ...]:
        """``backends`` in order, without tensorboard when ``tensorboard`` is false."""
        return tuple(
            b for b in dict.fromkeys(self.backends) if self.tensorboard or b is not LogBackend.TENSORBOARD
        )


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


@dataclass(frozen=True)
class CrossFieldRule:
    """A rule over several fields: CEL for the CRD (``self`` is the spec), Python for everyone else."""

    path: str  # the field the error names, relative to the manifest
    cel: str
    message: str
    check: Callable[[RLJobSpec], bool]
    got: Callable[[RLJobSpec], Any]


def cross_field_problems(spec: RLJobSpec) -> list[str]:
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
