"""The env contract: what the operator (and the local launcher) set, and what a pod reads.

Pure: ``read_pod_env`` takes the environment as an argument. This module is the one table of
env names, ports and paths shared by ``rlkube_operator.render`` and ``rlkube.launch``;
docs/env-contract.md is tested against :data:`ENV_CONTRACT`, and both ends are tested to set
exactly these names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path


class Role(StrEnum):
    TRAIN = "train"
    EVAL = "eval"


# Ports -----------------------------------------------------------------------------------------
#: torch.distributed rendezvous on train rank 0 (torchrun's default).
MASTER_PORT = 29500
#: The PolicyGroup coordinator (gRPC) on train rank 0.
COORDINATOR_PORT = 50051
#: Every train rank serves its weights on this port, so Sharded fetches read from several ranks.
WEIGHT_PORT = 50052
#: Every train rank also serves the bytes of its weight versions here, over a plain socket (the
#: weight data port, ``policy.weightBuffer.transport: tcp``); receivers learn it over gRPC.
WEIGHT_DATA_PORT = 50054
#: Every pod serves gRPC health checking (grpc.health.v1) here: kubelet's liveness and readiness
#: probes (``rlkube.health``).
HEALTH_PORT = 50053
#: The health service that says a pod does its job (its readiness probe); "" says it is alive.
READINESS_SERVICE = "readiness"
#: The operator's liveness and Prometheus metrics endpoint.
OPERATOR_METRICS_PORT = 8080
#: Every train and eval pod serves Prometheus ``/metrics`` here (``RLKUBE_METRICS_PORT``).
METRICS_PORT = 8000
#: The path of that endpoint (the chart's PodMonitor scrapes it).
METRICS_PATH = "/metrics"

# Paths inside pods -----------------------------------------------------------------------------
#: The job manifest, mounted from the job's ConfigMap.
JOB_CONFIG_PATH = "/etc/rlkube/job.yaml"
JOB_CONFIG_KEY = "job.yaml"
#: Run directory: checkpoints, the completion marker, TensorBoard logs.
RUN_DIR = "/var/lib/rlkube"
#: Shared-memory directory of the weight buffer (emptyDir Memory or hostPath, per strategy).
SHM_DIR = "/dev/shm/rlkube"
#: The job's credential, mounted read-only from its Secret (key ``token``; see rlkube.security).
TOKEN_DIR = "/etc/rlkube/credential"
TOKEN_KEY = "token"
TOKEN_PATH = f"{TOKEN_DIR}/{TOKEN_KEY}"
#: Optional mTLS certificates (cert-manager's ``tls.crt``, ``tls.key``, ``ca.crt``), from
#: ``spec.security.tlsSecretName``; named by the optional variable RLKUBE_TLS_DIR.
TLS_DIR = "/etc/rlkube/tls"
TLS_DIR_ENV = "RLKUBE_TLS_DIR"
#: Where the servers of a pod listen: every interface in a pod, loopback in a local run.
LISTEN_ALL = "0.0.0.0"
LISTEN_LOOPBACK = "127.0.0.1"
#: Where the pod entrypoint writes why its container stopped (the container's
#: ``terminationMessagePath``; the kubelet copies it into the pod's container status).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
#: The kubelet keeps at most this many bytes of a termination message.
TERMINATION_MESSAGE_MAX_BYTES = 4096

# The image -----------------------------------------------------------------------------------
#: The non-root user and group the image (Dockerfile) runs as; the operator's pods run as them too.
IMAGE_USER_ID = 10001
IMAGE_GROUP_ID = 10001

# Labels ----------------------------------------------------------------------------------------
LABEL_JOB = "rlkube.io/job-name"
LABEL_ROLE = "rlkube.io/role"
LABEL_REPLICA_INDEX = "rlkube.io/replica-index"
#: Set by the StatefulSet controller on every pod (Kubernetes >= 1.28).
LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"
#: Carried only by the pods the operator renders (the CRD refuses it in user pod overrides):
#: the NetworkPolicies admit peers by it, so a user's own pod cannot pose as a job's pod.
LABEL_JOB_POD = "rlkube.io/job-pod"


def secret_name(job: str) -> str:
    """The job's credential Secret (made by the operator, mounted only into the job's pods)."""
    return f"{job}-credential"


@dataclass(frozen=True)
class EnvVar:
    """One row of the contract. ``source`` says where a pod's value comes from."""

    name: str
    meaning: str
    source: str  # "spec": rendered from the job; "downward:<fieldPath>": Kubernetes fills it in
    roles: tuple[Role, ...] = (Role.TRAIN, Role.EVAL)


