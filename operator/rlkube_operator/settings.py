"""Every operator setting, read from the environment in one place (:func:`load_settings`).

Pure: :func:`load_settings` takes the environment as a mapping. The Helm chart sets these
variables on the operator Deployment; ``rlkube operator --help`` and docs/operator.md list them.
Bad values raise :class:`SettingsError` naming the variable, before the operator starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlkube import __version__
from rlkube.contract import COORDINATOR_PORT, OPERATOR_METRICS_PORT

from rlkube_operator.defaults import PodDefaults, PodDefaultsError, parse_pod_defaults


class SettingsError(ValueError):
    """An operator environment variable has a value we cannot use; the message names it."""


#: Tolerations added to every pod that asks for ``nvidia.com/gpu`` when RLKUBE_GPU_TOLERATIONS is unset
#: (the taint the NVIDIA GPU operator and most managed GPU node pools put on GPU nodes).
DEFAULT_GPU_TOLERATIONS: tuple[dict[str, Any], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)


@dataclass(frozen=True)
class RenderSettings:
    """What the operator adds to every RLJob's objects (the pure ``render`` reads only this)."""

    #: Image of train and eval pods when spec.image is not set (RLKUBE_DEFAULT_IMAGE).
    default_image: str = f"rlkube:{__version__}"
    #: imagePullPolicy when the job does not set one (RLKUBE_IMAGE_PULL_POLICY); None: Kubernetes' default.
    image_pull_policy: str | None = None
    #: Tolerations added to pods that request GPUs (RLKUBE_GPU_TOLERATIONS, a JSON list).
    gpu_tolerations: tuple[dict[str, Any], ...] = DEFAULT_GPU_TOLERATIONS
    #: Node selector added to every RLJob pod unless the job sets the same key (RLKUBE_DEFAULT_NODE_SELECTOR).
    default_node_selector: Mapping[str, str] = field(default_factory=dict)
    #: Per-role pod settings merged under each job's spec.trainer / spec.evaluator
    #: (RLKUBE_DEFAULT_POD_SETTINGS; the chart's jobDefaults; see rlkube_operator.defaults).
    pod_defaults: PodDefaults = field(default_factory=PodDefaults)
    #: Seconds a train pod gets to checkpoint after SIGTERM (RLKUBE_TRAIN_GRACE_SECONDS).
    train_grace_seconds: int = 60
    #: Seconds an eval pod gets to finish its fragment and deregister (RLKUBE_EVAL_GRACE_SECONDS); a
    #: fragment of the default size takes well under this.
    eval_grace_seconds: int = 90
    #: Render a NetworkPolicy per job that admits only its own pods (and the operator) to the
    #: coordinator, weight and rendezvous ports (RLKUBE_NETWORK_POLICY=true).
    network_policy: bool = False
    #: Namespace and pod labels of the operator, admitted to the coordinator port by that NetworkPolicy
    #: (RLKUBE_OPERATOR_NAMESPACE, normally from the downward API; RLKUBE_OPERATOR_POD_LABELS, JSON).
    operator_namespace: str = "rlkube-system"
    operator_pod_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "rlkube-operator"}
    )
    #: Size of the in-memory /dev/shm of train pods (RLKUBE_TRAIN_SHM_SIZE); None: unlimited.
    train_shm_size: str | None = None

    def digest_input(self) -> dict[str, Any]:
        """What shapes the pods, for the spec hash: a changed setting rolls the pods it changes.

        The operator's version is not in it: an upgrade restarts a job's pods only when what it
        renders for them changes (a new default image, new defaults), never for nothing.
        """
        return {
            "image": self.default_image,
            "pull": self.image_pull_policy,
            "gpu": list(self.gpu_tolerations),
            "nodes": dict(self.default_node_selector),
            "pods": self.pod_defaults.digest_input(),
            "grace": [self.train_grace_seconds, self.eval_grace_seconds],
            "shm": self.train_shm_size,
        }


