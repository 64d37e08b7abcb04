"""RLJob -> the Kubernetes objects that run it.

Pure: no I/O, no clock, no kopf or Kubernetes client; every function returns plain dicts that
the handlers server-side apply. One builder per object, each tested on its own (tests/render/).

Objects of a job ``J`` in namespace ``N`` (names from :mod:`rlkube.contract`):

* ConfigMap ``J-job``: the job manifest at ``job.yaml``, without ``spec.evaluator.replicas`` (the
  live eval count is the StatefulSet's, so scaling never touches this ConfigMap) and without
  labels and annotations (so relabelling a job does not roll its pods).
* Service ``J-train`` (headless, ``publishNotReadyAddresses``): stable DNS for every train rank,
  published before readiness so rank 0's address resolves while the ranks start.
* Service ``J-coordinator``: train rank 0's coordinator port.
* Service ``J-eval`` (headless): the eval StatefulSet's governing Service.
* StatefulSet ``J-train``: DDP ranks, ``Parallel`` pod management, rank from the pod-index label.
* StatefulSet ``J-eval``: rollout workers; ``kubectl scale rlj/J`` changes only its replicas.
* PodGroup ``J-train`` (``spec.scheduling.gang`` volcano or coscheduling): the train ranks as one
  gang of ``trainer.replicas``, each with the label or annotation its scheduler reads; Kueue needs
  no object of ours, only labels (on the train StatefulSet or on its pods). Eval pods never join.
* PodDisruptionBudget ``J-train``: no voluntary eviction of a ready train rank
  (``scheduling.disruptionBudget: false`` renders it with ``minAvailable: 0``, so turning it off
  takes effect on a running job without the operator deleting anything).
* NetworkPolicy ``J-train`` (when the operator enables it): only pods carrying ``rlkube.io/job-pod: J``
  (set on the operator's pod templates only; the CRD refuses ``rlkube.io/*`` labels in user
  overrides) and the operator reach the train ranks' ports.
* Secret ``J-credential`` (:func:`render_credential_secret`, applied by the reconciler once, with a
  token it generates: render stays pure): the job's bearer token, mounted read-only at
  ``/etc/rlkube/credential`` into this job's pods only. With ``spec.security.tlsSecretName`` the
  user's TLS Secret is mounted at ``/etc/rlkube/tls`` too (mutual TLS on every gRPC call).

The ``rlkube.io/spec-hash`` annotation is a digest of the spec without ``evaluator.replicas`` and
of the operator's render settings: it is on every object and every pod template, so a spec
change rolls the pods, and a scale does not.

Pods run the image's entrypoint (tini, then ``rlkube``) with ``args: ["pod"]``, so tini stays PID 1
and reaps and forwards signals. They run as the image's non-root user (``IMAGE_USER_ID``) under a
pod securityContext that Pod Security ``restricted`` admits, except that the Shared and Sharded
weight strategies mount a hostPath (``baseline`` forbids it) which the kubelet creates
root-owned: a small init container running as root with only CAP_CHOWN hands it to that user.
The operator's per-role pod defaults (:mod:`rlkube_operator.defaults`) are merged under the job's
own trainer and evaluator settings here, in the pod templates and the backend.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import yaml
from rlkube import contract as c
from rlkube.contract import Role
from rlkube.spec import (
    GangScheduler,
    KueueIntegration,
    PodSpecOverrides,
    RLJob,
    SchedulingSpec,
    WeightStrategy,
)

from rlkube_operator.defaults import merged_role, with_pod_defaults
from rlkube_operator.quantity import gang_requests, pod_requests
from rlkube_operator.settings import RenderSettings

ANNOTATION_SPEC_HASH = "rlkube.io/spec-hash"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "rlkube-operator"
LABEL_POD_NAME = "statefulset.kubernetes.io/pod-name"
CONTAINER_NAME = {Role.TRAIN: "train", Role.EVAL: "eval"}
#: Arguments of the image's entrypoint (``tini -- rlkube``): pods run ``rlkube pod``.
POD_ARGS = ["pod"]
#: The init container that hands a hostPath weight directory to the image's user.
WEIGHTS_DIR_INIT = "weights-dir"

PORTS = {
    "rendezvous": c.MASTER_PORT,
    "coordinator": c.COORDINATOR_PORT,
    "weights": c.WEIGHT_PORT,
    "weight-data": c.WEIGHT_DATA_PORT,
}
#: Every train and eval container declares its Prometheus endpoint under this port name (the
#: chart's PodMonitor selects it); it is not in PORTS: Services and the job-only ingress skip it.
METRICS_PORT_NAME = "metrics"


def eval_service_name(job: str) -> str:
    """The eval StatefulSet's governing (headless) Service."""
    return f"{job}-eval"