ENV_CONTRACT: tuple[EnvVar, ...] = (
    EnvVar("RLKUBE_JOB_NAME", "Name of the RLJob.", "spec"),
    EnvVar("RLKUBE_NAMESPACE", "Namespace of the RLJob.", "downward:metadata.namespace"),
    EnvVar("RLKUBE_ROLE", "`train` or `eval`.", "spec"),
    EnvVar(
        "RLKUBE_REPLICA_INDEX",
        f"Index of this pod in its StatefulSet (label `{LABEL_POD_INDEX}`).",
        f"downward:metadata.labels['{LABEL_POD_INDEX}']",
    ),
    EnvVar("RLKUBE_POD_NAME", "Name of this pod.", "downward:metadata.name"),
    EnvVar(
        "RLKUBE_NODE_NAME",
        "Node this pod runs on; eval pods on one node share a weight buffer.",
        "downward:spec.nodeName",
    ),
    EnvVar("RLKUBE_COORDINATOR_ADDR", "host:port of the PolicyGroup coordinator (train rank 0).", "spec"),
    EnvVar("RLKUBE_SHM_DIR", "Directory of this node's weight buffer.", "spec"),
    EnvVar("RLKUBE_RUN_DIR", "Directory for checkpoints, the completion marker and logs.", "spec"),
    EnvVar("RLKUBE_JOB_CONFIG", "Path of the job manifest (YAML).", "spec"),
    EnvVar("RLKUBE_BACKEND", "torch.distributed backend: `nccl` or `gloo`.", "spec", (Role.TRAIN,)),
    EnvVar("RLKUBE_WEIGHT_PORT", "Port on which every train rank serves its weights.", "spec"),
    EnvVar(
        "RLKUBE_WEIGHT_DATA_PORT",
        f"Port of this rank's weight data port ({WEIGHT_DATA_PORT}; 0: one the kernel picks; receivers "
        "learn it over gRPC).",
        "spec",
        (Role.TRAIN,),
    ),
    EnvVar(
        "RLKUBE_TOKEN_FILE",
        "File holding the job's credential (one token a line: the first is sent, all are accepted).",
        "spec",
    ),
    EnvVar(
        "RLKUBE_LISTEN_HOST",
        "Address the coordinator and weight servers bind (`0.0.0.0` in pods, `127.0.0.1` locally).",
        "spec",
    ),
    EnvVar(
        "RLKUBE_METRICS_PORT",
        f"Port of this pod's Prometheus `{METRICS_PATH}` ({METRICS_PORT}; unset or 0: none).",
        "spec",
    ),
    EnvVar("WORLD_SIZE", "Number of train ranks.", "spec", (Role.TRAIN,)),
    EnvVar(
        "RANK",
        "This train rank (equals RLKUBE_REPLICA_INDEX).",
        f"downward:metadata.labels['{LABEL_POD_INDEX}']",
        (Role.TRAIN,),
    ),
    EnvVar("LOCAL_RANK", "Rank within the pod; always 0 (one process per pod).", "spec", (Role.TRAIN,)),
    EnvVar("MASTER_ADDR", "Rendezvous host: `<job>-train-0.<job>-train.<ns>.svc`.", "spec", (Role.TRAIN,)),
    EnvVar("MASTER_PORT", f"Rendezvous port ({MASTER_PORT}).", "spec", (Role.TRAIN,)),
    EnvVar("PET_NNODES", "torchrun: number of nodes (= WORLD_SIZE).", "spec", (Role.TRAIN,)),
    EnvVar("PET_NPROC_PER_NODE", "torchrun: processes per pod (1).", "spec", (Role.TRAIN,)),
    EnvVar(
        "PET_NODE_RANK",
        "torchrun: node rank (= RANK).",
        f"downward:metadata.labels['{LABEL_POD_INDEX}']",
        (Role.TRAIN,),
    ),
    EnvVar("PET_MASTER_ADDR", "torchrun: rendezvous host (= MASTER_ADDR).", "spec", (Role.TRAIN,)),
    EnvVar("PET_MASTER_PORT", "torchrun: rendezvous port (= MASTER_PORT).", "spec", (Role.TRAIN,)),
)


def contract_names(role: Role) -> tuple[str, ...]:
    """The names a pod of ``role`` gets, in table order."""
    return tuple(var.name for var in ENV_CONTRACT if role in var.roles)


# Writing the contract: the one pod-env builder --------------------------------------------------


