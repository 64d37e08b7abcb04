"""The RLJob's training sections: ``policy`` (and its ``weightBuffer``), ``buffer`` and its
processors, ``train``, ``security``, ``checkpoint``, ``runPolicy`` and ``log``.

Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    Field,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)

from rlkube.config import Config
from rlkube.spec.base import (
    BufferType,
    CleanPodPolicy,
    LogBackend,
    LogLevel,
    NonNegativeInt,
    PositiveInt,
    RolloutMode,
    StaleFragments,
    VtraceClipAnchor,
    WandbMode,
    WeightBufferType,
    WeightStrategy,
    WeightTransport,
    _Model,
)


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
    vtrace_clip_anchor: VtraceClipAnchor = Field(
        VtraceClipAnchor.LEARNER,
        description="built-in PPO with staleFragments vtrace: the clipped ratio of a stale row is "
        "taken against the learner's policy when the update began (learner: the update may move "
        "the policy a whole clip range, as on fresh rows) or against the policy that collected it "
        "(behaviour, as RLightning's ppo_vtrace).",
    )
    target_return: float | None = Field(
        None, description="Stop early once the mean of the last 20 episode returns reaches this."
    )


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