def network_policy_name(job: str) -> str:
    return f"{job}-train"


def render(job: RLJob, settings: RenderSettings, *, stopped: bool = False) -> list[dict[str, Any]]:
    """Every object of the job, in apply order. ``stopped`` scales both StatefulSets to zero."""
    pod_group = render_pod_group(job, settings)
    objects = [
        render_config_map(job, settings),
        render_train_service(job, settings),
        render_coordinator_service(job, settings),
        render_eval_service(job, settings),
        # The PodGroup before the pods that name it: the scheduler then never sees an orphan rank.
        *([pod_group] if pod_group is not None else []),
        render_train_disruption_budget(job, settings, stopped=stopped),
        render_train_statefulset(job, settings, stopped=stopped),
        render_eval_statefulset(job, settings, stopped=stopped),
    ]
    if settings.network_policy:
        objects.append(render_network_policy(job, settings))
    return objects


# Shared pieces -------------------------------------------------------------------------------


def job_document(job: RLJob) -> dict[str, Any]:
    """The manifest the pods read: the spec without ``evaluator.replicas`` and without server fields."""
    spec = job.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec.get("evaluator", {}).pop("replicas", None)
    if job.spec.scheduling == SchedulingSpec():
        # Left out when default, so the spec hash of jobs that never asked for a gang is unchanged.
        spec.pop("scheduling", None)
    # Labels and annotations stay out: relabelling a job must not roll its pods.
    metadata = {"name": job.name, "namespace": job.namespace}
    return {"apiVersion": job.api_version, "kind": job.kind, "metadata": metadata, "spec": spec}


def spec_hash(job: RLJob, settings: RenderSettings) -> str:
    """Digest of what shapes the pods; replica counts of the eval role are left out."""
    payload = {"job": job_document(job)["spec"], "settings": settings.digest_input()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def role_labels(job: RLJob, role: Role) -> dict[str, str]:
    return {c.LABEL_JOB: job.name, c.LABEL_ROLE: role.value}


def owner_references(job: RLJob) -> list[dict[str, Any]]:
    uid = (job.metadata.model_extra or {}).get("uid")
    if not uid:
        return []  # rendered from a file: no owner yet
    return [
        {
            "apiVersion": job.api_version,
            "kind": job.kind,
            "name": job.name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(job: RLJob, settings: RenderSettings, name: str, role: Role | None) -> dict[str, Any]:
    labels = {c.LABEL_JOB: job.name, LABEL_MANAGED_BY: MANAGED_BY}
    if role is not None:
        labels[c.LABEL_ROLE] = role.value
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.namespace,
        "labels": labels,
        "annotations": {ANNOTATION_SPEC_HASH: spec_hash(job, settings)},
    }
    owners = owner_references(job)
    if owners:
        meta["ownerReferences"] = owners
    return meta


# ConfigMap and Services ----------------------------------------------------------------------


def render_config_map(job: RLJob, settings: RenderSettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, settings, c.config_map_name(job.name), None),
        "data": {c.JOB_CONFIG_KEY: yaml.safe_dump(job_document(job), sort_keys=False)},
    }


def _service_ports(names: tuple[str, ...]) -> list[dict[str, Any]]:
    return [{"name": n, "port": PORTS[n], "targetPort": PORTS[n], "protocol": "TCP"} for n in names]


def render_train_service(job: RLJob, settings: RenderSettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, settings, c.train_service_name(job.name), Role.TRAIN),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": role_labels(job, Role.TRAIN),
            "ports": _service_ports(("rendezvous", "coordinator", "weights", "weight-data")),
        },
    }


def render_coordinator_service(job: RLJob, settings: RenderSettings) -> dict[str, Any]:
    rank0 = f"{c.train_statefulset_name(job.name)}-0"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, settings, c.coordinator_service_name(job.name), Role.TRAIN),
        "spec": {
            "type": "ClusterIP",
            "publishNotReadyAddresses": True,
            "selector": {**role_labels(job, Role.TRAIN), LABEL_POD_NAME: rank0},
            "ports": _service_ports(("coordinator", "weights", "weight-data")),
        },
    }


def render_eval_service(job: RLJob, settings: RenderSettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, settings, eval_service_name(job.name), Role.EVAL),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": role_labels(job, Role.EVAL),
            # A headless Service without ports is valid; eval pods serve nothing.
        },
    }