@dataclass(frozen=True)
class PodIdentity:
    """What the downward API fills in a cluster (the ``downward:`` rows); a launcher without one
    (``rlkube run``) supplies it."""

    namespace: str
    replica_index: int
    pod_name: str
    node_name: str


@dataclass(frozen=True)
class TrainRendezvous:
    """The values only train ranks get: how they find each other."""

    world_size: int
    backend: str
    master_addr: str
    master_port: int
    #: 0: the kernel picks it (receivers learn it over gRPC).
    weight_data_port: int


def build_pod_env(
    role: Role,
    *,
    job_name: str,
    coordinator_addr: str,
    shm_dir: str,
    run_dir: str,
    job_config: str,
    weight_port: int,
    metrics_port: int,
    token_file: str,
    listen_host: str,
    train: TrainRendezvous | None,
    identity: PodIdentity | None = None,
) -> dict[str, str]:
    """The contract's values for a pod of ``role``, in table order: each caller (the operator's
    render, the local launcher) supplies only its own values; how they map to names (``RANK`` and
    ``PET_NODE_RANK`` are the replica index, the ``PET_*`` rendezvous names repeat the torch ones)
    is spelt here. Without ``identity`` the ``downward:`` rows are left out, for the downward API
    to fill; ``train`` is required for a train pod."""
    values: dict[str, str] = {
        "RLKUBE_JOB_NAME": job_name,
        "RLKUBE_ROLE": role.value,
        "RLKUBE_COORDINATOR_ADDR": coordinator_addr,
        "RLKUBE_SHM_DIR": shm_dir,
        "RLKUBE_RUN_DIR": run_dir,
        "RLKUBE_JOB_CONFIG": job_config,
        "RLKUBE_WEIGHT_PORT": str(weight_port),
        "RLKUBE_METRICS_PORT": str(metrics_port),
        "RLKUBE_TOKEN_FILE": token_file,
        "RLKUBE_LISTEN_HOST": listen_host,
        "LOCAL_RANK": "0",  # one process per pod
        "PET_NPROC_PER_NODE": "1",
    }
    if identity is not None:
        index = str(identity.replica_index)
        values |= {
            "RLKUBE_NAMESPACE": identity.namespace,
            "RLKUBE_REPLICA_INDEX": index,
            "RLKUBE_POD_NAME": identity.pod_name,
            "RLKUBE_NODE_NAME": identity.node_name,
            "RANK": index,
            "PET_NODE_RANK": index,
        }
    if train is not None:
        world, port = str(train.world_size), str(train.master_port)
        values |= {
            "RLKUBE_BACKEND": train.backend,
            "RLKUBE_WEIGHT_DATA_PORT": str(train.weight_data_port),
            "WORLD_SIZE": world,
            "MASTER_ADDR": train.master_addr,
            "MASTER_PORT": port,
            "PET_NNODES": world,
            "PET_MASTER_ADDR": train.master_addr,
            "PET_MASTER_PORT": port,
        }
    elif role is Role.TRAIN:
        raise ValueError("a train pod's env needs its rendezvous (train=TrainRendezvous(...))")
    env: dict[str, str] = {}
    for var in ENV_CONTRACT:
        if role not in var.roles:
            continue
        if var.name in values:
            env[var.name] = values[var.name]
        elif not (identity is None and var.source.startswith("downward:")):
            raise KeyError(f"no value for env contract variable {var.name}")
    return env


# Naming of the job's objects, shared by render.py and the launcher -----------------------------


def train_statefulset_name(job: str) -> str:
    return f"{job}-train"


def eval_statefulset_name(job: str) -> str:
    return f"{job}-eval"


def train_service_name(job: str) -> str:
    """Headless Service giving train pods stable DNS names."""
    return f"{job}-train"


def coordinator_service_name(job: str) -> str:
    return f"{job}-coordinator"


def config_map_name(job: str) -> str:
    return f"{job}-job"


def master_addr(job: str, namespace: str) -> str:
    return f"{job}-train-0.{train_service_name(job)}.{namespace}.svc"


def train_rank_host(job: str, namespace: str, rank: int) -> str:
    return f"{job}-train-{rank}.{train_service_name(job)}.{namespace}.svc"


def coordinator_addr(job: str, namespace: str) -> str:
    return f"{coordinator_service_name(job)}.{namespace}.svc:{COORDINATOR_PORT}"


# Reading the contract in a pod ------------------------------------------------------------------


class EnvContractError(ValueError):
    """A variable of the contract is missing or malformed; the message names it."""