@dataclass(frozen=True)
class OperatorSettings:
    """Settings of the operator process; :attr:`render` is what reaches the rendered objects."""

    render: RenderSettings = field(default_factory=RenderSettings)
    #: Namespaces to serve (RLKUBE_WATCH_NAMESPACES, comma-separated); empty: the whole cluster.
    namespaces: tuple[str, ...] = ()
    #: Port of /healthz and /metrics (RLKUBE_METRICS_PORT).
    metrics_port: int = OPERATOR_METRICS_PORT
    #: Seconds between status refreshes of one job (RLKUBE_STATUS_INTERVAL).
    status_interval: float = 5.0
    #: Deadline of one GetStatus call to a coordinator (RLKUBE_COORDINATOR_TIMEOUT).
    coordinator_timeout: float = 2.0
    #: Where a job's coordinator answers (RLKUBE_COORDINATOR_ADDRESS): a template with {job},
    #: {namespace} and {port}. The default is the coordinator Service's cluster DNS name;
    #: "unix:///run/x/{namespace}.{job}.sock" serves tests and local clusters.
    coordinator_address: str = "{job}-coordinator.{namespace}.svc:{port}"
    #: The watch request's server-side timeout, seconds (RLKUBE_WATCH_SERVER_TIMEOUT): the API
    #: server closes the stream after this and kopf reconnects, so a silently dropped
    #: connection costs at most this long.
    watch_server_timeout: int = 300
    #: Client-side watch timeout, seconds (RLKUBE_WATCH_CLIENT_TIMEOUT); longer than the server's.
    watch_client_timeout: int = 330
    #: Timeout of one API request, seconds (RLKUBE_API_TIMEOUT).
    api_timeout: float = 30.0
    #: Threads for blocking API and gRPC calls (RLKUBE_WORKERS).
    workers: int = 8
    #: Log level of the operator (RLKUBE_LOG_LEVEL): debug, info, warning, error.
    log_level: str = "info"
    #: Field manager name for server-side apply (RLKUBE_FIELD_MANAGER).
    field_manager: str = "rlkube-operator"
    #: Name of the coordination.k8s.io Lease, in the operator's namespace (RLKUBE_OPERATOR_NAMESPACE),
    #: that the replicas elect a leader through (RLKUBE_LEADER_ELECTION_LEASE); empty: standalone,
    #: one replica only. The chart sets it (see docs/operations.md, High availability).
    leader_election_lease: str = ""
    #: Seconds the Lease stays valid without a renewal (RLKUBE_LEASE_DURATION). The leader renews
    #: every 2/15 of it and exits when it has not renewed for 2/3 of it; a standby takes a killed
    #: leader's Lease this long after its last renewal, one that exits cleanly at once.
    lease_duration: int = 10

    def coordinator_target(self, job: str, namespace: str) -> str:
        return self.coordinator_address.format(job=job, namespace=namespace, port=COORDINATOR_PORT)