def job_pod_labels(job: RLJob) -> dict[str, str]:
    """Labels only the operator's rendered pods of ``job`` carry (NetworkPolicies admit by them)."""
    return {c.LABEL_JOB: job.name, c.LABEL_JOB_POD: job.name}


def render_credential_secret(job: RLJob, settings: RenderSettings, *, token: str) -> dict[str, Any]:
    """The job's credential Secret holding ``token`` (the caller generates it once, and keeps it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(job, settings, c.secret_name(job.name), None),
        "type": "Opaque",
        "data": {c.TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def credential_volumes(job: RLJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts, extra env) that give a pod the job's token, and its TLS files when asked for."""
    volumes: list[dict[str, Any]] = [
        {
            "name": "credential",
            "secret": {"secretName": c.secret_name(job.name), "defaultMode": 0o440},
        }
    ]
    mounts: list[dict[str, Any]] = [{"name": "credential", "mountPath": c.TOKEN_DIR, "readOnly": True}]
    env: list[dict[str, Any]] = []
    tls = job.spec.security.tls_secret_name
    if tls:
        volumes.append({"name": "tls", "secret": {"secretName": tls, "defaultMode": 0o440}})
        mounts.append({"name": "tls", "mountPath": c.TLS_DIR, "readOnly": True})
        env.append({"name": c.TLS_DIR_ENV, "value": c.TLS_DIR})
    return volumes, mounts, env


def render_network_policy(job: RLJob, settings: RenderSettings) -> dict[str, Any]:
    """Only this job's pods reach the train ranks' ports; the operator reaches the coordinator.

    The metrics port is open to any scraper (it serves read-only Prometheus text).
    """
    own_pods = {"podSelector": {"matchLabels": job_pod_labels(job)}}
    operator = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}},
        "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, settings, network_policy_name(job.name), Role.TRAIN),
        "spec": {
            "podSelector": {"matchLabels": role_labels(job, Role.TRAIN)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [own_pods],
                    "ports": [{"protocol": "TCP", "port": p} for p in PORTS.values()],
                },
                {"from": [operator], "ports": [{"protocol": "TCP", "port": c.COORDINATOR_PORT}]},
                # Read-only Prometheus metrics: any scraper (like the operator's own metrics port).
                {"ports": [{"protocol": "TCP", "port": c.METRICS_PORT}]},
            ],
        },
    }


# Pods ----------------------------------------------------------------------------------------


def contract_env(job: RLJob, role: Role, settings: RenderSettings) -> list[dict[str, Any]]:
    """Exactly the env contract's names for ``role``, in table order, values or downward-API refs."""
    master = c.master_addr(job.name, job.namespace)
    values = c.build_pod_env(
        role,
        job_name=job.name,
        coordinator_addr=c.coordinator_addr(job.name, job.namespace),
        shm_dir=c.SHM_DIR,
        run_dir=c.RUN_DIR,
        job_config=c.JOB_CONFIG_PATH,
        weight_port=c.WEIGHT_PORT,
        metrics_port=c.METRICS_PORT,
        token_file=c.TOKEN_PATH,
        listen_host=c.LISTEN_ALL,
        train=c.TrainRendezvous(
            world_size=job.spec.trainer.replicas,
            backend=with_pod_defaults(job, settings.pod_defaults).spec.resolved_backend().value,
            master_addr=master,
            master_port=c.MASTER_PORT,
            weight_data_port=c.WEIGHT_DATA_PORT,
        )
        if role is Role.TRAIN
        else None,
    )
    return [_env_entry(var, values) for var in c.ENV_CONTRACT if role in var.roles]


def _env_entry(var: c.EnvVar, values: dict[str, str]) -> dict[str, Any]:
    """A value rendered from the job, or the downward-API reference Kubernetes fills in."""
    if var.name in values:
        return {"name": var.name, "value": values[var.name]}
    field_path = var.source.removeprefix("downward:")
    return {"name": var.name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}


def _resources(pod: PodSpecOverrides) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("limits", "requests"):
        values = getattr(pod.resources, kind)
        if values:
            out[kind] = {name: str(value) for name, value in values.items()}
    return out


def _tolerations(pod: PodSpecOverrides, settings: RenderSettings) -> list[dict[str, Any]]:
    tolerations = [dict(t) for t in pod.tolerations]
    if pod.gpus() > 0:
        tolerations += [dict(t) for t in settings.gpu_tolerations if t not in tolerations]
    return tolerations