@dataclass(frozen=True)
class PodEnv:
    """The contract as read by a pod at start-up."""

    job_name: str
    namespace: str
    role: Role
    replica_index: int
    pod_name: str
    node_name: str
    coordinator_addr: str
    shm_dir: Path
    run_dir: Path
    job_config: Path
    weight_port: int
    #: The weight data port (train ranks; 0: one the kernel picks)
    weight_data_port: int = 0
    #: Prometheus /metrics (0: not served)
    metrics_port: int = 0
    token_file: Path = Path(TOKEN_PATH)
    listen_host: str = LISTEN_ALL
    # train only
    world_size: int = 1
    rank: int = 0
    backend: str = "gloo"
    master_addr: str = ""
    master_port: int = MASTER_PORT

    @property
    def is_train(self) -> bool:
        return self.role is Role.TRAIN


def read_pod_env(environ: Mapping[str, str]) -> PodEnv:
    """Parse the contract from ``environ``; every problem is listed in one :class:`EnvContractError`."""
    problems: list[str] = []

    def text(name: str) -> str:
        value = environ.get(name, "")
        if not value.strip():
            problems.append(f"{name} is not set")
        return value.strip()

    def integer(name: str, *, minimum: int = 0) -> int:
        raw = text(name)
        if not raw:
            return minimum
        try:
            value = int(raw)
        except ValueError:
            problems.append(f"{name}={raw!r} is not an integer")
            return minimum
        if value < minimum:
            problems.append(f"{name}={value} must be >= {minimum}")
        return value

    def _set(name: str) -> bool:
        return bool(environ.get(name, "").strip())

    raw_role = text("RLKUBE_ROLE")
    role = Role.TRAIN
    if raw_role:
        try:
            role = Role(raw_role)
        except ValueError:
            problems.append(f"RLKUBE_ROLE={raw_role!r} must be 'train' or 'eval'")
    coordinator = text("RLKUBE_COORDINATOR_ADDR")
    if coordinator and not _is_host_port(coordinator):
        problems.append(f"RLKUBE_COORDINATOR_ADDR={coordinator!r} must be host:port")
    env = PodEnv(
        job_name=text("RLKUBE_JOB_NAME"),
        namespace=text("RLKUBE_NAMESPACE"),
        role=role,
        replica_index=integer("RLKUBE_REPLICA_INDEX"),
        pod_name=text("RLKUBE_POD_NAME"),
        node_name=text("RLKUBE_NODE_NAME"),
        coordinator_addr=coordinator,
        shm_dir=Path(text("RLKUBE_SHM_DIR") or SHM_DIR),
        run_dir=Path(text("RLKUBE_RUN_DIR") or RUN_DIR),
        job_config=Path(text("RLKUBE_JOB_CONFIG") or JOB_CONFIG_PATH),
        weight_port=integer("RLKUBE_WEIGHT_PORT", minimum=1),
        # Optional: a pod started by hand (or by an older operator) runs without metrics.
        metrics_port=integer("RLKUBE_METRICS_PORT") if environ.get("RLKUBE_METRICS_PORT", "").strip() else 0,
        token_file=Path(text("RLKUBE_TOKEN_FILE") or TOKEN_PATH),
        listen_host=text("RLKUBE_LISTEN_HOST") or LISTEN_ALL,
    )
    if role is Role.TRAIN and not problems:
        world_size = integer("WORLD_SIZE", minimum=1)
        rank = integer("RANK")
        backend = text("RLKUBE_BACKEND")
        if backend and backend not in ("nccl", "gloo"):
            problems.append(f"RLKUBE_BACKEND={backend!r} must be 'nccl' or 'gloo'")
        if rank >= world_size:
            problems.append(f"RANK={rank} must be < WORLD_SIZE={world_size}")
        if rank != env.replica_index:
            problems.append(f"RANK={rank} differs from RLKUBE_REPLICA_INDEX={env.replica_index}")
        env = replace(
            env,
            world_size=world_size,
            rank=rank,
            backend=backend,
            master_addr=text("MASTER_ADDR"),
            master_port=integer("MASTER_PORT", minimum=1),
            # Optional: a pod rendered by an older operator lets the kernel pick it.
            weight_data_port=integer("RLKUBE_WEIGHT_DATA_PORT") if _set("RLKUBE_WEIGHT_DATA_PORT") else 0,
        )
    if problems:
        raise EnvContractError("the pod's env contract is broken: " + "; ".join(problems))
    return env


def _is_host_port(value: str) -> bool:
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit())


# What train rank 0 says: GetStatus ------------------------------------------------------------