#: name -> (meaning, default shown in docs); the operator's documented environment.
ENV_VARS: dict[str, str] = {
    "RLKUBE_DEFAULT_IMAGE": "image of RLJob pods when spec.image is unset",
    "RLKUBE_IMAGE_PULL_POLICY": "imagePullPolicy when the job sets none (Always, IfNotPresent, Never)",
    "RLKUBE_GPU_TOLERATIONS": "JSON list of tolerations for pods that request nvidia.com/gpu ('[]' for none)",
    "RLKUBE_DEFAULT_NODE_SELECTOR": "JSON object merged into every RLJob pod's nodeSelector",
    "RLKUBE_DEFAULT_POD_SETTINGS": 'JSON {"trainer": {...}, "evaluator": {...}}: pod settings (keys of '
    "spec.trainer/spec.evaluator but replicas and backend) merged under each job's own; the job wins",
    "RLKUBE_TRAIN_GRACE_SECONDS": "terminationGracePeriodSeconds of train pods (default 60)",
    "RLKUBE_EVAL_GRACE_SECONDS": "terminationGracePeriodSeconds of eval pods (default 90)",
    "RLKUBE_TRAIN_SHM_SIZE": "sizeLimit of the train pods' in-memory /dev/shm (default unlimited)",
    "RLKUBE_NETWORK_POLICY": "true: one NetworkPolicy per job admitting only its pods and the operator",
    "RLKUBE_OPERATOR_NAMESPACE": "the operator's namespace (downward API), admitted by that NetworkPolicy",
    "RLKUBE_OPERATOR_POD_LABELS": "JSON object: the operator pod's labels, admitted by that NetworkPolicy",
    "RLKUBE_WATCH_NAMESPACES": "comma-separated namespaces to serve; empty: all namespaces",
    "RLKUBE_METRICS_PORT": "port of /healthz and /metrics (default 8080)",
    "RLKUBE_STATUS_INTERVAL": "seconds between status refreshes of a job (default 5)",
    "RLKUBE_COORDINATOR_TIMEOUT": "deadline of one GetStatus call, seconds (default 2)",
    "RLKUBE_COORDINATOR_ADDRESS": "template of a coordinator's address with {job} {namespace} {port}",
    "RLKUBE_WATCH_SERVER_TIMEOUT": "server-side watch timeout, seconds (default 300)",
    "RLKUBE_WATCH_CLIENT_TIMEOUT": "client-side watch timeout, seconds (default 330)",
    "RLKUBE_API_TIMEOUT": "timeout of one API request, seconds (default 30)",
    "RLKUBE_WORKERS": "threads for blocking API and gRPC calls (default 8)",
    "RLKUBE_LOG_LEVEL": "debug, info, warning or error (default info)",
    "RLKUBE_FIELD_MANAGER": "server-side apply field manager (default rlkube-operator)",
    "RLKUBE_LEADER_ELECTION_LEASE": "name of the Lease (in RLKUBE_OPERATOR_NAMESPACE) the replicas elect a "
    "leader through; empty: standalone",
    "RLKUBE_LEASE_DURATION": "seconds the Lease stays valid without a renewal; a killed leader's successor "
    "waits this long (default 10)",
}


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``RLKUBE_*`` names in ``environ`` that are no operator setting (a typo is otherwise silent)."""
    return sorted(name for name in environ if name.startswith("RLKUBE_") and name not in ENV_VARS)


_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
_LOG_LEVELS = ("debug", "info", "warning", "error")


def load_settings(environ: Mapping[str, str] | None = None) -> OperatorSettings:
    """Read every ``RLKUBE_*`` operator variable; all problems are reported in one :class:`SettingsError`."""
    env = dict(os.environ if environ is None else environ)
    problems: list[str] = []
    base = OperatorSettings()
    rbase = base.render

    def text(name: str, default: str) -> str:
        return env.get(name, "").strip() or default

    def number(name: str, default: float, *, minimum: float, integer: bool = False) -> Any:
        raw = env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = int(raw) if integer else float(raw)
        except ValueError:
            problems.append(f"{name}={raw!r} is not {'an integer' if integer else 'a number'}")
            return default
        if value < minimum:
            problems.append(f"{name}={raw} must be >= {minimum}")
            return default
        return value

    def json_value(name: str, default: Any, kind: type) -> Any:
        raw = env.get(name, "").strip()
        if not raw:
            return default
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append(f"{name} is not JSON ({exc.msg})")
            return default
        if not isinstance(value, kind):
            problems.append(f"{name} must be a JSON {'list' if kind is list else 'object'}")
            return default
        return value

    def flag(name: str) -> bool:
        raw = env.get(name, "").strip().lower()
        if raw in ("", "0", "false", "no", "off"):
            return False
        if raw in ("1", "true", "yes", "on"):
            return True
        problems.append(f"{name}={raw!r} must be true or false")
        return False

    pull = env.get("RLKUBE_IMAGE_PULL_POLICY", "").strip() or None
    if pull is not None and pull not in _PULL_POLICIES:
        problems.append(f"RLKUBE_IMAGE_PULL_POLICY={pull!r} must be one of {', '.join(_PULL_POLICIES)}")
        pull = None
    tolerations = json_value("RLKUBE_GPU_TOLERATIONS", list(rbase.gpu_tolerations), list)
    if not all(isinstance(t, dict) for t in tolerations):
        problems.append("RLKUBE_GPU_TOLERATIONS must be a JSON list of objects")
        tolerations = []
    selector = json_value("RLKUBE_DEFAULT_NODE_SELECTOR", {}, dict)
    try:
        pod_defaults = parse_pod_defaults(json_value("RLKUBE_DEFAULT_POD_SETTINGS", {}, dict))
    except PodDefaultsError as exc:
        problems.append(f"RLKUBE_DEFAULT_POD_SETTINGS: {exc}")
        pod_defaults = PodDefaults()
    pod_labels = json_value("RLKUBE_OPERATOR_POD_LABELS", dict(rbase.operator_pod_labels), dict)
    log_level = text("RLKUBE_LOG_LEVEL", base.log_level).lower()
    if log_level not in _LOG_LEVELS:
        problems.append(f"RLKUBE_LOG_LEVEL={log_level!r} must be one of {', '.join(_LOG_LEVELS)}")
        log_level = base.log_level
    address = text("RLKUBE_COORDINATOR_ADDRESS", base.coordinator_address)
    try:
        address.format(job="j", namespace="n", port=1)
    except (KeyError, IndexError, ValueError):
        problems.append(
            f"RLKUBE_COORDINATOR_ADDRESS={address!r} may use only {{job}}, {{namespace}}, {{port}}"
        )
        address = base.coordinator_address
    render = RenderSettings(
        default_image=text("RLKUBE_DEFAULT_IMAGE", rbase.default_image),
        image_pull_policy=pull,
        gpu_tolerations=tuple(tolerations),
        default_node_selector={str(k): str(v) for k, v in selector.items()},
        pod_defaults=pod_defaults,
        train_grace_seconds=number(
            "RLKUBE_TRAIN_GRACE_SECONDS", rbase.train_grace_seconds, minimum=0, integer=True
        ),
        eval_grace_seconds=number(
            "RLKUBE_EVAL_GRACE_SECONDS", rbase.eval_grace_seconds, minimum=0, integer=True
        ),
        network_policy=flag("RLKUBE_NETWORK_POLICY"),
        operator_namespace=text("RLKUBE_OPERATOR_NAMESPACE", rbase.operator_namespace),
        operator_pod_labels={str(k): str(v) for k, v in pod_labels.items()},
        train_shm_size=env.get("RLKUBE_TRAIN_SHM_SIZE", "").strip() or None,
    )
    settings = OperatorSettings(
        render=render,
        namespaces=tuple(n.strip() for n in env.get("RLKUBE_WATCH_NAMESPACES", "").split(",") if n.strip()),
        metrics_port=number("RLKUBE_METRICS_PORT", base.metrics_port, minimum=0, integer=True),
        status_interval=number("RLKUBE_STATUS_INTERVAL", base.status_interval, minimum=0.1),
        coordinator_timeout=number("RLKUBE_COORDINATOR_TIMEOUT", base.coordinator_timeout, minimum=0.05),
        coordinator_address=address,
        watch_server_timeout=number(
            "RLKUBE_WATCH_SERVER_TIMEOUT", base.watch_server_timeout, minimum=1, integer=True
        ),
        watch_client_timeout=number(
            "RLKUBE_WATCH_CLIENT_TIMEOUT", base.watch_client_timeout, minimum=1, integer=True
        ),
        api_timeout=number("RLKUBE_API_TIMEOUT", base.api_timeout, minimum=0.1),
        workers=number("RLKUBE_WORKERS", base.workers, minimum=1, integer=True),
        log_level=log_level,
        field_manager=text("RLKUBE_FIELD_MANAGER", base.field_manager),
        leader_election_lease=env.get("RLKUBE_LEADER_ELECTION_LEASE", "").strip(),
        lease_duration=number("RLKUBE_LEASE_DURATION", base.lease_duration, minimum=3, integer=True),
    )
    if settings.watch_client_timeout <= settings.watch_server_timeout:
        problems.append("RLKUBE_WATCH_CLIENT_TIMEOUT must be longer than RLKUBE_WATCH_SERVER_TIMEOUT")
    if problems:
        raise SettingsError("bad operator settings: " + "; ".join(problems))
    return settings