#: The pod securityContext of every RLJob pod: the image's non-root user, as Pod Security
#: ``restricted`` asks; fsGroup makes a checkpoint PersistentVolumeClaim writable for it.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": c.IMAGE_USER_ID,
    "runAsGroup": c.IMAGE_GROUP_ID,
    "fsGroup": c.IMAGE_GROUP_ID,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def _host_path_weights(job: RLJob) -> bool:
    return job.spec.policy.weight_buffer.strategy in (WeightStrategy.SHARED, WeightStrategy.SHARDED)


def _weights_dir_init(image: str, pull: str | None) -> dict[str, Any]:
    """Root with only CAP_CHOWN: give the kubelet-made (root-owned) hostPath to the image's user."""
    init: dict[str, Any] = {
        "name": WEIGHTS_DIR_INIT,
        "image": image,
        "command": ["chown", f"{c.IMAGE_USER_ID}:{c.IMAGE_GROUP_ID}", c.SHM_DIR],
        "volumeMounts": [{"name": "weights", "mountPath": c.SHM_DIR}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        },
    }
    if pull:
        init["imagePullPolicy"] = pull
    return init


def _weight_volume(job: RLJob) -> dict[str, Any] | None:
    """The eval pods' weight-buffer volume, per strategy (None: no buffer, no volume)."""
    buffer = job.spec.policy.weight_buffer
    if buffer.strategy is WeightStrategy.DOUBLE:
        empty: dict[str, Any] = {"medium": "Memory"}
        if buffer.shm_size_limit:
            empty["sizeLimit"] = buffer.shm_size_limit
        return {"name": "weights", "emptyDir": empty}
    if _host_path_weights(job):
        path = f"{buffer.host_path.rstrip('/')}/{job.namespace}-{job.name}"
        return {"name": "weights", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}
    return None


def render_pod_template(job: RLJob, role: Role, settings: RenderSettings) -> dict[str, Any]:
    own = job.spec.trainer if role is Role.TRAIN else job.spec.evaluator
    pod = merged_role(own, settings.pod_defaults.for_role(role))
    volumes: list[dict[str, Any]] = [
        {
            "name": "job-config",
            "configMap": {
                "name": c.config_map_name(job.name),
                "items": [{"key": c.JOB_CONFIG_KEY, "path": c.JOB_CONFIG_KEY}],
            },
        },
        (
            {"name": "run", "persistentVolumeClaim": {"claimName": job.spec.checkpoint.claim_name}}
            if job.spec.checkpoint.claim_name
            else {"name": "run", "emptyDir": {}}
        ),
    ]
    mounts = [
        {"name": "job-config", "mountPath": c.JOB_CONFIG_PATH.rsplit("/", 1)[0], "readOnly": True},
        {"name": "run", "mountPath": c.RUN_DIR},
    ]
    if role is Role.TRAIN:
        shm: dict[str, Any] = {"medium": "Memory"}
        if settings.train_shm_size:
            shm["sizeLimit"] = settings.train_shm_size
        volumes.append({"name": "dshm", "emptyDir": shm})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    # Eval pods read their weight buffer here. With a per-node buffer (Shared, Sharded) train pods
    # mount the node's directory too: rank 0 then writes the slots of its node directly, and the
    # eval pods beside it skip the network (other ranks use a private subdirectory).
    weights = _weight_volume(job) if role is Role.EVAL or _host_path_weights(job) else None
    if weights is not None:
        volumes.append(weights)
        mounts.append({"name": "weights", "mountPath": c.SHM_DIR})
    secret_volumes, secret_mounts, secret_env = credential_volumes(job)
    volumes += secret_volumes
    mounts += secret_mounts

    image = job.spec.image or settings.default_image
    container: dict[str, Any] = {
        "name": CONTAINER_NAME[role],
        "image": image,
        "args": list(POD_ARGS),
        "env": contract_env(job, role, settings) + secret_env + [copy.deepcopy(e) for e in pod.env],
        "volumeMounts": mounts,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
        # The entrypoint writes why it stopped here; with nothing written, the log's tail stands in.
        "terminationMessagePath": c.TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pull = pod.image_pull_policy or settings.image_pull_policy
    if pull:
        container["imagePullPolicy"] = pull
    if role is Role.TRAIN:
        container["ports"] = [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in PORTS.items()]
    container |= health_probes()
    container.setdefault("ports", []).append(
        {"name": METRICS_PORT_NAME, "containerPort": c.METRICS_PORT, "protocol": "TCP"}
    )
    resources = _resources(pod)
    if resources:
        container["resources"] = resources

    spec: dict[str, Any] = {
        "securityContext": copy.deepcopy(POD_SECURITY_CONTEXT),
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": (
            settings.train_grace_seconds if role is Role.TRAIN else settings.eval_grace_seconds
        ),
    }
    if _host_path_weights(job):
        spec["initContainers"] = [_weights_dir_init(image, pull)]
    node_selector = {**settings.default_node_selector, **pod.node_selector}
    if node_selector:
        spec["nodeSelector"] = node_selector
    tolerations = _tolerations(pod, settings)
    if tolerations:
        spec["tolerations"] = tolerations
    if pod.affinity:
        spec["affinity"] = copy.deepcopy(pod.affinity)
    gang = gang_pod_metadata(job, pod) if role is Role.TRAIN else GangPodMetadata()
    for key, value in (
        ("priorityClassName", pod.priority_class_name),
        ("schedulerName", gang.scheduler_name or pod.scheduler_name),
        ("serviceAccountName", pod.service_account_name),
    ):
        if value:
            spec[key] = value
    return {
        "metadata": {
            "labels": {**pod.labels, **gang.labels, **role_labels(job, role), **job_pod_labels(job)},
            "annotations": {
                **pod.annotations,
                **gang.annotations,
                ANNOTATION_SPEC_HASH: spec_hash(job, settings),
            },
        },
        "spec": spec,
    }