class CoordinatorPhase(StrEnum):
    """What rank 0's engine is doing: ``JobStatus.Phase`` on the wire, value for value by name.

    The RLJob's own phase (``rlkube_operator.status.Phase``) is derived from it and the pods.
    """

    #: Restoring a checkpoint or waiting for eval workers: no figures to show yet.
    STARTING = "Starting"
    RUNNING = "Running"
    COMPLETE = "Complete"
    #: :class:`EngineFailure` names why; the status message says it.
    FAILED = "Failed"


class EngineFailure(StrEnum):
    """Why rank 0's engine failed the job: ``JobStatus.EngineFailure`` on the wire, value for value
    by name, and the reason of the RLJob's ``Failed`` condition (never read from the message)."""

    #: No cause of its own: the message says what happened.
    TRAINING_FAILED = "TrainingFailed"
    #: A training step left NaN or Inf in the weights; they were not published.
    NON_FINITE_WEIGHTS = "NonFiniteWeights"


# Why a pod stopped: its termination message ----------------------------------------------------


class FailureReason(StrEnum):
    """What the pod entrypoint writes as the reason of its termination message (CamelCase)."""

    #: The job manifest the pod read does not parse or validate.
    INVALID_SPEC = "InvalidSpec"
    #: The pod's env contract is missing or malformed (an operator/render bug, or a hand-made pod).
    ENV_CONTRACT_BROKEN = "EnvContractBroken"
    #: A module of ``spec.imports`` / ``spec.policy.module`` does not import.
    IMPORT_FAILED = "ImportFailed"
    #: ``spec.policy.type`` names no registered policy.
    POLICY_NOT_REGISTERED = "PolicyNotRegistered"
    #: The policy refuses its own configuration (``algoCfg``, ``modelCfg``, ``optimCfg``).
    POLICY_CONFIG_INVALID = "PolicyConfigInvalid"
    #: ``spec.buffer.type`` is one the policy cannot learn from (PPO is on-policy: rollout only).
    BUFFER_NOT_SUPPORTED = "BufferNotSupported"
    #: ``spec.env.id`` is not a registered gymnasium id (or ``spec.env.imports`` do not import).
    ENV_NOT_FOUND = "EnvNotFound"
    #: ``spec.checkpoint.path`` names no file (or no checkpoint directory).
    CHECKPOINT_NOT_FOUND = "CheckpointNotFound"
    #: The policy's own code raised while the job ran.
    POLICY_ERROR = "PolicyError"
    #: Anything else raised while the job ran.
    CRASHED = "Crashed"


#: Failures that no restart can fix: the operator fails the job at once, without backoff.
PERMANENT_FAILURES: frozenset[str] = frozenset(
    {
        FailureReason.INVALID_SPEC,
        FailureReason.ENV_CONTRACT_BROKEN,
        FailureReason.IMPORT_FAILED,
        FailureReason.POLICY_NOT_REGISTERED,
        FailureReason.POLICY_CONFIG_INVALID,
        FailureReason.BUFFER_NOT_SUPPORTED,
        FailureReason.ENV_NOT_FOUND,
        FailureReason.CHECKPOINT_NOT_FOUND,
    }
)


@dataclass(frozen=True)
class TerminationMessage:
    """A pod's termination message: one JSON object ``{"reason", "message", "permanent"}``."""

    reason: str
    message: str
    #: Whether restarting the pod cannot help; by default, whether ``reason`` is in PERMANENT_FAILURES.
    permanent: bool

    def encode(self, *, limit: int = TERMINATION_MESSAGE_MAX_BYTES) -> str:
        """The JSON text, with the message cut (marked with an ellipsis) so it fits in ``limit`` bytes."""
        message = self.message
        while True:
            text = json.dumps({"reason": self.reason, "message": message, "permanent": self.permanent})
            size = len(text.encode("utf-8"))
            if size <= limit or not message:
                return text
            keep = max(0, len(message) - (size - limit) - 4)
            message = message[:keep] + "\u2026" if keep else ""


def termination_message(reason: str, message: str, *, permanent: bool | None = None) -> TerminationMessage:
    return TerminationMessage(
        reason=str(reason),
        message=message,
        permanent=(str(reason) in PERMANENT_FAILURES) if permanent is None else permanent,
    )


def parse_termination_message(text: str | None) -> TerminationMessage | None:
    """The structured message a pod wrote, or None for free text (e.g. the kubelet's log fallback)."""
    if not text or not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("reason"), str) or not data["reason"]:
        return None
    permanent = data.get("permanent")
    return termination_message(
        data["reason"],
        str(data.get("message", "")),
        permanent=permanent if isinstance(permanent, bool) else None,
    )