#: Seconds a pod may take to start answering health checks (imports, envs, rendezvous): 5 min.
STARTUP_PROBE = {"periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 60}
#: A pod that does not answer for 60 s (hung, SIGSTOP) is restarted.
LIVENESS_PROBE = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6}
READINESS_PROBE = {"periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 2}


def health_probes() -> dict[str, Any]:
    """kubelet's native gRPC probes against the pod's grpc.health.v1 server (``rlkube.health``)."""

    def grpc_probe(service: str | None, timing: dict[str, int]) -> dict[str, Any]:
        check: dict[str, Any] = {"port": c.HEALTH_PORT}
        if service:
            check["service"] = service
        return {"grpc": check, **timing}

    return {
        "startupProbe": grpc_probe(None, STARTUP_PROBE),
        "livenessProbe": grpc_probe(None, LIVENESS_PROBE),
        "readinessProbe": grpc_probe(c.READINESS_SERVICE, READINESS_PROBE),
    }


def _statefulset(
    job: RLJob, role: Role, settings: RenderSettings, *, name: str, service: str, replicas: int
) -> dict[str, Any]:
    metadata = _metadata(job, settings, name, role)
    if role is Role.TRAIN:
        metadata["labels"].update(gang_statefulset_labels(job))
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "serviceName": service,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": role_labels(job, role)},
            "template": render_pod_template(job, role, settings),
        },
    }


def render_train_statefulset(
    job: RLJob, settings: RenderSettings, *, stopped: bool = False
) -> dict[str, Any]:
    return _statefulset(
        job,
        Role.TRAIN,
        settings,
        name=c.train_statefulset_name(job.name),
        service=c.train_service_name(job.name),
        replicas=0 if stopped else job.spec.trainer.replicas,
    )


def render_eval_statefulset(job: RLJob, settings: RenderSettings, *, stopped: bool = False) -> dict[str, Any]:
    return _statefulset(
        job,
        Role.EVAL,
        settings,
        name=c.eval_statefulset_name(job.name),
        service=eval_service_name(job.name),
        replicas=0 if stopped else job.spec.evaluator.replicas,
    )


# Gang scheduling and disruption budget -------------------------------------------------------

#: Where each gang scheduler reads a pod's group, from the projects' own API packages:
#: volcano-sh/apis pkg/apis/scheduling/v1beta1/labels.go (KubeGroupNameAnnotationKey),
#: scheduler-plugins apis/scheduling/v1alpha1/types.go (PodGroupLabel), kueue
#: pkg/controller/constants (QueueLabel) and pkg/controller/jobs/pod/constants (GroupNameLabel,
#: GroupTotalCountAnnotation).
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
#: The scheduler that serves each gang when trainer.schedulerName is unset: Volcano's own name, and
#: the name scheduler-plugins' Helm chart gives its second scheduler.
GANG_SCHEDULER_NAME = {
    GangScheduler.VOLCANO: "volcano",
    GangScheduler.COSCHEDULING: "scheduler-plugins-scheduler",
}
POD_GROUP_API = {
    GangScheduler.VOLCANO: "scheduling.volcano.sh/v1beta1",
    GangScheduler.COSCHEDULING: "scheduling.x-k8s.io/v1alpha1",
}


def pod_group_name(job: str) -> str:
    """The train gang's PodGroup (Volcano, coscheduling) or Kueue pod group."""
    return f"{job}-train"


def disruption_budget_name(job: str) -> str:
    return f"{job}-train"


@dataclass(frozen=True)
class GangPodMetadata:
    """What a train pod carries so its gang scheduler finds its group."""

    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    scheduler_name: str | None = None


def _train_pod(job: RLJob, settings: RenderSettings) -> PodSpecOverrides:
    return merged_role(job.spec.trainer, settings.pod_defaults.for_role(Role.TRAIN))


def gang_pod_metadata(job: RLJob, train_pod: PodSpecOverrides) -> GangPodMetadata:
    """Labels, annotations and scheduler of a train pod for ``spec.scheduling.gang``."""
    scheduling = job.spec.scheduling
    gang = scheduling.gang
    scheduler = train_pod.scheduler_name or GANG_SCHEDULER_NAME.get(gang)
    group = pod_group_name(job.name)
    if gang is GangScheduler.VOLCANO:
        return GangPodMetadata(annotations={VOLCANO_GROUP_ANNOTATION: group}, scheduler_name=scheduler)
    if gang is GangScheduler.COSCHEDULING:
        return GangPodMetadata(labels={COSCHEDULING_GROUP_LABEL: group}, scheduler_name=scheduler)
    if gang is GangScheduler.KUEUE and scheduling.kueue_integration is KueueIntegration.POD:
        return GangPodMetadata(
            labels={KUEUE_QUEUE_LABEL: str(scheduling.queue), KUEUE_GROUP_LABEL: group},
            annotations={KUEUE_GROUP_TOTAL_ANNOTATION: str(job.spec.trainer.replicas)},
        )
    return GangPodMetadata()


def gang_statefulset_labels(job: RLJob) -> dict[str, str]:
    """Labels of the train StatefulSet itself: Kueue's statefulset integration reads the queue there."""
    scheduling = job.spec.scheduling
    if (
        scheduling.gang is GangScheduler.KUEUE
        and scheduling.kueue_integration is KueueIntegration.STATEFULSET
    ):
        return {KUEUE_QUEUE_LABEL: str(scheduling.queue)}
    return {}


def render_pod_group(job: RLJob, settings: RenderSettings) -> dict[str, Any] | None:
    """The train gang as a Volcano or scheduler-plugins PodGroup; None for other gangs.

    ``minMember`` is every rank (DDP cannot start with fewer) and ``minResources`` what they request
    together, so the scheduler admits the gang only where all of it fits.
    """
    scheduling = job.spec.scheduling
    api = POD_GROUP_API.get(scheduling.gang)
    if api is None:
        return None
    pod = _train_pod(job, settings)
    members = job.spec.trainer.replicas
    spec: dict[str, Any] = {"minMember": members}
    requests = pod_requests(pod.resources.requests, pod.resources.limits)
    if requests:
        spec["minResources"] = gang_requests(requests, members)
    if scheduling.gang is GangScheduler.VOLCANO:
        if scheduling.queue:
            spec["queue"] = scheduling.queue
        if pod.priority_class_name:
            spec["priorityClassName"] = pod.priority_class_name
    elif scheduling.schedule_timeout_seconds is not None:
        spec["scheduleTimeoutSeconds"] = scheduling.schedule_timeout_seconds
    return {
        "apiVersion": api,
        "kind": "PodGroup",
        "metadata": _metadata(job, settings, pod_group_name(job.name), Role.TRAIN),
        "spec": spec,
    }


def render_train_disruption_budget(
    job: RLJob, settings: RenderSettings, *, stopped: bool = False
) -> dict[str, Any]:
    """No voluntary eviction of a ready train rank (one lost rank stops all of them).

    ``unhealthyPodEvictionPolicy: AlwaysAllow`` lets a drain evict a rank that is not ready (a
    crash-looping one would otherwise block the drain for good).
    """
    keep = 0 if stopped or not job.spec.scheduling.disruption_budget else job.spec.trainer.replicas
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(job, settings, disruption_budget_name(job.name), Role.TRAIN),
        "spec": {
            "minAvailable": keep,
            "selector": {"matchLabels": role_labels(job, Role.TRAIN)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
